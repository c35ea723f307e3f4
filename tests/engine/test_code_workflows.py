"""Workflows as code (issue 31): ``@stepstone.workflow`` functions and their journal.

Each behaviour is pinned on the memory, file and SQLite stores, for a plain ``def``
workflow under ``run`` and under ``arun`` and for an ``async def`` one under ``arun``.
One body serves all three: written ``async``, it is driven step by step by a plain
``def`` whose context answers each ``await`` at once (``SyncAsAsync``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import stepstone
from code_support import State, calls_of, drive, make, mode, store
from stepstone import (
    CallFailed,
    InvalidState,
    InvalidWorkflow,
    RetryPolicy,
    RunCancelled,
    StepFailed,
    Store,
    Suspended,
    Worker,
    WorkflowChanged,
    arun,
    cancel,
    open_store,
    run,
    signal,
    start,
)
from stepstone import _statelog as sl
from stepstone._checkpoint import Stored, utcnow
from stepstone._codec import decode_json
from stepstone._journal import JOURNAL_KEY
from stepstone.testing._barrier import WAIT_TIMEOUT
from waiting import status_of, until

#: The fixtures this module takes from code_support (imported to be found by pytest).
__all__ = ["mode", "store"]


def test_calls_run_once_and_the_journal_answers_them_on_resume(store: Store, mode: str) -> None:
    """Each call runs once; resumed after a wait, the journal answers every earlier call."""
    calls: list[Any] = []

    def work(x: Any) -> State:
        calls.append(x)
        return {"x": x}

    async def body(ctx: Any, input: State) -> Any:
        first = await ctx.step("draft", work, input["n"])
        for i in range(3):
            await ctx.step("revise", work, i)
        approved = await ctx.wait_for("approve")
        last = await ctx.step("send", work, approved["ok"])
        return {"first": first, "last": last}

    flow = make("loop", body, mode)
    with pytest.raises(Suspended):
        drive(mode, "r", flow, store, input={"n": 5})
    assert calls == [5, 0, 1, 2]
    waiting = store.load("r")
    assert waiting is not None and waiting.waiting_for == "signal approve"
    assert signal(store, "r", "approve", {"ok": True})
    state = drive(mode, "r", flow, store)
    assert calls == [5, 0, 1, 2, True]
    assert state["result"] == {"first": {"x": 5}, "last": {"x": True}}
    assert calls_of(state) == [
        "draft#1",
        "revise#1",
        "revise#2",
        "revise#3",
        "@wait:approve#1",
        "send#1",
    ]
    assert [entry["seq"] for entry in state[JOURNAL_KEY]] == list(range(6))
    assert drive(mode, "r", flow, store) == state and len(calls) == 5  # done: nothing runs


def test_sleep_saves_the_run_waiting_and_never_moves_its_due_time(store: Store, mode: str) -> None:
    """``ctx.sleep`` leaves the run waiting until a fixed time; then the function goes on."""
    calls: list[str] = []

    def work(x: str) -> str:
        calls.append(x)
        return x

    async def body(ctx: Any, input: State) -> Any:
        await ctx.step("before", work, "a")
        due = await ctx.sleep(timedelta(seconds=0.5))
        await ctx.step("after", work, "b")
        return due.isoformat()

    flow = make("sleeper", body, mode)
    with pytest.raises(Suspended) as first:
        drive(mode, "s", flow, store)
    wake_at = first.value.wake_at
    assert wake_at is not None and calls == ["a"]
    if utcnow() < wake_at:
        with pytest.raises(Suspended) as again:
            drive(mode, "s", flow, store)
        assert again.value.wake_at == wake_at and calls == ["a"]
    time.sleep(max(0.0, (wake_at - utcnow()).total_seconds()) + 0.01)  # until it is due
    state = drive(mode, "s", flow, store)
    assert calls == ["a", "b"]
    assert datetime.fromisoformat(state["result"]) == wake_at
    assert calls_of(state) == ["before#1", "@sleep#1", "after#1"]
    done = store.load("s")
    assert done is not None and done.waiting_for is None and done.status == "done"


def test_wait_for_timeout_gives_the_default_or_fails_the_call(store: Store, mode: str) -> None:
    """A wait past its timeout returns ``default``; without one the call fails (WaitTimeout)."""

    async def body(ctx: Any, input: State) -> Any:
        given = await ctx.wait_for("maybe", timeout=0, default={"ok": False})
        try:
            await ctx.wait_for("never", timeout=timedelta(0))
        except CallFailed as exc:
            return [given, exc.error_type, exc.call, exc.seq]
        raise AssertionError("the wait did not time out")

    state = drive(mode, "w", make("waits", body, mode), store)
    assert state["result"] == [{"ok": False}, "WaitTimeout", "@wait:never#1", 1]


def test_a_failed_call_is_journaled_with_its_attempts_and_replayed(store: Store, mode: str) -> None:
    """Retries run inside the call; its final failure is journaled and replayed, not rerun."""
    tries: list[str] = []

    def flaky(name: str) -> str:
        tries.append(name)
        if name == "broken" or tries.count(name) < 3:
            raise ValueError(f"{name} failed")
        return name

    policy = RetryPolicy(max_attempts=3, initial_delay=0, jitter=0)

    async def body(ctx: Any, input: State) -> Any:
        ok = await ctx.step("flaky", flaky, "flaky", retry=policy)
        try:
            await ctx.step("broken", flaky, "broken", retry=RetryPolicy(2, initial_delay=0))
        except CallFailed as exc:
            failed = [exc.error_type, exc.message, exc.attempt, exc.call]
        await ctx.wait_for("go")
        return [ok, failed]

    flow = make("retries", body, mode)
    with pytest.raises(Suspended):
        drive(mode, "f", flow, store)
    assert tries == ["flaky"] * 3 + ["broken"] * 2
    signal(store, "f", "go")
    state = drive(mode, "f", flow, store)
    assert tries == ["flaky"] * 3 + ["broken"] * 2  # replayed, never called again
    assert state["result"] == ["flaky", ["ValueError", "broken failed", 2, "broken#1"]]
    entries = state[JOURNAL_KEY]
    assert entries[0]["attempt"] == 3 and entries[0]["result"] == "flaky"
    assert not state.get("~attempts")  # counted before each attempt, dropped once journaled
    assert entries[1]["error"] == {"type": "ValueError", "message": "broken failed"}


def test_a_call_knows_its_position_attempt_and_idempotency_key(store: Store, mode: str) -> None:
    """``current_call()`` inside a call's function gives a key the same on every attempt."""
    seen: list[tuple[str, int, int, str]] = []

    def charge(x: int) -> int:
        call = stepstone.current_call()
        assert call is not None and call.run_id == "i"
        seen.append((call.step_name, call.step_index, call.attempt, call.idempotency_key))
        if call.attempt < 2:
            raise ValueError("flaky")
        return x

    policy = RetryPolicy(2, initial_delay=0)

    async def body(ctx: Any, input: State) -> Any:
        first = await ctx.step("charge", charge, 1, retry=policy)
        return first + await ctx.step("charge", charge, 2, retry=policy)

    assert drive(mode, "i", make("keys", body, mode), store)["result"] == 3
    assert [(name, index, attempt) for name, index, attempt, _ in seen] == [
        ("charge#1", 0, 1),
        ("charge#1", 0, 2),
        ("charge#2", 1, 1),
        ("charge#2", 1, 2),
    ]
    keys = [key for *_, key in seen]
    assert keys[0] == keys[1] != keys[2] == keys[3] and len(keys[0]) == 32
    assert stepstone.current_call() is None


