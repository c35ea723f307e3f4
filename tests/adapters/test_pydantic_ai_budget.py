"""pydantic-ai agents under a spend budget: their usage is charged with their output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepstone
from child_process import last_line
from stepstone import (
    Budget,
    InvalidWorkflow,
    Prices,
    Step,
    Store,
    Suspended,
    open_store,
    run,
    signal,
    spend_of,
)
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY
from stepstone.adapters.pydantic_ai import AgentStep, StepstoneDurability
from stepstone.cli._budget import over_budget, spend_text


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("lookup", {"x": 1})])
    return ModelResponse(parts=[TextPart("answer")])


def _agent(durable: bool) -> Agent[None, str]:
    capabilities = [StepstoneDurability()] if durable else []
    agent: Agent[None, str] = Agent(
        FunctionModel(_model), name="spender", capabilities=capabilities
    )

    @agent.tool_plain
    def lookup(x: int) -> str:
        return f"v{x}"

    return agent


def _expected_usage() -> tuple[int, int]:
    """The usage the same agent reports when run without stepstone."""
    used = _agent(durable=False).run_sync("q").usage
    return used.input_tokens or 0, used.output_tokens or 0


@pytest.fixture
def store() -> Iterator[Store]:
    """A fresh memory store."""
    with open_store("memory://pydantic-ai-budget") as opened:
        yield opened


def test_an_agent_steps_usage_is_charged_and_the_next_step_pauses(store: Store) -> None:
    """The agent's tokens land in the ledger with its output; past the limit the run waits."""
    inputs, outputs = _expected_usage()
    ran: list[str] = []
    steps = [
        AgentStep("agent", _agent(durable=True), "q", store=store),
        Step("after", lambda state: ran.append("after")),
    ]
    with pytest.raises(Suspended) as paused:
        # Reached by the agent's last request: the agent ends, the next step waits.
        run("r", steps, store, budget=Budget(tokens=inputs + outputs))
    assert paused.value.waiting_for == BUDGET_WAIT and ran == []
    cp = store.load("r")
    assert cp is not None and cp.state["agent"] == "answer"
    assert spend_of(cp).tokens == inputs + outputs > 0
    signal(store, "r", RAISE_SIGNAL, {"tokens": 10_000})
    final = run("r", steps, store)
    assert ran == ["after"]
    assert final[SPEND_KEY]["by_step"] == {"agent": {"usd": 0.0, "tokens": inputs + outputs}}


REQUESTS: list[int] = []


def _counted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    REQUESTS.append(len(messages))
    return _model(messages, info)


