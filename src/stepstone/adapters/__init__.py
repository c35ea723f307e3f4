"""stepstone underneath agent frameworks: one module per framework, each behind its extra.

Nothing here is imported by ``import stepstone``; import the module of the framework you
use (``stepstone.adapters.langgraph``, ``stepstone.adapters.agent_framework``,
``stepstone.adapters.pydantic_ai``, ``stepstone.adapters.openai_agents``).
"""
