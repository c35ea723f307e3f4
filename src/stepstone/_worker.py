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

The claim decision is ``_watch.Watch`` (no I/O). The claim loop is written once, as
generators of effects (``_serving``, ``_claim_some``, ``_claim_one``, ``_execution``):
``serve`` drives them with plain calls and runs each claimed run in a thread (``drive``;
at concurrency 1, in the loop's own thread: no hand-off per run), ``aserve`` with
awaits and runs each as a task (``adrive``). Only the effects' calls
(``_worker_io``), the spawning and the resting differ.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import _clock, _hooks, _lease, _upgrade, _wake
from ._acquire import ready
from ._checkpoint import Checkpoint, utcnow
from ._effects import Effect, Load, Save, astep_through, step_through
from ._errors import (
    ConflictError,
    InvalidWorkflow,
    StepstoneError,
    StoreError,
    Suspended,
    WorkflowChanged,
    safe_text,
)
from ._observe import count_in_flight, emit, logger
from ._outcomes import SETTLED, changed, claim_event, ending, park
from ._plan import Plan
from ._runner import make_plan
from ._schedule_fire import SchedulePoller
from ._steps import Workflow, workflow_label
from ._store import Listener, RunInfo, Store
from ._suspend import Map
from ._watch import KINDS, RECHECK, Watch
from ._worker_io import ClaimReady, Execute, Page, Rest, Spawn, aperform, perform

if TYPE_CHECKING:
    from concurrent.futures import Future

    from ._checkpoint import RunStatus


__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_GRACE", "DEFAULT_POLL", "Worker"]

DEFAULT_CONCURRENCY = 8
#: Seconds between looks at the claim index when there is nothing to do and nothing
#: rings: the fallback for wake-ups that are lost or never sent.
DEFAULT_POLL = 1.0
#: Without a listener (``Store.listen`` returned None) nothing tells the worker of
#: another process's writes, so it looks again this soon after activity (a run
#: claimed, a ring) and doubles the rest per idle look, up to ``poll``: work arriving
#: in bursts is found within tens of milliseconds, and an idle worker settles at one
#: look per ``poll`` about 1.5 s later (0.05 + 0.1 + ... + 0.8, at the default poll).
_QUICK = 0.05
#: Seconds past a known due time before the look that finds it: the due time was
#: turned from wall-clock into monotonic time, and a store may round what it stores.
_DUE_SLACK = 0.005
#: Due times remembered (of runs this worker suspended); beyond that, the poll finds them.
_MAX_DUE = 10_000
#: Seconds a stopping worker lets steps in flight finish before it gives up on them.
DEFAULT_GRACE = 30.0
#: Seconds (at least; doubled per repeat, up to ``_COOL_MAX``) a run whose execution
#: ended in an unexpected error is left alone: given back, it is claimable at once, and
#: claiming it straight away would only fail again, in a loop.
_COOL_FIRST = 1.0
_COOL_MAX = 30.0
_CLAIM_BATCH = 100
_NONE: frozenset[str] = frozenset()
#: Pages of one kind a worker reads per look at the claim index: runs it must leave
#: (other workflows, versions) and running runs to watch, beyond that, wait for its next.
_MAX_PAGES = 10


def _next_idle(rest: float, active: bool, poll: float) -> float:
    """Return the back-off's next rest: ``_QUICK`` after activity, else doubled, to ``poll``."""
    return min(_QUICK if active else rest * 2, poll)


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
                "two different workflows are named "
                f"{workflow_label(workflow.name, workflow.version)}"
            )
        if known is None:
            table[workflow.key] = workflow
            # A Map's child workflow is served too: its children must run somewhere.
            pending.extend(step.workflow for step in workflow.steps if isinstance(step, Map))
    if not table:
        raise InvalidWorkflow("a worker needs at least one Workflow to serve")
    # Plus the older versions they upgrade: (name, "2") -> version 3, upgrading from 2.
    return _upgrade.routes(table)


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
        poll: Seconds between looks at the store when idle: the fallback. The worker
            is woken sooner by a ring (a run started, signalled, or a child done, in
            this process or, where the store can push, ``Store.listen``, in another)
            and by the due time of a run it suspended (a ``Sleep``, a timeout). Where
            the store cannot push, it looks quickly after activity and backs off to
            ``poll`` when idle. Default 1.
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
        self._watch = Watch()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._plans: dict[str, Plan] = {}
        self._lock = threading.Lock()
        self._async_wake: tuple[Any, Any] | None = None
        # Monotonic due times (a heap) of runs this worker suspended with a timer.
        self._due: list[float] = []
        # Whether the store's listener hears other processes (then no back-off).
        self._pushed = False
        self.completed = 0
        # run_id -> (unexpected ends in a row, monotonic time until which it is left).
        self._cooling: dict[str, tuple[int, float]] = {}
        # Monotonic time of the last look at the owned runs (``_claim_some``).
        self._owned_at = -float("inf")
        # The (workflow, version) pairs served, as ``claim_ready`` takes them.
        self._served = frozenset(self.workflows)
        # A name holding NUL cannot be compared in SQL (SQLite's text functions stop at
        # it, PostgreSQL's jsonb refuses it; the statements skip such rows): a worker
        # serving one claims run by run, which compares in Python.
        self._one_call = store.claims_in_one_call and not any(
            "\x00" in name or "\x00" in (version or "") for name, version in self._served
        )
        # Schedules (issue 33, ``_schedule_fire``): due slots of the workflows served.
        self._schedules = SchedulePoller(self.poll)

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
        if workflow is not None and workflow.version != cp.workflow_version:
            # A version this one upgrades: the upgraded record is what the claim saves,
            # one compare-and-swap, so a crash leaves the old run or the upgraded one.
            try:
                cp = _upgrade.upgraded(cp, workflow)
            except StepstoneError as exc:
                # Left untouched for a worker serving its version, and not loaded (nor
                # claimed in one call: cooled) again for a while: a refused upgrade is
                # refused again until the code changes.
                now = _clock.monotonic()
                self._watch.leave(cp.run_id, now)
                with self._lock:
                    self._cooling[cp.run_id] = (0, now + RECHECK)
                logger.warning("run %r: not upgraded, left as it is: %s", cp.run_id, exc)
                return None
            upgrading: Checkpoint | None = cp
        else:
            upgrading = None
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
        if cp.status == "waiting" and not ready(plan, cp):
            return None
        cooling = self._cooling.get(cp.run_id)
        if cooling is not None and _clock.monotonic() < cooling[1]:
            return None  # it ended in an unexpected error a moment ago: not yet again
        # The record to claim from when it is not the one loaded (``_claim_one``);
        # ``_adopt`` replaces it with the claimed record.
        plan.preclaimed = upgrading
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
        return _lease.released(cp)  # its owner did not renew its lease: taken over

    def _claim_record(self, cp: Checkpoint) -> Checkpoint:
        return _lease.claimed(cp, self.owner, self.lease)

    def _finished(self, plan: Plan, error: BaseException | None = None) -> None:
        run_id = plan.run_id
        delay = 0.0
        with self._lock:
            self._plans.pop(run_id, None)
            self.completed += 1
            if error is None or isinstance(error, SETTLED):
                self._cooling.pop(run_id, None)
            else:
                ends = self._cooling.get(run_id, (0, 0.0))[0] + 1
                delay = min(max(self.poll, _COOL_FIRST) * 2 ** min(ends - 1, 20), _COOL_MAX)
                now = _clock.monotonic()
                if len(self._cooling) >= 10_000:  # forget runs long since left alone
                    self._cooling = {k: v for k, v in self._cooling.items() if v[1] > now}
                self._cooling[run_id] = (ends, now + delay)
        if isinstance(error, Suspended) and error.wake_at is not None:
            self._remember_due(error.wake_at)
        event = ending(plan, error)
        if delay:  # not claimed again by this worker for that long
            event = replace(event, detail={**event.detail, "cool_off": delay})
        emit(event)
        self._wake.set()

    def _remember_due(self, wake_at: datetime) -> None:
        """Look at the claim index when ``wake_at`` (a run's timer) is due, not at the poll."""
        left = (wake_at - utcnow()).total_seconds()
        if left <= 0:
            return  # due already: the look that ``_finished`` wakes finds it
        with self._lock:
            if len(self._due) < _MAX_DUE:
                heapq.heappush(self._due, _clock.monotonic() + left + _DUE_SLACK)

    # --- the loop, shared by both drivers -----------------------------------------------

    def _serving(self, asynchronous: bool) -> Generator[Effect, Any, None]:
        """Claim runs into free slots and start driving them, until ``stop`` is called."""
        # The runs-in-flight gauge (under OpenTelemetry) reads this worker while it serves.
        count_in_flight(id(self), lambda: len(self._plans))
        try:
            yield from self._claiming(asynchronous)
        finally:
            count_in_flight(id(self), None)

    def _claiming(self, asynchronous: bool) -> Generator[Effect, Any, None]:
        idle = min(_QUICK, self.poll)  # the back-off's next rest (no listener only)
        while not self._stopping.is_set():
            began = _clock.monotonic()
            free = self.concurrency - len(self._plans)  # one C call: no lock, no copy
            plans: list[Plan] = []
            failed = False
            soonest = yield from self._schedules.look(self.workflows)  # issue 33: schedules
            if soonest is not None:
                self._remember_due(soonest)
            if free > 0:
                try:
                    yield from self._claim_some(free, plans, asynchronous)
                except Exception:  # noqa: BLE001 - logged with its traceback; the loop lives on
                    self._claim_failed()
                    failed = True
            for plan in plans:
                yield Spawn(plan)
            if failed:
                yield from self._back_off()
                continue
            _hooks.fire("worker.resting")  # tests: the look is over, the rest begins
            fallback = self.poll if self._pushed else idle
            woken = yield Rest(self._rest(began, fallback))
            idle = _next_idle(idle, bool(plans or woken), self.poll)

    def _rest(self, began: float, fallback: float) -> float:
        """Return the seconds to rest after the look that began at ``began`` (monotonic).

        Until the earliest of ``fallback`` and a due time this worker knows: the timer
        of a run it suspended, or the lease of a run another owner holds running out
        by our watch (``Watch.next_expiry``). A due time at or before ``began`` was
        covered by that look. A ring (``Rest``'s wake) cuts any rest short.
        """
        soonest = self._watch.next_expiry(began)
        with self._lock:
            due = self._due
            while due and due[0] <= began:
                heapq.heappop(due)
            if due and (soonest is None or due[0] < soonest):
                soonest = due[0]
        if soonest is None:
            return fallback
        return max(0.0, min(fallback, soonest - _clock.monotonic()))

    def _claim_failed(self) -> None:
        # Not a StoreError (those are logged where they happen): a store outside the
        # tree raising its own type, or a bug in the bookkeeping. Killing the worker
        # would strand what it holds; the runs claimed before it are kept in ``plans``
        # and driven. The message holds no text of the exception's own (its __str__
        # may raise); the traceback printer guards against that.
        logger.exception(
            "%r: looking for runs to claim failed; trying again in %gs", self, self.poll
        )

    def _back_off(self) -> Generator[Effect, Any, None]:
        """Rest the whole poll interval: runs ending wake the loop, only ``stop`` cuts it."""
        until = _clock.monotonic() + self.poll
        yield Rest(self.poll)
        while not self._stopping.is_set() and (left := until - _clock.monotonic()) > 0:
            yield Rest(left)

    def _claim_some(
        self, free: int, plans: list[Plan], asynchronous: bool
    ) -> Generator[Effect, Any, None]:
        """Claim up to ``free`` runs into ``plans``, reading the claim index page by page.

        The first page of every kind comes from one call when the worker starts from the
        earliest due (the usual case); further pages, one kind at a time. Claimed runs
        go into ``plans`` at once: an error later on must not lose them.

        A store that claims in one call (``Store.claims_in_one_call``) is asked for the
        runs that need no judgement (unowned, due, of a workflow served here), as many
        as there are slots left, and returns them claimed: nothing is loaded to claim
        them, and on a server workers skip each other's picks instead of racing for the
        head of the queue. Only the owned runs are read page by page, first, for
        takeovers of owners whose lease ran out (what claiming in one call leaves).
        """
        self._watch.prune()
        now = utcnow()
        if self._one_call:
            # Owned runs only: running ones, and waiting ones re-claimed to act on a signal.
            # At most once per poll interval, not after every run that ends: a takeover
            # waits a whole lease anyway, and a mark seen later only starts that later.
            moment = _clock.monotonic()
            if moment - self._owned_at >= self.poll:
                self._owned_at = moment
                owned: tuple[RunStatus, ...] = ("running", "waiting")
                going = yield from self._claim_pages(
                    owned, {}, now, free, plans, asynchronous, True
                )
                if not going or len(plans) >= free:
                    return
            claimed = yield from self._claim_ready(free - len(plans), plans, now, asynchronous)
            if not claimed:  # the store refused: run by run, as any store
                yield from self._claim_pages(KINDS, {}, now, free, plans, asynchronous, False)
            return
        first: dict[str, tuple[list[RunInfo], bool]] = {}
        try:
            if self._watch.at_start():
                infos = yield Page(now, _CLAIM_BATCH, None, 0)
                first = self._watch.first_look(infos, _CLAIM_BATCH)
        except StoreError as exc:
            logger.warning("%r: cannot read the claim index: %s", self, exc)
            return
        yield from self._claim_pages(KINDS, first, now, free, plans, asynchronous, False)

    def _claim_pages(
        self,
        kinds: tuple[RunStatus, ...],
        first: dict[str, tuple[list[RunInfo], bool]],
        now: datetime,
        free: int,
        plans: list[Plan],
        asynchronous: bool,
        owned_only: bool,
    ) -> Generator[Effect, Any, bool]:
        """Claim run by run from pages of ``kinds``; return False if stopped or the index failed.

        ``owned_only``: the unowned runs a page shows are left to ``claim_ready``
        (loading them would race other workers for them).
        """
        for status in kinds:
            page = first.get(status)
            for count in range(_MAX_PAGES):
                if self._stopping.is_set():
                    return False
                if page is None:
                    try:
                        infos = yield Page(now, _CLAIM_BATCH, status, self._watch.skip[status])
                    except StoreError as exc:
                        logger.warning("%r: cannot read the claim index: %s", self, exc)
                        return False
                    page = (infos, len(infos) >= _CLAIM_BATCH)
                infos, more = page
                taken = 0
                listed = [i for i in infos if i.owner is not None] if owned_only else infos
                for info in self._watch.pick(listed, self._busy(), _clock.monotonic()):
                    if len(plans) >= free or self._stopping.is_set():
                        break
                    plan = yield from self._claim_one(info, asynchronous)
                    if plan is not None:
                        plans.append(plan)
                        taken += 1
                filled, capped = len(plans) >= free, count + 1 >= _MAX_PAGES
                if not self._watch.turn(status, len(infos), taken, more, filled, capped):
                    break
                page = None
        return True

    def _claim_ready(
        self, free: int, plans: list[Plan], now: datetime, asynchronous: bool
    ) -> Generator[Effect, Any, bool]:
        """Claim up to ``free`` runs in one call (``Store.claim_ready``); False if refused."""
        moment = _clock.monotonic()
        with self._lock:
            # Runs that ended in an unexpected error a moment ago: not yet again. And the
            # runs still in flight here: one given back has no owner, but until
            # ``_finished`` records how it ended (one lock hold) it is not claimed again.
            # (Usually neither: no set built then.)
            cooling = (
                frozenset(k for k, (_, until) in self._cooling.items() if until > moment)
                if self._cooling
                else _NONE
            )
            if self._plans:
                cooling |= frozenset(self._plans)
        try:
            claims = yield ClaimReady(self.owner, self.lease, free, self._served, now, cooling)
        except StoreError as exc:
            logger.warning("%r: cannot claim in one call, claiming run by run: %s", self, exc)
            return False
        for before, claimed in claims:
            plan = yield from self._take(before, claimed, asynchronous)
            if plan is not None:
                plans.append(plan)
        return True

    def _take(
        self, before: Checkpoint, claimed: Checkpoint, asynchronous: bool
    ) -> Generator[Effect, Any, Plan | None]:
        """Drive a run ``claim_ready`` claimed, or give it back; return its plan, or None."""
        plan = self._plan_for(claimed, asynchronous=asynchronous)
        try:
            if plan is None:
                # Not for this worker now after all (its step's own readiness rule, a
                # refused upgrade): given back at once, for whoever may run it, and
                # not claimed by this worker again for a while (else the next look,
                # 50 ms later under the back-off, claims and gives it back again).
                moment = _clock.monotonic()
                with self._lock:
                    ends, until = self._cooling.get(claimed.run_id, (0, 0.0))
                    pause = max(until, moment + max(self.poll, _COOL_FIRST))
                    self._cooling[claimed.run_id] = (ends, pause)
                yield Save(_lease.released(claimed), "claim", owned=False)
                return None
            if plan.preclaimed is not None:
                # An older version this worker upgrades: the upgrade is the claim's
                # second write, on the version the claim made.
                claimed = yield Save(plan.preclaimed, "claim", owned=False)
        except StepstoneError as exc:
            # Held by us and not driven: another worker takes it over after the lease.
            logger.warning("run %r: claimed, then left to its lease: %s", claimed.run_id, exc)
            return None
        self._adopt(plan, claimed)
        emit(claim_event(plan, before, claimed))
        return plan

    def _claim_one(self, info: RunInfo, asynchronous: bool) -> Generator[Effect, Any, Plan | None]:
        """Claim ``info``'s run if it needs this worker now; return its plan, or None."""
        try:
            # The time *before* the read: the version it returns was current at some
            # moment after this, so a lease counted from here is never too short.
            began = _clock.monotonic()
            loaded = yield Load(info.run_id)
            cp = self._claimable(loaded, began)
            if cp is None:
                return None
            plan = self._plan_for(cp, asynchronous=asynchronous)
            if plan is None:
                return None
            claimed = yield Save(self._claim_record(plan.preclaimed or cp), "claim", owned=False)
        except ConflictError:
            return None  # another worker won this claim
        except StepstoneError as exc:
            logger.warning("run %r: not claimed: %s", info.run_id, exc)
            return None
        self._adopt(plan, claimed)
        emit(claim_event(plan, loaded, claimed))
        return plan

    def _adopt(self, plan: Plan, claimed: Checkpoint) -> None:
        _hooks.fire("worker.claimed")  # the claim landed; nothing of the run is driven yet
        plan.preclaimed = plan.current = claimed
        plan.written_at = _clock.monotonic()
        with self._lock:
            self._plans[plan.run_id] = plan
            if self._stopping.is_set():
                plan.stop_requested = True

    def _execution(self, plan: Plan) -> Generator[Effect, Any, WorkflowChanged | None]:
        """Drive ``plan``'s run, or park it if its steps cannot resume it; return why parked."""
        why = changed(plan)
        if why is None:
            yield Execute(plan)
        else:
            yield from park(plan, why, self.owner)
        return why

    @staticmethod
    def _ended(plan: Plan, exc: BaseException) -> BaseException:
        """Log an execution's end by ``exc`` unless it is one of the tree's; return ``exc``."""
        if isinstance(exc, Exception) and not isinstance(exc, StepstoneError):
            logger.exception("run %r: unexpected error", plan.run_id)  # a bug, a foreign store
        elif not isinstance(exc, Exception):  # a step raised KeyboardInterrupt, SystemExit...
            logger.exception("run %r: stopped by %s", plan.run_id, type(exc).__name__)
        return exc

    # --- serve: threads -----------------------------------------------------------------

    def serve(self) -> None:
        """Serve until ``stop`` is called, driving runs in up to ``concurrency`` threads."""
        for workflow in self.workflows.values():
            for step in workflow.steps:
                # A Step, or a code workflow's step (``_code.CodeStep``), of an async def.
                if getattr(step, "is_async", False) is True:
                    raise InvalidWorkflow(
                        f"workflow {workflow.name!r} has the async step {step.name!r}: "
                        "serve it with `await worker.aserve()`, not worker.serve()"
                    )
        logger.info("%r: serving %d workflows", self, len(self.workflows))
        ring = self._wake.set
        unsubscribe = self.store.doorbell.subscribe(ring)
        opened: list[Listener | None] = []
        worked = [False]  # a run was spawned since the last rest

        def rest(effect: Rest) -> bool:
            if not opened and not worked[0] and not self._stopping.is_set():
                # The listener is opened at the first rest after a look that claimed
                # nothing, not before: a worker draining a backlog needs no wake-ups,
                # and SQLite's listener looks at every commit, the worker's own
                # included (0.4 M instructions a run of 10 steps). No rest now: the
                # look right after it covers what was committed before it opened.
                opened.append(self._listen(ring))
                return True
            worked[0] = False
            # Cleared as the rest ends, just before the next look: a ring during that
            # look sets it again, and the rest after it returns at once.
            woken = _clock.wait(self._wake, effect.seconds)
            self._wake.clear()
            return woken

        def spawned() -> None:
            worked[0] = True

        try:
            if self.concurrency == 1:
                self._serve_alone(rest, spawned)
            else:
                self._serve_pooled(rest, spawned)
        finally:
            unsubscribe()
            for listener in opened:
                self._unlisten(listener)
        logger.info("%r: stopped", self)

    def _serve_pooled(self, rest: Callable[[Rest], bool], spawned: Callable[[], None]) -> None:
        """Claim in this thread; drive each claimed run in a thread of a pool."""
        # Imported here: a process that only starts runs or calls the CLI never pays for it.
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="stepstone-worker")
        futures: set[Future[None]] = set()

        def perform(effect: Effect) -> Any:
            nonlocal futures
            if isinstance(effect, Spawn):
                futures = {f for f in futures if not f.done()}
                futures.add(pool.submit(self._drive, effect.plan))
                spawned()
                return None
            if isinstance(effect, Rest):
                return rest(effect)
            return self._io(effect)

        try:
            step_through(self._serving(asynchronous=False), perform)
            self._drain(futures)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _serve_alone(self, rest: Callable[[Rest], bool], spawned: Callable[[], None]) -> None:
        """Concurrency 1: claim and drive in one thread of ours, each run where it was claimed.

        With one slot the loop has nothing to do while a run is driven (it could claim
        nothing), so handing each run to another thread would only add hand-offs a
        plain loop of ``run`` calls has none of. The loop runs in its own thread, not
        the caller's, so that ``stop`` keeps its meaning: the caller waits for the
        stop, then at most ``grace`` for the run in flight to hand over, and returns
        (the thread goes on, as a pool's thread would, and hands over at its next step
        boundary). Leases are renewed as under the pool (``_renewer``, its own thread).
        """
        failure: list[BaseException] = []

        def perform(effect: Effect) -> Any:
            if isinstance(effect, Spawn):
                spawned()
                self._drive(effect.plan)
                return None
            if isinstance(effect, Rest):
                return rest(effect)
            return self._io(effect)

        def loop() -> None:
            try:
                step_through(self._serving(asynchronous=False), perform)
            except BaseException as exc:  # noqa: BLE001 - raised again by serve, below
                failure.append(exc)
                self._stopping.set()  # wakes the caller, which raises it

        # A daemon only if the caller is one: a worker served from the main thread holds
        # the exit with a run still in a step, as a pool's thread does; one served from
        # a daemon thread and never stopped must not hold it for ever (its loop would
        # not, under the pool: it ran in that daemon thread).
        daemon = threading.current_thread().daemon
        thread = threading.Thread(target=loop, name="stepstone-worker_0", daemon=daemon)
        thread.start()
        try:
            self._stopping.wait()  # interruptible: a signal handler may call stop
        except BaseException:
            self.stop()  # KeyboardInterrupt here: no more claims, the run hands over
            raise
        thread.join(self.grace)
        if failure:
            raise failure[0]
        if thread.is_alive():
            self._drain(set())  # logs the run still in a step

    def _listen(self, ring: Callable[[], None]) -> Listener | None:
        """Start hearing other processes' announcements (``Store.listen``), if the store can."""

        def heard() -> None:
            if not _wake.dropped():  # a test dropping rings drops these too
                ring()

        try:
            listener = self.store.listen(heard)
        except Exception as exc:  # noqa: BLE001 - without it the worker only polls sooner
            logger.warning(
                "%r: cannot listen for other processes' wake-ups (%s: %s); looking at the "
                "store after activity and every %gs",
                self,
                type(exc).__name__,
                safe_text(exc, 300),
                self.poll,
            )
            listener = None
        self._pushed = listener is not None
        return listener

    def _unlisten(self, listener: Listener | None) -> None:
        self._pushed = False
        if listener is None:
            return
        try:
            listener.close()
        except Exception as exc:  # noqa: BLE001 - the worker is leaving; nothing else to do
            logger.warning("%r: closing the wake-up listener failed: %s", self, safe_text(exc, 300))

    def _io(self, effect: Effect) -> Any:
        """Perform one of the claim's or an execution's effects with a plain call."""
        return perform(self.store, effect)

    def _drive(self, plan: Plan) -> None:
        error: BaseException | None = None
        try:
            error = step_through(self._execution(plan), self._io)
        except BaseException as exc:  # noqa: BLE001 - logged by _ended; the worker lives on
            error = self._ended(plan, exc)
        finally:
            # Always: a run this worker no longer drives is claimable again, its slot free.
            self._finished(plan, error)

    def _drain(self, futures: set[Future[None]]) -> None:
        deadline = _clock.monotonic() + self.grace
        for future in futures:
            left = deadline - _clock.monotonic()
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

    def abandon(self, timeout: float) -> list[str]:
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
            given = False
            for plan in plans:
                plan.stop_requested = True
                current = plan.current
                if current is None or current.owner != self.owner:
                    continue
                try:
                    self.store.save(_lease.released(_lease.as_stored(current)))
                    logger.warning("run %r: step abandoned, lease given back", plan.run_id)
                    given = True
                except Exception as exc:  # noqa: BLE001 - it expires by itself; takeover waits one lease
                    logger.warning("run %r: lease left to expire: %s", plan.run_id, exc)
            if given:
                _wake.announce(self.store)  # other workers may take them now

        if plans:
            thread = threading.Thread(target=release, name="stepstone-abandon", daemon=True)
            thread.start()
            thread.join(timeout)
        return [plan.run_id for plan in plans]

    # --- aserve: tasks ------------------------------------------------------------------

    async def aserve(self) -> None:
        """Serve until ``stop`` is called, driving runs as up to ``concurrency`` tasks.

        Cancelling the task that awaits ``aserve`` stops at once: each run's step in
        flight is cancelled and its lease given back.
        """
        import asyncio  # noqa: PLC0415 - sync users and the CLI never pay for importing it

        logger.info("%r: serving %d workflows (async)", self, len(self.workflows))
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        async def perform(effect: Effect) -> Any:
            if isinstance(effect, Spawn):
                task = asyncio.create_task(self._adrive(effect.plan, wake))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                return None
            if isinstance(effect, Rest):
                # Cleared as the rest ends, just before the next look (as in ``serve``).
                # On the seam's clock (asyncio.timeout, not wait_for, in the real one).
                woken = await _clock.await_event(wake, effect.seconds)
                wake.clear()
                return woken
            return await self._aio(effect)

        def ring() -> None:
            # RuntimeError: the loop is closed, aserve has returned already.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

        with self._lock:
            self._async_wake = (loop, wake)
        unsubscribe = self.store.doorbell.subscribe(ring)
        listener: Listener | None = None
        try:
            # In a thread: listening may connect to a server, the loop must not wait.
            opening = asyncio.ensure_future(asyncio.to_thread(self._listen, ring))
            try:
                listener = await asyncio.shield(opening)
            except asyncio.CancelledError:
                opening.add_done_callback(self._unlisten_opened)
                raise
            await astep_through(self._serving(asynchronous=True), perform)
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=self.grace)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=10)
        finally:
            unsubscribe()
            for task in tasks:
                task.cancel()
            try:
                if tasks:
                    # Let each cancelled run give its lease back before the loop goes away.
                    await asyncio.wait(tasks, timeout=10)
            finally:
                with self._lock:
                    self._async_wake = None
                if listener is not None:
                    await asyncio.to_thread(self._unlisten, listener)
        logger.info("%r: stopped", self)

    def _unlisten_opened(self, opening: Any) -> None:
        """Close what ``listen`` opened in ``opening`` (aserve was cancelled meanwhile)."""
        if not opening.cancelled() and opening.exception() is None:
            self._unlisten(opening.result())

    async def _aio(self, effect: Effect) -> Any:
        """Perform one of the claim's or an execution's effects, awaited."""
        return await aperform(self.store, effect)

    async def _adrive(self, plan: Plan, wake: Any) -> None:
        import asyncio  # noqa: PLC0415 - imported already by aserve, which calls this

        error: BaseException | None = None
        try:
            error = await astep_through(self._execution(plan), self._aio)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # aserve is stopping this run
            logger.exception("run %r: a step raised CancelledError", plan.run_id)
        except BaseException as exc:  # noqa: BLE001 - logged by _ended; the worker lives on
            error = self._ended(plan, exc)
        finally:
            wake.set()
            self._finished(plan, error)
