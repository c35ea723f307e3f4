"""What the runtime tests share: polling, a worker serving in a thread, clock moves, helpers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from .. import _clock, _store_time
from .._checkpoint import Checkpoint
from .._control import acancel, asignal, astart, cancel, signal, start
from .._lease import claimed
from .._registry import open_store
from .._steps import Workflow
from .._store import RunInfo, Store
from ..worker import Worker
from ._barrier import WAIT_TIMEOUT
from ._base import ContractBase
from ._ops import Ops

__all__ = [
    "LIVE_LEASE",
    "LONG",
    "ClockAhead",
    "RuntimeBase",
    "Serving",
    "State",
    "clock_ahead",
    "time_ahead",
    "until",
]

State = dict[str, Any]


def until(what: str, check: Callable[[], bool], timeout: float = WAIT_TIMEOUT) -> None:
    """Poll ``check`` until true; fail naming ``what`` if ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.01)


#: Seconds of a timer or a signal's timeout in the tests: longer than any save on a loaded
#: machine, so a run always suspends first; the tests then move the clock past it.
LONG = 3600.0


#: The lease of an owner that must be seen alive: its renewals come every third of it, so
#: only a stall of two thirds of it (not a loaded machine's hiccup) could look like death.
LIVE_LEASE = 2.0


class ClockAhead(_clock.SystemClock):
    """The real clock with its wall time moved ``offset`` ahead (a host whose clock is fast).

    Monotonic time, sleeps and waits stay real: a worker serving under it rests and
    judges leases as usual, while every timer, stamp and claim query reads the later time.
    """

    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self) -> datetime:
        """Return the real time plus ``offset``."""
        return super().now() + self.offset

    def __repr__(self) -> str:
        return f"ClockAhead({self.offset!r})"


def clock_ahead(monkeypatch: pytest.MonkeyPatch, due: datetime) -> None:
    """Move stepstone's wall clock and every store's clock to a second past ``due``: time
    driven, not waited for.

    Through the clock seams (``stepstone._clock``, and ``_store_time``'s stand-in, since
    a store's clock ignores a host clock that is merely ahead: timers are judged on it),
    so every reader of the time sees it, until the test ends (``monkeypatch`` puts both
    back).
    """
    # From the real clock: called twice, the second move is not added to the first.
    offset = due - _clock.SYSTEM.now() + timedelta(seconds=1)
    # The seam's one variable, not each module's ``utcnow``: nothing to keep in sync.
    ahead = ClockAhead(offset)
    monkeypatch.setattr(_clock, "_current", ahead)
    monkeypatch.setattr(_store_time, "_stand_in", [ahead.now])


@contextlib.contextmanager
def time_ahead(offset: timedelta) -> Iterator[None]:
    """Move this process's wall clock and every store's clock ``offset`` ahead, for the
    ``with`` block (``clock_ahead``'s move, as a context manager)."""
    ahead = ClockAhead(offset)
    with _clock.use_clock(ahead):
        _store_time.use_store_clock(ahead.now)
        try:
            yield
        finally:
            _store_time.use_store_clock(None)


class Serving:
    """A Worker on its own store, serving in a thread for the length of a ``with`` block.

    In the async form the thread runs ``aserve`` on an event loop of its own, with a
    store opened there, so a native async driver's connections stay on one loop.
    """

    def __init__(self, config: str, workflows: list[Workflow], mode: str, **options: Any) -> None:
        self.config = config
        self.workflows = workflows
        self.mode = mode
        self.options = options
        self.worker: Worker | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name=f"{mode} worker")

    def _serve(self) -> None:
        try:
            if self.mode == "async":

                async def main() -> None:
                    async with open_store(self.config) as store:
                        self.worker = Worker(store, self.workflows, **self.options)
                        self.ready.set()
                        await self.worker.aserve()

                asyncio.run(main())
            else:
                with open_store(self.config) as store:
                    self.worker = Worker(store, self.workflows, **self.options)
                    self.ready.set()
                    self.worker.serve()
        except BaseException as exc:  # noqa: BLE001 - re-raised on leaving the with block
            self.error = exc
            self.ready.set()

    def __enter__(self) -> Worker:
        self.thread.start()
        if not self.ready.wait(WAIT_TIMEOUT):
            raise AssertionError(f"the {self.mode} worker did not start in {WAIT_TIMEOUT}s")
        if self.worker is None:
            raise AssertionError(f"the {self.mode} worker failed to start: {self.error!r}")
        return self.worker

    def stop(self) -> None:
        """Stop the worker and wait for its thread; fail naming it if it hangs."""
        if self.worker is not None:
            self.worker.stop()
        self.thread.join(WAIT_TIMEOUT)
        if self.thread.is_alive():
            raise AssertionError(f"the {self.mode} worker did not stop in {WAIT_TIMEOUT}s")

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self.error is not None:
            raise self.error


class RuntimeBase(ContractBase):
    """The control functions in this test's form, and a dead owner's claim."""

    @staticmethod
    def start(ops: Ops, workflow: Workflow, run_id: str, input: State | None = None) -> RunInfo:
        """``start`` / ``astart``."""
        s = ops.store
        return ops.call(
            lambda: start(s, workflow, run_id, input), lambda: astart(s, workflow, run_id, input)
        )

    @staticmethod
    def cancel(ops: Ops, run_id: str) -> RunInfo:
        """``cancel`` / ``acancel``."""
        s = ops.store
        return ops.call(lambda: cancel(s, run_id), lambda: acancel(s, run_id))

    @staticmethod
    def signal(
        ops: Ops, run_id: str, name: str, payload: Any, signal_id: str | None = None
    ) -> bool:
        """``signal`` / ``asignal``."""
        s = ops.store
        return ops.call(
            lambda: signal(s, run_id, name, payload, signal_id=signal_id),
            lambda: asignal(s, run_id, name, payload, signal_id=signal_id),
        )

    @staticmethod
    def _ghost(store: Store, run_id: str, lease: float, steps: int = 2) -> Checkpoint:
        """Store a run claimed by an owner that will never renew (it 'died')."""
        fresh = Checkpoint(run_id=run_id, total_steps=steps)
        return store.save(claimed(fresh, "ghost:host:1:dead", lease))
