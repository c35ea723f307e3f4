"""A run's kept saves (``stepstone.history``), ``fork`` and ``rerun``, on every backend.

- a run of ``Workflow(history=True)`` lists every save, oldest first, with what changed;
- ``fork`` starts a new run from the state after a step; the original is untouched;
- ``rerun`` rewinds a failed run to before a step, with a patch, and only the steps
  from there run again;
- a run without history, an unknown step, a live owner: each a clear error;
- a process killed in the middle of a run keeps a history a fresh process reads and
  extends.

Backends as in ``tests/engine/test_upgrades.py``; Cosmos DB holds no pieces, so it refuses.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from child_process import TESTS
from fresh_stores import BACKENDS, fresh_config
from stepstone import (
    HistoryNotKept,
    Step,
    StepFailed,
    StepNotKept,
    Store,
    Workflow,
    open_store,
)

SRC = str(Path(stepstone.__file__).resolve().parents[1])
#: Where a child finds this module and the helper modules it imports.
CHILD_PATH = os.pathsep.join([TESTS, str(Path(__file__).resolve().parent)])
State = dict[str, Any]

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

#: What each step was called with, in order: (step index, the state's "bad" flag).
CALLS: list[tuple[int, bool]] = []


def _step(i: int) -> Any:
    def fn(state: State) -> State:
        CALLS.append((i, bool(state.get("bad"))))
        if i == 2 and state.get("bad"):
            raise RuntimeError("step 2 refuses a bad state")
        return {**state, f"s{i}": i * 10, "log": [*state.get("log", []), "m" * 3000]}

    return fn


def workflow(history: bool = True) -> Workflow:
    """Four steps; step 2 fails while the state says ``bad``; the log grows 3 KB a step."""
    return Workflow("hist", [Step(f"s{i}", _step(i)) for i in range(4)], history=history)


def _expected(upto: int, bad: bool = False) -> State:
    state: State = {"bad": bad} if bad else {}
    for i in range(upto + 1):
        state = {**state, f"s{i}": i * 10, "log": [*state.get("log", []), "m" * 3000]}
    return state


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend that holds pieces."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture
def store(config: str) -> Iterator[Store]:
    with open_store(config) as opened:
        yield opened


@pytest.fixture(params=("sync", "async"))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _run(store: Store, run_id: str, mode: str, **kw: Any) -> State:
    if mode == "async":
        result: State = asyncio.run(stepstone.arun(run_id, workflow(), store, **kw))
        return result
    return stepstone.run(run_id, workflow(), store, **kw)


def _history(store: Store, run_id: str, mode: str) -> list[stepstone.HistoryEntry]:
    if mode == "async":
        return asyncio.run(stepstone.ahistory(store, run_id))
    return stepstone.history(store, run_id)


def test_every_save_is_listed_oldest_first(store: Store, mode: str) -> None:
    """The start, each step's save and the end: steps, statuses, sizes, what changed."""
    assert _run(store, "r", mode) == _expected(3)
    entries = _history(store, "r", mode)
    assert [e.step for e in entries] == [-1, 0, 1, 2, 3]
    assert [e.step_names for e in entries][-1] == ("s0", "s1", "s2", "s3")
    assert entries[-1].status == "done" and entries[0].status == "running"
    sizes = [e.size for e in entries]
    assert sizes == sorted(sizes) and sizes[-1] > 4 * 3000
    # Once the state is long (past 8 KiB, in pieces), a save names what it changed.
    assert "append to log" in entries[-1].changes and "set s3" in entries[-1].changes
    times = [e.at for e in entries]
    assert all(t is not None for t in times) and times == sorted(times)  # type: ignore[type-var]


