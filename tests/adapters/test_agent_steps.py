"""What the adapters' agent steps share (``adapters._agent_step``): repr, name, prices."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent as OpenAIAgent
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.test import TestModel

from stepstone import InvalidWorkflow, RetryPolicy, open_store
from stepstone.adapters.openai_agents import AgentRunStep
from stepstone.adapters.pydantic_ai import AgentStep, StepstoneDurability


def _openai(**options: Any) -> AgentRunStep:
    return AgentRunStep("answer", OpenAIAgent(name="support"), "hi", **options)


def _pydantic(**options: Any) -> AgentStep:
    agent: PydanticAgent[None, str] = PydanticAgent(
        TestModel(), name="helper", capabilities=[StepstoneDurability()]
    )
    return AgentStep("reply", agent, "hi", store=open_store("memory://"), **options)


def test_each_agent_step_shows_its_kind_name_and_agent() -> None:
    assert repr(_openai()) == "AgentRunStep('answer', 'support')"
    assert repr(_pydantic()) == "AgentStep('reply', 'helper')"


def test_each_agent_step_keeps_its_retry_policy_and_checks_its_prices() -> None:
    retry = RetryPolicy(max_attempts=3)
    assert _openai(retry=retry).retry is retry
    assert _pydantic(retry=retry).retry is retry
    assert _openai().prices is None and _pydantic().prices is None
    with pytest.raises(InvalidWorkflow, match=r"^AgentRunStep 'answer': prices must be"):
        _openai(prices={"input": 1})
    with pytest.raises(InvalidWorkflow, match=r"^AgentStep 'reply': prices must be"):
        _pydantic(prices={"input": 1})
    with pytest.raises(InvalidWorkflow):
        AgentRunStep("", OpenAIAgent(name="support"), "hi")  # the name is checked too
