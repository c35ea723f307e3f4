"""The one seam through which stepstone reads time and waits.

The runner, the worker (its rests, its watch of other owners' leases, its timers), lease
renewal and retry backoff read the clock through the functions here, never
``datetime.now``, ``time.monotonic`` or ``time.sleep`` directly. Tests (the project's and
users', with ``stepstone.testing.FakeClock``) install a clock of their own with
``use_clock`` and move time forward instead of waiting for it.

The current clock is process-wide, not per task or thread: a worker's threads and the
runner's renewal thread must see the clock the test installed.

A leaf module: it imports nothing of stepstone's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Clock",
    "SystemClock",
    "asleep",
    "await_event",
    "current",
    "monotonic",
    "now",
    "sleep",
    "use_clock",
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


def current() -> Clock:
    """Return the clock stepstone reads now (the system's unless a test installed one)."""
    return _current


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
    return _current.now()


def monotonic() -> float:
    """Return the current clock's monotonic seconds."""
    return _current.monotonic()


def sleep(seconds: float) -> None:
    """Sleep ``seconds`` on the current clock."""
    _current.sleep(seconds)


async def asleep(seconds: float) -> None:
    """Sleep ``seconds`` on the current clock, async."""
    await _current.asleep(seconds)


def wait(event: threading.Event, seconds: float | None) -> bool:
    """Wait on ``event`` for at most ``seconds`` of the current clock."""
    return _current.wait(event, seconds)


async def await_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Await ``event`` for at most ``seconds`` of the current clock."""
    return await _current.await_event(event, seconds)
