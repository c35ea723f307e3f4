"""Schedules (issue 33): slots fired exactly once, DST, overlap and catch-up, bad input."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS
from fresh_stores import fresh_config as _config
from stepstone import (
    ConfigError,
    InvalidState,
    Step,
    Worker,
    Workflow,
    open_store,
)
from stepstone._control import _sync
from stepstone._effects import Save
from stepstone._schedule import (
    RECORD,
    ScheduleExists,
    ScheduleNotFound,
    aschedule,
    aschedules,
    delete_schedule,
    pause_schedule,
    resume_schedule,
    schedule,
    schedules,
)
from stepstone._schedule_fire import abackfill, backfill, fire_due
from stepstone._store import Store
from stepstone._store_time import Now
from stepstone.testing import FakeClock

State = dict[str, Any]


def _noop(state: State) -> State:
    return {"ran": True}


DIGEST = Workflow("digest", [Step("build", _noop)])
SERVED = {DIGEST.key: DIGEST}


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend (PostgreSQL and MySQL in fresh tables)."""
    with open_store(_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def mem() -> Iterator[Store]:
    """A fresh memory store."""
    with open_store(f"memory://sched-{uuid.uuid4().hex}") as opened:
        yield opened


def _fire(store: Store) -> datetime | None:
    result: datetime | None = _sync(fire_due(SERVED), store)
    return result


def _slot_runs(store: Store, name: str) -> list[str]:
    return sorted(r for r in store.list_runs() if r.startswith(f"sched/{name}/"))


def test_each_slot_fires_once_on_every_backend(store: Store) -> None:
    """Three workers' looks over five minutes start one run per minute slot, none twice."""
    with FakeClock(datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)) as clock:
        schedule(store, "tick", cron="* * * * *", workflow=DIGEST, overlap="allow")
        for _ in range(5):
            clock.advance(60)
            for _ in range(3):
                _fire(store)
    runs = _slot_runs(store, "tick")
    assert runs == [f"sched/tick/2030-01-01T12:0{m}:00Z" for m in range(1, 6)]
    info = schedules(store)[0]
    assert (info.fired, info.pending, info.last_run) == (5, (), runs[-1])
    cp = store.load(runs[0])
    assert cp is not None and cp.status == "queued"
    assert cp.input == {"schedule": "tick", "slot": "2030-01-01T12:01:00Z"}


def test_minute_schedule_over_a_week_across_dst(mem: Store) -> None:
    """A minute schedule in Berlin over the week of the spring-forward: every real minute once."""
    start = datetime(2026, 3, 26, 0, 0, 30, tzinfo=UTC)  # DST starts 2026-03-29 01:00 UTC
    with FakeClock(start) as clock:
        schedule(mem, "m", cron="* * * * *", tz="Europe/Berlin", workflow=DIGEST, overlap="allow")
        for _ in range(7 * 24):
            clock.advance(3600)  # an hour between looks: catch-up "latest" fires one
            _fire(mem)
    runs = _slot_runs(mem, "m")
    assert len(runs) == 7 * 24 == len(set(runs))
    assert "sched/m/2026-03-29T01:00:00Z" in runs  # 03:00 Berlin, the hour after the gap
    # Each look fired the latest slot: the hours' last minutes, in UTC, one per hour.
    assert runs[0] == "sched/m/2026-03-26T01:00:00Z"
    info = schedules(mem)[0]
    assert info.fired == 7 * 24 and info.skipped == 7 * 24 * 59


@pytest.mark.slow  # 10,080 slots: about 2 s on a quiet machine, more beside others
def test_minute_looks_over_a_week_fire_every_minute_once(mem: Store) -> None:
    """A look every simulated minute for a week across the spring-forward: 10,080 runs."""
    start = datetime(2026, 3, 26, 0, 0, 30, tzinfo=UTC)
    with FakeClock(start) as clock:
        schedule(mem, "w", cron="* * * * *", tz="Europe/Berlin", workflow=DIGEST, overlap="allow")
        for _ in range(7 * 24 * 60):
            clock.advance(60)
            _fire(mem)
    runs = _slot_runs(mem, "w")
    assert len(runs) == 7 * 24 * 60 == len(set(runs))
    assert schedules(mem)[0].skipped == 0


