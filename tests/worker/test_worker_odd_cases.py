"""Odd cases against the worker: stops from anywhere, hostile steps, waiting runs it holds.

Each case pins what a ``Worker`` must do when a step, an operator or the store does
something odd: hand the run over, stop at once, never spin, never lose or double work.
(The same campaign's cases against the runner are in ``engine/test_odd_cases.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import QUICK_BACKENDS, fresh_config
from stepstone import (
    Map,
    RunInfo,
    RunOwned,
    Sleep,
    Step,
    Store,
    Worker,
    Workflow,
    _hooks,
    open_store,
    run,
    start,
)
from waiting import loaded
from worker_support import LIVE_LEASE, ODD_TIMEOUT, ODD_WAIT, bounded

State = dict[str, Any]
WAIT = ODD_WAIT
LIVE = LIVE_LEASE
pytestmark = pytest.mark.timeout(ODD_TIMEOUT)
#: The shared helpers, bounded by ``WAIT``.
until, in_thread, arun_in_time, _Serving = bounded(WAIT)


@pytest.fixture(params=QUICK_BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each quick kind."""
    with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


class _Custom(BaseException):
    """A library's own interrupt, neither Exception nor a standard BaseException."""


CHILD = Workflow("child", [Step("double", lambda s: {"out": s["x"] * 2})])


# --- workers ----------------------------------------------------------------------------


def test_worker_stop_before_serve_and_twice_returns_at_once(store: Store) -> None:
    """stop() before serve() makes serve return at once; a second stop() is harmless."""
    wf = Workflow("w", [Step("a", lambda s: {"a": 1})])
    worker = Worker(store, [wf], poll=0.05)
    worker.stop()
    worker.stop()
    in_thread("serve after stop", worker.serve)()
    in_thread("aserve after stop", lambda: asyncio.run(worker.aserve()))()
    assert worker.stopping


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_worker_stop_from_inside_a_step_hands_the_run_over(store: Store, mode: str) -> None:
    """A step calling worker.stop() is saved; the run is handed over at the step boundary."""
    holder: dict[str, Worker] = {}

    def stopper(state: State) -> State:
        holder["w"].stop()
        return {"a": 1}

    wf = Workflow("w", [Step("a", stopper), Step("b", lambda s: {"b": 2})])
    start(store, wf, "r")
    worker = holder["w"] = Worker(store, [wf], poll=0.05, grace=5)
    _Serving(worker, mode).join()
    cp = loaded(store, "r")
    assert (cp.step, cp.state, cp.owner) == (0, {"a": 1}, None)
    assert cp.status == "running"


def test_worker_stop_from_many_threads_while_claiming(store: Store) -> None:
    """stop() raced from several threads while the worker claims leaves no run owned by it."""
    wf = Workflow("w", [Step("a", lambda s: {"a": 1}), Step("b", lambda s: {"b": 2})])
    for i in range(40):
        start(store, wf, f"r{i}")
    worker = Worker(store, [wf], poll=0.01, concurrency=4, grace=10)
    serving = _Serving(worker)
    until(
        "the first claim",
        lambda: (
            worker.completed > 0 or any(loaded(store, f"r{i}").owner is not None for i in range(40))
        ),
    )
    joins = [in_thread(f"stopper {i}", worker.stop) for i in range(4)]
    for join in joins:
        join()
    serving.join()
    for i in range(40):
        cp = loaded(store, f"r{i}")
        assert cp.owner is None, f"r{i} still owned after the worker stopped"
        assert cp.status in ("queued", "running", "done")


def test_worker_survives_a_step_raising_base_exception(store: Store) -> None:
    """A step raising a BaseException once under serve() does not strand the run or the slot."""
    raised: list[int] = []

    def once(state: State) -> State:
        if not raised:
            raised.append(1)
            raise _Custom("library-level interrupt")
        return {"a": 1}

    wf = Workflow("w", [Step("a", once)])
    start(store, wf, "r")
    serving = _Serving(Worker(store, [wf], poll=0.05, concurrency=1))
    try:
        until(
            "the run to finish after the BaseException",
            lambda: loaded(store, "r").status == "done",
            timeout=5,
        )
    finally:
        serving.stop()


