"""``SuspensionContract``: signals, timers and child runs, on every backend.

A suspended run holds no lease; a signal is applied exactly once whether it comes before
or after the wait; a timer wakes at its recorded time, across a worker restart; a map
waits for its children, retries only the failed ones and is cancelled with its parent.
Each test runs in both forms; timers are passed by moving the clock, never waited for.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from .._checkpoint import Checkpoint
from .._control import signal
from .._errors import (
    ConflictError,
    RunNotActive,
    RunNotFound,
    StepFailed,
    Suspended,
)
from .._registry import open_store
from .._steps import Step, Workflow
from .._store import Store
from .._suspend import Map, Sleep, WaitFor, child_run_id
from ._barrier import WAIT_TIMEOUT
from ._ops import Ops
from ._runtime_kit import LONG, RuntimeBase, Serving, State, clock_ahead, until

__all__ = ["SuspensionContract"]


class SuspensionContract(RuntimeBase):
    """Runs that wait; mixed into ``RuntimeContract``."""

    # -- signals -------------------------------------------------------------------------

    def _approval(self) -> Workflow:
        return Workflow(
            "approval",
            [
                Step("draft", lambda s: {"draft": "reply"}),
                WaitFor("approved", "approve"),
                Step("send", lambda s: {"sent": s["approved"]}),
            ],
        )

    def test_signal_after_the_wait(self, ops: Ops) -> None:
        """A run reaching WaitFor suspends (waiting, no owner); a signal lets it finish."""
        flow = self._approval()
        with pytest.raises(Suspended) as info:
            ops.run("ap", flow)
        assert info.value.waiting_for == "signal approve" and info.value.wake_at is None
        waiting = ops.load("ap")
        assert waiting is not None and waiting.status == "waiting" and waiting.owner is None
        with pytest.raises(Suspended):
            ops.run("ap", flow)  # still waiting: runs nothing
        assert self.signal(ops, "ap", "approve", {"by": "ann"}, signal_id="s1") is True
        assert ops.run("ap", flow) == {
            "draft": "reply",
            "approved": {"by": "ann"},
            "sent": {"by": "ann"},
        }
        # A repeated id is a no-op whatever the run's state (a webhook retried after the
        # run finished); a new signal to a finished run is an error.
        assert self.signal(ops, "ap", "approve", 1, signal_id="s1") is False
        with pytest.raises(RunNotActive):
            self.signal(ops, "ap", "approve", 1, signal_id="s2")

    def test_signal_before_the_wait_is_kept(self, ops: Ops) -> None:
        """A signal that arrives before its WaitFor is reached is used when it is."""
        flow = Workflow("w", [Step("a", lambda s: None), WaitFor("got", "go")])
        self.start(ops, flow, "early")
        self.signal(ops, "early", "go", "payload")
        assert ops.run("early", flow) == {"got": "payload"}

    def test_duplicate_signal_id_is_a_no_op(self, ops: Ops) -> None:
        """The same signal_id twice is recorded once; two WaitFors need two signals."""
        flow = Workflow("w", [WaitFor("one", "s"), WaitFor("two", "s")])
        self.start(ops, flow, "dup")
        assert self.signal(ops, "dup", "s", 1, signal_id="x") is True
        assert self.signal(ops, "dup", "s", 1, signal_id="x") is False
        with pytest.raises(Suspended):
            ops.run("dup", flow)
        waiting = ops.load("dup")
        assert waiting is not None and waiting.state == {"one": 1}
        self.signal(ops, "dup", "s", 2, signal_id="y")
        assert ops.run("dup", flow) == {"one": 1, "two": 2}

    def test_signal_refused_for_unknown_done_or_cancelled_runs(self, ops: Ops) -> None:
        """A signal to an unknown, done or cancelled run is a clear error, whatever its id."""
        with pytest.raises(RunNotFound):
            self.signal(ops, "nobody", "s", 1, signal_id="i")
        ops.run("finished", [Step("a", lambda s: None)])
        with pytest.raises(RunNotActive, match="done"):
            self.signal(ops, "finished", "s", 1, signal_id="i")
        with pytest.raises(Suspended):
            ops.run("to-cancel", [WaitFor("w", "s")])
        self.cancel(ops, "to-cancel")
        with pytest.raises(RunNotActive, match="cancelled"):
            self.signal(ops, "to-cancel", "s", 1)

    def test_failed_run_keeps_signals_for_its_retry(self, ops: Ops) -> None:
        """A failed run accepts signals; they are used when it is run again."""
        broken = {"on": True}

        def flaky(state: State) -> None:
            if broken["on"]:
                raise RuntimeError("down")

        steps = [Step("a", flaky), WaitFor("got", "s")]
        with pytest.raises(StepFailed):
            ops.run("retry-later", steps)
        assert self.signal(ops, "retry-later", "s", {"v": 1}) is True
        broken["on"] = False
        assert ops.run("retry-later", steps) == {"got": {"v": 1}}

    def test_concurrent_signals_each_applied_once(self, ops: Ops, store_config: str) -> None:
        """Twenty signals sent at once from threads are all kept, each exactly once."""
        flow = Workflow("w", [WaitFor(f"got{i}", "s") for i in range(20)])
        self.start(ops, flow, "many")
        barrier = threading.Barrier(20)
        errors: list[BaseException] = []

        def send(i: int) -> None:
            try:
                with open_store(store_config) as mine:
                    barrier.wait(WAIT_TIMEOUT)
                    signal(mine, "many", "s", i, signal_id=f"id{i}")
                    signal(mine, "many", "s", i, signal_id=f"id{i}")  # and a duplicate
            except BaseException as exc:  # noqa: BLE001 - asserted empty by the test's thread
                errors.append(exc)

        threads = [
            threading.Thread(target=send, args=(i,), name=f"signaller {i}") for i in range(20)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_TIMEOUT)
            assert not thread.is_alive(), f"{thread.name} hung"
        assert errors == []
        state = ops.run("many", flow)
        assert sorted(state.values()) == list(range(20))

    def test_wait_timeout_with_and_without_default(
        self, ops: Ops, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On timeout the default is merged; without one the step fails with a saved failure."""
        # A timeout no save can outlast, however loaded the machine; then time is moved
        # past it explicitly rather than waited for.
        with_default = [WaitFor("answer", "reply", timeout=LONG, default="none")]
        with pytest.raises(Suspended) as info:
            ops.run("t1", with_default)
        wake = info.value.wake_at
        assert wake is not None
        without = [WaitFor("answer", "reply", timeout=LONG)]
        with pytest.raises(Suspended) as second:
            ops.run("t2", without)
        deadline = second.value.wake_at
        assert deadline is not None
        clock_ahead(monkeypatch, max(wake, deadline))
        assert ops.run("t1", with_default) == {"answer": "none"}
        with pytest.raises(StepFailed):
            ops.run("t2", without)
        failed = ops.load("t2")
        assert failed is not None and failed.status == "failed"
        assert failed.failure is not None and failed.failure.error_type == "WaitTimeout"

    # -- timers --------------------------------------------------------------------------

    def test_sleep_wakes_at_its_recorded_time(
        self, ops: Ops, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Sleep suspends until a time recorded in the checkpoint and merges that time."""
        flow = [Sleep("nap", duration=LONG), Step("after", lambda s: {"after": True})]
        with pytest.raises(Suspended) as info:
            ops.run("nap", flow)
        wake = info.value.wake_at
        assert wake is not None and info.value.waiting_for == "timer"
        stored = ops.load("nap")
        assert stored is not None and stored.wake_at == wake and stored.owner is None
        due = {i.run_id for i in ops.claimable(wake + timedelta(seconds=1))}
        assert "nap" in due
        clock_ahead(monkeypatch, wake)
        state = ops.run("nap", flow)
        assert state == {"nap": wake.astimezone(UTC).isoformat(), "after": True}

    def test_sleep_across_a_worker_restart(
        self, ops: Ops, store_config: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A sleeping run survives its worker stopping; a new worker wakes it when due."""
        flow = Workflow("nap", [Sleep("nap", duration=LONG), Step("after", lambda s: {"ok": 1})])
        self.start(ops, flow, "restart")
        with Serving(store_config, [flow], ops.mode, poll=0.05):
            until("the run to sleep", lambda: ops.store.load("restart").status == "waiting")  # type: ignore[union-attr]
        slept = ops.load("restart")
        assert slept is not None and slept.wake_at is not None
        clock_ahead(monkeypatch, slept.wake_at)
        with Serving(store_config, [flow], ops.mode, poll=0.05):
            until("the run to wake and finish", lambda: ops.store.load("restart").status == "done")  # type: ignore[union-attr]
        final = ops.load("restart")
        assert final is not None and final.state["ok"] == 1 and "nap" in final.state

    def test_import_keeps_the_timestamps(self, store: Store) -> None:
        """import_checkpoint (migrate's write) is compare-and-swap and keeps both timestamps."""
        old = datetime(2020, 5, 17, 8, 30, tzinfo=UTC)
        cp = Checkpoint(
            "imported",
            step=0,
            state={"a": 1},
            step_names=("a",),
            total_steps=2,
            created_at=old,
            updated_at=old + timedelta(hours=1),
        )
        store.import_checkpoint(cp)
        loaded = store.load("imported")
        assert loaded is not None
        assert (loaded.created_at, loaded.updated_at) == (old, old + timedelta(hours=1))
        listed = {i.run_id: i for i in store.list_info()}["imported"]
        assert listed.updated_at == old + timedelta(hours=1)
        with pytest.raises(ConflictError):
            store.import_checkpoint(cp)

    def test_naive_until_is_refused(self) -> None:
        """Sleep(until=naive datetime) is refused at construction, naming the fix."""
        with pytest.raises(ValueError, match="timezone"):
            Sleep("x", until=datetime(2030, 1, 1))

    # -- children ------------------------------------------------------------------------

    def _fanout(self, size: int, fail: set[int] | None = None) -> tuple[Workflow, Workflow]:
        failing = fail if fail is not None else set()

        def summarize(state: State) -> State:
            if state["n"] in failing:
                raise RuntimeError(f"child {state['n']} failed")
            return {"summary": state["n"] * 10}

        child = Workflow("summarize", [Step("summarize", summarize)])
        parent = Workflow(
            "fanout",
            [
                Step("docs", lambda s: {"docs": list(range(size))}),
                Map("sums", child, lambda s: [{"n": n} for n in s["docs"]]),
                Step("total", lambda s: {"total": sum(c["summary"] for c in s["sums"])}),
            ],
        )
        return parent, child

    def test_map_waits_for_children_and_merges_in_order(self, ops: Ops) -> None:
        """Map starts one child per item, waits, then merges their final states in order."""
        parent, child = self._fanout(5)
        with pytest.raises(Suspended) as info:
            ops.run("p", parent)
        assert info.value.waiting_for == "children 0 of 5"
        ids = [child_run_id("p", "sums", i) for i in range(5)]
        assert ids[0] == "p/sums/0"
        for child_id in reversed(ids):
            ops.run(child_id, child)
        state = ops.run("p", parent)
        assert [c["n"] for c in state["sums"]] == list(range(5)) and state["total"] == 100

    def test_map_failed_child_fails_the_step_and_retries_only_it(self, ops: Ops) -> None:
        """A failed child fails the Map naming it; running the parent again re-queues only it."""
        failing = {2}
        parent, child = self._fanout(4, failing)
        with pytest.raises(Suspended):
            ops.run("pf", parent)
        runs: Counter[str] = Counter()
        for i in range(4):
            runs[f"pf/sums/{i}"] += 1
            with contextlib.suppress(StepFailed):
                ops.run(f"pf/sums/{i}", child)
        with pytest.raises(StepFailed) as info:
            ops.run("pf", parent)
        assert "pf/sums/2" in str(info.value.__cause__)
        failing.clear()
        with pytest.raises(Suspended) as again:
            ops.run("pf", parent)  # re-queues child 2 only
        assert again.value.waiting_for == "children 3 of 4"
        requeued = ops.load("pf/sums/2")
        assert requeued is not None and requeued.status == "queued"
        ops.run("pf/sums/2", child)
        assert ops.run("pf", parent)["total"] == 60

    def test_map_runs_with_workers(self, ops: Ops, store_config: str) -> None:
        """A worker runs a parent and its 50 children to the end without anyone's help."""
        parent, _child = self._fanout(50)
        self.start(ops, parent, "big")
        with Serving(store_config, [parent], ops.mode, concurrency=8, poll=0.05):
            until("the parent to finish", lambda: ops.store.load("big").status == "done")  # type: ignore[union-attr]
        final = ops.load("big")
        assert final is not None and final.state["total"] == sum(n * 10 for n in range(50))

    def test_cancel_parent_cancels_children(self, ops: Ops) -> None:
        """Cancelling a parent waiting on children cancels the children too."""
        parent, _child = self._fanout(3)
        with pytest.raises(Suspended):
            ops.run("cp", parent)
        self.cancel(ops, "cp")
        for i in range(3):
            child = ops.load(f"cp/sums/{i}")
            assert child is not None and child.status == "cancelled"
        parent_cp = ops.load("cp")
        assert parent_cp is not None and parent_cp.status == "cancelled"

    def test_waiting_run_holds_no_lease(self, ops: Ops) -> None:
        """A waiting run has no owner: it costs no process, and its record says why it waits."""
        with pytest.raises(Suspended):
            ops.run("idle", [WaitFor("x", "never")])
        cp = ops.load("idle")
        assert cp is not None
        assert (cp.owner, cp.lease, cp.waiting_for) == (None, None, "signal never")
        info = {i.run_id: i for i in ops.list_info()}["idle"]
        assert info.status == "waiting" and info.owner is None
