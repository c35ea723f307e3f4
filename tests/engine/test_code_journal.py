"""Workflows as code (issue 31): the journal's own values, upgrades, fork and rerun per call.

Pinned on the memory, file and SQLite stores, for a plain ``def`` workflow under ``run``
and under ``arun`` and an ``async def`` one under ``arun`` (``code_support``'s
``make``/``drive``); journal, fork and rerun once more on PostgreSQL and MySQL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from code_support import MODES, Body, Done, SyncAsAsync, calls_of, drive, store
from stepstone import CodeWorkflow, Store, Suspended, WorkflowChanged, signal
from stepstone._journal import JOURNAL_KEY
from stepstone.testing._barrier import WAIT_TIMEOUT

__all__ = ["MODES", "store"]

State = dict[str, Any]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """How the workflow is written and driven."""
    return str(request.param)


class _Ctx(SyncAsAsync):
    """``SyncAsAsync`` with the calls this module adds."""

    def random(self) -> Done:
        return Done(self.ctx.random())


def make(name: str, body: Body, mode: str, version: str = "1", **kwargs: Any) -> CodeWorkflow:
    """``code_support.make``, with ``_Ctx`` and ``workflow``'s keywords."""
    if mode == "async-arun":
        return stepstone.workflow(name, version=version, **kwargs)(body)

    def plain(ctx: Any, input: State) -> Any:
        coroutine = body(_Ctx(ctx), input)
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value
        coroutine.close()
        raise AssertionError("a body driven by a plain def awaited something real")

    return stepstone.workflow(name, version=version, **kwargs)(plain)


def test_random_is_journaled_and_replayed(store: Store, mode: str) -> None:
    """``ctx.random()`` draws in [0, 1) once: the function re-run gets the same numbers."""

    async def body(ctx: Any, input: State) -> Any:
        draws = [await ctx.random(), await ctx.random()]
        await ctx.wait_for("go")
        return draws

    flow = make("dice", body, mode)
    with pytest.raises(Suspended):
        drive(mode, "d", flow, store)
    first = store.load("d")
    assert first is not None
    recorded = [entry["result"] for entry in first.state[JOURNAL_KEY]]
    assert calls_of(first.state) == ["@random#1", "@random#2"]
    assert all(isinstance(x, float) and 0 <= x < 1 for x in recorded)
    assert recorded[0] != recorded[1]
    signal(store, "d", "go")
    assert drive(mode, "d", flow, store)["result"] == recorded


def test_upgrades_move_a_waiting_run_onto_the_new_function(store: Store, mode: str) -> None:
    """``upgrades=`` moves a waiting code run: the new function replays the transformed journal."""
    ran: list[str] = []

    def work(x: str) -> State:
        ran.append(x)
        return {"v": x}

    async def old(ctx: Any, input: State) -> Any:
        first = await ctx.step("a", work, "a")
        return [first, await ctx.wait_for("go")]

    async def new(ctx: Any, input: State) -> Any:
        first = await ctx.step("a", work, "a")
        got = await ctx.wait_for("go")
        return [first, got, await ctx.step("b", work, "b")]

    def renamed(state: State) -> State:
        for entry in state[JOURNAL_KEY]:
            if entry["call"] == "a#1":
                entry["result"] = {"value": entry["result"]["v"]}
        return state

    v1 = make("up", old, mode, version="1")
    v2 = make("up", new, mode, version="2", upgrades={"1": renamed})
    with pytest.raises(Suspended):
        drive(mode, "u", v1, store)
    moved = stepstone.upgrade(store, "u", v2)
    assert moved.workflow_version == "2" and moved.waiting_for == "signal go"
    signal(store, "u", "go", 7)
    state = drive(mode, "u", v2, store)
    assert state["result"] == [{"value": "a"}, 7, {"v": "b"}]
    assert ran == ["a", "b"]  # the journaled call never ran again


def test_an_upgrade_that_drops_journaled_calls_is_refused(store: Store, mode: str) -> None:
    """An upgrade function may change journaled results, not which calls were made."""

    async def body(ctx: Any, input: State) -> Any:
        await ctx.step("a", lambda: 1)
        return await ctx.wait_for("go")

    v1 = make("drop", body, mode, version="1")
    v2 = make("drop", body, mode, version="2", upgrades={"1": lambda s: {**s, JOURNAL_KEY: []}})
    with pytest.raises(Suspended):
        drive(mode, "x", v1, store)
    before = store.load("x")
    with pytest.raises(WorkflowChanged, match="1 calls before, 0 after"):
        stepstone.upgrade(store, "x", v2)
    after = store.load("x")
    assert before is not None and after is not None
    assert after.version == before.version and after.workflow_version == "1"