def test_now_and_uuid_are_journaled(store: Store, mode: str) -> None:
    """``ctx.now()`` and ``ctx.uuid()`` give the same values when the function re-runs."""

    async def body(ctx: Any, input: State) -> Any:
        when = await ctx.now()
        ident = await ctx.uuid()
        await ctx.wait_for("go")
        return [when.isoformat(), ident]

    flow = make("clock", body, mode)
    with pytest.raises(Suspended):
        drive(mode, "n", flow, store)
    first = store.load("n")
    assert first is not None
    recorded = [entry["result"] for entry in first.state[JOURNAL_KEY]]
    signal(store, "n", "go")
    assert drive(mode, "n", flow, store)["result"] == recorded


def test_another_call_order_raises_workflow_changed_and_parks_the_run(
    store: Store, mode: str
) -> None:
    """A replay meeting another call than the journal's parks the run, naming both calls."""
    ran: list[str] = []

    def work(x: str) -> str:
        ran.append(x)
        return x

    async def original(ctx: Any, input: State) -> Any:
        await ctx.step("a", work, "a")
        return await ctx.wait_for("go")

    async def edited(ctx: Any, input: State) -> Any:
        await ctx.step("b", work, "b")
        return await ctx.wait_for("go")

    with pytest.raises(Suspended):
        drive(mode, "c", make("changing", original, mode), store)
    signal(store, "c", "go", "went")
    with pytest.raises(WorkflowChanged) as caught:
        drive(mode, "c", make("changing", edited, mode), store)
    message = str(caught.value)
    assert "call 0 is 'b#1' now" in message and "recorded 'a#1'" in message
    assert caught.value.position == 0 and ran == ["a"]
    parked = store.load("c")
    assert parked is not None and parked.status == "failed" and parked.owner is None
    assert parked.failure is not None and parked.failure.error_type == "WorkflowChanged"
    # The code it was started with resumes it; the signal was not consumed meanwhile.
    assert drive(mode, "c", make("changing", original, mode), store)["result"] == "went"
    assert ran == ["a"]


