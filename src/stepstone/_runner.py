"""The durable runner: ``run``, one call that both starts and resumes a run.

Execution is at-least-once. The checkpoint is written after a step returns, so a crash
between a step finishing and its checkpoint landing re-runs that step on resume: steps
must be idempotent (``StepContext.idempotency_key`` helps). Writing the checkpoint
before the step instead would make a crash silently skip work.

The rules live once in ``_core.execute`` (a sans-I/O generator); this module is its
sync driver, a small loop that performs the effects the core yields with plain calls
and a process-wide renewal thread. ``arun``, the async driver, is in ``_arunner``. A
run is owned while it executes: both take the run's lease first (``_lease``), renew it
while a long step runs and give it back at the end.
"""

from __future__ import annotations

import heapq
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import _clock
from ._budget import Budget
from ._checks import Steps, check_clock, make_plan
from ._core import execute, renew
from ._effects import Announce, Call, Effect, Load, Pause, Renewing, Save, Together, step_through
from ._errors import ConflictError
from ._meter import current_store
from ._observe import logger
from ._plan import Plan, to_release
from ._steps import (
    AttemptsExhausted,
    RetryPolicy,
    Step,
    StepContext,
    idempotency_key,
)
from ._store import Store
from ._store_time import Now, store_now
from ._stream import _hooks as _stream
from ._timeouts import applies, timed_call
from ._wake import announce

__all__ = [
    "AttemptsExhausted",
    "RetryPolicy",
    "Step",
    "StepContext",
    "adrive",
    "arun",
    "drive",
    "idempotency_key",
    "make_plan",
    "renew_once",
    "run",
]

State = dict[str, Any]


def run(
    run_id: str,
    steps: Steps,
    store: Store,
    *,
    input: State | None = None,
    lease: float | timedelta | None = None,
    clock: _clock.Clock | None = None,
    budget: Budget | None = None,
) -> State:
    """Run ``steps`` durably under ``run_id``, resuming from its last checkpoint.

    Takes the run's lease, loads the checkpoint, skips the completed steps, runs the
    rest in order and saves a checkpoint after each step returns, before the next
    starts. A finished run returns its final state and runs nothing.

    Args:
        run_id: 1-1024 characters, no control characters.
        steps: A list of ``Step`` (and ``WaitFor``/``Sleep``/``Map``), or a ``Workflow``.
        store: Where checkpoints live.
        input: The initial state of a fresh run (a JSON dict), recorded with its first
            save. Resuming with None uses the recorded input; another input is refused.
        lease: Seconds (or a ``timedelta``) this call promises to renew its ownership
            within; another process may take the run over after that long without a
            renewal. Default 30.
        clock: The clock this call reads (its timers, backoff and lease), in place of
            the installed one (``stepstone.testing.use_clock``); a
            ``stepstone.testing.FakeClock`` in tests. Default: the installed clock.
        budget: The run's spend limit (``stepstone.Budget``; see Spend budgets), instead
            of its workflow's. Kept in the run's ledger from its first step on.

    Returns:
        The final state, a dict the caller owns.

    Raises:
        StepFailed: a step raised (retries exhausted), or returned a state that is not
            JSON (``__cause__`` is the ``InvalidState`` naming its path; never retried);
            the failure is saved on the run.
        Suspended: the run waits for a signal, a timer or child runs; it is saved as
            waiting. Call again (or let a worker) once that has happened.
        RunCancelled: the run was cancelled.
        WorkflowChanged: the completed steps' names differ from the first steps passed.
        InputMismatch: ``input`` differs from the one the run was started with.
        RunOwned: another process holds a live lease on the run.
        LeaseLost: another worker took the run over (this call's lease had expired).
        ConflictError: another writer advanced the run meanwhile.
        StoreError: the store failed; the run stops at its last checkpoint.
    """
    with _clock.using(check_clock(clock)):
        plan = make_plan(
            run_id, steps, store, input=input, lease=lease, asynchronous=False, budget=budget
        )
        return drive(plan, store)


def drive(plan: Plan, store: Store) -> State:
    """Perform the core's effects with plain calls until the run ends."""
    current_store.set(store)  # for ctx.reserve() inside the steps (``_budget``)
    try:
        result: State = step_through(execute(plan), lambda effect: _perform(effect, plan, store))
        return result
    except BaseException as exc:
        # After a conflict (a takeover, or another writer) the record is not ours to
        # give back: our version is gone, a release could only conflict again.
        if not isinstance(exc, ConflictError):
            _release(plan, store)
        raise
    finally:
        _renewer.finish(plan)