@pytest.mark.slow
def test_a_long_history_is_read_in_a_few_round_trips(store: Store) -> None:
    """300 saves kept: ``history`` lists the keys once and fetches the records in
    batches of ``RECORD_BATCH``, not one request per record."""
    from stepstone import _history

    steps = [Step(f"t{i}", _step(100 + i)) for i in range(300)]
    stepstone.run("many", Workflow("many", steps, history=True), store)
    calls: list[int] = []
    fetch = store.pieces

    def counting(run_id: str, keys: Any) -> dict[str, bytes]:
        calls.append(len(keys))
        return fetch(run_id, keys)

    store.pieces = counting  # type: ignore[method-assign]
    try:
        entries = stepstone.history(store, "many")
    finally:
        del store.pieces
    assert [e.step for e in entries] == list(range(-1, 300))
    batches = -(-len(entries) // _history.RECORD_BATCH)
    assert len(calls) == batches and max(calls) <= _history.RECORD_BATCH, calls


def test_fork_starts_a_new_run_from_the_state_after_a_step(store: Store, mode: str) -> None:
    """The fork holds the state after step 1 and runs steps 2 and 3 only; r is untouched."""
    _run(store, "r", mode)
    before = store.load("r")
    if mode == "async":
        forked = asyncio.run(stepstone.afork(store, "r", 1, "r-fork"))
    else:
        forked = stepstone.fork(store, "r", 1, "r-fork")
    assert forked.step == 1 and forked.state == _expected(1)
    CALLS.clear()
    assert _run(store, "r-fork", mode) == _expected(3)
    assert [i for i, _ in CALLS] == [2, 3]
    after = store.load("r")
    assert before is not None and after is not None and after.version == before.version
    # The fork keeps history of its own, from the fork on (queued, claimed, steps 2, 3).
    forked_history = _history(store, "r-fork", mode)
    assert [e.step for e in forked_history] == [1, 1, 2, 3]
    assert forked_history[0].status == "queued" and forked_history[-1].status == "done"
    with pytest.raises(stepstone.ConflictError, match="already exists"):
        stepstone.fork(store, "r", 0, "r-fork")


def test_rerun_rewinds_a_failed_run_with_a_patch(store: Store, mode: str) -> None:
    """A run failed at step 2; rerun from 2 with the flag patched runs 2 and 3 only."""
    with pytest.raises(StepFailed):
        _run(store, "r", mode, input={"bad": True})
    failed = store.load("r")
    assert failed is not None and failed.status == "failed"
    if mode == "async":
        rewound = asyncio.run(stepstone.arerun(store, "r", 2, patch={"bad": False}))
    else:
        rewound = stepstone.rerun(store, "r", 2, patch={"bad": False})
    assert rewound.step == 1 and rewound.failure is None and rewound.attempt == 0
    assert rewound.state == {**_expected(1, bad=True), "bad": False}
    CALLS.clear()
    assert _run(store, "r", mode) == {**_expected(3, bad=True), "bad": False}
    assert CALLS == [(2, False), (3, False)]
    statuses = [e.status for e in _history(store, "r", mode)]
    assert "failed" in statuses and statuses[-1] == "done"


def test_rerun_from_step_0_with_a_new_input(store: Store) -> None:
    """``input=`` replaces the input (from step 0 only); every step runs again."""
    with pytest.raises(StepFailed):
        stepstone.run("r", workflow(), store, input={"bad": True})
    with pytest.raises(StepNotKept, match="only from step 0"):
        stepstone.rerun(store, "r", 1, input={"bad": False})
    rewound = stepstone.rerun(store, "r", 0, input={"fresh": 1})
    assert rewound.step == -1 and rewound.state == {"fresh": 1} and rewound.input == {"fresh": 1}
    CALLS.clear()
    assert stepstone.run("r", workflow(), store, input={"fresh": 1}) == {
        "fresh": 1,
        **_expected(3),
    }
    assert [i for i, _ in CALLS] == [0, 1, 2, 3]


def test_refusals_say_what_is_wrong(store: Store) -> None:
    """No history kept, a step with no save, a step past the run's end, both state= and patch=."""
    stepstone.run("plain", workflow(history=False), store)
    with pytest.raises(HistoryNotKept, match=r"history=True"):
        stepstone.history(store, "plain")
    with pytest.raises(stepstone.RunNotFound):
        stepstone.history(store, "nobody")
    with pytest.raises(StepFailed):
        stepstone.run("r", workflow(), store, input={"bad": True})
    before = store.load("r")
    with pytest.raises(StepNotKept, match=r"no kept save after step 2.*\[-1, 0, 1\]"):
        stepstone.fork(store, "r", 2, "x")
    with pytest.raises(StepNotKept, match="would skip a step that never ran"):
        stepstone.rerun(store, "r", 3)
    with pytest.raises(StepNotKept, match="not both"):
        stepstone.rerun(store, "r", 1, state={}, patch={})
    # Nothing was changed by the refusals. (A live owner's: tests/worker/test_rerun_owner.py.)
    assert store.load("r") == before


@pytest.mark.process
@pytest.mark.parametrize("config", BACKENDS[1:], indirect=True)  # a memory store is per process
def test_the_cli_lists_forks_and_reruns(config: str, tmp_path: Path) -> None:
    """``stepstone runs history|fork|rerun``: a table, JSON, and the same effects."""
    with open_store(config) as store, pytest.raises(StepFailed):
        stepstone.run("r", workflow(), store, input={"bad": True})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "stepstone", "runs", *args, "--store", config],
            env={**os.environ, "PYTHONPATH": SRC},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    shown = cli("history", "r")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:3] == ["STEP", "NAME", "AT"] and len(lines) == 1 + 4
    listed = cli("history", "r", "--json")
    assert listed.returncode == 0, listed.stderr
    import json

    assert [e["step"] for e in json.loads(listed.stdout)] == [-1, 0, 1, 1]
    bad = cli("rerun", "r", "2", "--patch", "[1]")
    assert bad.returncode == 2 and "JSON object" in bad.stderr
    missing = cli("fork", "r", "7", "r2")
    assert missing.returncode == 1 and "no kept save after step 7" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert cli("rerun", "r", "2", "--patch", '{"bad": false}').returncode == 0
    assert cli("fork", "r", "0", "r2").returncode == 0
    with open_store(config) as store:
        assert stepstone.run("r", workflow(), store) == {**_expected(3, bad=True), "bad": False}
        forked = store.load("r2")
        assert forked is not None and (forked.step, forked.state) == (0, _expected(0, bad=True))


_CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path[:0] = sys.argv[2].split(os.pathsep)
    import stepstone
    from stepstone import open_store
    import test_history

    def die(state):
        os._exit(9)

    with open_store(sys.argv[1]) as store:
        steps = list(test_history.workflow().steps)
        steps[2] = stepstone.Step("s2", die)
        stepstone.run("crash", stepstone.Workflow("hist", steps, history=True), store)
    """
)


@pytest.mark.crash
@pytest.mark.parametrize("config", BACKENDS[1:], indirect=True)  # memory dies with it
def test_a_run_killed_mid_way_keeps_its_history(config: str) -> None:
    """Killed in step 2 (os._exit): a fresh process reads the history, resumes, extends it."""
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, config, CHILD_PATH],
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=300,
        check=False,
        capture_output=True,
        text=True,
    )
    assert child.returncode == 9, child.stderr[-3000:]
    with open_store(config) as store:
        assert [e.step for e in stepstone.history(store, "crash")] == [-1, 0, 1]
        assert stepstone.run("crash", workflow(), store, lease=0.5) == _expected(3)
        steps = [e.step for e in stepstone.history(store, "crash")]
        assert steps[:3] == [-1, 0, 1] and steps[-2:] == [2, 3]


def test_migrate_carries_the_history_over(config: str, tmp_path: Path) -> None:
    """``stepstone.migrate`` copies a history run's pieces: the copy lists the same saves."""
    from stepstone._migrate import migrate

    with open_store(config) as src, open_store(f"file://{tmp_path}/copy") as dst:
        stepstone.run("r", workflow(), src)
        before = [(e.step, e.status, e.size) for e in stepstone.history(src, "r")]
        report = migrate(src, dst)
        assert report.complete, report.summary()
        after = [(e.step, e.status, e.size) for e in stepstone.history(dst, "r")]
        # The import is a save too: one more record, of the same checkpoint (its state
        # written whole there, so its size is the state's, without a log's overhead).
        assert after[:-1] == before and after[-1][:2] == before[-1][:2]
        assert stepstone.fork(dst, "r", 1, "r-b").state == _expected(1)
        again = migrate(src, dst)  # idempotent: nothing copied twice, nothing lost
        assert again.complete, again.summary()
        assert [(e.step, e.status, e.size) for e in stepstone.history(dst, "r")] == after
