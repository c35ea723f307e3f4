"""The durable runner: ``run`` and ``arun``, one call that both starts and resumes a run.

Execution is at-least-once. The checkpoint is written after a step returns, so a crash
between a step finishing and its checkpoint landing re-runs that step on resume: steps
must be idempotent (``StepContext.idempotency_key`` helps). Writing the checkpoint
before the step instead would make a crash silently skip work.

The rules live once in ``_core.execute`` (a sans-I/O generator); this module holds its
two drivers, each a small loop that performs the effects the core yields: ``run`` with
plain calls and a process-wide renewal thread, ``arun`` with awaits and a timer per
step. A run is owned while it executes: both take the run's lease first
(``_lease``), renew it while a long step runs and give it back at the end.
"""

from __future__ import annotations

import heapq
import inspect
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import _lease
from ._checkpoint import Checkpoint, check_run_id
from ._codec import encode_state
from ._core import (
    Call,
    Effect,
    Load,
    Pause,
    Plan,
    Renewing,
    Save,
    astep_through,
    execute,
    renew,
    step_through,
)
from ._errors import ConflictError, InvalidWorkflow
from ._observe import logger, tracing
from ._steps import (
    AttemptsExhausted,
    RetryPolicy,
    Step,
    StepContext,
    Workflow,
    check_steps,
    idempotency_key,
)
from ._store import Store

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "AttemptsExhausted",
    "RetryPolicy",
    "Step",
    "StepContext",
    "arun",
    "idempotency_key",
    "make_plan",
    "run",
]

State = dict[str, Any]
Steps = Sequence[Any] | Workflow


def make_plan(
    run_id: str,
    steps: Steps,
    store: Store,
    *,
    input: State | None,
    lease: float | timedelta | None,
    owner: str | None = None,
    preclaimed: Checkpoint | None = None,
    asynchronous: bool,
) -> Plan:
    """Check the arguments of ``run``/``arun`` up front and return the core's ``Plan``."""
    check_run_id(run_id)
    if not isinstance(store, Store):
        raise InvalidWorkflow(f"store must be a stepstone Store, got {type(store).__name__}")
    workflow = (steps.name, steps.version) if isinstance(steps, Workflow) else None
    items = check_steps(steps)
    if not asynchronous:
        for item in items:
            if isinstance(item, Step) and item.is_async:
                raise InvalidWorkflow(
                    f"step {item.name!r} is async (async def); run it with "
                    "`await stepstone.arun(...)`, not stepstone.run"
                )
    if input is not None:
        # Validated (and copied) here: a bad input is refused before anything is stored.
        input = encode_state(input)[1]
    seconds = _lease.DEFAULT_LEASE if lease is None else _lease.check_lease(lease)
    return Plan(
        run_id,
        items,
        input=input,
        workflow=workflow,
        owner=owner or _lease.new_owner(),
        lease=seconds,
        on=tracing(),
        preclaimed=preclaimed,
    )


# --- the sync driver ------------------------------------------------------------------


