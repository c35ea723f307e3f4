"""pydantic-ai's agent events on the stepstone run's stream (issue 34).

``emit_events`` is an ``event_stream_handler`` for ``StepstoneDurability``: text parts
and deltas go to ``"tokens"``, tool calls and their results to ``"tool"``, as
``stepstone.emit`` events of the step running the agent.

The commit rule. pydantic-ai calls the handler inside durable units (the model's
events inside the model-request unit, each tool event in a unit of its own). A unit's
events are an attempt of their own, named by its journal entry once it lands (as a
code workflow's calls are): readers show the events of journaled units, hide those of
a unit that crashed or failed, and a replayed unit emits nothing again.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

from pydantic_ai.messages import (
    AgentStreamEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.tools import RunContext

from ..._stream import emit
from .._clip import clip

__all__ = ["emit_events"]


async def emit_events(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    """Emit an agent's stream events to the run's stream (an ``event_stream_handler``).

    Example:
        ``StepstoneDurability(event_stream_handler=emit_events)``
    """
    async for event in events:
        if isinstance(event, PartStartEvent):
            if isinstance(event.part, TextPart) and event.part.content:
                emit("tokens", event.part.content)
        elif isinstance(event, PartDeltaEvent):
            if isinstance(event.delta, TextPartDelta) and event.delta.content_delta:
                emit("tokens", event.delta.content_delta)
        elif isinstance(event, FunctionToolCallEvent):
            call = event.part
            arguments = call.args_as_json_str()
            _tool("called", call.tool_call_id, name=call.tool_name, arguments=arguments)
        elif isinstance(event, FunctionToolResultEvent):
            result = event.part
            _tool("output", result.tool_call_id, output=str(getattr(result, "content", "")))


def _tool(kind: str, call_id: str, **texts: str) -> None:
    """Emit a ``"tool"`` event: its kind, call id, and its texts clipped (``_clip``)."""
    emit("tool", {"event": kind, "call_id": call_id} | {k: clip(v) for k, v in texts.items()})
