"""StepstoneSaver, the LangGraph checkpointer, on every backend.

LangGraph's official conformance suite runs twice per backend: as published (it calls
the async methods) and through a shim that maps each async call onto the sync method,
so the sync path passes the very same cases. Then what no LangGraph saver has: two
writers on one thread (threads, and processes on every durable backend), and crashes of
a real graph (SIGKILL inside a node and between supersteps, an ``interrupt()`` resumed
with ``Command(resume=...)``), each resumed by a fresh process from the config string.

Child processes come from a forkserver that has imported langgraph once: each child is
a new process that opens the store itself, but does not pay the import again.
"""

from __future__ import annotations

import asyncio
import binascii
import json
import operator
import os
import queue
import random
import signal
import threading
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    empty_checkpoint,
)
from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import ERROR
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import langgraph_support as lgs
from fresh_stores import BACKENDS
from langgraph_support import CHILD_TIMEOUT, DURABLE, _config_for, _context
from stepstone import ConfigError, CorruptCheckpoint, Store, open_store
from stepstone._checkpoint import evolve
from stepstone.adapters.langgraph import (
    CheckpointConflict,
    StepstoneSaver,
    ThreadOwned,
    UnsafeCheckpoint,
)


@pytest.fixture(scope="module", params=BACKENDS)
def store_config(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One store per backend for the module; each test keeps to its own key prefix."""
    return _config_for(request.param, request, tmp_path_factory)


@pytest.fixture(scope="module", params=DURABLE)
def durable_config(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A durable backend's store, for the tests that reopen it in other processes."""
    return _config_for(request.param, request, tmp_path_factory)


@pytest.fixture
def store(store_config: str) -> Iterator[Store]:
    """The module's store, opened for one test."""
    opened = open_store(store_config)
    yield opened
    opened.close()


@pytest.fixture
def saver(store: Store) -> StepstoneSaver:
    """A saver on its own prefix, so tests sharing a store never see each other."""
    return StepstoneSaver(store, prefix=f"t{uuid.uuid4().hex[:10]}")


def _cfg(thread: str, checkpoint_id: str | None = None, ns: str = "") -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _checkpoint(values: dict[str, Any] | None = None) -> LGCheckpoint:
    cp = empty_checkpoint()
    cp["channel_values"] = dict(values or {})
    cp["channel_versions"] = {k: 1 for k in cp["channel_values"]}
    return cp


def _meta(source: str = "loop", step: int = 0) -> CheckpointMetadata:
    return {"source": source, "step": step, "parents": {}}  # type: ignore[typeddict-item]


# -- the official conformance suite, async and sync -------------------------------------


class _SyncForm:
    """The conformance suite's async calls, each answered by the saver's sync method."""

    def __init__(self, saver: StepstoneSaver) -> None:
        self.saver = saver

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.saver.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for item in self.saver.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.saver.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.saver.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.saver.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.saver.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.saver.prune(thread_ids, strategy=strategy)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["async", "sync"])
def test_conformance_suite_reports_full(store_config: str, form: str) -> None:
    """langgraph-checkpoint-conformance detects all eight capabilities and passes all."""

    async def main() -> Any:
        opened = open_store(store_config)

        @checkpointer_test(name=f"StepstoneSaver[{form}]")
        async def factory() -> AsyncGenerator[Any, None]:
            # A fresh saver per capability: its own prefix is its own empty keyspace.
            saver = StepstoneSaver(opened, prefix=f"conf{uuid.uuid4().hex[:10]}")
            yield saver if form == "async" else _SyncForm(saver)

        try:
            return await validate(factory)
        finally:
            await opened.aclose()

    report = asyncio.run(main())
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert report.conformance_level() == "FULL", failures
    assert {name for name, r in report.results.items() if r.detected and r.passed} == {
        cap.value for cap in ALL_CAPABILITIES
    }, report.to_dict()


# -- behaviour LangGraph leaves open, pinned on every backend ----------------------------


def test_checkpoint_id_is_written_once(saver: StepstoneSaver) -> None:
    """A put of a stored id with other content is refused; the same content again is a no-op."""
    cp = _checkpoint({"x": 1})
    stored = saver.put(_cfg("t"), cp, _meta("input", -1), {"x": 1})
    assert saver.put(_cfg("t"), cp, _meta("input", -1), {"x": 1}) == stored
    other = {**cp, "channel_values": {"x": 2}}
    with pytest.raises(CheckpointConflict, match="already stored with other content"):
        saver.put(_cfg("t"), other, _meta("input", -1), {"x": 1})  # type: ignore[arg-type]
    tup = saver.get_tuple(stored)
    assert tup is not None and tup.checkpoint["channel_values"] == {"x": 1}


