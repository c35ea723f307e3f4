"""StepstoneSaver(budget=, prices=): a graph's AI messages' usage charged to its thread.

A fake chat model reports usage on every answer; the saver charges it, by message id,
in the head's compare-and-swap that commits each checkpoint, and stops the graph at the
thread's limit before its next superstep.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph

from fresh_stores import fresh_config
from stepstone import Budget, Checkpoint, InvalidWorkflow, Prices, Store, open_store, spend_of
from stepstone._budget import SPEND_KEY
from stepstone._errors import StoreUnavailable
from stepstone.adapters.langgraph import StepstoneSaver, ThreadOverBudget
from stepstone.cli._budget import over_budget

INPUT, OUTPUT = 10, 5  # the tokens the fake model reports per answer


class UsageModel(BaseChatModel):
    """A chat model that answers "answer N" and reports ``INPUT``/``OUTPUT`` tokens."""

    calls: list[int] = []  # noqa: RUF012 - one list per instance, set in the fixture

    @property
    def _llm_type(self) -> str:
        return "usage-fake"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(len(messages))
        message = AIMessage(
            content=f"answer {len(self.calls)}",
            usage_metadata={
                "input_tokens": INPUT,
                "output_tokens": OUTPUT,
                "total_tokens": INPUT + OUTPUT,
            },
            response_metadata={"model_name": "fake-1"},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def _graph(saver: StepstoneSaver, model: UsageModel) -> Any:
    """Two model calls in a row: ``first``, then ``second``."""

    def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("first", call)
    builder.add_node("second", call)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver)


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Store]:
    """A fresh store of each local kind, and PostgreSQL."""
    with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def model() -> UsageModel:
    """The fake model, its calls counted afresh."""
    fake = UsageModel()
    fake.calls = []
    return fake


def _head(store: Store, thread: str) -> Checkpoint:
    head = store.load(f"langgraph/{thread}/")
    assert head is not None, f"no head record for thread {thread!r}"
    return head


def test_usage_is_charged_once_per_message_with_prices(store: Store, model: UsageModel) -> None:
    """Each answer's tokens and dollars are charged once, though every later checkpoint
    carries the message again; the ledger names the prices' date."""
    prices = Prices(input_per_million=2.0, output_per_million=8.0, as_of="2026-12-01")
    saver = StepstoneSaver(store, prices=prices)
    config = {"configurable": {"thread_id": "t1"}}
    _graph(saver, model).invoke({"messages": [HumanMessage("hi")]}, config)
    _graph(saver, model).invoke({"messages": [HumanMessage("again")]}, config)
    assert len(model.calls) == 4
    spend = spend_of(_head(store, "t1"))
    assert spend.tokens == 4 * (INPUT + OUTPUT)
    assert spend.usd == round(4 * prices.cost(INPUT, OUTPUT), 9) > 0
    ledger = _head(store, "t1").state[SPEND_KEY]
    assert ledger["prices_as_of"] == "2026-12-01" and len(ledger["refs"]) == 4
    assert ledger["by_step"] == {"fake-1": {"usd": spend.usd, "tokens": spend.tokens}}


def test_the_graph_stops_at_the_limit_and_goes_on_with_a_larger_budget(
    store: Store, model: UsageModel
) -> None:
    """At the limit the superstep's checkpoint is kept and the next one is not run; new
    input is refused with nothing written; a larger budget lets the thread finish."""
    config = {"configurable": {"thread_id": "t2"}}
    tight = StepstoneSaver(store, budget=Budget(tokens=INPUT + OUTPUT))
    with pytest.raises(ThreadOverBudget, match="reached its budget") as stopped:
        # "sync": each checkpoint is saved before the next superstep starts (LangGraph's
        # default, "async", saves it beside the next superstep, which then runs too).
        _graph(tight, model).invoke({"messages": [HumanMessage("hi")]}, config, durability="sync")
    assert stopped.value.thread_id == "t2" and model.calls == [1]
    assert over_budget(_head(store, "t2"))  # runs list --over-budget shows the thread
    state = _graph(tight, model).get_state(config)
    assert state.next == ("second",) and state.values["messages"][-1].content == "answer 1"
    before = _head(store, "t2").version
    with pytest.raises(ThreadOverBudget, match="nothing was written"):
        _graph(tight, model).invoke({"messages": [HumanMessage("more")]}, config, durability="sync")
    assert model.calls == [1] and _head(store, "t2").version == before
    roomy = StepstoneSaver(store, budget=Budget(tokens=100))
    final = _graph(roomy, model).invoke(None, config)
    assert [m.content for m in final["messages"]] == ["hi", "answer 1", "answer 2"]
    spend = spend_of(_head(store, "t2"))
    assert spend.tokens == 2 * (INPUT + OUTPUT) and spend.limit_tokens == 100
    assert not spend.over


