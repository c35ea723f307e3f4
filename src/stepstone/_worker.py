"""``Worker``: claims runs that need work and drives them, until stopped.

A worker polls the store's claim index (``Store.claimable``: running runs, and queued
or waiting runs that are due) and claims runs by compare-and-swap, never by a lock or a
second coordinator: workers on many hosts share one store and nothing else.

- A run nobody owns (queued, due, or given back) is claimed at once.
- A run with an owner is watched: the worker remembers the owner's mark (what only
  the owner writes, ``_lease.owner_mark``; signals and cancel requests do not move it)
  and, on its own monotonic clock, when it first saw it. Once that mark has not
  changed for the owner's whole recorded lease, the owner is presumed dead and the run
  is taken over (a claim that bumps the epoch, fencing the old owner). Wall clocks are
  never compared, so hosts whose clocks disagree neither strand nor steal runs.
- A run recorded under a workflow (name, version) this worker does not serve is left
  alone for a worker that does, logged once, and not loaded again for a minute.
- The index is read a page of one status at a time (the first page of each in one
  call), paging on past what the worker leaves and through every running run, so
  neither a backlog of others' runs nor a skewed due time hides a run from it.

The claim decision is ``_Watch``, shared by ``serve`` (threads running ``run``'s
driver) and ``aserve`` (tasks running ``arun``'s); only the waiting and spawning differ.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Generator, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import _hooks, _lease
from ._checkpoint import Checkpoint, Failure, evolve, utcnow
from ._control import _async, _sync
from ._core import Effect, Interrupted, Plan, _ready, check_names, write
from ._errors import (
    ConflictError,
    InvalidWorkflow,
    RunCancelled,
    StepFailed,
    StepstoneError,
    StoreError,
    Suspended,
    WorkflowChanged,
)
from ._observe import logger
from ._runner import adrive, drive, make_plan
from ._steps import Workflow
from ._store import RunInfo, Store, aclaim_page, claim_page
from ._suspend import Map, nudge

if TYPE_CHECKING:
    from concurrent.futures import Future

    from ._checkpoint import RunStatus

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_GRACE", "DEFAULT_POLL", "Worker"]

DEFAULT_CONCURRENCY = 8
#: Seconds between looks at the claim index when there is nothing to do.
DEFAULT_POLL = 1.0
#: Seconds a stopping worker lets steps in flight finish before it gives up on them.
DEFAULT_GRACE = 30.0
#: Seconds (at least; doubled per repeat, up to ``_COOL_MAX``) a run whose execution
#: ended in an unexpected error is left alone: given back, it is claimable at once, and
#: claiming it straight away would only fail again, in a loop.
_COOL_FIRST = 1.0
_COOL_MAX = 30.0
_CLAIM_BATCH = 100
#: Pages of one kind a worker reads per look at the claim index: runs it must leave
#: (other workflows, versions) and running runs to watch, beyond that, wait for its next.
_MAX_PAGES = 10
#: Seconds before a run of a workflow this worker does not serve is loaded again.
_RECHECK = 60.0
#: Seconds after which a run the index no longer shows is forgotten.
_FORGET = 600.0
#: The claim index's kinds, in the order a worker reads them: takeovers, runs resumed
#: (a signal, a timer, children done), new runs.
_KINDS: tuple[RunStatus, ...] = ("running", "waiting", "queued")


def _index(
    workflows: Iterable[Workflow] | Mapping[Any, Workflow],
) -> dict[tuple[str, str | None], Workflow]:
    items = workflows.values() if isinstance(workflows, Mapping) else workflows
    if isinstance(items, (str, bytes, Workflow)):
        raise InvalidWorkflow("workflows must be a list or dict of Workflow objects")
    table: dict[tuple[str, str | None], Workflow] = {}
    pending = list(items)
    while pending:
        workflow = pending.pop()
        if not isinstance(workflow, Workflow):
            raise InvalidWorkflow(
                f"workflows must be Workflow objects, got {type(workflow).__name__}"
            )
        known = table.get(workflow.key)
        if known is not None and known is not workflow and known.steps != workflow.steps:
            raise InvalidWorkflow(
                f"two different workflows are named {workflow.name!r} version {workflow.version!r}"
            )
        if known is None:
            table[workflow.key] = workflow
            # A Map's child workflow is served too: its children must run somewhere.
            pending.extend(step.workflow for step in workflow.steps if isinstance(step, Map))
    if not table:
        raise InvalidWorkflow("a worker needs at least one Workflow to serve")
    return table


class _Seen:
    """What a worker saw of one run held by another owner (see ``_Watch``)."""

    __slots__ = ("cp_mark", "info_mark", "lease", "sighted", "since")

    def __init__(self, info_mark: Any, cp_mark: Any, since: float, lease: float | None) -> None:
        self.info_mark = info_mark  # the owner's fields the claim index shows
        self.cp_mark = cp_mark  # ``_lease.owner_mark`` of the last load, None until one
        self.since = since  # monotonic: when the owner's mark was first seen as it is
        self.lease = lease  # the owner's recorded lease, once a load told it
        self.sighted = since  # monotonic: when the claim index last showed the run


class _Watch:
    """Which runs to claim now, from what the claim index shows over time (no I/O).

    For each run another owner holds it remembers the owner's mark (what only the owner
    writes: claims, renewals, saves; never signals or cancel requests, see
    ``_lease.owner_mark``), when (monotonic) that mark was first seen, and the owner's
    lease once a load told it. A run is loaded only to learn its lease (once) and when
    that lease may have passed, not on every poll: watching a thousand busy runs costs
    no reads. Runs of workflows this worker does not serve are remembered too, and not
    loaded again for ``_RECHECK`` seconds.

    It also keeps the worker's place in each kind of the claim index (``skip``): runs
    it leaves (another workflow or version) cannot fill its view for ever, and every
    running run comes under watch, whatever due_at its owner's clock wrote.
    """

    def __init__(self) -> None:
        self.seen: dict[str, _Seen] = {}
        self.unserved: set[tuple[str | None, str | None]] = set()
        # run_id -> monotonic time of the load that found its workflow not served here.
        self.left: dict[str, float] = {}
        self.skip: dict[RunStatus, int] = dict.fromkeys(_KINDS, 0)
        self._pruned = time.monotonic()

    def pick(self, infos: list[RunInfo], busy: set[str], now: float) -> list[RunInfo]:
        """Return the runs worth loading to claim, in the index's order."""
        picked: list[RunInfo] = []
        for info in infos:
            run_id = info.run_id
            if run_id in busy:
                continue
            left = self.left.get(run_id)
            if left is not None and now - left < _RECHECK:
                continue
            if info.owner is None:
                picked.append(info)
                continue
            # renewed_at moves with every write of the owner's, and due_at with it.
            mark = (info.owner, info.due_at, info.step, info.status)
            seen = self.seen.get(run_id)
            if seen is None:
                self.seen[run_id] = _Seen(mark, None, now, None)
                picked.append(info)  # loaded once, to learn the owner's lease
                continue
            seen.sighted = now
            if seen.info_mark != mark:
                seen.info_mark, seen.cp_mark, seen.since = mark, None, now
                continue
            if seen.lease is None or now - seen.since >= seen.lease:
                picked.append(info)
        return picked

    def expired(self, cp: Checkpoint, now: float) -> bool:
        """Return whether ``cp``'s owner let its whole lease pass without a write, by our clock."""
        lease = cp.lease or _lease.DEFAULT_LEASE
        mark = _lease.owner_mark(cp)
        seen = self.seen.get(cp.run_id)
        if seen is None:
            self.seen[cp.run_id] = _Seen(None, mark, now, lease)
            return False
        seen.lease = lease
        if seen.cp_mark is None:
            seen.cp_mark = mark
            # The index showed this owner's mark unchanged since ``since``; a running
            # run's due_at moves with each of its owner's writes, so that age holds when
            # the record is the one the index showed. Otherwise count from now.
            if cp.status != "running" or seen.info_mark != (
                cp.owner,
                cp.due_at,
                cp.step,
                cp.status,
            ):
                seen.since = now
                return False
        elif seen.cp_mark != mark:
            seen.cp_mark, seen.since = mark, now
            return False
        return bool(now - seen.since >= lease)

    def leave(self, run_id: str, now: float) -> None:
        """Remember that ``run_id`` is of a workflow this worker does not serve."""
        self.left[run_id] = now
        self.seen.pop(run_id, None)

    def first_look(self, infos: list[RunInfo]) -> dict[str, tuple[list[RunInfo], bool]]:
        """Split one ``claimable(now, limit)`` answer into pages of each kind.

        Each kind's page comes with whether more of that kind may follow: the running
        part was full, or the due part (queued and waiting merged by due_at) was.
        """
        kinds: dict[str, list[RunInfo]] = {status: [] for status in _KINDS}
        for info in infos:
            if info.status in kinds:
                kinds[info.status].append(info)
        due_full = len(kinds["queued"]) + len(kinds["waiting"]) >= _CLAIM_BATCH
        return {
            status: (page, len(page) >= _CLAIM_BATCH if status == "running" else due_full)
            for status, page in kinds.items()
        }

    def at_start(self) -> bool:
        """Whether every kind is read from its earliest due (one combined query serves)."""
        return not any(self.skip.values())

    def turn(
        self, status: RunStatus, got: int, taken: int, more: bool, filled: bool, capped: bool
    ) -> bool:
        """Move past a page of ``got`` runs of ``status``; return whether to read the next now.

        ``taken`` of them were claimed (a claimed queued or waiting run leaves its
        kind, so the next page starts that much earlier); ``more``: the page was full.
        A short page is the last: the next look starts again from the earliest due. A
        worker whose slots are full starts its next look at the earliest due too (they
        go first); one that read its ``_MAX_PAGES`` pages carries on from here next time.
        """
        if not more:
            self.skip[status] = 0
            return False
        moved = self.skip[status] + got - (0 if status == "running" else taken)
        if filled and status != "running":
            self.skip[status] = 0
            return False
        self.skip[status] = max(moved, 0)
        return not (filled or capped)

    def prune(self) -> None:
        """Forget runs the index has not shown for a while (finished, deleted)."""
        now = time.monotonic()
        if now - self._pruned < _RECHECK:
            return
        self._pruned = now
        self.seen = {k: s for k, s in self.seen.items() if now - s.sighted < _FORGET}
        self.left = {k: t for k, t in self.left.items() if now - t < _RECHECK}


