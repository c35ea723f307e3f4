"""Agent Framework usage charges: a real MAF agent on a fake model that reports usage,
called from stepstone steps under a budget: paused at the limit, raised, charged once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, BaseChatClient, ChatResponse, Message, UsageDetails

import stepstone
from stepstone import (
    AsyncWorkflowContext,
    Budget,
    InvalidCharge,
    Prices,
    Step,
    StepContext,
    Suspended,
    arun,
    open_store,
    signal,
    spend_of,
)
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL
from stepstone.adapters.agent_framework import usage_charge

PRICES = Prices(input_per_million=2.0, output_per_million=8.0, as_of="2026-12-01")
CALLS: list[str] = []


class UsageModel(BaseChatClient):
    """A fake chat model (no API) that answers with an id and 1,000 in + 250 out tokens."""

    async def _inner_get_response(
        self, *, messages: Any, stream: bool, options: Any, **_: Any
    ) -> Any:
        text = messages[-1].text
        CALLS.append(text)
        return ChatResponse(
            messages=[Message(role="assistant", contents=[f"re: {text}"])],
            response_id=f"resp-{text}",
            usage_details=UsageDetails(input_token_count=1000, output_token_count=250),
        )


def _agent() -> Agent:
    return Agent(client=UsageModel(), name="writer", instructions="write")


def _asking(question: str) -> Step:
    async def ask(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        response = await _agent().run(question)
        ctx.charge(**usage_charge(response, PRICES))
        return {question: response.text}

    return Step(question, ask)


def test_usage_charges_pause_a_budgeted_run_and_count_once(tmp_path: Path) -> None:
    """$0.004 per call (1,000 in at $2/M, 250 out at $8/M): at $0.008 the third waits."""
    CALLS.clear()
    steps = [_asking(q) for q in ("a", "b", "c")]
    with open_store(f"sqlite:///{tmp_path}/runs.db") as store:
        with pytest.raises(Suspended) as paused:
            asyncio.run(arun("r", steps, store, budget=Budget(usd=0.008)))
        assert paused.value.waiting_for == BUDGET_WAIT and CALLS == ["a", "b"]
        signal(store, "r", RAISE_SIGNAL, {"usd": 1})
        final = asyncio.run(arun("r", steps, store))
        spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert final["c"] == "re: c" and CALLS == ["a", "b", "c"]
    assert (spend.usd, spend.tokens) == (0.012, 3750)
    assert spend.by_step["b"] == {"usd": 0.004, "tokens": 1250}


def test_usage_charges_in_a_code_workflow_use_the_response_id_as_ref(tmp_path: Path) -> None:
    """The same response charged twice counts once: its response_id is the ref."""
    CALLS.clear()

    async def ask(question: str) -> dict[str, Any]:
        response = await _agent().run(question)
        return {"text": response.text, "charge": usage_charge(response)}

    @stepstone.workflow("maf-agent")
    async def agent(ctx: AsyncWorkflowContext, input: dict[str, Any]) -> list[bool]:
        reply = await ctx.step("ask", ask, "q")
        return [await ctx.charge(**reply["charge"]), await ctx.charge(**reply["charge"])]

    with open_store(f"sqlite:///{tmp_path}/runs.db") as store:
        final = asyncio.run(arun("r", agent, store, budget=Budget(tokens=10_000)))
        spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert final["result"] == [True, False] and (spend.usd, spend.tokens) == (0.0, 1250)


def test_usage_charge_reads_mappings_and_refuses_what_holds_no_usage() -> None:
    """A UsageDetails mapping works; a bad count or a value without usage is refused."""
    usage = UsageDetails(input_token_count=10, output_token_count=None)
    assert usage_charge(usage, ref="x") == {"usd": 0.0, "tokens": 10, "ref": "x"}
    with pytest.raises(InvalidCharge, match="input_token_count must be an int >= 0"):
        usage_charge({"input_token_count": -1})
    with pytest.raises(InvalidCharge, match="AgentResponse or ChatResponse"):
        usage_charge("not a response")
    with pytest.raises(InvalidCharge, match="prices must be a stepstone.Prices"):
        usage_charge(usage, prices=2.0)  # type: ignore[arg-type]
