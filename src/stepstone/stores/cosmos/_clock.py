"""Cosmos DB's clock: the time rates and schedules are judged on (``Store.server_now``).

Cosmos DB has no "select the time" that every server and emulator answers, but every
write stamps its item with ``_ts``: the server's time in whole seconds. So a reading
is one upsert of a tiny item (``CLOCK_ID``, about 5 RU; no ETag, so writers never
conflict) whose answer carries its ``_ts``. The resolution is a second
(``server_clock_resolution``); ``_store_time`` reads it again near its ticks until the
bounds are fine and then once a minute, so the cost is a handful of writes when a
process starts and one a minute after.

The item has ``piece_of`` (pointing at itself), so listings and claims, which skip
piece items, never see it; it has no piece ``key``, so orphan collection leaves it.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar, Final, TypeVar

from ._effects import OPEN, Send, Steps
from ._errors import Call
from ._wire import PIECE_MARK

if TYPE_CHECKING:
    from ._config import Settings

T = TypeVar("T")

__all__ = ["CLOCK_ID", "CosmosClock"]

#: The clock item's id: no run's (``item_id`` never starts with ``PIECE_MARK``) and no
#: piece's (``piece_id`` has a second ``PIECE_MARK``).
CLOCK_ID: Final = f"{PIECE_MARK}clock"


class CosmosClock:
    """``server_now`` for ``CosmosStore``: the ``_ts`` of one upsert."""

    server_clock_resolution: ClassVar[float] = 1.0

    def _clock(self) -> Steps[datetime]:
        container = yield OPEN
        with self._translate(Call("read the clock")):
            item = yield Send(
                container,
                "upsert_item",
                ({"id": CLOCK_ID, "piece_of": CLOCK_ID},),
                {"timeout": self.settings.timeout},
            )
        return datetime.fromtimestamp(int(item["_ts"]), UTC)

    def server_now(self) -> datetime:
        """Return the server's clock, to the second: the ``_ts`` of one upsert."""
        return self._run(self._clock())

    async def aserver_now(self) -> datetime:
        """Async ``server_now``."""
        return await self._arun(self._clock())

    if TYPE_CHECKING:
        settings: Settings

        def _translate(self, call: Call) -> contextlib.AbstractContextManager[None]: ...
        def _run(self, steps: Steps[T]) -> T: ...
        async def _arun(self, steps: Steps[T]) -> T: ...
