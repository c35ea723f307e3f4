"""stepstone underneath agent frameworks: one package per framework, each behind its extra.

Nothing here is imported by ``import stepstone``; import the package of the framework you
use (``stepstone.adapters.langgraph``, ``stepstone.adapters.agent_framework``,
``stepstone.adapters.pydantic_ai``, ``stepstone.adapters.openai_agents``).

Shared by them: ``_drive`` (store effects and the sync and async drivers every rule runs
on), ``_agent_step`` (the base of the agent steps), ``_agent_call`` (an agent step's call
under either runner), ``_lifetime`` (closing a store the adapter opened), ``_extra`` (the
error when a framework is not installed).
"""
