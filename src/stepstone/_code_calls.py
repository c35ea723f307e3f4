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
from collections.abc import Awaitable, Callable, Generator
from functools import partial
from typing import Any, NamedTuple

from . import _clock, _timeouts
from ._codec import copy_containers
from ._effects import Effect, astep_through, step_through
from ._errors import DeadlineExceeded, InvalidWorkflow, safe_text
from ._flow._limit import RateLimited
from ._journal import answer_of, entry_failed, entry_ok, json_value
from ._session import CallFailed, Session, close, inside
from ._steps import AttemptsExhausted, RetryPolicy, retries
from ._stream import _hooks as _stream

__all__ = [
    "Do",
    "Op",
    "JournaledCall",
    "adrive",
    "answer",
    "arun_call",
    "drive",
    "failure",
    "passed",
    "run_call",
]


def passed(session: Session) -> bool:
    """Whether the run's deadline has fallen (never without one)."""
    until = session.deadline_mono
    return until is not None and _clock.monotonic() >= until


def bounded(session: Session, timeout: float | None, idle: float | None) -> bool:
    """Whether a call runs with a limit: its own timeouts, or the run's deadline."""
    return timeout is not None or idle is not None or session.deadline_at is not None


def beat_of(session: Session, what: str) -> _timeouts.Beat:
    """The heartbeat of one attempt, given at most the time to the run's deadline."""
    beat = _timeouts.Beat(what)
    at = session.deadline_at
    if at is not None and session.deadline_mono is not None:
        beat.until = session.deadline_mono
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


class JournaledCall(NamedTuple):
    """A ``ctx.step`` or ``ctx.submit`` call, its arguments checked by the context."""

    seq: int
    call: str
    what: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    policy: RetryPolicy | None
    timeout: float | None
    idle: float | None
    want: list[Any] | None  # flow control: the keys it holds (``_context_args._limits``)


# A call's life is written once, as a generator of ``Do`` effects; ``drive`` performs
# them from a plain workflow's thread, ``adrive`` from an ``async def`` workflow's task,
# each by its table of what a kind of effect calls (``_SYNC``, ``_ASYNC``).


class Do(Effect):
    """Call what ``kind`` names in the driver's table with ``args``; the result is its answer.

    ``ask``: post a request to the core and wait for its answer (``Session.ask``);
    ``attempt``: call the function once; ``backoff``: wait a retry's delay; ``stream``:
    commit an attempt's events (streams, issue 34), the result is its token.
    """

    __slots__ = ("args", "kind")

    def __init__(self, kind: str, *args: Any) -> None:
        self.kind = kind
        self.args = args


Op = Generator[Effect, Any, Any]


def _life(session: Session, c: JournaledCall) -> Op:
    """Run a call (retries included) and journal how it ended, as effects."""
    ask = partial(Do, "ask", session)
    durable = c.policy is not None and c.policy.max_attempts > 1
    attempt = 0
    if c.want:
        yield ask(("acquire", c.seq, c.call, c.want))  # flow control: or the run parks
    if session.budgeted:
        yield ask(("budget",))  # at its hard limit the run pauses here (``_budget``)
    while True:
        if passed(session):  # issue 33: a boundary; the run ends here (or was extended)
            yield ask(("deadline",))
        # With retries, the attempt is counted in the run before it is made, as a
        # step's is: a call that kills its process every time stops after max_attempts.
        attempt = (yield ask(("attempt", c.seq, c.call))) if durable else attempt + 1
        exhausted = _exhausted(c.what, attempt, c.policy)
        if exhausted is not None:
            failed = entry_failed(c.seq, c.call, attempt - 1, "AttemptsExhausted", str(exhausted))
            yield ask(("save", failed))
            raise failure(session, failed) from exhausted
        token = inside.set((session.run_id, c.seq, c.call, attempt))
        scope = _stream.begin_call(c.seq, attempt)  # streams (issue 34)
        try:
            if bounded(session, c.timeout, c.idle):  # issue 33: StepTimeout, or the deadline
                beat = beat_of(session, c.what)
                mark = _timeouts.beating.set(beat)  # ``ctx.heartbeat()`` in the call finds it
                try:
                    result = yield Do("attempt", c, beat)
                finally:
                    _timeouts.beating.reset(mark)
            else:
                result = yield Do("attempt", c, None)
            ending, scope = scope, None
            streamed = (yield Do("stream", ending)) if ending is not None else None
        except Exception as exc:
            if scope is not None:
                _stream.abandon(scope)
            if isinstance(exc, RateLimited):  # flow control: park the run, block its keys
                yield ask(("rate_limited", c.seq, c.call, exc))
            if isinstance(exc, DeadlineExceeded):  # the run's, not the call's: never retried
                yield ask(("deadline",))  # the run ends here, or a person extended it
                attempt -= 0 if durable else 1
                continue
            if retries(c.policy, attempt, exc):
                yield Do("backoff", c.policy.delay(attempt))
                continue
            failed = entry_failed(c.seq, c.call, attempt, type(exc).__qualname__, safe_text(exc))
            yield ask(("save", failed))
            raise failure(session, failed) from exc
        finally:
            inside.reset(token)
        value = json_value(result, session.run_id, c.call, c.seq)
        yield ask(("save", _streamed(entry_ok(c.seq, c.call, attempt, value), streamed)))
        return copy_containers(value)


