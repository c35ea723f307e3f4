"""Workflows as code: ``@workflow`` functions whose context calls are journaled.

A ``CodeWorkflow`` is a ``Workflow`` of one suspending step (``CodeStep``) whose
evaluation drives the function. The function runs beside the core: in a thread of its
own (a plain ``def``) or as a task on the caller's event loop (``async def``). Each
``ctx`` call that has no answer in the journal yet sends a request to the core, which
performs it as effects like any step's bookkeeping: a journaled result is one save of
the run (``_core.write``: compare-and-swap, fenced by the run's lease), a wait is the
run saved ``waiting`` exactly as ``WaitFor``/``Sleep``/``Map`` leave it (``ctx.map``
runs a ``Map`` step's own evaluation). Meanwhile the core
waits for the next request inside a ``Call``, so the driver renews the lease as it
does while a long step runs, and every save is the driver's own (``Plan.current``).

The journal is a list in the run's state under ``JOURNAL_KEY``, one entry per answered
call, in the order the answers landed (``_journal``). Appending to it is an append to
a list, so a long state's save stores only the new entry (``_statelog``'s ``x`` op).

On resume the function runs again from the top: the journal answers every call made
before (by its position in call order, checked against its name), and the first call
it cannot answer runs for real. Code between calls therefore re-runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from . import _budget, _hooks, _lease
from ._checkpoint import Checkpoint, evolve, parked
from ._code_budget import _append, _spend_request
from ._codec import copy_containers
from ._context import MISSING, AsyncWorkflowContext, WorkflowContext, failure
from ._core import Interrupted, write
from ._deadline_run import deadline_asked
from ._effects import Announce, Call, Effect
from ._errors import (
    ConfigError,
    ConflictError,
    InvalidState,
    InvalidWorkflow,
    StoreUnavailable,
    WorkflowChanged,
    safe_text,
)
from ._flow import _hook as _flow
from ._flow._call import FlowCall
from ._flow._limit import Limit, LimitReached
from ._journal import (
    ATTEMPTS_KEY,
    JOURNAL_KEY,
    RERUNS_KEY,
    answer_of,
    entry_failed,
    entry_ok,
    journal_of,
    json_value,
    recorded_calls,
)
from ._observe import logger
from ._plan import Plan
from ._session import CallFailed, Reply, Session, Waiter, close, current_call
from ._steps import Complete, Outcome, StepCodeError, SuspendingStep, Wait, Workflow, check_name
from ._store_time import Now, plain
from ._suspend import Map, _due, nudge, pending_signals
from ._write import _finish_cancelled as finish_cancelled

__all__ = [
    "JOURNAL_KEY",
    "AsyncWorkflowContext",
    "CallFailed",
    "CodeStep",
    "CodeWorkflow",
    "WorkflowContext",
    "current_call",
    "workflow",
]

State = dict[str, Any]
Upgrades = Mapping[str | None, Callable[[State], State]]


# --- the step that drives the function ---------------------------------------------------


class CodeStep(SuspendingStep):
    """The one step of a ``CodeWorkflow``: runs the function, journaling its calls."""

    __slots__ = ("fn", "is_async")

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = check_name(name)
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)
        self.retry = None

    def __repr__(self) -> str:
        return f"CodeStep({self.name!r})"

    def ready(self, cp: Checkpoint, now: datetime | None = None) -> bool:
        waiting = cp.waiting_for or ""
        if waiting.startswith("signal ") and pending_signals(cp, waiting[len("signal ") :]):
            return True
        # A key may have come free before the due time (flow control): ask it again.
        return waiting.startswith("limit:") or _due(cp.wake_at, now)

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: State, first: bool
    ) -> Generator[Effect, Any, Outcome]:
        recorded = recorded_calls(plan.run_id, journal_of(cp.state))
        given = cp.input if isinstance(cp.input, dict) else {}
        session = Session(
            plan.run_id, self.name, recorded, self.fn, copy_containers(given), self.is_async
        )
        session.ctx = (AsyncWorkflowContext if self.is_async else WorkflowContext)(session)
        session.budgeted = _budget.active(plan, cp)
        # Issue 33: checked by each call, on this process's monotonic clock.
        session.deadline_at, session.deadline_mono = plan.deadline_at, plan.deadline_mono
        # Awaited under arun. The sync driver calls it instead, and gets a coroutine: the
        # core then waits in the driver's thread (``next_requests``).
        waiter = Waiter(self.name, session.anext_requests, True)
        try:
            while True:
                batch = yield Call(waiter, state, None, cp)
                if inspect.isawaitable(batch):
                    close(batch)  # never awaited: nothing of it ran
                    if self.is_async:
                        raise InvalidWorkflow(
                            f"workflow {self.name!r} is async (async def): run it with "
                            "`await stepstone.arun(...)` or `await worker.aserve()`"
                        )
                    waiter = Waiter(self.name, session.next_requests, False)
                    continue
                saves = [request for request in batch if request[0] == "save"]
                if saves:
                    # The same kill points as a step's: returned, not yet journaled; journaled.
                    _hooks.fire("runner.after_step")
                    cp = yield from _append(plan, cp, [request[1] for request in saves], {})
                    _hooks.fire("runner.after_save")
                    if cp.cancel_requested or plan.stop_requested:
                        # Every journaled call is a boundary, as each step of a list is.
                        session.stop("stopped")
                        yield from _boundary(plan, cp)
                    for request in saves:
                        session.answer(request[2], None)
                    yield from _give_back(cp, session, saves)
                for request in batch:
                    kind = request[0]
                    if kind == "save":
                        continue
                    if kind == "end":
                        return (yield from _ended(plan, cp, index, session, state, request))
                    if kind == "attempt":
                        cp = yield from _attempt(plan, cp, session, request)
                        if cp.cancel_requested or plan.stop_requested:
                            session.stop("stopped")
                            yield from _boundary(plan, cp)
                        continue
                    if kind == "sleep":
                        cp, wait = yield from _sleep(plan, cp, session, request)
                    elif kind in ("charge", "budget", "reserve"):  # spend budgets (``_budget``)
                        cp, wait = yield from _spend_request(plan, cp, session, request)
                    else:  # map, acquire, rate_limited, deadline, wait (``_other``)
                        cp, wait = yield from _other(plan, cp, index, state, session, request)
                    if wait is not None:
                        return wait
        finally:
            session.stop("stopped")
            # Keys of calls that will not be journaled now (the run parks, fails or is
            # handed over) lapse with the lease the run gives back.


def _other(
    plan: Plan, cp: Checkpoint, index: int, state: State, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """Perform a ``map``, ``acquire``, ``rate_limited``, ``deadline`` or ``wait`` request."""
    kind = request[0]
    if kind == "deadline":  # issue 33: a call met the run's deadline
        return (yield from deadline_asked(plan, cp, index, session, request[1], write)), None
    if kind == "map":
        return (yield from _map(plan, cp, index, state, session, request))
    if kind == "acquire":
        return (yield from _acquire(plan, cp, session, request))
    if kind == "rate_limited":
        return (yield from _rate_limited(cp, session, request))
    return (yield from _wait(plan, cp, session, request))


def _rate_limited(
    cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """A call raised ``RateLimited``: give back its keys, block them, park the run."""
    _, seq, _call, error, _reply = request
    taken = session.held.pop(seq, FlowCall())
    keys = list(taken.held)
    yield from _flow.give_back(cp.run_id, cp.epoch, taken, ran=True)
    until = yield from _flow.rate_limited(error, keys)
    session.stop("stopped")
    key = error.key or (keys[0] if keys else "rate")
    return cp, Wait(f"limit:{key}", datetime.fromtimestamp(until, UTC))


def _give_back(
    cp: Checkpoint, session: Session, saves: list[tuple[Any, ...]]
) -> Generator[Effect, Any, None]:
    """Give back the keys of the calls just journaled for good (flow control)."""
    for request in saves:
        taken = session.held.pop(request[1]["seq"], None)
        if taken is not None:
            yield from _flow.give_back(cp.run_id, cp.epoch, taken, ran=True)


def _acquire(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """Take the keys of call ``seq`` (flow control), or park the run on the first full one."""
    _, seq, _call, want, reply = request
    if _flow.resumed(cp):
        cp = yield from write(plan, cp, evolve(cp, waiting_for=None, wake_at=None), "limit")
    taken = FlowCall()
    priority = int(cp.flow.get("priority", 0)) if cp.flow else 0
    try:
        wait = yield from _flow.take(cp.run_id, cp.epoch, want, taken, priority)
    except (ConfigError, LimitReached) as exc:
        session.answered(reply)
        reply.fail(exc)  # the call raises it in the function
        return cp, None
    if wait is None:
        session.held[seq] = taken
        session.answer(reply, None)
        return cp, None
    session.stop("stopped")
    if wait.retry_at is None:  # on the store's clock, as ``retry_at`` and the claims
        wake = plain((yield Now())) + timedelta(seconds=_flow.LIMIT_POLL)
    else:
        wake = datetime.fromtimestamp(wait.retry_at, UTC)
    return cp, Wait(f"limit:{wait.key}", wake)


def _boundary(plan: Plan, cp: Checkpoint) -> Generator[Effect, Any, None]:
    """Act on a cancel request or a stopping worker at a journaled call, as at a step."""
    if cp.cancel_requested:
        yield from finish_cancelled(plan, cp)  # raises RunCancelled
    yield from write(plan, cp, _lease.released(cp), "hand-over")
    yield Announce()  # another worker may take it now
    logger.info("run %r: handed over at a journaled call (worker stopping)", plan.run_id)
    raise Interrupted(plan.run_id)


def _ended(
    plan: Plan,
    cp: Checkpoint,
    index: int,
    session: Session,
    state: State,
    request: tuple[Any, ...],
) -> Generator[Effect, Any, Complete]:
    """The function ended: complete the step, or park or fail the run (raising)."""
    _, how, value = request
    why = session.fatal
    if why is None and how == "raise" and isinstance(value, WorkflowChanged):
        why = value
    if why is None and how == "return":
        why = _shrunk(session)
    if why is not None:
        yield from _park(plan, cp, index, session.name, why)
    if how == "raise":
        raise value
    return _finished(session, state, cp, value)


def _shrunk(session: Session) -> WorkflowChanged | None:
    """Why a function that returned made fewer calls than its journal holds, if it did."""
    left = [seq for seq in session.recorded if seq >= session.seq]
    if not left:
        return None
    seq = min(left)
    return WorkflowChanged(
        f"run {session.run_id!r} of workflow {session.name!r}: the function returned "
        f"after {session.seq} calls, but the journal recorded "
        f"{session.recorded[seq]['call']!r} as call {seq}; the function's calls changed "
        "under a started run",
        session.run_id,
        seq,
    )


def _finished(session: Session, state: State, cp: Checkpoint, value: Any) -> Complete:
    """The function returned ``value``: check it, complete the step."""
    try:
        result = json_value(value, session.run_id, "the return value", session.seq)
    except InvalidState as exc:
        raise InvalidState(
            f"workflow {session.name!r} returned a value that is not JSON: {exc}", exc.path
        ) from None
    session.stop("returned")
    # The state completed with is the one last saved (its journal included), not the
    # copy the core started from: the final save then adds only the result.
    for key in (JOURNAL_KEY, ATTEMPTS_KEY, _budget.SPEND_KEY):
        if key in cp.state:
            state[key] = cp.state[key]
        else:
            state.pop(key, None)
    return Complete({"result": result})


def _attempt(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, Checkpoint]:
    """Count an attempt of a call with retries before it is made; answer its number."""
    _, _, call, reply = request
    begun = cp.state.get(ATTEMPTS_KEY)
    counts = dict(begun) if isinstance(begun, dict) else {}
    attempt = int(counts.get(call, 0)) + 1
    counts[call] = attempt
    new = dict(cp.state)
    new[ATTEMPTS_KEY] = counts
    cp = yield from write(plan, cp, evolve(cp, state=new), f"attempt {attempt} of {call}")
    session.answer(reply, attempt)
    return cp


def _sleep(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    _, seq, call, seconds, reply = request
    # The labels of ``Sleep`` and ``WaitFor``: ``signal`` wakes a run by its label. The
    # wait the run is saved at is always the first call the journal cannot answer, so
    # the label says which call it is.
    label = "timer"
    now: datetime = yield Now()  # the store's clock, as ``Sleep``'s (``_suspend``)
    if cp.waiting_for == label and cp.wake_at is not None:
        wake = cp.wake_at  # fixed when this sleep began: a restart never moves it
    else:
        wake = plain(now) + timedelta(seconds=seconds)
    if not _due(wake, now):
        session.stop("stopped")
        return cp, Wait(label, wake)
    entry = entry_ok(seq, call, 1, wake.isoformat())
    cleared = {"waiting_for": None, "wake_at": None}
    return (yield from _answered(plan, cp, session, reply, entry, cleared))


def _wait(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    _, seq, call, signal, timeout, default, reply = request
    label = f"signal {signal}"
    cleared = {"waiting_for": None, "wake_at": None}
    pending = pending_signals(cp, signal)
    if pending:
        consumed = dict(cp.consumed)
        consumed[signal] = consumed.get(signal, 0) + 1
        logger.info("run %r: signal %r (id %r) consumed", cp.run_id, signal, pending[0].id)
        _hooks.fire("wait.consumed")  # chosen, not yet saved: a crash here must not lose it
        entry = entry_ok(seq, call, 1, pending[0].payload)
        return (
            yield from _answered(plan, cp, session, reply, entry, {**cleared, "consumed": consumed})
        )
    now: datetime = yield Now()  # the store's clock, as ``WaitFor``'s (``_suspend``)
    if cp.waiting_for == label:
        # Without a timeout, a wake time is the run's deadline: the core acts on it.
        deadline = cp.wake_at if timeout is not None else None
    else:
        deadline = None if timeout is None else plain(now) + timedelta(seconds=timeout)
    if deadline is None or not _due(deadline, now):
        session.stop("stopped")
        return cp, Wait(label, deadline)
    if default is not MISSING:
        entry = entry_ok(seq, call, 1, default)
    else:
        entry = entry_failed(
            seq, call, 1, "WaitTimeout", f"no signal {signal!r} within {timeout:g}s"
        )
    return (yield from _answered(plan, cp, session, reply, entry, cleared))


def _map(
    plan: Plan, cp: Checkpoint, index: int, state: State, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """Make or look at ``ctx.map``'s children, as a ``Map`` step does; journal their end."""
    _, seq, call, workflow, inputs, reply = request
    # After a rerun from a call, the map makes new children (``PARENT/@map:NAME#K~N/I``,
    # N the reruns): the old ones' results belong to the calls the rerun forgot.
    reruns = cp.state.get(RERUNS_KEY)
    name = f"{call}~{reruns}" if type(reruns) is int and reruns > 0 else call
    step = Map(name, workflow, lambda state: inputs)
    # A fresh reach re-queues children that failed before, as a Map's fresh attempt does.
    first = not (cp.waiting_for or "").startswith("children ")
    try:
        outcome = yield from step.evaluate(plan, cp, index, state, first)
    except (ConflictError, StoreUnavailable):
        raise  # the bookkeeping failed, not the call: whoever resumes looks again
    except Exception as caught:  # noqa: BLE001 - a child failed: the call's failure
        error = caught.error if isinstance(caught, StepCodeError) else caught
        entry = entry_failed(seq, call, 1, type(error).__qualname__, safe_text(error))
        cleared: dict[str, Any] = {"waiting_for": None, "wake_at": None}
        return (yield from _answered(plan, _latest(plan, cp), session, reply, entry, cleared))
    cp = _latest(plan, cp)  # renewed while the children were made
    if isinstance(outcome, Wait):
        session.stop("stopped")
        return cp, outcome
    states = outcome.update[name]
    results = [s.get("result") for s in states] if isinstance(workflow, CodeWorkflow) else states
    entry = entry_ok(seq, call, 1, results)
    cleared = {"waiting_for": None, "wake_at": None, "children": ()}
    return (yield from _answered(plan, cp, session, reply, entry, cleared))


