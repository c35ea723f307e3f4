"""Time control in code workflows (issue 33): the deadline between and during ctx.step
calls, ``ctx.step(idle_timeout=)`` with ``ctx.heartbeat()``, ``ctx.submit(timeout=)``."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import fresh_config as _config
from stepstone import (
    Budget,
    CallFailed,
    InvalidWorkflow,
    RetryPolicy,
    Suspended,
    arun,
    current_call,
    open_store,
    run,
    signal,
    spend_of,
    start,
    stream,
    workflow,
)
from stepstone._deadline import DeadlineExceeded
from stepstone._store import Store
from stepstone.testing import FakeClock

State = dict[str, Any]
T0 = datetime(2030, 1, 1, tzinfo=UTC)
#: Real seconds a test waits for something that happens at once; never reached when green.
HANG = 30.0
NO_DELAY = RetryPolicy(max_attempts=3, initial_delay=0, jitter=0)


@pytest.fixture(params=("memory", "sqlite"))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each in-process backend."""
    with open_store(_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """The fake clock, from 2030-01-01 UTC."""
    with FakeClock(T0) as fake:
        yield fake


def _rid() -> str:
    return f"c-{uuid.uuid4().hex}"


def _drive(run_id: str, flow: Any, store: Store, mode: str) -> Any:
    if mode == "sync":
        return run(run_id, flow, store)
    return asyncio.run(arun(run_id, flow, store))


def _failed_at_deadline(store: Store, run_id: str) -> None:
    cp = store.load(run_id)
    assert cp is not None and cp.status == "failed" and cp.failure is not None
    assert cp.failure.error_type == "DeadlineExceeded"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_deadline_is_checked_between_ctx_step_calls(
    store: Store, clock: FakeClock, mode: str
) -> None:
    """Past the deadline the next ctx.step is not called: the run fails at that boundary."""
    called: list[str] = []

    def note(name: str) -> str:
        called.append(name)
        return name

    if mode == "sync":

        @workflow(f"between-{mode}")
        def flow(ctx: Any, data: State) -> str:
            ctx.step("a", note, "a")
            clock.advance(timedelta(hours=2))  # between the calls, in fake time
            return str(ctx.step("b", note, "b"))

    else:

        @workflow(f"between-{mode}")
        async def flow(ctx: Any, data: State) -> str:
            await ctx.step("a", note, "a")
            clock.advance(timedelta(hours=2))
            return str(await ctx.step("b", note, "b"))

    run_id = _rid()
    start(store, flow, run_id, deadline=timedelta(hours=1))
    with pytest.raises(DeadlineExceeded):
        _drive(run_id, flow, store, mode)
    assert called == ["a"]
    _failed_at_deadline(store, run_id)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_running_ctx_step_is_bounded_by_the_deadline(
    store: Store, clock: FakeClock, mode: str
) -> None:
    """A call still running at the deadline is given up; its late result is not journaled."""
    release = threading.Event()

    def hangs() -> str:
        clock.advance(timedelta(hours=2))  # the deadline falls while the call runs
        release.wait(HANG)
        return "late"

    if mode == "sync":

        @workflow(f"during-{mode}")
        def flow(ctx: Any, data: State) -> str:
            return str(ctx.step("hang", hangs, retry=NO_DELAY))

    else:

        @workflow(f"during-{mode}")
        async def flow(ctx: Any, data: State) -> str:
            return str(await ctx.step("hang", hangs, retry=NO_DELAY))

    run_id = _rid()
    start(store, flow, run_id, deadline=timedelta(hours=1))
    try:
        with pytest.raises(DeadlineExceeded):
            _drive(run_id, flow, store, mode)
    finally:
        release.set()
    _failed_at_deadline(store, run_id)
    cp = store.load(run_id)
    assert cp is not None and "late" not in str(cp.state)


def test_a_person_extends_the_deadline_of_a_code_workflow(store: Store, clock: FakeClock) -> None:
    """on_deadline='wait': the run waits at the call; a deadline signal lets it go on."""
    called: list[str] = []
    advanced: list[bool] = []

    @workflow("extend")
    def flow(ctx: Any, data: State) -> list[str]:
        ctx.step("a", called.append, "a")
        if not advanced:
            advanced.append(True)
            clock.advance(timedelta(hours=2))  # once: a replay after the extension does not
        ctx.step("b", called.append, "b")
        return called

    run_id = _rid()
    start(store, flow, run_id, deadline=timedelta(hours=1), on_deadline="wait")
    with pytest.raises(Suspended, match="signal deadline"):
        run(run_id, flow, store)
    assert called == ["a"]
    signal(store, run_id, "deadline", {"extend": 3600})
    assert run(run_id, flow, store)["result"] == ["a", "b"]


def test_ctx_step_idle_timeout_counts_from_the_last_heartbeat(
    store: Store, clock: FakeClock
) -> None:
    """Heartbeats keep a call alive past 3x its idle timeout; a silent call times out."""
    release = threading.Event()

    @workflow("idle")
    def flow(ctx: Any, data: State) -> list[str]:
        def beating() -> str:
            for _ in range(4):
                clock.advance(8)  # less than the idle timeout since the last heartbeat
                ctx.heartbeat()
            return "alive"

        def silent() -> str:
            clock.advance(11)  # longer than the idle timeout, no heartbeat
            release.wait(HANG)
            return "late"

        first = str(ctx.step("beating", beating, idle_timeout=10))
        try:
            ctx.step("silent", silent, idle_timeout=timedelta(seconds=10))
        except CallFailed as exc:
            return [first, exc.error_type, exc.message]
        return [first, "not timed out"]

    try:
        result = run(_rid(), flow, store)["result"]
    finally:
        release.set()
    assert result[:2] == ["alive", "StepTimeout"] and "idle_timeout" in result[2]


def test_ctx_submit_timeout_retries_a_hung_call(store: Store, clock: FakeClock) -> None:
    """ctx.submit(timeout=): the hung first attempt fails with StepTimeout, the retry runs."""
    release = threading.Event()
    calls: list[int] = []

    def fetch() -> str:
        calls.append(1)
        if len(calls) == 1:
            clock.advance(10)  # hung past its timeout, in fake time
            release.wait(HANG)
            return "late"
        return "fresh"

    @workflow("submitter")
    def flow(ctx: Any, data: State) -> str:
        return str(ctx.submit("fetch", fetch, retry=NO_DELAY, timeout=5).result())

    run_id = _rid()
    try:
        assert run(run_id, flow, store)["result"] == "fresh"
    finally:
        release.set()
    assert len(calls) == 2


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"idle_timeout": -1}, {"timeout": "1"}])
def test_bad_call_timeouts_are_refused(store: Store, kwargs: dict[str, Any]) -> None:
    """A bad timeout on ctx.submit or ctx.step is refused before the call runs."""
    calls: list[int] = []

    @workflow("bad-timeouts")
    def flow(ctx: Any, data: State) -> str:
        try:
            ctx.submit("s", calls.append, 1, **kwargs)
        except InvalidWorkflow as exc:
            return str(exc)
        return "accepted"

    message = run(_rid(), flow, store)["result"]
    assert "ctx.submit('s')" in message and calls == []


