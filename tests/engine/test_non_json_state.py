"""A step that returns a state that is not JSON fails its run, once, with the path named.

Such a state can never be saved, so retrying it (or a worker claiming the run again)
only repeats the failure: ``run``, ``arun`` and a ``Worker`` record the failure on the
run (status ``failed``, the error naming the path of the value that is not JSON) and
stop, the last checkpoint left as it was.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import QUICK_BACKENDS, fresh_config
from stepstone import (
    InvalidState,
    RetryPolicy,
    Step,
    StepFailed,
    Store,
    Worker,
    Workflow,
    arun,
    open_store,
    run,
    start,
)
from stepstone.testing._barrier import WAIT_TIMEOUT
from waiting import until

State = dict[str, Any]
BACKENDS = QUICK_BACKENDS
#: Where the value that is not JSON sits in the state the bad step returns.
BAD_PATH = "state['report']['tags'][1]"


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend."""
    with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


class _Steps:
    """A good step, then one returning a set inside the state; counts the bad one's calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def good(self, state: State) -> State:
        return {"a": 1}

    def bad(self, state: State) -> State:
        with self._lock:
            self.calls += 1
        return {"report": {"tags": ["ok", {"a", "b"}]}}

    def steps(self) -> list[Step]:
        return [
            Step("good", self.good),
            Step("bad", self.bad, retry=RetryPolicy(max_attempts=5, initial_delay=0.01)),
        ]


def _assert_failed_once(store: Store, run_id: str, steps: _Steps) -> None:
    cp = store.load(run_id)
    assert cp is not None
    assert cp.status == "failed", f"the run was left {cp.status}"
    assert cp.step == 0 and cp.state == {"a": 1}, "the last checkpoint changed"
    assert cp.owner is None, "the failed run kept its lease"
    failure = cp.failure
    assert failure is not None and failure.step_name == "bad"
    assert failure.error_type == "InvalidState"
    assert BAD_PATH in failure.message, failure.message
    assert steps.calls == 1, f"the step ran {steps.calls} times: a non-JSON state was retried"


def _check_raised(info: pytest.ExceptionInfo[StepFailed]) -> None:
    cause = info.value.__cause__
    assert isinstance(cause, InvalidState), cause
    assert cause.path == BAD_PATH


def test_run_records_the_failure_and_names_the_path(store: Store) -> None:
    """``run`` fails the run (StepFailed from InvalidState), recorded, without retrying."""
    steps = _Steps()
    with pytest.raises(StepFailed) as info:
        run("r", steps.steps(), store)
    _check_raised(info)
    _assert_failed_once(store, "r", steps)


def test_arun_records_the_failure_and_names_the_path(store: Store) -> None:
    """``arun`` fails the run (StepFailed from InvalidState), recorded, without retrying."""
    steps = _Steps()

    async def main() -> None:
        await arun("r", steps.steps(), store)

    with pytest.raises(StepFailed) as info:
        asyncio.run(main())
    _check_raised(info)
    _assert_failed_once(store, "r", steps)


def test_a_worker_fails_the_run_once(store: Store) -> None:
    """Under a ``Worker`` the run ends failed after one call; it is not claimed again."""
    steps = _Steps()
    flow = Workflow("not-json", steps.steps(), version="1")
    start(store, flow, "w")
    worker = Worker(store, [flow], concurrency=1, poll=0.05)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            worker.serve()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:

        def failed() -> bool:
            cp = store.load("w")
            return cp is not None and cp.status == "failed"

        until("the worker to fail the run", failed)
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "the worker did not stop"
    assert not errors, errors
    _assert_failed_once(store, "w", steps)