#: How an execution may end and leave its run settled: done, waiting, cancelled, handed
#: over, failed (saved), parked, or another owner's. Any other end (a store error, a step
#: raising SystemExit, a bug) gives the run back unchanged, so ``_COOL_FIRST`` applies.
_SETTLED = (Suspended, RunCancelled, Interrupted, StepFailed, ConflictError, WorkflowChanged)


class Worker:
    """Claims runs that need work (queued, due, interrupted) and drives them to their end.

    Args:
        store: The store to serve; shared with any number of workers on any hosts.
        workflows: A list or dict of the ``Workflow`` objects this worker may run (the
            child workflows of their ``Map`` steps are served too).
        concurrency: Runs driven at once (threads under ``serve``, tasks under
            ``aserve``). Default 8.
        lease: Seconds (or ``timedelta``) of each claim; renewed every third of it while
            a step runs. Shorter moves a dead worker's runs sooner; longer renews less
            often. Default 30.
        poll: Seconds between looks at the store when idle. Default 1.
        grace: Seconds ``stop`` lets steps in flight finish. Default 30.
    """

    def __init__(
        self,
        store: Store,
        workflows: Iterable[Workflow] | Mapping[Any, Workflow],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float | timedelta = _lease.DEFAULT_LEASE,
        poll: float = DEFAULT_POLL,
        grace: float = DEFAULT_GRACE,
    ) -> None:
        if not isinstance(store, Store):
            raise InvalidWorkflow(f"store must be a stepstone Store, got {type(store).__name__}")
        if (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or not 1 <= concurrency <= 10_000
        ):
            raise InvalidWorkflow(
                f"concurrency must be an int from 1 to 10000, got {concurrency!r}"
            )
        for name, value in (("poll", poll), ("grace", grace)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 86_400
            ):
                raise InvalidWorkflow(f"{name} must be seconds from 0 to 86400, got {value!r}")
        self.store = store
        self.workflows = _index(workflows)
        self.concurrency = concurrency
        self.lease = _lease.check_lease(lease)
        self.poll = float(poll)
        self.grace = float(grace)
        self.owner = _lease.new_owner("worker")
        self._watch = _Watch()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._plans: dict[str, Plan] = {}
        self._lock = threading.Lock()
        self._async_wake: tuple[Any, Any] | None = None
        self.completed = 0
        # run_id -> (unexpected ends in a row, monotonic time until which it is left).
        self._cooling: dict[str, tuple[int, float]] = {}

    def __repr__(self) -> str:
        return f"Worker(owner={self.owner!r}, concurrency={self.concurrency}, lease={self.lease:g})"

    # --- control ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; runs in flight give their lease back at their next step boundary.

        Thread-safe and idempotent; may be called from a signal handler. ``serve`` and
        ``aserve`` return once the runs in flight have handed over, or after ``grace``.
        """
        # No lock: a signal handler runs in the main thread between two bytecodes, maybe
        # inside the loop's own ``with self._lock`` (``_busy``, ``_adopt``), and a plain
        # lock would deadlock there (an RLock would let us in halfway through an update).
        # None is needed: the flag is set first, the copy of ``_plans`` is one C call
        # (whole under the GIL, and under a free-threaded build's per-dict lock), and
        # ``_adopt`` checks the flag after adding its plan, so every plan gets it.
        self._stopping.set()
        self._wake.set()
        for plan in self._plans.copy().values():
            plan.stop_requested = True
        waker = self._async_wake
        if waker is not None:
            loop, event = waker
            # RuntimeError: the loop is closed, aserve has returned already.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stopping.is_set()

    def _busy(self) -> set[str]:
        with self._lock:
            return set(self._plans)

    # --- the claim, shared by both loops ------------------------------------------------

    def _plan_for(self, cp: Checkpoint, asynchronous: bool) -> Plan | None:
        """Return the plan to drive ``cp`` by, or None if this worker must leave it."""
        workflow = self.workflows.get((cp.workflow or "", cp.workflow_version))
        if workflow is None:
            key = (cp.workflow, cp.workflow_version)
            if key not in self._watch.unserved:
                self._watch.unserved.add(key)
                logger.warning(
                    "run %r: workflow %r version %r is not served by this worker; left for "
                    "a worker that serves it",
                    cp.run_id,
                    cp.workflow,
                    cp.workflow_version,
                )
            return None
        plan = make_plan(
            cp.run_id,
            workflow,
            self.store,
            input=None,
            lease=self.lease,
            owner=self.owner,
            asynchronous=asynchronous,
        )
        if cp.status == "waiting" and not _ready(plan, cp):
            return None
        cooling = self._cooling.get(cp.run_id)
        if cooling is not None and time.monotonic() < cooling[1]:
            return None  # it ended in an unexpected error a moment ago: not yet again
        return plan

    def _claimable(self, cp: Checkpoint | None, now: float) -> Checkpoint | None:
        """Return the record to claim from, or None if ``cp`` needs nothing from us now."""
        if cp is None or cp.status not in ("queued", "running", "waiting"):
            return None
        if cp.status == "queued" and cp.cancel_requested:
            return None
        if (cp.workflow or "", cp.workflow_version) not in self.workflows:
            # Not ours, whoever holds it: not loaded again for a while, and never taken
            # over by a worker that could not run it.
            self._watch.leave(cp.run_id, now)
            self._plan_for(cp, asynchronous=False)  # logs it, once per workflow
            return None
        if cp.owner is None:
            return cp
        if cp.owner == self.owner and cp.run_id in self._busy():
            return None
        if not self._watch.expired(cp, now):
            return None
        logger.warning(
            "run %r: owner %r did not renew its %gs lease; taking it over",
            cp.run_id,
            cp.owner,
            cp.lease or _lease.DEFAULT_LEASE,
        )
        return _lease.released(cp)

    def _claim_record(self, cp: Checkpoint) -> Checkpoint:
        return _lease.claimed(cp, self.owner, self.lease)

    @staticmethod
    def _changed(plan: Plan) -> WorkflowChanged | None:
        """Return why ``plan``'s steps cannot resume the record it claimed, or None."""
        cp = plan.preclaimed
        if cp is None:
            return None
        try:
            check_names(plan.run_id, plan.names, cp.step_names)
        except WorkflowChanged as exc:
            return exc
        return None

    def _park(self, plan: Plan, why: WorkflowChanged) -> Generator[Effect, Any, None]:
        """Save the claimed run as ``failed`` with ``why`` as its failure, lease given back.

        Its steps were renamed without a version bump, so every worker serving its
        (name, version) would claim it, fail the same check and give it back, in a loop.
        As a failure it leaves the claim index for good, and ``runs list``/``runs show``
        say why. Nothing is lost: state, input, signals and completed steps stay, and
        ``run`` with the steps it was recorded with resumes it (or ``cancel`` ends it).
        """
        cp = plan.preclaimed
        assert cp is not None
        position = min(max(why.position, 0), max(len(cp.step_names) - 1, 0))
        recorded = cp.step_names[position] if cp.step_names else "?"
        failure = Failure(
            step_index=position,
            step_name=recorded,
            error_type=type(why).__name__,
            message=f"{why}. Parked by {self.owner}: no worker claims it again; resume it "
            "with the steps it was recorded with (stepstone.run), or cancel it",
            attempt=0,
            at=utcnow(),
        )
        # ``waiting_for`` cleared: a waiting run's status would hide the failure.
        parked = evolve(cp, failure=failure, attempt=0, waiting_for=None, wake_at=None)
        saved = yield from write(plan, cp, _lease.released(parked), "park")
        logger.error("run %r: parked as failed: %s", plan.run_id, why)
        if saved.parent is not None:
            yield from nudge(saved.parent)  # a waiting parent learns of it at once

    def _finished(self, run_id: str, outcome: str, error: BaseException | None = None) -> None:
        delay = 0.0
        with self._lock:
            self._plans.pop(run_id, None)
            self.completed += 1
            if error is None or isinstance(error, _SETTLED):
                self._cooling.pop(run_id, None)
            else:
                ends = self._cooling.get(run_id, (0, 0.0))[0] + 1
                delay = min(max(self.poll, _COOL_FIRST) * 2 ** min(ends - 1, 20), _COOL_MAX)
                now = time.monotonic()
                if len(self._cooling) >= 10_000:  # forget runs long since left alone
                    self._cooling = {k: v for k, v in self._cooling.items() if v[1] > now}
                self._cooling[run_id] = (ends, now + delay)
        logger.info("run %r: %s", run_id, outcome)
        if delay:
            logger.warning(
                "run %r: not claimed again by this worker for %gs (%s)", run_id, delay, outcome
            )
        self._wake.set()

    @staticmethod
    def _outcome(exc: BaseException | None) -> str:
        if exc is None:
            return "done"
        if isinstance(exc, Suspended):
            return f"waiting for {exc.waiting_for}"
        if isinstance(exc, RunCancelled):
            return "cancelled"
        if isinstance(exc, Interrupted):
            return "handed over"
        if isinstance(exc, StepFailed):
            return f"failed at step {exc.step_index} ({exc.step_name!r})"
        if isinstance(exc, WorkflowChanged):
            return "parked as failed: its completed steps are not this workflow's"
        if isinstance(exc, ConflictError):
            return f"given up: {exc}"
        return f"stopped: {type(exc).__name__}: {exc}"

    # --- serve: threads -----------------------------------------------------------------

    def serve(self) -> None:
        """Serve until ``stop`` is called, driving runs in up to ``concurrency`` threads."""
        for workflow in self.workflows.values():
            for step in workflow.steps:
                if getattr(step, "is_async", False):
                    raise InvalidWorkflow(
                        f"workflow {workflow.name!r} has the async step {step.name!r}: "
                        "serve it with `await worker.aserve()`, not worker.serve()"
                    )
        # Imported here: a process that only starts runs or calls the CLI never pays for it.
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        logger.info("%r: serving %d workflows", self, len(self.workflows))
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="stepstone-worker")
        futures: set[Future[None]] = set()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                free = self.concurrency - len(self._busy())
                if free > 0:
                    for plan in self._claim_some(free):
                        futures.add(pool.submit(self._drive, plan))
                futures = {f for f in futures if not f.done()}
                self._wake.wait(self.poll)
            self._drain(futures)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        logger.info("%r: stopped", self)

    def _drain(self, futures: set[Future[None]]) -> None:
        deadline = time.monotonic() + self.grace
        for future in futures:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(Exception):
                future.result(timeout=left)
        stuck = self._busy()
        if stuck:
            logger.warning(
                "%r: %d runs still in a step after the %gs grace; serve returns and their "
                "threads go on (each hands over at its next step boundary)",
                self,
                len(stuck),
                self.grace,
            )

    def _abandon(self, timeout: float) -> list[str]:
        """Give back the leases of runs still in a step after ``serve`` returned.

        Only for a process about to end at once (``stepstone worker`` calls this, then
        ``os._exit``): the steps' threads die with it, so each run's step is abandoned,
        to run again on another worker, which may take the run at once instead of
        after a lease. Sound while those threads still run: each release is a
        compare-and-swap on the record the run last wrote, and a step, renewal or
        hand-over landing after it finds another holder (``rebase``: ``LeaseLost``) and
        writes nothing; a release that loses such a race is dropped and its lease
        expires instead. Releases are made in a daemon thread given ``timeout``
        seconds, so a store that hangs cannot hold the exit. Returns the run_ids.
        """
        plans = list(self._plans.copy().values())

        def release() -> None:
            for plan in plans:
                plan.stop_requested = True
                current = plan.current
                if current is None or current.owner != self.owner:
                    continue
                try:
                    self.store.save(_lease.released(_lease.as_stored(current)))
                    logger.warning("run %r: step abandoned, lease given back", plan.run_id)
                except Exception as exc:  # it expires by itself; takeover waits one lease
                    logger.warning("run %r: lease left to expire: %s", plan.run_id, exc)

        if plans:
            thread = threading.Thread(target=release, name="stepstone-abandon", daemon=True)
            thread.start()
            thread.join(timeout)
        return [plan.run_id for plan in plans]

    def _claim_some(self, free: int) -> list[Plan]:
        # The first page of every kind comes from one call when the worker starts from
        # the earliest due (the usual case); further pages, one kind at a time.
        self._watch.prune()
        plans: list[Plan] = []
        now = utcnow()
        try:
            first = (
                self._watch.first_look(claim_page(self.store, now, _CLAIM_BATCH, None, 0))
                if self._watch.at_start()
                else {}
            )
        except StoreError as exc:
            logger.warning("%r: cannot read the claim index: %s", self, exc)
            return plans
        for status in _KINDS:
            page = first.get(status)
            for count in range(_MAX_PAGES):
                if self._stopping.is_set():
                    return plans
                if page is None:
                    try:
                        infos = claim_page(
                            self.store, now, _CLAIM_BATCH, status, self._watch.skip[status]
                        )
                    except StoreError as exc:
                        logger.warning("%r: cannot read the claim index: %s", self, exc)
                        return plans
                    page = (infos, len(infos) >= _CLAIM_BATCH)
                infos, more = page
                taken = 0
                for info in self._watch.pick(infos, self._busy(), time.monotonic()):
                    if len(plans) >= free or self._stopping.is_set():
                        break
                    plan = self._claim_one(info)
                    if plan is not None:
                        plans.append(plan)
                        taken += 1
                filled, capped = len(plans) >= free, count + 1 >= _MAX_PAGES
                if not self._watch.turn(status, len(infos), taken, more, filled, capped):
                    break
                page = None
        return plans

    def _claim_one(self, info: RunInfo) -> Plan | None:
        try:
            # The time *before* the read: the version it returns was current at some
            # moment after this, so a lease counted from here is never too short.
            began = time.monotonic()
            cp = self._claimable(self.store.load(info.run_id), began)
            if cp is None:
                return None
            plan = self._plan_for(cp, asynchronous=False)
            if plan is None:
                return None
            claimed = self.store.save(self._claim_record(cp))
        except ConflictError:
            return None  # another worker won this claim
        except StepstoneError as exc:
            logger.warning("run %r: not claimed: %s", info.run_id, exc)
            return None
        self._adopt(plan, claimed)
        return plan

    def _adopt(self, plan: Plan, claimed: Checkpoint) -> None:
        _hooks.fire("worker.claimed")  # the claim landed; nothing of the run is driven yet
        plan.preclaimed = plan.current = claimed
        plan.written_at = time.monotonic()
        with self._lock:
            self._plans[plan.run_id] = plan
            if self._stopping.is_set():
                plan.stop_requested = True

    def _drive(self, plan: Plan) -> None:
        error: BaseException | None = None
        try:
            changed = self._changed(plan)
            if changed is None:
                drive(plan, self.store)
            else:
                error = changed
                _sync(self._park(plan, changed), self.store)
        except StepstoneError as exc:
            error = exc
        except Exception as exc:  # a bug or a store outside the tree: logged, not fatal
            logger.exception("run %r: unexpected error", plan.run_id)
            error = exc
        except BaseException as exc:  # a step raised KeyboardInterrupt, SystemExit...
            logger.exception("run %r: stopped by %s", plan.run_id, type(exc).__name__)
            error = exc
        finally:
            # Always: a run this worker no longer drives is claimable again, its slot free.
            self._finished(plan.run_id, self._outcome(error), error)

    # --- aserve: tasks ------------------------------------------------------------------

    async def aserve(self) -> None:
        """Serve until ``stop`` is called, driving runs as up to ``concurrency`` tasks.

        Cancelling the task that awaits ``aserve`` stops at once: each run's step in
        flight is cancelled and its lease given back.
        """
        import asyncio  # noqa: PLC0415

        logger.info("%r: serving %d workflows (async)", self, len(self.workflows))
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        with self._lock:
            self._async_wake = (loop, wake)
        try:
            while not self._stopping.is_set():
                wake.clear()
                free = self.concurrency - len(self._busy())
                if free > 0:
                    for plan in await self._aclaim_some(free):
                        task = asyncio.create_task(self._adrive(plan, wake))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self.poll)
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=self.grace)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=10)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                # Let each cancelled run give its lease back before the loop goes away.
                await asyncio.wait(tasks, timeout=10)
            with self._lock:
                self._async_wake = None
        logger.info("%r: stopped", self)

    async def _aclaim_some(self, free: int) -> list[Plan]:
        # ``_claim_some``, with the I/O awaited.
        self._watch.prune()
        plans: list[Plan] = []
        now = utcnow()
        try:
            first = (
                self._watch.first_look(await aclaim_page(self.store, now, _CLAIM_BATCH, None, 0))
                if self._watch.at_start()
                else {}
            )
        except StoreError as exc:
            logger.warning("%r: cannot read the claim index: %s", self, exc)
            return plans
        for status in _KINDS:
            page = first.get(status)
            for count in range(_MAX_PAGES):
                if self._stopping.is_set():
                    return plans
                if page is None:
                    try:
                        infos = await aclaim_page(
                            self.store, now, _CLAIM_BATCH, status, self._watch.skip[status]
                        )
                    except StoreError as exc:
                        logger.warning("%r: cannot read the claim index: %s", self, exc)
                        return plans
                    page = (infos, len(infos) >= _CLAIM_BATCH)
                infos, more = page
                taken = 0
                for info in self._watch.pick(infos, self._busy(), time.monotonic()):
                    if len(plans) >= free or self._stopping.is_set():
                        break
                    plan = await self._aclaim_one(info)
                    if plan is not None:
                        plans.append(plan)
                        taken += 1
                filled, capped = len(plans) >= free, count + 1 >= _MAX_PAGES
                if not self._watch.turn(status, len(infos), taken, more, filled, capped):
                    break
                page = None
        return plans

    async def _aclaim_one(self, info: RunInfo) -> Plan | None:
        try:
            began = time.monotonic()
            cp = self._claimable(await self.store.aload(info.run_id), began)
            if cp is None:
                return None
            plan = self._plan_for(cp, asynchronous=True)
            if plan is None:
                return None
            claimed = await self.store.asave(self._claim_record(cp))
        except ConflictError:
            return None
        except StepstoneError as exc:
            logger.warning("run %r: not claimed: %s", info.run_id, exc)
            return None
        self._adopt(plan, claimed)
        return plan

    async def _adrive(self, plan: Plan, wake: Any) -> None:
        import asyncio  # noqa: PLC0415

        error: BaseException | None = None
        try:
            changed = self._changed(plan)
            if changed is None:
                await adrive(plan, self.store)
            else:
                error = changed
                await _async(self._park(plan, changed), self.store)
        except StepstoneError as exc:
            error = exc
        except Exception as exc:
            logger.exception("run %r: unexpected error", plan.run_id)
            error = exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # aserve is stopping this run
            logger.exception("run %r: a step raised CancelledError", plan.run_id)
        except BaseException as exc:
            logger.exception("run %r: stopped by %s", plan.run_id, type(exc).__name__)
            error = exc
        finally:
            wake.set()
            self._finished(plan.run_id, self._outcome(error), error)
