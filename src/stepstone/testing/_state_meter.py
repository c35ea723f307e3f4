"""``StateMeter``: the saves planned inside a ``with`` block, and the state bytes they write.

A supported seam for benchmarks and tests that measure what a run stores, instead of
wrapping a private function: every built-in backend plans its saves through
``stepstone._statelog.prepare_save``, which tells the meters installed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Self

from .._statelog import Prepared, observe

__all__ = ["StateMeter"]


class StateMeter:
    """Count the saves planned while the meter is entered, and the state bytes they write.

    ``saves``: how many saves were planned (one per ``Store.save``, a claim's save
    included). ``bytes``: what those saves hand the store for the state: the state's
    JSON text kept in the run's document, plus every piece written (a long state's base
    or log piece, a history record). Saves from every thread of the process count;
    meters may be nested, and each counts what happens while it is entered.
    """

    def __init__(self) -> None:
        self.saves = 0
        self.bytes = 0
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None

    def __enter__(self) -> Self:
        if self._stop is not None:
            raise RuntimeError("this StateMeter is already entered; make another")
        self._stop = observe(self._count)
        return self

    def __exit__(self, *exc_info: object) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    def _count(self, prepared: Prepared) -> None:
        size = sum(len(piece.data) for piece in prepared.pieces)
        if prepared.state_text is not None:
            size += len(prepared.state_text.encode("utf-8"))
        with self._lock:
            self.saves += 1
            self.bytes += size
