"""What the runtime tests share: polling, a worker serving in a thread, clock moves, helpers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from .._checkpoint import Checkpoint, utcnow
from .._control import acancel, asignal, astart, cancel, signal, start
from .._lease import claimed
from .._registry import open_store
from .._steps import Workflow
from .._store import RunInfo, Store
from .._worker import Worker
from ._barrier import WAIT_TIMEOUT
from ._base import ContractBase
from ._ops import Ops

__all__ = ["LIVE_LEASE", "LONG", "RuntimeBase", "Serving", "State", "clock_ahead", "until"]

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


def clock_ahead(monkeypatch: pytest.MonkeyPatch, due: datetime) -> None:
    """Move the clocks that end a wait to a second past ``due``: time driven, not waited for.

    Those are the suspending steps' clock and the worker's claim query's.
    """
    offset = due - utcnow() + timedelta(seconds=1)
    for module in ("stepstone._suspend", "stepstone._worker"):
        monkeypatch.setattr(f"{module}.utcnow", lambda: utcnow() + offset)


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
