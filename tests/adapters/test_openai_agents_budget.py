"""OpenAI Agents SDK runs under a spend budget: their usage is charged with their output."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    RunConfig,
    Usage,
    function_tool,
)
from agents.models.interface import ModelTracing
from agents.testing import assistant_message, function_call

from child_process import last_line
from stepstone import Budget, Prices, Step, Store, Suspended, open_store, run, signal, spend_of
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY
from stepstone.adapters.openai_agents import AgentRunStep


class CountingModel(Model):
    """Answers at once, reporting 120 input and 30 output tokens."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        usage = Usage(requests=1, input_tokens=120, output_tokens=30, total_tokens=150)
        return ModelResponse(output=[assistant_message("ok")], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


class CountingProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return CountingModel()


def _step(store: Store, **kwargs: Any) -> AgentRunStep:
    config = RunConfig(model_provider=CountingProvider(), tracing_disabled=True)
    agent: Agent[Any] = Agent(name="counter", instructions="answer")
    return AgentRunStep("agent", agent, "hi", store=store, run_config=config, **kwargs)


@pytest.fixture
def store() -> Iterator[Store]:
    """A fresh memory store."""
    with open_store("memory://openai-agents-budget") as opened:
        yield opened


def test_the_runs_usage_is_charged_and_the_next_step_pauses(store: Store) -> None:
    """150 tokens land in the ledger with the output; past the limit the run waits."""
    ran: list[str] = []
    steps = [_step(store), Step("after", lambda state: ran.append("after"))]
    with pytest.raises(Suspended) as paused:
        run("r", steps, store, budget=Budget(tokens=100))
    assert paused.value.waiting_for == BUDGET_WAIT and ran == []
    cp = store.load("r")
    assert cp is not None and cp.state["agent"] == "ok" and spend_of(cp).tokens == 150
    signal(store, "r", RAISE_SIGNAL, {"tokens": 1000})
    final = run("r", steps, store)
    assert ran == ["after"] and final[SPEND_KEY]["tokens"] == 150


def test_prices_make_dollars(store: Store) -> None:
    """At $2 in / $8 out per million tokens, 120 + 30 tokens cost $0.00048."""
    prices = Prices(input_per_million=2.0, output_per_million=8.0, as_of="2026-12-01")
    run("p", [_step(store, prices=prices)], store)
    spend = spend_of(store.load("p"))  # type: ignore[arg-type]
    assert (spend.usd, spend.tokens) == (0.00048, 150)


CALLS: list[int] = []


class ToolThenAnswer(Model):
    """Calls the tool ``look`` first, then answers; 120 + 30 tokens a call."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        CALLS.append(len(input))
        usage = Usage(requests=1, input_tokens=120, output_tokens=30, total_tokens=150)
        first = isinstance(input, str) or len(input) == 1
        call = function_call("look", "{}", call_id="call-1")
        output = [call] if first else [assistant_message("done")]
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


class ToolProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return ToolThenAnswer()


@function_tool
def look() -> str:
    """Look something up."""
    return "found"


def test_an_agent_run_pauses_between_its_model_calls_at_the_limit(store: Store) -> None:
    """150 tokens of 100 after the first call: the second waits; raised, the first is
    replayed from the journal and the run's usage is charged once."""
    CALLS.clear()
    config = RunConfig(model_provider=ToolProvider(), tracing_disabled=True)
    agent: Agent[Any] = Agent(name="looker", instructions="look", tools=[look])
    steps = [AgentRunStep("agent", agent, "hi", store=store, run_config=config)]
    with pytest.raises(Suspended) as paused:
        run("between", steps, store, budget=Budget(tokens=100))
    assert paused.value.waiting_for == BUDGET_WAIT and len(CALLS) == 1
    cp = store.load("between")
    assert cp is not None and "agent" not in cp.state and spend_of(cp).tokens == 0
    assert steps[0].ready(cp) is False  # no raise yet: not due
    signal(store, "between", RAISE_SIGNAL, {"tokens": 1000})
    assert steps[0].ready(store.load("between")) is True  # type: ignore[arg-type]
    final = run("between", steps, store)
    assert final["agent"] == "done" and len(CALLS) == 2
    assert final[SPEND_KEY]["tokens"] == 300


CHILD = r"""
import json, os, sys
# This module's folder and tests/ (what the module imports from there).
sys.path[:0] = [sys.argv[2], os.path.dirname(sys.argv[2])]
from agents import Agent, RunConfig
from test_openai_agents_budget import CALLS, ToolProvider, look
from stepstone import Budget, Suspended, open_store, run
from stepstone.adapters.openai_agents import AgentRunStep

with open_store(sys.argv[1]) as store:
    config = RunConfig(model_provider=ToolProvider(), tracing_disabled=True)
    agent = Agent(name="looker", instructions="look", tools=[look])
    steps = [AgentRunStep("agent", agent, "hi", store=store, run_config=config)]
    try:
        run("r", steps, store, budget=Budget(tokens=100))
        out = "done"
    except Suspended as exc:
        out = exc.waiting_for
    print(json.dumps([out, len(CALLS)]))
"""


@pytest.mark.process
def test_a_run_paused_between_model_calls_is_raised_from_another_process_and_ends_exact(
    tmp_path: Path,
) -> None:
    """Paused after its first model call (150 tokens of 100), raised by `stepstone runs
    budget` in a second process, the run finishes in a third that makes only the second
    call (the first is answered by the journal): 300 tokens, each call charged once."""
    config = f"sqlite:///{tmp_path}/runs.db"
    here = str(Path(__file__).resolve().parent)
    assert json.loads(last_line("-c", CHILD, config, here)) == [BUDGET_WAIT, 1]
    last_line("-m", "stepstone", "runs", "budget", "r", "--raise-tokens", "1000", "--store", config)
    assert json.loads(last_line("-c", CHILD, config, here)) == ["done", 1]
    with open_store(config) as store:
        cp = store.load("r")
    assert cp is not None and cp.status == "done"
    spend = spend_of(cp)
    assert (spend.tokens, spend.by_step) == (300, {"agent": {"usd": 0.0, "tokens": 300}})
