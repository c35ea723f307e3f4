"""Models and tools journaled inside a stepstone agent run; the agents they are given to."""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pydantic
from agents import Agent, FunctionTool, ModelResponse, RunConfig
from agents.models.interface import Model, ModelProvider

from ..._errors import InvalidWorkflow
from .._budget_gate import over_budget
from ._journal import MISSING, BudgetPause, Journal, journal_var, scope_var, to_json, unit
from ._streaming import journaled_stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from agents.items import TResponseStreamEvent
    from agents.tool_context import ToolContext

_RESPONSE = pydantic.TypeAdapter(ModelResponse)
# The invoke functions durable_tool made, so wrapping a wrapped tool is a no-op.
_DURABLE: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


class StepstoneModel(Model):
    """A ``Model`` whose ``get_response`` is journaled inside a stepstone agent run.

    Outside one it is the wrapped model. Inside one ``stream_response`` is journaled too
    (``_streaming.journaled_stream``): the same record, replayed as a short stream.
    """

    def __init__(self, model: Model, name: str | None = None) -> None:
        self.model = model
        self.name = name

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The wrapped model's ``get_response``, journaled: replayed once recorded.

        The arguments are handed on as the SDK gave them, whatever its version adds.
        """

        async def call() -> ModelResponse:
            return await self.model.get_response(*args, **kwargs)

        journal = journal_var.get()
        if journal is None:
            return await call()
        scope = scope_var.get()
        key = journal.next_name(f"{scope}get_response")
        found = journal.get(key)
        if found is MISSING:
            if journal.budgeted:  # spend budgets: at the run's limit, pause before this call
                await _gate(journal)
            async with unit(journal, scope):
                response = await call()
            payload = {
                "model": self.name,
                "response": _RESPONSE.dump_python(response, mode="json", by_alias=True),
            }
            found = await journal.put(key, payload)
            journal.executed += 1
        else:
            journal.replayed += 1
        usage = found["response"].get("usage") if isinstance(found["response"], dict) else None
        if isinstance(usage, dict):  # this agent run's usage so far (the budget's check)
            journal.used[0] += int(usage.get("input_tokens") or 0)
            journal.used[1] += int(usage.get("output_tokens") or 0)
        return _RESPONSE.validate_python(found["response"])

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        """The wrapped model's ``stream_response``, journaled as ``get_response`` is."""

        def call() -> AsyncIterator[TResponseStreamEvent]:
            return self.model.stream_response(*args, **kwargs)

        journal = journal_var.get()
        if journal is None:
            return call()
        return journaled_stream(journal, self.name, call)

    async def close(self) -> None:
        await self.model.close()


async def _gate(journal: Journal) -> None:
    """Unwind the agent run (``BudgetPause``) if the run is at its spend limit, counting
    this agent run's usage so far (``_budget_gate``)."""

    cp = await journal.latest_run()
    inputs, outputs = journal.used
    if over_budget(cp, inputs, outputs, journal.prices) is not None:
        raise BudgetPause(journal.run_id)


class StepstoneModelProvider(ModelProvider):
    """Wraps a ``ModelProvider``: every model it returns is a ``StepstoneModel``."""

    def __init__(self, provider: ModelProvider) -> None:
        self.provider = provider

    def get_model(self, model_name: str | None) -> Model:
        model = self.provider.get_model(model_name)
        return model if isinstance(model, StepstoneModel) else StepstoneModel(model, model_name)

    async def aclose(self) -> None:
        await self.provider.aclose()


def durable_tool(tool: FunctionTool) -> FunctionTool:
    """Return a copy of ``tool`` whose calls are journaled inside a stepstone agent run.

    A call's output (JSON) is recorded under ``tool:NAME:CALL_ID`` and returned on every
    replay instead of calling the tool again; model calls made inside it (a sub-agent)
    are counted in the call's own scope. Outside a stepstone run it is ``tool``.
    """
    if not isinstance(tool, FunctionTool):
        raise InvalidWorkflow(f"durable_tool takes a FunctionTool, got {type(tool).__name__}")
    if tool.on_invoke_tool in _DURABLE:
        return tool
    invoke = tool.on_invoke_tool
    name = tool.name

    async def on_invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        journal = journal_var.get()
        if journal is None:
            return await invoke(ctx, arguments)
        call_id = getattr(ctx, "tool_call_id", None) or ""
        if not call_id:
            raise InvalidWorkflow(
                f"tool {name!r} was called without a call id; a durable tool's result is "
                "recorded under its call id (the model must give every tool call one)"
            )
        key = f"tool:{name}:{call_id}"
        found = journal.get(key)
        if found is not MISSING:
            journal.replayed += 1
            return found["output"]
        token = scope_var.set(f"{key}/")
        try:
            output = await invoke(ctx, arguments)
        finally:
            scope_var.reset(token)
        recorded = await journal.put(key, {"output": to_json(output, f"tool {name!r}'s output")})
        journal.executed += 1
        return recorded["output"]

    _DURABLE.add(on_invoke)
    wrapped = copy.copy(tool)
    wrapped.on_invoke_tool = on_invoke
    return wrapped


def durable_agent(
    agent: Agent[Any], durable_tools: bool, done: dict[int, Agent[Any]] | None = None
) -> Agent[Any]:
    """Return a copy of ``agent`` (and of the agents it hands off to) with model instances
    and, if ``durable_tools``, function tools journaled; names are kept, so a stored
    ``RunState`` restores onto the copy."""
    done = {} if done is None else done
    if id(agent) in done:
        return done[id(agent)]
    changes: dict[str, Any] = {}
    if isinstance(agent.model, Model) and not isinstance(agent.model, StepstoneModel):
        changes["model"] = StepstoneModel(agent.model)
    if durable_tools:
        changes["tools"] = [
            durable_tool(t) if isinstance(t, FunctionTool) else t for t in agent.tools
        ]
    copied = agent.clone(**changes)
    done[id(agent)] = copied  # before the handoffs: agents may hand off in a cycle
    # Agents named directly in ``handoffs``; a ``Handoff`` object builds its agent itself.
    copied.handoffs = [
        durable_agent(h, durable_tools, done) if isinstance(h, Agent) else h for h in agent.handoffs
    ]
    return copied


def durable_config(run_config: RunConfig | None) -> RunConfig:
    config = run_config if run_config is not None else RunConfig()
    if not isinstance(config, RunConfig):
        raise InvalidWorkflow(f"run_config must be a RunConfig, got {type(config).__name__}")
    changes: dict[str, Any] = {}
    if not isinstance(config.model_provider, StepstoneModelProvider):
        changes["model_provider"] = StepstoneModelProvider(config.model_provider)
    if isinstance(config.model, Model) and not isinstance(config.model, StepstoneModel):
        changes["model"] = StepstoneModel(config.model)
    return dataclasses.replace(config, **changes) if changes else config
