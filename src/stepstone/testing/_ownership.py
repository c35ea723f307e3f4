"""``OwnershipContract``: claims, leases, start and cancel, and workers, on every backend.

Exactly one claimant wins, a takeover happens only after a whole lease without renewal,
a live owner is never doubled, a fenced owner writes nothing, workers drain the queue
exactly once and hand their runs over on a graceful stop. Each test runs in both forms.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from .._checkpoint import Checkpoint, utcnow
from .._control import cancel
from .._errors import (
    ConflictError,
    InputMismatch,
    LeaseLost,
    RunCancelled,
    RunNotActive,
    RunNotFound,
    RunOwned,
    WorkflowChanged,
)
from .._lease import claimed, released
from .._registry import open_store
from .._steps import Step, Workflow
from ._barrier import WAIT_TIMEOUT
from ._ops import Ops
from ._runtime_kit import LIVE_LEASE, RuntimeBase, Serving, State, until

__all__ = ["OwnershipContract"]


class OwnershipContract(RuntimeBase):
    """Who runs a run, and for how long; mixed into ``RuntimeContract``."""

    # -- claims and leases -----------------------------------------------------------------

    def test_claim_race_exactly_one_wins(self, ops: Ops) -> None:
        """Two claims built on the same version: exactly one lands, the other conflicts."""
        queued = self.start(ops, Workflow("w", [Step("a", lambda s: None)]), "race")
        cp = ops.load("race")
        assert cp is not None and queued.status == "queued"
        first = ops.save(claimed(cp, "worker:a", 5.0))
        with pytest.raises(ConflictError):
            ops.save(claimed(cp, "worker:b", 5.0))
        stored = ops.load("race")
        assert stored is not None and stored.owner == "worker:a" == first.owner
        assert stored.epoch == cp.epoch + 1 and stored.status == "running"

    def test_takeover_only_after_the_lease(self, ops: Ops) -> None:
        """A run whose owner stopped renewing is taken over after its lease, epoch bumped."""
        ghost = self._ghost(ops.store, "orphan", lease=0.3, steps=1)
        began = time.monotonic()
        state = ops.run("orphan", [Step("a", lambda s: {"a": 1})])
        waited = time.monotonic() - began
        assert state == {"a": 1}
        # The takeover waited for a whole lease without renewal, by our own clock.
        assert waited >= 0.3
        final = ops.load("orphan")
        assert final is not None and final.epoch == ghost.epoch + 1 and final.owner is None

    def test_live_owner_refuses_a_second_execution(self, ops: Ops, store_config: str) -> None:
        """``run`` on a run another owner renews raises RunOwned and runs nothing."""
        entered, release = threading.Event(), threading.Event()
        ran: list[str] = []

        def hold(state: State) -> None:
            entered.set()
            assert release.wait(WAIT_TIMEOUT), "the test never released the holding step"

        def second(state: State) -> None:
            ran.append("second")

        errors: list[BaseException] = []

        def holder() -> None:
            with open_store(store_config) as other:
                try:
                    from .._runner import run  # noqa: PLC0415

                    run("held", [Step("hold", hold)], other, lease=LIVE_LEASE)
                except BaseException as exc:  # noqa: BLE001 - re-raised by the test's thread
                    errors.append(exc)

        thread = threading.Thread(target=holder, name="lease holder")
        thread.start()
        try:
            assert entered.wait(WAIT_TIMEOUT), "the holder never entered its step"
            with pytest.raises(RunOwned) as info:
                ops.run("held", [Step("hold", second)])
            assert "held" in str(info.value) and ran == []
        finally:
            release.set()
            thread.join(WAIT_TIMEOUT)
        assert not thread.is_alive(), "the lease holder thread hung"
        assert errors == []

    def test_lease_is_renewed_during_a_long_step(self, ops: Ops) -> None:
        """A step longer than its lease keeps it: the owner renews, nobody takes over."""
        store = ops.store
        seen: list[str | None] = []

        def long(state: State) -> State:
            first = store.load("long")
            assert first is not None
            seen.append(first.version)

            def renewed_twice() -> bool:
                now = store.load("long")
                if now is not None and now.version != seen[-1]:
                    seen.append(now.version)
                return len(seen) >= 3

            until("two lease renewals during the step", renewed_twice)
            return {"long": True}

        from .._runner import arun, run  # noqa: PLC0415

        steps = [Step("long", long)]
        if ops.is_async:
            state = ops.aio(arun("long", steps, store, lease=0.3))
        else:
            state = run("long", steps, store, lease=0.3)
        assert state == {"long": True}
        final = ops.load("long")
        assert final is not None and final.epoch == 1 and final.owner is None

    def test_fenced_owner_writes_nothing(self, ops: Ops, store_config: str) -> None:
        """An owner whose run was taken over mid-step gets LeaseLost and saves nothing."""

        def taken_over(state: State) -> State:
            # While this step runs, another worker takes the run over (as after a freeze).
            with open_store(store_config) as other:
                current = other.load("zombie")
                assert current is not None
                other.save(claimed(released(current), "worker:thief", 30.0))
            return {"zombie_wrote": True}

        with pytest.raises(LeaseLost):
            ops.run("zombie", [Step("a", taken_over), Step("b", lambda s: {"b": 1})])
        final = ops.load("zombie")
        assert final is not None
        assert final.owner == "worker:thief" and final.step == -1
        assert "zombie_wrote" not in final.state

    # -- start and cancel --------------------------------------------------------------------

    def test_start_is_idempotent(self, ops: Ops) -> None:
        """start twice is a no-op; another input or workflow is a clear error."""
        flow = Workflow("greet", [Step("a", lambda s: None)], version="1")
        first = self.start(ops, flow, "greet-1", {"to": "ann"})
        again = self.start(ops, flow, "greet-1", {"to": "ann"})
        assert first.status == again.status == "queued" and first.version == again.version
        with pytest.raises(InputMismatch, match="to"):
            self.start(ops, flow, "greet-1", {"to": "bob"})
        with pytest.raises(WorkflowChanged):
            self.start(ops, Workflow("greet", flow.steps, version="2"), "greet-1", {"to": "ann"})
        cp = ops.load("greet-1")
        assert cp is not None and cp.input == {"to": "ann"} and cp.workflow_version == "1"

    def test_cancel_queued_run(self, ops: Ops) -> None:
        """A queued run is cancelled at once, never runs, and cannot be cancelled twice."""
        ran: list[str] = []
        flow = Workflow("w", [Step("a", lambda s: ran.append("a"))])
        self.start(ops, flow, "q")
        assert self.cancel(ops, "q").status == "cancelled"
        with pytest.raises(RunCancelled):
            ops.run("q", flow)
        with pytest.raises(RunNotActive):
            self.cancel(ops, "q")
        with pytest.raises(RunNotFound):
            self.cancel(ops, "never-started")
        assert ran == []
        assert "q" not in {i.run_id for i in ops.claimable(utcnow() + timedelta(days=1))}

    def test_cancel_stops_at_the_next_step_boundary(self, ops: Ops) -> None:
        """Cancel during a step: that step's result is saved, no later step runs."""
        store = ops.store
        ran: list[str] = []

        def a(state: State) -> State:
            cancel(store, "c")
            ran.append("a")
            return {"a": 1}

        with pytest.raises(RunCancelled):
            ops.run("c", [Step("a", a), Step("b", lambda s: ran.append("b"))])
        final = ops.load("c")
        assert final is not None and final.status == "cancelled"
        assert final.step == 0 and final.state == {"a": 1} and ran == ["a"]
        with pytest.raises(RunNotActive):
            self.cancel(ops, "c")

    def test_cancel_finished_run_is_an_error(self, ops: Ops) -> None:
        """Cancelling a done run is refused, and the run is left as it is."""
        ops.run("fin", [Step("a", lambda s: {"a": 1})])
        with pytest.raises(RunNotActive, match="done"):
            self.cancel(ops, "fin")
        final = ops.load("fin")
        assert final is not None and final.status == "done"

    # -- workers -----------------------------------------------------------------------------

    def test_workers_drain_queued_runs_exactly_once(self, ops: Ops, store_config: str) -> None:
        """Two workers on one store run each of 30 queued runs' steps exactly once."""
        counts: Counter[str] = Counter()
        lock = threading.Lock()

        def count(state: State, ctx: Any) -> State:
            with lock:
                counts[f"{ctx.run_id}:{ctx.step_name}"] += 1
            return {ctx.step_name: state["n"]}

        flow = Workflow("drain", [Step("a", count), Step("b", count)])
        for n in range(30):
            self.start(ops, flow, f"drain-{n}", {"n": n})
        with (
            Serving(store_config, [flow], ops.mode, concurrency=3, lease=5, poll=0.05),
            Serving(store_config, [flow], ops.mode, concurrency=3, lease=5, poll=0.05),
        ):
            until(
                "30 runs done by two workers",
                lambda: all(
                    (c := ops.store.load(f"drain-{n}")) is not None and c.status == "done"
                    for n in range(30)
                ),
            )
        for n in range(30):
            final = ops.load(f"drain-{n}")
            assert final is not None and final.state == {"n": n, "a": n, "b": n}
        assert set(counts.values()) == {1} and len(counts) == 60

    def test_worker_takes_over_an_expired_lease(self, ops: Ops, store_config: str) -> None:
        """A worker takes over a run whose owner died holding it, once its lease passed."""
        flow = Workflow("orphaned", [Step("a", lambda s: {"a": 1}), Step("b", lambda s: {"b": 2})])
        dead = Checkpoint(
            run_id="dead-owner", total_steps=2, workflow="orphaned", state={}, input=None
        )
        ghost = ops.store.save(claimed(dead, "worker:elsewhere:1:-:dead", 0.5))
        with Serving(store_config, [flow], ops.mode, lease=5, poll=0.05):
            until(
                "the worker to take the orphaned run over",
                lambda: ops.store.load("dead-owner").status == "done",  # type: ignore[union-attr]
            )
        final = ops.load("dead-owner")
        assert final is not None and final.state == {"a": 1, "b": 2}
        assert final.epoch == ghost.epoch + 1 and final.owner is None

    def test_worker_leaves_unserved_workflows(self, ops: Ops, store_config: str) -> None:
        """A run of a workflow (or version) the worker does not serve is never run by it."""
        ran: list[str] = []
        v1 = Workflow("w", [Step("a", lambda s: ran.append("v1"))], version="1")
        v2 = Workflow("w", [Step("a", lambda s: ran.append("v2"))], version="2")
        self.start(ops, v2, "other-version")
        self.start(ops, v1, "served")
        with Serving(store_config, [v1], ops.mode, poll=0.05):
            until("the served run", lambda: ops.store.load("served").status == "done")  # type: ignore[union-attr]
        cp = ops.load("other-version")
        assert cp is not None and cp.status == "queued" and ran == ["v1"]

    def test_graceful_stop_hands_runs_over(self, ops: Ops, store_config: str) -> None:
        """stop(): the step in flight finishes and is saved, the lease is given back at once."""
        entered, release = threading.Event(), threading.Event()

        def slow(state: State) -> State:
            entered.set()
            assert release.wait(WAIT_TIMEOUT), "the test never released the step"
            return {"slow": True}

        flow = Workflow("handover", [Step("slow", slow), Step("next", lambda s: {"next": 1})])
        self.start(ops, flow, "h")
        serving = Serving(store_config, [flow], ops.mode, lease=30, poll=0.05)
        with serving as worker:
            assert entered.wait(WAIT_TIMEOUT), "the worker never started the step"
            worker.stop()
            release.set()
            serving.stop()
        handed = ops.load("h")
        assert handed is not None
        assert handed.step == 0 and handed.state == {"slow": True}
        assert handed.owner is None and handed.status == "running"
        # Released, not expired: another worker takes it at once, no lease wait.
        assert ops.run("h", flow) == {"slow": True, "next": 1}
