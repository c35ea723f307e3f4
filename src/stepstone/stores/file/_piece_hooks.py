"""The file store's hooks of the pieces protocol (``.._pieces_protocol``): how a run is
loaded, saved and deleted, its long state in pieces (``_pieces``).

The protocol's order, with this store's locks around it:

- **save**: ``flock`` the run's current document (``_locking``) and check its version,
  hold the run's directory of pieces shared, write the pieces (each durable), publish
  the document (``_publish``: the compare-and-swap is the lock, or ``link`` for a first
  save), release the document, collect the old pieces, release the directory.
- **delete**: ``flock`` the current document, unlink it, release it, then remove that
  document's incarnation's pieces under the directory's exclusive lock: a save of the
  same id under way (a run deleted and started again) holds it shared, and its pieces
  are of another incarnation anyway.
- **load**: no lock (a rename is atomic, pieces are immutable).

The hooks do their I/O themselves: generators of no effects, run by ``run_plain``.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from typing import Any, Final, NamedTuple

from ... import _statelog
from ..._checkpoint import ACTIVE_STATUSES, Checkpoint, utcnow
from ..._codec import PiecesNeeded, checkpoint_from_doc, encode_document
from ..._errors import ConflictError, CorruptCheckpoint, StoreError
from .._common import new_version
from .._pieces_protocol import Current, PiecesProtocol, run_plain
from ._disk import sync
from ._documents import Known, doc_active, open_document
from ._errors import too_large, translating
from ._names import encode_name, hashed, run_of
from ._pieces import EVERY, PieceDir, open_root, open_run, remove_run
from ._publish import Publisher, logger

__all__ = ["PieceHooks"]

#: ``Current.version`` of an entry at the run's name that is not a document of ours.
_FOREIGN: Final = object()
#: ``Current.version`` of a document of ours that cannot be parsed.
_UNREADABLE: Final = object()

#: A hook of this store: it does its I/O itself, so yields nothing.
Plain = Generator[None, Any, Any]


class _Loading:
    """The ``ctx`` of a load: the run's names and the document read last, kept open (its
    fd and version) for the caller."""

    __slots__ = ("dir_fd", "fd", "keep", "name", "run_id", "source", "version")

    def __init__(self, dir_fd: int, name: str, source: str, run_id: str | None, keep: bool) -> None:
        self.dir_fd, self.name, self.source = dir_fd, name, source
        self.run_id, self.keep = run_id, keep
        self.fd: int | None = None
        self.version: str = ""


class _Plan(NamedTuple):
    """A save's plan (kept whole for the retry of a save whose answer was lost)."""

    prepared: _statelog.Prepared
    saved: Checkpoint
    #: The version the save expects to replace (None: a first save).
    expected: str | None
    #: The document, encoded.
    data: bytes
    name: str


class _Held:
    """The ``ctx`` of a save or delete: the run's names and the locks it holds."""

    __slots__ = ("active", "dir_fd", "expected", "landed", "lock_fd", "name", "run", "run_id")

    def __init__(self, dir_fd: int, name: str, run_id: str, expected: str | None) -> None:
        self.dir_fd, self.name, self.run_id, self.expected = dir_fd, name, run_id, expected
        #: The current document, open and ``flock``ed, until released.
        self.lock_fd: int | None = None
        #: Whether the run was active before the save.
        self.active = False
        #: The save's own document is the current one (a retry whose first try landed).
        self.landed = False
        #: The run's directory of pieces, held shared (a save's).
        self.run: PieceDir | None = None


