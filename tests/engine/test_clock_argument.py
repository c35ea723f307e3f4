"""A call's own clock (``clock=``) and lease renewal on the clock seam (issue 30).

``run``, ``arun``, ``start``, ``astart`` and ``Worker`` take ``clock=``: that call (and
the threads and tasks it starts) reads the given clock instead of the installed one,
and every other call keeps the installed one. A lease renewed while a long step runs
(sync: the renewal thread; async: a timer on the event loop) goes by the run's clock,
so a ``FakeClock`` moved by the test renews it. No test waits for time to pass: each
moves a fake clock and waits, in real time with a generous limit, for the effect.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS
from fresh_stores import fresh_config as _config
from stepstone import (
    InvalidWorkflow,
    Sleep,
    Step,
    Store,
    Suspended,
    WaitFor,
    Worker,
    Workflow,
    _clock,
    arun,
    astart,
    open_store,
    run,
    start,
)
from stepstone.testing import FakeClock
from stepstone.testing._barrier import WAIT_TIMEOUT
from waiting import until

State = dict[str, Any]
LATER = datetime(2031, 5, 1, tzinfo=UTC)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Yield a fresh store of each backend (the clock is read in process, Cosmos too)."""
    with open_store(_config(request.param, request, tmp_path)) as opened:
        yield opened


def _approval() -> Workflow:
    return Workflow(
        "approval",
        [
            WaitFor("approval", "approve", timeout=timedelta(days=2), default={"ok": False}),
            Step("decide", lambda s: {"sent": s["approval"]["ok"]}),
        ],
    )


@pytest.mark.parametrize("form", ["sync", "async"])
def test_run_reads_its_own_clock_and_leaves_the_installed_one(store: Store, form: str) -> None:
    """A two-day timeout goes by the clock passed to the call; the installed one is untouched."""
    clock = FakeClock(LATER)

    def attempt() -> State:
        if form == "sync":
            return run("r", _approval(), store, clock=clock)
        return asyncio.run(arun("r", _approval(), store, clock=clock))

    with pytest.raises(Suspended):
        attempt()
    waiting = store.load("r")
    assert waiting is not None and waiting.wake_at == LATER + timedelta(days=2)
    assert _clock.current() is _clock.SYSTEM, "the call's clock leaked out of it"
    clock.advance(timedelta(days=2))
    assert attempt() == {"approval": {"ok": False}, "sent": False}


def test_a_calls_clock_wins_over_the_installed_one(store: Store) -> None:
    """Inside ``with FakeClock()``, a call given another clock reads that one."""
    own = FakeClock(LATER)
    with FakeClock() as installed:
        with pytest.raises(Suspended):
            run("r", _approval(), store, clock=own)
        installed.advance(timedelta(days=3))
        with pytest.raises(Suspended):  # the installed clock's days do not count
            run("r", _approval(), store, clock=own)
        own.advance(timedelta(days=2))
        assert run("r", _approval(), store, clock=own)["sent"] is False


@pytest.mark.parametrize("form", ["sync", "async"])
def test_start_stamps_the_run_with_its_clock(store: Store, form: str) -> None:
    """``start(clock=)`` records the run as created at that clock's time."""
    flow = Workflow("w", [Step("a", lambda s: {})])
    clock = FakeClock(LATER)
    if form == "sync":
        start(store, flow, "r", clock=clock)
    else:
        asyncio.run(astart(store, flow, "r", clock=clock))
    queued = store.load("r")
    assert queued is not None and queued.created_at == LATER


