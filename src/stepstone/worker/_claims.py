"""``Claims``: a worker's claim loop, written once as generators of effects.

A worker polls the store's claim index (``Store.claimable``: running runs, and queued
or waiting runs that are due) and claims runs by compare-and-swap, never by a lock or a
second coordinator: workers on many hosts share one store and nothing else.

- A run nobody owns (queued, due, or given back) is claimed at once.
- A run with an owner is watched (``_watch.Watch``, no I/O): the worker remembers the
  owner's mark (what only the owner writes, ``_lease.owner_mark``; signals and cancel
  requests do not move it) and, on its own monotonic clock, when it first saw it. Once
  that mark has not changed for the owner's whole recorded lease, the owner is presumed
  dead and the run is taken over (a claim that bumps the epoch, fencing the old owner).
  Wall clocks are never compared, so hosts whose clocks disagree neither strand nor
  steal runs.
- A run recorded under a workflow (name, version) this worker does not serve is left
  alone for a worker that does, logged once, and not loaded again for a minute.
- The index is read a page of one status at a time (the first page of each in one
  call), paging on past what the worker leaves and through every running run, so
  neither a backlog of others' runs nor a skewed due time hides a run from it.

``Claims`` holds what the loop knows between looks (the runs in flight, the runs cooling
off, the due times it remembers, the watch) and yields effects (``_io``: pages, claims,
``Spawn``, ``Rest``; the core's ``Load`` and ``Save``). The thread driver
(``_threads``) and the task driver (``_tasks``) perform them; only spawning and resting
differ between the two.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Generator
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import _clock, _hooks, _lease, _upgrade
from .._acquire import ready
from .._checkpoint import Checkpoint, utcnow
from .._effects import Effect, Load, Save
from .._errors import (
    ConflictError,
    StepstoneError,
    StoreError,
    Suspended,
    WorkflowChanged,
)
from .._observe import count_in_flight, emit, logger
from .._plan import Plan
from .._runinfo import ReadyAsk
from .._runner import make_plan
from .._schedule_fire import SchedulePoller
from .._store import RunInfo, Store
from .._store_time import Now, earliest, known_now, plain
from ._config import WorkflowTable
from ._io import ClaimReady, Drain, Execute, Listen, Page, Rest, Spawn, Subscribe, Unlisten
from ._outcomes import SETTLED, changed, claim_event, ending, park
from ._watch import KINDS, RECHECK, Watch

if TYPE_CHECKING:
    from .._checkpoint import RunStatus

__all__ = ["Claims", "next_idle"]

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


def next_idle(rest: float, active: bool, poll: float) -> float:
    """Return the back-off's next rest: ``_QUICK`` after activity, else doubled, to ``poll``."""
    return min(_QUICK if active else rest * 2, poll)