def test_catchup_all_fires_every_missed_minute_across_fall_back(mem: Store) -> None:
    """catchup='all' over the October fall-back night fires each of its real minutes once."""
    start = datetime(2026, 10, 24, 22, 0, 30, tzinfo=UTC)  # Berlin falls back at 01:00 UTC
    with FakeClock(start) as clock:
        schedule(
            mem,
            "a",
            cron="* * * * *",
            tz="Europe/Berlin",
            workflow=DIGEST,
            overlap="allow",
            catchup="all",
        )
        for _ in range(6):
            clock.advance(3600)
            _fire(mem)
    runs = _slot_runs(mem, "a")
    assert len(runs) == 6 * 60 == len(set(runs))


def test_fixed_time_on_dst_days_fires_once(mem: Store) -> None:
    """02:30 Berlin fires once on the spring-forward day (at 03:00) and once on fall-back."""
    fired: list[str] = []
    for start, expected in (
        (datetime(2026, 3, 28, 12, tzinfo=UTC), "2026-03-29T01:00:00Z"),
        (datetime(2026, 10, 24, 12, tzinfo=UTC), "2026-10-25T00:30:00Z"),
    ):
        name = f"d{len(fired)}"
        with FakeClock(start) as clock:
            schedule(mem, name, cron="30 2 * * *", tz="Europe/Berlin", workflow=DIGEST)
            for _ in range(24 * 4):
                clock.advance(900)
                _fire(mem)
        runs = _slot_runs(mem, name)
        assert runs[0] == f"sched/{name}/{expected}"
        assert len(runs) == 1  # the next day's slot is 24 h away from the first
        fired.extend(runs)


def test_overlap_skip_and_buffer_one(mem: Store) -> None:
    """skip leaves slots while the previous run is active; buffer_one keeps one for later."""
    with FakeClock(datetime(2030, 1, 1, tzinfo=UTC)) as clock:
        schedule(mem, "s", cron="* * * * *", workflow=DIGEST, overlap="skip")
        schedule(mem, "b", cron="* * * * *", workflow=DIGEST, overlap="buffer_one")
        for _ in range(3):
            clock.advance(60)
            _fire(mem)
        assert len(_slot_runs(mem, "s")) == 1  # the first run is still queued
        assert len(_slot_runs(mem, "b")) == 1
        by_name = {i.name: i for i in schedules(mem)}
        assert by_name["s"].skipped == 2
        assert by_name["b"].buffered == "2030-01-01T00:02:00Z" and by_name["b"].skipped == 1
        # The first runs finish: the buffered slot starts at the next look.
        worker = Worker(mem, [DIGEST])
        for run_id in _slot_runs(mem, "b") + _slot_runs(mem, "s"):
            cp = mem.load(run_id)
            assert cp is not None
            from stepstone import run

            run(run_id, DIGEST, mem)
        del worker
        _fire(mem)
        assert _slot_runs(mem, "b")[-1] == "sched/b/2030-01-01T00:02:00Z"


def test_overlap_cancel_previous(mem: Store) -> None:
    """cancel_previous asks the active previous run to stop and starts the new slot."""
    with FakeClock(datetime(2030, 1, 1, tzinfo=UTC)) as clock:
        schedule(mem, "c", cron="* * * * *", workflow=DIGEST, overlap="cancel_previous")
        clock.advance(60)
        _fire(mem)
        clock.advance(60)
        _fire(mem)
    first, second = _slot_runs(mem, "c")
    cp = mem.load(first)
    assert cp is not None and cp.status == "cancelled"
    assert mem.load(second) is not None


def test_a_crash_between_advance_and_start_is_repaired(mem: Store) -> None:
    """Slots advanced but not started (the worker died) are started by the next look, once."""
    with FakeClock(datetime(2030, 1, 1, tzinfo=UTC)) as clock:
        schedule(mem, "r", cron="* * * * *", workflow=DIGEST)
        clock.advance(60)
        gen = fire_due(SERVED)
        effect = next(gen)  # Now: the store's clock
        assert isinstance(effect, Now)
        effect = gen.send(clock.now())  # Load
        effect = gen.send(mem.load(RECORD))  # Save of the advanced record
        assert isinstance(effect, Save)
        mem.save(effect.cp)  # lands; then the worker dies before starting the slot
        gen.close()
        assert schedules(mem)[0].pending == ("2030-01-01T00:01:00Z",)
        _fire(mem)
        _fire(mem)
    assert _slot_runs(mem, "r") == ["sched/r/2030-01-01T00:01:00Z"]
    assert schedules(mem)[0].pending == ()