def _answered(
    plan: Plan,
    cp: Checkpoint,
    session: Session,
    reply: Reply,
    entry: dict[str, Any],
    changes: dict[str, Any],
) -> Generator[Effect, Any, tuple[Checkpoint, None]]:
    """Journal ``entry`` (with ``changes`` to the record), then answer the call with it.

    The call returns a copy of the recorded result, or raises the recorded failure.
    """
    cp = yield from _append(plan, cp, [entry], changes)
    session.answered(reply)
    if "error" in entry:
        reply.fail(failure(session, entry))
    else:
        reply.ok(copy_containers(answer_of(entry)))
    return cp, None


def _latest(plan: Plan, cp: Checkpoint) -> Checkpoint:
    """Our newest record: a renewal during the children's bookkeeping replaced ``cp``."""
    current = plan.current
    if current is not None and current.owner == cp.owner and current.epoch == cp.epoch:
        return current
    return cp


def _park(
    plan: Plan, cp: Checkpoint, index: int, name: str, why: WorkflowChanged
) -> Generator[Effect, Any, None]:
    """Save the run failed with ``why`` (lease given back), then raise it: never spun.

    As the worker parks a step list whose names changed (``worker._outcomes.park``): a failed
    run leaves the claim index, and running it again with the code it was started with
    resumes it.
    """
    advice = (
        "Parked: no worker claims it again; resume it with the code it was started with "
        "(stepstone.run), or cancel it"
    )
    record = parked(cp, index, name, why, advice)
    yield from write(plan, cp, _lease.released(record), "park")
    if cp.parent is not None:
        yield from nudge(cp.parent)
    logger.error("run %r: %s", plan.run_id, why)
    raise why