def test_a_refused_checkpoint_leaves_the_head_where_it_was(saver: StepstoneSaver) -> None:
    """The head is advanced in the same call as the checkpoint's record (one commit on
    SQLite); a record refused there (its id stored with other content) puts it back."""
    a = _checkpoint({"x": 1})
    at_a = saver.put(_cfg("t"), a, _meta("input", -1), {"x": 1})
    b = _checkpoint({"x": 2})
    at_b = saver.put(at_a, b, _meta("loop", 0), {"x": 1})
    other = {**a, "channel_values": {"x": 3}}  # a's id again, other content, after b
    with pytest.raises(CheckpointConflict, match="already stored with other content"):
        saver.put(at_b, other, _meta("loop", 1), {"x": 1})  # type: ignore[arg-type]
    for reader in (saver, StepstoneSaver(saver.store, prefix=saver.prefix)):
        latest = reader.get_tuple(_cfg("t"))
        assert latest is not None and latest.checkpoint["id"] == b["id"], "the head moved"
        first = reader.get_tuple(at_a)
        assert first is not None and first.checkpoint["channel_values"] == {"x": 1}
    c = _checkpoint({"x": 4})
    saver.put(at_b, c, _meta("loop", 1), {"x": 1})  # the thread goes on from b
    latest = saver.get_tuple(_cfg("t"))
    assert latest is not None and latest.checkpoint["id"] == c["id"]


def test_a_write_follows_what_its_writer_read(saver: StepstoneSaver) -> None:
    """A parent read as the latest (or a put's answer) must be the head, whatever the
    source; a parent asked for by id (get_tuple with an id, list, parent_config) may branch."""
    first = saver.put(_cfg("t"), _checkpoint(), _meta("input", -1), {})
    second = saver.put(first, _checkpoint(), _meta("loop", 0), {})
    for source in ("loop", "input", "update", "fork"):
        with pytest.raises(CheckpointConflict, match="another process is driving") as caught:
            saver.put(first, _checkpoint(), _meta(source, 0), {})
    assert caught.value.thread_id == "t" and caught.value.checkpoint_ns == ""
    assert [t.config for t in saver.list(_cfg("t"))] == [second, first]
    latest = saver.get_tuple(_cfg("t"))
    assert latest is not None and latest.config == second and latest.parent_config == first
    addressed = [
        saver.get_tuple(first),
        next(iter(saver.list(_cfg("t"), before=second))),
    ]
    # Time travel from the first checkpoint, however it was asked for: allowed, and the
    # branch becomes the head, which the loop then extends.
    for parent in [tup.config for tup in addressed if tup] + [latest.parent_config]:
        fork = saver.put(parent, _checkpoint(), _meta("loop", 0), {})
        assert saver.put(fork, _checkpoint(), _meta("loop", 1), {})
    with pytest.raises(CheckpointConflict):
        saver.put(second, _checkpoint(), _meta("loop", 1), {})


def test_pending_writes_are_stored_once_and_special_channels_overwrite(
    saver: StepstoneSaver,
) -> None:
    """A repeated (task_id, idx) keeps the first value; ERROR (idx -1) keeps the last."""
    stored = saver.put(_cfg("t"), _checkpoint(), _meta(), {})
    saver.put_writes(stored, [("a", 1), ("b", 2)], "task", "p")
    saver.put_writes(stored, [("a", 10), ("b", 20)], "task", "p")
    saver.put_writes(stored, [(ERROR, "first")], "task", "p")
    saver.put_writes(stored, [(ERROR, "second")], "task", "p")
    saver.put_writes(stored, [("a", 3)], "other", "o")
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert tup.pending_writes == [
        ("other", "a", 3),
        ("task", ERROR, "second"),
        ("task", "a", 1),
        ("task", "b", 2),
    ]