@pytest.mark.parametrize("is_async", [False, True])
def test_a_bad_idle_timeout_is_refused_on_a_replay_too(store: Store, is_async: bool) -> None:
    """ctx.step checks every argument before the journal answers: a replayed call with a
    bad idle_timeout is refused as a first call would be, not answered from the journal."""
    idle: list[float] = [5.0]

    @workflow("replayed-idle")
    def flow(ctx: Any, data: State) -> Any:
        try:
            value = ctx.step("a", lambda: "ran", idle_timeout=idle[0])
        except InvalidWorkflow as exc:
            return str(exc)
        return {"step": value, "then": ctx.wait_for("go")}

    @workflow("replayed-idle-async")
    async def aflow(ctx: Any, data: State) -> Any:
        try:
            value = await ctx.step("a", lambda: "ran", idle_timeout=idle[0])
        except InvalidWorkflow as exc:
            return str(exc)
        return {"step": value, "then": await ctx.wait_for("go")}

    def once(run_id: str) -> State:
        if is_async:
            return asyncio.run(arun(run_id, aflow, store))
        return run(run_id, flow, store)

    run_id = _rid()
    with pytest.raises(Suspended):
        once(run_id)  # "a" journaled, then waiting for "go"
    idle[0] = -1
    signal(store, run_id, "go")
    message = once(run_id)["result"]
    assert "ctx.step('a')" in message and "idle_timeout" in message


