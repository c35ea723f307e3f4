"""The context a code workflow's function gets (``ctx``): its journaled calls.

Each call looks in the journal first (``Session.replay``): a journaled call returns
its recorded answer at once. Otherwise it runs (``ctx.step``, ``ctx.submit``) or asks
the core (``ctx.sleep``, ``ctx.wait_for``), and returns once its entry is saved.
"""

from __future__ import annotations

import contextvars
import inspect
import random as randomlib
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Any

from . import _clock, _timeouts
from ._checkpoint import utcnow
from ._codec import copy_containers
from ._context_args import (
    MISSING,
    RESERVED,
    _charge_args,
    _check_retry,
    _check_step_name,
    _limits,
    _map_args,
    _reserve_args,
    _wait_args,
)
from ._errors import InvalidWorkflow, safe_text
from ._flow._limit import Limit, RateLimited
from ._journal import answer_of, entry_failed, entry_ok, json_value
from ._session import POOL_THREADS, CallFailed, Session, close, inside
from ._steps import (
    AttemptsExhausted,
    RetryPolicy,
    Workflow,
    retries,
)
from ._stream import _hooks as _stream
from ._stream._events import EmitOutsideStep
from ._stream._writer import emit as _stream_emit
from ._suspend import _seconds

__all__ = [
    "MISSING",
    "POOL_THREADS",
    "RESERVED",
    "AsyncWorkflowContext",
    "WorkflowContext",
    "failure",
]

State = dict[str, Any]


# --- the contexts ------------------------------------------------------------------------


def failure(session: Session, entry: dict[str, Any]) -> CallFailed:
    error = entry["error"]
    return CallFailed(
        session.run_id,
        entry["call"],
        entry["seq"],
        str(error.get("type", "Exception")),
        str(error.get("message", "")),
        int(entry.get("attempt", 1)),
    )


def _answer(session: Session, entry: dict[str, Any]) -> Any:
    """The value a journaled call returns (a copy: the journal's own stays untouched)."""
    if "error" in entry:
        raise failure(session, entry)
    return copy_containers(answer_of(entry))


def _exhausted(what: str, attempt: int, policy: RetryPolicy | None) -> AttemptsExhausted | None:
    """The error of an attempt past the policy's budget (earlier ones died with processes)."""
    if policy is None or attempt <= policy.max_attempts:
        return None
    return AttemptsExhausted(
        f"{what} already began {attempt - 1} of {policy.max_attempts} allowed attempts "
        "in earlier processes"
    )


def _run_call(
    session: Session,
    seq: int,
    call: str,
    what: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    policy: RetryPolicy | None,
    timeout: float | None = None,
) -> Any:
    """Run a plain workflow's call (retries included) and journal how it ended."""
    durable = policy is not None and policy.max_attempts > 1
    attempt = 0
    if session.budgeted:
        session.ask(("budget",))  # at its hard limit the run pauses here (``_budget``)
    while True:
        # With retries, the attempt is counted in the run before it is made, as a
        # step's is: a call that kills its process every time stops after max_attempts.
        attempt = session.ask(("attempt", seq, call)) if durable else attempt + 1
        exhausted = _exhausted(what, attempt, policy)
        if exhausted is not None:
            failed = entry_failed(seq, call, attempt - 1, "AttemptsExhausted", str(exhausted))
            session.ask(("save", failed))
            raise failure(session, failed) from exhausted
        token = inside.set((session.run_id, seq, call, attempt))
        scope = _stream.begin_call(seq, attempt)  # streams (issue 34)
        try:
            if timeout is not None:  # issue 33: StepTimeout at the timeout (_timeouts)
                result = _timeouts.call(fn, args, timeout, None, _timeouts.Beat(what))
            else:
                result = fn(*args)
            if inspect.isawaitable(result):
                close(result)
                raise InvalidWorkflow(
                    f"{what}: the function returned an awaitable; await it in an "
                    "`async def` workflow, or pass a plain function"
                )
            ending, scope = scope, None
            streamed = _stream.end(ending) if ending is not None else None
        except Exception as exc:
            if scope is not None:
                _stream.abandon(scope)
            if isinstance(exc, RateLimited):  # flow control: park the run, block its keys
                session.ask(("rate_limited", seq, call, exc))
            if retries(policy, attempt, exc):
                _clock.sleep(policy.delay(attempt))
                continue
            failed = entry_failed(seq, call, attempt, type(exc).__qualname__, safe_text(exc))
            session.ask(("save", failed))
            raise failure(session, failed) from exc
        finally:
            inside.reset(token)
        value = json_value(result, session.run_id, call, seq)
        session.ask(("save", _streamed(entry_ok(seq, call, attempt, value), streamed)))
        return copy_containers(value)