def test_parallel_writers_of_one_superstep_all_land(saver: StepstoneSaver) -> None:
    """Eight tasks writing to one checkpoint at once: compare-and-swap merges, none lost."""
    stored = saver.put(_cfg("t"), _checkpoint(), _meta(), {})
    barrier = threading.Barrier(8)

    def task(n: int) -> None:
        barrier.wait(30)
        saver.put_writes(stored, [("ch", n)], f"task-{n}")

    threads = [threading.Thread(target=task, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert sorted(v for _, _, v in tup.pending_writes or []) == list(range(8))


def test_two_writer_threads_never_both_extend_one_parent(store: Store) -> None:
    """Two savers read the same head and write at once: each round exactly one lands."""
    prefix = f"tw{uuid.uuid4().hex[:8]}"
    savers = [StepstoneSaver(store, prefix=prefix) for _ in range(2)]
    savers[0].put(_cfg("t"), _checkpoint(), _meta("input", -1), {})
    rounds = 5
    barrier = threading.Barrier(2)
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def writer(saver: StepstoneSaver) -> None:
        for r in range(rounds):
            barrier.wait(60)
            head = saver.get_tuple(_cfg("t"))
            assert head is not None
            barrier.wait(60)
            try:
                saver.put(head.config, _checkpoint(), _meta("loop", r), {})
                outcome = "won"
            except CheckpointConflict:
                outcome = "lost"
            with lock:
                outcomes.append((r, outcome))

    threads = [threading.Thread(target=writer, args=(s,)) for s in savers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
        assert not t.is_alive(), "a writer thread hung"
    assert sorted(outcomes) == sorted(
        [(r, "lost") for r in range(rounds)] + [(r, "won") for r in range(rounds)]
    )
    _assert_chain(savers[0], "t", rounds + 1)


def _assert_chain(saver: StepstoneSaver, thread: str, length: int) -> None:
    """The thread is one chain of ``length`` checkpoints: no parent has two children."""
    tuples = list(saver.list(_cfg(thread)))
    assert len(tuples) == length
    parents = [t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config]
    assert len(parents) == len(set(parents)) == length - 1


def test_owner_lease_refuses_other_owners_until_it_expires(store: Store) -> None:
    """With owner=, a live lease refuses another owner; after expiry the other takes over."""
    prefix = f"ls{uuid.uuid4().hex[:8]}"
    a = StepstoneSaver(store, prefix=prefix, owner="a", lease=60)
    b = StepstoneSaver(store, prefix=prefix, owner="b", lease=60)
    unleased = StepstoneSaver(store, prefix=prefix)
    head = a.put(_cfg("t"), _checkpoint(), _meta("input", -1), {})
    with pytest.raises(ThreadOwned, match="leased to 'a'") as caught:
        b.put(head, _checkpoint(), _meta("update", 0), {})
    assert caught.value.owner == "a"
    with pytest.raises(ThreadOwned):
        unleased.put(head, _checkpoint(), _meta("update", 0), {})
    # b's clock 61 s on: a's 60 s lease has lapsed, b takes the thread over.
    b.clock = lambda: datetime.now(UTC) + timedelta(seconds=61)
    b.put(head, _checkpoint(), _meta("update", 0), {})
    with pytest.raises(ThreadOwned, match="leased to 'b'"):
        a.put(head, _checkpoint(), _meta("update", 0), {})


def test_pickle_is_never_stored_or_loaded_without_opt_in(store: Store) -> None:
    """A pickling serializer is refused on write, and a stored pickle is refused on load."""
    prefix = f"pk{uuid.uuid4().hex[:8]}"
    pickling = JsonPlusSerializer(pickle_fallback=True)
    refusing = StepstoneSaver(store, prefix=prefix, serde=pickling)
    with pytest.raises(UnsafeCheckpoint, match="allow_pickle=True"):
        refusing.put(_cfg("t"), _checkpoint({"x": threading.Lock}), _meta(), {"x": 1})
    opted_in = StepstoneSaver(store, prefix=prefix, serde=pickling, allow_pickle=True)
    stored = opted_in.put(_cfg("t"), _checkpoint({"x": threading.Lock}), _meta(), {"x": 1})
    tup = opted_in.get_tuple(stored)
    assert tup is not None and tup.checkpoint["channel_values"]["x"] is threading.Lock
    with pytest.raises(UnsafeCheckpoint, match="channel 'x' is stored as pickle"):
        StepstoneSaver(store, prefix=prefix).get_tuple(stored)


def test_records_are_finished_runs_no_worker_claims(saver: StepstoneSaver, store: Store) -> None:
    """Every record is a 'done' run of workflow 'langgraph', so workers never claim one."""
    stored = saver.put(_cfg("chat/1"), _checkpoint({"m": "hi"}), _meta(), {"m": 1})
    saver.put_writes(stored, [("m", "x")], "task")
    mine = sorted(r for r in store.list_runs() if r.startswith(saver.prefix + "/"))
    cp_id = stored["configurable"]["checkpoint_id"]
    assert mine == [
        f"{saver.prefix}/chat%2F1/",
        f"{saver.prefix}/chat%2F1//{cp_id}",
        f"{saver.prefix}/chat%2F1//{cp_id}/writes",
    ]
    for run_id in mine:
        record = store.load(run_id)
        assert record is not None and record.status == "done" and record.workflow == "langgraph"
    assert not [i for i in store.claimable(datetime.now(UTC)) if i.run_id in mine]
    assert [t.config for t in saver.list(None)] == [stored]  # every thread of the prefix


def test_serialized_bytes_are_stored_as_ascii_base64(saver: StepstoneSaver, store: Store) -> None:
    """Every serialized value is stored as base64 (ASCII: no text transcoding per save),
    control and high bytes included, and comes back exact on every backend."""
    values = {"text": "x" * 500 + '\x00\x01\x1f\x7f\x80\x9f é "\\', "blob": bytes(range(256))}
    stored = saver.put(_cfg("t"), _checkpoint(values), _meta(), {"text": 1, "blob": 1})
    tup = saver.get_tuple(stored)
    assert tup is not None and tup.checkpoint["channel_values"] == values
    record = store.load(f"{saver.prefix}/t//{stored['configurable']['checkpoint_id']}")
    assert record is not None
    assert {k: v[1] for k, v in record.state["values"].items()} == {"text": "b64", "blob": "b64"}
    assert all(v[2].isascii() for v in record.state["values"].values())


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (["msgpack", "b64", "AAA"], "not valid b64 .*padding"),
        (["msgpack", "text", "caf\u20ac"], "not valid text"),
        (["msgpack", "b64"], 'not a serialized value .*"b64" or "text"'),
        (["msgpack", "zip", "AA=="], "not a serialized value"),
        ({"secret": "sk-do-not-show"}, "stored as a dict, which is not a serialized value"),
    ],
    ids=["bad-padding", "not-latin-1", "two-parts", "unknown-encoding", "not-a-list"],
)
def test_a_damaged_stored_value_is_a_clear_error(
    saver: StepstoneSaver, store: Store, bad: Any, said: str
) -> None:
    """A channel value edited or damaged in the store raises ``CorruptCheckpoint`` naming
    the checkpoint and the channel and what a stored value is, never a bare unpacking or
    base64 error, and never the stored content; the record is left as it is."""
    stored = saver.put(_cfg("t"), _checkpoint({"text": "hello"}), _meta(), {"text": 1})
    key = f"{saver.prefix}/t//{stored['configurable']['checkpoint_id']}"
    record = store.load(key)
    assert record is not None
    damaged = store.save(evolve(record, state={**record.state, "values": {"text": bad}}))
    with pytest.raises(CorruptCheckpoint, match=said) as info:
        saver.get_tuple(stored)
    assert "channel 'text'" in str(info.value) and "sk-do-not-show" not in str(info.value)
    after = store.load(key)
    assert after is not None and after.version == damaged.version


def test_base64_text_is_the_standard_librarys_both_ways() -> None:
    """The saver's base64 (pybase64 when installed) writes the standard library's text and
    reads it back, so records written with either encoder load under the other; the
    decoder is as lenient as the standard library's on text it did not write."""
    from stepstone.adapters.langgraph import _codec

    rng = random.Random(36)
    samples = [b"", b"\x00", b"\xff\xfe", bytes(range(256))]
    samples += [rng.randbytes(rng.randrange(1, 5000)) for _ in range(200)]
    for data in samples:
        text = _codec.b64_text(data)
        assert text == _codec.stdlib_b64_text(data)
        assert type(text) is str and text.isascii()
        assert _codec.b64_bytes(text) == data == _codec.stdlib_b64_bytes(text)
    # Text of another writer: line breaks ignored alike; bad padding refused alike.
    wrapped = "AAEC\nAw=="
    assert _codec.b64_bytes(wrapped) == _codec.stdlib_b64_bytes(wrapped) == b"\0\1\2\3"
    for bad in ("AAA", "A"):
        with pytest.raises(binascii.Error):
            _codec.stdlib_b64_bytes(bad)
        with pytest.raises(binascii.Error):
            _codec.b64_bytes(bad)


def test_bad_arguments_get_clear_errors(saver: StepstoneSaver, store: Store) -> None:
    """Unknown prune strategy, an over-long thread id, a bad prefix: ConfigError saying why."""
    with pytest.raises(ConfigError, match="allowed: 'keep_latest', 'delete'"):
        saver.prune(["t"], strategy="oldest")
    with pytest.raises(ConfigError, match="too long to store"):
        saver.get_tuple(_cfg("x" * 2000))
    with pytest.raises(ConfigError, match="without '/'"):
        StepstoneSaver(store, prefix="a/b")


def test_delete_for_runs_moves_the_head_back(saver: StepstoneSaver) -> None:
    """Deleting the latest checkpoint's run leaves the previous one latest, and writable."""
    first = saver.put(_cfg("t"), _checkpoint(), {**_meta("input", -1), "run_id": "r1"}, {})
    saver.put(first, _checkpoint(), {**_meta("loop", 0), "run_id": "r2"}, {})
    saver.delete_for_runs(["r2"])
    latest = saver.get_tuple(_cfg("t"))
    assert latest is not None and latest.config == first
    assert saver.put(first, _checkpoint(), _meta("loop", 0), {})


# -- a real graph: time travel, crashes, interrupts --------------------------------------


class ChatState(TypedDict):
    messages: Annotated[list[str], operator.add]
    approved: str


TURNS = 6


def _count(path: str, what: str) -> None:
    # Appended before the node's work: a SIGKILL right after still leaves the line (the
    # kernel has it), so the count says how often a node began.
    with open(path, "a") as f:
        f.write(what + "\n")


def _build_graph(count_path: str, kill_in_model: int | None = None) -> StateGraph[ChatState]:
    def model(state: ChatState) -> dict[str, Any]:
        turn = len(state["messages"])
        _count(count_path, f"model:{turn}")  # the counted fake model call
        if turn == kill_in_model:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"messages": [f"reply {turn}"]}

    def approve(state: ChatState) -> dict[str, Any]:
        _count(count_path, "approve")
        return {"approved": interrupt("approve the transcript?")}

    def finish(state: ChatState) -> dict[str, Any]:
        _count(count_path, "finish")
        return {}

    builder = StateGraph(ChatState)
    builder.add_node("model", model)
    builder.add_node("approve", approve)
    builder.add_node("finish", finish)
    builder.add_edge(START, "model")
    builder.add_conditional_edges(
        "model", lambda s: "model" if len(s["messages"]) < TURNS else "approve"
    )
    builder.add_edge("approve", "finish")
    builder.add_edge("finish", END)
    return builder


