"""Event streams out of a running run (issue 34).

``ctx.emit(topic, data)`` in a step appends to the run's stream (``_writer``), stored
in write-once blocks beside the run (``_events``); ``stream``/``astream`` read it from
any process, hiding the events of attempts that did not commit their step
(``_reader``); ``_retention`` removes a stream with its run. The drivers install each
step's attempt through ``_hooks``.

The names below are imported on first use, as ``stepstone``'s are: the drivers import
``_hooks`` on every run, and need none of the reader.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from ._events import MAX_EVENT_BYTES, EmitOutsideStep, EventTooLarge, StreamEvent
    from ._reader import astream, stream
    from ._retention import delete_stream, expire_stream, is_block
    from ._writer import emit

_LAZY = {
    "MAX_EVENT_BYTES": "._events",
    "EmitOutsideStep": "._events",
    "EventTooLarge": "._events",
    "StreamEvent": "._events",
    "astream": "._reader",
    "delete_stream": "._retention",
    "emit": "._writer",
    "expire_stream": "._retention",
    "is_block": "._retention",
    "stream": "._reader",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "MAX_EVENT_BYTES",
    "EmitOutsideStep",
    "EventTooLarge",
    "StreamEvent",
    "astream",
    "delete_stream",
    "emit",
    "expire_stream",
    "is_block",
    "stream",
]