def test_an_agent_run_pauses_between_its_model_requests_at_the_limit(store: Store) -> None:
    """Past the limit after its first request, the agent waits before its second; once
    raised, the first is replayed from the journal, and the usage is charged once."""
    inputs, outputs = _expected_usage()
    REQUESTS.clear()
    agent: Agent[None, str] = Agent(
        FunctionModel(_counted), name="spender", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    def lookup(x: int) -> str:
        return f"v{x}"

    steps = [AgentStep("agent", agent, "q", store=store)]
    with pytest.raises(Suspended) as paused:
        run("between", steps, store, budget=Budget(tokens=1))
    assert paused.value.waiting_for == BUDGET_WAIT and REQUESTS == [1]
    cp = store.load("between")
    assert cp is not None and "agent" not in cp.state and spend_of(cp).tokens == 0
    assert cp.consumed.get(RAISE_SIGNAL, 0) == 0
    with pytest.raises(Suspended):
        run("between", steps, store)  # not raised: still waiting, no request made
    assert REQUESTS == [1]
    # Nothing charged yet, yet over budget by definition: it waits for a raise.
    assert over_budget(store.load("between")) and "OVER BUDGET" in str(spend_text(cp))
    signal(store, "between", RAISE_SIGNAL, {"tokens": 100_000})
    final = run("between", steps, store)
    assert final["agent"] == "answer" and REQUESTS == [1, 3]
    assert not over_budget(store.load("between"))
    assert final[SPEND_KEY]["by_step"] == {"agent": {"usd": 0.0, "tokens": inputs + outputs}}


def test_prices_turn_the_usage_into_dollars_and_say_their_date(store: Store) -> None:
    """With Prices the charge has dollars too, and the ledger names the prices' date."""
    inputs, outputs = _expected_usage()
    prices = Prices(input_per_million=2.0, output_per_million=8.0, as_of="2026-12-01")
    step = AgentStep("agent", _agent(durable=True), "q", store=store, prices=prices)
    final = run("p", [step], store)
    spend = spend_of(store.load("p"))  # type: ignore[arg-type]
    assert spend.usd == round((inputs * 2.0 + outputs * 8.0) / 1e6, 9) > 0
    assert final[SPEND_KEY]["prices_as_of"] == "2026-12-01"


def test_without_a_budget_or_prices_nothing_is_added_to_the_state(store: Store) -> None:
    """An agent step in a run with no budget keeps its state as before: no ledger."""
    final = run("n", [AgentStep("agent", _agent(durable=True), "q", store=store)], store)
    assert SPEND_KEY not in final


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"input_per_million": -1, "output_per_million": 1, "as_of": "x"}, ">= 0"),
        ({"input_per_million": 1, "output_per_million": 1, "as_of": ""}, "as_of"),
    ],
)
def test_bad_prices_are_refused(kwargs: dict[str, Any], says: str) -> None:
    """Prices check their numbers and insist on a date."""
    with pytest.raises(InvalidWorkflow, match=says):
        Prices(**kwargs)


CHILD = r"""
import json, sys
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from stepstone import Budget, Suspended, open_store, run
from stepstone.adapters.pydantic_ai import AgentStep, StepstoneDurability
from stepstone.cli._budget import over_budget, spend_text

def model(messages, info):
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("lookup", {"x": 1})])
    return ModelResponse(parts=[TextPart("answer")])

def agent():
    made = Agent(FunctionModel(model), name="spender", capabilities=[StepstoneDurability()])
    @made.tool_plain
    def lookup(x: int) -> str:
        return f"v{x}"
    return made

with open_store(sys.argv[1]) as store:
    steps = [AgentStep(n, agent(), "q", store=store) for n in ("first", "second")]
    try:
        run("r", steps, store, budget=Budget(tokens=1))
    except Suspended as exc:
        print(json.dumps(exc.waiting_for))
        sys.exit(0)
    print(json.dumps("done"))
"""


@pytest.mark.process
def test_a_paused_agent_run_is_raised_from_another_process_and_ends_exact(
    tmp_path: Path,
) -> None:
    """Paused after its first agent, raised by `stepstone runs budget` in another process,
    the run finishes in a third with each agent's usage charged once."""
    inputs, outputs = _expected_usage()
    config = f"sqlite:///{tmp_path}/runs.db"
    assert json.loads(last_line("-c", CHILD, config)) == BUDGET_WAIT
    last_line(
        "-m", "stepstone", "runs", "budget", "r", "--raise-tokens", "100000", "--store", config
    )
    assert json.loads(last_line("-c", CHILD, config)) == "done"
    with open_store(config) as store:
        spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    each = {"usd": 0.0, "tokens": inputs + outputs}
    assert spend.by_step == {"first": each, "second": each}
    assert (spend.tokens, spend.limit_tokens) == (2 * (inputs + outputs), 100_001)


def test_an_agents_usage_counts_against_its_runs_tenant(tmp_path: Path) -> None:
    """The agent step's usage charge reaches the tenant's window too, once."""
    inputs, outputs = _expected_usage()
    with open_store(f"sqlite:///{tmp_path}/runs.db") as store:
        stepstone.set_tenant_cap(store, stepstone.TenantCap("acme", tokens=1_000_000))
        steps = [AgentStep("agent", _agent(durable=True), "q", store=store)]
        run("t", steps, store, budget=Budget(tenant="acme"))
        run("t", steps, store)  # done: nothing charged again
        spent = stepstone.tenant_spend(store, "acme")
    assert spent.tokens == inputs + outputs > 0
