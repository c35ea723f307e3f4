"""``Worker(max_runs=N)``: claim N executions, let them end, return (``stepstone worker
--max-runs``). None in flight is handed back, as ``stop`` would; the rest stay queued."""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from pathlib import Path
from typing import Any

import pytest

from cli_support import cli
from fresh_stores import QUICK_BACKENDS, store_fixture
from stepstone import InvalidWorkflow, Step, Store, Worker, Workflow, open_store, start
from stepstone._bounds import MAX_RUNS
from stepstone.cli import build_parser
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.worker import _config
from waiting import status_of

State = dict[str, Any]


store = store_fixture(QUICK_BACKENDS)


def _marking(done: list[str]) -> Workflow:
    def mark(state: State) -> State:
        done.append(str(state["n"]))
        return {"marked": True}

    return Workflow("max-runs", [Step("one", dict), Step("mark", mark)], version="1")


def _serve_in_thread(worker: Worker, asynchronous: bool) -> threading.Thread:
    """``serve`` or ``aserve`` in a thread, which ends when the call returns."""
    target = (lambda: asyncio.run(worker.aserve())) if asynchronous else worker.serve
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["serve", "aserve"])
def test_a_worker_claims_max_runs_lets_them_end_and_returns(
    store: Store, concurrency: int, asynchronous: bool
) -> None:
    """Five queued, ``max_runs=3``: serve returns by itself once three are done; two stay
    queued, untouched, and a second worker takes them."""
    done: list[str] = []
    flow = _marking(done)
    for n in range(5):
        start(store, flow, f"r{n}", input={"n": n})
    worker = Worker(store, [flow], concurrency=concurrency, poll=60.0, max_runs=3)
    thread = _serve_in_thread(worker, asynchronous)
    thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "serve did not return after its three runs"
    statuses = sorted(str(status_of(store, f"r{n}")) for n in range(5))
    assert statuses == ["done", "done", "done", "queued", "queued"]
    assert len(done) == 3 and worker.completed == 3 and worker.stopping
    rest = Worker(store, [flow], concurrency=concurrency, poll=60.0, max_runs=2)
    rest.serve()
    assert [status_of(store, f"r{n}") for n in range(5)] == ["done"] * 5


def test_a_worker_with_max_runs_waits_for_the_runs_to_arrive(store: Store) -> None:
    """With nothing queued yet it rests, and returns only after the second run started
    later has ended."""
    done: list[str] = []
    flow = _marking(done)
    worker = Worker(store, [flow], concurrency=2, poll=60.0, max_runs=2)
    thread = _serve_in_thread(worker, asynchronous=False)
    start(store, flow, "first", input={"n": 1})
    start(store, flow, "second", input={"n": 2})
    thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "serve did not return after the two runs started later"
    assert sorted(done) == ["1", "2"]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 1_000_000_001])
def test_max_runs_out_of_range_is_refused_naming_it(store: Store, bad: object) -> None:
    """Not None nor a whole number from 1 up: InvalidWorkflow, which says what is allowed."""
    with pytest.raises(InvalidWorkflow, match=r"max_runs must be None \(no limit\) or an int"):
        Worker(store, [], max_runs=bad)  # type: ignore[arg-type]


def test_the_cli_worker_exits_after_max_runs(tmp_path: Path) -> None:
    """``stepstone worker --max-runs 2`` drives two of three queued runs and exits 0."""
    config = f"sqlite:///{tmp_path}/runs.db"
    module = tmp_path / "max_runs_flows.py"
    module.write_text(
        "from stepstone import Step, Workflow\n"
        "WORKFLOWS = [Workflow('max-runs', [Step('one', lambda s: dict(s)), "
        "Step('mark', lambda s: {'marked': True})], version='1')]\n"
    )
    with open_store(config) as store:
        flow = Workflow("max-runs", [Step("one", dict), Step("mark", dict)], version="1")
        for n in range(3):
            start(store, flow, f"c{n}", input={"n": n})
    result = cli(
        "worker",
        "--workflows",
        "max_runs_flows:WORKFLOWS",
        "--max-runs",
        "2",
        "--store",
        config,
        cwd=module.parent,
    )
    assert result.returncode == 0, result.stderr
    with open_store(config) as store:
        assert sorted(str(status_of(store, f"c{n}")) for n in range(3)) == [
            "done",
            "done",
            "queued",
        ]


def test_the_cli_and_the_worker_take_the_same_bound() -> None:
    """``--max-runs`` accepts what ``Worker(max_runs=)`` accepts, up to the one bound."""
    parser = build_parser()
    top = ["worker", "--workflows", "m:w", "--max-runs"]
    assert parser.parse_args([*top, str(MAX_RUNS)]).max_runs == MAX_RUNS
    assert _config.check_max_runs(MAX_RUNS) == MAX_RUNS
    with pytest.raises(SystemExit) as usage, contextlib.redirect_stderr(io.StringIO()) as err:
        parser.parse_args([*top, str(MAX_RUNS + 1)])
    assert usage.value.code == 2 and str(MAX_RUNS) in err.getvalue()
    with pytest.raises(InvalidWorkflow, match=str(MAX_RUNS)):
        _config.check_max_runs(MAX_RUNS + 1)
