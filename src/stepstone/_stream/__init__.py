"""Event streams out of a running run (issue 34).

``ctx.emit(topic, data)`` in a step appends to the run's stream (``_writer``), stored
in write-once blocks beside the run (``_events``); ``stream``/``astream`` read it from
any process, hiding the events of attempts that did not commit their step
(``_reader``). The drivers install each step's attempt through ``_hooks``.
"""

from ._events import MAX_EVENT_BYTES, EmitOutsideStep, EventTooLarge, StreamEvent
from ._reader import astream, stream
from ._retention import delete_stream, expire_stream, is_block
from ._writer import emit

__all__ = [
    "MAX_EVENT_BYTES",
    "EmitOutsideStep",
    "StreamEvent",
    "EventTooLarge",
    "astream",
    "delete_stream",
    "emit",
    "expire_stream",
    "is_block",
    "stream",
]