# --- the decorator -------------------------------------------------------------------------


class CodeWorkflow(Workflow):
    """A workflow written as a function (``@stepstone.workflow``): one ``CodeStep``.

    Accepted wherever a ``Workflow`` is: ``run``, ``arun``, ``start``, ``Worker``. A
    run's final state is its input, the journal (under ``JOURNAL_KEY``) and the
    function's return value under ``"result"``.
    """

    __slots__ = ("fn", "is_async")

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        version: str | None = None,
        history: bool = False,
        upgrades: Upgrades | None = None,
        limits: Sequence[Limit | str] = (),
    ) -> None:
        if not callable(fn):
            raise InvalidWorkflow(f"workflow {name!r}: expected a function, got {fn!r}")
        super().__init__(
            name,
            [CodeStep(name, fn)],
            version=version,
            history=history,
            upgrades=upgrades,
            limits=limits,
        )
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)

    def __repr__(self) -> str:
        shown = "" if self.version is None else f", version={self.version!r}"
        kind = "async def" if self.is_async else "def"
        return f"CodeWorkflow({self.name!r}, {kind} {getattr(self.fn, '__qualname__', '?')}{shown})"


def workflow(
    name: str,
    *,
    version: str | None = None,
    history: bool = False,
    upgrades: Upgrades | None = None,
    limits: Sequence[Limit | str] = (),
) -> Callable[
    [Callable[[Any, State], Any] | Callable[[Any, State], Coroutine[Any, Any, Any]]],
    CodeWorkflow,
]:
    """Make a function ``fn(ctx, input)`` a durable workflow named ``name``.

    A plain ``def`` gets a ``WorkflowContext`` and runs under ``run`` and ``arun``; an
    ``async def`` gets an ``AsyncWorkflowContext`` and runs under ``arun`` (and
    ``Worker.aserve``). ``input`` is the run's recorded input (a fresh copy each time).
    ``upgrades`` moves runs of older versions onto this one, as a step list's does
    (``{"1": fn}``: ``fn`` gets the run's state, its journal included, and returns the
    new one); the new function must make the calls the journal recorded, in order.
    ``limits``: flow-control keys each run holds while it executes (``Workflow``'s).

    Example::

        @stepstone.workflow("triage", version="1")
        async def triage(ctx, input):
            draft = await ctx.step("draft", call_model, input["ticket"])
            while not draft["done"]:
                draft = await ctx.step("revise", call_model, draft)
            return draft
    """

    def decorate(
        fn: Callable[[Any, State], Any] | Callable[[Any, State], Coroutine[Any, Any, Any]],
    ) -> CodeWorkflow:
        return CodeWorkflow(
            name, fn, version=version, history=history, upgrades=upgrades, limits=limits
        )

    return decorate