class _KillAfterStep(StepstoneSaver):
    """Dies by SIGKILL right after the checkpoint of ``step`` is stored: between supersteps."""

    kill_step: int = -99

    def put(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        stored = super().put(config, checkpoint, metadata, new_versions)
        if metadata.get("step") == self.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return stored


def _graph_child(config: str, prefix: str, thread: str, count_path: str, mode: str) -> None:
    """One process's part of the crash scenario (runs in a fresh forkserver child)."""
    kill_in_model = int(mode.split(":")[1]) if mode.startswith("kill-in-node") else None
    saver = _KillAfterStep.from_config(config, prefix=prefix)
    if mode.startswith("kill-after-step"):
        saver.kill_step = int(mode.split(":")[1])
    graph = _build_graph(count_path, kill_in_model).compile(checkpointer=saver)
    run_config: RunnableConfig = {"configurable": {"thread_id": thread}}
    arg: Any = None
    if mode.startswith("kill-in-node"):
        arg = {"messages": [], "approved": ""}
    elif mode.startswith("resume:"):
        arg = Command(resume=mode.split(":", 1)[1])
    graph.invoke(arg, run_config, durability="sync")
    saver.close()


def _two_writer_child(
    config: str, prefix: str, barrier: Any, rounds: int, results: Any, name: str
) -> None:
    """One of two processes that read the same head and write on it at the same moment."""
    with StepstoneSaver.from_config(config, prefix=prefix) as saver:
        for r in range(rounds):
            barrier.wait(CHILD_TIMEOUT)
            head = saver.get_tuple(_cfg("t"))
            assert head is not None
            barrier.wait(CHILD_TIMEOUT)
            try:
                saver.put(head.config, _checkpoint({"by": name}), _meta("loop", r), {"by": 1})
                results.put((r, "won"))
            except CheckpointConflict:
                results.put((r, "lost"))


def _run_child(target: Any, *args: Any) -> int | None:
    process = _context().Process(target=lgs.with_env, args=(lgs.child_env(), target, *args))
    process.start()
    process.join(CHILD_TIMEOUT)
    if process.is_alive():
        process.kill()
        pytest.fail(f"child {target.__name__}{args[-1:]} hung for {CHILD_TIMEOUT} s")
    return process.exitcode  # type: ignore[no-any-return]


def test_time_travel_with_a_real_graph(saver: StepstoneSaver, tmp_path: Path) -> None:
    """update_state on a past checkpoint forks, and the graph runs on from the fork."""
    count = str(tmp_path / "count")
    graph = _build_graph(count).compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "tt"}}
    graph.invoke({"messages": [], "approved": ""}, config)
    history = list(graph.get_state_history(config))
    past = next(s for s in history if len(s.values.get("messages", [])) == 2)
    forked = graph.update_state(past.config, {"messages": ["edited"]})
    graph.invoke(None, forked)
    graph.invoke(Command(resume="ok"), config)
    state = graph.get_state(config)
    assert state.values["messages"][:3] == ["reply 0", "reply 1", "edited"]
    assert len(state.values["messages"]) == TURNS and state.values["approved"] == "ok"


