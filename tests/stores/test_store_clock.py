"""One clock per store (``_store_time``): rates and schedules never compare two hosts' clocks.

Logic first (the store's clock on each backend, its cache, a test's fake clock winning),
then the proof: worker processes whose own clocks are hours apart share a SQLite or
PostgreSQL store; the rate per window is never exceeded and every run finishes, and a
schedule's slots fire once each, none before its time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from child_process import reap, spawn
from fresh_stores import fresh_config
from stepstone import Sleep, Step, Workflow, open_store, schedule, start
from stepstone._cron import parse_slot
from stepstone._effects import Effect
from stepstone._store import Store
from stepstone._store_time import Now, astore_now, forget, slack, store_now
from stepstone.testing import FakeClock, use_clock
from stepstone.testing._runtime_kit import ClockAhead
from waiting import until

HOURS = 3.0
#: How far a store's clock may be from this host's real one: the server runs here.
NEAR = timedelta(seconds=5)


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite", "postgresql", "mysql", "cosmos"])
def test_the_store_clock_ignores_a_host_clock_that_is_ahead(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Under a clock 3 h ahead, the store's time is the server's or the host's real one."""
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        server = store.server_now()
        assert (server is None) == (kind in ("memory", "file", "sqlite"))
        with use_clock(ClockAhead(timedelta(hours=HOURS))):
            real = datetime.now(UTC)
            at = store_now(store)
            assert abs(at - real) < NEAR, (at, real)
            assert at.tzinfo is not None
            assert abs(asyncio.run(astore_now(store)) - real) < NEAR


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_fake_clock_is_the_store_clock(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A test's FakeClock moves the store's time on every backend (rates refill with it)."""
    with open_store(fresh_config(kind, request, tmp_path)) as store, FakeClock() as clock:
        before = store_now(store)
        clock.advance(timedelta(hours=2))
        assert store_now(store) - before == timedelta(hours=2)


def _sent(store: Store) -> int:
    sent: int = getattr(store, "requests_sent")  # noqa: B009 - server stores only
    return sent


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_the_server_is_asked_once_per_refresh(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Many readings cost one round trip; after ``forget`` the next one asks again."""
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        store.load("warm-up")  # the connection, opened outside the count
        forget(store)
        sent = _sent(store)
        readings = [store_now(store) for _ in range(50)]
        assert _sent(store) - sent == 1
        assert readings == sorted(readings)  # monotonic between readings of the server
        forget(store)
        store_now(store)
        assert _sent(store) - sent == 2


def test_the_now_effect_is_performed_by_the_control_driver(tmp_path: Path) -> None:
    """A rule yielding ``Now`` gets the store's time (sync and async drivers)."""
    from stepstone._control import _async, _sync

    def rule() -> Generator[Effect, Any, datetime]:
        at: datetime = yield Now()
        return at

    with open_store(f"sqlite:///{tmp_path}/runs.db") as store, FakeClock() as clock:
        assert _sync(rule(), store) == clock.now()
        assert asyncio.run(_async(rule(), store)) == clock.now()


# --- processes with skewed clocks ----------------------------------------------------------

_RATED = r"""
import sys, threading, time
from datetime import timedelta
from stepstone import Limit, Step, Worker, Workflow, open_store
from stepstone.testing import use_clock
from stepstone.testing._runtime_kit import ClockAhead

config, log, total, hours = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

def work(state):
    with open(log, "a") as f:
        f.write(f"{time.time()}\n")  # one host: the real clock, not the skewed one
    return {"done": True}

flow = Workflow("rated", [Step("work", work, limits=[Limit("rated", requests=4, per=1.0)])])
with use_clock(ClockAhead(timedelta(hours=hours))):
    store = open_store(config)
    worker = Worker(store, [flow], concurrency=2, poll=0.05)
    thread = threading.Thread(target=worker.serve)
    thread.start()
    deadline = time.monotonic() + 60
    while store.count_by_status("r").get("done", 0) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    thread.join()
"""

RUNS = 16


@pytest.mark.process
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "cosmos"])
def test_skewed_workers_never_exceed_a_rate(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two workers 6 h apart, 16 runs at 4 requests/s: within the GCRA bound, all done.

    On Cosmos DB the store's clock ticks in whole seconds (an item's ``_ts``): the
    bound holds all the same, the workers' readings only as fine as they have become.
    Judged on each process's own clock, the one ahead finds the bucket full again (a
    second burst) and the one behind finds it empty for hours (its runs never finish).
    """
    config = fresh_config(kind, request, tmp_path)
    flow = Workflow("rated", [Step("work", lambda s: None)])
    with open_store(config) as store:
        for i in range(RUNS):
            start(store, flow, f"r{i}")
    log = tmp_path / "starts"
    # The one behind first, until it has had its burst: on its own clock the one ahead
    # would then find the bucket full again and burst at once.
    procs = [spawn(_RATED, config, str(log), str(RUNS), str(-HOURS))]
    until(
        "the worker behind to start its first runs",
        lambda: log.exists() and len(log.read_text().splitlines()) >= 4,
    )
    procs.append(spawn(_RATED, config, str(log), str(RUNS), str(HOURS)))
    for proc in procs:
        code, err = reap(proc, "a skewed worker process")
        assert code == 0, err[-2000:]
    starts = sorted(float(line) for line in log.read_text().splitlines())
    with open_store(config) as store:
        done = store.count_by_status("r").get("done", 0)
    assert done == RUNS, f"{done} of {RUNS} runs done: a worker waited on a skewed clock"
    assert len(starts) == RUNS
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            # The bucket: 4, refilled 4/s; plus 1.5 for a step logging up to 0.3 s after
            # its grant on a busy machine (two bursts at once would be 8).
            allowed = 4 + 4 * (starts[j] - first) + 1.5
            assert j - i + 1 <= allowed, (i, j, starts[j] - first)


_FIRING = r"""
import sys, time
from datetime import timedelta
from stepstone import Step, Workflow, open_store
from stepstone._control import _sync
from stepstone._schedule_fire import fire_due
from stepstone.testing import use_clock
from stepstone.testing._runtime_kit import ClockAhead

