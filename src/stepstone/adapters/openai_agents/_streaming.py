"""Streamed model responses inside a stepstone agent run, and their events on the run's stream.

``AgentRunStep(..., stream=True)`` (``StepstoneRunner.run(..., stream=True)``) runs the
agent with the SDK's ``Runner.run_streamed`` and maps its stream events onto
``stepstone.emit``: text deltas to ``"tokens"``, tool calls and their outputs to
``"tool"``, handoffs to ``"agent"`` (``emit_event``).

A streamed model call is journaled like ``get_response`` (``journaled_stream``): live, the
model's events pass through and the final response is journaled (the same entry as a
``get_response``, so either path replays the other); on replay the recorded response is
streamed again as one text delta per message part and a completed event. So the attempt
that commits the step emits the whole answer, replayed calls included: the run's stream
never depends on the events of an attempt that crashed (those are hidden once the retry
commits, as for any step).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pydantic
from agents import ModelResponse, Usage
from agents.items import TResponseStreamEvent
from agents.stream_events import AgentUpdatedStreamEvent, RawResponsesStreamEvent, StreamEvent
from agents.stream_events import RunItemStreamEvent as ItemEvent
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from ..._stream import emit
from .._clip import clip
from ._journal import MISSING, Journal, scope_var, unit

__all__ = ["emit_event", "journaled_stream"]

_RESPONSE = pydantic.TypeAdapter(ModelResponse)


def _usage(response: Response) -> Usage:
    used = response.usage
    if used is None:
        return Usage(requests=1)
    return Usage(
        requests=1,
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        total_tokens=used.total_tokens,
    )


def _replayed(response: ModelResponse) -> list[TResponseStreamEvent]:
    """The stream events a replay yields for a recorded response: its text, then done."""
    events: list[TResponseStreamEvent] = []
    seq = 0
    for index, item in enumerate(response.output):
        if not isinstance(item, ResponseOutputMessage):
            continue
        for part_index, part in enumerate(item.content):
            if isinstance(part, ResponseOutputText) and part.text:
                events.append(
                    ResponseTextDeltaEvent(
                        type="response.output_text.delta",
                        item_id=item.id,
                        output_index=index,
                        content_index=part_index,
                        delta=part.text,
                        logprobs=[],
                        sequence_number=seq,
                    )
                )
                seq += 1
    used = response.usage
    completed = Response(
        id=response.response_id or "stepstone-replayed",
        created_at=0,
        model="stepstone-replayed",
        object="response",
        output=list(response.output),
        tool_choice="auto",
        tools=[],
        top_p=None,
        parallel_tool_calls=False,
        status="completed",
        usage=ResponseUsage(
            input_tokens=used.input_tokens,
            output_tokens=used.output_tokens,
            total_tokens=used.total_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        ),
    )
    events.append(
        ResponseCompletedEvent(type="response.completed", response=completed, sequence_number=seq)
    )
    return events


async def journaled_stream(
    journal: Journal,
    model_name: str | None,
    call: Callable[[], AsyncIterator[TResponseStreamEvent]],
) -> AsyncIterator[TResponseStreamEvent]:
    """Stream a model call recorded in ``journal``: live the first time, replayed after."""
    scope = scope_var.get()
    key = journal.next_name(f"{scope}get_response")
    found = journal.get(key)
    if found is not MISSING:
        journal.replayed += 1
        for event in _replayed(_RESPONSE.validate_python(found["response"])):
            yield event
        return
    completed: Response | None = None
    done_items: list[Any] = []
    async with unit(journal, scope):
        async for event in call():
            if isinstance(event, ResponseCompletedEvent):
                completed = event.response  # yielded after it is recorded, below
                continue
            if isinstance(event, ResponseOutputItemDoneEvent):
                done_items.append(event.item)
            yield event
    if completed is None:
        return  # the SDK raises "Model did not produce a final response"
    output = list(completed.output) or done_items  # as the SDK does for such streams
    response = ModelResponse(output=output, usage=_usage(completed), response_id=completed.id)
    payload = {
        "model": model_name,
        "response": _RESPONSE.dump_python(response, mode="json", by_alias=True),
    }
    found = await journal.put(key, payload)
    journal.executed += 1
    recorded = _RESPONSE.validate_python(found["response"])
    # The completed event carries the recorded response (another writer's, if it won).
    yield _replayed(recorded)[-1]


def emit_event(event: StreamEvent) -> None:
    """Append one SDK stream event to the run's stream, if it is one a reader wants."""
    if isinstance(event, RawResponsesStreamEvent):
        if isinstance(event.data, ResponseTextDeltaEvent) and event.data.delta:
            emit("tokens", event.data.delta)
    elif isinstance(event, ItemEvent):
        raw: Any = event.item.raw_item

        def get(name: str) -> Any:
            return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)

        if event.name == "tool_called":
            emit(
                "tool",
                {
                    "event": "called",
                    "name": get("name"),
                    "call_id": get("call_id"),
                    "arguments": clip(str(get("arguments") or "")),
                },
            )
        elif event.name == "tool_output":
            output = getattr(event.item, "output", None)
            emit(
                "tool", {"event": "output", "call_id": get("call_id"), "output": clip(str(output))}
            )
    elif isinstance(event, AgentUpdatedStreamEvent):
        emit("agent", event.new_agent.name)