@pytest.mark.crash
def test_killed_graph_resumes_in_fresh_processes(durable_config: str, tmp_path: Path) -> None:
    """SIGKILL inside a node, then between supersteps, then interrupt() and a resume
    in another process: finished nodes never run again, a killed node at most once more."""
    prefix, count = f"cr{uuid.uuid4().hex[:8]}", str(tmp_path / "count")
    steps = [
        ("kill-in-node:2", -signal.SIGKILL),  # killed inside the model call of turn 2
        ("kill-after-step:3", -signal.SIGKILL),  # killed once turn 3's checkpoint is stored
        ("run", 0),  # runs to the interrupt() and returns
        ("resume:yes", 0),  # Command(resume=...) from yet another process
    ]
    for mode, expected in steps:
        code = _run_child(_graph_child, durable_config, prefix, "chat", count, mode)
        assert code == expected, f"{mode}: exit code {code}"
    calls = Path(count).read_text().split()
    assert {c: calls.count(c) for c in set(calls)} == {
        "model:0": 1,
        "model:1": 1,
        "model:2": 2,  # killed in it once, run again once
        "model:3": 1,
        "model:4": 1,  # not begun when the process died after turn 3's checkpoint
        "model:5": 1,
        "approve": 2,  # LangGraph reruns an interrupted node on resume: by design
        "finish": 1,
    }
    with StepstoneSaver.from_config(durable_config, prefix=prefix) as saver:
        final = saver.get_tuple(_cfg("chat"))
    assert final is not None
    values = final.checkpoint["channel_values"]
    assert values["messages"] == [f"reply {n}" for n in range(TURNS)]
    assert values["approved"] == "yes"


