"""The Store contract every backend implements."""

from __future__ import annotations

import abc
import heapq
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Self

from ._checkpoint import ACTIVE_STATUSES, STATUSES, Checkpoint, keep_times
from ._closing import Closing
from ._errors import StoreError
from ._incarnation import ORPHAN_AGE
from ._runinfo import (
    Claim,
    Diagnosis,
    Listener,
    PageAsk,
    ReadyAsk,
    RunInfo,
    check_page,
    infos_of,
    page_key,
)
from ._store_compat import _delete, _to_thread, aclaim_page, claim_page
from ._store_many import asave_in_order, check_many, save_in_order
from ._wake import Doorbell

if TYPE_CHECKING:
    from ._checkpoint import RunStatus
    from ._incarnation import Orphan
    from ._statelog import Piece

__all__ = [
    "Claim",
    "Diagnosis",
    "Listener",
    "RunInfo",
    "Store",
    "aclaim_page",
    "check_page",
    "claim_page",
    "page_key",
]


class Store(Closing, abc.ABC):
    """Keeps at most one checkpoint per run_id, with compare-and-swap saves.

    Subclasses implement the five abstract methods and ``from_config``; a backend that
    forgets one fails when constructed. Every method may raise ``StoreUnavailable`` or
    ``StorePermissionError`` when the backend cannot be reached or refuses access.

    Async counterparts (``aload``, ``asave``, ...) sit beside the sync methods with the
    same names plus an ``a`` prefix; by default they run the sync method in a thread,
    and a backend with a native async driver overrides them.

    Wake-ups (``stepstone._wake``): after a write that makes work for a worker (a run
    started, a signal, a child's completion, a lease given back) the writer rings the
    store object's ``doorbell``, which wakes every worker of this process serving it,
    and calls ``announce``, which tells other processes. A worker subscribes to the
    doorbell and calls ``listen`` while it serves. A backend that can push across
    processes overrides ``announce`` (PostgreSQL: ``NOTIFY``) and ``listen`` (``LISTEN``)
    and declares ``pushes_wakeups``; the defaults do nothing and return None, and the
    worker then looks quickly after activity and backs off to its poll interval when
    idle. Either way a lost notification only delays work until the next poll.
    """

    #: The config-string scheme that selects this backend, e.g. ``"sqlite"``.
    scheme: ClassVar[str] = ""

    # What the backend can do, declared once, read by the contract suite, the chaos
    # harness and the CLI (instead of probing with getattr).

    #: Named durability settings, the default first (``("full", "none")`` for files);
    #: empty when the store has a single, fixed durability (the server's, say).
    durability_levels: ClassVar[tuple[str, ...]] = ()
    #: Hook points inside a save (``stepstone._hooks``) mapped to whether the new
    #: checkpoint is visible after the process is killed there.
    kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType({})
    #: The same for the points inside the save of a long state only (its pieces are
    #: written, then the document swapped, then old pieces collected: ``_statelog``),
    #: kept apart because a small state's save never reaches them.
    piece_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType({})
    #: Points inside the clean-up of pieces, outside any save: ``pieces.deleting`` (a
    #: ``delete`` removed the document, not yet its pieces) and ``pieces.collecting``
    #: (``collect_orphans`` between two deletions) -> whether the operation's effect on
    #: the documents has landed at a kill there. The chaos harness's churn cases die there.
    cleanup_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType({})
    #: The checkpoints outlive the process (False only for ``memory://``).
    durable: ClassVar[bool] = True
    #: The backend can expire runs by itself (``expire``, Cosmos TTL).
    supports_ttl: ClassVar[bool] = False
    #: The store counts the requests it sends in ``requests_sent``.
    counts_requests: ClassVar[bool] = False
    #: ``aload``/``asave``/... use a native async driver rather than a thread.
    native_async: ClassVar[bool] = False
    #: ``claimable``/``aclaimable`` take ``status=`` and ``skip=`` (one kind of run, paged).
    #: False for a store written before paging: the worker then cuts pages from longer
    #: answers (slower, never stuck). Every built-in backend declares True.
    claims_by_kind: ClassVar[bool] = False
    #: ``claim_ready``/``aclaim_ready`` claim the runs that need no judgement (unowned,
    #: due, of a served workflow) in one call, returning the claimed records: workers
    #: then load nothing to claim them. False: the worker loads and saves each one.
    claims_in_one_call: ClassVar[bool] = False
    #: ``save_many`` commits its saves in one transaction (SQLite's group commit).
    saves_together: ClassVar[bool] = False
    #: The ``asave`` this class defines never suspends (it awaits nothing), so ``arun``
    #: needs no shielded task per save: a cancellation cannot land inside it.
    asave_never_suspends: ClassVar[bool] = False
    #: ``listen`` returns a ``Listener`` that hears ``announce`` from other processes, so
    #: a worker may sleep its whole poll interval between looks (PostgreSQL's
    #: ``LISTEN``/``NOTIFY``). False: ``listen`` returns None and workers back off.
    pushes_wakeups: ClassVar[bool] = False
    #: A state past ``_statelog.INLINE_MAX`` is kept in immutable pieces beside the run's
    #: document, which names them (``stepstone._statelog``); ``piece_keys``, ``pieces``
    #: and ``put_pieces`` reach them. False: the state is always inside the document (a
    #: store written before pieces), and the piece methods raise ``NotImplementedError``.
    holds_pieces: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: str) -> Self:
        """Open the store described by a config string of this backend's scheme.

        Raises:
            ConfigError: the string is malformed or has parts this backend does not know;
                the message lists the valid forms.
        """

    @abc.abstractmethod
    def load(self, run_id: str) -> Checkpoint | None:
        """Return the run's checkpoint, or None if the run never started.

        Raises:
            InvalidRunId: ``run_id`` is not 1-1024 characters without control characters.
            CorruptCheckpoint: what is stored is not a readable checkpoint; it is left as is.
        """

    @abc.abstractmethod
    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Store ``checkpoint`` if the stored version still equals ``checkpoint.version``.

        ``version`` None means nothing may be stored for the run yet. The write is atomic:
        afterwards a load sees either the old or the new checkpoint, never a mix.

        Returns:
            The checkpoint as stored, with its new ``version``, ``updated_at`` and
            ``state_json`` set and a ``state`` that shares nothing with the argument.

        Raises:
            ConflictError: the stored version differs; nothing was stored.
            InvalidState: the state does not round-trip through JSON; nothing was stored.
            CheckpointTooLarge: the encoded checkpoint is over the backend's limit.
        """

    def save_many(self, checkpoints: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
        """Save each checkpoint as ``save`` would; return each outcome, in order: the
        checkpoint as stored or the ``Exception`` its save raised. One failing fails no
        other (``stepstone._store_many``); at most one checkpoint per run (ValueError),
        each a ``Checkpoint`` (TypeError). With ``saves_together`` one commit holds them."""
        return save_in_order(self, check_many(checkpoints))

    async def asave_many(self, checkpoints: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
        """Async ``save_many``."""
        return await asave_in_order(self, check_many(checkpoints))

    def expire(self, run_id: str, ttl_seconds: int | None) -> bool:
        """Let the backend delete the run by itself ``ttl_seconds`` after its last write.

        Only where ``supports_ttl`` is True (Cosmos DB's native TTL); returns False if
        there is no such run.

        Raises:
            StoreError: this backend has no native TTL (``supports_ttl`` is False).
        """
        raise StoreError(
            f"the {self.scheme or type(self).__name__} store has no native TTL "
            f"(cannot expire {run_id!r}); delete the run instead"
        )

    @abc.abstractmethod
    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Delete the run's checkpoint; return whether there was one.

        With ``expected_version``, the delete is compare-and-swap like a save: it happens
        only if the stored version is still that one. Prune and anything else that
        deletes on the strength of what it read passes the version it read.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
            ConflictError: ``expected_version`` was given and the stored version differs
                (the run advanced meanwhile); nothing was deleted. A run that no longer
                exists returns False instead.
        """

    @abc.abstractmethod
    def list_runs(self) -> Iterator[str]:
        """Yield the run_ids stored, in no particular order."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and handles. Closing twice is allowed."""

    def list_info(self) -> Iterator[RunInfo]:
        """Yield a ``RunInfo`` per stored run. Backends with an index override this.

        A run whose checkpoint is corrupt is logged and skipped: one bad document must
        not hide every other run from an operator listing or pruning the store.
        """
        yield from infos_of(self.list_runs(), self.load)

    def claimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """Return the runs a worker may have to act on, from an index where there is one.

        That is every run in status ``running`` (a worker watches them for an expired
        lease) and the runs in status ``queued`` or ``waiting`` whose ``due_at`` is at or
        before ``now``, ordered by ``due_at``; at most ``limit`` of each kind. Finished,
        failed and cancelled runs are never read: the cost of a claim must not grow with
        them. The default scans ``list_info``; every built-in backend overrides it with an
        indexed query on (status, due_at).

        With ``status`` (``running``, ``queued`` or ``waiting``) only that kind is
        returned, a page of at most ``limit`` after the first ``skip`` in due_at order:
        a worker pages past runs it cannot serve (another workflow or version) and
        through every running run, whatever due_at a skewed clock wrote. A page shorter
        than ``limit`` is the last.

        The result is a hint: a worker acts on it only by compare-and-swap on the version.

        Raises:
            ValueError: ``status`` is not an active status, or ``skip`` is negative.
        """
        check_page(status, skip)
        running: list[RunInfo] = []
        due: list[RunInfo] = []
        for info in self.list_info():
            if status is not None and info.status != status:
                continue
            if info.status == "running":
                running.append(info)
            elif info.status in ACTIVE_STATUSES and info.due_at is not None and info.due_at <= now:
                due.append(info)
        due.sort(key=lambda info: info.due_at or now)
        if status is None:
            return running[:limit] + due[:limit]
        running.sort(key=lambda info: info.due_at or now)
        return (running or due)[skip : skip + limit]

    def list_page(
        self,
        status: RunStatus | None = None,
        *,
        prefix: str = "",
        after: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[RunInfo]:
        """Return one page of a listing: runs most recently updated first (the dashboard's).

        Only runs with ``status`` (any status if None) whose id starts with ``prefix``;
        ``after`` is the ``page_key`` of the last run of the previous page (keyset paging,
        so a page costs the same at any depth and runs saved meanwhile never shift it).
        The default scans ``list_info``; a backend with a (status, updated_at) index may
        override ``_list_page`` with an indexed query.
        """
        return self._list_page(PageAsk(status, prefix, after, limit))

    def _list_page(self, ask: PageAsk) -> list[RunInfo]:
        status, prefix, after, limit = ask
        found = (
            info
            for info in self.list_info()
            if (status is None or info.status == status)
            and info.run_id.startswith(prefix)
            and (after is None or page_key(info) < after)
        )
        return heapq.nlargest(limit, found, key=page_key)

    def version_of(self, run_id: str) -> str | None:
        """Return the stored version of the run, or None if there is none: a cheap look
        for a page that polls for changes. The default loads the run; backends that can
        read the version alone override it.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
        """
        cp = self.load(run_id)
        return None if cp is None else cp.version

    def count_by_status(self, prefix: str = "") -> dict[str, int]:
        """Return how many runs whose id starts with ``prefix`` have each status.

        The default scans ``list_info``; a backend with a status index may override it.
        """
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for info in self.list_info():
            if info.run_id.startswith(prefix):
                counts[info.status] += 1
        return counts

    def import_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint:
        """Save a checkpoint copied from another store, keeping its timestamps.

        The contract of ``save`` (compare-and-swap on ``checkpoint.version``, atomic),
        except that the stored ``created_at`` and ``updated_at`` are the checkpoint's own
        rather than now, so ``stepstone migrate`` keeps each run's age and ``prune
        --older-than`` treats migrated runs as it treated the originals.

        Raises:
            StepstoneError: the errors of ``save``.
        """
        token = keep_times.set(True)
        try:
            return self.save(checkpoint)
        finally:
            keep_times.reset(token)

    def init(self) -> list[str]:
        """Create what the backend needs (tables, database, container) if it may.

        Returns:
            One line per thing created or found; backends that create everything on first
            use return a line saying so.

        Raises:
            StorePermissionError: the credentials may not create it; the message says
                what to provision by hand.
        """
        return [f"{self.scheme} store: created on first use, nothing to do"]

    def doctor(self) -> list[Diagnosis]:
        """Check connectivity, permissions and schema; return one ``Diagnosis`` per check.

        The default writes, reads and deletes a probe run under a reserved id. Backends
        add their own checks (schema version, partition key) by extending the list.
        """
        probe = f"__stepstone_doctor__/{os.getpid()}-{time.monotonic_ns()}"
        results: list[Diagnosis] = []

        def check(name: str, action: Callable[[], object]) -> bool:
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - any failure is the diagnosis
                results.append(Diagnosis(name, False, f"{type(exc).__name__}: {exc}"))
                return False
            results.append(Diagnosis(name, True, "ok"))
            return True

        if check("list runs (read access)", lambda: next(iter(self.list_runs()), None)):
            saved: list[Checkpoint] = []
            if check(
                "save a probe run (write access)",
                lambda: saved.append(self.save(Checkpoint(run_id=probe, total_steps=0))),
            ):
                check("load the probe run", lambda: self.load(probe))
                check("delete the probe run", lambda: self.delete(probe))
        return results

    # --- wake-ups (``stepstone._wake``) -------------------------------------------------

    @property
    def doorbell(self) -> Doorbell:
        """The ``Doorbell`` of this store object: rung after writes that make work.

        Created on first use, one per store object; every worker of this process
        serving this object subscribes to it. Not shared by two objects opened on the
        same data (they ring across with ``announce``/``listen``, as processes do).
        """
        bell: Doorbell | None = self.__dict__.get("_stepstone_doorbell")
        if bell is None:
            # setdefault is atomic: two threads asking at once get the same doorbell.
            bell = self.__dict__.setdefault("_stepstone_doorbell", Doorbell())
        return bell

    def announce(self) -> None:
        """Tell workers in other processes to look at the claim index now.

        Called (through ``stepstone._wake.announce``) after a write that makes work for
        a worker has landed. The default does nothing: this backend has no push across
        processes. A backend that has one sends a small notification and returns; a
        failure may raise any ``StoreError``, which the caller logs at DEBUG and
        ignores (workers find the work at their next poll).

        Raises:
            StoreError: the notification could not be sent.
        """
        return  # nothing to tell: this backend has no push across processes

    async def aannounce(self) -> None:
        """Async ``announce``; same contract. Nothing to await unless ``announce`` does work."""
        if type(self).announce is not Store.announce:
            await _to_thread(self.announce)

    def announce_stream(self, run_id: str) -> None:
        """Tell stream readers in other processes that ``run_id``'s stream grew (issue 34).

        Called by a stream writer after each block it appended. The default does
        nothing: readers here are woken by ``listen_stream`` or poll. PostgreSQL sends a
        ``NOTIFY`` on a channel of its own (not the workers': they are not woken).

        Raises:
            StoreError: the notification could not be sent (the writer logs it).
        """
        return

    def listen_stream(
        self, ring: Callable[[], None], *, run_id: str | None = None
    ) -> Listener | None:
        """``listen`` for stream readers: ring after ``announce_stream`` or any write.

        ``run_id`` names the run the reader follows (a store may ring only for its
        flushes; None: any run's). The default is ``listen``: a listener that rings on
        every write (SQLite's ``data_version``, the file store's inotify) serves readers
        as it is.

        Raises:
            StoreError: listening could not be set up; the reader polls.
        """
        return self.listen(ring)

    def listen(self, ring: Callable[[], None]) -> Listener | None:
        """Call ``ring`` whenever another process announces work, until the result is closed.

        ``ring`` is cheap and thread-safe (it sets an event); it may be called from a
        thread of the listener's own, spuriously, or more than once per announcement.
        The default returns None: this backend has no push across processes, and the
        worker falls back to an adaptive back-off (quick looks after activity, its
        poll interval when idle). Announcements a listener misses (its connection
        lost, say) only delay work until the worker's next poll; one that gets its
        connection back should ring once, since it may have missed some.

        Raises:
            StoreError: listening could not be set up; the worker logs it and polls.
        """
        return None

    #: Seconds between ticks of ``server_now``'s clock (0: finer than a microsecond).
    server_clock_resolution: ClassVar[float] = 0.0

    def server_now(self) -> datetime | None:
        """Return the time on the store server's clock (aware, UTC), in one round trip.

        The one clock that rates and schedules are judged on (``_store_time``), so that
        processes on hosts with skewed clocks never compare their clocks. None (the
        default): the store has no server of its own (memory, file, SQLite: one host),
        and the host's clock is the store's.
        """
        return None

    async def aserver_now(self) -> datetime | None:
        """Async ``server_now``; the default awaits nothing (no server to ask)."""
        if type(self).server_now is Store.server_now:
            return None
        return await _to_thread(self.server_now)

    # The async defaults run the sync method in a worker thread: correct for any
    # backend (a third-party store written sync-only works under ``arun``), and the
    # event loop never waits on the store's I/O or locks.

    async def aload(self, run_id: str) -> Checkpoint | None:
        """Async ``load``; same contract, same errors."""
        return await _to_thread(self.load, run_id)

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        """Async ``save``; same contract, same errors."""
        return await _to_thread(self.save, checkpoint)

    async def adelete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Async ``delete``; same contract, same errors.

        Without ``expected_version`` it calls ``delete(run_id)``, so a store written to
        the previous contract (no ``expected_version`` argument) keeps working; with one,
        such a store raises ``StoreError`` saying so, and nothing is deleted.
        """
        return await _to_thread(_delete, self, run_id, expected_version)

    async def alist_runs(self) -> AsyncIterator[str]:
        """Async ``list_runs``: an async iterator of run_ids."""
        for run_id in await _to_thread(lambda: list(self.list_runs())):
            yield run_id

    async def alist_info(self) -> AsyncIterator[RunInfo]:
        """Async ``list_info``: an async iterator of ``RunInfo``."""
        for info in await _to_thread(lambda: list(self.list_info())):
            yield info

    async def aclaimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """Async ``claimable``."""
        return await _to_thread(claim_page, self, now, limit, status, skip)

    def claim_ready(
        self,
        owner: str,
        lease: float,
        limit: int,
        served: frozenset[tuple[str, str | None]],
        now: datetime,
        *,
        exclude: frozenset[str] = frozenset(),
    ) -> list[Claim]:
        """Claim up to ``limit`` runs that need no judgement, in one call; return them.

        Only where ``claims_in_one_call`` is True. A run qualifies when nobody owns it,
        its (workflow, workflow_version) is in ``served``, its run_id is not in
        ``exclude``, and it is queued (not cancel-requested), waiting and due by ``now``
        (a timer passed, a signal it waits for arrived), or running with its lease given
        back; earliest due first. Each is stored as ``_lease.claimed(cp, owner, lease)``
        would be saved by compare-and-swap on the version it had (a new version, the
        epoch bumped, ``renewed_at`` and ``updated_at`` set), and workers claiming at
        once never claim one run twice: on a server, runs another claim holds are
        skipped, not waited for. Runs with an owner (takeovers) are left to ``claimable``.

        Returns:
            One ``Claim`` per run claimed: the record as it was and as it is now stored.

        Raises:
            StoreError: this backend does not claim in one call.
        """
        return self._claim_asked(ReadyAsk(owner, lease, limit, served, now, exclude))

    def _claim_asked(self, ask: ReadyAsk) -> list[Claim]:
        """``claim_ready``, for a backend that claims in one call to override."""
        raise StoreError(
            f"the {self.scheme or type(self).__name__} store does not claim in one call "
            "(claims_in_one_call is False); load and save each run instead"
        )

    async def aclaim_ready(
        self,
        owner: str,
        lease: float,
        limit: int,
        served: frozenset[tuple[str, str | None]],
        now: datetime,
        *,
        exclude: frozenset[str] = frozenset(),
    ) -> list[Claim]:
        """Async ``claim_ready``; same contract, same errors."""
        return await self._aclaim_asked(ReadyAsk(owner, lease, limit, served, now, exclude))

    async def _aclaim_asked(self, ask: ReadyAsk) -> list[Claim]:
        # The instance's ``claim_ready``, in a thread: a store that overrides it (written
        # to the contract, not to this hook) is the one called.
        return await _to_thread(lambda: self.claim_ready(*ask[:5], exclude=ask.exclude))

    async def aclose(self) -> None:
        """Async ``close``."""
        await _to_thread(self.close)

    # --- the pieces of long states (``stepstone._statelog``) ------------------------------

    def piece_keys(self, run_id: str) -> list[str]:
        """Every piece key stored for ``run_id``, sorted (history, migration, checks)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no pieces")

    def pieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The data of those of ``keys`` stored for ``run_id``; absent keys are absent."""
        raise NotImplementedError(f"{type(self).__name__} keeps no pieces")

    def put_pieces(self, run_id: str, pieces: Sequence[Piece]) -> None:
        """Store ``pieces`` for ``run_id`` (immutable: a key is written once)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no pieces")

    async def apiece_keys(self, run_id: str) -> list[str]:
        """Async ``piece_keys``."""
        return await _to_thread(self.piece_keys, run_id)

    async def apieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Async ``pieces``."""
        return await _to_thread(self.pieces, run_id, keys)

    async def aput_pieces(self, run_id: str, pieces: Sequence[Piece]) -> None:
        """Async ``put_pieces``."""
        await _to_thread(self.put_pieces, run_id, pieces)

    def collect_orphans(self, min_age: float = ORPHAN_AGE) -> list[Orphan]:
        """Delete orphaned pieces: those of a run with no document, of an incarnation
        made more than ``min_age`` seconds ago (``stepstone._statelog``); return them.

        A writer killed between a first save's pieces and its document leaves such
        pieces. ``min_age`` (by the writing host's clock) keeps any save in flight safe.
        The default: nothing to collect (a store whose saves cannot leave orphans).

        Raises:
            StoreError: the store failed or is unreachable.
        """
        return []

    async def acollect_orphans(self, min_age: float = ORPHAN_AGE) -> list[Orphan]:
        """Async ``collect_orphans``."""
        return await _to_thread(self.collect_orphans, min_age)
