"""``rerun`` of a run whose owner died takes it over; a live owner still blocks it.

Issue 29, item 5: ``rerun`` refused with ``RunOwned`` however long ago the owner's
lease had expired. Now, as ``run`` does, it watches the lease: an owner that writes
nothing for a whole lease (by the caller's clock), or a process of this machine that
no longer exists, is taken over; one that renews meanwhile is refused with a message
saying what to do. Memory, SQLite and PostgreSQL, sync and async.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import stepstone
from child_process import TESTS
from fresh_stores import fresh_config
from stepstone import RunOwned, Step, Store, Workflow, open_store
from stepstone._checkpoint import utcnow

SRC = str(Path(stepstone.__file__).resolve().parents[1])
#: Where a child finds this module and the helper modules it imports.
CHILD_PATH = os.pathsep.join([TESTS, str(Path(__file__).resolve().parent)])
BACKENDS = ("memory", "sqlite", "postgresql")
State = dict[str, Any]
#: Long enough that a test never waits for a takeover it does not expect.
WAIT = 60.0


def _step(i: int) -> Any:
    def fn(state: State) -> State:
        return {**state, f"s{i}": i}

    return fn


def workflow() -> Workflow:
    """Three steps, history kept (``rerun`` needs it)."""
    return Workflow("owned", [Step(f"s{i}", _step(i)) for i in range(3)], history=True)


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend, as ``fresh_stores`` makes one."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture
def store(config: str) -> Iterator[Store]:
    """The store under test."""
    with open_store(config) as opened:
        yield opened


@pytest.fixture(params=("sync", "async"))
def mode(request: pytest.FixtureRequest) -> str:
    """``sync``: rerun; ``async``: arerun."""
    return str(request.param)


def _rerun(store: Store, run_id: str, from_step: int, mode: str) -> stepstone.Checkpoint:
    if mode == "async":
        return asyncio.run(stepstone.arerun(store, run_id, from_step))
    return stepstone.rerun(store, run_id, from_step)


def _abandoned(store: Store, run_id: str, lease: float) -> stepstone.Checkpoint:
    """A finished run made to look held by a process of another machine that stopped."""
    stepstone.run(run_id, workflow(), store)
    done = store.load(run_id)
    assert done is not None
    # Another host's owner (dead_here cannot tell), mid-way through step 2, its lease
    # never renewed again: only watching it for a whole lease shows it is gone.
    stalled = replace(
        done,
        step=1,
        step_names=done.step_names[:2],
        owner="worker:elsewhere:4242:-:0badc0de",
        epoch=done.epoch + 1,
        lease=lease,
        renewed_at=utcnow(),
    )
    held = store.save(stalled)
    assert held.status == "running"
    return held


def test_rerun_takes_over_a_run_whose_lease_expired_unrenewed(store: Store, mode: str) -> None:
    """An owner that wrote nothing for its whole lease no longer blocks rerun."""
    held = _abandoned(store, "stalled", lease=0.3)
    rewound = _rerun(store, "stalled", 1, mode)
    assert rewound.owner is None and rewound.step == 0 and rewound.version != held.version
    assert rewound.queued  # from a Workflow: the workers, or run(), pick it up
    assert stepstone.run("stalled", workflow(), store) == {"s0": 0, "s1": 1, "s2": 2}


def test_a_live_lease_still_blocks_rerun(store: Store, mode: str) -> None:
    """An owner that renews while rerun watches refuses it; the message says what to do."""
    inside, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def slow(state: State) -> State:
        inside.set()
        if not release.wait(WAIT):
            raise AssertionError("the test never released the owner's step")
        return {**state, "s1": 1}

    steps = [Step("s0", _step(0)), Step("s1", slow), Step("s2", _step(2))]

    def owner() -> None:
        # A lease of 1.5 s: the owner renews every ~0.5 s while its step runs.
        outcome["result"] = stepstone.run(
            "live", Workflow("owned", steps, history=True), store, lease=1.5
        )

    thread = threading.Thread(target=owner)
    thread.start()
    try:
        assert inside.wait(WAIT), "the owner never reached its step"
        before = store.load("live")
        with pytest.raises(RunOwned, match=r"is live.*rerun it once it has stopped.*cancel"):
            _rerun(store, "live", 0, mode)
    finally:
        release.set()
        thread.join(WAIT)
    assert not thread.is_alive(), "the owner's run never finished"
    assert outcome["result"] == {"s0": 0, "s1": 1, "s2": 2}  # the refusal changed nothing
    assert before is not None and before.owner is not None


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path[:0] = sys.argv[2].split(os.pathsep)
    import stepstone
    from stepstone import open_store
    import test_rerun_owner

    def die(state):
        os.kill(os.getpid(), signal.SIGKILL)

    with open_store(sys.argv[1]) as store:
        steps = list(test_rerun_owner.workflow().steps)
        steps[1] = stepstone.Step("s1", die)
        # A day's lease: only knowing the owner is dead lets anyone in before then.
        stepstone.run("killed", stepstone.Workflow("owned", steps, history=True), store,
                      lease=86400)
    """
)


@pytest.mark.crash
@pytest.mark.parametrize("config", BACKENDS[1:], indirect=True)  # memory dies with it
def test_rerun_takes_over_at_once_from_a_killed_owner(config: str, mode: str) -> None:
    """A child SIGKILLed while owning the run: rerun (in a fresh store) takes it over at once."""
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, config, CHILD_PATH],
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=300,
        check=False,
        capture_output=True,
        text=True,
    )
    assert child.returncode == -9, child.stderr[-3000:]
    with open_store(config) as store:
        held = store.load("killed")
        assert held is not None and held.owner is not None and held.lease == 86400
        rewound = _rerun(store, "killed", 1, mode)
        assert rewound.owner is None and rewound.step == 0
        assert stepstone.run("killed", workflow(), store) == {"s0": 0, "s1": 1, "s2": 2}