def _streamed(entry: dict[str, Any], token: str | None) -> dict[str, Any]:
    """Return ``entry`` naming the attempt whose events readers show (streams, issue 34)."""
    if token is not None:
        entry["stream"] = token
    return entry


def drive(op: Op) -> Any:
    """Perform ``op``'s effects from a plain workflow's thread."""
    return step_through(op, _perform)


def _perform(effect: Effect) -> Any:
    assert isinstance(effect, Do)
    return _SYNC[effect.kind](*effect.args)


async def adrive(op: Op) -> Any:
    """``drive`` from an ``async def`` workflow's task: each effect awaited."""
    return await astep_through(op, _aperform)


async def _aperform(effect: Effect) -> Any:
    assert isinstance(effect, Do)
    return await _ASYNC[effect.kind](*effect.args)


def run_call(session: Session, c: JournaledCall) -> Any:
    """Run a plain workflow's call (retries included) and journal how it ended."""
    return drive(_life(session, c))


async def arun_call(session: Session, c: JournaledCall) -> Any:
    """Run an ``async def`` workflow's call (retries included) and journal how it ended."""
    return await adrive(_life(session, c))


def _attempt(c: JournaledCall, beat: _timeouts.Beat | None) -> Any:
    """Call a plain workflow's function once; its thread waits (at most to ``beat``'s limit)."""
    if beat is not None:
        result = _timeouts.call(c.fn, c.args, c.timeout, c.idle, beat)
    else:
        result = c.fn(*c.args)
    if inspect.isawaitable(result):
        close(result)
        raise InvalidWorkflow(
            f"{c.what}: the function returned an awaitable; await it in an "
            "`async def` workflow, or pass a plain function"
        )
    return result


async def _aattempt(c: JournaledCall, beat: _timeouts.Beat | None) -> Any:
    """Await an ``async def`` workflow's function once (cancelled at ``beat``'s limit).

    ``fn`` may be ``async def``; a plain function runs in a worker thread, so that a
    blocking call cannot stall the event loop.
    """
    import asyncio  # noqa: PLC0415 - sync users never import asyncio

    is_async = inspect.iscoroutinefunction(c.fn)
    if beat is not None:
        return await _timeouts.acall(c.fn, c.args, is_async, c.timeout, c.idle, beat)
    if is_async:
        return await c.fn(*c.args)
    result = await asyncio.to_thread(c.fn, *c.args)
    if inspect.isawaitable(result):
        result = await result
    return result


_SYNC: dict[str, Callable[..., Any]] = {
    "ask": Session.ask,
    "attempt": _attempt,
    "backoff": _clock.sleep,
    "stream": _stream.end,
}
_ASYNC: dict[str, Callable[..., Awaitable[Any]]] = {
    "ask": Session.aask,
    "attempt": _aattempt,
    "backoff": _clock.asleep,
    "stream": _stream.aend,
}
