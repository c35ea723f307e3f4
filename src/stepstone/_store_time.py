"""One clock per store: the time that rates (``_flow``) and schedules are judged on.

Processes on several hosts that share a store must never compare their own clocks: a
host an hour ahead would otherwise find a bucket refilled (and burst through a rate)
or a schedule's slot due an hour early. So rates and schedule slots are judged on the
store's clock (``Store.server_now``): the server's where the store has one (PostgreSQL
``clock_timestamp()``, MySQL ``UTC_TIMESTAMP(6)``), the host's otherwise (memory, file
and SQLite stores live on one host, whose processes share its clock).

**Cost.** The server is not asked on every acquisition: a reading is kept per store
object with the monotonic time it was taken at, and the store's time is that reading
plus the monotonic seconds since. It is read again every ``REFRESH`` seconds (one
round trip a minute per process, none per acquisition). The error is at most half the
round trip of the reading plus the drift of the monotonic clock over ``REFRESH``
seconds (parts per million): a millisecond or so, where skew between hosts is seconds
to hours.

**Tests.** When the installed clock is not a real one (``FakeClock``), it is the store's
clock on every backend: a test moves time with it. A real clock moved ahead
(``ClockAhead``, a host whose clock is fast) is ignored here, as a server ignores it.

Rules ask for the time with the ``Now`` effect; each driver performs it with
``store_now`` or ``astore_now``.
"""

from __future__ import annotations

import threading
import time
import weakref
from datetime import datetime, timedelta

from . import _clock
from ._effects import Effect
from ._store import Store

__all__ = ["REFRESH", "Now", "astore_now", "forget", "store_now"]

#: Seconds a reading of the server's clock is used for before it is read again.
REFRESH = 60.0

# store -> (its clock's reading, the monotonic seconds it was taken at); None: the
# store has no server, the host's clock is its clock.
_readings: weakref.WeakKeyDictionary[Store, tuple[datetime, float] | None] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


class Now(Effect):
    """Read the store's clock; the result is an aware UTC ``datetime`` (``store_now``)."""

    __slots__ = ()


def _known(store: Store) -> datetime | None:
    """The store's time without a round trip, or None: read the server's clock.

    The installed clock's time if it is not a real one (a test's); else the kept
    reading plus the monotonic seconds since, while it is under ``REFRESH`` seconds old.
    """
    clock = _clock.current()
    if not _clock.is_real(clock):
        return clock.now()
    with _lock:
        if store not in _readings:
            return None
        reading = _readings[store]
    if reading is None:
        return _clock.SYSTEM.now()
    at, taken = reading
    since = time.monotonic() - taken
    if since > REFRESH:
        return None
    return at + timedelta(seconds=since)


def _keep(store: Store, at: datetime | None, before: float, after: float) -> datetime:
    # The reading is taken at the middle of the round trip: its error is half of it.
    with _lock:
        _readings[store] = None if at is None else (at, (before + after) / 2)
    return _clock.SYSTEM.now() if at is None else at + timedelta(seconds=(after - before) / 2)


def store_now(store: Store) -> datetime:
    """Return the time on ``store``'s clock (aware, UTC); at most one round trip."""
    at = _known(store)
    if at is not None:
        return at
    before = time.monotonic()
    read = store.server_now()
    return _keep(store, read, before, time.monotonic())


async def astore_now(store: Store) -> datetime:
    """Async ``store_now``."""
    at = _known(store)
    if at is not None:
        return at
    before = time.monotonic()
    read = await store.aserver_now()
    return _keep(store, read, before, time.monotonic())


def forget(store: Store) -> None:
    """Drop ``store``'s kept reading (the next ``store_now`` asks the server again)."""
    with _lock:
        _readings.pop(store, None)
