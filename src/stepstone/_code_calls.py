"""Running a code workflow's calls (``ctx.step``, ``ctx.submit``): retries, timeouts, deadline.

One call's life: count the attempt (durably, with retries), call ``fn``, journal how it
ended. Issue 33: a call with ``timeout=`` or ``idle_timeout=``, or in a run with a
deadline, runs where the driver can stop waiting for it (``_timeouts``). The run's
deadline is checked before each attempt and bounds the attempt running; when it falls
the call asks the core (``("deadline",)``, ``_code``), which ends the run, so a code
workflow meets its deadline between and during its calls, not only when it resumes.

A timed-out call's thread runs on, late, with no way to write to the run, so the
retry keeps the lease's epoch (a step list's moves it, ``_write._record_failure``):
in its copied context ``inside`` is set, so ``ctx.reserve``/``ctx.charge`` are refused
(journaled calls are not made from a call's function), ``current_call()`` has no meter
(``InvalidCharge``), and its stream attempt was abandoned (``ctx.emit`` raises
``EmitOutsideStep``). A new epoch would also make the workflow's own open reservations,
named by the epoch, look like a dead attempt's (``_spending.settle_reservations``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import _clock, _timeouts
from ._checkpoint import utcnow
from ._codec import copy_containers
from ._errors import DeadlineExceeded, InvalidWorkflow, safe_text
from ._flow._limit import RateLimited
from ._journal import answer_of, entry_failed, entry_ok, json_value
from ._session import CallFailed, Session, close, inside
from ._steps import AttemptsExhausted, RetryPolicy, retries
from ._stream import _hooks as _stream

__all__ = ["answer", "arun_call", "failure", "passed", "run_call"]


def passed(session: Session) -> bool:
    """Whether the run's deadline has fallen (never without one)."""
    at = session.deadline_at
    return at is not None and utcnow() >= at


def bounded(session: Session, timeout: float | None, idle: float | None) -> bool:
    """Whether a call runs with a limit: its own timeouts, or the run's deadline."""
    return timeout is not None or idle is not None or session.deadline_at is not None


def beat_of(session: Session, what: str) -> _timeouts.Beat:
    """The heartbeat of one attempt, given at most the time to the run's deadline."""
    beat = _timeouts.Beat(what)
    at = session.deadline_at
    if at is not None:
        beat.until = _clock.monotonic() + (at - utcnow()).total_seconds()
        run_id = session.run_id
        beat.late = lambda: DeadlineExceeded(run_id, at)
    return beat


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


def answer(session: Session, entry: dict[str, Any]) -> Any:
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


def run_call(
    session: Session,
    seq: int,
    call: str,
    what: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    policy: RetryPolicy | None,
    timeout: float | None = None,
    idle: float | None = None,
) -> Any:
    """Run a plain workflow's call (retries included) and journal how it ended."""
    durable = policy is not None and policy.max_attempts > 1
    attempt = 0
    if session.budgeted:
        session.ask(("budget",))  # at its hard limit the run pauses here (``_budget``)
    while True:
        if passed(session):  # issue 33: a boundary; the run ends here (or was extended)
            session.ask(("deadline",))
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
            if bounded(session, timeout, idle):  # issue 33: StepTimeout, or the deadline
                beat = beat_of(session, what)
                mark = _timeouts.beating.set(beat)  # ``ctx.heartbeat()`` in the call finds it
                try:
                    result = _timeouts.call(fn, args, timeout, idle, beat)
                finally:
                    _timeouts.beating.reset(mark)
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
            if isinstance(exc, DeadlineExceeded):  # the run's, not the call's: never retried
                session.ask(("deadline",))  # the run ends here, or a person extended it
                attempt -= 0 if durable else 1
                continue
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


async def arun_call(
    session: Session,
    seq: int,
    call: str,
    what: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    policy: RetryPolicy | None,
    limit: float | None = None,
    idle: float | None = None,
) -> Any:
    """Run an ``async def`` workflow's call (retries included) and journal how it ended."""
    import asyncio  # noqa: PLC0415 - sync users never import asyncio

    durable = policy is not None and policy.max_attempts > 1
    attempt = 0
    if session.budgeted:
        await session.aask(("budget",))  # at its hard limit the run pauses here
    while True:
        if passed(session):  # issue 33: a boundary; the run ends here (or was extended)
            await session.aask(("deadline",))
        attempt = await session.aask(("attempt", seq, call)) if durable else attempt + 1
        exhausted = _exhausted(what, attempt, policy)
        if exhausted is not None:
            failed = entry_failed(seq, call, attempt - 1, "AttemptsExhausted", str(exhausted))
            await session.aask(("save", failed))
            raise failure(session, failed) from exhausted
        token = inside.set((session.run_id, seq, call, attempt))
        scope = _stream.begin_call(seq, attempt)  # streams (issue 34)
        try:
            if bounded(session, limit, idle):  # issue 33: cancelled at the timeout
                beat = beat_of(session, what)
                mark = _timeouts.beating.set(beat)
                try:
                    is_async = inspect.iscoroutinefunction(fn)
                    result = await _timeouts.acall(fn, args, is_async, limit, idle, beat)
                finally:
                    _timeouts.beating.reset(mark)
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
            if isinstance(exc, DeadlineExceeded):  # the run's, not the call's: never retried
                await session.aask(("deadline",))
                attempt -= 0 if durable else 1
                continue
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