def test_an_upgraded_function_that_calls_otherwise_parks_the_run(store: Store, mode: str) -> None:
    """After an upgrade, a function whose calls differ from the journal is parked, not spun."""

    async def old(ctx: Any, input: State) -> Any:
        await ctx.step("a", lambda: 1)
        return await ctx.wait_for("go")

    async def new(ctx: Any, input: State) -> Any:
        await ctx.step("b", lambda: 1)
        return await ctx.wait_for("go")

    with pytest.raises(Suspended):
        drive(mode, "p", make("park", old, mode, version="1"), store)
    v2 = make("park", new, mode, version="2", upgrades={"1": lambda s: s})
    stepstone.upgrade(store, "p", v2)
    signal(store, "p", "go")
    with pytest.raises(WorkflowChanged, match="'b#1' now"):
        drive(mode, "p", v2, store)
    parked = store.load("p")
    assert parked is not None and parked.status == "failed" and parked.owner is None


async def _loop(ctx: Any, input: State) -> Any:
    """Three ``revise`` calls between a ``draft`` and a wait, then a ``send``."""
    draft = await ctx.step("draft", _work, "d")
    for i in range(3):
        draft = await ctx.step("revise", _work, f"r{i}")
    await ctx.wait_for("go")
    return [draft, await ctx.step("send", _work, "s")]


_RAN: list[str] = []


def _work(x: str) -> str:
    _RAN.append(x)
    return x


def test_journal_lists_each_call_with_name_ordinal_attempt_time_and_size(
    store: Store, mode: str
) -> None:
    """``stepstone.journal`` lists the journaled calls in call order, as steps are listed."""
    with pytest.raises(Suspended):
        drive(mode, "j", make("listed", _loop, mode), store)
    entries = stepstone.journal(store, "j")
    assert [(e.seq, e.call, e.name, e.ordinal) for e in entries] == [
        (0, "draft#1", "draft", 1),
        (1, "revise#1", "revise", 1),
        (2, "revise#2", "revise", 2),
        (3, "revise#3", "revise", 3),
    ]
    assert all(e.attempt == 1 and e.error_type is None and e.at is not None for e in entries)
    assert all(e.size > len(e.call) for e in entries)
    assert asyncio.run(stepstone.ajournal(store, "j")) == entries
    with pytest.raises(stepstone.RunNotFound):
        stepstone.journal(store, "nope")


def test_fork_at_a_call_keeps_the_journal_up_to_it(store: Store, mode: str) -> None:
    """A fork at ``revise#2`` replays the calls up to it and runs the later ones again."""
    flow = make("forked", _loop, mode)
    with pytest.raises(Suspended):
        drive(mode, "f", flow, store)
    _RAN.clear()
    forked = stepstone.fork(store, "f", "revise#2", "f2")
    assert forked.run_id == "f2" and calls_of(forked.state) == ["draft#1", "revise#1", "revise#2"]
    with pytest.raises(Suspended):
        drive(mode, "f2", flow, store)
    assert _RAN == ["r2"]  # only revise#3 ran: the fork's journal answered the rest
    original = store.load("f")
    assert original is not None and len(original.state[JOURNAL_KEY]) == 4  # untouched
    with pytest.raises(stepstone.ConflictError):
        stepstone.fork(store, "f", "revise#2", "f2")
    with pytest.raises(stepstone.StepNotKept, match="revise#9.*draft#1, revise#1"):
        stepstone.fork(store, "f", "revise#9", "f3")


def test_rerun_from_a_call_runs_it_and_the_later_ones_again(store: Store, mode: str) -> None:
    """``rerun`` from ``revise#3`` of a finished run cuts the journal before it and reruns."""
    flow = make("rerun", _loop, mode)
    with pytest.raises(Suspended):
        drive(mode, "r", flow, store)
    signal(store, "r", "go")
    done = drive(mode, "r", flow, store)
    assert done["result"] == ["r2", "s"]
    _RAN.clear()
    rewound = stepstone.rerun(store, "r", "revise#3")
    assert rewound.status != "done" and "result" not in rewound.state
    assert calls_of(rewound.state) == ["draft#1", "revise#1", "revise#2"]
    with pytest.raises(Suspended):  # the signal was consumed by the first wait
        drive(mode, "r", flow, store)
    assert _RAN == ["r2"]
    signal(store, "r", "go", signal_id="again")
    assert drive(mode, "r", flow, store)["result"] == ["r2", "s"]
    assert _RAN == ["r2", "s"]
    with pytest.raises(stepstone.StepNotKept, match="no state="):
        stepstone.rerun(store, "r", "send#1", patch={"x": 1})
    after = store.load("r")
    assert after is not None and after.status == "done"


