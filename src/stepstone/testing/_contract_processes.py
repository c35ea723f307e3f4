"""``ProcessContract``: other threads, tasks and processes on one store, and real crashes.

Racing saves on one run (threads or tasks in one process, then processes), processes
writing their own runs, a fresh process reopening the store, and child processes killed
by ``os._exit`` or SIGKILL at chosen points then resumed by a fresh one
(``stepstone.testing._child``).
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .._checkpoint import Checkpoint
from . import _barrier, _workers
from ._base import ContractBase, child_env, cp
from ._ops import Ops

__all__ = ["ProcessContract"]


class ProcessContract(ContractBase):
    """Threads, tasks, processes and real crashes on one store; mixed into ``StoreContract``."""

    def test_reopen_in_new_process(self, ops: Ops, store_config: str) -> None:
        """A fresh process opening the same config string sees what was saved."""
        self.need_durable(ops.store)
        ops.save(cp("r/1", 1, {"from": "parent"}))
        code = (
            "import asyncio, json, sys, stepstone\n"
            "store = stepstone.open_store(sys.argv[1])\n"
            "cp = store.load('r/1') if sys.argv[2] == 'sync' else asyncio.run(store.aload('r/1'))\n"
            "print(json.dumps([cp.step, cp.state]))\n"
        )
        done = _barrier.run_child(
            [sys.executable, "-c", code, store_config, ops.mode], "reopen", env=child_env()
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [1, {"from": "parent"}]

    def test_racing_one_run_in_one_process(self, ops: Ops, store_config: str) -> None:
        """Threads (sync) or tasks on one loop (async) saving on one version: one wins a round."""
        ops.save(Checkpoint(run_id="race", step=-1, state={"wins": []}))
        rounds, workers = 8, 4
        if ops.is_async:
            results = ops.aio(_workers.race_tasks(ops.store, "race", rounds, workers))
        else:
            barrier = threading.Barrier(workers)
            found: queue.Queue[tuple[int, int, bool]] = queue.Queue()
            if self.is_durable(ops.store):
                # Each thread opens its own store, as separate workers in one process do.
                threads = [
                    _barrier.Worker(
                        f"racer-{w}",
                        _workers.race_one_run,
                        store_config,
                        "race",
                        rounds,
                        w,
                        barrier,
                        found,
                    )
                    for w in range(workers)
                ]
            else:  # each open of memory:// is a new store; share this one
                threads = [
                    _barrier.Worker(
                        f"racer-{w}",
                        _workers.race_rounds,
                        ops.store,
                        "race",
                        rounds,
                        w,
                        barrier,
                        found.put,
                    )
                    for w in range(workers)
                ]
            for t in threads:
                t.start()
            _barrier.join_threads(threads, _barrier.PROCESS_TIMEOUT)
            results = [found.get_nowait() for _ in range(rounds * workers)]
        self._check_race(ops, results, rounds)

    @staticmethod
    def _check_race(ops: Ops, results: list[tuple[int, int, bool]], rounds: int) -> None:
        winners = {r: w for r, w, ok in results if ok}
        wins_per_round = Counter(r for r, _, ok in results if ok)
        assert all(wins_per_round[r] == 1 for r in range(rounds)), wins_per_round
        final = ops.load("race")
        assert final is not None
        assert final.state["wins"] == [winners[r] for r in range(rounds)]
        assert final.step == rounds - 1

    def test_processes_racing_one_run(self, ops: Ops, store_config: str) -> None:
        """Processes saving on top of the same version: exactly one wins each round."""
        self.need_durable(ops.store)
        ops.save(Checkpoint(run_id="race", step=-1, state={"wins": []}))
        rounds, workers = 6, self.processes
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(workers)
        results = ctx.Queue()
        procs = {
            f"racer-{w}": ctx.Process(
                target=_workers.race_one_run,
                args=(store_config, "race", rounds, w, barrier, results, ops.mode),
            )
            for w in range(workers)
        }
        for p in procs.values():
            p.start()
        collected = _barrier.collect(results, rounds * workers, procs)
        for name, p in procs.items():
            _barrier.join_process(p, name)
        self._check_race(ops, collected, rounds)

    def test_processes_writing_different_runs(self, ops: Ops, store_config: str) -> None:
        """Many processes running their own runs into one store lose no checkpoint."""
        self.need_durable(ops.store)
        per_process = 5
        ctx = multiprocessing.get_context("spawn")
        procs = {
            f"writer-{w}": ctx.Process(
                target=_workers.run_many, args=(store_config, f"p{w}", per_process, ops.mode)
            )
            for w in range(self.processes)
        }
        for p in procs.values():
            p.start()
        for name, p in procs.items():
            _barrier.join_process(p, name)
        expected = {f"p{w}-{i}" for w in range(self.processes) for i in range(per_process)}
        assert set(ops.list_runs()) == expected
        for run_id in expected:
            loaded = ops.load(run_id)
            assert loaded is not None
            assert loaded.state == {"a": 1, "b": 2, "c": 3}
            assert loaded.status == "done"

    # -- real crashes ----------------------------------------------------------------

    @pytest.fixture
    def crashes(self, ops: Ops, store_config: str, tmp_path: Path) -> Crashes:
        """The crash tests' child processes (durable stores only: others skip)."""
        self.need_durable(ops.store)
        return Crashes(ops, store_config, tmp_path)

    @pytest.mark.crash
    @pytest.mark.parametrize("how", ["exit", "sigkill"])
    def test_crash_inside_step_resumes(self, crashes: Crashes, how: str) -> None:
        """A process killed inside step b resumes in a fresh process running only b and c."""
        died = crashes.child("crash", kill={"how": how, "step": "b", "at": "inside"})
        assert died.returncode == (3 if how == "exit" else -9), died.stderr
        assert crashes.effects("crash") == ["a", "b"]
        crashes.resumes_to_the_end("crash")
        assert crashes.effects("crash") == ["a", "b", "b", "c"]

    @pytest.mark.crash
    def test_crash_after_step_before_save_reruns_it_once(self, crashes: Crashes) -> None:
        """Killed after b returned but before its checkpoint: b runs again, once."""
        kill = {"how": "sigkill", "step": "b", "at": "runner.after_step"}
        died = crashes.child("after", kill=kill)
        assert died.returncode == -9, died.stderr
        loaded = crashes.ops.load("after")
        assert loaded is not None and loaded.step == 0 and loaded.state == {"a": 1, "last": "a"}
        crashes.resumes_to_the_end("after")
        assert crashes.effects("after") == ["a", "b", "b", "c"]

    @pytest.mark.crash
    def test_crash_inside_save_keeps_a_whole_checkpoint(self, crashes: Crashes) -> None:
        """Killed at each kill point inside b's save: the next load is the old or new checkpoint."""
        points = self.kill_points(crashes.ops.store)
        if not points:
            pytest.skip(f"{type(crashes.ops.store).__name__} declares no kill points inside a save")
        for point, new_visible in points.items():
            run_id = f"save-{point}"
            died = crashes.child(run_id, kill={"how": "sigkill", "step": "b", "at": point})
            assert died.returncode == -9, (point, died.stdout, died.stderr)
            loaded = crashes.ops.load(run_id)
            assert loaded is not None, point
            if new_visible:
                assert (loaded.step, loaded.state) == (1, {"a": 1, "b": 2, "last": "b"}), point
            else:
                assert (loaded.step, loaded.state) == (0, {"a": 1, "last": "a"}), point
            crashes.resumes_to_the_end(run_id)
            expected_b = 1 if new_visible else 2
            assert crashes.effects(run_id).count("b") == expected_b, point

    @pytest.mark.crash
    def test_attempt_count_survives_a_crash(self, crashes: Crashes) -> None:
        """A process killed between attempts resumes with the attempt count it had."""
        # b fails on attempt 1, and the process dies during the backoff before attempt 2.
        kill = {"how": "sigkill", "step": "b", "at": "runner.backoff"}
        spec: dict[str, Any] = {"fail": {"b": 1}, "retry": {"b": 3}}
        died = crashes.child("retry", kill=kill, **spec)
        assert died.returncode == -9, died.stderr
        loaded = crashes.ops.load("retry")
        assert loaded is not None and loaded.attempt == 1 and loaded.failure is not None
        resumed = crashes.child("retry", **spec)
        assert resumed.returncode == 0, resumed.stderr
        assert crashes.log("retry").read_text().splitlines() == ["a 1", "b 1", "b 2", "c 1"]

    @pytest.mark.crash
    def test_crash_loop_stops_at_max_attempts(self, crashes: Crashes) -> None:
        """A step that kills its process every time stops after max_attempts, not forever."""
        kill = {"how": "sigkill", "step": "b", "at": "inside"}
        for _ in range(2):
            died = crashes.child("loop", kill=kill, retry={"b": 2})
            assert died.returncode == -9, died.stderr
        final = crashes.child("loop", kill=kill, retry={"b": 2})
        assert final.returncode == 1, final.stderr
        assert json.loads(final.stdout) == {"failed": "b", "attempt": 2}
        assert crashes.effects("loop") == ["a", "b", "b"]


