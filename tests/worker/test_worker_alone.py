"""A worker at concurrency 1 drives each run in the thread that claimed it (issue 20).

What the pool gave ``serve`` must still hold without it: ``stop`` returns after the
grace with a step stuck, ``abandon`` then gives the lease back, the lease is renewed
while a step runs, a failure of the loop reaches the caller, and work committed after
a backlog is drained is still heard (the listener policy itself, for serve and
aserve: ``test_listener_policy``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS, fresh_config
from stepstone import Step, Store, Worker, Workflow, open_store, start
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.worker import _claims
from waiting import status_of, until

State = dict[str, Any]


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend, as a config string."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture
def store(config: str) -> Iterator[Store]:
    """The store under test."""
    with open_store(config) as opened:
        yield opened


def _blocking(
    entered: threading.Event,
    release: threading.Event,
    ran_in: list[threading.Thread] | None = None,
) -> Workflow:
    def hold(state: State) -> State:
        if ran_in is not None:
            ran_in.append(threading.current_thread())
        entered.set()
        release.wait(WAIT_TIMEOUT)
        return {"held": True}

    return Workflow("alone-block", [Step("hold", hold)], version="1")


def _serving(worker: Worker) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            worker.serve()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, errors


def test_a_lone_worker_returns_after_the_grace_and_abandons(store: Store) -> None:
    """With its one run stuck in a step, serve returns after the grace; abandon gives it back."""
    entered, release = threading.Event(), threading.Event()
    ran_in: list[threading.Thread] = []
    flow = _blocking(entered, release, ran_in)
    start(store, flow, "stuck")
    worker = Worker(store, [flow], concurrency=1, poll=0.05, grace=0.2)
    thread, errors = _serving(worker)
    try:
        assert entered.wait(WAIT_TIMEOUT), "the worker never ran the step"
        worker.stop()
        thread.join(WAIT_TIMEOUT)
        assert not thread.is_alive(), "serve did not return after the grace"
        assert not errors
        assert worker.abandon(WAIT_TIMEOUT) == ["stuck"]
        cp = store.load("stuck")
        assert cp is not None and cp.owner is None, "the lease was not given back"
    finally:
        release.set()
        # The abandoned step goes on in the worker's thread: once released, it finds its
        # lease lost and logs so. Wait for it here, while the store is open and the log
        # captured, not after the test (a write to a closed stream, a closed store).
        for left in ran_in:
            left.join(WAIT_TIMEOUT)
            assert not left.is_alive(), f"the abandoned step's thread {left.name} did not end"


def test_a_lone_worker_renews_the_lease_of_the_run_it_drives(store: Store) -> None:
    """While the run's step runs in the serving thread, its lease is renewed."""
    entered, release = threading.Event(), threading.Event()
    flow = _blocking(entered, release)
    start(store, flow, "renewed")
    worker = Worker(store, [flow], concurrency=1, poll=0.05, lease=1.0)
    thread, errors = _serving(worker)
    try:
        assert entered.wait(WAIT_TIMEOUT), "the worker never ran the step"
        first = store.load("renewed")
        assert first is not None and first.renewed_at is not None

        def renewed() -> bool:
            cp = store.load("renewed")
            return cp is not None and cp.renewed_at != first.renewed_at

        until("the lease to be renewed", renewed)
        release.set()
        until("the run to finish", lambda: status_of(store, "renewed") == "done")
    finally:
        release.set()
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive() and not errors


def test_a_failure_of_the_lone_loop_reaches_the_caller(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the claim loop does not handle is raised by serve, as under the pool."""
    worker = Worker(store, [_blocking(threading.Event(), threading.Event())], concurrency=1)

    def broken(asynchronous: bool) -> Iterator[Any]:
        raise RuntimeError("loop broke")
        yield  # a generator, as Claims.serving is

    monkeypatch.setattr(worker._claims, "serving", broken)
    with pytest.raises(RuntimeError, match="loop broke"):
        worker.serve()


def test_a_lone_worker_hears_work_after_a_backlog(
    store: Store, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After draining a backlog it finds a run started later at once, poll and back-off at 60 s."""
    monkeypatch.setattr(_claims, "_QUICK", 60.0)
    done: list[str] = []

    def mark(state: State) -> State:
        done.append("x")
        return {}

    flow = Workflow("alone-quick", [Step("mark", mark)], version="1")
    for index in range(3):
        start(store, flow, f"backlog-{index}")
    worker = Worker(store, [flow], concurrency=1, poll=60.0)
    thread, errors = _serving(worker)
    try:
        until("the backlog to be drained", lambda: len(done) >= 3)
        if store.pushes_wakeups:
            # Opened at the first idle rest; from then on every commit is heard.
            until("the worker to listen", lambda: worker._claims.pushed)
            # As another process would: this store's doorbell is not rung.
            with open_store(config) as other:
                start(other, flow, "later")
        else:
            start(store, flow, "later")  # rings the doorbell the worker subscribed to
        until("the run started later to finish", lambda: status_of(store, "later") == "done")
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive() and not errors
