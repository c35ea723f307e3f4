"""A coarse store clock (Cosmos DB's ``_ts``, whole seconds) and rates that hold anyway.

``_store_time`` keeps bounds on the server's clock and reads a coarse one again near
its ticks until they are fine; the time it returns says how far off it may be
(``slack``). The GCRA grants on the earliest the time can be and charges from the
latest, so workers whose readings are off by up to their slack never overrun a rate.
Logic here, on a stub clock; the processes on the emulator are in test_store_clock.py.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import ClassVar

import pytest

from stepstone import Limit
from stepstone._flow import _bucket
from stepstone._store_time import (
    FINE,
    FINE_READS,
    REFRESH,
    earliest,
    forget,
    slack,
    store_now,
)
from stepstone.stores.memory import MemoryStore

#: The server's clock minus this process's monotonic one (an arbitrary, unround value).
OFFSET = 1_790_000_000.123_456
RTT = 0.004


class _Mono:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _CoarseStore(MemoryStore):
    """A store whose server clock ticks in whole seconds, read in ``RTT`` seconds."""

    server_clock_resolution: ClassVar[float] = 1.0

    def __init__(self, mono: _Mono) -> None:
        super().__init__()
        self.mono = mono
        self.reads = 0

    def server_now(self) -> datetime:
        self.reads += 1
        self.mono.now += RTT / 2
        stamp = math.floor(self.mono.now + OFFSET)
        self.mono.now += RTT / 2
        return datetime.fromtimestamp(stamp, UTC)


@pytest.fixture
def mono(monkeypatch: pytest.MonkeyPatch) -> _Mono:
    clock = _Mono()
    monkeypatch.setattr("stepstone._store_time.time", SimpleNamespace(monotonic=clock.monotonic))
    return clock


def test_a_coarse_clock_is_read_near_its_ticks_until_fine(mono: _Mono) -> None:
    """Readings every 5 ms for a minute: each within its slack, fine in a few reads."""
    store = _CoarseStore(mono)
    forget(store)
    fine_at: float | None = None
    began = mono.now
    while mono.now - began < REFRESH - 1:
        mono.now += 0.005
        at = store_now(store)
        truth = mono.now + OFFSET
        assert abs(at.timestamp() - truth) <= slack(at) + 1e-6, (at, truth, slack(at))
        assert earliest(at).timestamp() <= truth + 1e-6
        if fine_at is None and 2 * slack(at) <= FINE:
            fine_at, reads = mono.now - began, store.reads
    assert fine_at is not None, f"bounds never narrowed to {FINE}s: slack {slack(at)}"
    assert reads <= FINE_READS + 1, reads
    assert fine_at < 15, f"{fine_at:.1f}s to narrow the bounds"
    assert store.reads == reads, "read again after the bounds were fine, before REFRESH"
    mono.now += REFRESH
    store_now(store)
    assert store.reads == reads + 1, "not read again after REFRESH"


def test_a_host_clock_store_has_no_slack(mono: _Mono) -> None:
    """Memory, file and SQLite: the host's clock, exact by definition."""
    store = MemoryStore()
    assert slack(store_now(store)) == 0.0


def _grants(slack_used: float, errors: tuple[float, ...]) -> list[float]:
    """True times at which workers whose clocks are off by ``errors`` were granted."""
    limit = Limit("api", requests=4, per=1.0)
    state = _bucket.fresh(limit)
    granted: list[float] = []
    for tick in range(2000):
        truth = tick * 0.01
        error = errors[tick % len(errors)]
        new, decision = _bucket.decide(
            state, limit, "r", 1, 0.0, truth + error, set(), slack=slack_used
        )
        if new is not None:
            state = new
        if decision.granted:
            granted.append(truth)
    return granted


def _worst(granted: list[float]) -> float:
    """The most grants in a window beyond the GCRA bound (4 at once, then 4 a second)."""
    worst = -math.inf
    for i, first in enumerate(granted):
        for j in range(i, len(granted)):
            worst = max(worst, (j - i + 1) - (4 + 4 * (granted[j] - first)))
    return worst


def test_the_rate_holds_for_workers_off_by_up_to_their_slack() -> None:
    """Workers 0.3 s behind and ahead, taking turns: never over; judged as exact, over."""
    errors = (-0.3,) * 4 + (0.3,) * 4
    granted = _grants(0.3, errors)
    assert _worst(granted) <= 1e-9, _worst(granted)
    assert len(granted) >= 40, f"only {len(granted)} grants in 20 s at 4/s: starved"
    # The same readings taken as exact: the one ahead finds credit where the one behind
    # charged from its earlier now, 2.4 grants over the bound.
    assert _worst(_grants(0.0, errors)) > 0.5


@pytest.mark.parametrize("width", [0.5, 1.0])
def test_a_clock_read_coarsely_still_grants_within_the_rate(width: float) -> None:
    """Slack as wide as the coarse clock's tick (bounds not yet narrowed): never over, live.

    Before, a unit was refused while ``2 * slack`` plus its interval exceeded the window:
    with a 1 s wide clock a rate of 4 a second granted nothing at all.
    """
    slack_used = width / 2 + 0.05
    errors = (-slack_used,) * 3 + (slack_used,) * 3 + (0.0,) * 2
    granted = _grants(slack_used, errors)
    assert _worst(granted) <= 1e-9, _worst(granted)
    # 20 s at 4/s is 80; a slack of s costs up to 2s of the TAT after each idle spell.
    assert len(granted) >= 20, f"only {len(granted)} grants in 20 s at 4/s: starved"