def _streamed(entry: dict[str, Any], token: str | None) -> dict[str, Any]:
    """Return ``entry`` naming the attempt whose events readers show (streams, issue 34)."""
    if token is not None:
        entry["stream"] = token
    return entry


def _emit(topic: str, data: Any) -> None:
    if inside.get() is None:
        raise EmitOutsideStep(
            "ctx.emit() outside a ctx.step call: a code workflow emits inside the function "
            "a ctx.step (or ctx.submit) call runs; code between calls re-runs on resume, "
            "and would emit its events again"
        )
    _stream_emit(topic, data)


class WorkflowContext:
    """The context of a plain ``def`` workflow: journaled calls, answered once.

    Every method is a call in the journal's order: on a resumed run the journal
    answers it without running anything, so the function must make the same calls in
    the same order each time (``WorkflowChanged`` otherwise).
    """

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def run_id(self) -> str:
        """The run this execution belongs to."""
        return self._session.run_id

    def emit(self, topic: str, data: Any) -> None:
        """Append an event to the run's stream, from inside a ``ctx.step`` function.

        Raises:
            EmitOutsideStep: called outside the function of a ``ctx.step`` call.
            InvalidState: ``data`` is not JSON (the message names the path).
            EventTooLarge: the event is over ``MAX_EVENT_BYTES``.
        """
        _emit(topic, data)

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        limits: Sequence[Limit | str] = (),
        tokens: float | None = None,
    ) -> Any:
        """Call ``fn(*args)`` once for this run; return its JSON result, journaled.

        ``timeout``: seconds an attempt may take before it fails with ``StepTimeout``
        (``retry`` applies); the call then runs in a thread of its own (``_timeouts``).

        The result (or the final failure, after ``retry``'s attempts) is saved in the run
        before this returns; on resume the journal returns it and ``fn`` is not called.
        Repeated names are numbered in call order (``revise#1``, ``revise#2``).
        ``limits`` (flow control): keys the call holds, ``tokens`` estimated; a full key
        parks the run (saved waiting on ``limit:<key>``) until it can take it.

        Raises:
            CallFailed: ``fn`` failed for good (now or, journaled, on an earlier run).
            InvalidState: ``fn`` returned a value that is not JSON; nothing was journaled.
            WorkflowChanged: the journal recorded another call at this position.
        """
        session = self._session
        what = f"ctx.step({name!r})"
        seq, call = session.begin(_check_step_name(name, what), what)
        policy = _check_retry(retry, what)
        limit = _timeouts.check_timeout(what, "timeout", timeout)
        want = _limits(limits, tokens, what)
        entry = session.replay(seq, call)
        if entry is not None:
            return _answer(session, entry)
        if want:
            session.ask(("acquire", seq, call, want))  # flow control: or the run parks
        return _run_call(session, seq, call, what, fn, args, policy, limit)

    def submit(
        self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None
    ) -> Future[Any]:
        """Start ``fn(*args)`` on the workflow's threads; return a future of its result.

        ``ctx.step``, in parallel: the call's position is fixed now, in call order, and
        its result is journaled when it completes, whatever the order. On resume a
        journaled call's future is done at once, and only the unfinished calls run.
        Up to ``POOL_THREADS`` calls of a run run at once; ``future.result()`` raises
        what ``ctx.step`` would.
        """
        session = self._session
        what = f"ctx.submit({name!r})"
        seq, call = session.begin(_check_step_name(name, what), what)
        policy = _check_retry(retry, what)
        entry = session.replay(seq, call)
        if entry is None:
            # In a copy of this context: the call's events go to this run's stream.
            return session.pool().submit(
                contextvars.copy_context().run,
                _run_call,
                session,
                seq,
                call,
                what,
                fn,
                args,
                policy,
            )
        done: Future[Any] = Future()
        try:
            done.set_result(_answer(session, entry))
        except CallFailed as exc:
            done.set_exception(exc)
        return done

    def charge(
        self, *, usd: float = 0.0, tokens: int = 0, ref: str | None = None, **unknown: Any
    ) -> bool:
        """Record what the workflow spent (journaled, with the ledger, by one write).

        Call it after the ``ctx.step`` that spent, with the provider's response id as
        ``ref``: a replay answers it from the journal, and a run resumed between the
        step and the charge charges once. A ref the ledger holds counts nothing
        (returns False). Raises ``InvalidCharge`` on a bad amount; nothing recorded.
        """
        session = self._session
        charge = _charge_args(usd, tokens, ref, unknown)
        seq, call = session.begin(f"{RESERVED}charge", "ctx.charge()")
        entry = session.replay(seq, call)
        if entry is None:
            return bool(session.ask(("charge", seq, call, charge)))
        return bool(_answer(session, entry))

    def reserve(self, *, usd: float = 0.0, tokens: int = 0, **unknown: Any) -> str:
        """Reserve an estimate before an expensive ``ctx.step``; return its id (journaled).

        Saved at once with its journal entry (one write, refused if the lease moved on),
        settled by the next ``ctx.charge``; if the process dies before that charge, the
        reservation stays counted, as spent, unconfirmed. Past the run's limit (or its
        tree's pool's) the run pauses here until the budget is raised.
        """
        session = self._session
        estimate = _reserve_args(usd, tokens, unknown)
        seq, call = session.begin(f"{RESERVED}reserve", "ctx.reserve()")
        entry = session.replay(seq, call)
        if entry is None:
            return str(session.ask(("reserve", seq, call, estimate)))
        return str(_answer(session, entry))

    def now(self) -> datetime:
        """Return the current time (UTC), journaled: a replay returns the same time."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}now", "ctx.now()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, utcnow().isoformat())
            session.ask(("save", entry))
        return datetime.fromisoformat(answer_of(entry))

    def uuid(self) -> str:
        """Return a random UUID (as text), journaled: a replay returns the same one."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}uuid", "ctx.uuid()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, str(uuidlib.uuid4()))
            session.ask(("save", entry))
        return str(answer_of(entry))

    def random(self) -> float:
        """Return a random float in [0, 1), journaled: a replay returns the same one."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}random", "ctx.random()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, _draw())
            session.ask(("save", entry))
        return float(answer_of(entry))

    def sleep(self, duration: float | timedelta) -> datetime:
        """Sleep durably: the run is saved waiting (no process held) until ``duration`` passed.

        Returns the time it was due (UTC). The due time is fixed when the sleep first
        begins, so restarts never move it.
        """
        session = self._session
        seconds = _seconds(duration, "ctx.sleep() duration")
        seq, call = session.begin(f"{RESERVED}sleep", "ctx.sleep()")
        entry = session.replay(seq, call)
        if entry is None:
            return datetime.fromisoformat(session.ask(("sleep", seq, call, seconds)))
        return datetime.fromisoformat(_answer(session, entry))

    def wait_for(
        self, signal: str, *, timeout: float | timedelta | None = None, default: Any = MISSING
    ) -> Any:
        """Wait durably for the signal ``signal``; return its payload.

        The run is saved waiting (no process held) until ``stepstone.signal`` sends it.
        With ``timeout``, ``default`` is returned when it passes; without a default the
        call fails (``CallFailed``, type ``WaitTimeout``).
        """
        session = self._session
        args = _wait_args(signal, timeout, default)
        seq, call = session.begin(f"{RESERVED}wait:{signal}", f"ctx.wait_for({signal!r})")
        entry = session.replay(seq, call)
        if entry is None:
            return session.ask(("wait", seq, call, *args))
        return _answer(session, entry)

    def map(self, name: str, workflow: Workflow, inputs: list[State]) -> list[Any]:
        """Run one child run of ``workflow`` per input; return their results, in order.

        The children are ordinary queued runs (``PARENT/@map:NAME#K/INDEX``), run by
        workers (serve ``workflow`` too); this run waits for them as a ``Map`` step does
        (saved waiting, no process held). A child that is a code workflow gives its
        ``"result"``, any other its final state.

        Raises:
            CallFailed: a child failed or was cancelled (type ``ChildFailed``).
        """
        session = self._session
        what = f"ctx.map({name!r})"
        args = _map_args(name, workflow, inputs, what)
        seq, call = session.begin(f"{RESERVED}map:{name}", what)
        entry = session.replay(seq, call)
        if entry is None:
            return list(session.ask(("map", seq, call, *args)))
        return list(_answer(session, entry))


class AsyncWorkflowContext:
    """The context of an ``async def`` workflow: ``WorkflowContext``'s calls, awaited.

    A call's position in the journal is fixed when it is made, not when it is awaited,
    so ``asyncio.gather(ctx.step(...), ctx.step(...))`` numbers its calls in the order
    written; each is journaled as it completes.
    """

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def run_id(self) -> str:
        """The run this execution belongs to."""
        return self._session.run_id

    def emit(self, topic: str, data: Any) -> None:
        """Append an event to the run's stream (see ``WorkflowContext.emit``); not awaited."""
        _emit(topic, data)

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        limits: Sequence[Limit | str] = (),
        tokens: float | None = None,
    ) -> Awaitable[Any]:
        """Await ``fn(*args)`` once for this run (see ``WorkflowContext.step``).

        ``timeout``: an ``async def`` ``fn`` is cancelled after that many seconds, and
        the attempt fails with ``StepTimeout`` (``retry`` applies).

        ``fn`` may be ``async def``; a plain function runs in a worker thread, so that a
        blocking call cannot stall the event loop.
        """
        session = self._session
        what = f"ctx.step({name!r})"
        seq, call = session.begin(_check_step_name(name, what), what)
        policy = _check_retry(retry, what)
        limit = _timeouts.check_timeout(what, "timeout", timeout)
        want = _limits(limits, tokens, what)
        entry = session.replay(seq, call)
        return self._step(seq, call, what, entry, fn, args, policy, limit, want)

    async def _step(
        self,
        seq: int,
        call: str,
        what: str,
        entry: dict[str, Any] | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        policy: RetryPolicy | None,
        limit: float | None = None,
        want: list[Any] | None = None,
    ) -> Any:
        import asyncio  # noqa: PLC0415 - see _AReply

        session = self._session
        if entry is not None:
            return _answer(session, entry)
        if want:
            await session.aask(("acquire", seq, call, want))  # flow control: or the run parks
        durable = policy is not None and policy.max_attempts > 1
        attempt = 0
        if session.budgeted:
            await session.aask(("budget",))  # at its hard limit the run pauses here
        while True:
            attempt = await session.aask(("attempt", seq, call)) if durable else attempt + 1
            exhausted = _exhausted(what, attempt, policy)
            if exhausted is not None:
                failed = entry_failed(seq, call, attempt - 1, "AttemptsExhausted", str(exhausted))
                await session.aask(("save", failed))
                raise failure(session, failed) from exhausted
            token = inside.set((session.run_id, seq, call, attempt))
            scope = _stream.begin_call(seq, attempt)  # streams (issue 34)
            try:
                if limit is not None:  # issue 33: cancelled at the timeout (_timeouts)
                    beat = _timeouts.Beat(what)
                    is_async = inspect.iscoroutinefunction(fn)
                    result = await _timeouts.acall(fn, args, is_async, limit, None, beat)
                elif inspect.iscoroutinefunction(fn):
                    result = await fn(*args)
                else:
                    result = await asyncio.to_thread(fn, *args)
                    if inspect.isawaitable(result):
                        result = await result
                ending, scope = scope, None
                streamed = await _stream.aend(ending) if ending is not None else None
            except Exception as exc:
                if scope is not None:
                    _stream.abandon(scope)
                if isinstance(exc, RateLimited):  # flow control: park the run, block its keys
                    await session.aask(("rate_limited", seq, call, exc))
                if retries(policy, attempt, exc):
                    await _clock.asleep(policy.delay(attempt))
                    continue
                failed = entry_failed(seq, call, attempt, type(exc).__qualname__, safe_text(exc))
                await session.aask(("save", failed))
                raise failure(session, failed) from exc
            finally:
                inside.reset(token)
            value = json_value(result, session.run_id, call, seq)
            await session.aask(("save", _streamed(entry_ok(seq, call, attempt, value), streamed)))
            return copy_containers(value)

    async def charge(
        self, *, usd: float = 0.0, tokens: int = 0, ref: str | None = None, **unknown: Any
    ) -> bool:
        """Record what the workflow spent (see ``WorkflowContext.charge``)."""
        session = self._session
        charge = _charge_args(usd, tokens, ref, unknown)
        seq, call = session.begin(f"{RESERVED}charge", "ctx.charge()")
        entry = session.replay(seq, call)
        if entry is None:
            return bool(await session.aask(("charge", seq, call, charge)))
        return bool(_answer(session, entry))

    async def reserve(self, *, usd: float = 0.0, tokens: int = 0, **unknown: Any) -> str:
        """Reserve an estimate (see ``WorkflowContext.reserve``)."""
        session = self._session
        estimate = _reserve_args(usd, tokens, unknown)
        seq, call = session.begin(f"{RESERVED}reserve", "ctx.reserve()")
        entry = session.replay(seq, call)
        if entry is None:
            return str(await session.aask(("reserve", seq, call, estimate)))
        return str(_answer(session, entry))

    async def now(self) -> datetime:
        """Return the current time (UTC), journaled (see ``WorkflowContext.now``)."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}now", "ctx.now()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, utcnow().isoformat())
            await session.aask(("save", entry))
        return datetime.fromisoformat(answer_of(entry))

    async def uuid(self) -> str:
        """Return a random UUID (as text), journaled (see ``WorkflowContext.uuid``)."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}uuid", "ctx.uuid()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, str(uuidlib.uuid4()))
            await session.aask(("save", entry))
        return str(answer_of(entry))

    async def random(self) -> float:
        """Return a random float in [0, 1), journaled (see ``WorkflowContext.random``)."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}random", "ctx.random()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, _draw())
            await session.aask(("save", entry))
        return float(answer_of(entry))

    async def sleep(self, duration: float | timedelta) -> datetime:
        """Sleep durably (see ``WorkflowContext.sleep``)."""
        session = self._session
        seconds = _seconds(duration, "ctx.sleep() duration")
        seq, call = session.begin(f"{RESERVED}sleep", "ctx.sleep()")
        entry = session.replay(seq, call)
        if entry is None:
            return datetime.fromisoformat(await session.aask(("sleep", seq, call, seconds)))
        return datetime.fromisoformat(_answer(session, entry))

    async def wait_for(
        self,
        signal: str,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, not this await's
        default: Any = MISSING,
    ) -> Any:
        """Wait durably for the signal ``signal`` (see ``WorkflowContext.wait_for``)."""
        session = self._session
        args = _wait_args(signal, timeout, default)
        seq, call = session.begin(f"{RESERVED}wait:{signal}", f"ctx.wait_for({signal!r})")
        entry = session.replay(seq, call)
        if entry is None:
            return await session.aask(("wait", seq, call, *args))
        return _answer(session, entry)

    async def map(self, name: str, workflow: Workflow, inputs: list[State]) -> list[Any]:
        """Run child runs and await their results (see ``WorkflowContext.map``)."""
        session = self._session
        what = f"ctx.map({name!r})"
        args = _map_args(name, workflow, inputs, what)
        seq, call = session.begin(f"{RESERVED}map:{name}", what)
        entry = session.replay(seq, call)
        if entry is None:
            return list(await session.aask(("map", seq, call, *args)))
        return list(_answer(session, entry))


#: Draws of ``ctx.random()``: seeded from the OS, not the ``random`` module's shared
#: generator, so a user's ``random.seed`` neither repeats nor reveals a run's draws.
_random = randomlib.SystemRandom()


def _draw() -> float:
    return _random.random()