config, hours = sys.argv[1], float(sys.argv[2])
flow = Workflow("tick", [Step("s", lambda s: {})])
with open_store(config) as store, use_clock(ClockAhead(timedelta(hours=hours))):
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        _sync(fire_due({flow.key: flow}), store)
"""


@pytest.mark.process
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "cosmos"])
def test_skewed_workers_fire_each_slot_once_none_early(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Workers 1 day ahead and behind fire the slots due by the store's clock, each once.

    The schedule is made 3 minutes in the past (its first slots are due). On its own
    clock the worker ahead would fire a day's slots early, the one behind none.
    """
    config = fresh_config(kind, request, tmp_path)
    flow = Workflow("tick", [Step("s", lambda s: {})])
    made = datetime.now(UTC) - timedelta(minutes=3)
    with open_store(config) as store:
        with FakeClock(made):
            schedule(store, "tick", cron="* * * * *", workflow=flow, catchup="all", overlap="allow")
        began = datetime.now(UTC)
        procs = [spawn(_FIRING, config, str(h)) for h in (24.0, -24.0)]
        for proc in procs:
            code, err = reap(proc, "a skewed firing process")
            assert code == 0, err[-2000:]
        ended = datetime.now(UTC)
        runs = sorted(r for r in store.list_runs() if r.startswith("sched/tick/"))
    slots = [parse_slot(r.rsplit("/", 1)[1]) for r in runs]
    early = [s for s in slots if s > ended]
    assert not early, f"slots fired before their time: {early}"
    due = [made.replace(second=0, microsecond=0) + timedelta(minutes=m) for m in range(1, 4)]
    missed = [s for s in due if s <= began and s not in slots]
    assert not missed, f"due slots not fired: {missed}"
    assert len(slots) == len(set(slots)) <= 4


