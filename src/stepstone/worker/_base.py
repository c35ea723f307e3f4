"""What both of a worker's drivers share: its settings, ``stop`` and ``abandon``.

``Worker`` (``_worker``) is this base with the thread driver (``_threads``: ``serve``)
and the task driver (``_tasks``: ``aserve``) mixed in; each driver performs the effects
of the one claim loop (``_claims.Claims``), which the worker composes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from .. import _clock, _lease, _wake
from .._observe import logger
from .._store import Listener, Store
from ._claims import Claims
from ._config import WorkflowTable
from ._wakeups import listen, unlisten

__all__ = ["WorkerBase"]


class WorkerBase:
    """A worker's settings and its control: ``stop``, ``abandon``, ``completed``."""

    store: Store
    workflows: WorkflowTable
    concurrency: int
    lease: float
    poll: float
    grace: float
    #: Executions claimed before the worker stops claiming (``max_runs=``); None: no limit.
    max_runs: int | None
    owner: str
    #: The clock this worker's loop and runs read (``clock=``); None: the installed one.
    clock: _clock.Clock | None
    _claims: Claims
    _stopping: threading.Event
    _wake: threading.Event
    # (loop, asyncio.Event) of a running ``aserve``, so ``stop`` can end its rest.
    _async_wake: tuple[Any, Any] | None

    def __repr__(self) -> str:
        return f"Worker(owner={self.owner!r}, concurrency={self.concurrency}, lease={self.lease:g})"

    def stop(self) -> None:
        """Stop claiming; runs in flight give their lease back at their next step boundary.

        Thread-safe and idempotent; may be called from a signal handler. ``serve`` and
        ``aserve`` return once the runs in flight have handed over, or after ``grace``.
        """
        # No lock: a signal handler runs in the main thread between two bytecodes, maybe
        # inside the loop's own ``with Claims.lock`` (``Claims.busy``, ``Claims._adopt``),
        # and a plain lock would deadlock there (an RLock would let us in halfway through
        # an update). None is needed: the flag is set first, the copy of ``Claims.plans``
        # is one C call
        # (whole under the GIL, and under a free-threaded build's per-dict lock), and
        # ``Claims._adopt`` checks the flag after adding its plan, so every plan gets it.
        self._stopping.set()
        self._wake.set()
        for plan in self._claims.plans.copy().values():
            plan.stop_requested = True
        waker = self._async_wake
        if waker is not None:
            loop, event = waker
            # RuntimeError: the loop is closed, aserve has returned already.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called (or ``max_runs`` executions were claimed and ended)."""
        return self._stopping.is_set()

    @property
    def completed(self) -> int:
        """Return how many executions of runs this worker has ended (any way) so far."""
        return self._claims.completed

    def abandon(self, timeout: float) -> list[str]:
        """Give back the leases of runs still in a step after ``serve`` returned.

        Only for a process about to end at once (``stepstone worker`` calls this, then
        ``os._exit``): the steps' threads die with it, so each run's step is abandoned,
        to run again on another worker, which may take the run at once instead of
        after a lease. Sound while those threads still run: each release is a
        compare-and-swap on the record the run last wrote, and a step, renewal or
        hand-over landing after it finds another holder (``rebase``: ``LeaseLost``) and
        writes nothing; a release that loses such a race is dropped and its lease
        expires instead. Releases are made in a daemon thread given ``timeout``
        seconds, so a store that hangs cannot hold the exit. Returns the run_ids.
        """
        plans = list(self._claims.plans.copy().values())

        def release() -> None:
            given = False
            for plan in plans:
                plan.stop_requested = True
                current = plan.current
                if current is None or current.owner != self.owner:
                    continue
                try:
                    self.store.save(_lease.released(_lease.as_stored(current)))
                    logger.warning("run %r: step abandoned, lease given back", plan.run_id)
                    given = True
                except Exception as exc:  # noqa: BLE001 - it expires by itself; takeover waits one lease
                    logger.warning("run %r: lease left to expire: %s", plan.run_id, exc)
            if given:
                _wake.announce(self.store)  # other workers may take them now

        if plans:
            thread = threading.Thread(
                target=self._clocked(release), name="stepstone-abandon", daemon=True
            )
            thread.start()
            thread.join(timeout)
        return [plan.run_id for plan in plans]

    def _clocked(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Return ``fn`` run under this worker's clock: for a thread it starts."""
        clock = self.clock
        if clock is None:
            return fn

        def clocked() -> None:
            with _clock.using(clock):
                fn()

        return clocked

    def _listen(self, ring: Callable[[], None]) -> Listener | None:
        """Open the store's listener for other processes' rings (``_wakeups.listen``)."""
        listener = listen(self.store, ring, repr(self), self.poll)
        self._claims.pushed = listener is not None
        return listener

    def _unlisten(self, listener: Listener | None) -> None:
        self._claims.pushed = False
        unlisten(listener, repr(self))
