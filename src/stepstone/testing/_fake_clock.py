"""``FakeClock``: time that moves only when a test moves it."""

from __future__ import annotations

import asyncio
import math
import threading
from contextlib import AbstractContextManager, suppress
from datetime import UTC, datetime, timedelta

from .._clock import current, use_clock
from .._errors import ConfigError

__all__ = ["FakeClock"]

#: Real seconds between looks at a ``threading.Event`` while a wait is parked on fake time:
#: an Event cannot notify our condition, so a set is noticed within this much.
_EVENT_POLL = 0.002
#: The earliest start: queued runs are dated into 1970 to order their claims
#: (``_checkpoint.queued_due``), so a clock in or before 1970 would find none due.
EARLIEST_START = datetime(2000, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock for tests: stepstone's runner, worker, leases, timers and backoff read it.

    Install it with ``with FakeClock() as clock:`` and move time with
    ``clock.advance(timedelta(days=2))``, or give it to the calls that should read it
    (``run``, ``arun``, ``start``, ``Worker``: ``clock=clock``). There, a run's timers
    (``Sleep``, a ``WaitFor`` timeout), retry backoff, lease expiry and renewal and the
    worker's rests all go by this clock:

    - ``sleep`` and ``asleep`` (a retry's backoff) move the clock forward by the time
      asked and return at once, as if the time had passed.
    - An interruptible wait (a worker resting until its next look) parks until its event
      is set or ``advance``, from any thread, moves the clock past its deadline.

    Wall time starts at ``start`` (the real time now if not given); monotonic time starts
    at the real monotonic reading, so plans made before the clock was installed stay
    comparable.

    Args:
        start: The wall-clock time to start at; timezone-aware.

    Raises:
        ConfigError: ``start`` is naive (no timezone) or before 2000-01-01 UTC (queued
            runs are dated into 1970 to order them: a clock there would find none due).
            A ``ValueError``.
    """

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.tzinfo is None:
            raise ConfigError(
                f"FakeClock needs a timezone-aware start, got {start!r}; "
                "pass e.g. datetime(2030, 1, 1, tzinfo=UTC)"
            )
        if start is not None and start < EARLIEST_START:
            raise ConfigError(
                f"FakeClock needs a start on or after 2000-01-01 UTC, got {start.isoformat()}: "
                "stepstone dates queued runs into 1970 to order their claims, so a clock "
                "there would find none due; pass e.g. datetime(2030, 1, 1, tzinfo=UTC)"
            )
        real = current()
        self._wall = (start or real.now()).astimezone(UTC)
        self._mono = real.monotonic()
        self._cond = threading.Condition()
        self._sleepers = 0
        # (deadline, loop, flag) for each task awaiting an asyncio.Event on this clock.
        self._async: list[tuple[float, asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._installed: list[AbstractContextManager[object]] = []

    # --- the test's side ------------------------------------------------------------------

    def advance(self, delta: timedelta | float) -> None:
        """Move time forward by ``delta`` (a timedelta, or seconds), waking due waiters.

        Raises:
            ValueError: ``delta`` is negative: time does not go back.
        """
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        if seconds < 0:
            raise ValueError(f"FakeClock.advance needs a delta >= 0, got {seconds:g}s")
        with self._cond:
            moved = self._mono + seconds
            if seconds > 0 and moved == self._mono:
                # Less than a float step at this reading: move by one step, or a loop
                # sleeping "what is left" (waiting out a lease) would never see time pass.
                moved = math.nextafter(self._mono, math.inf)
            self._mono = moved
            self._wall += timedelta(seconds=seconds)
            due = [entry for entry in self._async if entry[0] <= self._mono]
            self._cond.notify_all()
        for _deadline, loop, flag in due:
            # RuntimeError: that loop has closed; nobody awaits there any more.
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(flag.set)

    @property
    def sleepers(self) -> int:
        """Return how many threads and tasks are parked in a wait on this clock now."""
        with self._cond:
            return self._sleepers

    def wait_for_sleepers(self, count: int = 1, timeout: float = 30.0) -> None:
        """Block until at least ``count`` waits are parked on this clock.

        Real seconds, for tests: advance once the worker is resting, not before.

        Raises:
            TimeoutError: ``timeout`` real seconds passed first.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._sleepers >= count, timeout):
                raise TimeoutError(
                    f"FakeClock: {self._sleepers} waits parked after {timeout:g}s, "
                    f"expected at least {count}"
                )

    def __enter__(self) -> FakeClock:
        installing = use_clock(self)
        installing.__enter__()
        self._installed.append(installing)
        return self

    def __exit__(self, *exc: object) -> None:
        # Restored whatever ended the block, and nothing of it suppressed: ``use_clock``
        # needs no word of the exception.
        self._installed.pop().__exit__(None, None, None)

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now().isoformat()})"

    # --- the Clock protocol ---------------------------------------------------------------

    def now(self) -> datetime:
        """Return this clock's wall time, timezone-aware in UTC."""
        with self._cond:
            return self._wall

    def monotonic(self) -> float:
        """Return this clock's monotonic seconds."""
        with self._cond:
            return self._mono

    def sleep(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` and return at once."""
        if seconds > 0:
            self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``, then yield to the loop once."""
        if seconds > 0:
            self.advance(seconds)
        await asyncio.sleep(0)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        """Park until ``event`` is set or the clock passes ``seconds`` from now."""
        with self._cond:
            deadline = None if seconds is None else self._mono + seconds
            self._sleepers += 1
            self._cond.notify_all()
            try:
                while not event.is_set() and (deadline is None or self._mono < deadline):
                    self._cond.wait(_EVENT_POLL)
            finally:
                self._sleepers -= 1
        return event.is_set()

    async def await_event(self, event: asyncio.Event, seconds: float | None) -> bool:
        """Await ``event``, or the clock passing ``seconds`` from now, whichever is first."""
        if event.is_set():
            return True
        flag = asyncio.Event()
        entry = (float("inf"), asyncio.get_running_loop(), flag)
        with self._cond:
            if seconds is not None:
                entry = (self._mono + seconds, entry[1], flag)
                if entry[0] <= self._mono:
                    return False
            self._async.append(entry)
            self._sleepers += 1
            self._cond.notify_all()
        waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(flag.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            with self._cond:
                self._async.remove(entry)
                self._sleepers -= 1
        return event.is_set()
