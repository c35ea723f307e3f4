"""One clock per store: the time that rates (``_flow``), schedules and timers are judged on.

Processes on several hosts that share a store must never compare their own clocks: a
host an hour ahead would otherwise find a bucket refilled (and burst through a rate),
a schedule's slot due an hour early, or a timer another host began over an hour early.
So rates, schedule slots, the wake times of waiting runs (``Sleep``, ``WaitFor``'s
timeout, a limit's or a pool's poll), the claims that find them due and run deadlines
(``_deadline``) are judged on the store's clock (``Store.server_now``): the server's
where the store has one (PostgreSQL ``clock_timestamp()``, MySQL
``UTC_TIMESTAMP(6)``, Cosmos DB an item's ``_ts``), the host's otherwise (memory, file
and SQLite stores live on one host, whose processes share its clock).

**Cost.** The server is not asked on every acquisition: what the readings say is kept
per store object as bounds on the offset between the server's clock and this process's
monotonic one, and the store's time is the middle of those bounds plus the monotonic
now. It is read again every ``REFRESH`` seconds (one round trip a minute per process,
none per acquisition).

**Error.** A reading taken between monotonic ``before`` and ``after`` that says ``at``
on a clock of resolution ``r`` (``Store.server_clock_resolution``: 0 for the SQL
servers' microseconds, 1 s for Cosmos DB's ``_ts``) puts the offset in
``[at - after, at + r - before]``; each reading narrows the bounds kept (widened by the
monotonic clock's possible drift since). The time returned is a ``StoreTime`` whose
``slack`` is half their width: a millisecond or so on the SQL servers. A coarse clock
is read again just before its next tick is due (each such reading halves the bounds,
at most ``FINE_READS`` of them) until they are ``FINE`` wide. Rates stay exact whatever
the slack: the GCRA (``_flow._bucket``) grants on the earliest the time can be and
charges from the latest, so an uncertain clock costs throughput, never an overrun.

**Tests.** When the installed clock is not a real one (``FakeClock``), it is the store's
clock on every backend: a test moves time with it. A real clock moved ahead
(``ClockAhead``, a host whose clock is fast) is ignored here, as a server ignores it.

Rules ask for the time with the ``Now`` effect; each driver performs it with
``store_now`` or ``astore_now``.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from . import _clock
from ._effects import Effect
from ._store import Store

__all__ = [
    "use_store_clock",
    "FINE",
    "REFRESH",
    "Now",
    "StoreTime",
    "astore_now",
    "earliest",
    "forget",
    "known_now",
    "plain",
    "slack",
    "store_now",
]

#: Seconds a reading of the server's clock is used for before it is read again.
REFRESH = 60.0
#: Width (seconds) of the bounds below which a coarse clock is not read early again.
FINE = 0.02
#: The most readings a coarse clock is read early for (each halves the bounds).
FINE_READS = 10
#: How far a monotonic clock may drift from the server's, per second (generous: 100 ppm).
_DRIFT = 1e-4


class StoreTime(datetime):
    """A time on the store's clock: at most ``slack`` seconds from the server's."""

    #: Seconds the server's clock may be either side of this time (0: exact, or a
    #: time made by arithmetic on one, which the class default covers).
    slack: float = 0.0


def slack(at: datetime) -> float:
    """Seconds ``at`` may be off the store's clock (0 for a plain datetime, a test's)."""
    return at.slack if isinstance(at, StoreTime) else 0.0


def plain(at: datetime) -> datetime:
    """``at`` as a plain ``datetime`` (a ``StoreTime``'s slack dropped).

    What a record or a query is given: a database driver may encode only the exact type
    (PyMySQL does, and sends a subclass as text a MySQL server refuses).
    """
    if type(at) is datetime:
        return at
    return datetime(
        at.year,
        at.month,
        at.day,
        at.hour,
        at.minute,
        at.second,
        at.microsecond,
        at.tzinfo,
        fold=at.fold,
    )


def earliest(at: datetime) -> datetime:
    """The earliest the store's time may be when it reads ``at`` (what is due by then)."""
    return at - timedelta(seconds=slack(at))


@dataclass(slots=True)
class _Bounds:
    """What the readings of one store's clock say: server time - monotonic, in [lo, hi]."""

    lo: float
    hi: float
    #: The monotonic time of the last reading's answer, and when to read again.
    taken: float
    due: float
    reads: int


# store -> its bounds; None: the store has no server, the host's clock is its clock.
_readings: weakref.WeakKeyDictionary[Store, _Bounds | None] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class Now(Effect):
    """Read the store's clock; the result is an aware UTC ``StoreTime`` (``store_now``)."""

    __slots__ = ()


# A stand-in for every store's clock in this process (``use_store_clock``), or None;
# a one-item list so the setter needs no ``global``.
_stand_in: list[Callable[[], datetime] | None] = [None]


def use_store_clock(now: Callable[[], datetime] | None) -> None:
    """Make ``now`` every store's clock in this process (None: the stores' own again).

    The seam for tools that run schedules and rates on a fast clock while leases keep
    the real one (``tools/fleet/caps``: a minute a second); tests move all time together
    with ``FakeClock`` instead.
    """
    _stand_in[0] = now


def _fake() -> datetime | None:
    """The stand-in's or the installed clock's time if it is not a real one, else None."""
    stand_in = _stand_in[0]
    if stand_in is not None:
        return stand_in()
    clock = _clock.current()
    return None if _clock.is_real(clock) else clock.now()


def _at(bounds: _Bounds, mono: float) -> StoreTime:
    at = StoreTime.fromtimestamp((bounds.lo + bounds.hi) / 2 + mono, UTC)
    at.slack = (bounds.hi - bounds.lo) / 2
    return at


def known_now(store: Store) -> datetime | None:
    """The store's time without asking it (a fake clock's, or its bounds'; no I/O), or
    None: then it must be read."""
    fake = _fake()
    if fake is not None:
        return fake
    mono = time.monotonic()
    with _lock:
        if store not in _readings:
            return None
        bounds = _readings[store]
    if bounds is None:
        return _clock.SYSTEM.now()
    if mono >= bounds.due:
        return None
    return _at(bounds, mono)


def _narrowed(old: _Bounds | None, lo: float, hi: float, after: float) -> _Bounds:
    """The bounds ``old`` and a new reading's ``[lo, hi]`` say together."""
    if old is None:
        return _Bounds(lo, hi, after, after + REFRESH, 1)
    drift = _DRIFT * max(0.0, after - old.taken)
    both = max(lo, old.lo - drift), min(hi, old.hi + drift)
    if both[0] > both[1]:
        # The readings disagree: the server's clock was stepped. The new one wins.
        return _Bounds(lo, hi, after, after + REFRESH, 1)
    return _Bounds(*both, after, after + REFRESH, old.reads + 1)


def _next_tick(bounds: _Bounds, resolution: float, rtt: float) -> float:
    """When to send a reading that lands on the coarse clock's next tick (monotonic)."""
    mid = (bounds.lo + bounds.hi) / 2
    tick = (math.floor((bounds.taken + mid) / resolution) + 1) * resolution
    return tick - mid - rtt / 2


def _keep(store: Store, at: datetime | None, before: float, after: float) -> datetime:
    if at is None:
        with _lock:
            _readings[store] = None
        return _clock.SYSTEM.now()
    resolution = store.server_clock_resolution
    stamp = at.timestamp()
    with _lock:
        old = _readings.get(store)
        bounds = _narrowed(old, stamp - after, stamp + resolution - before, after)
        if resolution > 0 and bounds.hi - bounds.lo > FINE and bounds.reads <= FINE_READS:
            bounds.due = _next_tick(bounds, resolution, after - before)
        _readings[store] = bounds
    return _at(bounds, after)


def store_now(store: Store) -> datetime:
    """Return the time on ``store``'s clock (aware, UTC); at most one round trip."""
    known = known_now(store)
    if known is not None:
        return known
    before = time.monotonic()
    return _keep(store, store.server_now(), before, time.monotonic())


async def astore_now(store: Store) -> datetime:
    """Async ``store_now``."""
    known = known_now(store)
    if known is not None:
        return known
    before = time.monotonic()
    return _keep(store, await store.aserver_now(), before, time.monotonic())


def forget(store: Store) -> None:
    """Drop ``store``'s kept readings (the next ``store_now`` asks the server again)."""
    with _lock:
        _readings.pop(store, None)