def _perform(effect: Effect, plan: Plan, store: Store) -> Any:
    kind = type(effect)
    if kind is Save:
        assert isinstance(effect, Save)
        saved = store.save(effect.cp)
        if effect.owned:
            # Written out here and in ``_arunner``, not called: a call on every save
            # costs each step ~1% in instructions. What the run holds now, and the time
            # of its last write (any write renews the lease).
            plan.current = saved if saved.owner == plan.owner else None
            plan.written_at = _clock.monotonic()
        return saved
    if kind is Load:
        assert isinstance(effect, Load)
        return store.load(effect.run_id)
    if kind is Call:
        assert isinstance(effect, Call)
        step = effect.step
        ticket = _renewer.enter(plan, store)
        attempt = _stream.begin(store, plan, effect)  # streams (issue 34)
        try:
            if applies(plan, step):  # issue 33: a timeout, or the run's deadline
                update = timed_call(step, effect.state, effect.ctx, plan.deadline_mono, plan.late)
            elif effect.ctx is not None:
                update = step.fn(effect.state, effect.ctx)
            else:
                update = step.fn(effect.state)
        except BaseException:
            _stream.abandon(attempt)
            raise
        finally:
            lost = _renewer.leave(ticket)
        if lost is not None:
            _stream.abandon(attempt)
            raise lost
        plan.streamed = _stream.end(attempt)  # its events are stored before the commit
        return update
    if kind is Renewing:
        assert isinstance(effect, Renewing)
        held = _renewer.enter(plan, store)
        try:
            result = step_through(effect.gen, lambda inner: _perform(inner, plan, store))
        finally:
            lost = _renewer.leave(held)
        if lost is not None:
            raise lost
        return result
    if kind is Announce:
        assert isinstance(effect, Announce)
        if effect.local:
            store.doorbell.ring()
        else:
            announce(store)
        return None
    if kind is Together or kind is Now:
        return _plain(effect, store)
    assert isinstance(effect, Pause)
    pause_ticket = _renewer.enter(plan, store) if effect.base is not None else None
    try:
        _clock.sleep(effect.seconds)
    finally:
        lost = _renewer.leave(pause_ticket) if pause_ticket is not None else None
    if lost is not None:
        raise lost
    return None


#: Threads the sync driver performs a ``Together`` on (shared by every run of the
#: process; each makes or reads one child at a time, so a handful is enough).
TOGETHER_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool  # noqa: PLW0603 - one pool per process, made on first use
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(TOGETHER_THREADS, thread_name_prefix="stepstone-together")
        return _pool


def _one(effect: Load | Save, store: Store) -> Any:
    """One effect of a ``Together``: its result, or the exception it raised."""
    try:
        if isinstance(effect, Load):
            return store.load(effect.run_id)
        return store.save(effect.cp)
    except Exception as exc:  # noqa: BLE001 - handed back: the rule decides
        return exc


def _plain(effect: Effect, store: Store) -> Any:
    """A ``Together`` or a ``Now``: effects that neither renew nor touch the plan."""
    if isinstance(effect, Now):
        return store_now(store)
    assert isinstance(effect, Together)
    return together(effect, store)


def together(effect: Together, store: Store) -> list[Any]:
    """Perform a ``Together``: each effect on the shared pool, results in order."""
    effects = effect.effects
    if len(effects) <= 1:
        return [_one(each, store) for each in effects]
    saves = [each.cp for each in effects if isinstance(each, Save)]
    if store.saves_together and len(saves) == len(effects):
        # A Map's children made in one transaction (SQLite: one commit, one fsync).
        return list(store.save_many(saves))
    pool = _shared_pool()
    futures = [pool.submit(_one, each, store) for each in effects]
    return [future.result() for future in futures]


def _release(plan: Plan, store: Store) -> None:
    """Give the lease back after an interruption, so the run can be resumed at once."""
    record = to_release(plan)
    if record is None:
        return
    try:
        store.save(record)
    except Exception as exc:  # noqa: BLE001 - any failure: the lease expires by itself
        # A takeover then waits one lease.
        logger.warning("run %r: could not give the lease back: %s", plan.run_id, exc)


def renew_once(plan: Plan, store: Store) -> BaseException | None:
    """Renew the lease on ``plan.current``; return the ``LeaseLost`` if it is gone."""
    lost: BaseException | None = step_through(renew(plan), lambda e: _perform(e, plan, store))
    return lost


# Identity semantics (``eq=False``): tickets sit in a heap ordered by ``__lt__`` alone.
@dataclass(slots=True, eq=False, repr=False)
class _Ticket:
    plan: Plan
    store: Store
    due: float
    #: The clock the run reads (its ``written_at``, ``due``): the call's own or the
    #: installed one, as it was when the run first entered a step.
    clock: _clock.Clock
    active: bool = field(default=False, init=False)
    dead: bool = field(default=False, init=False)
    lost: BaseException | None = field(default=None, init=False)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __lt__(self, other: _Ticket) -> bool:
        return self.due < other.due


#: Real seconds between looks at the runs on a clock that is not real (a test's
#: ``FakeClock``): its moves cannot wake a real wait, so they are noticed within this.
_OTHER_CLOCKS_POLL = 0.02


