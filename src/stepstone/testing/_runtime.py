"""``RuntimeContract``: leases, workers, cancellation and suspended runs, on every backend.

The runtime builds only on the Store contract (compare-and-swap saves and the claim
index), so every backend must show the same ownership behaviour: exactly one claimant
wins, a takeover happens only after a whole lease without renewal, a fenced owner writes
nothing, signals are applied exactly once. Each test runs in both forms (``ops``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from .._checkpoint import Checkpoint, utcnow
from .._control import acancel, asignal, astart, cancel, signal, start
from .._errors import (
    ConflictError,
    InputMismatch,
    LeaseLost,
    RunCancelled,
    RunNotActive,
    RunNotFound,
    RunOwned,
    StepFailed,
    Suspended,
    WorkflowChanged,
)
from .._lease import claimed, released
from .._registry import open_store
from .._steps import Step, Workflow
from .._store import RunInfo, Store
from .._suspend import Map, Sleep, WaitFor, child_run_id
from .._worker import Worker
from ._barrier import WAIT_TIMEOUT
from ._base import ContractBase
from ._ops import Ops

__all__ = ["RuntimeContract", "until"]

State = dict[str, Any]


def until(what: str, check: Callable[[], bool], timeout: float = WAIT_TIMEOUT) -> None:
    """Poll ``check`` until true; fail naming ``what`` if ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.01)


#: Seconds of a timer or a signal's timeout in the tests: longer than any save on a loaded
#: machine, so a run always suspends first; the tests then move the clock past it.
_LONG = 3600.0


#: The lease of an owner that must be seen alive: its renewals come every third of it, so
#: only a stall of two thirds of it (not a loaded machine's hiccup) could look like death.
_LIVE_LEASE = 2.0


def _clock_ahead(monkeypatch: pytest.MonkeyPatch, due: datetime) -> None:
    """Move the clocks that end a wait to a second past ``due``: time driven, not waited for.

    Those are the suspending steps' clock and the worker's claim query's.
    """
    offset = due - utcnow() + timedelta(seconds=1)
    for module in ("stepstone._suspend", "stepstone._worker"):
        monkeypatch.setattr(f"{module}.utcnow", lambda: utcnow() + offset)


class _Serving:
    """A Worker on its own store, serving in a thread for the length of a ``with`` block.

    In the async form the thread runs ``aserve`` on an event loop of its own, with a
    store opened there, so a native async driver's connections stay on one loop.
    """

    def __init__(self, config: str, workflows: list[Workflow], mode: str, **options: Any) -> None:
        self.config = config
        self.workflows = workflows
        self.mode = mode
        self.options = options
        self.worker: Worker | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name=f"{mode} worker")

    def _serve(self) -> None:
        import asyncio  # noqa: PLC0415

        try:
            if self.mode == "async":

                async def main() -> None:
                    async with open_store(self.config) as store:
                        self.worker = Worker(store, self.workflows, **self.options)
                        self.ready.set()
                        await self.worker.aserve()

                asyncio.run(main())
            else:
                with open_store(self.config) as store:
                    self.worker = Worker(store, self.workflows, **self.options)
                    self.ready.set()
                    self.worker.serve()
        except BaseException as exc:
            self.error = exc
            self.ready.set()

    def __enter__(self) -> Worker:
        self.thread.start()
        if not self.ready.wait(WAIT_TIMEOUT):
            raise AssertionError(f"the {self.mode} worker did not start in {WAIT_TIMEOUT}s")
        if self.worker is None:
            raise AssertionError(f"the {self.mode} worker failed to start: {self.error!r}")
        return self.worker

    def stop(self) -> None:
        """Stop the worker and wait for its thread; fail naming it if it hangs."""
        if self.worker is not None:
            self.worker.stop()
        self.thread.join(WAIT_TIMEOUT)
        if self.thread.is_alive():
            raise AssertionError(f"the {self.mode} worker did not stop in {WAIT_TIMEOUT}s")

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self.error is not None:
            raise self.error


