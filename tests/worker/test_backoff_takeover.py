"""A run whose owner dies during a retry's backoff is taken over, not stranded.

A retried failure is saved with the failure and the owner's lease kept (the owner waits
out the backoff, renewing). Such a run is still ``running``: a worker that finds its
owner gone (no renewal for a whole lease) takes it over and retries the step, and a Map
parent does not mistake a retrying child for a failed one. Only a final failure, saved
with the lease given back, is ``failed``.
"""

from __future__ import annotations

import signal as signals
import uuid
from pathlib import Path
from typing import Any

import pytest

from child_process import reap, spawn
from fresh_stores import DURABLE_BACKENDS, fresh_config
from stepstone import RetryPolicy, Step, Workflow, open_store
from stepstone._checkpoint import Checkpoint, Failure, utcnow
from waiting import status_of, until
from worker_support import serving

State = dict[str, Any]
MODES = ("sync", "async")

# The owner: a Worker serving one run whose step fails on its first attempt; the worker
# dies by SIGKILL at the runner's backoff point, after the retried failure was saved.
_OWNER = r"""
import os, signal, sys
from pathlib import Path
from stepstone import RetryPolicy, Step, Worker, Workflow, _hooks, open_store, start

config, run_id, marks = sys.argv[1:4]

def flaky(state):
    with open(marks, "a") as f:
        f.write("x")
    if len(Path(marks).read_text()) == 1:
        raise RuntimeError("the first attempt fails")
    return {"ok": True}

workflow = Workflow(
    "flaky", [Step("flaky", flaky, retry=RetryPolicy(max_attempts=3, initial_delay=30))]
)

def hook(point):
    if point == "runner.backoff":
        os.kill(os.getpid(), signal.SIGKILL)

_hooks.install(hook)
store = open_store(config)
start(store, workflow, run_id, {})
Worker(store, [workflow], lease=1, poll=0.05).serve()
sys.exit("the worker was never killed in the backoff")
"""


def _flaky_here(marks: Path) -> Workflow:
    """The owner's workflow, for the worker that takes over (same step, same marks)."""

    def flaky(state: State) -> State:
        with marks.open("a") as f:
            f.write("x")
        return {"ok": True}

    policy = RetryPolicy(max_attempts=3, initial_delay=30)
    return Workflow("flaky", [Step("flaky", flaky, retry=policy)])


@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", DURABLE_BACKENDS)
def test_an_owner_killed_in_a_backoff_is_taken_over(
    kind: str, mode: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A worker SIGKILLed while it waits out a retry's backoff leaves a run that is due.

    The stored run is ``running`` (failure recorded, owner kept), it is in the claim
    index, and a worker in another process takes it over and finishes it: the step ran
    once in the dead owner and once more after the takeover.
    """
    config = fresh_config(kind, request, tmp_path)
    run_id = f"backoff-{uuid.uuid4().hex[:8]}"
    marks = tmp_path / "marks"
    code, err = reap(spawn(_OWNER, config, run_id, str(marks)), "the owner")
    assert code == -signals.SIGKILL, (
        f"the owner was not killed in the backoff: {code} {err[-2000:]}"
    )
    with open_store(config) as store:
        cp = store.load(run_id)
        assert cp is not None and cp.failure is not None and cp.owner is not None
        assert cp.status == "running", "a run waiting out a retry is not failed"
        assert run_id in {info.run_id for info in store.claimable(utcnow())}
    with (
        serving(config, [_flaky_here(marks)], mode, poll=0.05, lease=1),
        open_store(config) as store,
    ):
        until(
            f"a worker to take over and finish {run_id}", lambda: status_of(store, run_id) == "done"
        )
        done = store.load(run_id)
    assert done is not None and done.state == {"ok": True} and done.failure is None
    assert marks.read_text() == "xx", "the step ran once before the kill and once after"


def test_only_a_released_failure_is_failed() -> None:
    """A failure with an owner is a retry in progress (running); without one it is failed."""
    failure = Failure(0, "s", "E", "m", 1, utcnow())
    base = Checkpoint(run_id="r", state={}, step=-1, total_steps=2, failure=failure)
    assert base.status == "failed"
    owned = Checkpoint(
        run_id="r", state={}, step=-1, total_steps=2, failure=failure, owner="w", lease=1.0
    )
    assert owned.status == "running"
