"""Step timeouts: ``Step(timeout=, idle_timeout=)``, ``ctx.step(timeout=)``, ``ctx.heartbeat()``.

A step with a timeout runs where the driver can stop waiting for it:

- an ``async def`` step (under ``arun``/``aserve``) in a task of its own, cancelled at
  the timeout;
- a plain function in a thread of its own (under ``run``, ``serve`` and ``arun``). A
  thread cannot be stopped from outside: the driver stops waiting, stops renewing the
  lease for it, and raises ``StepTimeout`` as the attempt's failure, so the retry policy
  applies with its durable attempt count. The late thread runs on, fenced: its result is
  dropped (the next attempt starts from the saved state, never from the dict the late
  thread may still change), and its ``ctx.heartbeat()`` raises ``StepTimeout``, so a step
  that heartbeats between its writes stops at the first one after its timeout.

The idle timeout is LangGraph's choice: a step that has not called ``ctx.heartbeat()``
for ``idle_timeout`` seconds has hung, however long it may run in all. Time is read
through the clock seam (``_clock``): ``FakeClock`` tests move it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from . import _clock
from ._errors import InvalidWorkflow, StepTimeout

__all__ = [
    "Beat",
    "StepTimeout",
    "acall",
    "applies",
    "atimed_call",
    "call",
    "beating",
    "check_timeout",
    "heartbeat",
    "seconds_of",
    "timed_call",
    "with_beat",
]

#: The longest timeout one may ask for: a week. Longer work is a workflow, not a step.
MAX_TIMEOUT = 7 * 86_400.0
#: Real seconds a cancelled async step is given to end before its timeout is raised.
_CANCEL_GRACE = 5.0


def seconds_of(what: str, name: str, value: object) -> float | None:
    """Return ``value`` (a number or a ``timedelta``) as seconds, None as None, or raise
    ``InvalidWorkflow`` (timeouts here, deadlines in ``_deadline``)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidWorkflow(
            f"{what}: {name} must be seconds (a number or a timedelta) or None, "
            f"got {type(value).__name__}"
        )
    return float(value)


def check_timeout(what: str, name: str, value: object) -> float | None:
    """Return ``value`` as seconds (None stays None), or raise ``InvalidWorkflow``."""
    seconds = seconds_of(what, name, value)
    if seconds is None:
        return None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise InvalidWorkflow(
            f"{what}: {name} must be more than 0 and at most {MAX_TIMEOUT:g} seconds "
            f"(a week), got {value!r}"
        )
    return seconds


class Beat:
    """One attempt's heartbeat: when it last showed life, and whether it timed out."""

    __slots__ = ("expired", "last", "late", "until", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.last = _clock.monotonic()
        self.expired = False
        #: The run's deadline, in monotonic seconds, and the error it raises (``_deadline``).
        self.until: float | None = None
        self.late: Callable[[], Exception] | None = None

    def beat(self) -> None:
        """Record a sign of life, or raise ``StepTimeout`` if the attempt has timed out."""
        if self.expired:
            raise StepTimeout(f"{self.what} timed out; this attempt's work is fenced off")
        self.last = _clock.monotonic()


#: The attempt of a code workflow's call running in this context (``ctx.heartbeat()``).
beating: contextvars.ContextVar[Beat | None] = contextvars.ContextVar("beating", default=None)


def heartbeat() -> None:
    """Beat the heartbeat of the call running here, if it has one (code workflows)."""
    beat = beating.get()
    if beat is not None:
        beat.beat()


def _left(started: float, beat: Beat, timeout: float | None, idle: float | None) -> float:
    """Return seconds until the earlier of the timeout and the idle timeout."""
    now = _clock.monotonic()
    left = math.inf
    if timeout is not None:
        left = started + timeout - now
    if idle is not None:
        left = min(left, beat.last + idle - now)
    if beat.until is not None:
        left = min(left, beat.until - now)
    return left


def _expired(beat: Beat, timeout: float | None, idle: float | None, started: float) -> Exception:
    beat.expired = True
    now = _clock.monotonic()
    if beat.until is not None and beat.late is not None and now >= beat.until:
        return beat.late()  # the run's deadline fell first: not the step's own timeout
    if (
        idle is not None
        and now - beat.last >= idle
        and (timeout is None or now - started < timeout)
    ):
        return StepTimeout(f"{beat.what}: no heartbeat for {idle:g}s (idle_timeout)")
    return StepTimeout(f"{beat.what}: still running after {timeout:g}s (timeout)")


def with_beat(ctx: Any, beat: Beat) -> Any:
    """Return ``ctx`` (a ``StepContext``, or None) carrying ``beat`` for ``heartbeat()``."""
    if ctx is None or not hasattr(ctx, "_beat"):
        return ctx
    return dataclasses.replace(ctx, _beat=beat)


def call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    timeout: float | None,
    idle: float | None,
    beat: Beat,
) -> Any:
    """Call ``fn(*args)`` in a thread of its own; raise ``StepTimeout`` if it runs too long."""
    done = threading.Event()
    box: list[Any] = []

    context = contextvars.copy_context()  # what the call sees of its caller (current_call)

    def target() -> None:
        try:
            box.append((True, context.run(fn, *args)))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting driver
            box.append((False, exc))
        finally:
            done.set()

    started = beat.last = _clock.monotonic()
    thread = threading.Thread(target=target, name=f"stepstone-step {beat.what}", daemon=True)
    thread.start()
    while not done.is_set():
        left = _left(started, beat, timeout, idle)
        if left <= 0:
            raise _expired(beat, timeout, idle, started)
        _clock.wait(done, left)
    ok, value = box[0]
    if ok:
        return value
    raise value


