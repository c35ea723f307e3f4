"""``RunnerContract``: ``run`` / ``arun`` on top of the backend under test.

Resuming skips completed steps, failures name their step and are cleared, a changed
workflow is refused, states are copies, conflicts stop the run, retries and their
budget, idempotency keys and the recorded ``input=``; each test runs in both forms.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from .._errors import ConflictError, InputMismatch, InvalidState, StepFailed, WorkflowChanged
from .._runner import RetryPolicy, Step, StepContext
from ._base import ContractBase
from ._ops import Ops

__all__ = ["RunnerContract"]


class RunnerContract(ContractBase):
    """The runner on this store; mixed into ``StoreContract``."""

    def test_run_skips_completed_steps(self, ops: Ops) -> None:
        """A resumed run skips the steps its checkpoint completed and runs the rest."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("not yet")

        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log), Step("c", boom)])
        final = ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log), ops.add("c", 3, log)])
        assert final == {"a": 1, "b": 2, "c": 3}
        assert log == ["a", "b", "c"]

    def test_finished_run_runs_nothing(self, ops: Ops) -> None:
        """Running a finished run again returns its final state and runs no step."""
        log: list[str] = []
        steps = [ops.add("a", 1, log), ops.add("b", 2, log)]
        assert ops.run("r", steps) == {"a": 1, "b": 2}
        assert ops.run("r", steps) == {"a": 1, "b": 2}
        assert log == ["a", "b"]

    def test_appending_steps_is_allowed(self, ops: Ops) -> None:
        """Steps appended after a finished run run on the next call; earlier ones do not."""
        log: list[str] = []
        ops.run("r", [ops.add("a", 1, log)])
        assert ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log)]) == {"a": 1, "b": 2}
        assert log == ["a", "b"]

    def test_step_failed_reports_the_step(self, ops: Ops) -> None:
        """A raising step gives StepFailed with run, index, name, last state and cause."""

        def boom(state: dict[str, Any]) -> None:
            state["a"] = "mutated before raising"
            raise ValueError("bad input")

        with pytest.raises(StepFailed) as info:
            ops.run("r", [ops.add("a", 1), ops.step("b", boom)])
        err = info.value
        assert (err.run_id, err.step_index, err.step_name) == ("r", 1, "b")
        assert err.state == {"a": 1}
        assert isinstance(err.__cause__, ValueError)
        loaded = ops.load("r")
        assert loaded is not None and loaded.status == "failed" and loaded.step == 0
        assert loaded.failure is not None
        assert (loaded.failure.step_name, loaded.failure.error_type) == ("b", "ValueError")
        assert loaded.failure.message == "bad input"

    def test_failure_cleared_when_step_succeeds(self, ops: Ops) -> None:
        """Resuming clears the saved failure once the failed step succeeds."""

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("x")

        with pytest.raises(StepFailed):
            ops.run("r", [Step("a", boom), ops.add("b", 2)])
        ops.run("r", [ops.add("a", 1), ops.add("b", 2)])
        loaded = ops.load("r")
        assert loaded is not None and loaded.failure is None and loaded.status == "done"

    def test_workflow_changed(self, ops: Ops) -> None:
        """Resuming with renamed or removed completed steps raises and runs nothing."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("stop")

        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1), ops.add("b", 2), Step("c", boom)])
        with pytest.raises(WorkflowChanged) as info:
            ops.run("r", [ops.add("a", 1, log), ops.add("B", 2, log), ops.add("c", 3, log)])
        assert info.value.position == 1
        assert "position 1" in str(info.value)
        with pytest.raises(WorkflowChanged) as info:
            ops.run("r", [ops.add("a", 1, log)])
        assert info.value.position == 1
        assert log == []

    def test_step_state_is_a_copy(self, ops: Ops) -> None:
        """A step that keeps and later mutates its state cannot change any checkpoint."""
        kept: list[dict[str, Any]] = []

        def keep(state: dict[str, Any]) -> dict[str, Any]:
            kept.append(state)
            return {"kept": True}

        def later(state: dict[str, Any]) -> dict[str, Any]:
            kept[0]["sneaky"] = "changed"
            kept[0]["kept"] = "changed"
            return {"later": True}

        final = ops.run("r", [ops.add("a", [1]), Step("keep", keep), ops.step("later", later)])
        assert final == {"a": [1], "kept": True, "later": True}
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == final
        final["a"].append(2)
        again = ops.load("r")
        assert again is not None and again.state["a"] == [1]

    def test_in_place_mutation_is_kept(self, ops: Ops) -> None:
        """Changes a step makes to its own state in place are saved like returned ones."""

        def append(state: dict[str, Any]) -> None:
            state["items"].append("b")

        steps = [ops.add("items", ["a"]), ops.step("append", append), Step("again", append)]
        assert ops.run("r", steps) == {"items": ["a", "b", "b"]}
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == {"items": ["a", "b", "b"]}

    def test_non_json_update_fails_without_saving(self, ops: Ops) -> None:
        """A step returning a non-JSON value fails the run, recorded with the value's path,
        and leaves the last checkpoint's state as it was."""
        with pytest.raises(StepFailed) as info:
            ops.run("r", [ops.add("a", 1), ops.add("b", {1, 2})])
        assert isinstance(info.value.__cause__, InvalidState)
        loaded = ops.load("r")
        assert loaded is not None and loaded.step == 0 and loaded.state == {"a": 1}
        assert loaded.status == "failed" and loaded.failure is not None
        assert loaded.failure.error_type == "InvalidState"
        assert "state['b']" in loaded.failure.message

    def test_conflict_stops_the_run(self, ops: Ops) -> None:
        """When another worker advances the run mid-step, run raises ConflictError."""
        log: list[str] = []
        store = ops.store

        def interloper(state: dict[str, Any]) -> dict[str, Any]:
            # A plain step: under arun it runs in a worker thread, so sync calls are fine.
            current = store.load("r")
            assert current is not None
            store.save(
                replace(
                    current,
                    step=1,
                    state={"a": 1, "b": "other"},
                    step_names=("a", "b"),
                    total_steps=3,
                )
            )
            return {"b": "mine"}

        with pytest.raises(ConflictError):
            ops.run("r", [ops.add("a", 1), Step("b", interloper), ops.add("c", 3, log)])
        assert log == []
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == {"a": 1, "b": "other"}

    def test_retry_runs_until_success(self, ops: Ops) -> None:
        """A step that fails twice then succeeds runs three times under a retry policy."""
        attempts: list[int] = []

        def flaky(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            attempts.append(ctx.attempt)
            if ctx.attempt < 3:
                raise ConnectionError("try again")
            return {"flaky": ctx.attempt}

        policy = RetryPolicy(max_attempts=5, initial_delay=0, jitter=0)
        assert ops.run("r", [ops.step("flaky", flaky, retry=policy)]) == {"flaky": 3}
        assert attempts == [1, 2, 3]
        loaded = ops.load("r")
        assert loaded is not None and loaded.failure is None and loaded.attempt == 0

    def test_retry_gives_up_with_last_error(self, ops: Ops) -> None:
        """Exhausted attempts fail the run with the last error and save the failure."""

        def always(state: dict[str, Any], ctx: StepContext) -> None:
            raise TimeoutError(f"attempt {ctx.attempt}")

        policy = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
        with pytest.raises(StepFailed) as info:
            ops.run("r", [Step("x", always, retry=policy)])
        assert str(info.value.__cause__) == "attempt 2"
        loaded = ops.load("r")
        assert loaded is not None and loaded.failure is not None
        assert (loaded.failure.attempt, loaded.attempt, loaded.status) == (2, 0, "failed")

    def test_failed_run_gets_a_fresh_budget(self, ops: Ops) -> None:
        """Running a failed run again starts the step's attempts from one."""
        attempts: list[int] = []

        def fails_twice(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            attempts.append(ctx.attempt)
            if len(attempts) <= 2:
                raise TimeoutError("down")
            return {"ok": True}

        policy = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
        with pytest.raises(StepFailed):
            ops.run("r", [ops.step("x", fails_twice, retry=policy)])
        assert ops.run("r", [ops.step("x", fails_twice, retry=policy)]) == {"ok": True}
        assert attempts == [1, 2, 1]

    def test_retry_only_listed_errors(self, ops: Ops) -> None:
        """An error the policy does not list fails at once, without retrying."""
        attempts: list[int] = []

        def wrong(state: dict[str, Any], ctx: StepContext) -> None:
            attempts.append(ctx.attempt)
            raise KeyError("not retried")

        policy = RetryPolicy(max_attempts=5, initial_delay=0, retry_on=(ConnectionError,))
        with pytest.raises(StepFailed):
            ops.run("r", [ops.step("x", wrong, retry=policy)])
        assert attempts == [1]

    def test_idempotency_key(self, ops: Ops) -> None:
        """Each step's key is stable across attempts and distinct across steps and runs."""
        keys: dict[tuple[str, str, int], str] = {}

        def record(state: dict[str, Any], ctx: StepContext) -> None:
            keys[(ctx.run_id, ctx.step_name, ctx.attempt)] = ctx.idempotency_key
            if ctx.attempt == 1 and ctx.step_name == "b":
                raise RuntimeError("once")

        policy = RetryPolicy(max_attempts=2, initial_delay=0)
        steps = [ops.step("a", record), Step("b", record, retry=policy)]
        ops.run("r1", steps)
        ops.run("r2", steps)
        assert keys[("r1", "b", 1)] == keys[("r1", "b", 2)]
        assert len({keys[("r1", "a", 1)], keys[("r1", "b", 1)], keys[("r2", "a", 1)]}) == 3

    # -- input= ------------------------------------------------------------------------

    def test_input_is_the_initial_state_and_recorded(self, ops: Ops) -> None:
        """input= is the state the first step sees, and the first save records it."""
        seen: list[dict[str, Any]] = []

        def first(state: dict[str, Any]) -> dict[str, Any]:
            seen.append(dict(state))
            return {"a": 1}

        given = {"query": "héllo", "k": [1, {"x": None}]}
        final = ops.run("r", [ops.step("first", first), ops.add("b", 2)], input=given)
        assert final == {**given, "a": 1, "b": 2}
        assert seen == [given]
        loaded = ops.load("r")
        assert loaded is not None and loaded.input == given

    def test_input_reused_when_resuming_without_it(self, ops: Ops) -> None:
        """Resuming with input=None starts from the recorded input, not from an empty state."""
        seen: list[dict[str, Any]] = []

        def first(state: dict[str, Any]) -> dict[str, Any]:
            seen.append(dict(state))
            if len(seen) == 1:
                raise RuntimeError("not yet")
            return {"a": 1}

        with pytest.raises(StepFailed):
            ops.run("r", [ops.step("first", first)], input={"q": 1})
        assert ops.run("r", [ops.step("first", first)]) == {"q": 1, "a": 1}
        assert seen == [{"q": 1}, {"q": 1}]
        loaded = ops.load("r")
        assert loaded is not None and loaded.input == {"q": 1} and loaded.status == "done"

    def test_different_input_is_refused_and_runs_nothing(self, ops: Ops) -> None:
        """Resuming with another input raises InputMismatch naming the difference; no step runs."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("stop")

        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1), Step("b", boom)], input={"q": 1, "k": [1, 2]})
        before = ops.load("r")
        assert before is not None
        with pytest.raises(InputMismatch) as info:
            ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log)], input={"q": 1, "k": [1, 3]})
        assert info.value.run_id == "r"
        assert "k" in info.value.path and "k" in str(info.value)
        assert log == []
        after = ops.load("r")
        assert after is not None and (after.version, after.input) == (before.version, before.input)

    def test_same_input_again_is_a_no_op(self, ops: Ops) -> None:
        """Passing the recorded input again resumes normally, and a finished run runs nothing."""
        log: list[str] = []
        calls: list[int] = []

        def once(state: dict[str, Any]) -> dict[str, Any]:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("not yet")
            return {"b": 2}

        given = {"q": [1, 2]}
        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1, log), Step("b", once)], input=given)
        final = ops.run("r", [ops.add("a", 1, log), Step("b", once)], input={"q": [1, 2]})
        assert final == {"q": [1, 2], "a": 1, "b": 2}
        assert ops.run("r", [ops.add("a", 1, log), Step("b", once)], input=given) == final
        assert log == ["a"] and len(calls) == 2
