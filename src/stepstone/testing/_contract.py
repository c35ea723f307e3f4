"""``StoreContract``: the behaviour every backend must show, written once as tests."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import pytest

from .._checkpoint import Checkpoint, Failure, utcnow
from .._errors import (
    ConflictError,
    InvalidRunId,
    InvalidState,
    StepFailed,
    WorkflowChanged,
)
from .._registry import open_store
from .._runner import RetryPolicy, Step, StepContext, run
from .._store import Store
from . import _workers

__all__ = ["AWKWARD_RUN_IDS", "StoreContract", "backend_unavailable"]

#: Run ids that break naive backends: path tricks, URL syntax, case, length, Unicode.
AWKWARD_RUN_IDS = (
    "plain",
    "Plain",
    "PLAIN",
    "a/b",
    "/",
    "..",
    "../x",
    "./x",
    "a\\b",
    "#",
    "?q=1",
    "%",
    "%2F",
    "a%2fb",
    "with space",
    " leading and trailing ",
    "ü",
    "u\u0308",
    "日本語の実行",
    "emoji-\U0001f680",
    "~tilde",
    "!bang",
    ".hidden",
    "x.json",
    "x.lock",
    ".tmp-x",
    "CON",
    "'; DROP TABLE x; --",
    "x" * 1024,
    "é" * 1024,
    "/" * 1024,
)

BAD_RUN_IDS: tuple[object, ...] = (
    "",
    "x" * 1025,
    "a\x00b",
    "line\nbreak",
    "tab\t",
    "\x7f",
    5,
    None,
)

BAD_STATES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("set", {"docs": [{"when": {1, 2}}]}, "state['docs'][0]['when']"),
    ("bytes", {"blob": b"x"}, "state['blob']"),
    ("nan", {"score": float("nan")}, "state['score']"),
    ("inf", {"nested": {"x": [1.0, float("inf")]}}, "state['nested']['x'][1]"),
    ("int key", {"map": {1: "one"}}, "state['map'][1]"),
    ("tuple", {"pair": (1, 2)}, "state['pair']"),
    ("object", {"obj": object()}, "state['obj']"),
    ("surrogate", {"s": ["ok", "bad\ud800"]}, "state['s'][1]"),
)


def backend_unavailable(reason: str) -> NoReturn:
    """Skip a backend's tests loudly, or fail them when CI demands every backend.

    CI sets ``STEPSTONE_REQUIRE_BACKENDS=1``; then a missing server is a failure, so a
    backend can never vanish from CI as a quiet skip.
    """
    message = f"BACKEND UNAVAILABLE: {reason}"
    if os.environ.get("STEPSTONE_REQUIRE_BACKENDS") == "1":
        pytest.fail(message + " (STEPSTONE_REQUIRE_BACKENDS=1: every backend must run)")
    pytest.skip(message)


def _cp(run_id: str, step: int = 0, state: dict[str, Any] | None = None, **kw: Any) -> Checkpoint:
    names = kw.pop("step_names", tuple(f"s{i}" for i in range(step + 1)))
    return Checkpoint(run_id=run_id, step=step, state=state or {"n": step}, step_names=names, **kw)


def _add(name: str, value: Any, log: list[str] | None = None) -> Step:
    def fn(state: dict[str, Any]) -> dict[str, Any]:
        if log is not None:
            log.append(name)
        return {name: value}

    return Step(name, fn)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


class StoreContract:
    """Subclass with a ``store_config`` fixture returning a fresh, empty store's config.

    Class attributes tune the suite to the backend:

    - ``durable``: the store outlives its process (False only for ``memory://``); the
      cross-process and crash tests need it.
    - ``save_kill_points``: hook points inside a save, mapped to whether the new
      checkpoint is visible after a kill there (``stepstone._hooks`` lists them).
    - ``processes``: how many processes the concurrency tests start.
    """

    durable: ClassVar[bool] = True
    save_kill_points: ClassVar[dict[str, bool]] = {}
    processes: ClassVar[int] = 4

    @pytest.fixture
    def store(self, store_config: str) -> Iterator[Store]:
        """Open the store under test from its config string."""
        with open_store(store_config) as store:
            yield store

    def _need_durable(self) -> None:
        if not self.durable:
            pytest.skip("this backend does not outlive its process")

    # -- the Store methods ---------------------------------------------------------

    def test_missing_run_is_none(self, store: Store) -> None:
        """Loading a run that never started returns None, not an error."""
        assert store.load("never-started") is None

    def test_round_trip(self, store: Store) -> None:
        """A saved checkpoint loads back with the same fields and the new version."""
        state = {"text": "héllo", "n": 3, "f": 1.5, "ok": True, "none": None, "l": [1, {"a": []}]}
        failure = Failure(2, "s2", "ValueError", "boom", 1, utcnow())
        saved = store.save(_cp("r", 1, state, total_steps=4, attempt=1, failure=failure))
        assert saved.version is not None
        loaded = store.load("r")
        assert loaded is not None
        assert loaded.state == state
        assert loaded.step == 1
        assert loaded.step_names == ("s0", "s1")
        assert loaded.total_steps == 4
        assert loaded.attempt == 1
        assert loaded.failure == failure
        assert loaded.version == saved.version
        assert loaded.status == "failed"
        assert loaded.created_at is not None and loaded.updated_at is not None

    def test_numbers_round_trip_exactly(self, store: Store) -> None:
        """Big ints, floats that look like ints and negative zero come back exactly."""
        state = {
            "big": 2**60 + 1,
            "neg_big": -(2**63),
            "float": 1.0,
            "neg_zero": -0.0,
            "tiny": 5e-324,
            "huge": 1.7976931348623157e308,
            "list": [1, 1.0, 2**53 + 1],
        }
        store.save(_cp("r", 0, state))
        loaded = store.load("r")
        assert loaded is not None
        assert json.dumps(loaded.state, sort_keys=True) == json.dumps(state, sort_keys=True)

    def test_status_done_from_checkpoint_alone(self, store: Store) -> None:
        """A checkpoint whose last step is the workflow's last reports done."""
        store.save(_cp("r", 2, total_steps=3))
        loaded = store.load("r")
        assert loaded is not None and loaded.status == "done"

    def test_isolation_between_run_ids(self, store: Store) -> None:
        """Saving one run neither creates nor changes another."""
        store.save(_cp("one", 0, {"who": "one"}))
        store.save(_cp("two", 0, {"who": "two"}))
        one, two = store.load("one"), store.load("two")
        assert one is not None and one.state == {"who": "one"}
        assert two is not None and two.state == {"who": "two"}
        assert store.load("three") is None

    def test_create_is_compare_and_swap(self, store: Store) -> None:
        """A save with version None fails with ConflictError when the run exists."""
        store.save(_cp("r", 0, {"first": True}))
        with pytest.raises(ConflictError):
            store.save(_cp("r", 0, {"second": True}))
        loaded = store.load("r")
        assert loaded is not None and loaded.state == {"first": True}

    def test_update_is_compare_and_swap(self, store: Store) -> None:
        """A save with a stale version fails and stores nothing; the current one succeeds."""
        v1 = store.save(_cp("r", 0, {"v": 1}))
        v2 = store.save(_cp("r", 1, {"v": 2}, version=v1.version))
        assert v2.version != v1.version
        with pytest.raises(ConflictError):
            store.save(_cp("r", 2, {"v": "stale"}, version=v1.version))
        with pytest.raises(ConflictError):
            store.save(_cp("r", 2, {"v": "made-up"}, version="not-a-version"))
        loaded = store.load("r")
        assert loaded is not None and loaded.state == {"v": 2}
        assert loaded.version == v2.version

    def test_recreated_run_gets_a_new_version(self, store: Store) -> None:
        """After delete and re-create, a version held from before no longer matches."""
        old = store.save(_cp("r", 0))
        assert store.delete("r")
        new = store.save(_cp("r", 0))
        assert new.version != old.version
        with pytest.raises(ConflictError):
            store.save(_cp("r", 1, version=old.version))

    def test_stale_save_cannot_resurrect_a_deleted_run(self, store: Store) -> None:
        """A save with a version after the run was deleted conflicts and stores nothing."""
        held = store.save(_cp("r", 0))
        assert store.delete("r")
        with pytest.raises(ConflictError):
            store.save(_cp("r", 1, version=held.version))
        assert store.load("r") is None

    def test_saved_state_is_not_aliased(self, store: Store) -> None:
        """Mutating the state passed to save, or the one returned, changes nothing stored."""
        state: dict[str, Any] = {"list": [1]}
        saved = store.save(_cp("r", 0, state))
        state["list"].append(2)
        saved.state["list"].append(3)
        saved.state["new"] = True
        loaded = store.load("r")
        assert loaded is not None and loaded.state == {"list": [1]}
        loaded.state["list"].append(4)
        again = store.load("r")
        assert again is not None and again.state == {"list": [1]}

    def test_delete(self, store: Store) -> None:
        """Delete removes the run and reports whether it existed."""
        store.save(_cp("r", 0))
        assert store.delete("r") is True
        assert store.load("r") is None
        assert store.delete("r") is False
        assert "r" not in set(store.list_runs())

    def test_list_runs(self, store: Store) -> None:
        """list_runs yields exactly the stored run_ids."""
        assert set(store.list_runs()) == set()
        ids = {"a", "b/c", "Ü", "x" * 1024}
        for run_id in ids:
            store.save(_cp(run_id, 0))
        assert set(store.list_runs()) == ids

    def test_list_info(self, store: Store) -> None:
        """list_info reports each run's status and step without needing the caller's steps."""
        store.save(_cp("done", 1, total_steps=2))
        store.save(_cp("running", 0, total_steps=2))
        store.save(_cp("failed", 0, total_steps=2, failure=Failure(1, "s1", "E", "m", 1, utcnow())))
        info = {i.run_id: i for i in store.list_info()}
        assert {k: v.status for k, v in info.items()} == {
            "done": "done",
            "running": "running",
            "failed": "failed",
        }
        assert info["done"].step == 1 and info["done"].updated_at is not None

    def test_awkward_run_ids(self, store: Store) -> None:
        """Every run_id the contract allows round-trips and never shares a checkpoint."""
        for index, run_id in enumerate(AWKWARD_RUN_IDS):
            store.save(_cp(run_id, 0, {"index": index}))
        for index, run_id in enumerate(AWKWARD_RUN_IDS):
            loaded = store.load(run_id)
            assert loaded is not None, run_id
            assert loaded.state == {"index": index}, run_id
            assert loaded.run_id == run_id
        assert set(store.list_runs()) == set(AWKWARD_RUN_IDS)
        assert store.delete("../x")
        assert store.load("../x") is None
        assert store.load("x") is None
        loaded = store.load("./x")
        assert loaded is not None and loaded.state["index"] == AWKWARD_RUN_IDS.index("./x")

    @pytest.mark.parametrize("bad", BAD_RUN_IDS, ids=repr)
    def test_bad_run_id_refused(self, store: Store, bad: Any) -> None:
        """A run_id outside the contract is refused with InvalidRunId on every method."""
        with pytest.raises(InvalidRunId, match="run_id"):
            store.load(bad)
        with pytest.raises(InvalidRunId):
            store.save(Checkpoint(run_id=bad, step=0, state={}, step_names=("a",)))
        with pytest.raises(InvalidRunId):
            store.delete(bad)

    @pytest.mark.parametrize(("kind", "state", "path"), BAD_STATES, ids=[b[0] for b in BAD_STATES])
    def test_non_json_state_refused(
        self, store: Store, kind: str, state: dict[str, Any], path: str
    ) -> None:
        """A state that does not round-trip through JSON is refused naming its path."""
        before = store.save(_cp("r", 0, {"good": 1}))
        with pytest.raises(InvalidState) as info:
            store.save(_cp("r", 1, state, version=before.version))
        assert info.value.path == path
        assert path in str(info.value)
        loaded = store.load("r")
        assert loaded is not None
        assert (loaded.state, loaded.version) == ({"good": 1}, before.version)
        with pytest.raises(InvalidState):
            store.save(_cp("fresh", 0, state))
        assert store.load("fresh") is None

    def test_store_is_context_manager_and_close_twice(self, store_config: str) -> None:
        """A store closes on leaving a with block, and closing again is allowed."""
        with open_store(store_config) as store:
            store.save(_cp("r", 0))
        store.close()

    # -- processes and threads -----------------------------------------------------

    def test_reopen_in_new_process(self, store: Store, store_config: str) -> None:
        """A fresh process opening the same config string sees what was saved."""
        self._need_durable()
        store.save(_cp("r/1", 1, {"from": "parent"}))
        code = (
            "import json, sys, stepstone\n"
            "cp = stepstone.open_store(sys.argv[1]).load('r/1')\n"
            "print(json.dumps([cp.step, cp.state]))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, store_config],
            capture_output=True,
            text=True,
            timeout=120,
            env=_child_env(),
            check=True,
        ).stdout
        assert json.loads(out) == [1, {"from": "parent"}]

    def test_threads_racing_one_run(self, store: Store, store_config: str) -> None:
        """Threads saving on top of the same version: exactly one wins each round."""
        store.save(Checkpoint(run_id="race", step=-1, state={"wins": []}))
        rounds, workers = 8, 4
        barrier = threading.Barrier(workers)
        results: queue.Queue[tuple[int, int, bool]] = queue.Queue()
        threads = [
            threading.Thread(
                target=_workers.race_one_run,
                args=(store_config, "race", rounds, w, barrier, results),
            )
            for w in range(workers)
        ]
        if not self.durable:  # each open of memory:// is a new store; share this one
            threads = [
                threading.Thread(
                    target=self._race_shared, args=(store, rounds, w, barrier, results)
                )
                for w in range(workers)
            ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        self._check_race(store, [results.get_nowait() for _ in range(rounds * workers)], rounds)

    @staticmethod
    def _race_shared(store: Store, rounds: int, worker: int, barrier: Any, results: Any) -> None:
        for round_no in range(rounds):
            barrier.wait()
            cp = store.load("race")
            assert cp is not None
            barrier.wait()
            try:
                store.save(
                    Checkpoint(
                        run_id="race",
                        step=cp.step + 1,
                        state={"wins": [*cp.state["wins"], worker]},
                        version=cp.version,
                        step_names=(*cp.step_names, f"round{round_no}"),
                    )
                )
            except ConflictError:
                results.put((round_no, worker, False))
            else:
                results.put((round_no, worker, True))

    @staticmethod
    def _check_race(store: Store, results: list[tuple[int, int, bool]], rounds: int) -> None:
        winners = {r: w for r, w, ok in results if ok}
        wins_per_round = Counter(r for r, _, ok in results if ok)
        assert all(wins_per_round[r] == 1 for r in range(rounds)), wins_per_round
        final = store.load("race")
        assert final is not None
        assert final.state["wins"] == [winners[r] for r in range(rounds)]
        assert final.step == rounds - 1

    def test_processes_racing_one_run(self, store: Store, store_config: str) -> None:
        """Processes saving on top of the same version: exactly one wins each round."""
        self._need_durable()
        store.save(Checkpoint(run_id="race", step=-1, state={"wins": []}))
        rounds, workers = 6, self.processes
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(workers)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_workers.race_one_run,
                args=(store_config, "race", rounds, w, barrier, results),
            )
            for w in range(workers)
        ]
        for p in procs:
            p.start()
        collected = [results.get(timeout=300) for _ in range(rounds * workers)]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        self._check_race(store, collected, rounds)

    def test_processes_writing_different_runs(self, store: Store, store_config: str) -> None:
        """Many processes running their own runs into one store lose no checkpoint."""
        self._need_durable()
        per_process = 5
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=_workers.run_many, args=(store_config, f"p{w}", per_process))
            for w in range(self.processes)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
            assert p.exitcode == 0
        expected = {f"p{w}-{i}" for w in range(self.processes) for i in range(per_process)}
        assert set(store.list_runs()) == expected
        for run_id in expected:
            cp = store.load(run_id)
            assert cp is not None
            assert cp.state == {"a": 1, "b": 2, "c": 3}
            assert cp.status == "done"

    # -- the runner on this store --------------------------------------------------

    def test_run_skips_completed_steps(self, store: Store) -> None:
        """A resumed run skips the steps its checkpoint completed and runs the rest."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("not yet")

        with pytest.raises(StepFailed):
            run("r", [_add("a", 1, log), _add("b", 2, log), Step("c", boom)], store)
        final = run("r", [_add("a", 1, log), _add("b", 2, log), _add("c", 3, log)], store)
        assert final == {"a": 1, "b": 2, "c": 3}
        assert log == ["a", "b", "c"]

    def test_finished_run_runs_nothing(self, store: Store) -> None:
        """Running a finished run again returns its final state and runs no step."""
        log: list[str] = []
        steps = [_add("a", 1, log), _add("b", 2, log)]
        assert run("r", steps, store) == {"a": 1, "b": 2}
        assert run("r", steps, store) == {"a": 1, "b": 2}
        assert log == ["a", "b"]

    def test_appending_steps_is_allowed(self, store: Store) -> None:
        """Steps appended after a finished run run on the next call; earlier ones do not."""
        log: list[str] = []
        run("r", [_add("a", 1, log)], store)
        assert run("r", [_add("a", 1, log), _add("b", 2, log)], store) == {"a": 1, "b": 2}
        assert log == ["a", "b"]

    def test_step_failed_reports_the_step(self, store: Store) -> None:
        """A raising step gives StepFailed with run, index, name, last state and cause."""

        def boom(state: dict[str, Any]) -> None:
            state["a"] = "mutated before raising"
            raise ValueError("bad input")

        with pytest.raises(StepFailed) as info:
            run("r", [_add("a", 1), Step("b", boom)], store)
        err = info.value
        assert (err.run_id, err.step_index, err.step_name) == ("r", 1, "b")
        assert err.state == {"a": 1}
        assert isinstance(err.__cause__, ValueError)
        cp = store.load("r")
        assert cp is not None and cp.status == "failed" and cp.step == 0
        assert cp.failure is not None
        assert (cp.failure.step_name, cp.failure.error_type) == ("b", "ValueError")
        assert cp.failure.message == "bad input"

    def test_failure_cleared_when_step_succeeds(self, store: Store) -> None:
        """Resuming clears the saved failure once the failed step succeeds."""

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("x")

        with pytest.raises(StepFailed):
            run("r", [Step("a", boom), _add("b", 2)], store)
        run("r", [_add("a", 1), _add("b", 2)], store)
        cp = store.load("r")
        assert cp is not None and cp.failure is None and cp.status == "done"

    def test_workflow_changed(self, store: Store) -> None:
        """Resuming with renamed or removed completed steps raises and runs nothing."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("stop")

        with pytest.raises(StepFailed):
            run("r", [_add("a", 1), _add("b", 2), Step("c", boom)], store)
        with pytest.raises(WorkflowChanged) as info:
            run("r", [_add("a", 1, log), _add("B", 2, log), _add("c", 3, log)], store)
        assert info.value.position == 1
        assert "position 1" in str(info.value)
        with pytest.raises(WorkflowChanged) as info:
            run("r", [_add("a", 1, log)], store)
        assert info.value.position == 1
        assert log == []

    def test_step_state_is_a_copy(self, store: Store) -> None:
        """A step that keeps and later mutates its state cannot change any checkpoint."""
        kept: list[dict[str, Any]] = []

        def keep(state: dict[str, Any]) -> dict[str, Any]:
            kept.append(state)
            return {"kept": True}

        def later(state: dict[str, Any]) -> dict[str, Any]:
            kept[0]["sneaky"] = "changed"
            kept[0]["kept"] = "changed"
            return {"later": True}

        final = run("r", [_add("a", [1]), Step("keep", keep), Step("later", later)], store)
        assert final == {"a": [1], "kept": True, "later": True}
        cp = store.load("r")
        assert cp is not None and cp.state == final
        final["a"].append(2)
        again = store.load("r")
        assert again is not None and again.state["a"] == [1]

    def test_in_place_mutation_is_kept(self, store: Store) -> None:
        """Changes a step makes to its own state in place are saved like returned ones."""

        def append(state: dict[str, Any]) -> None:
            state["items"].append("b")

        assert run("r", [_add("items", ["a"]), Step("append", append)], store) == {
            "items": ["a", "b"]
        }

    def test_non_json_update_fails_without_saving(self, store: Store) -> None:
        """A step returning a non-JSON value fails and leaves the last checkpoint as it was."""
        with pytest.raises(InvalidState):
            run("r", [_add("a", 1), _add("b", {1, 2})], store)
        cp = store.load("r")
        assert cp is not None and cp.step == 0 and cp.state == {"a": 1}

    def test_conflict_stops_the_run(self, store: Store) -> None:
        """When another worker advances the run mid-step, run raises ConflictError."""
        log: list[str] = []

        def interloper(state: dict[str, Any]) -> dict[str, Any]:
            current = store.load("r")
            assert current is not None
            store.save(
                Checkpoint(
                    run_id="r",
                    step=1,
                    state={"a": 1, "b": "other"},
                    version=current.version,
                    step_names=("a", "b"),
                    total_steps=3,
                )
            )
            return {"b": "mine"}

        with pytest.raises(ConflictError):
            run("r", [_add("a", 1), Step("b", interloper), _add("c", 3, log)], store)
        assert log == []
        cp = store.load("r")
        assert cp is not None and cp.state == {"a": 1, "b": "other"}

    def test_retry_runs_until_success(self, store: Store) -> None:
        """A step that fails twice then succeeds runs three times under a retry policy."""
        attempts: list[int] = []

        def flaky(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            attempts.append(ctx.attempt)
            if ctx.attempt < 3:
                raise ConnectionError("try again")
            return {"flaky": ctx.attempt}

        policy = RetryPolicy(max_attempts=5, initial_delay=0, jitter=0)
        assert run("r", [Step("flaky", flaky, retry=policy)], store) == {"flaky": 3}
        assert attempts == [1, 2, 3]
        cp = store.load("r")
        assert cp is not None and cp.failure is None and cp.attempt == 0

    def test_retry_gives_up_with_last_error(self, store: Store) -> None:
        """Exhausted attempts fail the run with the last error and save the failure."""

        def always(state: dict[str, Any], ctx: StepContext) -> None:
            raise TimeoutError(f"attempt {ctx.attempt}")

        policy = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
        with pytest.raises(StepFailed) as info:
            run("r", [Step("x", always, retry=policy)], store)
        assert str(info.value.__cause__) == "attempt 2"
        cp = store.load("r")
        assert cp is not None and cp.failure is not None
        assert (cp.failure.attempt, cp.attempt, cp.status) == (2, 0, "failed")

    def test_failed_run_gets_a_fresh_budget(self, store: Store) -> None:
        """Running a failed run again starts the step's attempts from one."""
        attempts: list[int] = []

        def fails_twice(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            attempts.append(ctx.attempt)
            if len(attempts) <= 2:
                raise TimeoutError("down")
            return {"ok": True}

        policy = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
        with pytest.raises(StepFailed):
            run("r", [Step("x", fails_twice, retry=policy)], store)
        assert run("r", [Step("x", fails_twice, retry=policy)], store) == {"ok": True}
        assert attempts == [1, 2, 1]

    def test_retry_only_listed_errors(self, store: Store) -> None:
        """An error the policy does not list fails at once, without retrying."""
        attempts: list[int] = []

        def wrong(state: dict[str, Any], ctx: StepContext) -> None:
            attempts.append(ctx.attempt)
            raise KeyError("not retried")

        policy = RetryPolicy(max_attempts=5, initial_delay=0, retry_on=(ConnectionError,))
        with pytest.raises(StepFailed):
            run("r", [Step("x", wrong, retry=policy)], store)
        assert attempts == [1]

    def test_idempotency_key(self, store: Store) -> None:
        """Each step's key is stable across attempts and distinct across steps and runs."""
        keys: dict[tuple[str, str, int], str] = {}

        def record(state: dict[str, Any], ctx: StepContext) -> None:
            keys[(ctx.run_id, ctx.step_name, ctx.attempt)] = ctx.idempotency_key
            if ctx.attempt == 1 and ctx.step_name == "b":
                raise RuntimeError("once")

        policy = RetryPolicy(max_attempts=2, initial_delay=0)
        steps = [Step("a", record), Step("b", record, retry=policy)]
        run("r1", steps, store)
        run("r2", steps, store)
        assert keys[("r1", "b", 1)] == keys[("r1", "b", 2)]
        assert len({keys[("r1", "a", 1)], keys[("r1", "b", 1)], keys[("r2", "a", 1)]}) == 3

    # -- real crashes ----------------------------------------------------------------

    def _child(
        self, store_config: str, tmp_path: Path, run_id: str, **spec: Any
    ) -> subprocess.CompletedProcess[str]:
        spec = {
            "config": store_config,
            "run_id": run_id,
            "steps": spec.pop("steps", ["a", "b", "c"]),
            "effects": str(tmp_path / f"effects-{abs(hash(run_id))}.log"),
            **spec,
        }
        return subprocess.run(
            [sys.executable, "-m", "stepstone.testing._child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=300,
            env=_child_env(),
            check=False,
        )

    @staticmethod
    def _effects(tmp_path: Path, run_id: str) -> list[str]:
        path = tmp_path / f"effects-{abs(hash(run_id))}.log"
        if not path.exists():
            return []
        return [line.split()[0] for line in path.read_text().splitlines()]

    @pytest.mark.parametrize("how", ["exit", "sigkill"])
    def test_crash_inside_step_resumes(self, store_config: str, tmp_path: Path, how: str) -> None:
        """A process killed inside step b resumes in a fresh process running only b and c."""
        self._need_durable()
        died = self._child(
            store_config, tmp_path, "crash", kill={"how": how, "step": "b", "at": "inside"}
        )
        assert died.returncode == (3 if how == "exit" else -9), died.stderr
        assert self._effects(tmp_path, "crash") == ["a", "b"]
        resumed = self._child(store_config, tmp_path, "crash")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout) == {"a": 1, "b": 2, "c": 3, "last": "c"}
        assert self._effects(tmp_path, "crash") == ["a", "b", "b", "c"]

    def test_crash_after_step_before_save_reruns_it_once(
        self, store_config: str, tmp_path: Path
    ) -> None:
        """Killed after b returned but before its checkpoint: b runs again, once."""
        self._need_durable()
        kill = {"how": "sigkill", "step": "b", "at": "runner.after_step"}
        died = self._child(store_config, tmp_path, "after", kill=kill)
        assert died.returncode == -9, died.stderr
        with open_store(store_config) as store:
            cp = store.load("after")
            assert cp is not None and cp.step == 0 and cp.state == {"a": 1, "last": "a"}
        resumed = self._child(store_config, tmp_path, "after")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout) == {"a": 1, "b": 2, "c": 3, "last": "c"}
        assert self._effects(tmp_path, "after") == ["a", "b", "b", "c"]

    def test_crash_inside_save_keeps_a_whole_checkpoint(
        self, store_config: str, tmp_path: Path
    ) -> None:
        """Killed inside b's save: the next load is the old or the new checkpoint, whole."""
        self._need_durable()
        if not self.save_kill_points:
            pytest.skip("this backend declares no kill points inside a save")
        for point, new_visible in self.save_kill_points.items():
            run_id = f"save-{point}"
            kill = {"how": "sigkill", "step": "b", "at": point}
            died = self._child(store_config, tmp_path, run_id, kill=kill)
            assert died.returncode == -9, (point, died.stdout, died.stderr)
            with open_store(store_config) as store:
                cp = store.load(run_id)
            assert cp is not None, point
            if new_visible:
                assert (cp.step, cp.state) == (1, {"a": 1, "b": 2, "last": "b"}), point
            else:
                assert (cp.step, cp.state) == (0, {"a": 1, "last": "a"}), point
            resumed = self._child(store_config, tmp_path, run_id)
            assert resumed.returncode == 0, (point, resumed.stderr)
            assert json.loads(resumed.stdout) == {"a": 1, "b": 2, "c": 3, "last": "c"}
            expected_b = 1 if new_visible else 2
            assert self._effects(tmp_path, run_id).count("b") == expected_b, point

    def test_attempt_count_survives_a_crash(self, store_config: str, tmp_path: Path) -> None:
        """A process killed between attempts resumes with the attempt count it had."""
        self._need_durable()
        # b fails on attempt 1, and the process dies during the backoff before attempt 2.
        kill = {"how": "sigkill", "step": "b", "at": "runner.backoff"}
        spec: dict[str, Any] = {"fail": {"b": 1}, "retry": {"b": 3}}
        died = self._child(store_config, tmp_path, "retry", kill=kill, **spec)
        assert died.returncode == -9, died.stderr
        with open_store(store_config) as store:
            cp = store.load("retry")
        assert cp is not None and cp.attempt == 1 and cp.failure is not None
        resumed = self._child(store_config, tmp_path, "retry", **spec)
        assert resumed.returncode == 0, resumed.stderr
        path = tmp_path / f"effects-{abs(hash('retry'))}.log"
        assert path.read_text().splitlines() == ["a 1", "b 1", "b 2", "c 1"]

    def test_crash_loop_stops_at_max_attempts(self, store_config: str, tmp_path: Path) -> None:
        """A step that kills its process every time stops after max_attempts, not forever."""
        self._need_durable()
        kill = {"how": "sigkill", "step": "b", "at": "inside"}
        for _ in range(2):
            died = self._child(store_config, tmp_path, "loop", kill=kill, retry={"b": 2})
            assert died.returncode == -9, died.stderr
        final = self._child(store_config, tmp_path, "loop", kill=kill, retry={"b": 2})
        assert final.returncode == 1, final.stderr
        assert json.loads(final.stdout) == {"failed": "b", "attempt": 2}
        assert self._effects(tmp_path, "loop") == ["a", "b", "b"]