async def acall(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    is_async: bool,
    limit: float | None,
    idle: float | None,
    beat: Beat,
) -> Any:
    """Await ``fn(*args)`` (a plain ``fn`` in a thread); cancel it at its timeout."""
    import asyncio  # noqa: PLC0415 - sync users never import asyncio
    import inspect  # noqa: PLC0415

    # Counted from before the call starts: a thread may run (and the clock move) at once.
    started = beat.last = _clock.monotonic()
    if is_async:
        task: asyncio.Future[Any] = asyncio.ensure_future(fn(*args))
    else:
        # A daemon thread of ours, not ``asyncio.to_thread``: the loop's executor is
        # joined when the loop closes, and a late thread hung in a read would hang that.
        task = _in_thread(asyncio.get_running_loop(), fn, args)
    done = asyncio.Event()
    task.add_done_callback(lambda _: done.set())
    try:
        while not done.is_set():
            left = _left(started, beat, limit, idle)
            if left <= 0:
                break
            await _clock.await_event(done, left)
    except BaseException:
        task.cancel()  # we are cancelled: so is the step
        raise
    if not task.done():
        error = _expired(beat, limit, idle, started)
        task.cancel()
        # An async step ends at its next await; a thread cannot be stopped (fenced, above).
        await asyncio.wait([task], timeout=_CANCEL_GRACE)
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: its outcome is void, the attempt timed out
        raise error
    result = task.result()
    if inspect.isawaitable(result):
        result = await result
    return result


def applies(plan: Any, step: Any) -> bool:
    """Whether the driver runs ``step`` with a limit: its own timeouts, or the run's deadline.

    The deadline bounds the run's own steps only (found by identity among them), never
    the core's internal calls (a ``Map``'s items, a code workflow's requests).
    """
    if getattr(step, "timed", False):
        return True
    return plan.deadline_at is not None and any(s is step for s in plan.steps)


def _step_call(
    step: Any, state: Any, ctx: Any, deadline: float | None, late: Callable[[], Exception]
) -> tuple[Beat, tuple[Any, ...]]:
    what = f"step {step.name!r}" + ("" if ctx is None else f" attempt {ctx.attempt}")
    beat = Beat(what)
    if deadline is not None:
        beat.until = deadline
        beat.late = late
    ctx = with_beat(ctx, beat)
    return beat, ((state,) if ctx is None else (state, ctx))


def timed_call(
    step: Any, state: Any, ctx: Any, deadline: float | None, late: Callable[[], Exception]
) -> Any:
    """Call a ``Step`` with its timeouts and the run's ``deadline`` (the sync ``Call``):
    the monotonic time it falls at (``Plan.deadline_mono``), or None."""
    beat, args = _step_call(step, state, ctx, deadline, late)
    return call(
        step.fn, args, getattr(step, "timeout", None), getattr(step, "idle_timeout", None), beat
    )


async def atimed_call(
    step: Any, state: Any, ctx: Any, deadline: float | None, late: Callable[[], Exception]
) -> Any:
    """Await a ``Step`` with its timeouts and the run's ``deadline`` (the async ``Call``)."""
    beat, args = _step_call(step, state, ctx, deadline, late)
    timeout, idle = getattr(step, "timeout", None), getattr(step, "idle_timeout", None)
    return await acall(step.fn, args, step.is_async, timeout, idle, beat)


def _in_thread(loop: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run ``fn(*args)`` in a daemon thread; return a future of ``loop`` for its outcome."""
    future = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return  # timed out and cancelled: the late outcome is dropped
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            outcome = (True, context.run(fn, *args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits it now
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name="stepstone-step", daemon=True).start()
    return future