def test_returning_before_the_journaled_calls_is_a_change(store: Store, mode: str) -> None:
    """A function that now makes fewer calls than its journal holds is refused the same way."""

    async def two(ctx: Any, input: State) -> Any:
        await ctx.step("a", str, 1)
        return await ctx.wait_for("go")

    async def none(ctx: Any, input: State) -> Any:
        return "early"

    with pytest.raises(Suspended):
        drive(mode, "e", make("shrinking", two, mode), store)
    signal(store, "e", "go")
    with pytest.raises(WorkflowChanged, match="returned after 0 calls.*'a#1' as call 0"):
        drive(mode, "e", make("shrinking", none, mode), store)
    parked = store.load("e")
    assert parked is not None and parked.status == "failed" and parked.owner is None
    assert parked.failure is not None and parked.failure.error_type == "WorkflowChanged"


def test_a_non_json_result_names_the_call_its_ordinal_and_path(store: Store, mode: str) -> None:
    """A result that is not JSON fails the call with its name, ordinal and path; no entry."""

    async def body(ctx: Any, input: State) -> Any:
        await ctx.step("fine", str, 1)
        return await ctx.step("bad", lambda: {"a": [1, {2}]})

    with pytest.raises(StepFailed) as caught:
        drive(mode, "j", make("nonjson", body, mode), store)
    error = caught.value.__cause__
    assert isinstance(error, InvalidState)
    assert "call 1 ('bad#1')" in str(error) and error.path == "result['a'][1]"
    failed = store.load("j")
    assert failed is not None and calls_of(failed.state) == ["fine#1"]


def test_calls_inside_a_call_or_after_the_return_are_refused(store: Store, mode: str) -> None:
    """``ctx.step`` inside a step's function, or after the workflow returned, is an error."""
    kept: list[Any] = []

    async def body(ctx: Any, input: State) -> Any:
        kept.append(ctx)

        def nested() -> Any:
            return (
                kept[0].ctx.step("inner", str, 1)
                if mode != "async-arun"
                else ctx.step("inner", str, 1)
            )

        try:
            await ctx.step("outer", nested)
        except CallFailed as exc:
            return exc.message
        return "no error"

    state = drive(mode, "m", make("misuse", body, mode), store)
    assert "called inside the function of call 'outer#1'" in state["result"]
    later = kept[0] if mode == "async-arun" else kept[0].ctx
    with pytest.raises(InvalidWorkflow, match="after workflow 'misuse' returned"):
        later.step("late", str, 1)