class PieceHooks(Publisher, PiecesProtocol[None]):
    """The load, save and delete of ``FileStore``, as the pieces protocol's hooks."""

    __slots__ = ()

    # -- loading --------------------------------------------------------------------------

    def _load(self, name: str, run_id: str | None, keep: bool) -> Checkpoint | None:
        """Load ``<name>.json``; ``run_id`` None for a hashed name found by listing.

        ``keep``: a load for the caller, whose document stays open for the next save.
        False: a look at the metadata (a listing, the index), which closes the document
        again and does not read a state kept in pieces (its state is then empty).
        """
        dir_fd = self._handles.begin()
        try:
            return self._load_in(dir_fd, name, run_id, keep)
        finally:
            self._handles.end()

    def _load_in(self, dir_fd: int, name: str, run_id: str | None, keep: bool) -> Checkpoint | None:
        ctx = _Loading(dir_fd, name, self._file(name + ".json"), run_id, keep)
        try:
            # No lock: the rename that publishes a document is atomic. A piece missing
            # means a newer save collected it: its document names pieces that are there
            # (the pieces protocol reads it again; the same version missing one is damage).
            read = run_plain(self._pp_read(ctx))
            cp = None if read is None else run_plain(self._pieces_load(ctx, *read))
        except BaseException:
            if ctx.fd is not None:
                os.close(ctx.fd)
            raise
        fd = ctx.fd
        if cp is None or fd is None:
            if fd is not None:
                os.close(fd)
            return None
        if keep:
            # Keeping it open lets the next save of this run skip reading it again.
            self._handles.track(fd)
            self._handles.keep(name, Known(fd, ctx.version, cp.status in ACTIVE_STATUSES))
        else:
            os.close(fd)
        return cp  # type: ignore[no-any-return]

    def _pp_read(self, ctx: _Loading) -> Plain:
        """Open and parse the run's document (closing the one read before)."""
        yield from ()  # performs its I/O itself: a generator of no effects
        if ctx.fd is not None:
            os.close(ctx.fd)
            ctx.fd = None
        file_name = ctx.name + ".json"
        opened = open_document(ctx.dir_fd, self._path, file_name)
        if opened is None:
            return None
        ctx.fd, st = opened
        doc, ctx.version = self._parse(ctx.fd, st.st_size, file_name, ctx.run_id)
        if ctx.run_id is None:
            found = doc.get("run_id")
            if not isinstance(found, str) or hashed(found) != ctx.name:
                raise CorruptCheckpoint(
                    f"{ctx.source}: its run_id {found!r} does not hash to its name; left untouched"
                )
        return doc, ctx.version

    def _pp_source(self, ctx: _Loading) -> str:
        return ctx.source

    def _pp_decode(
        self, ctx: _Loading, doc: Any, version: Any, found: dict[str, bytes] | None
    ) -> Checkpoint:
        if found is not None:
            return _statelog.checkpoint_with_pieces(
                self, doc, version, ctx.source, doc.get("run_id"), found
            )
        if ctx.keep:
            return checkpoint_from_doc(doc, version, source=ctx.source)
        # A look at the metadata only: a state kept in pieces is not read (empty).
        try:
            return checkpoint_from_doc(doc, version, source=ctx.source)
        except PiecesNeeded:
            return checkpoint_from_doc(doc, version, source=ctx.source, state={})

    def _pp_fetch(self, ctx: _Loading, keys: Sequence[str]) -> Plain:
        yield from ()  # performs its I/O itself
        return self._read_pieces(ctx.dir_fd, ctx.name, keys)

    def _read_pieces(self, dir_fd: int, name: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Those of the run's pieces ``keys`` that are stored (no lock: they are immutable)."""
        run = self._piece_dir(dir_fd, name, create=False, lock=False)
        if run is None:
            return {}
        try:
            return run.read(keys, self._max_bytes)
        finally:
            run.close()

    def _piece_dir(self, dir_fd: int, name: str, *, create: bool, lock: bool) -> PieceDir | None:
        """Open the run's directory of pieces (``_pieces``); None if absent and not ``create``."""
        root = open_root(dir_fd, self._path, create=create, strict=self._strict)
        if root is None:
            return None
        try:
            return open_run(root, self._path, name, create=create, strict=self._strict, lock=lock)
        finally:
            os.close(root)

    # -- saving ---------------------------------------------------------------------------

    def _pp_plan(self, checkpoint: Checkpoint) -> _Plan:
        """Encode the save whole before any I/O: a document over the limit is refused."""
        run_id = checkpoint.run_id
        prepared = _statelog.prepare_save(self, checkpoint)
        text = prepared.state_text
        if text is not None and len(text) > self._max_bytes:
            # Characters <= bytes: refuse before encoding.
            size = len(text.encode("utf-8", "backslashreplace"))
            raise too_large(run_id, size, self._max_bytes)
        # The count is the stored one's plus one; the swap fails unless that is ours.
        version = new_version(checkpoint.version)
        saved = checkpoint.stored(prepared.state, text, version, utcnow(), prepared.bind(version))
        document = encode_document(
            saved, text, extra={"version": version}, **prepared.document_fields()
        )
        # JSON text can hold lone surrogates, which UTF-8 cannot; they only occur inside
        # string literals, where the \\udXXX that backslashreplace writes is the JSON
        # escape for the same character, so the document round-trips.
        data = document.encode("utf-8", "backslashreplace")
        if len(data) > self._max_bytes:
            raise too_large(run_id, len(data), self._max_bytes)
        return _Plan(prepared, saved, checkpoint.version, data, encode_name(run_id))

    def _pp_prepared(self, plan: _Plan) -> _statelog.Prepared:
        return plan.prepared

    def _pp_run_id(self, plan: _Plan) -> str:
        return plan.saved.run_id

    def _pp_begin(self, plan: _Plan) -> Plain:
        """Lock the run's document and check its version, then hold its pieces' directory.

        Raises ``ConflictError`` before anything is written if the version is not the one
        the save expects (or the save's own: a retry whose first try landed).
        """
        yield from ()
        ctx = _Held(self._handles.fd(), plan.name, plan.saved.run_id, plan.expected)
        try:
            ctx.lock_fd, current, ctx.active = self._current(ctx)
            saved = plan.saved
            # Nobody else writes a save's random version token.
            ctx.landed = current is not None and current == saved.version
            if not ctx.landed and current != plan.expected:
                raise ConflictError(
                    f"run {ctx.run_id!r}: expected version {plan.expected!r}, stored {current!r}",
                    ctx.run_id,
                )
            prepared = plan.prepared
            if not ctx.landed and saved.status in ACTIVE_STATUSES and not ctx.active:
                self._mark(ctx.name, saved.status)  # before the save: no active run unindexed
            if prepared.pieces or prepared.collect_below is not None:
                # Held shared until the old pieces are collected: a delete of the run
                # waits (``_pieces``).
                create = bool(prepared.pieces) and not ctx.landed
                ctx.run = self._piece_dir(ctx.dir_fd, ctx.name, create=create, lock=True)
        except BaseException:
            self._pp_end(ctx)
            raise
        return ctx

    def _current(self, ctx: _Held) -> tuple[int | None, str | None, bool]:
        """Lock the run's current document: its fd, version and whether it is active."""
        name = ctx.name
        known = self._handles.checkout(name)
        if known is not None:
            try:
                still = self._handles.lock_known(known.fd, name + ".json")
            except BaseException:
                self._handles.release(known.fd)
                raise
            if still:
                return known.fd, known.version, known.active
            self._handles.release(known.fd)
        locked = self._handles.lock_current(ctx.dir_fd, name)
        if locked is None:
            return None, None, False
        lock_fd, st = locked
        try:
            # Parsing proves the file is ours and whole, so a corrupt file stays put.
            doc, version = self._parse(lock_fd, st.st_size, name + ".json", ctx.run_id)
        except BaseException:
            self._handles.release(lock_fd)
            raise
        return lock_fd, version, doc_active(doc)

    def _pp_end(self, ctx: _Held) -> None:
        self._unlock(ctx)
        if ctx.run is not None:
            run, ctx.run = ctx.run, None
            run.close()

    def _unlock(self, ctx: _Held) -> None:
        if ctx.lock_fd is not None:
            fd, ctx.lock_fd = ctx.lock_fd, None
            self._handles.release(fd)

    def _pp_write(self, ctx: _Held, pieces: Sequence[_statelog.Piece], retry: bool) -> Plain:
        """Write the pieces durably; those written go again if the write fails (the
        document, locked, cannot have named them)."""
        yield from ()
        if ctx.landed:
            return  # the stored document is this very save's: its pieces are there
        run = ctx.run
        assert run is not None
        try:
            run.write(pieces)  # a key already stored keeps its data
        except BaseException:
            run.remove([piece.key for piece in pieces])
            raise

    def _pp_commit(self, ctx: _Held, plan: _Plan, checkpoint: Checkpoint) -> Plain:
        """Publish the document (``_publish``), then release the old one's lock."""
        yield from ()
        if ctx.landed:
            self._unlock(ctx)
            return None
        saved = plan.saved
        active = saved.status in ACTIVE_STATUSES
        try:
            fd = self._publish(
                ctx.dir_fd,
                ctx.name,
                plan.data,
                create=plan.expected is None,
                unmark=ctx.active and not active,
            )
        finally:
            self._unlock(ctx)
        self._handles.keep(ctx.name, Known(fd, saved.version, active))  # type: ignore[arg-type]
        return None

    def _pp_own(self, ctx: _Held, plan: _Plan) -> Plain:
        """None: a save's own landed write is found by ``_pp_begin`` under the lock, so a
        commit that missed lost to another writer (a first save's ``link``)."""
        yield from ()
        return None

    def _pp_saved(self, plan: _Plan, checkpoint: Checkpoint, result: Any) -> Checkpoint:
        return plan.saved

    def _pp_drop(self, ctx: _Held, keys: list[str]) -> Plain:
        yield from ()
        if ctx.run is not None:
            ctx.run.remove(keys)

    def _pp_collect(self, ctx: _Held, below: int, inc: str | None) -> Plain:
        """Delete incarnation ``inc``'s pieces below generation ``below``, and the run's
        orphans (``_statelog.is_orphan``); a failure is only logged."""
        yield from ()
        run = ctx.run
        if run is None:
            return
        try:
            if not self._durable:
                # The document naming the new pieces must outlast a power cut before the
                # pieces the one it replaced named go: else the cut can bring that one
                # back, torn.
                with translating(self._path):
                    sync(ctx.dir_fd)
            run.collect(below, inc)
        except (OSError, StoreError) as exc:
            logger.warning("could not collect old pieces in %s: %s", run.path, exc)

    # -- deleting -------------------------------------------------------------------------

    def _delete_in(self, dir_fd: int, run_id: str, expected: str | None) -> bool:
        """``delete``: the protocol's, the document's lock released however it ends."""
        name = encode_name(run_id)
        ctx = _Held(dir_fd, name, run_id, expected)
        try:
            known = self._handles.checkout(name)
            if known is not None:
                self._handles.release(known.fd)
            return run_plain(self._pieces_delete(ctx, run_id, expected))
        finally:
            self._pp_end(ctx)

    def _pp_current(self, ctx: _Held) -> Plain:
        """Lock the run's current document: its ``Current``, or None if there is none.

        Without an expected version, something at the run's name that is not a document
        of ours (a symlink, a FIFO, a file that does not parse) is deleted too, with every
        piece under the name: delete is the operator's explicit request.
        """
        yield from ()
        self._unlock(ctx)
        try:
            locked = self._handles.lock_current(ctx.dir_fd, ctx.name)
        except CorruptCheckpoint:
            if ctx.expected is not None:
                raise
            return Current(_FOREIGN, True, EVERY)
        if locked is None:
            return None
        ctx.lock_fd, st = locked
        try:
            doc, version = self._parse(ctx.lock_fd, st.st_size, ctx.name + ".json", ctx.run_id)
        except CorruptCheckpoint:
            if ctx.expected is not None:
                raise
            return Current(_UNREADABLE, True, EVERY)
        has_pieces, inc = _statelog.inc_of_doc(doc)
        return Current(version, has_pieces, inc)

    def _pp_delete_conflict(self, run_id: str, expected: str, found: Any) -> ConflictError:
        return ConflictError(
            f"run {run_id!r}: delete expected version {expected!r}, stored {found!r}; "
            "nothing was deleted",
            run_id,
        )

    def _pp_delete_cas(self, ctx: _Held, version: Any) -> Plain:
        """Delete the document ``_pp_current`` locked (still ``version``: saves of the
        run take the same lock)."""
        yield from ()
        if version is _FOREIGN:
            return self._unlink_foreign(ctx.dir_fd, ctx.name)
        try:
            self._unlink_locked(ctx.dir_fd, ctx.name)
        finally:
            self._unlock(ctx)
        return True

    def _pp_delete_inc(self, ctx: _Held, inc: str | None) -> Plain:
        """Remove incarnation ``inc``'s pieces (``EVERY``: all) after the document; a
        failure is only logged (what is left is an orphan)."""
        yield from ()
        dir_fd, name = ctx.dir_fd, ctx.name
        try:
            root = open_root(dir_fd, self._path, create=False, strict=self._strict)
        except StoreError as exc:
            logger.warning("could not remove the pieces of run %r: %s", run_of(name), exc)
            return
        if root is None:
            return

        def still_gone() -> bool:
            if inc == EVERY:
                try:
                    os.stat(name + ".json", dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    pass
                else:
                    return False  # saved again since: a new run, whose pieces these are
            if not self._durable:
                # The document's removal must outlast a power cut before its pieces go:
                # else the cut can bring the run back without them.
                sync(dir_fd)
            return True

        try:
            remove_run(root, self._path, name, self._strict, still_gone=still_gone, inc=inc)
        finally:
            os.close(root)
