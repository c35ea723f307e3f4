"""The public fake clock (issue 30): time-driven behaviour tested without waiting.

``stepstone.testing.FakeClock`` is installed through the one seam (``stepstone._clock``)
that the runner, the worker, leases, timers and backoff read. Each test moves the clock
with ``advance`` (or lets a backoff's sleep move it) and asserts on outcomes: a two-day
approval that times out, a backoff of hours, a dead owner's lease running out. None
asserts on speed; each would wait days (or hang to its real-time limit) on the real clock.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS as ALL_BACKENDS
from fresh_stores import fresh_config
from stepstone import (
    Checkpoint,
    ConfigError,
    RetryPolicy,
    Sleep,
    Step,
    Store,
    Suspended,
    WaitFor,
    Worker,
    Workflow,
    _clock,
    arun,
    open_store,
    run,
    start,
)
from stepstone.testing import Clock, FakeClock, use_clock

#: Cosmos DB aside: the fake clock is read in this process, the emulator keeps its own.
BACKENDS = tuple(kind for kind in ALL_BACKENDS if kind != "cosmos")
#: Real seconds any wait for the worker may take before the test fails naming it.
PATIENCE = 30.0
State = dict[str, Any]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Yield a fresh store of each backend (Cosmos aside: the clock is read in process)."""
    with open_store(fresh_config(request.param, request, tmp_path)) as opened:
        yield opened


def _approval() -> Workflow:
    """The documented example: wait two days for an approval, else go on refused."""
    return Workflow(
        "approval",
        [
            WaitFor("approval", "approve", timeout=timedelta(days=2), default={"ok": False}),
            Step("decide", lambda s: {"sent": s["approval"]["ok"]}),
        ],
    )


def _until(what: str, check: Any, store: Store, run_id: str) -> Checkpoint:
    """Poll the run in real time until ``check(checkpoint)``; fail naming ``what``."""
    done = threading.Event()
    for _ in range(int(PATIENCE / 0.01)):
        cp = store.load(run_id)
        if cp is not None and check(cp):
            return cp
        done.wait(0.01)
    raise AssertionError(f"timed out after {PATIENCE:g}s waiting for {what}")


@pytest.mark.parametrize("form", ["sync", "async"])
def test_run_times_out_after_two_days_advanced(store: Store, form: str) -> None:
    """A run waiting two days for a signal takes its default once the clock moves two days."""
    with FakeClock() as clock:

        def attempt() -> State:
            if form == "sync":
                return run("r", _approval(), store)
            return asyncio.run(arun("r", _approval(), store))

        with pytest.raises(Suspended):
            attempt()
        clock.advance(timedelta(days=2) - timedelta(seconds=1))
        with pytest.raises(Suspended):
            attempt()
        clock.advance(timedelta(seconds=1))
        assert attempt() == {"approval": {"ok": False}, "sent": False}


