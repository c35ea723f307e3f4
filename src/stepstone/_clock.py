"""The one seam through which stepstone reads time and waits.

The runner, the worker (its rests, its watch of other owners' leases, its timers), lease
renewal and retry backoff read the clock through the functions here, never
``datetime.now``, ``time.monotonic`` or ``time.sleep`` directly. Tests (the project's and
users', with ``stepstone.testing.FakeClock``) install a clock of their own with
``use_clock`` and move time forward instead of waiting for it.

The installed clock is process-wide, not per task or thread: a worker's threads and
the runner's renewal thread must see the clock the test installed. A call given a clock
of its own (``run``, ``arun``, ``start``, ``Worker``: ``clock=``) reads that one instead,
through ``using``: a context variable, so the threads and tasks stepstone starts for the
call (a worker's, a lease renewal's) read it too, and other calls keep the installed one.

Timers on the event loop go through the seam as well (``call_later``: an async step's
lease renewal), so a ``FakeClock`` moved by a test fires them.

A leaf module: it imports nothing of stepstone's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Clock",
    "SystemClock",
    "Timer",
    "asleep",
    "await_event",
    "call_later",
    "current",
    "is_real",
    "monotonic",
    "now",
    "sleep",
    "use_clock",
    "using",
    "wait",
]


@runtime_checkable
class Clock(Protocol):
    """What stepstone asks of a clock: two readings, a sleep and an interruptible wait."""

    def now(self) -> datetime:
        """Return the wall-clock time, timezone-aware in UTC (timers, stamps)."""
        ...

    def monotonic(self) -> float:
        """Return seconds on a clock that never goes back (leases, rests, deadlines)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` (a retry's backoff)."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` (a retry's backoff, async)."""
        ...

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        """Wait until ``event`` is set or ``seconds`` pass; return whether it is set."""
        ...

    async def await_event(self, event: asyncio.Event, seconds: float | None) -> bool:
        """Await ``event`` for at most ``seconds``; return whether it is set."""
        ...


class SystemClock:
    """The real clock: the system's time, real sleeps and waits."""

    def now(self) -> datetime:
        """Return ``datetime.now(UTC)``."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Call ``time.sleep``."""
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        """Await ``asyncio.sleep``."""
        import asyncio  # noqa: PLC0415 - sync users and the CLI never pay for importing it

        await asyncio.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        """Call ``event.wait(seconds)``."""
        return event.wait(seconds)

    async def await_event(self, event: asyncio.Event, seconds: float | None) -> bool:
        """Await ``event.wait()`` under ``asyncio.timeout``."""
        import asyncio  # noqa: PLC0415 - as in asleep

        if event.is_set():
            return True
        if seconds is not None and seconds <= 0:
            return False
        # asyncio.timeout, not wait_for: on 3.11 wait_for returns normally when it is
        # cancelled just as the event is set, and the caller's cancel would be lost.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()
        return event.is_set()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM = SystemClock()
_current: Clock = SYSTEM
_installing = threading.Lock()
#: The clock of the call in progress in this context (``using``), over ``_current``.
_override: ContextVar[Clock | None] = ContextVar("stepstone_clock", default=None)


def current() -> Clock:
    """Return the clock stepstone reads here: the call's own, else the installed one.

    The installed one is the system's unless a test installed another (``use_clock``).
    """
    override = _override.get()
    return _current if override is None else override


def is_real(clock: Clock) -> bool:
    """Return whether ``clock`` keeps real monotonic time and waits (a ``SystemClock``).

    A subclass that only moves the wall time (a host whose clock is ahead) is real; one
    that replaces the monotonic reading or the waits is not.
    """
    kind = type(clock)
    return (
        isinstance(clock, SystemClock)
        and kind.monotonic is SystemClock.monotonic
        and kind.wait is SystemClock.wait
        and kind.await_event is SystemClock.await_event
    )


@contextlib.contextmanager
def using(clock: Clock | None) -> Iterator[None]:
    """Read ``clock`` in this context (thread or task) inside the block; None: no change.

    Unlike ``use_clock``, other threads and tasks keep theirs, except the ones started
    inside the block, which copy the context (``asyncio`` tasks, ``asyncio.to_thread``)
    or are given it (a worker's threads).
    """
    if clock is None:
        yield
        return
    token = _override.set(clock)
    try:
        yield
    finally:
        _override.reset(token)


@contextlib.contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Make ``clock`` the one stepstone reads inside the ``with`` block, then restore.

    Raises:
        TypeError: ``clock`` lacks a method of ``Clock``.
    """
    global _current  # noqa: PLW0603 - the seam is process-wide on purpose (see above)
    if not isinstance(clock, Clock):
        raise TypeError(
            f"use_clock needs a Clock (now, monotonic, sleep, asleep, wait, await_event); "
            f"got {type(clock).__name__}"
        )
    with _installing:
        before, _current = _current, clock
    try:
        yield clock
    finally:
        with _installing:
            _current = before


def now() -> datetime:
    """Return the current clock's wall time, timezone-aware in UTC."""
    return current().now()


def monotonic() -> float:
    """Return the current clock's monotonic seconds."""
    return current().monotonic()


def sleep(seconds: float) -> None:
    """Sleep ``seconds`` on the current clock."""
    current().sleep(seconds)


async def asleep(seconds: float) -> None:
    """Sleep ``seconds`` on the current clock, async."""
    await current().asleep(seconds)


def wait(event: threading.Event, seconds: float | None) -> bool:
    """Wait on ``event`` for at most ``seconds`` of the current clock."""
    return current().wait(event, seconds)


async def await_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Await ``event`` for at most ``seconds`` of the current clock."""
    return await current().await_event(event, seconds)


class Timer(Protocol):
    """What ``call_later`` returns: a timer that can be cancelled before it fires."""

    def cancel(self) -> None:
        """Do not call the callback (if it has not been called yet)."""
        ...


#: Timers on a clock that is not real, while they wait (a task is only weakly held).
_timers: set[Any] = set()


def call_later(seconds: float, callback: Callable[[], object]) -> Timer:
    """Call ``callback`` on the running event loop once ``seconds`` of the clock pass.

    On a real clock, the loop's own ``call_later``; on another (a ``FakeClock``), a task
    awaiting the clock's ``await_event``, so the clock's moves fire it.
    """
    import asyncio  # noqa: PLC0415 - as in asleep

    clock = current()
    loop = asyncio.get_running_loop()
    if is_real(clock):
        return loop.call_later(seconds, callback)
    return _ClockTimer(clock, loop, seconds, callback)


class _ClockTimer:
    """A timer on a clock that is not real: a task awaiting a cancel flag until its deadline."""

    __slots__ = ("_cancelled",)

    def __init__(
        self,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        seconds: float,
        callback: Callable[[], object],
    ) -> None:
        import asyncio  # noqa: PLC0415 - as in asleep

        self._cancelled = asyncio.Event()
        # The deadline is read now, not when the task first runs: a move of the clock
        # in between counts towards it.
        deadline = clock.monotonic() + seconds
        task = loop.create_task(self._fire(clock, deadline, callback))
        _timers.add(task)
        task.add_done_callback(_timers.discard)

    async def _fire(self, clock: Clock, deadline: float, callback: Callable[[], object]) -> None:
        while not self._cancelled.is_set():
            left = deadline - clock.monotonic()
            if left <= 0:
                # No await between this check and the call: a cancel is seen here.
                callback()
                return
            await clock.await_event(self._cancelled, left)

    def cancel(self) -> None:
        """Do not call the callback: the waiting task ends at its next turn."""
        self._cancelled.set()