class Claims:
    """What one worker's claim loop knows between looks, and the loop itself.

    Args:
        store: The store the worker serves.
        workflows: The worker's table of what it serves (``_config.index``).
        owner: The worker's owner id, written into the leases it takes.
        lease: Seconds of each claim.
        poll: The fallback rest between looks.
        concurrency: Runs driven at once.
        limit: Executions to claim in all (``Worker(max_runs=)``), then return once
            they have ended; None: until ``stop``.
        stopping: Set by ``Worker.stop``: no more claims.
        wake: Set to end a rest early (a ring, a run ending).
        label: How the log names the worker.
    """

    def __init__(
        self,
        store: Store,
        workflows: WorkflowTable,
        *,
        owner: str,
        lease: float,
        poll: float,
        concurrency: int,
        limit: int | None = None,
        stopping: threading.Event,
        wake: threading.Event,
        label: str,
    ) -> None:
        self.store = store
        self.workflows = workflows
        self.owner = owner
        self.lease = lease
        self.poll = poll
        self.concurrency = concurrency
        self.stopping = stopping
        self.wake = wake
        self.label = label
        self.limit = limit
        #: Executions claimed so far (``_adopt``), held against ``limit``.
        self.claimed = 0
        self.watch = Watch()
        #: run_id -> the plan of each run this worker drives now.
        self.plans: dict[str, Plan] = {}
        self.lock = threading.Lock()
        # Monotonic due times (a heap) of runs this worker suspended with a timer.
        self.due: list[float] = []
        #: Whether the store's listener hears other processes (then no back-off).
        self.pushed = False
        #: Executions ended (finished, suspended, failed, handed over) so far.
        self.completed = 0
        # run_id -> (unexpected ends in a row, monotonic time until which it is left).
        self.cooling: dict[str, tuple[int, float]] = {}
        # Monotonic time of the last look at the owned runs (``_claim_some``).
        self.owned_at = -float("inf")
        # The (workflow, version) pairs served, as ``claim_ready`` takes them.
        self.served = frozenset(workflows)
        # A name holding NUL cannot be compared in SQL (SQLite's text functions stop at
        # it, PostgreSQL's jsonb refuses it; the statements skip such rows): a worker
        # serving one claims run by run, which compares in Python.
        self.one_call = store.claims_in_one_call and not any(
            "\x00" in name or "\x00" in (version or "") for name, version in self.served
        )
        # Schedules (issue 33, ``_schedule_fire``): due slots of the workflows served.
        self.schedules = SchedulePoller(poll)

    def __repr__(self) -> str:
        return self.label

    def busy(self) -> set[str]:
        """Return the run_ids this worker drives now (a copy)."""
        with self.lock:
            return set(self.plans)

    def _plan_for(
        self, cp: Checkpoint, asynchronous: bool, now: datetime | None = None
    ) -> Plan | None:
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
                moment = _clock.monotonic()
                self.watch.leave(cp.run_id, moment)
                with self.lock:
                    self.cooling[cp.run_id] = (0, moment + RECHECK)
                logger.warning("run %r: not upgraded, left as it is: %s", cp.run_id, exc)
                return None
            upgrading: Checkpoint | None = cp
        else:
            upgrading = None
        if workflow is None:
            key = (cp.workflow, cp.workflow_version)
            if key not in self.watch.unserved:
                self.watch.unserved.add(key)
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
        if cp.status == "waiting" and not ready(plan, cp, now):
            return None
        cooling = self.cooling.get(cp.run_id)
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
            self.watch.leave(cp.run_id, now)
            self._plan_for(cp, asynchronous=False)  # logs it, once per workflow
            return None
        if cp.owner is None:
            return cp
        if cp.owner == self.owner and cp.run_id in self.busy():
            return None
        if not self.watch.expired(cp, now):
            return None
        return _lease.released(cp)  # its owner did not renew its lease: taken over

    def _claim_record(self, cp: Checkpoint) -> Checkpoint:
        return _lease.claimed(cp, self.owner, self.lease)

    def finished(self, plan: Plan, error: BaseException | None = None) -> None:
        run_id = plan.run_id
        delay = 0.0
        with self.lock:
            self.plans.pop(run_id, None)
            self.completed += 1
            if error is None or isinstance(error, SETTLED):
                self.cooling.pop(run_id, None)
            else:
                ends = self.cooling.get(run_id, (0, 0.0))[0] + 1
                delay = min(max(self.poll, _COOL_FIRST) * 2 ** min(ends - 1, 20), _COOL_MAX)
                now = _clock.monotonic()
                if len(self.cooling) >= 10_000:  # forget runs long since left alone
                    self.cooling = {k: v for k, v in self.cooling.items() if v[1] > now}
                self.cooling[run_id] = (ends, now + delay)
        if isinstance(error, Suspended) and error.wake_at is not None:
            self._remember_due(error.wake_at)
        event = ending(plan, error)
        if delay:  # not claimed again by this worker for that long
            event = replace(event, detail={**event.detail, "cool_off": delay})
        emit(event)
        self.wake.set()

    def _remember_due(self, wake_at: datetime) -> None:
        """Look at the claim index when ``wake_at`` (a run's timer) is due, not at the poll."""
        # On the store's clock, as the claim that will find it judges it: the earliest
        # the store's time may be (a Cosmos DB clock ticks in whole seconds).
        at = known_now(self.store)
        left = (wake_at - (utcnow() if at is None else earliest(at))).total_seconds()
        if left <= 0:
            return  # due already: the look that ``finished`` wakes finds it
        with self.lock:
            if len(self.due) < _MAX_DUE:
                heapq.heappush(self.due, _clock.monotonic() + left + _DUE_SLACK)

    # --- the loop -------------------------------------------------------------------------

    def serving(self, asynchronous: bool) -> Generator[Effect, Any, None]:
        """Claim runs into free slots and start driving them, until ``stop`` is called."""
        # The runs-in-flight gauge (under OpenTelemetry) reads this worker while it serves.
        count_in_flight(id(self), lambda: len(self.plans))
        try:
            yield Subscribe()  # before the first look, which covers what came before it
            yield from self._claiming(asynchronous)
        finally:
            count_in_flight(id(self), None)

    def _claiming(self, asynchronous: bool) -> Generator[Effect, Any, None]:
        idle = min(_QUICK, self.poll)  # the back-off's next rest (no listener only)
        # The listener policy, the same under serve and aserve. It is opened at the first
        # rest after a look that claimed nothing, not before: a worker draining a
        # backlog needs no wake-ups, and SQLite's listener looks at every commit, the
        # worker's own included (0.4 M instructions a run of 10 steps). No rest then:
        # the look right after it covers what was committed before it opened.
        listening = False  # Listen was performed (the store may have no listener)
        worked = False  # a run was spawned since the last rest
        backlog = False  # the look before the last rest claimed a run too
        while not self.stopping.is_set():
            began = _clock.monotonic()
            free = self.concurrency - len(self.plans)  # one C call: no lock, no copy
            if self.limit is not None:
                left = self.limit - self.claimed
                if left <= 0 and not self.plans:
                    # All claimed and ended (``finished`` wakes the rest below): stop
                    # as ``stop`` would, with nothing left in flight to hand over.
                    self.stopping.set()
                    break
                free = min(free, left)
            plans: list[Plan] = []
            failed = False
            soonest = yield from self.schedules.look(self.workflows)  # issue 33: schedules
            if soonest is not None:
                self._remember_due(soonest)
            if free > 0:
                try:
                    yield from self._claim_some(free, plans, asynchronous)
                except Exception:  # noqa: BLE001 - logged with its traceback; the loop lives on
                    self._claim_failed()
                    failed = True
            for plan in plans:
                if backlog and self.concurrency == 1 and self.pushed:
                    # A backlog again (this look and the one before it claimed): at
                    # concurrency 1 nothing can be claimed while this run is driven, the
                    # look after it needs no ring, and SQLite's listener would look at
                    # each of its commits (~0.9 M instructions a run of 10 steps).
                    # Opened again at the next rest after a look that claims nothing,
                    # as at the start; a run arriving at an idle worker is driven with
                    # it open.
                    yield Unlisten()
                    listening = False
                worked = True
                yield Spawn(plan)
            if failed:
                yield from self._back_off()
                continue
            _hooks.fire("worker.resting")  # tests: the look is over, the rest begins
            if free > 0 and not listening and not worked and not self.stopping.is_set():
                yield Listen()
                listening = True
                backlog = False
                woken = True
            else:
                # A look with no free slot (aserve's loop looks while its runs are in
                # flight, serve's at concurrency 1 never does) neither ends a backlog nor
                # makes the worker idle: only a look that could claim says either.
                if free > 0:
                    backlog, worked = worked, False
                fallback = self.poll if self.pushed else idle
                # Cleared by the driver as the rest ends, just before the next look: a
                # ring during that look sets it again, and the rest after returns at once.
                woken = yield Rest(self._rest(began, fallback))
            idle = next_idle(idle, bool(plans or woken), self.poll)
        if listening:
            yield Unlisten()
        yield Drain()

    def _rest(self, began: float, fallback: float) -> float:
        """Return the seconds to rest after the look that began at ``began`` (monotonic).

        Until the earliest of ``fallback`` and a due time this worker knows: the timer
        of a run it suspended, or the lease of a run another owner holds running out
        by our watch (``Watch.next_expiry``). A due time at or before ``began`` was
        covered by that look. A ring (``Rest``'s wake) cuts any rest short.
        """
        soonest = self.watch.next_expiry(began)
        with self.lock:
            due = self.due
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
        while not self.stopping.is_set() and (left := until - _clock.monotonic()) > 0:
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
        self.watch.prune()
        # The store's clock (``_store_time``): which timers are due is the store's
        # judgement, never this host's, whose clock may be hours off the writers'.
        # The earliest it may be (``earliest``), so no run is claimed before its time;
        # as a plain datetime, which every driver encodes (``plain``).
        now = plain(earliest((yield Now())))
        if self.one_call:
            # Owned runs only: running ones, and waiting ones re-claimed to act on a signal.
            # At most once per poll interval, not after every run that ends: a takeover
            # waits a whole lease anyway, and a mark seen later only starts that later.
            moment = _clock.monotonic()
            if moment - self.owned_at >= self.poll:
                self.owned_at = moment
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
            if self.watch.at_start():
                infos = yield Page(now, _CLAIM_BATCH, None, 0)
                first = self.watch.first_look(infos, _CLAIM_BATCH)
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
                if self.stopping.is_set():
                    return False
                if page is None:
                    try:
                        infos = yield Page(now, _CLAIM_BATCH, status, self.watch.skip[status])
                    except StoreError as exc:
                        logger.warning("%r: cannot read the claim index: %s", self, exc)
                        return False
                    page = (infos, len(infos) >= _CLAIM_BATCH)
                infos, more = page
                taken = 0
                listed = [i for i in infos if i.owner is not None] if owned_only else infos
                for info in self.watch.pick(listed, self.busy(), _clock.monotonic()):
                    if len(plans) >= free or self.stopping.is_set():
                        break
                    plan = yield from self._claim_one(info, asynchronous, now)
                    if plan is not None:
                        plans.append(plan)
                        taken += 1
                filled, capped = len(plans) >= free, count + 1 >= _MAX_PAGES
                if not self.watch.turn(status, len(infos), taken, more, filled, capped):
                    break
                page = None
        return True

    def _claim_ready(
        self, free: int, plans: list[Plan], now: datetime, asynchronous: bool
    ) -> Generator[Effect, Any, bool]:
        """Claim up to ``free`` runs in one call (``Store.claim_ready``); False if refused."""
        moment = _clock.monotonic()
        with self.lock:
            # Runs that ended in an unexpected error a moment ago: not yet again. And the
            # runs still in flight here: one given back has no owner, but until
            # ``finished`` records how it ended (one lock hold) it is not claimed again.
            # (Usually neither: no set built then.)
            cooling = (
                frozenset(k for k, (_, until) in self.cooling.items() if until > moment)
                if self.cooling
                else _NONE
            )
            if self.plans:
                cooling |= frozenset(self.plans)
        try:
            claims = yield ClaimReady(
                ReadyAsk(self.owner, self.lease, free, self.served, now, cooling)
            )
        except StoreError as exc:
            logger.warning("%r: cannot claim in one call, claiming run by run: %s", self, exc)
            return False
        for before, claimed in claims:
            plan = yield from self._take(before, claimed, asynchronous, now)
            if plan is not None:
                plans.append(plan)
        return True

    def _take(
        self, before: Checkpoint, claimed: Checkpoint, asynchronous: bool, now: datetime
    ) -> Generator[Effect, Any, Plan | None]:
        """Drive a run ``claim_ready`` claimed, or give it back; return its plan, or None."""
        plan = self._plan_for(claimed, asynchronous=asynchronous, now=now)
        try:
            if plan is None:
                # Not for this worker now after all (its step's own readiness rule, a
                # refused upgrade): given back at once, for whoever may run it, and
                # not claimed by this worker again for a while (else the next look,
                # 50 ms later under the back-off, claims and gives it back again).
                moment = _clock.monotonic()
                with self.lock:
                    ends, until = self.cooling.get(claimed.run_id, (0, 0.0))
                    pause = max(until, moment + max(self.poll, _COOL_FIRST))
                    self.cooling[claimed.run_id] = (ends, pause)
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
        return self._adopt(plan, before, claimed)

    def _claim_one(
        self, info: RunInfo, asynchronous: bool, now: datetime
    ) -> Generator[Effect, Any, Plan | None]:
        """Claim ``info``'s run if it needs this worker now; return its plan, or None."""
        try:
            # The time *before* the read: the version it returns was current at some
            # moment after this, so a lease counted from here is never too short.
            began = _clock.monotonic()
            loaded = yield Load(info.run_id)
            cp = self._claimable(loaded, began)
            if cp is None:
                return None
            plan = self._plan_for(cp, asynchronous=asynchronous, now=now)
            if plan is None:
                return None
            claimed = yield Save(self._claim_record(plan.preclaimed or cp), "claim", owned=False)
        except ConflictError:
            return None  # another worker won this claim
        except StepstoneError as exc:
            logger.warning("run %r: not claimed: %s", info.run_id, exc)
            return None
        return self._adopt(plan, loaded, claimed)

    def _adopt(self, plan: Plan, loaded: Checkpoint, claimed: Checkpoint) -> Plan:
        """Hold ``plan``, whose claim of ``loaded`` landed as ``claimed``; tell the claim."""
        _hooks.fire("worker.claimed")  # the claim landed; nothing of the run is driven yet
        plan.preclaimed = plan.current = claimed
        plan.written_at = _clock.monotonic()
        with self.lock:
            self.plans[plan.run_id] = plan
            self.claimed += 1
            if self.stopping.is_set():
                plan.stop_requested = True
        emit(claim_event(plan, loaded, claimed))
        return plan

    def execution(self, plan: Plan) -> Generator[Effect, Any, WorkflowChanged | None]:
        """Drive ``plan``'s run, or park it if its steps cannot resume it; return why parked."""
        why = changed(plan)
        if why is None:
            yield Execute(plan)
        else:
            yield from park(plan, why, self.owner)
        return why

    @staticmethod
    def ended(plan: Plan, exc: BaseException) -> BaseException:
        """Log an execution's end by ``exc`` unless it is one of the tree's; return ``exc``."""
        if isinstance(exc, Exception) and not isinstance(exc, StepstoneError):
            logger.exception("run %r: unexpected error", plan.run_id)  # a bug, a foreign store
        elif not isinstance(exc, Exception):  # a step raised KeyboardInterrupt, SystemExit...
            logger.exception("run %r: stopped by %s", plan.run_id, type(exc).__name__)
        return exc