def _serve(worker: Worker, form: str) -> threading.Thread:
    """Start ``worker`` serving (``serve`` or ``aserve``) in a thread of its own."""
    target = worker.serve if form == "sync" else (lambda: asyncio.run(worker.aserve()))
    thread = threading.Thread(target=target, name=f"fake-clock-{form}", daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("form", ["sync", "async"])
def test_worker_times_out_an_approval_in_milliseconds(store: Store, form: str) -> None:
    """A worker resumes a two-day WaitFor with its default when the test advances two days."""
    flow = _approval()
    with FakeClock() as clock:
        worker = Worker(store, [flow], poll=5.0)
        thread = _serve(worker, form)
        try:
            start(store, flow, "r")
            _until("the run to wait", lambda cp: cp.waiting_for is not None, store, "r")
            clock.wait_for_sleepers(timeout=PATIENCE)
            assert store.load("r") is not None
            clock.advance(timedelta(days=2, seconds=1))  # past the timeout, as documented
            done = _until("the run to finish", lambda cp: cp.step == 1, store, "r")
            assert done.state == {"approval": {"ok": False}, "sent": False}
        finally:
            worker.stop()
            thread.join(PATIENCE)
        assert not thread.is_alive(), "the worker did not stop"


@pytest.mark.parametrize("form", ["sync", "async"])
def test_backoff_moves_the_fake_clock_instead_of_waiting(store: Store, form: str) -> None:
    """Retry delays of hours pass on the fake clock: the run succeeds, the clock moved by them."""
    tries: list[float] = []

    def flaky(state: State) -> State:
        tries.append(_clock.monotonic())
        if len(tries) < 3:
            raise ConnectionError("not yet")
        return {"tries": len(tries)}

    policy = RetryPolicy(
        max_attempts=3, initial_delay=3600.0, multiplier=2.0, max_delay=86400.0, jitter=0.0
    )
    steps = [Step("flaky", flaky, retry=policy)]
    with FakeClock():
        state = run("r", steps, store) if form == "sync" else asyncio.run(arun("r", steps, store))
    assert state == {"tries": 3}
    gaps = [later - earlier for earlier, later in itertools.pairwise(tries)]
    assert gaps == pytest.approx([3600.0, 7200.0])


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_dead_owners_lease_runs_out_on_the_fake_clock(store: Store, form: str) -> None:
    """A worker takes over a run whose owner stopped renewing once the lease has passed."""
    flow = Workflow("orphan", [Step("only", lambda s: {"done": True})])
    with FakeClock() as clock:
        store.save(
            Checkpoint(
                run_id="r",
                total_steps=1,
                workflow=flow.name,
                workflow_version=flow.version,
                owner="dead-host:1",
                epoch=1,
                lease=60.0,
                renewed_at=clock.now(),
            )
        )
        worker = Worker(store, [flow], poll=5.0)
        thread = _serve(worker, form)
        try:
            clock.wait_for_sleepers(timeout=PATIENCE)
            clock.advance(30.0)
            clock.wait_for_sleepers(timeout=PATIENCE)
            held = store.load("r")
            assert held is not None and held.owner == "dead-host:1", "taken within the lease"
            clock.advance(31.0)
            done = _until("the run to be taken over", lambda cp: cp.step == 0, store, "r")
            assert done.state == {"done": True}
        finally:
            worker.stop()
            thread.join(PATIENCE)
        assert not thread.is_alive(), "the worker did not stop"


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_sleep_of_hours_ends_when_the_clock_reaches_it(store: Store, form: str) -> None:
    """A worker wakes a run sleeping five hours once the clock is advanced to its wake time."""
    flow = Workflow("napper", [Sleep("nap", duration=timedelta(hours=5)), Step("after", _after)])
    with FakeClock() as clock:
        worker = Worker(store, [flow], poll=5.0)
        thread = _serve(worker, form)
        try:
            start(store, flow, "r")
            slept = _until("the run to sleep", lambda cp: cp.wake_at is not None, store, "r")
            assert slept.wake_at == clock.now() + timedelta(hours=5)
            clock.wait_for_sleepers(timeout=PATIENCE)
            clock.advance(timedelta(hours=4, minutes=59))
            clock.wait_for_sleepers(timeout=PATIENCE)
            still = store.load("r")
            assert still is not None and still.status == "waiting", "woke before its time"
            # Past the wake time, not onto it: the worker looks a few ms after a due time.
            clock.advance(timedelta(minutes=1, seconds=1))
            done = _until("the run to wake and finish", lambda cp: cp.step == 1, store, "r")
            assert done.state["after"] is True
        finally:
            worker.stop()
            thread.join(PATIENCE)
        assert not thread.is_alive(), "the worker did not stop"


def _after(state: State) -> State:
    return {"after": True}


@pytest.mark.parametrize("form", ["sync", "async"])
def test_run_takes_over_a_dead_owner_after_its_lease_on_the_fake_clock(
    store: Store, form: str
) -> None:
    """``run`` on a run whose owner stopped renewing waits out the lease on the fake clock."""
    flow = Workflow("orphan", [Step("only", lambda s: {"done": True})])
    with FakeClock() as clock:
        store.save(
            Checkpoint(
                run_id="r",
                total_steps=1,
                workflow=flow.name,
                owner="dead-host:1",
                epoch=1,
                lease=600.0,
                renewed_at=clock.now(),
            )
        )
        began = clock.monotonic()
        state = run("r", flow, store) if form == "sync" else asyncio.run(arun("r", flow, store))
        assert state == {"done": True}
        assert clock.monotonic() - began >= 600.0, "taken over within the lease"


def test_advance_wakes_a_wait_in_another_thread() -> None:
    """A wait parked on the fake clock returns False once advance passes its deadline."""
    clock = FakeClock()
    event = threading.Event()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(clock.wait(event, 60.0)))
    waiter.start()
    clock.wait_for_sleepers(timeout=PATIENCE)
    clock.advance(59.0)
    assert clock.sleepers == 1, "woke before its deadline"
    clock.advance(1.0)
    waiter.join(PATIENCE)
    assert got == [False]


