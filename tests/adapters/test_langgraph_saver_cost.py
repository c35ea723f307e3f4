"""StepstoneSaver's cost per superstep, and stores written before that cost came down.

A superstep of a graph is three store writes in two calls (the task's writes; the
checkpoint and the head's compare-and-swap in one ``save_many``, one commit on SQLite)
and no load: the saver guesses the head and the writes record
it last wrote or read, and a wrong guess is caught by the compare-and-swap. Guessing
keeps ownership: a writer whose remembered head is stale is refused, and leaves nothing
behind. Values are stored as ASCII base64; threads written by the previous release (one
character per byte, ``"text"``) still load and continue.
"""

from __future__ import annotations

import json
import operator
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph

from fresh_stores import BACKENDS
from langgraph_support import _config_for
from stepstone import Checkpoint, Store, _hooks, open_store
from stepstone.adapters.langgraph import CheckpointConflict, StepstoneSaver

LEGACY = Path(__file__).parent / "langgraph_legacy_records.json"


@pytest.fixture(scope="module", params=BACKENDS)
def store_config(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One store per backend for the module; each test keeps to its own key prefix."""
    return _config_for(str(request.param), request, tmp_path_factory)


@pytest.fixture
def store(store_config: str) -> Iterator[Store]:
    """The module's store, opened for one test."""
    opened = open_store(store_config)
    yield opened
    opened.close()


def _prefix() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


def _count(store: Store) -> Counter[str]:
    """Count the store's loads, saves and ``save_many`` calls from now on (patched on this
    instance): ``records`` is every record saved, ``calls`` every call that saves."""
    calls: Counter[str] = Counter()
    inside = threading.local()  # per thread: LangGraph saves writes beside a checkpoint
    lock = threading.Lock()
    load, save, save_many = store.load, store.save, store.save_many

    def counted_load(run_id: str) -> Checkpoint | None:
        with lock:
            calls["load"] += 1
        return load(run_id)

    def counted_save(cp: Checkpoint) -> Checkpoint:
        if not getattr(inside, "many", False):  # the default save_many saves through save
            with lock:
                calls["records"] += 1
                calls["calls"] += 1
        return save(cp)

    def counted_save_many(cps: Any) -> list[Checkpoint | Exception]:
        with lock:
            calls["records"] += len(cps)
            calls["calls"] += 1
        inside.many = True
        try:
            return save_many(cps)
        finally:
            inside.many = False

    store.load = counted_load  # type: ignore[method-assign]
    store.save = counted_save  # type: ignore[method-assign,assignment]
    store.save_many = counted_save_many  # type: ignore[method-assign,assignment]
    return calls


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: StepstoneSaver, steps: int) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("model", lambda s: {"messages": [f"turn {len(s['messages'])}"]})
    builder.add_edge(START, "model")
    builder.add_conditional_edges(
        "model", lambda s: "model" if len(s["messages"]) < steps else "__end__"
    )
    return builder.compile(checkpointer=saver)


def test_a_superstep_is_three_writes_in_two_calls_and_no_load(store: Store) -> None:
    """Past the first, each superstep saves writes, then checkpoint and head in one
    ``save_many`` (one commit on SQLite), and loads nothing."""
    saver = StepstoneSaver(store, prefix=_prefix())
    config: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    calls = _count(store)
    _graph(saver, 3).invoke({"messages": []}, config, durability="sync")
    short = dict(calls)
    calls.clear()
    config["configurable"]["thread_id"] = "u"
    _graph(saver, 13).invoke({"messages": []}, config, durability="sync")
    assert calls["records"] - short["records"] == 10 * 3, (dict(calls), short)
    assert calls["calls"] - short["calls"] == 10 * 2, (dict(calls), short)
    assert calls["load"] == short["load"], (dict(calls), short)