def test_aserve_survives_a_step_raising_cancelled_error(store: Store) -> None:
    """A step raising CancelledError unprompted fails (saved) and does not strand the worker."""
    raised: list[int] = []

    async def once(state: State) -> State:
        if not raised:
            raised.append(1)
            raise asyncio.CancelledError
        return {"a": 1}

    wf = Workflow("w", [Step("a", once)])
    start(store, wf, "r")
    serving = _Serving(Worker(store, [wf], poll=0.05, concurrency=1), "async")
    try:
        until(
            "the run to fail on the CancelledError",
            lambda: loaded(store, "r").status == "failed",
        )
        failure = loaded(store, "r").failure
        assert failure is not None and failure.error_type == "RuntimeError"
        start(store, wf, "r2")  # the worker's one slot is free again
        until("the next run to finish", lambda: loaded(store, "r2").status == "done")
    finally:
        serving.stop()


def test_graceful_hand_over_logs_no_error(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """A worker stopped between steps hands its run over without logging an ERROR."""
    holder: dict[str, Worker] = {}

    def stopper(state: State) -> State:
        holder["w"].stop()
        return {"a": 1}

    wf = Workflow("w", [Step("a", stopper), Step("b", lambda s: {"b": 2})])
    start(store, wf, "r")
    worker = holder["w"] = Worker(store, [wf], poll=0.05)
    with caplog.at_level(logging.INFO, logger="stepstone"):
        _Serving(worker).join()
    # The worker's own records: a task another test left behind can be collected (and
    # logged by asyncio) at any moment, and is not this worker's error.
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith("stepstone")
    ]
    assert errors == []


def test_store_closed_while_a_worker_serves(tmp_path: Path) -> None:
    """Closing a SQLite store under a serving worker neither crashes it nor stops stop() working."""
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    wf = Workflow("w", [Step("a", lambda s: {"a": 1})])
    start(store, wf, "r0")
    worker = Worker(store, [wf], poll=0.02)
    serving = _Serving(worker)
    until("the first run", lambda: loaded(store, "r0").status == "done")
    store.close()
    time.sleep(0.2)  # some polls against the closed store
    serving.stop()


# --- workers and waiting runs ----------------------------------------------------------------


def test_worker_leaves_a_far_sleeping_run_alone(store: Store) -> None:
    """A run sleeping until next year is not claimed or rewritten by a polling worker."""
    wf = Workflow("w", [Sleep("s", until=datetime.now(UTC) + timedelta(days=365))])
    start(store, wf, "r")
    worker = Worker(store, [wf], poll=0.02)
    serving = _Serving(worker)
    try:
        until("the run to wait", lambda: loaded(store, "r").status == "waiting")
        version = loaded(store, "r").version
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            assert loaded(store, "r").version == version, "a waiting run was rewritten"
            time.sleep(0.02)
    finally:
        serving.stop()