def test_a_sleep_below_a_float_step_still_moves_the_clock() -> None:
    """A sleep too short to change the monotonic reading moves it one step (no endless loop)."""
    clock = FakeClock()
    clock.advance(timedelta(days=400))  # readings where a float step is ~1e-8 s
    before = clock.monotonic()
    clock.sleep(1e-12)
    assert clock.monotonic() > before


def test_a_set_event_ends_a_wait_without_time_passing() -> None:
    """An event set while a wait is parked on the fake clock ends it, the clock unmoved."""
    clock = FakeClock()
    event = threading.Event()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(clock.wait(event, 60.0)))
    waiter.start()
    clock.wait_for_sleepers(timeout=PATIENCE)
    before = clock.monotonic()
    event.set()
    waiter.join(PATIENCE)
    assert got == [True] and clock.monotonic() == before


def test_async_waits_end_by_advance_or_event() -> None:
    """``await_event`` returns False when advanced past, True when its event is set."""
    clock = FakeClock()

    async def main() -> tuple[bool, bool]:
        timed, rung = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(clock.await_event(timed, 10.0))
        second = asyncio.create_task(clock.await_event(rung, 10.0))
        await asyncio.to_thread(clock.wait_for_sleepers, 2, PATIENCE)
        rung.set()
        assert await second
        clock.advance(10.0)
        return await first, rung.is_set()

    assert asyncio.run(main()) == (False, True)


def test_the_clock_is_installed_only_inside_the_block() -> None:
    """``with FakeClock()`` makes utcnow read it, and restores the real clock after."""
    start_at = datetime(2030, 1, 1, tzinfo=UTC)
    real = _clock.current()
    with FakeClock(start_at) as clock:
        assert _clock.current() is clock and _clock.now() == start_at
        clock.advance(timedelta(hours=1))
        assert _clock.now() == start_at + timedelta(hours=1)
    assert _clock.current() is real
    assert isinstance(clock, Clock)


def test_bad_uses_are_refused() -> None:
    """A naive start, a negative advance and a non-clock are refused, saying what is allowed."""
    with pytest.raises(ValueError, match="timezone-aware"):
        FakeClock(datetime(2030, 1, 1))
    with pytest.raises(ValueError, match=">= 0"):
        FakeClock().advance(-1.0)
    with pytest.raises(TypeError, match="needs a Clock"), use_clock(object()):  # type: ignore[arg-type]
        pass


def test_a_start_before_2000_is_refused_and_the_earliest_finds_queued_runs_due() -> None:
    """Queued runs are dated into 1970 to order them: a clock there would find none due,
    so such a start is refused; at the earliest start allowed, queued runs are due."""
    for early in (datetime(1969, 12, 31, tzinfo=UTC), datetime(1999, 12, 31, 23, tzinfo=UTC)):
        with pytest.raises(ConfigError, match="on or after 2000-01-01"):
            FakeClock(early)
    flow = Workflow("queued", [Step("after", _after)])
    earliest = datetime(2000, 1, 1, tzinfo=UTC)
    with open_store("memory://") as store:
        start(store, flow, "today")  # queued by the real clock: ordered by today's time
        with FakeClock(earliest) as clock:
            start(store, flow, "then", priority=-5)
            due = {info.run_id for info in store.claimable(clock.now(), status="queued")}
    assert due == {"today", "then"}