class _SyncRenewer:
    """One thread renews the leases of every run executing in the process.

    Each run has one ticket, checked every third of its lease; a step that returns
    within a third of the lease after the run's last write costs no renewal, and
    entering or leaving a step is one uncontended lock. Renewal holds the ticket's
    lock, so ``leave`` returns only after an in-flight renewal landed and
    ``Plan.current`` is the newest record.

    Tickets on a real clock wait in a heap, by due time. A run on another clock (a
    ``FakeClock``, installed or passed as ``clock=``) is looked at every
    ``_OTHER_CLOCKS_POLL`` real seconds, on its own clock, so moving that clock past a
    third of the lease renews it; its renewal runs under that clock too.
    """

    def __init__(self) -> None:
        self._heap: list[_Ticket] = []
        self._others: list[_Ticket] = []
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def enter(self, plan: Plan, store: Store) -> _Ticket:
        ticket: _Ticket | None = plan.renewal
        if ticket is None:
            clock = _clock.current()
            ticket = _Ticket(plan, store, plan.written_at + plan.lease / 3, clock)
            plan.renewal = ticket
            with self._cond:
                if _clock.is_real(clock):
                    heapq.heappush(self._heap, ticket)
                    if self._heap[0] is ticket:
                        self._cond.notify()
                else:
                    self._others.append(ticket)
                    self._cond.notify()
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._loop, name="stepstone-lease-renewer", daemon=True
                    )
                    self._thread.start()
        with ticket.lock:
            ticket.active = True
        return ticket

    @staticmethod
    def leave(ticket: _Ticket) -> BaseException | None:
        with ticket.lock:
            ticket.active = False
        return ticket.lost

    @staticmethod
    def finish(plan: Plan) -> None:
        ticket = plan.renewal
        if ticket is not None:
            with ticket.lock:
                ticket.dead = True
                ticket.active = False

    def _due(self) -> list[_Ticket]:
        """Take the tickets due now out of the heap and the others (under ``_cond``)."""
        due: list[_Ticket] = []
        if self._others:
            waiting: list[_Ticket] = []
            for ticket in self._others:
                if not ticket.dead:  # a finished run is dropped here, not renewed
                    (due if ticket.clock.monotonic() >= ticket.due else waiting).append(ticket)
            self._others = waiting
        heap = self._heap
        if heap and heap[0].due <= _clock.SYSTEM.monotonic():
            due.append(heapq.heappop(heap))
        return due

    def _timeout(self) -> float | None:
        """Return the real seconds to wait for the next ticket (None: until notified)."""
        timeout = None if not self._heap else self._heap[0].due - _clock.SYSTEM.monotonic()
        if self._others:
            timeout = _OTHER_CLOCKS_POLL if timeout is None else min(timeout, _OTHER_CLOCKS_POLL)
        return timeout

    def _loop(self) -> None:
        while True:
            with self._cond:
                due = self._due()
                while not due:
                    self._cond.wait(self._timeout())
                    due = self._due()
            for ticket in due:
                if self._renew(ticket):
                    with self._cond:
                        if _clock.is_real(ticket.clock):
                            heapq.heappush(self._heap, ticket)
                        else:
                            self._others.append(ticket)

    @staticmethod
    def _renew(ticket: _Ticket) -> bool:
        """Renew ``ticket``'s run if it is in a step and due; return whether it lives on."""
        plan = ticket.plan
        clock = ticket.clock
        with ticket.lock:
            if ticket.dead:
                return False
            third = plan.lease / 3
            if ticket.active and clock.monotonic() >= plan.written_at + third:
                try:
                    with _clock.using(clock):  # its stamps and ``written_at`` on its clock
                        lost = renew_once(plan, ticket.store)
                except Exception:  # noqa: BLE001 - one run's bad renewal must not stop every run's
                    logger.exception("run %r: lease renewal failed", plan.run_id)
                    lost = None
                if lost is not None:
                    ticket.lost = lost
                    logger.error("run %r: %s", plan.run_id, lost)
            ticket.due = max(plan.written_at + third, clock.monotonic() + third / 4)
        return True


_renewer = _SyncRenewer()


# --- the async driver, by its old address ---------------------------------------------
# ``arun`` and ``adrive`` are ``_arunner``'s, looked up there on first use (PEP 562), not
# imported at the top: asyncio costs ~40 ms to import, which sync users, the worker's
# sync loop and the CLI never pay. Looked up rather than wrapped, so that their
# signatures are written once, in ``_arunner``.

if TYPE_CHECKING:
    from ._arunner import adrive, arun
else:

    def __getattr__(name: str) -> object:
        if name in ("adrive", "arun"):
            from . import _arunner  # noqa: PLC0415 - defers asyncio, see above

            return getattr(_arunner, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
