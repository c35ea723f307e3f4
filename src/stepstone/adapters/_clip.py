"""``clip``: the text of an adapter's tool event, cut to a size a stream event can carry.

The adapters emit a tool call's arguments and its output to the run's stream for a UI
to show; the whole value is in the adapter's journal. Cut here, no such event nears the
stream's per-event limit (``MAX_EVENT_BYTES``), so a large tool output never fails the
step that emits it.
"""

from __future__ import annotations

__all__ = ["CLIP", "clip"]

#: Characters of a tool's arguments or output kept in its stream event.
CLIP = 16_000


def clip(text: str) -> str:
    """``text``, or its first ``CLIP`` characters and a note of how many were cut."""
    if len(text) <= CLIP:
        return text
    return f"{text[:CLIP]}... [{len(text) - CLIP} more characters]"
