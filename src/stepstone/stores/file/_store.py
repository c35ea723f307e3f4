"""FileStore: the store itself, putting the directory, documents, locks and index together.

Every operation touches a fixed number of files through a directory fd held open, so
the cost of a save does not grow with the number of runs stored, and a later ``chdir``
does not move a store opened from a relative path. A save of a run this process saved
or loaded last is ``flock``, ``fstat``, ``open``, ``write``, ``fsync``, ``rename``,
``fsync`` (directory), ``close``: eight system calls.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import sys
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, Self

from ... import _statelog
from ..._checkpoint import ACTIVE_STATUSES, Checkpoint, RunStatus, check_run_id, utcnow
from ..._codec import PiecesNeeded, checkpoint_from_doc, encode_document
from ..._errors import ConflictError, CorruptCheckpoint, StoreError, StorePermissionError
from ..._hooks import fire
from ..._store import RunInfo, Store, check_page
from .._common import Unanswered, new_version
from .._pieces_protocol import PiecesProtocol, run_plain
from ._config import Durability, Trust, check_settings, parse_config
from ._disk import (
    O_DIRECTORY,
    open_temp,
    remove_stale_temps,
    scan,
    sync,
    unlink_quietly,
    write_all,
)
from ._documents import Known, doc_active, open_document, parse
from ._errors import too_large, translating
from ._index import drop_orphan, has_marker, mark, marker_run, open_index, unmark
from ._locking import Handles
from ._names import ACTIVE, HASHED_NAME, decode_name, encode_name, hashed, join, run_of
from ._notify import DirectoryListener, listen_directory
from ._pieces import (
    PIECES,
    PieceDir,
    check_key,
    collect_orphans,
    open_root,
    open_run,
    remove_run,
)
from ._trust import check_opened, check_trust, make_dirs

__all__ = ["MAX_DOCUMENT_BYTES", "FileStore"]

logger = logging.getLogger("stepstone.stores.file")

#: Largest document a save writes (and a load reads): far above any sane checkpoint, low
#: enough that a runaway state fails loudly instead of filling the disk. A long state's
#: document names its pieces instead of holding it, so this bounds the document and each
#: piece, not the state.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
#: Reads of a run's document when the pieces it names were collected by a newer save.
_READS = 3


class _Loading:
    """The ``ctx`` of a load (``_pieces_protocol``): the run's names and the document
    read last, kept open (its fd and version) for the caller."""

    __slots__ = ("dir_fd", "fd", "keep", "name", "run_id", "source", "version")

    def __init__(self, dir_fd: int, name: str, source: str, run_id: str | None, keep: bool) -> None:
        self.dir_fd, self.name, self.source, self.run_id, self.keep = (
            dir_fd,
            name,
            source,
            run_id,
            keep,
        )
        self.fd: int | None = None
        self.version: str = ""


class FileStore(PiecesProtocol[None], Store):
    """Keeps each run's checkpoint as a JSON file in a local directory.

    Config strings: ``file:///abs/dir`` or ``file:rel/dir`` (relative to the working
    directory when opened; the path is taken literally, without percent-decoding). The
    directory, and any missing parent, is created with mode 0700; files get mode 0600.

    Option ``durability``:

    - ``full`` (default): fsync the new file before renaming it into place and the
      directory after. A save that returned survives a process crash and a power cut.
    - ``none``: fsync the new file, never the directory. A save that returned survives a
      process crash; a power cut may roll a run back to an earlier checkpoint (or remove
      a run saved recently for the first time), never leave it torn or empty.

    Option ``trust``: ``strict`` (default) refuses a directory another user could change
    (see ``_trust.check_trust``); ``any`` accepts it, for a directory shared on purpose.

    Saves of one run are serialised across threads and processes by ``flock`` on the
    run's document; saves of different runs run in parallel. Documents over 64 MiB are
    refused with ``CheckpointTooLarge``. POSIX, local file systems only.

    A state over ``_statelog.INLINE_MAX`` is kept in pieces under ``.pieces/<name>/``
    (``_pieces``), written durably before the document naming them, in both modes.
    """

    scheme: ClassVar[str] = "file"
    durability_levels: ClassVar[tuple[str, ...]] = ("full", "none")
    kill_points = MappingProxyType(
        {
            "file.after_temp_write": False,
            "file.after_rename": True,
            "file.before_dir_fsync": True,
        }
    )
    native_async: ClassVar[bool] = False
    _pieces_reads: ClassVar[int] = _READS
    claims_by_kind: ClassVar[bool] = True
    #: inotify on the store's directory (``_notify``): Linux only.
    pushes_wakeups: ClassVar[bool] = sys.platform.startswith("linux")
    holds_pieces: ClassVar[bool] = True
    piece_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.piece": False, "pieces.written": False, "pieces.collect": True}
    )
    cleanup_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.deleting": True, "pieces.collecting": True}
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        durability: Durability = "full",
        *,
        trust: Trust = "strict",
    ) -> None:
        self._path = check_settings(path, durability, trust)
        self._handles = Handles(self._path)
        self._index_error = "the file store is closed"
        # Saves whose answer was lost, for their retry (``Unanswered``).
        self._unanswered = Unanswered()
        self._durable = durability == "full"
        self._strict = trust == "strict"
        self.durability: Durability = durability
        self.trust: Trust = trust
        with translating(self._path):
            make_dirs(self._path, self._durable)
            if trust == "strict":
                check_trust(self._path)
            # Held for the store's life: every file is reached relative to it (no path
            # lookups, immune to chdir) and it is what the directory fsync needs.
            dir_fd = self._handles.dir_fd = os.open(self._path, O_DIRECTORY)
            if trust == "strict":
                try:
                    check_opened(self._path, dir_fd)
                except StorePermissionError:
                    self.close()
                    raise
            try:
                self._handles.active_fd = open_index(dir_fd, self._path)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                # A directory this process may only read (an operator listing runs):
                # loads and listings work; saves and claimable say why they cannot.
                self._index_error = f"{self._file(ACTIVE)}: {exc.strerror}"
        self._remove_stale_temps()

    @classmethod
    def from_config(cls, config: str) -> Self:
        path, durability, trust = parse_config(config)
        return cls(path, durability, trust=trust)

    @property
    def path(self) -> str:
        """The store's directory, absolute."""
        return self._path

    def __repr__(self) -> str:
        extra = ", trust='any'" if self.trust == "any" else ""
        return f"FileStore({self._path!r}, durability={self.durability!r}{extra})"

    def _file(self, name: str) -> str:
        return join(self._path, name)

    # -- reading ------------------------------------------------------------------------

    def _parse(
        self, fd: int, size: int, file_name: str, run_id: str | None
    ) -> tuple[dict[str, Any], str]:
        return parse(fd, size, self._path, file_name, run_id, MAX_DOCUMENT_BYTES)

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        return self._load(encode_name(run_id), run_id, keep=True)

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

    # -- the hooks of the pieces protocol's load (``_pieces_protocol``) -----------------

    def _pp_read(self, ctx: _Loading) -> Generator[None, Any, tuple[Any, Any] | None]:
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

    def _pp_fetch(
        self, ctx: _Loading, keys: Sequence[str]
    ) -> Generator[None, Any, dict[str, bytes]]:
        yield from ()  # performs its I/O itself
        return self._read_pieces(ctx.dir_fd, ctx.name, keys)

    def _read_pieces(self, dir_fd: int, name: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Those of the run's pieces ``keys`` that are stored (no lock: they are immutable)."""
        run = self._piece_dir(dir_fd, name, create=False, lock=False)
        if run is None:
            return {}
        try:
            return run.read(keys, MAX_DOCUMENT_BYTES)
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

    # -- writing ------------------------------------------------------------------------

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        run_id = check_run_id(checkpoint.run_id)
        # A retry of a save whose answer was lost writes what that save planned.
        again: tuple[_statelog.Prepared, Checkpoint] | None = self._unanswered.take(
            checkpoint, run_id
        )
        if again is None:
            prepared = _statelog.prepare_save(self, checkpoint)
            text = prepared.state_text
            if text is not None and len(text) > MAX_DOCUMENT_BYTES:
                # Characters <= bytes: refuse before any I/O.
                size = len(text.encode("utf-8", "backslashreplace"))
                raise too_large(run_id, size, MAX_DOCUMENT_BYTES)
            # The count is the stored one's plus one; the swap fails unless that is ours.
            version = new_version(checkpoint.version)
            saved = checkpoint.stored(
                prepared.state, text, version, utcnow(), prepared.bind(version)
            )
        else:
            prepared, saved = again
        dir_fd = self._handles.begin()
        try:
            return self._save_in(dir_fd, checkpoint, run_id, prepared, saved, again is not None)
        except ConflictError:
            raise
        except BaseException:
            # Whether the document landed is unknown (a failure after the rename, say).
            self._unanswered.keep(checkpoint, run_id, (prepared, saved))
            raise
        finally:
            self._handles.end()

    def _current(self, dir_fd: int, name: str, run_id: str) -> tuple[int | None, str | None, bool]:
        """Lock the run's current document: its fd, version and whether it is active."""
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
        locked = self._handles.lock_current(dir_fd, name)
        if locked is None:
            return None, None, False
        lock_fd, st = locked
        try:
            # Parsing proves the file is ours and whole, so a corrupt file stays put.
            doc, version = self._parse(lock_fd, st.st_size, name + ".json", run_id)
        except BaseException:
            self._handles.release(lock_fd)
            raise
        return lock_fd, version, doc_active(doc)

    def _save_in(
        self,
        dir_fd: int,
        checkpoint: Checkpoint,
        run_id: str,
        prepared: _statelog.Prepared,
        saved: Checkpoint,
        retry: bool,
    ) -> Checkpoint:
        name = encode_name(run_id)
        run: PieceDir | None = None
        version: str = saved.version  # type: ignore[assignment]  # a stored copy has one
        try:
            lock_fd, current_version, was_active = self._current(dir_fd, name, run_id)
            try:
                if current_version != checkpoint.version:
                    if retry and current_version == version:
                        return saved  # the retried save's own write: it landed
                    raise ConflictError(
                        f"run {run_id!r}: expected version {checkpoint.version!r}, "
                        f"stored {current_version!r}",
                        run_id,
                    )
                text = prepared.state_text
                document = encode_document(
                    saved, text, extra={"version": version}, **prepared.document_fields()
                )
                # JSON text can hold lone surrogates, which UTF-8 cannot; they only occur
                # inside string literals, where the \\udXXX that backslashreplace writes is
                # the JSON escape for the same character, so the document round-trips.
                data = document.encode("utf-8", "backslashreplace")
                if len(data) > MAX_DOCUMENT_BYTES:
                    raise too_large(run_id, len(data), MAX_DOCUMENT_BYTES)
                active = saved.status in ACTIVE_STATUSES
                if active and not was_active:
                    self._mark(name, saved.status)  # before the save: no active run unindexed
                if prepared.pieces or prepared.collect_below is not None:
                    # Held shared until the old pieces are collected: a delete of the run
                    # waits (``_pieces``).
                    run = self._piece_dir(dir_fd, name, create=bool(prepared.pieces), lock=True)
                new_fd = self._write(
                    dir_fd,
                    name,
                    data,
                    prepared,
                    run,
                    create=current_version is None,
                    unmark=was_active and not active,
                )
            finally:
                if lock_fd is not None:
                    self._handles.release(lock_fd)
            self._handles.keep(name, Known(new_fd, version, active))
            if prepared.collect_below is not None:
                fire("pieces.collect")
                if run is not None:
                    self._collect(dir_fd, run, prepared.collect_below, prepared.inc)
        finally:
            if run is not None:
                run.close()
        return saved

    def _write(
        self,
        dir_fd: int,
        name: str,
        data: bytes,
        prepared: _statelog.Prepared,
        run: PieceDir | None,
        *,
        create: bool,
        unmark: bool,
    ) -> int:
        """Write the save's pieces, then its document; return the document's open fd.

        Pieces a save wrote are removed again if its document never landed: the
        compare-and-swap lost, or anything failed before the document was written.
        (A failure inside ``_publish`` may come after the rename: those pieces stay,
        for the next new base to collect.)
        """
        try:
            if prepared.pieces:
                assert run is not None
                run.write(prepared.pieces)
                fire("pieces.written")
        except BaseException:
            if run is not None and prepared.pieces:
                run.remove(prepared.piece_keys)
            raise
        try:
            return self._publish(dir_fd, name, data, create=create, unmark=unmark)
        except ConflictError:
            if run is not None and prepared.pieces:
                run.remove(prepared.piece_keys)
            raise

    def _collect(self, dir_fd: int, run: PieceDir, below: int, inc: str | None) -> None:
        """Delete incarnation ``inc``'s pieces below generation ``below``, and the run's
        orphans (``_statelog.is_orphan``); a failure is only logged."""
        try:
            if not self._durable:
                # The document naming the new pieces must outlast a power cut before the
                # pieces the one it replaced named go: else the cut can bring that one
                # back, torn.
                with translating(self._path):
                    sync(dir_fd)
            run.collect(below, inc)
        except (OSError, StoreError) as exc:
            logger.warning("could not collect old pieces in %s: %s", run.path, exc)

    def _publish(self, dir_fd: int, name: str, data: bytes, *, create: bool, unmark: bool) -> int:
        """Atomically put ``data`` at ``<name>.json``; return the new document's open fd.

        ``create``: the run has no document, and the new one appears only if still none
        does (``link`` fails if the name exists: the compare-and-swap of a first save).
        ``unmark``: the run stops being active; its index marker goes after the save,
        while the new document is locked, so that whoever makes it active again next
        (and marks it) does so after the marker is gone.
        """
        fd, temp = open_temp(dir_fd, self._path)
        self._handles.track(fd)
        try:
            with translating(self._path, temp):
                write_all(fd, data)
                fire("file.after_temp_write")
                # Before the rename, in both modes: else a power cut can leave the name
                # pointing at a file whose data never reached the disk (empty or torn).
                sync(fd)
                if unmark:
                    fcntl.flock(fd, fcntl.LOCK_EX)
            self._rename(dir_fd, temp, name, create=create)
        except BaseException:
            unlink_quietly(dir_fd, temp)
            self._handles.release(fd)
            raise
        try:
            fire("file.after_rename")
            fire("file.before_dir_fsync")
            if self._durable or unmark:
                # The rename is a change to the directory; only this makes it survive power
                # loss. Before a marker goes, in both modes: a power cut must not leave the
                # run active again (the rename undone) with its marker gone.
                with translating(self._path):
                    sync(dir_fd)
            if unmark:
                try:
                    self._unmark(name)
                finally:
                    with translating(self._path, name + ".json"):
                        fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            self._handles.release(fd)
            raise
        return fd

    def _rename(self, dir_fd: int, temp: str, name: str, *, create: bool) -> None:
        """Put the temp file at ``<name>.json``; with ``create``, only if nothing is there."""
        final = name + ".json"
        with translating(self._path, final):
            if not create:
                os.rename(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                return
            try:
                os.link(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                raise ConflictError(
                    f"run {run_of(name)!r}: expected no checkpoint, but one was saved meanwhile",
                    run_of(name),
                ) from None
            finally:
                unlink_quietly(dir_fd, temp)

    # -- the index of active runs --------------------------------------------------------

    def _mark(self, name: str, status: str) -> None:
        active_fd = self._handles.active_fd
        if active_fd is None:
            self._handles.fd()
            raise StorePermissionError(
                f"{self._path}: cannot index the active run {name!r}: {self._index_error}"
            )
        mark(active_fd, self._path, name, status)

    def _unmark(self, name: str) -> None:
        unmark(self._handles.active_fd, self._path, name)

    # -- deleting -----------------------------------------------------------------------

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        check_run_id(run_id)
        dir_fd = self._handles.begin()
        try:
            return self._delete_in(dir_fd, run_id, expected_version)
        finally:
            self._handles.end()

    def _delete_in(self, dir_fd: int, run_id: str, expected_version: str | None) -> bool:
        name = encode_name(run_id)
        known = self._handles.checkout(name)
        if known is not None:
            self._handles.release(known.fd)
        try:
            locked = self._handles.lock_current(dir_fd, name)
        except CorruptCheckpoint:
            if expected_version is not None:
                raise
            return self._delete_foreign(dir_fd, name)
        if locked is None:
            return False
        lock_fd, st = locked
        try:
            if expected_version is not None:
                _, current = self._parse(lock_fd, st.st_size, name + ".json", run_id)
                if current != expected_version:
                    raise ConflictError(
                        f"run {run_id!r}: delete expected version {expected_version!r}, "
                        f"stored {current!r}; nothing was deleted",
                        run_id,
                    )
            self._delete_locked(dir_fd, name)
        finally:
            self._handles.release(lock_fd)
        return True

    def _delete_foreign(self, dir_fd: int, name: str) -> bool:
        # A symlink, FIFO or directory at the run's path: delete is the operator's
        # explicit request, so remove the entry without reading through it.
        file_name = name + ".json"
        with translating(self._path, file_name):
            try:
                os.unlink(file_name, dir_fd=dir_fd)
            except IsADirectoryError:
                raise CorruptCheckpoint(
                    f"{self._file(file_name)}: a directory, not a checkpoint; left untouched"
                ) from None
            except FileNotFoundError:
                return False
        self._unmark(name)
        self._drop_pieces(dir_fd, name)
        return True

    def _delete_locked(self, dir_fd: int, name: str) -> None:
        with translating(self._path, name + ".json"):
            os.unlink(name + ".json", dir_fd=dir_fd)
        if self._durable:
            with translating(self._path):
                sync(dir_fd)
        # The marker goes after the document is durably gone (a crash in between
        # leaves a hint claimable cleans up), under the lock of the document that was
        # current, so a power cut cannot bring back an active run without its marker.
        if has_marker(self._handles.active_fd, name):
            if not self._durable:
                with translating(self._path):
                    sync(dir_fd)
            self._unmark(name)
        # Lock files of releases before this index existed: their run is gone.
        unlink_quietly(dir_fd, name + ".lock")
        fire("pieces.deleting")  # the document is gone, its pieces not yet
        self._drop_pieces(dir_fd, name)

    def _drop_pieces(self, dir_fd: int, name: str) -> None:
        """Remove a deleted run's pieces, after its document; a failure is only logged."""
        try:
            root = open_root(dir_fd, self._path, create=False, strict=self._strict)
        except StoreError as exc:
            logger.warning("could not remove the pieces of run %r: %s", run_of(name), exc)
            return
        if root is None:
            return

        def still_gone() -> bool:
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
            remove_run(root, self._path, name, self._strict, still_gone=still_gone)
        finally:
            os.close(root)

    def collect_orphans(self, min_age: float = _statelog.ORPHAN_AGE) -> list[_statelog.Orphan]:
        """Delete orphaned pieces older than ``min_age`` (``Store.collect_orphans``): of
        runs with no document, each run's directory locked as ``delete`` locks it.

        Raises:
            StoreError: the store's directory cannot be read.
        """
        dir_fd = self._handles.begin()
        try:
            root = open_root(dir_fd, self._path, create=False, strict=self._strict)
            if root is None:
                return []
            try:
                with translating(self._path, PIECES):
                    names = sorted(entry.name for entry in scan(root, "."))
                found: list[_statelog.Orphan] = []
                for name in names:

                    def still_gone(name: str = name) -> bool:
                        try:
                            os.stat(name + ".json", dir_fd=dir_fd, follow_symlinks=False)
                        except FileNotFoundError:
                            return True
                        return False

                    if not still_gone():
                        continue
                    pieces = collect_orphans(
                        root, self._path, name, self._strict, min_age, still_gone=still_gone
                    )
                    run_id = run_of(name)
                    found.extend(_statelog.Orphan(run_id, k, size) for k, size in pieces)
                return found
            finally:
                os.close(root)
        finally:
            self._handles.end()

    # -- listing and housekeeping -------------------------------------------------------

    def _scan(self, where: str = ".") -> list[os.DirEntry[str]]:
        dir_fd = self._handles.begin()
        try:
            with translating(self._path, "" if where == "." else where):
                active_fd = self._handles.active_fd
                if where == ACTIVE and active_fd is not None:
                    # The index the markers are written to, not whatever is at the name
                    # now (a symlink or FIFO swapped in since the store opened).
                    return scan(active_fd, ".")
                return scan(dir_fd, where)
        finally:
            self._handles.end()

    def list_runs(self) -> Iterator[str]:
        entries = self._scan()  # scan now, so errors surface at the call
        return self._run_ids(entries)

    def _run_ids(self, entries: list[os.DirEntry[str]]) -> Iterator[str]:
        for entry in entries:
            file_name = entry.name
            if not file_name.endswith(".json"):
                continue
            stem = file_name[:-5]
            try:
                regular = entry.is_file(follow_symlinks=False)
            except OSError:
                continue  # gone since the scan
            if not regular:
                # A symlink, directory or FIFO named like a run: not ours; never let it
                # stop a listing, a prune or a migration.
                logger.warning(
                    "skipping %s: not a regular file, so not a checkpoint the file store wrote",
                    self._file(file_name),
                )
                continue
            if HASHED_NAME.fullmatch(stem) is None:
                run_id = decode_name(stem)
                if run_id is not None:
                    yield run_id
                continue
            try:
                cp = self._load(stem, None, keep=False)  # its run_id only
            except CorruptCheckpoint as exc:
                logger.warning("skipping %s in list_runs: %s", self._file(file_name), exc)
                continue
            if cp is not None:
                yield cp.run_id

    def list_info(self) -> Iterator[RunInfo]:
        """Yield a ``RunInfo`` per run from its document alone: a state kept in pieces is
        not read, so a listing (and the dashboard's page and counts, built on it) costs
        the same whatever the size of the states.
        """
        for run_id in self.list_runs():
            try:
                cp = self._load(encode_name(run_id), run_id, keep=False)
            except CorruptCheckpoint as exc:
                logger.warning("skipping run %r in listing: %s", run_id, exc)
                continue
            if cp is not None:
                yield RunInfo.of(cp)

    def claimable(
        self,
        now: datetime,
        limit: int = 100,
        *,
        status: RunStatus | None = None,
        skip: int = 0,
    ) -> list[RunInfo]:
        """Return the runs a worker may have to act on, from the ``.active/`` index.

        Only runs with a marker are read (queued, running and waiting ones, plus markers
        not yet cleaned up), so the cost does not grow with finished runs. Each marker is
        re-checked by loading its run; markers of runs at rest are removed. With
        ``status``, one page of that kind (``Store.claimable``).

        Raises:
            ValueError: ``status`` is not an active status, or ``skip`` is negative.
            StoreError: the index cannot be read.
        """
        check_page(status, skip)
        self._handles.fd()
        if self._handles.active_fd is None:
            logger.warning("no index of active runs (%s): scanning every run", self._index_error)
            return super().claimable(now, limit, status=status, skip=skip)
        dir_fd = self._handles.begin()
        try:
            found = self._claimable_in(dir_fd, now, limit if status is None else None)
        finally:
            self._handles.end()
        if status is None:
            return found
        # Running runs first, then the due ones: each kind is in due_at order.
        return [info for info in found if info.status == status][skip : skip + limit]

    def _claimable_in(self, dir_fd: int, now: datetime, limit: int | None) -> list[RunInfo]:
        running: list[RunInfo] = []
        due: list[RunInfo] = []
        for entry in self._scan(ACTIVE):
            name = entry.name
            ours, run_id = marker_run(name)
            if not ours:
                logger.warning("skipping %s: not an index marker", self._file(f"{ACTIVE}/{name}"))
                continue
            try:
                # The metadata only: a long state's pieces are not read to list it.
                cp = self._load(name, run_id, keep=False)
            except CorruptCheckpoint as exc:
                logger.warning("skipping run %r in claimable: %s", run_id or name, exc)
                continue
            active_fd = self._handles.active_fd
            if cp is None:
                if active_fd is not None:
                    drop_orphan(active_fd, dir_fd, self._path, name)
                continue
            status = cp.status
            if status not in ACTIVE_STATUSES:
                self._drop_rest_marker(dir_fd, name)
                continue
            info = RunInfo.of(cp)
            if status == "running":
                running.append(info)
            elif info.due_at is not None and info.due_at <= now:
                due.append(info)
        running.sort(key=lambda info: info.due_at or now)
        due.sort(key=lambda info: info.due_at or now)
        return running[:limit] + due[:limit]

    def _drop_rest_marker(self, dir_fd: int, name: str) -> None:
        # Re-checked under the document's lock: whoever makes the run active again marks
        # it under the same lock, so the marker cannot be lost in between.
        try:
            locked = self._handles.lock_current(dir_fd, name)
            if locked is None:
                return
            lock_fd, st = locked
            try:
                doc, _ = self._parse(lock_fd, st.st_size, name + ".json", None)
                if not doc_active(doc):
                    sync(dir_fd)  # the rest state must be durable before the marker goes
                    self._unmark(name)
            finally:
                self._handles.release(lock_fd)
        except (OSError, StoreError) as exc:
            logger.debug("could not clean index marker %s: %s", name, exc)

    def _remove_stale_temps(self) -> None:
        """Delete ``.tmp-*`` files left by writers that crashed; best effort."""
        try:
            dir_fd = self._handles.fd()
            names = [entry.name for entry in self._scan()]
        except StoreError as exc:
            logger.debug("could not clean temp files in %s: %s", self._path, exc)
            return
        remove_stale_temps(dir_fd, self._path, names)

    # -- the pieces of long states (``_pieces``) ---------------------------------------

    def piece_keys(self, run_id: str) -> list[str]:
        """Every piece key stored for ``run_id``, sorted (history, migration, checks).

        Raises:
            StoreError: something not ours is where the run's pieces go, or a call failed.
        """
        check_run_id(run_id)
        dir_fd = self._handles.begin()
        try:
            run = self._piece_dir(dir_fd, encode_name(run_id), create=False, lock=False)
            if run is None:
                return []
            try:
                return run.keys()
            finally:
                run.close()
        finally:
            self._handles.end()

    def pieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The data of those of ``keys`` stored for ``run_id``; absent keys are absent.

        Raises:
            ValueError: a key is not a piece key (``_pieces.KEY``).
            CorruptCheckpoint: something not ours is at a key.
            StoreError: something not ours is where the run's pieces go, or a call failed.
        """
        check_run_id(run_id)
        wanted = [check_key(key) for key in keys]
        dir_fd = self._handles.begin()
        try:
            return self._read_pieces(dir_fd, encode_name(run_id), wanted)
        finally:
            self._handles.end()

    def put_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> None:
        """Store ``pieces`` for ``run_id`` durably; a key already stored keeps its data.

        Raises:
            ValueError: a key is not a piece key, or does not start with its generation.
            CheckpointTooLarge: a piece is over ``MAX_DOCUMENT_BYTES``.
            StoreError: something not ours is where the run's pieces go, or a call failed.
        """
        check_run_id(run_id)
        for piece in pieces:
            check_key(piece.key)
            if _statelog.gen_of(piece.key) != piece.gen:
                raise ValueError(f"piece {piece.key!r} says generation {piece.gen}")
            if not isinstance(piece.data, bytes):
                raise TypeError(f"piece {piece.key!r}: data must be bytes")
            if len(piece.data) > MAX_DOCUMENT_BYTES:
                raise too_large(run_id, len(piece.data), MAX_DOCUMENT_BYTES)
        if not pieces:
            return
        dir_fd = self._handles.begin()
        try:
            run = self._piece_dir(dir_fd, encode_name(run_id), create=True, lock=True)
            assert run is not None
            try:
                run.write(pieces)
            finally:
                run.close()
        finally:
            self._handles.end()

    def listen(self, ring: Callable[[], None]) -> DirectoryListener | None:
        """Watch the store's directory with inotify; call ``ring`` when a run is saved.

        The directory watched is the one this store holds open and judged when it was
        opened (``_notify`` says why the directory and not only ``.active/``). None on
        systems without inotify: the worker polls.

        Raises:
            StoreError: the store is closed.
        """
        dir_fd = self._handles.begin()
        try:
            return listen_directory(dir_fd, self._path, ring)
        finally:
            self._handles.end()

    def close(self) -> None:
        self._handles.close()

    def __del__(self) -> None:
        # Only a safety net for a forgotten close(); never raise from a finaliser.
        with contextlib.suppress(Exception):
            self.close()
