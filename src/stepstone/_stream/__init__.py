"""Event streams out of a running run (issue 34).

``ctx.emit(topic, data)`` in a step appends to the run's stream (``_writer``), stored
in write-once blocks beside the run (``_events``); ``stream``/``astream`` read it from
any process, hiding the events of attempts that did not commit their step
(``_reader``). The drivers install each step's attempt through ``_hooks``.
"""

from ._events import MAX_EVENT_BYTES, EmitOutsideStep, Event, EventTooLarge
from ._reader import astream, stream
from ._writer import emit

__all__ = [
    "MAX_EVENT_BYTES",
    "EmitOutsideStep",
    "Event",
    "EventTooLarge",
    "astream",
    "emit",
    "stream",
]
