"""Run deadlines (issue 33): fixed at the first claim, enforced at boundaries and mid-step."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import stepstone
from fresh_stores import BACKENDS
from fresh_stores import fresh_config as _config
from stepstone import (
    InvalidWorkflow,
    Map,
    Sleep,
    Step,
    Suspended,
    Workflow,
    arun,
    open_store,
    retry,
    run,
    signal,
    start,
)
from stepstone._deadline import DeadlineExceeded, deadline_of
from stepstone._store import Store
from stepstone.testing import FakeClock

State = dict[str, Any]
T0 = datetime(2030, 1, 1, tzinfo=UTC)
HANG = 30.0


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend."""
    with open_store(_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """The fake clock, from 2030-01-01 UTC."""
    with FakeClock(T0) as fake:
        yield fake


def _rid() -> str:
    return f"d-{uuid.uuid4().hex}"


def test_a_deadline_between_steps_fails_the_run(store: Store, clock: FakeClock) -> None:
    """A step that takes past the deadline ends the run at the next boundary, recorded."""
    ran: list[str] = []

    def slow(state: State) -> State:
        clock.advance(timedelta(hours=2))
        ran.append("slow")
        return {"slow": True}

    def after(state: State) -> State:
        ran.append("after")
        return {}

    flow = Workflow("late", [Step("slow", slow), Step("after", after)], deadline=3600)
    run_id = _rid()
    with pytest.raises(DeadlineExceeded) as caught:
        run(run_id, flow, store)
    assert caught.value.deadline_at == T0 + timedelta(hours=1)
    assert ran == ["slow"]
    cp = store.load(run_id)
    assert cp is not None and cp.status == "failed" and cp.failure is not None
    assert (cp.failure.error_type, cp.failure.step_name) == ("DeadlineExceeded", "after")
    # A retry gets a fresh deadline from its next claim, as a fresh attempt budget.
    assert cp.timing is not None and cp.timing["expired_at"] == "2030-01-01T01:00:00+00:00"
    retry(store, run_id)
    assert run(run_id, flow, store) == {"slow": True}
    again = store.load(run_id)
    assert again is not None and again.timing is not None
    assert again.timing["deadline_at"] == (T0 + timedelta(hours=3)).isoformat()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_deadline_during_a_step_ends_it(store: Store, clock: FakeClock, mode: str) -> None:
    """A step still running at the deadline is given up (not retried); the run fails."""
    release = threading.Event()

    def hangs(state: State) -> State:
        clock.advance(timedelta(hours=2))  # the deadline falls while the step runs
        release.wait(HANG)
        return {"late": True}

    flow = Workflow("hang", [Step("hangs", hangs)], deadline=timedelta(hours=1))
    run_id = _rid()
    try:
        with pytest.raises(DeadlineExceeded):
            if mode == "sync":
                run(run_id, flow, store)
            else:
                asyncio.run(arun(run_id, flow, store))
    finally:
        release.set()
    cp = store.load(run_id)
    assert cp is not None and cp.status == "failed" and "late" not in cp.state


def test_start_deadline_is_fixed_at_first_claim_and_kept_on_resume(
    store: Store, clock: FakeClock
) -> None:
    """start(deadline=) counts from the first claim; a resume never moves it."""
    flow = Workflow("nap", [Sleep("nap", duration=timedelta(days=1)), Step("s", lambda s: {})])
    run_id = _rid()
    start(store, flow, run_id, deadline=timedelta(hours=3))
    clock.advance(timedelta(hours=10))  # queued time does not count
    with pytest.raises(Suspended):
        run(run_id, flow, store)
    cp = store.load(run_id)
    assert cp is not None and deadline_of(cp) == T0 + timedelta(hours=13)
    # The sleep's wake-up is pulled to the deadline: a worker looks then.
    assert cp.wake_at == T0 + timedelta(hours=13)
    clock.advance(timedelta(hours=1))
    with pytest.raises(Suspended):
        run(run_id, flow, store)
    again = store.load(run_id)
    assert again is not None and deadline_of(again) == T0 + timedelta(hours=13)
    clock.advance(timedelta(hours=3))
    with pytest.raises(DeadlineExceeded):
        run(run_id, flow, store)


def test_a_deadline_ends_a_run_mid_map_and_its_children(store: Store, clock: FakeClock) -> None:
    """Children inherit the parent's deadline; at it the parent fails and cancels them."""
    child = Workflow("child", [Step("work", lambda s: {"done": True})])
    parent = Workflow(
        "parent",
        [Map("fan", child, lambda s: [{"n": n} for n in range(3)]), Step("end", lambda s: {})],
        deadline=600,
    )
    run_id = _rid()
    with pytest.raises(Suspended):
        run(run_id, parent, store)
    kids = [f"{run_id}/fan/{n}" for n in range(3)]
    for kid in kids:
        cp = store.load(kid)
        assert cp is not None and deadline_of(cp) == T0 + timedelta(minutes=10)
    clock.advance(timedelta(minutes=11))
    with pytest.raises(DeadlineExceeded):
        run(run_id, parent, store)
    for kid in kids:
        cp = store.load(kid)
        assert cp is not None and cp.status == "cancelled"


def test_wait_for_a_person_to_extend_the_deadline(store: Store, clock: FakeClock) -> None:
    """on_deadline='wait': the run waits for the signal 'deadline', which extends it."""

    def slow(state: State) -> State:
        clock.advance(timedelta(hours=2))
        return {}

    flow = Workflow(
        "ask",
        [Step("slow", slow), Step("end", lambda s: {"end": True})],
        deadline=3600,
        on_deadline="wait",
    )
    run_id = _rid()
    with pytest.raises(Suspended) as caught:
        run(run_id, flow, store)
    assert caught.value.waiting_for == "signal deadline"
    cp = store.load(run_id)
    assert cp is not None and cp.status == "waiting"
    signal(store, run_id, "deadline", {"extend": 1800})
    assert run(run_id, flow, store) == {"end": True}
    done = store.load(run_id)
    assert done is not None and deadline_of(done) == T0 + timedelta(hours=2, minutes=30)


def test_bad_deadlines_are_refused() -> None:
    """A deadline that is not a positive number of seconds, or a bad policy, is refused."""
    with pytest.raises(InvalidWorkflow, match="more than 0"):
        Workflow("w", [Step("s", lambda s: {})], deadline=0)
    with pytest.raises(InvalidWorkflow, match="'fail' or 'wait'"):
        Workflow("w", [Step("s", lambda s: {})], deadline=5, on_deadline="retry")
    flow = Workflow("w", [Step("s", lambda s: {})])
    with open_store("memory://bad-deadline") as store:
        with pytest.raises(InvalidWorkflow, match="needs a deadline"):
            start(store, flow, "r", on_deadline="wait")
        assert store.load("r") is None


def test_runs_without_a_deadline_store_no_timing(clock: FakeClock) -> None:
    """A run with no deadline stores no timing field (stores of earlier releases read it)."""
    with open_store(f"memory://{uuid.uuid4().hex}") as store:
        run("plain", [Step("s", lambda s: {"x": 1})], store)
        cp = store.load("plain")
        assert cp is not None and cp.timing is None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_worker_fixes_the_deadline_at_its_claim(store: Store, mode: str) -> None:
    """A worker's claim (one call or run by run, on every backend) keeps and fixes timing."""
    done = threading.Event()

    def work(state: State) -> State:
        done.set()
        return {"ok": True}

    flow = Workflow("timed", [Step("work", work)])
    run_id = _rid()
    start(store, flow, run_id, deadline=600)
    worker = stepstone.Worker(store, [flow], poll=0.05)
    if mode == "sync":
        thread = threading.Thread(target=worker.serve, daemon=True)
    else:
        thread = threading.Thread(target=lambda: asyncio.run(worker.aserve()), daemon=True)
    thread.start()
    try:
        assert done.wait(HANG), "the worker never ran the run"
        until = time.monotonic() + HANG
        while (cp := store.load(run_id)) is None or cp.status != "done":
            assert time.monotonic() < until, "the run never finished"
            threading.Event().wait(0.01)
    finally:
        worker.stop()
        thread.join(HANG)
    cp = store.load(run_id)
    assert cp is not None and cp.timing is not None and cp.status == "done"
    assert cp.timing["deadline"] == 600.0 and "deadline_at" in cp.timing


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_code_workflow_under_a_deadline(clock: FakeClock, mode: str) -> None:
    """A code workflow with a deadline runs as usual; resumed past it, it fails."""
    from stepstone import workflow

    def fetch(n: int) -> int:
        return n * 2

    if mode == "sync":

        @workflow("code-deadline")
        def flow(ctx: Any, data: State) -> int:
            value: int = ctx.step("fetch", fetch, 21)
            ctx.sleep(timedelta(hours=2))
            return value

    else:

        @workflow("code-deadline")
        async def flow(ctx: Any, data: State) -> int:
            value: int = await ctx.step("fetch", fetch, 21)
            await ctx.sleep(timedelta(hours=2))
            return value

    def drive(run_id: str, store: Store) -> Any:
        if mode == "sync":
            return run(run_id, flow, store)
        return asyncio.run(arun(run_id, flow, store))

    with open_store(f"memory://{uuid.uuid4().hex}") as store:
        start(store, flow, "c1", deadline=timedelta(hours=1))
        with pytest.raises(Suspended):
            drive("c1", store)
        cp = store.load("c1")
        assert cp is not None and cp.wake_at == T0 + timedelta(hours=1)  # due at the deadline
        clock.advance(timedelta(hours=1))
        with pytest.raises(DeadlineExceeded):
            drive("c1", store)
        start(store, flow, "c2", deadline=timedelta(hours=3))
        with pytest.raises(Suspended):
            drive("c2", store)
        clock.advance(timedelta(hours=2))
        assert drive("c2", store)["result"] == 42
