"""A LangGraph graph run inside a stepstone step, its stream modes on the run's stream.

``stream_graph(graph, input, config)`` (``astream_graph`` for async steps) runs
``graph.stream`` with the stream modes ``custom`` and ``messages`` (and ``values``, for
its result) and emits each chunk with ``stepstone.emit``: a ``custom`` chunk (what a
node wrote with ``get_stream_writer()``) on ``"custom"``, the text of a ``messages``
chunk (a chat model's token) on ``"tokens"``. It returns the graph's last values.

The commit rule is the stream's: a reader sees the events of the attempt that committed
the step. A retried step calls the function again, so the graph runs again from its
input and emits again: every node's events are in the committing attempt. (A graph
resumed from its checkpointer's thread instead, ``input=None``, emits only from the node
it resumes at: the nodes that finished before the crash emitted in the crashed attempt,
whose events are hidden; ``superseded=True`` shows them.)
"""

from __future__ import annotations

from typing import Any

from ..._stream import emit

__all__ = ["astream_graph", "stream_graph"]

_MODES = ["custom", "messages", "values"]


def _text(message: Any) -> str:
    """The text of a message chunk: its str content, or the text parts of a list one."""
    content = getattr(message, "content", "")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(
        p if isinstance(p, str) else str(p.get("text", ""))
        for p in parts
        if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")
    )


def _emit(mode: str, chunk: Any) -> None:
    if mode == "custom":
        emit("custom", chunk)
    elif mode == "messages":
        text = _text(chunk[0])
        if text:
            emit("tokens", text)


def stream_graph(graph: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
    """Run ``graph`` on ``input`` inside a stepstone step, emitting its stream; return
    its last values. ``kwargs`` go to ``graph.stream`` (not ``stream_mode``).

    Raises:
        EmitOutsideStep: not inside a running step.
        InvalidState: a ``custom`` chunk is not JSON (the message names its path).
    """
    values = None
    for mode, chunk in graph.stream(input, config, stream_mode=_MODES, **kwargs):
        if mode == "values":
            values = chunk
        else:
            _emit(mode, chunk)
    return values


async def astream_graph(graph: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
    """``stream_graph`` for async steps (``graph.astream``)."""
    values = None
    async for mode, chunk in graph.astream(input, config, stream_mode=_MODES, **kwargs):
        if mode == "values":
            values = chunk
        else:
            _emit(mode, chunk)
    return values