class RuntimeContract(ContractBase):
    """Ownership, workers and suspension; mixed into ``StoreContract``."""

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def start(ops: Ops, workflow: Workflow, run_id: str, input: State | None = None) -> RunInfo:
        """``start`` / ``astart``."""
        s = ops.store
        return ops.call(
            lambda: start(s, workflow, run_id, input), lambda: astart(s, workflow, run_id, input)
        )

    @staticmethod
    def cancel(ops: Ops, run_id: str) -> RunInfo:
        """``cancel`` / ``acancel``."""
        s = ops.store
        return ops.call(lambda: cancel(s, run_id), lambda: acancel(s, run_id))

    @staticmethod
    def signal(
        ops: Ops, run_id: str, name: str, payload: Any, signal_id: str | None = None
    ) -> bool:
        """``signal`` / ``asignal``."""
        s = ops.store
        return ops.call(
            lambda: signal(s, run_id, name, payload, signal_id=signal_id),
            lambda: asignal(s, run_id, name, payload, signal_id=signal_id),
        )

    @staticmethod
    def _ghost(store: Store, run_id: str, lease: float, steps: int = 2) -> Checkpoint:
        """Store a run claimed by an owner that will never renew (it 'died')."""
        fresh = Checkpoint(run_id=run_id, total_steps=steps)
        return store.save(claimed(fresh, "ghost:host:1:dead", lease))

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

                    run("held", [Step("hold", hold)], other, lease=_LIVE_LEASE)
                except BaseException as exc:
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
            _Serving(store_config, [flow], ops.mode, concurrency=3, lease=5, poll=0.05),
            _Serving(store_config, [flow], ops.mode, concurrency=3, lease=5, poll=0.05),
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
        with _Serving(store_config, [flow], ops.mode, lease=5, poll=0.05):
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
        with _Serving(store_config, [v1], ops.mode, poll=0.05):
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
        serving = _Serving(store_config, [flow], ops.mode, lease=30, poll=0.05)
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
        with pytest.raises(RunNotActive):
            self.signal(ops, "ap", "approve", 1, signal_id="s1")

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
            except BaseException as exc:
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
        with_default = [WaitFor("answer", "reply", timeout=_LONG, default="none")]
        with pytest.raises(Suspended) as info:
            ops.run("t1", with_default)
        wake = info.value.wake_at
        assert wake is not None
        without = [WaitFor("answer", "reply", timeout=_LONG)]
        with pytest.raises(Suspended) as second:
            ops.run("t2", without)
        deadline = second.value.wake_at
        assert deadline is not None
        _clock_ahead(monkeypatch, max(wake, deadline))
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
        flow = [Sleep("nap", duration=_LONG), Step("after", lambda s: {"after": True})]
        with pytest.raises(Suspended) as info:
            ops.run("nap", flow)
        wake = info.value.wake_at
        assert wake is not None and info.value.waiting_for == "timer"
        stored = ops.load("nap")
        assert stored is not None and stored.wake_at == wake and stored.owner is None
        due = {i.run_id for i in ops.claimable(wake + timedelta(seconds=1))}
        assert "nap" in due
        _clock_ahead(monkeypatch, wake)
        state = ops.run("nap", flow)
        assert state == {"nap": wake.astimezone(UTC).isoformat(), "after": True}

    def test_sleep_across_a_worker_restart(
        self, ops: Ops, store_config: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A sleeping run survives its worker stopping; a new worker wakes it when due."""
        flow = Workflow("nap", [Sleep("nap", duration=_LONG), Step("after", lambda s: {"ok": 1})])
        self.start(ops, flow, "restart")
        with _Serving(store_config, [flow], ops.mode, poll=0.05):
            until("the run to sleep", lambda: ops.store.load("restart").status == "waiting")  # type: ignore[union-attr]
        slept = ops.load("restart")
        assert slept is not None and slept.wake_at is not None
        _clock_ahead(monkeypatch, slept.wake_at)
        with _Serving(store_config, [flow], ops.mode, poll=0.05):
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
        with _Serving(store_config, [parent], ops.mode, concurrency=8, poll=0.05):
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
