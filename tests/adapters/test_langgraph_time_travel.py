"""StepstoneSaver under real graphs: time travel may branch, concurrent invokes never lose one.

What a ``put`` may do follows what its writer read: resuming an interrupt from a past
checkpoint id and a subgraph replaying from its own checkpoint branch, as on LangGraph's
own savers; two invokes that both loaded the thread's latest checkpoint cannot both land,
so one finished invoke is never silently dropped from the thread (threads on every
backend, and processes on every durable one). The same for two first invokes of one new
thread, and for two puts that both start a namespace: one creates its head by
compare-and-swap, the other is refused (threads on every backend, processes on SQLite
and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
import operator
import queue
import threading
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    empty_checkpoint,
    get_checkpoint_id,
)
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Durability, interrupt

from fresh_stores import BACKENDS
from langgraph_support import (
    CHILD_TIMEOUT,
    DURABLE,
    _config_for,
    _context,
    child_env,
    with_env,
)
from stepstone import ConflictError, Store, open_store
from stepstone.adapters.langgraph import CheckpointConflict, StepstoneSaver


@pytest.fixture(scope="module", params=BACKENDS)
def store_config(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One store per backend for the module; each test keeps to its own key prefix."""
    return _config_for(str(request.param), request, tmp_path_factory)


@pytest.fixture(scope="module", params=DURABLE)
def durable_config(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A durable backend's store, for the test that writes from other processes."""
    return _config_for(str(request.param), request, tmp_path_factory)


@pytest.fixture
def store(store_config: str) -> Any:
    """The module's store, opened for one test."""
    opened = open_store(store_config)
    yield opened
    opened.close()


@pytest.fixture
def saver(store: Store) -> StepstoneSaver:
    """A saver on its own prefix, so tests sharing a store never see each other."""
    return StepstoneSaver(store, prefix=f"t{uuid.uuid4().hex[:10]}")


class Answers(TypedDict):
    answers: Annotated[list[str], operator.add]


def _run(
    graph: CompiledStateGraph[Any],
    form: str,
    arg: Any,
    config: RunnableConfig,
    durability: Durability = "sync",
) -> Any:
    """``invoke`` or ``ainvoke``, by ``form``."""
    if form == "sync":
        return graph.invoke(arg, config, durability=durability)
    return asyncio.run(graph.ainvoke(arg, config, durability=durability))


def _two_questions(saver: StepstoneSaver) -> CompiledStateGraph[Any]:
    def first(state: Answers) -> dict[str, Any]:
        return {"answers": ["1:" + interrupt("first?")]}

    def second(state: Answers) -> dict[str, Any]:
        return {"answers": ["2:" + interrupt("second?")]}

    builder = StateGraph(Answers)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("form", ["sync", "async"])
def test_resuming_a_past_interrupt_branches(saver: StepstoneSaver, form: str) -> None:
    """Command(resume=...) with a past checkpoint id branches there; the old ending stays."""
    graph = _two_questions(saver)
    thread: RunnableConfig = {"configurable": {"thread_id": "tt"}}
    _run(graph, form, {"answers": []}, thread)
    at_first = graph.get_state(thread).config
    _run(graph, form, Command(resume="a"), thread)
    _run(graph, form, Command(resume="b"), thread)
    assert graph.get_state(thread).values["answers"] == ["1:a", "2:b"]
    # Back to the first question's checkpoint. LangGraph hands the answer stored there
    # back to its node ("a", as on InMemorySaver), and asks the second question again.
    replayed = _run(graph, form, Command(resume="x"), at_first)
    assert [i.value for i in replayed["__interrupt__"]] == ["second?"]
    _run(graph, form, Command(resume="y"), thread)
    assert graph.get_state(thread).values["answers"] == ["1:a", "2:y"]
    endings = [s.values["answers"] for s in graph.get_state_history(thread) if not s.next]
    assert endings == [["1:a", "2:y"], ["1:a", "2:b"]]


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_subgraph_replays_from_its_own_checkpoint(saver: StepstoneSaver, form: str) -> None:
    """invoke(None) and a resume on a subgraph's checkpoint config run the rest of both graphs."""

    def ask(state: Answers) -> dict[str, Any]:
        return {"answers": ["human:" + interrupt("input?")]}

    sub = StateGraph(Answers)
    sub.add_node("step_a", lambda s: {"answers": ["sub_a"]})
    sub.add_node("ask", ask)
    sub.add_edge(START, "step_a")
    sub.add_edge("step_a", "ask")
    sub.add_edge("ask", END)
    parent = StateGraph(Answers)
    parent.add_node("router", lambda s: {"answers": ["routed"]})
    parent.add_node("sub", sub.compile(checkpointer=True))
    parent.add_node("post", lambda s: {"answers": ["post"]})
    parent.add_edge(START, "router")
    parent.add_edge("router", "sub")
    parent.add_edge("sub", "post")
    parent.add_edge("post", END)
    graph = parent.compile(checkpointer=saver)
    thread: RunnableConfig = {"configurable": {"thread_id": "sg"}}
    assert "__interrupt__" in _run(graph, form, {"answers": []}, thread)
    task_state = graph.get_state(thread, subgraphs=True).tasks[0].state
    assert task_state is not None and not isinstance(task_state, dict)
    sub_config = task_state.config
    replayed = _run(graph, form, None, sub_config)
    assert [i.value for i in replayed["__interrupt__"]] == ["input?"]
    final = _run(graph, form, Command(resume="r"), sub_config)
    assert final["answers"][-2:] == ["human:r", "post"]


class _ReadTogether(StepstoneSaver):
    """Once, right after loading a thread's latest checkpoint: waits at ``barrier`` (so
    two invokes surely start from the same head), then for ``after`` (an event set when
    the other invoke has finished), the interleaving in which a stale head's invoke
    would silently replace a finished one."""

    barrier: Any = None
    after: Any = None

    def _together(self, config: RunnableConfig) -> None:
        if self.barrier is not None and not get_checkpoint_id(config):
            barrier, self.barrier = self.barrier, None
            barrier.wait(CHILD_TIMEOUT)
            if self.after is not None and not self.after.wait(CHILD_TIMEOUT):
                raise TimeoutError("the other invoke never finished")

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = super().get_tuple(config)
        self._together(config)
        return found

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await super().aget_tuple(config)
        await asyncio.to_thread(self._together, config)
        return found


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _chat(saver: StepstoneSaver) -> CompiledStateGraph[Any]:
    builder = StateGraph(Chat)
    builder.add_node("reply", lambda s: {"messages": [f"reply to {s['messages'][-1]}"]})
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def _invoke_or_lose(
    saver: StepstoneSaver, form: str, name: str, durability: Durability = "sync"
) -> str:
    """One invoke of ``name`` on thread ``chat``: "won", or "lost" to CheckpointConflict."""
    try:
        _run(_chat(saver), form, {"messages": [name]}, _chat_thread(), durability)
    except CheckpointConflict:
        return "lost"
    return "won"


def _assert_no_invoke_lost(saver: StepstoneSaver, outcomes: dict[str, str]) -> None:
    """Exactly one invoke won, and the thread's latest state holds it and the first turn."""
    assert sorted(outcomes.values()) == ["lost", "won"], outcomes
    (winner,) = [name for name, outcome in outcomes.items() if outcome == "won"]
    state = _chat(saver).get_state({"configurable": {"thread_id": "chat"}})
    assert state.values["messages"] == ["hi", "reply to hi", winner, f"reply to {winner}"]


@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.parametrize("form", ["sync", "async"])
def test_two_invokes_from_one_head_never_lose_one(
    store: Store, form: str, durability: Durability
) -> None:
    """Two invokes load the same latest checkpoint and one finishes first: the other is
    refused, not stored as the thread's new head in place of the finished one."""
    prefix = f"ti{uuid.uuid4().hex[:8]}"
    _run(_chat(StepstoneSaver(store, prefix=prefix)), form, {"messages": ["hi"]}, _chat_thread())
    barrier, a_done = threading.Barrier(2), threading.Event()
    outcomes: dict[str, str] = {}

    def invoke(name: str) -> None:
        saver = _ReadTogether(store, prefix=prefix)
        saver.barrier, saver.after = barrier, (a_done if name == "b" else None)
        try:
            outcomes[name] = _invoke_or_lose(saver, form, name, durability)
        finally:
            if name == "a":
                a_done.set()

    threads = [threading.Thread(target=invoke, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
        assert not t.is_alive(), "an invoking thread hung"
    _assert_no_invoke_lost(StepstoneSaver(store, prefix=prefix), outcomes)


def _chat_thread() -> RunnableConfig:
    return {"configurable": {"thread_id": "chat"}}


def _invoke_child(
    config: str, prefix: str, barrier: Any, a_done: Any, results: Any, name: str
) -> None:
    """One of two processes invoking one thread from the latest checkpoint both loaded;
    "b" goes on once "a" has finished."""
    with _ReadTogether.from_config(config, prefix=prefix) as saver:
        saver.barrier, saver.after = barrier, (a_done if name == "b" else None)
        try:
            results.put((name, _invoke_or_lose(saver, "sync", name)))
        finally:
            if name == "a":
                a_done.set()


@pytest.mark.crash
def test_two_invoke_processes_never_lose_one(durable_config: str) -> None:
    """Two processes invoke one thread from the same head, one finishing first: the
    other is refused, and the finished invoke stays in the thread."""
    prefix = f"tp{uuid.uuid4().hex[:8]}"
    with StepstoneSaver.from_config(durable_config, prefix=prefix) as saver:
        _run(_chat(saver), "sync", {"messages": ["hi"]}, _chat_thread())
        ctx = _context()
        barrier, a_done, results = ctx.Barrier(2), ctx.Event(), ctx.Queue()
        children = [
            ctx.Process(
                target=with_env,
                args=(
                    child_env(),
                    _invoke_child,
                    durable_config,
                    prefix,
                    barrier,
                    a_done,
                    results,
                    name,
                ),
            )
            for name in ("a", "b")
        ]
        for child in children:
            child.start()
        outcomes: dict[str, str] = {}
        for _ in children:
            try:
                name, outcome = results.get(timeout=CHILD_TIMEOUT)
            except queue.Empty:
                for child in children:
                    child.kill()
                pytest.fail(f"invoking processes stopped reporting after {outcomes}")
            outcomes[name] = outcome
        for child in children:
            child.join(CHILD_TIMEOUT)
            assert child.exitcode == 0, f"invoking process exited with {child.exitcode}"
        _assert_no_invoke_lost(saver, outcomes)


def _empty() -> Checkpoint:
    return empty_checkpoint()


def _meta_input() -> CheckpointMetadata:
    return {"source": "input", "step": -1, "parents": {}}


def test_an_addressed_id_is_an_ordinary_str(saver: StepstoneSaver) -> None:
    """The ids get_tuple and list hand out compare, hash, print and encode as plain str,
    and a str subclass on the other side decides equality as it would with a plain str."""

    class AnyString(str):
        def __eq__(self, other: object) -> bool:
            return isinstance(other, str)

        __hash__ = str.__hash__

    stored = saver.put({"configurable": {"thread_id": "t"}}, _empty(), _meta_input(), {})
    cp_id = stored["configurable"]["checkpoint_id"]
    found = saver.get_tuple(stored)
    assert found is not None
    addressed = found.config["configurable"]["checkpoint_id"]
    assert type(addressed) is not str and type(cp_id) is str
    assert addressed == cp_id and cp_id == addressed and (addressed != cp_id) is False
    assert hash(addressed) == hash(cp_id) and {addressed: 1}[cp_id] == 1
    assert repr(addressed) == repr(cp_id) and json.dumps(addressed) == json.dumps(cp_id)
    assert addressed == AnyString("") and found.config == {
        "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": AnyString()}
    }
    assert addressed != "other" and (addressed == "other") is False


# -- two first invokes of one new thread -------------------------------------------------


def _first_invoke(saver: StepstoneSaver, form: str, thread: str, name: str) -> str:
    """The first invoke of ``name`` on a new thread: "won", or "lost" to CheckpointConflict."""
    try:
        _run(_chat(saver), form, {"messages": [name]}, {"configurable": {"thread_id": thread}})
    except CheckpointConflict:
        return "lost"
    return "won"


def _assert_one_first_invoke(saver: StepstoneSaver, thread: str, outcomes: dict[str, str]) -> None:
    """Exactly one first invoke won, and the thread holds its turn and nothing else."""
    assert sorted(outcomes.values()) == ["lost", "won"], outcomes
    (winner,) = [name for name, outcome in outcomes.items() if outcome == "won"]
    state = _chat(saver).get_state({"configurable": {"thread_id": thread}})
    assert state.values["messages"] == [winner, f"reply to {winner}"]


@pytest.mark.parametrize("form", ["sync", "async"])
def test_two_first_invokes_of_a_new_thread_never_lose_one(store: Store, form: str) -> None:
    """Two invokes both find a new thread empty and one finishes first: the other's first
    checkpoint is refused, not made the thread's head in place of the finished invoke."""
    prefix = f"fi{uuid.uuid4().hex[:8]}"
    barrier, a_done = threading.Barrier(2), threading.Event()
    outcomes: dict[str, str] = {}

    def invoke(name: str) -> None:
        saver = _ReadTogether(store, prefix=prefix)
        saver.barrier, saver.after = barrier, (a_done if name == "b" else None)
        try:
            outcomes[name] = _first_invoke(saver, form, "new", name)
        finally:
            if name == "a":
                a_done.set()

    threads = [threading.Thread(target=invoke, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
        assert not t.is_alive(), "an invoking thread hung"
    assert outcomes == {"a": "won", "b": "lost"}
    _assert_one_first_invoke(StepstoneSaver(store, prefix=prefix), "new", outcomes)


class _PausedPut(StepstoneSaver):
    """Its put stops once it has read the namespace's head, until ``go`` is set."""

    reached: threading.Event
    go: threading.Event

    def _put_rule(self, *args: Any) -> Any:
        inner = super()._put_rule(*args)
        resume: tuple[str, Any] = ("send", (yield next(inner)))  # the head's read
        self.reached.set()
        if not self.go.wait(CHILD_TIMEOUT):
            raise TimeoutError("the other put never finished")
        while True:
            try:
                how, value = resume
                effect = inner.send(value) if how == "send" else inner.throw(value)
            except StopIteration as stop:
                return stop.value
            try:
                resume = ("send", (yield effect))
            except ConflictError as exc:  # a refused compare-and-swap: the rule handles it
                resume = ("throw", exc)


def test_two_puts_starting_one_namespace_one_creates_its_head(store: Store) -> None:
    """Two puts with no parent both find no head: the one that creates it wins; the
    other is refused and leaves nothing, instead of replacing the winner's head."""
    prefix = f"fp{uuid.uuid4().hex[:8]}"
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    late = _PausedPut(store, prefix=prefix)
    late.reached, late.go = threading.Event(), threading.Event()
    meta: CheckpointMetadata = {"source": "loop", "step": 0, "parents": {}}
    first, second = _empty(), _empty()
    outcome: list[BaseException | None] = []

    def put_late() -> None:
        try:
            late.put(config, second, meta, {})
        except CheckpointConflict as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=put_late)
    thread.start()
    assert late.reached.wait(CHILD_TIMEOUT), "the paused put never read the head"
    saver = StepstoneSaver(store, prefix=prefix)
    try:
        saver.put(config, first, meta, {})
    finally:
        late.go.set()
        thread.join(CHILD_TIMEOUT)
    assert not thread.is_alive(), "the paused put hung"
    assert len(outcome) == 1 and isinstance(outcome[0], CheckpointConflict), outcome
    latest = saver.get_tuple(config)
    assert latest is not None and latest.checkpoint["id"] == first["id"]
    assert [t.checkpoint["id"] for t in saver.list(config)] == [first["id"]]


def _first_invoke_child(
    config: str, prefix: str, barrier: Any, rounds: int, results: Any, name: str
) -> None:
    """One of two processes making the first invoke of each of ``rounds`` new threads,
    after both found it empty."""
    with open_store(config) as store:
        for r in range(rounds):
            saver = _ReadTogether(store, prefix=prefix)
            saver.barrier = barrier
            results.put((r, name, _first_invoke(saver, "sync", f"new-{r}", name)))


@pytest.mark.process
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_two_first_invoke_processes_never_lose_one(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two processes make the first invoke of the same new threads at once: of each
    pair, one wins and the thread holds exactly its turn; the other is refused."""
    config, prefix, rounds = _config_for(kind, request, tmp_path_factory), "fp", 4
    ctx = _context()
    barrier, results = ctx.Barrier(2), ctx.Queue()
    children = [
        ctx.Process(
            target=with_env,
            args=(child_env(), _first_invoke_child, config, prefix, barrier, rounds, results, n),
        )
        for n in ("a", "b")
    ]
    for child in children:
        child.start()
    outcomes: dict[int, dict[str, str]] = {r: {} for r in range(rounds)}
    for _ in range(2 * rounds):
        try:
            r, name, outcome = results.get(timeout=CHILD_TIMEOUT)
        except queue.Empty:
            for child in children:
                child.kill()
            pytest.fail(f"invoking processes stopped reporting after {outcomes}")
        outcomes[r][name] = outcome
    for child in children:
        child.join(CHILD_TIMEOUT)
        assert child.exitcode == 0, f"invoking process exited with {child.exitcode}"
    with StepstoneSaver.from_config(config, prefix=prefix) as saver:
        for r in range(rounds):
            _assert_one_first_invoke(saver, f"new-{r}", outcomes[r])
