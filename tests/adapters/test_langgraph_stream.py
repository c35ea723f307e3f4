"""LangGraph's ``custom`` and ``messages`` stream modes on the stepstone run's stream.

The graph's chat model is langchain-core's ``GenericFakeChatModel`` (no network), which
streams its message word by word; a node writes progress with ``get_stream_writer``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph

from fresh_stores import fresh_config
from stepstone import EmitOutsideStep, RetryPolicy, Step, arun, open_store, run, stream
from stepstone.adapters.langgraph import astream_graph, stream_graph

KINDS = ("memory", "sqlite")


class Chat(TypedDict):
    q: str
    answer: str


def _graph(fail_first: bool = False) -> Any:
    """think (writes progress) -> answer (a chat model's reply); answer may fail once."""
    model = GenericFakeChatModel(messages=iter([AIMessage(content="It is 42")] * 2))
    failures = {"left": 1 if fail_first else 0}

    def think(state: Chat) -> dict[str, Any]:
        get_stream_writer()({"progress": "thinking"})
        return {}

    def answer(state: Chat) -> dict[str, Any]:
        reply = model.invoke(state["q"]).content
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("the model timed out after streaming")
        return {"answer": reply}

    builder = StateGraph(Chat)
    builder.add_node("think", think)
    builder.add_node("answer", answer)
    builder.add_edge(START, "think")
    builder.add_edge("think", "answer")
    builder.add_edge("answer", END)
    return builder.compile()


EXPECTED = [
    ("custom", {"progress": "thinking"}),
    ("tokens", "It"),
    ("tokens", " "),
    ("tokens", "is"),
    ("tokens", " "),
    ("tokens", "42"),
]


@pytest.mark.parametrize("kind", KINDS)
def test_stream_graph_emits_custom_and_messages(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    graph = _graph()

    def ask(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"graph": stream_graph(graph, {"q": "what?", "answer": ""})}

    with open_store(fresh_config(kind, request, tmp_path)) as store:
        state = run("lg-stream", [Step("ask", ask)], store)
        events = [(e.topic, e.data) for e in stream(store, "lg-stream", follow=False)]
    assert state["graph"] == {"q": "what?", "answer": "It is 42"}
    assert events == EXPECTED


def test_astream_graph_in_an_async_step(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    graph = _graph()

    async def ask(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"graph": await astream_graph(graph, {"q": "what?", "answer": ""})}

    with open_store(fresh_config("sqlite", request, tmp_path)) as store:
        state = asyncio.run(arun("lg-astream", [Step("ask", ask)], store))
        events = [(e.topic, e.data) for e in stream(store, "lg-astream", follow=False)]
    assert state["graph"]["answer"] == "It is 42"
    assert events == EXPECTED


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_runs_the_graph_again_and_hides_the_failed_attempt(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    graph = _graph(fail_first=True)

    def ask(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"graph": stream_graph(graph, {"q": "what?", "answer": ""})}

    step = Step("ask", ask, retry=RetryPolicy(max_attempts=2, initial_delay=0))
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        run("lg-retry", [step], store)
        shown = [(e.topic, e.data) for e in stream(store, "lg-retry", follow=False)]
        everything = list(stream(store, "lg-retry", follow=False, superseded=True))
    assert shown == EXPECTED  # once: the committing attempt's
    assert [(e.topic, e.data) for e in everything if e.superseded] == EXPECTED
    assert {e.attempt for e in everything if e.superseded} == {1}


def test_outside_a_step_it_says_so() -> None:
    with pytest.raises(EmitOutsideStep):
        stream_graph(_graph(), {"q": "what?", "answer": ""})