def test_a_cancel_request_stops_the_function_at_its_next_journaled_call(
    store: Store, mode: str
) -> None:
    """A run cancelled while its function runs stops once the call in flight is journaled."""
    ran: list[int] = []

    def work(x: int) -> int:
        ran.append(x)
        if x == 1:
            cancel(store, "k")  # another writer, while call 1 runs
        return x

    async def body(ctx: Any, input: State) -> Any:
        for i in range(4):
            await ctx.step("work", work, i)
        return "finished"

    with pytest.raises(RunCancelled):
        drive(mode, "k", make("cancelled", body, mode), store)
    assert ran == [0, 1]
    cp = store.load("k")
    assert cp is not None and cp.status == "cancelled" and cp.owner is None
    assert calls_of(cp.state) == ["work#1", "work#2"]


def test_an_exception_leaving_the_function_fails_the_run(store: Store, mode: str) -> None:
    """An exception out of the function fails the run like a failing step, saved on it."""

    async def body(ctx: Any, input: State) -> Any:
        await ctx.step("fine", str, 1)
        raise KeyError("no such ticket")

    with pytest.raises(StepFailed) as caught:
        drive(mode, "x", make("raising", body, mode), store)
    assert isinstance(caught.value.__cause__, KeyError)
    failed = store.load("x")
    assert failed is not None and failed.status == "failed" and failed.owner is None
    assert failed.failure is not None and failed.failure.error_type == "KeyError"
    assert failed.failure.step_name == "raising" and calls_of(failed.state) == ["fine#1"]


def test_the_lease_is_renewed_while_a_call_runs(store: Store, mode: str) -> None:
    """A call that outlasts a third of the lease sees the run's lease renewed meanwhile."""

    def renewed() -> bool:
        cp = store.load("l")
        assert cp is not None and cp.renewed_at is not None
        first = cp.renewed_at
        deadline = time.monotonic() + WAIT_TIMEOUT
        while True:
            now = store.load("l")
            assert now is not None and now.renewed_at is not None
            if now.renewed_at > first:
                return True
            assert time.monotonic() < deadline, "the lease was never renewed during the call"
            time.sleep(0.02)

    async def body(ctx: Any, input: State) -> Any:
        return await ctx.step("long", renewed)

    assert drive(mode, "l", make("renewing", body, mode), store, lease=0.6)["result"] is True


def test_map_runs_child_runs_and_the_journal_keeps_their_results(store: Store, mode: str) -> None:
    """``ctx.map`` waits for one child run per input, then returns their results in order."""
    doubled: list[int] = []

    def double(x: int) -> int:
        doubled.append(x)
        return 2 * x

    @stepstone.workflow("child", version="1")
    def child(ctx: stepstone.WorkflowContext, input: State) -> Any:
        return ctx.step("double", double, input["x"])

    async def body(ctx: Any, input: State) -> Any:
        results = await ctx.map("kids", child, [{"x": x} for x in (1, 2, 3)])
        return sum(results)

    flow = make("parent", body, mode)
    with pytest.raises(Suspended) as waiting:
        drive(mode, "p", flow, store)
    assert waiting.value.waiting_for == "children 0 of 3"
    parent = store.load("p")
    assert parent is not None
    assert parent.children == tuple(f"p/@map:kids#1/{i}" for i in range(3))
    for child_id in parent.children:
        run(child_id, child, store)  # what a worker serving ``child`` does
    state = drive(mode, "p", flow, store)
    assert state["result"] == 12 and sorted(doubled) == [1, 2, 3]
    assert calls_of(state) == ["@map:kids#1"] and state[JOURNAL_KEY][0]["result"] == [2, 4, 6]
    done = store.load("p")
    assert done is not None and done.children == () and done.status == "done"