def test_a_superstep_is_two_commits_on_sqlite(tmp_path: Path) -> None:
    """On SQLite the checkpoint and its head share a commit: two per superstep (the task's
    writes, then the checkpoint), as LangGraph's own SqliteSaver makes; three before.

    The saver is called as LangGraph calls it, from one thread, so no commit of the group
    commit can hold two calls' saves and the count is exact.
    """
    from langgraph.checkpoint.base import empty_checkpoint

    commits: list[str] = []
    with open_store(f"sqlite:///{tmp_path}/lg.db") as store:
        saver = StepstoneSaver(store, prefix=_prefix())
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        meta: Any = {"source": "input", "step": -1, "parents": {}}
        config = saver.put(config, empty_checkpoint(), meta, {})
        _hooks.install(lambda point: commits.append(point) if point == "sqlite.committed" else None)
        try:
            for step in range(10):
                saver.put_writes(config, [("messages", f"turn {step}")], f"task-{step}")
                meta = {"source": "loop", "step": step, "parents": {}}
                config = saver.put(config, empty_checkpoint(), meta, {})
        finally:
            _hooks.install(None)
        latest = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert latest is not None and latest.config == config
    assert len(commits) == 10 * 2, f"{len(commits)} commits for 10 supersteps"


def test_a_stale_remembered_head_is_refused_and_leaves_nothing(store: Store) -> None:
    """Another saver advances the thread; this one's next put, built on the head it
    remembers, is refused by the compare-and-swap, and its checkpoint is not kept."""
    prefix = _prefix()
    mine = StepstoneSaver(store, prefix=prefix)
    other = StepstoneSaver(store, prefix=prefix)
    config: Any = {"configurable": {"thread_id": "t"}}
    graph = _graph(mine, 2)
    graph.invoke({"messages": []}, config, durability="sync")
    latest = mine.get_tuple(config)
    assert latest is not None
    _graph(other, 4).invoke({"messages": []}, config, durability="sync")
    before = sorted(r for r in store.list_runs() if r.startswith(prefix))
    cp = {**latest.checkpoint, "id": str(uuid.uuid4())}
    with pytest.raises(CheckpointConflict, match="another process is driving"):
        mine.put(latest.config, cp, {"source": "loop", "step": 9, "parents": {}}, {})  # type: ignore[arg-type]
    assert sorted(r for r in store.list_runs() if r.startswith(prefix)) == before
    # Reloaded, it continues from the other's head.
    assert len(graph.invoke({"messages": []}, config)["messages"]) >= 4


def test_a_thread_written_by_the_previous_release_loads_and_continues(store: Store) -> None:
    """Records the previous release wrote (values as one character per byte, "text")
    load exact, and the thread continues from its head."""
    prefix = _prefix()
    records = json.loads(LEGACY.read_text(encoding="utf-8"))
    assert any(v[1] == "text" for r in records.values() for v in r.get("values", {}).values())
    for key, state in records.items():
        store.save(
            Checkpoint(
                run_id=prefix + key.removeprefix("langgraph"),
                state=state,
                total_steps=0,
                workflow="langgraph",
            )
        )
    saver = StepstoneSaver(store, prefix=prefix)
    config: Any = {"configurable": {"thread_id": "legacy-chat"}}
    latest = saver.get_tuple(config)
    assert latest is not None
    values = latest.checkpoint["channel_values"]
    assert [m.content for m in values["messages"]] == ["hi", "reply 1: héllo"]
    assert values["blob"] == bytes(range(256))
    assert len(list(saver.list(config))) == 3
    cp = {**latest.checkpoint, "id": str(uuid.uuid4()), "channel_values": {"blob": b"next"}}
    meta: Any = {"source": "loop", "step": 2, "parents": {}}
    saver.put(latest.config, cp, meta, {})  # type: ignore[arg-type]
    newer = saver.get_tuple(config)
    assert newer is not None and newer.checkpoint["channel_values"] == {"blob": b"next"}
    assert newer.parent_config is not None
    assert newer.parent_config["configurable"]["checkpoint_id"] == latest.checkpoint["id"]