def run(
    run_id: str,
    steps: Steps,
    store: Store,
    *,
    input: State | None = None,
    lease: float | timedelta | None = None,
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

    Returns:
        The final state, a dict the caller owns.

    Raises:
        StepFailed: a step raised (retries exhausted); the failure is saved on the run.
        Suspended: the run waits for a signal, a timer or child runs; it is saved as
            waiting. Call again (or let a worker) once that has happened.
        RunCancelled: the run was cancelled.
        WorkflowChanged: the completed steps' names differ from the first steps passed.
        InputMismatch: ``input`` differs from the one the run was started with.
        RunOwned: another process holds a live lease on the run.
        LeaseLost: another worker took the run over (this call's lease had expired).
        ConflictError: another writer advanced the run meanwhile.
        InvalidState: a step produced a state that is not JSON; nothing was saved.
        StoreError: the store failed; the run stops at its last checkpoint.
    """
    plan = make_plan(run_id, steps, store, input=input, lease=lease, asynchronous=False)
    return drive(plan, store)


def drive(plan: Plan, store: Store) -> State:
    """Perform the core's effects with plain calls until the run ends."""
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
            plan.current = saved if saved.owner == plan.owner else None
            plan.written_at = time.monotonic()
        return saved
    if kind is Load:
        assert isinstance(effect, Load)
        return store.load(effect.run_id)
    if kind is Call:
        assert isinstance(effect, Call)
        step = effect.step
        ticket = _renewer.enter(plan, store)
        try:
            if effect.ctx is not None:
                update = step.fn(effect.state, effect.ctx)
            else:
                update = step.fn(effect.state)
        finally:
            lost = _renewer.leave(ticket)
        if lost is not None:
            raise lost
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
    assert isinstance(effect, Pause)
    pause_ticket = _renewer.enter(plan, store) if effect.base is not None else None
    try:
        time.sleep(effect.seconds)
    finally:
        lost = _renewer.leave(pause_ticket) if pause_ticket is not None else None
    if lost is not None:
        raise lost
    return None


def _release(plan: Plan, store: Store) -> None:
    """Give the lease back after an interruption, so the run can be resumed at once."""
    current = plan.current
    if current is None or current.owner != plan.owner:
        return
    plan.current = None
    try:
        store.save(_lease.released(_lease.as_stored(current)))
    except Exception as exc:
        # It expires by itself; a takeover then waits one lease.
        logger.warning("run %r: could not give the lease back: %s", plan.run_id, exc)


def renew_once(plan: Plan, store: Store) -> BaseException | None:
    """Renew the lease on ``plan.current``; return the ``LeaseLost`` if it is gone."""
    lost: BaseException | None = step_through(renew(plan), lambda e: _perform(e, plan, store))
    return lost


class _Ticket:
    __slots__ = ("active", "dead", "due", "lock", "lost", "plan", "store")

    def __init__(self, plan: Plan, store: Store, due: float) -> None:
        self.plan = plan
        self.store = store
        self.due = due
        self.active = False
        self.dead = False
        self.lost: BaseException | None = None
        self.lock = threading.Lock()

    def __lt__(self, other: _Ticket) -> bool:
        return self.due < other.due


class _SyncRenewer:
    """One thread renews the leases of every run executing in the process.

    Each run has one ticket in a heap, checked every third of its lease; a step that
    returns within a third of the lease after the run's last write costs no renewal,
    and entering or leaving a step is one uncontended lock. Renewal holds the ticket's
    lock, so ``leave`` returns only after an in-flight renewal landed and
    ``Plan.current`` is the newest record.
    """

    def __init__(self) -> None:
        self._heap: list[_Ticket] = []
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def enter(self, plan: Plan, store: Store) -> _Ticket:
        ticket: _Ticket | None = plan.renewal
        if ticket is None:
            ticket = _Ticket(plan, store, plan.written_at + plan.lease / 3)
            plan.renewal = ticket
            with self._cond:
                heapq.heappush(self._heap, ticket)
                if self._heap[0] is ticket:
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

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0].due > time.monotonic():
                    timeout = self._heap[0].due - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                ticket = heapq.heappop(self._heap)
            plan = ticket.plan
            with ticket.lock:
                if ticket.dead:
                    continue
                third = plan.lease / 3
                if ticket.active and time.monotonic() >= plan.written_at + third:
                    try:
                        lost = renew_once(plan, ticket.store)
                    except Exception:  # one run's bad renewal must not stop every run's
                        logger.exception("run %r: lease renewal failed", plan.run_id)
                        lost = None
                    if lost is not None:
                        ticket.lost = lost
                        logger.error("run %r: %s", plan.run_id, lost)
                ticket.due = max(plan.written_at + third, time.monotonic() + third / 4)
            with self._cond:
                heapq.heappush(self._heap, ticket)


_renewer = _SyncRenewer()


# --- the async driver -----------------------------------------------------------------


async def arun(
    run_id: str,
    steps: Steps,
    store: Store,
    *,
    input: State | None = None,
    lease: float | timedelta | None = None,
) -> State:
    """Await the run: the contract of ``run``, for async steps and async stores.

    ``async def`` steps are awaited in the caller's task; plain steps run in a worker
    thread so that a blocking call cannot stall the event loop. Cancelling the task
    that awaits ``arun`` cancels the step in flight: nothing is saved for it, a save
    already in flight lands whole (old or new checkpoint, never torn), the lease is
    given back and ``CancelledError`` propagates; a later ``run``/``arun`` resumes
    from the last checkpoint.

    Raises:
        The errors of ``run``, and ``asyncio.CancelledError`` when cancelled.
    """
    plan = make_plan(run_id, steps, store, input=input, lease=lease, asynchronous=True)
    return await adrive(plan, store)


async def adrive(plan: Plan, store: Store) -> State:
    """Perform the core's effects with awaits until the run ends."""
    import asyncio  # noqa: PLC0415 - sync users and the CLI never pay for importing it

    try:
        result: State = await astep_through(
            execute(plan), lambda effect: _aperform(effect, plan, store, asyncio)
        )
        return result
    except BaseException as exc:
        if not isinstance(exc, ConflictError):
            await _landed(asyncio, _arelease(plan, store))
        raise


async def _landed(asyncio: Any, coro: Any) -> Any:
    """Await ``coro`` to its end even if we are cancelled meanwhile, then re-raise that.

    A save is one request: once sent it lands or not, whatever happens to our task. We
    wait for its answer so that what the run holds (``Plan.current``) is what is stored.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            pass
    if cancelled:
        task.exception()  # retrieved: no "exception never retrieved" warning
        raise asyncio.CancelledError
    return task.result()


async def _aperform(effect: Effect, plan: Plan, store: Store, asyncio: Any) -> Any:
    kind = type(effect)
    if kind is Save:
        assert isinstance(effect, Save)
        owned = effect.owned

        async def save() -> Checkpoint:
            saved = await store.asave(effect.cp)
            if owned:
                plan.current = saved if saved.owner == plan.owner else None
                plan.written_at = time.monotonic()
            return saved

        return await _landed(asyncio, save())
    if kind is Load:
        assert isinstance(effect, Load)
        return await store.aload(effect.run_id)
    if kind is Call:
        assert isinstance(effect, Call)
        step = effect.step
        renewal = _AsyncRenewal(plan, store, asyncio)
        try:
            args = (effect.state,) if effect.ctx is None else (effect.state, effect.ctx)
            try:
                if step.is_async:
                    update = await step.fn(*args)
                else:
                    update = await asyncio.to_thread(_in_thread, step.fn, *args)
                    if inspect.isawaitable(update):
                        # A plain callable returning a coroutine (``lambda s: client.call(s)``).
                        update = await update
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being cancelled: the run stops here, nothing saved
                # The step raised CancelledError itself, nobody cancelled us: a failure.
                raise RuntimeError(
                    f"step {step.name!r} raised CancelledError without being cancelled"
                ) from exc
        finally:
            lost = await renewal.stop()
        if lost is not None:
            raise lost
        return update
    if kind is Renewing:
        assert isinstance(effect, Renewing)
        holding = _AsyncRenewal(plan, store, asyncio)
        try:
            result = await astep_through(
                effect.gen, lambda inner: _aperform(inner, plan, store, asyncio)
            )
        finally:
            lost = await holding.stop()
        if lost is not None:
            raise lost
        return result
    assert isinstance(effect, Pause)
    pausing = _AsyncRenewal(plan, store, asyncio) if effect.base is not None else None
    try:
        await asyncio.sleep(effect.seconds)
    finally:
        lost = await pausing.stop() if pausing is not None else None
    if lost is not None:
        raise lost
    return None


def _in_thread(fn: Any, *args: Any) -> Any:
    # StopIteration cannot cross into a future (asyncio would leave it unresolved, and
    # the run would hang): it becomes the step's error here, as PEP 479 does for
    # generators.
    try:
        return fn(*args)
    except StopIteration as exc:
        raise RuntimeError(f"the step raised StopIteration: {exc!r}") from exc


async def _arelease(plan: Plan, store: Store) -> None:
    current = plan.current
    if current is None or current.owner != plan.owner:
        return
    plan.current = None
    try:
        await store.asave(_lease.released(_lease.as_stored(current)))
    except Exception as exc:
        logger.warning("run %r: could not give the lease back: %s", plan.run_id, exc)


async def arenew_once(plan: Plan, store: Store) -> BaseException | None:
    """Async ``renew_once``."""
    import asyncio  # noqa: PLC0415

    lost: BaseException | None = await astep_through(
        renew(plan), lambda e: _aperform(e, plan, store, asyncio)
    )
    return lost


class _AsyncRenewal:
    """Renews a step's lease every third of it, from a timer; nothing if the step is short."""

    __slots__ = ("asyncio", "handle", "lost", "plan", "store", "task")

    def __init__(self, plan: Plan, store: Store, asyncio: Any) -> None:
        self.plan = plan
        self.store = store
        self.asyncio = asyncio
        self.lost: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        self.handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            plan.lease / 3, self._tick
        )

    def _tick(self) -> None:
        self.handle = None
        self.task = self.asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        lost = await arenew_once(self.plan, self.store)
        if lost is not None:
            self.lost = lost
            logger.error("run %r: %s", self.plan.run_id, lost)
            return
        self.handle = self.asyncio.get_running_loop().call_later(self.plan.lease / 3, self._tick)

    async def stop(self) -> BaseException | None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        task = self.task
        if task is not None and not task.done():
            # Let an in-flight renewal land: the run's next save builds on it.
            await _landed(self.asyncio, _wait(task))
        if self.handle is not None:
            self.handle.cancel()
        return self.lost


async def _wait(task: Any) -> None:
    await task