def test_a_failed_child_fails_the_map_call(store: Store, mode: str) -> None:
    """A child run that fails makes ``ctx.map`` raise ``CallFailed`` naming the child."""

    def broken(x: int) -> int:
        raise ValueError(f"bad {x}")

    @stepstone.workflow("failing-child", version="1")
    def child(ctx: stepstone.WorkflowContext, input: State) -> Any:
        return ctx.step("broken", broken, input["x"])

    async def body(ctx: Any, input: State) -> Any:
        try:
            await ctx.map("kids", child, [{"x": 1}])
        except CallFailed as exc:
            return [exc.error_type, exc.message]
        raise AssertionError("the map did not fail")

    flow = make("parent-of-failing", body, mode)
    with pytest.raises(Suspended):
        drive(mode, "p", flow, store)
    with pytest.raises(StepFailed):
        run("p/@map:kids#1/0", child, store)
    error_type, message = drive(mode, "p", flow, store)["result"]
    assert error_type == "ChildFailed" and "'p/@map:kids#1/0' failed" in message


def test_a_thread_the_workflow_did_not_start_is_refused(store: Store) -> None:
    """A plain workflow's context refuses calls from other threads (no thread pool yet)."""
    errors: list[BaseException] = []

    @stepstone.workflow("threads")
    def body(ctx: stepstone.WorkflowContext, input: State) -> Any:
        def other() -> None:
            try:
                ctx.step("x", str, 1)
            except InvalidWorkflow as exc:
                errors.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(WAIT_TIMEOUT)
        return len(errors)

    assert run("t", body, store)["result"] == 1
    assert "from a thread workflow 'threads' did not start" in str(errors[0])


def test_parallel_calls_keep_call_order_and_are_journaled_as_they_complete(
    store: Store,
) -> None:
    """Gathered calls are numbered as written and each is saved when it completes."""
    finished: list[int] = []

    async def body(ctx: stepstone.AsyncWorkflowContext, input: State) -> Any:
        events = [asyncio.Event() for _ in range(3)]

        async def tool(i: int) -> int:
            if i < 2:
                await asyncio.wait_for(events[i + 1].wait(), WAIT_TIMEOUT)
            finished.append(i)
            events[i].set()
            return i * 10

        return await asyncio.gather(*(ctx.step("tool", tool, i) for i in range(3)))

    state = asyncio.run(arun("p", stepstone.workflow("fan")(body), store))
    assert finished == [2, 1, 0] and state["result"] == [0, 10, 20]
    assert [(e["seq"], e["call"]) for e in state[JOURNAL_KEY]] == [
        (2, "tool#3"),
        (1, "tool#2"),
        (0, "tool#1"),
    ]


@pytest.mark.parametrize("under", ["run", "arun"])
def test_submitted_calls_keep_call_order_and_are_journaled_as_they_complete(
    store: Store, under: str
) -> None:
    """A plain workflow's ``ctx.submit`` calls run in parallel, numbered as written."""
    finished: list[int] = []

    def journaled(call: str) -> bool:
        cp = store.load("p")
        assert cp is not None
        return call in calls_of(cp.state) if JOURNAL_KEY in cp.state else False

    def tool(i: int) -> int:
        if i < 2:  # each ends only once the next one's entry is saved: they end in reverse
            until(f"tool#{i + 2} to be journaled", lambda: journaled(f"tool#{i + 2}"))
        finished.append(i)
        return i * 10

    @stepstone.workflow("pool")
    def body(ctx: stepstone.WorkflowContext, input: State) -> Any:
        futures = [ctx.submit("tool", tool, i) for i in range(3)]
        return [future.result(WAIT_TIMEOUT) for future in futures]

    mode = "def-run" if under == "run" else "def-arun"
    state = drive(mode, "p", body, store)
    assert finished == [2, 1, 0] and state["result"] == [0, 10, 20]
    assert [(e["seq"], e["call"]) for e in state[JOURNAL_KEY]] == [
        (2, "tool#3"),
        (1, "tool#2"),
        (0, "tool#1"),
    ]
    finished.clear()
    assert drive(mode, "p", body, store) == state and finished == []