def test_a_put_whose_commit_failed_charges_nothing_and_its_rerun_charges_once(
    store: Store, model: UsageModel
) -> None:
    """The charge is part of the head's save: when that save never lands, nothing is
    charged; the resumed graph reuses the task's saved answer and charges it once."""
    thread = f"t3-{uuid.uuid4().hex[:6]}"
    config = {"configurable": {"thread_id": thread}}
    saver = StepstoneSaver(store, budget=Budget(tokens=1000))
    real_save = store.save
    failing = {"left": 0}

    def save(cp: Checkpoint) -> Checkpoint:
        # The head of the second superstep: its save fails (twice: the retry too).
        if cp.run_id == f"langgraph/{thread}/" and failing["left"] > 0:
            failing["left"] -= 1
            raise StoreUnavailable("injected: the head's save did not land")
        return real_save(cp)

    real_many = store.save_many

    def save_many(cps: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
        # The head saved with its checkpoint in one call: the same failure, the head's alone.
        head = f"langgraph/{thread}/"
        if failing["left"] == 0 or all(cp.run_id != head for cp in cps):
            return real_many(cps)
        failing["left"] -= 1
        landed = iter(real_many([cp for cp in cps if cp.run_id != head]))
        lost = StoreUnavailable("injected: the head's save did not land")
        return [lost if cp.run_id == head else next(landed) for cp in cps]

    store.save = save  # type: ignore[method-assign,assignment]
    store.save_many = save_many  # type: ignore[method-assign,assignment]
    graph = _graph(saver, model)
    original_put = saver.put
    failed: list[str] = []

    def put(*args: Any, **kwargs: Any) -> Any:
        # The first put of the checkpoint that holds "first"'s answer: its head save fails.
        if len(args[1]["channel_values"].get("messages", ())) == 2 and not failed:
            failed.append(args[1]["id"])
            failing["left"] = 2
        return original_put(*args, **kwargs)

    saver.put = put  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable, match="injected"):
        graph.invoke({"messages": [HumanMessage("hi")]}, config, durability="sync")
    assert model.calls == [1] and len(failed) == 1
    assert spend_of(_head(store, thread)).tokens == 0  # the input's head: nothing charged
    final = graph.invoke(None, config, durability="sync")
    assert [m.content for m in final["messages"]] == ["hi", "answer 1", "answer 2"]
    assert model.calls == [1, 2]  # "first" was not called again: its writes were saved
    spend = spend_of(_head(store, thread))
    assert spend.tokens == 2 * (INPUT + OUTPUT) and len(spend.by_step) == 1


def test_no_budget_and_no_prices_leave_the_head_as_before(store: Store, model: UsageModel) -> None:
    """A saver without budget or prices adds no ledger."""
    config = {"configurable": {"thread_id": "t4"}}
    _graph(StepstoneSaver(store), model).invoke({"messages": [HumanMessage("hi")]}, config)
    assert SPEND_KEY not in _head(store, "t4").state


def test_bad_budget_or_prices_are_refused(store: Store) -> None:
    """The arguments are checked when the saver is built."""
    with pytest.raises(InvalidWorkflow, match="budget must be"):
        StepstoneSaver(store, budget={"usd": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidWorkflow, match="prices must be"):
        StepstoneSaver(store, prices=2.0)  # type: ignore[arg-type]


def test_async_graphs_are_charged_and_stopped_alike(store: Store, model: UsageModel) -> None:
    """aput charges as put does, and stops an ainvoke at the limit."""
    config = {"configurable": {"thread_id": "t5"}}
    saver = StepstoneSaver(store, budget=Budget(tokens=INPUT + OUTPUT))
    with pytest.raises(ThreadOverBudget):
        asyncio.run(
            _graph(saver, model).ainvoke(
                {"messages": [HumanMessage("hi")]}, config, durability="sync"
            )
        )
    assert model.calls == [1] and spend_of(_head(store, "t5")).tokens == INPUT + OUTPUT


def test_a_copied_thread_is_not_charged_again_for_what_it_copied(
    store: Store, model: UsageModel
) -> None:
    """copy_thread: the copy's next checkpoint charges only its own new answers."""
    saver = StepstoneSaver(store, budget=Budget(tokens=1000))
    source = {"configurable": {"thread_id": "t6"}}
    _graph(saver, model).invoke({"messages": [HumanMessage("hi")]}, source)
    saver.copy_thread("t6", "t7")
    target = {"configurable": {"thread_id": "t7"}}
    _graph(saver, model).invoke({"messages": [HumanMessage("more")]}, target)
    assert len(model.calls) == 4
    assert spend_of(_head(store, "t6")).tokens == 2 * (INPUT + OUTPUT)
    assert spend_of(_head(store, "t7")).tokens == 2 * (INPUT + OUTPUT)  # its own two