@pytest.mark.crash
def test_two_writer_processes_never_both_extend_one_parent(durable_config: str) -> None:
    """Two processes read one head and write on it together: each round, exactly one lands."""
    prefix, rounds = f"pw{uuid.uuid4().hex[:8]}", 4
    with StepstoneSaver.from_config(durable_config, prefix=prefix) as saver:
        saver.put(_cfg("t"), _checkpoint(), _meta("input", -1), {})
        ctx = _context()
        barrier, results = ctx.Barrier(2), ctx.Queue()
        children = [
            ctx.Process(
                target=lgs.with_env,
                args=(
                    lgs.child_env(),
                    _two_writer_child,
                    durable_config,
                    prefix,
                    barrier,
                    rounds,
                    results,
                    name,
                ),
            )
            for name in ("a", "b")
        ]
        for child in children:
            child.start()
        outcomes = []
        for _ in range(2 * rounds):
            try:
                outcomes.append(results.get(timeout=CHILD_TIMEOUT))
            except queue.Empty:
                for child in children:
                    child.kill()
                pytest.fail(f"writer processes stopped reporting after {outcomes}")
        for child in children:
            child.join(CHILD_TIMEOUT)
            assert child.exitcode == 0, f"writer process exited with {child.exitcode}"
        assert sorted(outcomes) == sorted(
            [(r, "lost") for r in range(rounds)] + [(r, "won") for r in range(rounds)]
        )
        _assert_chain(saver, "t", rounds + 1)


def test_subclass_keeps_saver_contract() -> None:
    """StepstoneSaver is a BaseCheckpointSaver with string channel versions."""
    assert issubclass(StepstoneSaver, BaseCheckpointSaver)
    saver = StepstoneSaver(open_store("memory://"))
    first = saver.get_next_version(None, None)
    assert first.startswith("0" * 31 + "1.") and saver.get_next_version(first, None) > first
    assert json.loads(json.dumps(first)) == first