def test_an_interrupted_gather_reruns_only_its_unfinished_calls(store: Store) -> None:
    """Cancelled mid-gather, the run resumes running only the calls not yet journaled."""
    started: list[int] = []
    hold = [True]

    async def body(ctx: stepstone.AsyncWorkflowContext, input: State) -> Any:
        async def tool(i: int) -> int:
            started.append(i)
            if i == 0 and hold[0]:
                await asyncio.Event().wait()  # until cancelled
            return i

        return await asyncio.gather(*(ctx.step("tool", tool, i) for i in range(3)))

    flow = stepstone.workflow("gather")(body)

    async def interrupted() -> None:
        task = asyncio.create_task(arun("g", flow, store))
        deadline = time.monotonic() + WAIT_TIMEOUT
        while True:
            cp = await store.aload("g")
            if cp is not None and len(cp.state.get(JOURNAL_KEY, [])) == 2:
                break
            assert time.monotonic() < deadline, "calls 1 and 2 were never journaled"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(interrupted())
    assert sorted(started) == [0, 1, 2]
    cp = store.load("g")
    assert cp is not None and cp.owner is None  # given back on cancellation
    started.clear()
    hold[0] = False
    state = asyncio.run(arun("g", flow, store))
    assert started == [0] and state["result"] == [0, 1, 2]


def test_an_async_workflow_is_refused_by_run(store: Store) -> None:
    """An ``async def`` workflow under the sync ``run`` is refused before anything runs."""

    @stepstone.workflow("async-only")
    async def body(ctx: stepstone.AsyncWorkflowContext, input: State) -> Any:
        return 1

    with pytest.raises(InvalidWorkflow, match="arun"):
        run("a", body, store)
    assert store.load("a") is None


def test_an_async_workflow_is_refused_by_a_sync_worker(store: Store) -> None:
    """``Worker.serve`` refuses an ``async def`` workflow up front, as it does async steps."""

    @stepstone.workflow("async-served")
    async def body(ctx: stepstone.AsyncWorkflowContext, input: State) -> Any:
        return 1

    with pytest.raises(InvalidWorkflow, match="aserve"):
        Worker(store, [body]).serve()


def test_reserved_and_bad_names_are_refused(store: Store) -> None:
    """A step's name may not start with '@' (the context's own calls) and must be a name."""

    @stepstone.workflow("names")
    def body(ctx: stepstone.WorkflowContext, input: State) -> Any:
        found = []
        for name in ("@now", ""):
            try:
                ctx.step(name, str, 1)
            except InvalidWorkflow as exc:
                found.append(str(exc))
        return found

    found = run("n", body, store)["result"]
    assert "may not start with '@'" in found[0] and "non-empty str" in found[1]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_each_journal_entry_is_saved_as_an_append(kind: str, tmp_path: Path) -> None:
    """With a long state, each journaled call's save is one op holding only its entry."""
    config = (
        f"memory://append-{time.monotonic_ns()}"
        if kind == "memory"
        else (f"sqlite:///{tmp_path}/runs.db")
    )
    with open_store(config) as store:
        saved: list[Any] = []
        real = store.save

        def recording(cp: Any) -> Any:
            result = real(cp)
            saved.append(result)
            return result

        store.save = recording  # type: ignore[method-assign,assignment]

        @stepstone.workflow("long")
        def body(ctx: stepstone.WorkflowContext, input: State) -> Any:
            return [ctx.step("call", str, i) for i in range(5)]

        run("l", body, store, input={"blob": "x" * (sl.INLINE_MAX + 1000)})
        journaled = [cp for cp in saved if len(cp.state.get(JOURNAL_KEY, [])) > 0]
        assert len(journaled) >= 5
        for n, cp in enumerate(journaled[:5]):
            handle = cp.stored_state
            assert isinstance(handle, Stored) and handle.ref is not None
            keys = sl.pieces_of(handle.ref)[len(handle.ref["base"]) :]
            assert keys, "the journal's save was written whole"
            ops = decode_json(store.pieces(cp.run_id, [keys[-1]])[keys[-1]].decode())
            entry = cp.state[JOURNAL_KEY][-1]
            # The first entry makes the list (a set), each later one is an append.
            assert ops == [["s" if n == 0 else "x", [JOURNAL_KEY], [entry]]]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["serve", "aserve"])
