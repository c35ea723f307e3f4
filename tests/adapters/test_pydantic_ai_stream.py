"""pydantic-ai's agent events on the stepstone run's stream (``emit_events``), durably.

The agents stream from pydantic-ai's ``FunctionModel`` (no network); the model and the
tool count their calls, so a test sees what a retry replayed instead of running again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from fresh_stores import fresh_config
from stepstone import RetryPolicy, Store, open_store, run, stream
from stepstone.adapters.pydantic_ai import (
    AgentStep,
    StepstoneDurability,
    adurable_agent_run,
    emit_events,
)

KINDS = ("memory", "sqlite")


def _agent(fail_first: bool, handler: Any = emit_events) -> tuple[Agent[None, str], dict[str, int]]:
    """An agent that looks a number up, then streams its answer in two deltas."""
    calls = {"model": 0, "lookup": 0}

    async def model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        calls["model"] += 1
        returned = [
            p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)
        ]
        if not returned:
            yield {0: DeltaToolCall(name="lookup", json_args='{"x": 7}', tool_call_id="s1")}
        else:
            yield "It is "
            yield "v7."

    agent: Agent[None, str] = Agent(
        FunctionModel(stream_function=model),
        name="support",
        capabilities=[StepstoneDurability(event_stream_handler=handler)],
    )

    @agent.tool_plain
    def lookup(x: int) -> str:
        calls["lookup"] += 1
        if fail_first and calls["lookup"] == 1:
            raise RuntimeError("the lookup service timed out")
        return f"v{x}"

    return agent, calls


CALLED = {"event": "called", "name": "lookup", "call_id": "s1", "arguments": '{"x":7}'}
OUTPUT = {"event": "output", "call_id": "s1", "output": "v7"}


@pytest.mark.parametrize("kind", KINDS)
def test_emit_events_streams_tokens_and_tool_events(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    agent, _ = _agent(fail_first=False)
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        assert asyncio.run(adurable_agent_run(store, "pa-stream", agent, "q")) == "It is v7."
        events = [(e.topic, e.data) for e in stream(store, "pa-stream", follow=False)]
    assert events == [
        ("tool", CALLED),
        ("tool", OUTPUT),
        ("tokens", "It is "),
        ("tokens", "v7."),
    ]


def _run_with_retry(store: Store, agent: Agent[None, str], run_id: str) -> dict[str, Any]:
    retry = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    return run(run_id, [AgentStep("agent", agent, "q", retry=retry, store=store)], store)


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_shows_each_units_events_once(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each unit's events commit with its journal entry: the failed attempt's journaled
    call event stays shown, once (the retry replays it, emitting nothing again)."""
    agent, calls = _agent(fail_first=True)
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        assert _run_with_retry(store, agent, "pa-retry")["agent"] == "It is v7."
        shown = [(e.topic, e.data) for e in stream(store, "pa-retry", follow=False)]
        everything = list(stream(store, "pa-retry", follow=False, superseded=True))
    # The first model request was replayed, not repeated; the tool ran again.
    assert calls == {"model": 2, "lookup": 2}
    assert shown == [("tool", CALLED), ("tool", OUTPUT), ("tokens", "It is "), ("tokens", "v7.")]
    assert not [e for e in everything if e.superseded]


def test_a_replayed_request_keeps_its_streamed_text(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A run resumed after its answer streamed (the step failed later) replays the model
    request: the text it streamed stays shown as streamed, and is not emitted again."""
    failures = {"left": 1}
    agent, calls = _agent(fail_first=False)

    def output(result: Any) -> str:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("the output could not be stored")
        return str(result.output)

    retry = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    with open_store(fresh_config("sqlite", request, tmp_path)) as store:
        step = AgentStep("agent", agent, "q", retry=retry, store=store, output=output)
        assert run("pa-replay", [step], store)["agent"] == "It is v7."
        shown = [(e.topic, e.data) for e in stream(store, "pa-replay", follow=False)]
    assert calls == {"model": 2, "lookup": 1}  # the retry ran nothing again
    assert shown == [("tool", CALLED), ("tool", OUTPUT), ("tokens", "It is "), ("tokens", "v7.")]


def test_a_users_own_handler_is_not_run_again_on_replay(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    seen: list[str] = []

    async def handler(ctx: Any, events: Any) -> None:
        async for event in events:
            seen.append(type(event).__name__)

    agent, _ = _agent(fail_first=True, handler=handler)
    with open_store(fresh_config("memory", request, tmp_path)) as store:
        _run_with_retry(store, agent, "pa-own")
    # The tool ran twice, but its call event's handler unit was recorded by the failed
    # attempt and replayed by the retry: a handler of the user's runs once per event.
    assert seen.count("FunctionToolCallEvent") == 1
    assert seen.count("FunctionToolResultEvent") == 1