def test_a_worker_serving_the_new_version_upgrades_the_runs_it_claims(store: Store) -> None:
    """A worker given only version 2 claims a version 1 code run, upgrades it and finishes it."""

    def v1_body(ctx: Any, input: State) -> Any:
        first = ctx.step("a", _work, "a")
        return [first, ctx.wait_for("go")]

    def v2_body(ctx: Any, input: State) -> Any:
        first = ctx.step("a", _work, "a")
        return [first, ctx.wait_for("go"), ctx.step("b", _work, "b")]

    v1 = stepstone.workflow("served-up", version="1")(v1_body)
    v2 = stepstone.workflow("served-up", version="2", upgrades={"1": lambda s: s})(v2_body)
    stepstone.start(store, v1, "w", {})
    with pytest.raises(Suspended):
        stepstone.run("w", v1, store)
    _RAN.clear()
    signal(store, "w", "go", 5)
    worker = stepstone.Worker(store, [v2], poll=0.01)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_TIMEOUT
        while (done := store.load("w")) is None or done.status != "done":
            assert time.monotonic() < deadline, "the version 2 worker never finished the run"
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert done.workflow_version == "2" and done.state["result"] == ["a", 5, "b"]
    assert _RAN == ["b"]  # the journaled call was answered, not run again


@pytest.fixture(params=["postgresql", "mysql", "cosmos"])
def server_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store on a server (skipped, loudly, if it is down), dropped after."""
    from fresh_stores import fresh_config

    with stepstone.open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


def test_journal_fork_and_rerun_on_the_servers(server_store: Store) -> None:
    """On PostgreSQL, MySQL and Cosmos too: the journal lists, a fork keeps, a rerun cuts."""
    store = server_store
    flow = make("server", _loop, "def-run")
    with pytest.raises(Suspended):
        drive("def-run", "s", flow, store)
    assert [e.call for e in stepstone.journal(store, "s")][-1] == "revise#3"
    stepstone.fork(store, "s", "revise#1", "s-fork")
    stepstone.rerun(store, "s", "revise#2")
    assert [e.call for e in stepstone.journal(store, "s-fork")] == ["draft#1", "revise#1"]
    assert [e.call for e in stepstone.journal(store, "s")] == ["draft#1", "revise#1"]
    _RAN.clear()
    with pytest.raises(Suspended):
        drive("def-run", "s", flow, store)
    assert _RAN == ["r1", "r2"]


def test_an_upgrade_of_a_run_waiting_for_map_children_is_refused(store: Store) -> None:
    """A code run waiting for a ``ctx.map``'s children is not upgraded until they end."""

    @stepstone.workflow("kid-up")
    def kid(ctx: Any, input: State) -> Any:
        return input["k"]

    def body(ctx: Any, input: State) -> Any:
        return ctx.map("kids", kid, [{"k": 1}, {"k": 2}])

    v1 = stepstone.workflow("mapped", version="1")(body)
    v2 = stepstone.workflow("mapped", version="2", upgrades={"1": lambda s: s})(body)
    with pytest.raises(Suspended):
        stepstone.run("m", v1, store)
    with pytest.raises(WorkflowChanged, match="child runs of a ctx.map"):
        stepstone.upgrade(store, "m", v2)
    waiting = store.load("m")
    assert waiting is not None and waiting.workflow_version == "1" and waiting.children


def test_a_rerun_from_a_map_call_runs_new_children(store: Store, mode: str) -> None:
    """A rerun from ``@map:kids#1`` makes new child runs: the old ones' results stay theirs.

    A demanding user reruns the map to get new results (a fixed tool, a new model); the
    children the cut journal forgot are done and would answer the map again unchanged.
    """
    made: list[int] = []

    def count(x: int) -> int:
        made.append(x)
        return x + len(made) * 100

    @stepstone.workflow("rerun-kid")
    def kid(ctx: stepstone.WorkflowContext, input: State) -> Any:
        return ctx.step("count", count, input["x"])

    async def body(ctx: Any, input: State) -> Any:
        return await ctx.map("kids", kid, [{"x": 1}, {"x": 2}])

    flow = make("rerun-map", body, mode)

    def finish(run_id: str) -> tuple[tuple[str, ...], State]:
        with pytest.raises(Suspended):
            drive(mode, run_id, flow, store)
        parent = store.load(run_id)
        assert parent is not None
        for child_id in parent.children:
            stepstone.run(child_id, kid, store)  # what a worker serving ``kid`` does
        return parent.children, drive(mode, run_id, flow, store)

    first_kids, first = finish("rm")
    assert first_kids == ("rm/@map:kids#1/0", "rm/@map:kids#1/1")
    assert first["result"] == [101, 202]
    rewound = stepstone.rerun(store, "rm", "@map:kids#1")
    assert calls_of(rewound.state) == []
    again_kids, again = finish("rm")
    assert again_kids == ("rm/@map:kids#1~1/0", "rm/@map:kids#1~1/1")
    assert again["result"] == [301, 402] and made == [1, 2, 1, 2]
    for child_id in first_kids:  # the first children are left as they were
        old = store.load(child_id)
        assert old is not None and old.status == "done" and old.state["result"] in (101, 202)
    stepstone.rerun(store, "rm", "@map:kids#1")
    third_kids, _ = finish("rm")
    assert third_kids == ("rm/@map:kids#1~2/0", "rm/@map:kids#1~2/1")