_SLEEPER = r"""
import sys, threading, time
from datetime import timedelta
from stepstone import Sleep, Step, Worker, Workflow, open_store
from stepstone.testing import use_clock
from stepstone.testing._runtime_kit import ClockAhead

config, hours = sys.argv[1], float(sys.argv[2])

def stamp(name):
    return lambda state: {name: time.time()}  # one host: the real clock, not the skewed one

flow = Workflow(
    "nap", [Step("begin", stamp("begin")), Sleep("nap", duration=2), Step("end", stamp("end"))]
)
with use_clock(ClockAhead(timedelta(hours=hours))):
    store = open_store(config)
    worker = Worker(store, [flow], poll=0.05)
    thread = threading.Thread(target=worker.serve)
    thread.start()
    deadline = time.monotonic() + 60
    while store.count_by_status("nap").get("done", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    thread.join()
    store.close()
"""


@pytest.mark.process
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_skewed_workers_end_a_sleep_neither_early_nor_late(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Workers 3 h behind and 3 h ahead share a run that sleeps 2 s: it wakes 2 s after it
    began, by the store's clock. On their own clocks, the one ahead would wake it at once
    (or one begun behind would be due 3 h early) and the one behind would leave it 3 h."""
    config = fresh_config(kind, request, tmp_path)
    steps = [Step("begin", lambda s: {}), Sleep("nap", duration=2), Step("end", lambda s: {})]
    flow = Workflow("nap", steps)  # the workers' own, their steps stamping the real time
    with open_store(config) as store:
        start(store, flow, "nap")
    procs = [spawn(_SLEEPER, config, str(h)) for h in (-HOURS, HOURS)]
    for proc in procs:
        code, err = reap(proc, "a skewed sleeping worker")
        assert code == 0, err[-2000:]
    with open_store(config) as store:
        done = store.load("nap")
    assert done is not None and done.status == "done", done
    slept = done.state["end"] - done.state["begin"]
    # The store's clock is this host's real one (SQLite) or a server on it (PostgreSQL):
    # two seconds less a millisecond's slack at most, and nowhere near three hours.
    assert 1.99 <= slept < 30, slept


def test_the_async_worker_driver_performs_now(tmp_path: Path) -> None:
    """The worker's I/O (``aperform``, async serving) reads the store's clock for schedules."""
    from stepstone._effects import astep_through
    from stepstone._schedule_fire import fire_due
    from stepstone.worker._io import aperform

    flow = Workflow("tick", [Step("s", lambda s: {})])
    start_at = datetime(2030, 1, 1, tzinfo=UTC)
    with open_store(f"sqlite:///{tmp_path}/runs.db") as store, FakeClock(start_at) as clock:
        schedule(store, "tick", cron="* * * * *", workflow=flow)
        clock.advance(timedelta(seconds=61))

        async def fire() -> Any:
            return await astep_through(
                fire_due({flow.key: flow}), lambda effect: aperform(store, effect)
            )

        assert asyncio.run(fire()) == datetime(2030, 1, 1, 0, 2, tzinfo=UTC)
        assert [r for r in store.list_runs() if r.startswith("sched/")] == [
            "sched/tick/2030-01-01T00:01:00Z"
        ]


def test_the_cosmos_clock_is_an_item_no_listing_sees(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Cosmos DB's clock is one upsert's ``_ts``: no run, no orphan, read once until fine."""
    with open_store(fresh_config("cosmos", request, tmp_path)) as store:
        store.load("warm-up")  # the connection, opened outside the count
        forget(store)
        sent = _sent(store)
        first = store_now(store)
        assert abs(first - datetime.now(UTC)) < NEAR
        assert _sent(store) - sent == 1
        assert 0.5 <= slack(first) <= 0.6, slack(first)  # a second wide, and the round trip
        assert list(store.list_runs()) == []
        assert list(store.list_info()) == []
        assert store.collect_orphans(min_age=0) == []
