"""A timed-out thread step is fenced by the lease epoch (issue 33).

The retry that follows a timeout moves the run's lease to a new epoch, still held by
the same owner, so a late thread's writes through its ``ctx`` are refused while the
retry runs, exactly as a frozen owner's are after a takeover.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS
from fresh_stores import fresh_config as _config
from stepstone import (
    Budget,
    LeaseLost,
    Limit,
    RetryPolicy,
    Step,
    StepContext,
    Workflow,
    arun,
    limit_usage,
    open_store,
)
from stepstone import run as run_sync
from stepstone._store import Store
from stepstone.testing import FakeClock

State = dict[str, Any]
#: Real seconds a test waits for something that happens at once; never reached when green.
HANG = 30.0
#: Fake seconds: a hung attempt moves the fake clock past it, so only hung attempts time
#: out, however slow the machine (a retry waiting on the store never does).
TIMEOUT = 5.0
NO_DELAY = RetryPolicy(max_attempts=3, initial_delay=0, jitter=0)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend."""
    with open_store(_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """The fake clock the timeouts are read through."""
    with FakeClock() as fake:
        yield fake


def _hang(clock: FakeClock, release: threading.Event) -> None:
    """Hang past the timeout: move the fake clock past it, then block until released."""
    clock.advance(TIMEOUT + 1)
    assert release.wait(HANG), "the test never let the timed-out attempt go"


def _late_writer(clock: FakeClock) -> tuple[Any, threading.Event, queue.Queue[str]]:
    """A step whose first attempt hangs past its timeout, then reserves while the retry runs.

    The second attempt lets the first go and waits for the outcome of its late write,
    so the late write lands while the run is still held by the same owner.
    """
    release = threading.Event()
    outcome: queue.Queue[str] = queue.Queue()

    def step(state: State, ctx: StepContext) -> State:
        if ctx.attempt == 1:
            _hang(clock, release)
            try:
                ctx.reserve(usd=1.0)
                outcome.put("written")
            except LeaseLost:
                outcome.put("fenced")
            return {"late": True}
        release.set()
        return {"late_write": outcome.get(timeout=HANG), "attempt": ctx.attempt}

    return step, release, outcome


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_timed_out_threads_late_reserve_is_refused(
    store: Store, clock: FakeClock, mode: str
) -> None:
    """The late thread's ctx.reserve() during the retry raises LeaseLost; nothing is reserved."""
    fn, release, _ = _late_writer(clock)
    flow = Workflow(
        "fenced", [Step("call", fn, retry=NO_DELAY, timeout=TIMEOUT)], budget=Budget(usd=100)
    )
    run_id = f"f-{uuid.uuid4().hex}"
    try:
        if mode == "sync":
            result = run_sync(run_id, flow, store)
        else:
            result = asyncio.run(arun(run_id, flow, store))
    finally:
        release.set()  # never leave the hung thread behind on a failure
    assert result["late_write"] == "fenced" and result["attempt"] == 2
    assert "late" not in result
    cp = store.load(run_id)
    assert cp is not None and cp.status == "done"
    assert not [s for s in cp.signals if "reserve" in s.name], "the late reservation landed"


def test_the_retry_holds_the_lease_at_a_new_epoch(store: Store, clock: FakeClock) -> None:
    """Each timeout moves the epoch on; the owner keeps the run and completes it."""
    epochs: list[int] = []
    release = threading.Event()

    def step(state: State, ctx: StepContext) -> State:
        cp = store.load(state["run_id"])
        assert cp is not None
        epochs.append(cp.epoch)
        if ctx.attempt < 3:
            _hang(clock, release)
        return {"attempt": ctx.attempt}

    run_id = f"f-{uuid.uuid4().hex}"
    steps = [Step("call", step, retry=NO_DELAY, timeout=TIMEOUT)]
    try:
        assert run_sync(run_id, steps, store, input={"run_id": run_id})["attempt"] == 3
    finally:
        release.set()
    assert epochs == [epochs[0], epochs[0] + 1, epochs[0] + 2]


def test_the_runs_own_keys_are_held_at_the_new_epoch(store: Store, clock: FakeClock) -> None:
    """A run holding a key of its workflow's still holds it in the retry after a timeout."""
    key = f"api{uuid.uuid4().hex[:12]}"
    release = threading.Event()
    seen: list[dict[str, int]] = []

    def step(state: State, ctx: StepContext) -> State:
        if ctx.attempt == 1:
            _hang(clock, release)
            return {}
        usage = limit_usage(store, key)
        seen.append({} if usage is None else dict(usage.holders))
        return {"attempt": ctx.attempt}

    flow = Workflow(
        "keyed",
        [Step("call", step, retry=NO_DELAY, timeout=TIMEOUT)],
        limits=[Limit(key, concurrency=1)],
    )
    run_id = f"f-{uuid.uuid4().hex}"
    try:
        assert run_sync(run_id, flow, store)["attempt"] == 2
    finally:
        release.set()
    assert list(seen[0]) == [run_id], "the retry does not hold the run's key"