def _serve(worker: Worker, form: str) -> threading.Thread:
    target = worker.serve if form == "sync" else (lambda: asyncio.run(worker.aserve()))
    thread = threading.Thread(target=target, name=f"clock-argument-{form}", daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_worker_serves_on_its_own_clock(store: Store, form: str) -> None:
    """``Worker(clock=)`` rests, times and wakes runs on that clock, none installed."""
    flow = Workflow("napper", [Sleep("nap", duration=timedelta(hours=5)), Step("after", _after)])
    clock = FakeClock(LATER)
    worker = Worker(store, [flow], poll=5.0, clock=clock)
    thread = _serve(worker, form)
    try:
        start(store, flow, "r", clock=clock)
        until("the run to sleep", lambda: _wake_at(store) is not None)
        assert _wake_at(store) == LATER + timedelta(hours=5)
        clock.wait_for_sleepers(timeout=WAIT_TIMEOUT)
        clock.advance(timedelta(hours=5, seconds=1))
        until("the run to wake and finish", lambda: _status(store) == "done")
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "the worker did not stop"
    assert _clock.current() is _clock.SYSTEM


def _after(state: State) -> State:
    return {"after": True}


def _wake_at(store: Store) -> datetime | None:
    cp = store.load("r")
    return None if cp is None else cp.wake_at


def _status(store: Store) -> str | None:
    cp = store.load("r")
    return None if cp is None else cp.status


@pytest.mark.parametrize("how", ["installed", "argument"])
@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_long_steps_lease_is_renewed_when_the_fake_clock_moves(
    store: Store, form: str, how: str
) -> None:
    """Moving the run's fake clock past a third of the lease renews it while the step runs."""
    entered, gate = threading.Event(), threading.Event()
    clock = FakeClock(LATER)

    def slow(state: State) -> State:
        entered.set()
        assert gate.wait(WAIT_TIMEOUT), "the test did not let the step finish"
        return {"slow": True}

    async def aslow(state: State) -> State:
        entered.set()
        # Suspends: the step gets its renewal timer (an async step that never
        # suspends gets none; the loop could not run it anyway).
        assert await asyncio.to_thread(gate.wait, WAIT_TIMEOUT), "the step was not let go"
        return {"slow": True}

    steps = [Step("slow", slow if form == "sync" else aslow)]
    own = clock if how == "argument" else None
    outcome: list[object] = []

    def call() -> None:
        try:
            if form == "sync":
                outcome.append(run("r", steps, store, lease=30, clock=own))
            else:
                outcome.append(asyncio.run(arun("r", steps, store, lease=30, clock=own)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    installing = clock if how == "installed" else _NoClock()
    with installing:
        caller = threading.Thread(target=call, name="long-step", daemon=True)
        caller.start()
        try:
            assert entered.wait(WAIT_TIMEOUT), "the step never started"
            claimed = store.load("r")
            assert claimed is not None and claimed.renewed_at == LATER
            if form == "async":
                # Its renewal timer is set once the step suspends: move the clock after.
                clock.wait_for_sleepers(timeout=WAIT_TIMEOUT)
            clock.advance(11.0)  # past a third of the 30 s lease
            until("the lease to be renewed", lambda: _renewed_at(store) == LATER + _11S)
        finally:
            gate.set()
            caller.join(WAIT_TIMEOUT)
    assert outcome == [{"slow": True}]


_11S = timedelta(seconds=11)


class _NoClock:
    """A ``with`` block that installs nothing (the clock goes to the call instead)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _renewed_at(store: Store) -> datetime | None:
    cp = store.load("r")
    return None if cp is None else cp.renewed_at


def test_a_timer_on_a_fake_clock_fires_when_moved_and_not_once_cancelled() -> None:
    """``_clock.call_later`` on a fake clock fires on ``advance``; a cancelled one never does."""
    clock = FakeClock()

    async def main() -> list[str]:
        fired: list[str] = []
        with _clock.using(clock):
            _clock.call_later(10.0, lambda: fired.append("due"))
            cancelled = _clock.call_later(10.0, lambda: fired.append("cancelled"))
        await asyncio.to_thread(clock.wait_for_sleepers, 2, WAIT_TIMEOUT)
        cancelled.cancel()
        clock.advance(9.0)
        await asyncio.sleep(0)
        assert fired == [], "fired before its time"
        clock.advance(1.0)
        for _ in range(1000):  # real turns of the loop, until the timer's task has run
            if fired:
                break
            await asyncio.sleep(0.001)
        return fired

    assert asyncio.run(main()) == ["due"]


@pytest.mark.parametrize(
    "call",
    [
        lambda store, flow, bad: run("r", flow, store, clock=bad),
        lambda store, flow, bad: asyncio.run(arun("r", flow, store, clock=bad)),
        lambda store, flow, bad: start(store, flow, "r", clock=bad),
        lambda store, flow, bad: Worker(store, [flow], clock=bad),
    ],
    ids=["run", "arun", "start", "Worker"],
)
def test_a_clock_that_is_not_one_is_refused(call: Any, tmp_path: Path) -> None:
    """``clock=`` that is not a Clock raises InvalidWorkflow naming what a clock needs."""
    flow = Workflow("w", [Step("a", lambda s: {})])
    with open_store(f"sqlite:///{tmp_path}/runs.db") as opened:
        with pytest.raises(InvalidWorkflow, match="clock must be None .* monotonic"):
            call(opened, flow, datetime.now(UTC))
        assert opened.load("r") is None, "something was stored"