def test_worker_does_not_reclaim_a_malformed_map_forever(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker facing a Map with malformed items records one failure instead of re-claiming."""
    wf = Workflow("w", [Map("m", CHILD, lambda s: "not a list")])  # type: ignore[arg-type,return-value]
    start(store, wf, "r")
    polls: list[int] = []
    claimable = store.claimable

    def counted(*args: Any, **kwargs: Any) -> list[RunInfo]:
        polls.append(1)
        return claimable(*args, **kwargs)

    monkeypatch.setattr(store, "claimable", counted)
    serving = _Serving(Worker(store, [wf], poll=0.02))
    try:
        until("the failure to be saved", lambda: loaded(store, "r").status == "failed")
        # Many polls of the claim index since: a correct worker claimed only once.
        seen = len(polls)
        until("ten more polls of the claim index", lambda: len(polls) >= seen + 10)
        cp = loaded(store, "r")
        assert cp.status == "failed"
        assert cp.epoch == 1
    finally:
        serving.stop()


def test_direct_run_on_a_run_a_worker_holds_is_refused(store: Store) -> None:
    """run() on a run a live worker executes raises RunOwned; the step runs once."""
    calls: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def long(state: State) -> State:
        calls.append("long")
        inside.set()
        release.wait(WAIT)
        return {"x": 1}

    wf = Workflow("w", [Step("long", long)])
    start(store, wf, "r")
    serving = _Serving(Worker(store, [wf], poll=0.02, lease=LIVE))
    try:
        assert inside.wait(WAIT), "the worker never started the step"
        with pytest.raises(RunOwned):
            run("r", wf, store, lease=LIVE)
        release.set()
        until("the worker to finish", lambda: loaded(store, "r").status == "done")
    finally:
        release.set()
        serving.stop()
    assert calls == ["long"]


def test_cancelling_aserve_frees_the_runs_in_flight(
    store: Store, request: pytest.FixtureRequest
) -> None:
    """Cancelling the task awaiting aserve cancels the step in flight and gives its lease back."""
    inside = threading.Event()

    async def slow(state: State) -> None:
        inside.set()
        await asyncio.sleep(3600)

    wf = Workflow("w", [Step("a", lambda s: {"a": 1}), Step("slow", slow)])
    start(store, wf, "r")

    async def main() -> None:
        task = asyncio.create_task(Worker(store, [wf], poll=0.02).aserve())
        deadline = time.monotonic() + WAIT
        while not inside.is_set():
            assert time.monotonic() < deadline, "the worker never started the slow step"
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)

    arun_in_time("aserve cancellation", main(), timeout=WAIT * 2)
    until("the lease to be given back", lambda: loaded(store, "r").owner is None)
    cp = loaded(store, "r")
    assert (cp.step, cp.state) == (0, {"a": 1})


def test_cancelling_aserve_as_its_rest_is_woken_still_stops_it(store: Store) -> None:
    """A cancel that lands just as the rest's wake event is set is not lost.

    On Python 3.11 ``asyncio.wait_for`` returns normally when cancelled in the same turn
    as the awaited event is set; a rest written with it swallowed the cancel and the
    worker served on (a flaky hang of the test above on SQLite, whose listener rings on
    every commit). Here the two are made to coincide on purpose.
    """
    resting = threading.Event()
    previous = _hooks.installed()

    def hook(point: str) -> None:
        if point == "worker.resting":
            resting.set()
        if previous is not None:
            previous(point)

    async def main() -> None:
        worker = Worker(store, [Workflow("w", [Step("a", lambda s: None)])], poll=30)
        task = asyncio.create_task(worker.aserve())
        deadline = time.monotonic() + WAIT
        while not resting.is_set():
            assert time.monotonic() < deadline, "the worker never began to rest"
            await asyncio.sleep(0.01)
        for _ in range(5):  # let the rest reach its await on the wake event
            await asyncio.sleep(0)
        wake = worker._async_wake  # the event the rest awaits
        assert wake is not None, "aserve published no wake event"
        wake[1].set()
        task.cancel()  # in the same turn: the rest's await has not resumed yet
        done, _ = await asyncio.wait({task}, timeout=WAIT)
        if not done:
            worker.stop()
            await asyncio.wait({task}, timeout=WAIT)
            pytest.fail("aserve lost its cancel: it kept serving after task.cancel()")
        assert task.cancelled(), "aserve ended without raising CancelledError"

    _hooks.install(hook)
    try:
        arun_in_time("aserve cancelled during a wake-up", main(), timeout=WAIT * 3)
    finally:
        _hooks.install(previous)


def test_serve_returns_after_grace_with_a_stuck_step(store: Store) -> None:
    """stop() on a worker whose step outlasts the grace returns from serve after the grace."""
    inside = threading.Event()
    release = threading.Event()

    def stuck(state: State) -> State:
        inside.set()
        release.wait(WAIT)
        return {"x": 1}

    wf = Workflow("w", [Step("stuck", stuck), Step("b", lambda s: {"b": 2})])
    start(store, wf, "r")
    worker = Worker(store, [wf], poll=0.02, grace=0.2)
    serving = _Serving(worker)
    try:
        assert inside.wait(WAIT), "the worker never started the step"
        worker.stop()
        # serve returned while the step is still stuck (release is not set yet).
        serving.join(WAIT)
        assert not release.is_set()
    finally:
        release.set()
    # The step that outlived the grace still completes and hands the run over.
    until("the stuck step to be saved", lambda: loaded(store, "r").step == 0)
    until("the run to be handed over", lambda: loaded(store, "r").owner is None)