def test_async_ctx_step_idle_timeout_cancels_a_silent_call(store: Store, clock: FakeClock) -> None:
    """An async call silent past its idle timeout is cancelled; the retry heartbeats and ends."""
    seen: list[str] = []

    @workflow("aidle")
    async def flow(ctx: Any, data: State) -> str:
        async def fetch() -> str:
            ctx.heartbeat()
            if not seen:
                seen.append("first")
                try:
                    clock.advance(10)  # silent past the idle timeout, in fake time
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    seen.append("cancelled")
                    raise
            return "fresh"

        return str(await ctx.step("fetch", fetch, retry=NO_DELAY, idle_timeout=5))

    assert asyncio.run(arun(_rid(), flow, store))["result"] == "fresh"
    assert seen == ["first", "cancelled"]


def test_a_timed_out_calls_late_thread_writes_nothing(store: Store, clock: FakeClock) -> None:
    """The late thread of a timed-out ctx.step call, released while the retry runs, has
    no way to write to the run: its ctx.emit, ctx.reserve, ctx.charge and current_call's
    charge are refused, and nothing of it reaches the stream or the ledger."""
    release = threading.Event()
    outcomes: dict[str, str] = {}
    late_done = threading.Event()

    def late(ctx: Any) -> None:
        """What the late thread tries, each refusal by its error's name."""
        writes: tuple[tuple[str, Callable[[], object]], ...] = (
            ("emit", lambda: ctx.emit("late", 1)),
            ("reserve", lambda: ctx.reserve(usd=1.0)),
            ("charge", lambda: ctx.charge(usd=1.0, ref="late")),
            ("step_charge", lambda: current_call().charge(usd=1.0)),  # type: ignore[union-attr]
        )
        for name, write in writes:
            try:
                write()
                outcomes[name] = "written"
            except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
                outcomes[name] = type(exc).__name__
        late_done.set()

    @workflow("late-writer")
    def flow(ctx: Any, data: State) -> str:
        def fetch() -> str:
            attempt = current_call().attempt  # type: ignore[union-attr]
            if attempt == 1:
                ctx.emit("early", 1)  # before the timeout: the attempt's, hidden later
                clock.advance(10)  # hung past its timeout, in fake time
                assert release.wait(HANG), "the retry never let the late attempt go"
                late(ctx)
                return "late"
            release.set()  # the retry runs: the late thread writes now
            assert late_done.wait(HANG), "the late thread never finished its writes"
            ctx.emit("fresh", attempt)
            return "fresh"

        return str(ctx.step("fetch", fetch, retry=NO_DELAY, timeout=5))

    run_id = _rid()
    try:
        result = run(run_id, flow, store, budget=Budget(usd=100))
    finally:
        release.set()
    assert result["result"] == "fresh"
    assert outcomes == {
        "emit": "EmitOutsideStep",
        "reserve": "InvalidWorkflow",
        "charge": "InvalidWorkflow",
        "step_charge": "InvalidCharge",
    }
    cp = store.load(run_id)
    assert cp is not None and cp.status == "done"
    assert not [s for s in cp.signals if "reserve" in s.name], "a late reservation landed"
    assert spend_of(cp).usd == 0.0
    topics = [e.topic for e in stream(store, run_id, follow=False)]
    assert topics == ["fresh"], topics  # the late attempt's events are not the run's