def test_pause_resume_delete_and_backfill(mem: Store) -> None:
    """Paused schedules fire nothing; resume starts from the next slot; backfill is idempotent."""
    with FakeClock(datetime(2030, 1, 1, tzinfo=UTC)) as clock:
        schedule(mem, "p", cron="0 * * * *", workflow=DIGEST)
        assert pause_schedule(mem, "p").paused
        clock.advance(timedelta(hours=3))
        _fire(mem)
        assert _slot_runs(mem, "p") == []
        info = resume_schedule(mem, "p")
        assert info.next_fire == datetime(2030, 1, 1, 4, tzinfo=UTC)
        start, end = datetime(2030, 1, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, 3, tzinfo=UTC)
        started = backfill(mem, "p", DIGEST, start, end)
        assert len(started) == 3
        assert backfill(mem, "p", DIGEST, start, end) == started
        assert len(_slot_runs(mem, "p")) == 3
        delete_schedule(mem, "p")
        assert schedules(mem) == []
        with pytest.raises(ScheduleNotFound, match="'p'"):
            delete_schedule(mem, "p")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "not valid"),
        ({"cron": "* * * *"}, "five are allowed"),
        ({"tz": "Mars/Olympus"}, "not a known IANA"),
        ({"overlap": "queue"}, "overlap must be one of"),
        ({"catchup": "some"}, "catchup must be one of"),
        ({"workflow": "digest"}, "must be a stepstone.Workflow"),
        ({"name": "has space"}, "schedule name"),
    ],
)
def test_bad_input_is_refused_and_nothing_stored(
    mem: Store, kwargs: dict[str, Any], message: str
) -> None:
    """An invalid cron, zone, policy, workflow or name raises ConfigError; nothing is stored."""
    args: dict[str, Any] = {"name": "x", "cron": "0 7 * * *", "workflow": DIGEST, **kwargs}
    name = args.pop("name")
    with pytest.raises(ConfigError, match=message):
        schedule(mem, name, **args)
    assert mem.load(RECORD) is None


def test_name_clash_and_non_json_input(mem: Store) -> None:
    """The same spec again is a no-op; another spec under the name is refused, unless replace."""
    schedule(mem, "n", cron="0 7 * * *", workflow=DIGEST)
    schedule(mem, "n", cron="0 7 * * *", workflow=DIGEST)
    with pytest.raises(ScheduleExists, match="cron"):
        schedule(mem, "n", cron="0 8 * * *", workflow=DIGEST)
    assert schedule(mem, "n", cron="0 8 * * *", workflow=DIGEST, replace=True).cron == "0 8 * * *"
    with pytest.raises(InvalidState):
        schedule(mem, "j", cron="0 7 * * *", workflow=DIGEST, input={"x": object()})
    assert [i.name for i in schedules(mem)] == ["n"]


def test_async_schedule_and_backfill(mem: Store) -> None:
    """aschedule, aschedules and abackfill work on the same record."""

    async def main() -> list[str]:
        await aschedule(mem, "as", cron="0 0 * * *", workflow=DIGEST)
        assert [i.name for i in await aschedules(mem)] == ["as"]
        day = datetime(2030, 1, 1, tzinfo=UTC)
        return await abackfill(mem, "as", DIGEST, day, day + timedelta(days=1))

    assert asyncio.run(main()) == ["sched/as/2030-01-01T00:00:00Z", "sched/as/2030-01-02T00:00:00Z"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_worker_fires_and_runs_due_slots(mem: Store, mode: str) -> None:
    """A worker serving the workflow fires a due slot and runs it to the end."""
    done = threading.Event()

    def build(state: State) -> State:
        done.set()
        return {"built": state["slot"]}

    flow = Workflow("digest2", [Step("build", build)])
    with FakeClock(datetime(2030, 1, 1, 6, 59, 59, tzinfo=UTC)) as clock:
        schedule(mem, "w", cron="0 7 * * *", workflow=flow)
        worker = Worker(mem, [flow], poll=0.05)
        if mode == "sync":
            thread = threading.Thread(target=worker.serve, daemon=True)
        else:
            thread = threading.Thread(target=lambda: asyncio.run(worker.aserve()), daemon=True)
        thread.start()
        try:
            clock.advance(2)
            for _ in range(200):
                if done.wait(0.05):
                    break
                clock.advance(0.1)
            assert done.is_set(), "the worker did not fire the 07:00 slot"
        finally:
            worker.stop()
            thread.join(30)
    cp = mem.load("sched/w/2030-01-01T07:00:00Z")
    assert cp is not None and cp.state["built"] == "2030-01-01T07:00:00Z"
