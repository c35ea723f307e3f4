"""Each adapter package, imported without its framework, says which extra to install."""

from __future__ import annotations

import importlib
import sys

import pytest

CASES = [
    (
        "agent_framework",
        "agent_framework",
        "stepstone.adapters.agent_framework needs Microsoft Agent Framework: "
        "pip install 'stepstone[agent-framework]'",
    ),
    (
        "openai_agents",
        "agents",
        "stepstone.adapters.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'stepstone[openai-agents]'",
    ),
    (
        "pydantic_ai",
        "pydantic_ai",
        "stepstone.adapters.pydantic_ai needs pydantic-ai: pip install 'stepstone[pydantic-ai]'",
    ),
    (
        "langgraph",
        "langgraph.checkpoint.base",
        "stepstone.adapters.langgraph needs LangGraph (langgraph.checkpoint.base is missing): "
        "pip install 'stepstone[langgraph]'",
    ),
]


@pytest.mark.parametrize(("adapter", "framework", "message"), CASES)
def test_an_adapter_without_its_framework_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, adapter: str, framework: str, message: str
) -> None:
    # None in sys.modules makes importing that module fail, as if it were not installed;
    # monkeypatch puts both entries back, so the installed adapter stays as it was.
    monkeypatch.setitem(sys.modules, framework, None)
    monkeypatch.delitem(sys.modules, f"stepstone.adapters.{adapter}", raising=False)
    with pytest.raises(ImportError) as caught:
        importlib.import_module(f"stepstone.adapters.{adapter}")
    assert str(caught.value) == message
    assert isinstance(caught.value.__cause__, ImportError)
