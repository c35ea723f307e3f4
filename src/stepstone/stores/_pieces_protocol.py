"""The pieces protocol, once: how a store with a long state in pieces saves, loads and
deletes a run (``_statelog``), for the SQL, Cosmos and file stores.

- **save**: write the save's pieces (immutable, under keys nobody else uses), then
  commit the document by its one compare-and-swap, which names them. A save whose
  answer was lost keeps its plan for its retry (``Unanswered``); the retry writes that
  same plan, and a compare-and-swap that misses only because the first attempt landed
  is that attempt's success. A save that lost drops its own pieces; after any other
  error whether the document landed is unknown, so they stay (a later base collects
  them). After a new base at generation ``g``, the incarnation's pieces below ``g`` (and
  old orphans) are collected; a failure there is only logged (the save is done).
- **load**: the document, its pieces fetched when it names some. A piece missing means
  a newer save collected it: the document is read again (after a back-off where reads
  may lag behind writes, as on a Cosmos account below Strong consistency).
- **delete**: read the document, delete it by compare-and-swap on the version read,
  then delete exactly that document's incarnation's pieces (none when there was no
  document: a first save in flight may have written its own already).

The protocol is written as generators over the store's own effects (``Exec`` of the
SQL store, the SDK calls of the Cosmos store), so each store's sync and async drivers
run it unchanged. A store supplies the hooks (``_pp_*``): each either returns at once
or is itself a generator of that store's effects, and keeps its store's error
translation. ``ctx`` is whatever a store needs to name the run in them (its key, its
container and item id): the protocol only passes it along.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, ClassVar, Final, Generic, NamedTuple, TypeVar

from .. import _hooks, _statelog
from .._checkpoint import Checkpoint
from .._codec import PiecesNeeded
from .._errors import ConflictError, CorruptCheckpoint, StoreError, StoreUnavailable
from .._observe import logger
from ._common import Unanswered

__all__ = ["DELETE_TRIES", "READ_AGAIN", "Current", "PiecesProtocol", "run_plain"]

E = TypeVar("E")
T = TypeVar("T")
#: A step of the protocol: yields the store's effects, is sent their results.
Steps = Generator[E, Any, T]

#: How many times ``delete`` reads a document that keeps changing before giving up.
DELETE_TRIES: Final = 50
#: How many times a load reads again a document that keeps being replaced while its
#: pieces are fetched (reads that do not lag) before it gives up with
#: ``StoreUnavailable``.
READ_AGAIN: Final = 50


def run_plain(steps: Steps[None, T]) -> T:
    """Run the protocol for a store whose hooks do their I/O themselves (yield nothing)."""
    try:
        effect = steps.send(None)
    except StopIteration as stop:
        value: T = stop.value
        return value
    steps.close()
    raise TypeError(f"a plain store's hook yielded an effect: {effect!r}")


class Current(NamedTuple):
    """What ``delete`` needs of the stored document: its version and its incarnation."""

    version: Any
    #: Whether the document has a state in pieces at all (``_statelog.inc_of_doc``).
    has_pieces: bool
    #: Its incarnation; None for a legacy lineage (keys without one).
    inc: str | None


class PiecesProtocol(Generic[E]):
    """The protocol as methods over hooks; a store class inherits it and fills them in.

    ``E``: the store's effect type.
    """

    __slots__ = ()

    _unanswered: Unanswered

    #: Lagging reads only: how many times a load fetches pieces before a missing one
    #: is damage (other stores: the same document missing one is, at once).
    _pieces_reads: ClassVar[int] = 3
    #: Reads may lag behind writes (Cosmos below Strong consistency): after a missing
    #: piece, wait (``_pp_pause``) and read again, even a document of the same version,
    #: but give up after the last fetch without reading again. Otherwise the document is
    #: read again at once, and the same version missing a piece twice is damage.
    _pieces_lagging: ClassVar[bool] = False
    #: The store writes a save's pieces inside the transaction of its compare-and-swap
    #: (``_pp_write`` only plans them, ``_pp_commit`` runs them; the SQL stores): they
    #: land with the document or not at all. So a lost save has no pieces to drop, and
    #: the store fires ``pieces.written`` itself, inside that transaction.
    _pieces_in_commit: ClassVar[bool] = False

    # --- hooks ----------------------------------------------------------------------

    def _pp_plan(self, checkpoint: Checkpoint) -> Any:
        """Plan a save (encode and check it, before any I/O)."""
        raise NotImplementedError

    def _pp_prepared(self, plan: Any) -> _statelog.Prepared:
        """The state's plan inside a save's plan (its pieces, its collection)."""
        raise NotImplementedError

    def _pp_run_id(self, plan: Any) -> str:
        raise NotImplementedError

    def _pp_begin(self, plan: Any) -> Steps[E, Any]:
        """The ``ctx`` of a save (after planning it, before any write)."""
        raise NotImplementedError

    def _pp_end(self, ctx: Any) -> None:
        """Release what ``_pp_begin`` took (the file store's locks), however the save
        ended. Default: nothing."""

    def _pp_write(self, ctx: Any, pieces: Sequence[_statelog.Piece], retry: bool) -> Steps[E, None]:
        """Write ``pieces``; ``retry``: some may be stored already (keep them)."""
        raise NotImplementedError

    def _pp_commit(self, ctx: Any, plan: Any, checkpoint: Checkpoint) -> Steps[E, Any]:
        """Write the document by compare-and-swap; ``ConflictError`` when it missed."""
        raise NotImplementedError

    def _pp_own(self, ctx: Any, plan: Any) -> Steps[E, Any]:
        """After a retry's compare-and-swap missed: the stored document's result if it is
        the one ``plan`` wrote (the first attempt landed), else None."""
        raise NotImplementedError

    def _pp_saved(self, plan: Any, checkpoint: Checkpoint, result: Any) -> Checkpoint:
        """The checkpoint a save returns, from its plan and its commit's result."""
        raise NotImplementedError

    def _pp_drop(self, ctx: Any, keys: list[str]) -> Steps[E, None]:
        """Delete exactly these pieces (a lost save's own); ``StoreError`` if it failed."""
        raise NotImplementedError

    def _pp_collected(self, ctx: Any) -> bool:
        """Whether the save's commit already collected what ``_pp_collect`` would."""
        return False

    def _pp_collect(self, ctx: Any, below: int, inc: str | None) -> Steps[E, None]:
        """Delete incarnation ``inc``'s pieces below generation ``below`` and old orphans
        of other incarnations (``_statelog.is_orphan``), never another's young pieces."""
        raise NotImplementedError

    def _pp_source(self, ctx: Any) -> str:
        """Where the run is stored, for messages."""
        raise NotImplementedError

    def _pp_decode(self, ctx: Any, doc: Any, version: Any, found: dict[str, bytes] | None) -> Any:
        """The checkpoint of a document: ``PiecesNeeded`` if ``found`` is None and its
        state is in pieces, ``PiecesMissing`` if one of them is not in ``found``."""
        raise NotImplementedError

    def _pp_fetch(self, ctx: Any, keys: Sequence[str]) -> Steps[E, dict[str, bytes]]:
        """Those of the pieces ``keys`` that are stored."""
        raise NotImplementedError

    def _pp_read(self, ctx: Any) -> Steps[E, tuple[Any, Any] | None]:
        """The stored document and its version, or None if there is none."""
        raise NotImplementedError

    def _pp_pause(self, attempt: int) -> E:
        """The back-off before reading again (``_pieces_lagging`` stores only)."""
        raise NotImplementedError

    def _pp_current(self, ctx: Any) -> Steps[E, Current | None]:
        """For ``delete``: the stored document's ``Current``, or None if there is none."""
        raise NotImplementedError

    def _pp_delete_conflict(self, run_id: str, expected: str, found: Any) -> ConflictError:
        raise NotImplementedError

    def _pp_delete_cas(self, ctx: Any, version: Any) -> Steps[E, bool]:
        """Delete the document if it still has ``version``; whether it did."""
        raise NotImplementedError

    def _pp_delete_inc(self, ctx: Any, inc: str | None) -> Steps[E, None]:
        """Delete every piece of incarnation ``inc`` (None: every legacy piece)."""
        raise NotImplementedError

    # --- the protocol ---------------------------------------------------------------

    def _pieces_save(self, checkpoint: Checkpoint) -> Steps[E, Checkpoint]:
        """Save ``checkpoint``: pieces first, then the document by compare-and-swap."""
        # A retry of a save whose answer was lost writes what that save planned: the
        # same version token, document and pieces (``Unanswered``).
        again = self._unanswered.take(checkpoint, checkpoint.run_id)
        plan = self._pp_plan(checkpoint) if again is None else again
        ctx = yield from self._pp_begin(plan)
        try:
            return (yield from self._pieces_save_in(ctx, plan, again, checkpoint))
        finally:
            self._pp_end(ctx)

    def _pieces_save_in(
        self, ctx: Any, plan: Any, again: Any, checkpoint: Checkpoint
    ) -> Steps[E, Checkpoint]:
        """``_pieces_save`` once it has its ``ctx``."""
        prepared = self._pp_prepared(plan)
        run_id = self._pp_run_id(plan)
        if prepared.pieces:
            # Immutable and under keys nobody else uses: written before the document
            # names them; the save's commit point is still the one write below.
            yield from self._pp_write(ctx, prepared.pieces, again is not None)
            if not self._pieces_in_commit:
                _hooks.fire("pieces.written")
        try:
            result = yield from self._pp_commit(ctx, plan, checkpoint)
        except ConflictError:
            ours = None
            if again is not None:
                try:
                    ours = yield from self._pp_own(ctx, plan)
                except BaseException:
                    self._unanswered.keep(checkpoint, run_id, plan)
                    raise
            if ours is None:
                # Lost: this save's own pieces are garbage. Written with the swap, they
                # went with it (and a retry's first attempt, had it landed, left pieces
                # that are a stored document's, not garbage).
                if prepared.pieces and not self._pieces_in_commit:
                    try:
                        yield from self._pp_drop(ctx, prepared.piece_keys)
                    except StoreError as exc:
                        logger.warning("pieces of a lost save left behind: %s", exc)
                raise
            # The retried save's own write landed (nobody else writes its plan): this is
            # its success, and its pieces are the stored document's.
            result = ours
        except BaseException:
            # Whether the document landed is unknown: its pieces stay (a later base
            # collects them if it did not), and its plan is kept for a retry.
            self._unanswered.keep(checkpoint, run_id, plan)
            raise
        saved = self._pp_saved(plan, checkpoint, result)
        below = prepared.collect_below
        if below is not None:
            _hooks.fire("pieces.collect")
            if self._pp_collected(ctx):
                return saved  # collected in the save's own transaction
            try:
                yield from self._pp_collect(ctx, below, prepared.inc)
            except StoreError as exc:
                logger.warning(
                    "run %r: saved; its superseded pieces are left for the next base: %s",
                    run_id,
                    exc,
                )
        return saved

    def _pieces_load(self, ctx: Any, doc: Any, version: Any) -> Steps[E, Any]:
        """The checkpoint of a stored document, its pieces fetched when it has them;
        None if the run was deleted while they were read."""
        try:
            return self._pp_decode(ctx, doc, version, None)
        except PiecesNeeded as need:
            ref = need.ref
        lagging = self._pieces_lagging
        # Lagging reads: a missing piece may only not have arrived yet, so each try
        # counts. Otherwise only a document replaced since it was read counts: the same
        # version missing a piece is damage at once, while a writer saving new bases
        # faster than this reader fetches them is progress, not damage, and a long run
        # of it (seen on a loaded MariaDB: three in a row) must not read as corruption.
        tries = self._pieces_reads if lagging else READ_AGAIN
        for attempt in range(tries):
            try:
                keys = _statelog.pieces_of(ref)
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptCheckpoint(
                    f"{self._pp_source(ctx)}: malformed state_ref ({exc}); left untouched"
                ) from exc
            found = yield from self._pp_fetch(ctx, keys)
            try:
                return self._pp_decode(ctx, doc, version, found)
            except _statelog.PiecesMissing as exc:
                missing = exc
            last = attempt == tries - 1
            if lagging:
                if last:
                    raise _statelog.missing_error(self._pp_source(ctx), missing) from None
                yield self._pp_pause(attempt)
            # A newer save collected them: read the document again.
            read = yield from self._pp_read(ctx)
            if read is None:
                return None  # a delete landed while its pieces were read: the run is gone
            if not lagging and read[1] == version:
                raise _statelog.missing_error(self._pp_source(ctx), missing) from None
            if last:
                raise StoreUnavailable(
                    f"{self._pp_source(ctx)}: its state was replaced {tries} times while "
                    "its pieces were read (a writer saving faster than this reader); "
                    "nothing is damaged: read it again"
                )
            doc, version = read
            try:
                return self._pp_decode(ctx, doc, version, None)
            except PiecesNeeded as need:
                ref = need.ref
        raise AssertionError("unreachable")  # pragma: no cover

    def _pieces_delete(self, ctx: Any, run_id: str, expected: str | None) -> Steps[E, bool]:
        """Delete the run's document by compare-and-swap, then its incarnation's pieces."""
        for _ in range(DELETE_TRIES):
            current = yield from self._pp_current(ctx)
            if current is None:
                return False
            if expected is not None and current.version != expected:
                raise self._pp_delete_conflict(run_id, expected, current.version)
            deleted = yield from self._pp_delete_cas(ctx, current.version)
            if not deleted:
                continue  # saved (or deleted) in between: read it again
            if current.has_pieces:
                _hooks.fire("pieces.deleting")  # the document is gone, its pieces not yet
                yield from self._pp_delete_inc(ctx, current.inc)
            return True
        raise ConflictError(
            f"run {run_id!r}: changed under each of {DELETE_TRIES} attempts to delete it; "
            "nothing was deleted, try again",
            run_id,
        )