def test_a_worker_runs_a_started_code_workflow(store: Store, asynchronous: bool) -> None:
    """``start`` queues a code workflow and a worker runs it to the end, waits included."""

    def work(x: int) -> int:
        return x + 1

    if asynchronous:

        @stepstone.workflow("served", version="1")
        async def served(ctx: stepstone.AsyncWorkflowContext, input: State) -> Any:
            got = await ctx.wait_for("go")
            return await ctx.step("add", work, got)

        flow = served
    else:

        @stepstone.workflow("served", version="1")
        def plain(ctx: stepstone.WorkflowContext, input: State) -> Any:
            return ctx.step("add", work, ctx.wait_for("go"))

        flow = plain
    start(store, flow, "w", {"n": 1})
    worker = Worker(store, [flow])
    if asynchronous:
        thread = threading.Thread(target=lambda: asyncio.run(worker.aserve()), daemon=True)
    else:
        thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        until("the run to wait", lambda: status_of(store, "w") == "waiting")
        signal(store, "w", "go", 41)
        until("the run to finish", lambda: status_of(store, "w") == "done")
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    done = store.load("w")
    assert done is not None and done.state["result"] == 42


def test_a_stopping_worker_hands_the_run_over_at_the_next_journaled_call(store: Store) -> None:
    """Stopped while a call runs, a worker journals that call, then gives the run back."""
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> str:
        ran.append("slow")
        entered.set()
        assert release.wait(WAIT_TIMEOUT), "the test never released the call"
        return "slow"

    def fast() -> str:
        ran.append("fast")
        return "fast"

    @stepstone.workflow("handover", version="1")
    def body(ctx: stepstone.WorkflowContext, input: State) -> Any:
        return [ctx.step("slow", slow), ctx.step("fast", fast)]

    start(store, body, "h")
    worker = Worker(store, [body])
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        assert entered.wait(WAIT_TIMEOUT), "the worker never ran the first call"
        stopping = threading.Thread(target=worker.stop, daemon=True)
        stopping.start()
        until("the worker to be stopping", lambda: worker.stopping)
        release.set()
        stopping.join(WAIT_TIMEOUT)
    finally:
        release.set()
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    handed = store.load("h")
    assert handed is not None and handed.owner is None and handed.status != "done"
    assert calls_of(handed.state) == ["slow#1"] and ran == ["slow"]
    assert run("h", body, store)["result"] == ["slow", "fast"]
    assert ran == ["slow", "fast"]


def test_plain_workflows_under_arun_hold_no_thread_of_the_loops_executor(tmp_path: Path) -> None:
    """A plain ``def`` workflow's blocked call under ``arun`` leaves the loop's executor free."""
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()

    @stepstone.workflow("blocked")
    def blocked(ctx: stepstone.WorkflowContext, input: State) -> Any:
        return ctx.step("wait", release.wait, WAIT_TIMEOUT)

    @stepstone.workflow("releasing")
    def releasing(ctx: stepstone.WorkflowContext, input: State) -> Any:
        ctx.step("first", str, 1)  # its save runs in the executor (the file store's asave)

        def set_it() -> str:
            release.set()
            return "released"

        return ctx.step("release", set_it)

    async def both(store: Store) -> list[State]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        runs = [arun("b1", blocked, store), arun("b2", blocked, store)]
        runs.append(arun("r", releasing, store))
        return await asyncio.wait_for(asyncio.gather(*runs), WAIT_TIMEOUT / 2)

    with open_store(f"file://{tmp_path}/runs") as store:
        try:
            states = asyncio.run(both(store))
        finally:
            release.set()
    assert [state["result"] for state in states] == [True, True, "released"]