class Crashes:
    """Child processes running the steps a, b, c of a run on the store, killed or not.

    Each is ``stepstone.testing._child``; a step's effects are logged, one line per
    call (``<step> <attempt>``), in a file per run under the test's ``tmp_path``.
    """

    def __init__(self, ops: Ops, store_config: str, tmp_path: Path) -> None:
        self.ops = ops
        self.store_config = store_config
        self.tmp_path = tmp_path

    def child(self, run_id: str, **spec: Any) -> Any:
        """Run a child process on ``run_id`` (``spec``: a kill, failures, retries)."""
        spec = {
            "config": self.store_config,
            "run_id": run_id,
            "mode": self.ops.mode,
            "steps": spec.pop("steps", ["a", "b", "c"]),
            "effects": str(self.log(run_id)),
            **spec,
        }
        return _barrier.run_child(
            [sys.executable, "-m", "stepstone.testing._child", json.dumps(spec)],
            f"_child {run_id!r} ({self.ops.mode}, kill={spec.get('kill')})",
            env=child_env(),
        )

    def resumes_to_the_end(self, run_id: str) -> None:
        """A fresh child resumes ``run_id`` and finishes the three steps a, b, c."""
        resumed = self.child(run_id)
        assert resumed.returncode == 0, (run_id, resumed.stderr)
        assert json.loads(resumed.stdout) == {"a": 1, "b": 2, "c": 3, "last": "c"}

    def log(self, run_id: str) -> Path:
        """The file ``run_id``'s children log their steps' effects in."""
        return self.tmp_path / f"effects-{abs(hash(run_id))}.log"

    def effects(self, run_id: str) -> list[str]:
        """The steps that ran for ``run_id``, in order, one per call (none: ``[]``)."""
        path = self.log(run_id)
        if not path.exists():
            return []
        return [line.split()[0] for line in path.read_text().splitlines()]
