"""The thread driver: ``serve`` performs the claim loop's effects with plain calls.

The loop (``_claims.Claims.serving``) runs in one thread and each claimed run is driven
in a thread of a pool (``_drive``); at concurrency 1, in the loop's own thread, with no
hand-off per run. A rest is a wait on a ``threading.Event`` on the clock seam, which a
ring or a run ending sets.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import _clock
from .._effects import Effect, step_through
from .._observe import logger
from .._plan import Plan
from .._store import Listener
from ._base import WorkerBase
from ._config import check_async_steps
from ._io import Drain, Listen, Rest, Spawn, Subscribe, Unlisten, perform

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["ThreadDriver"]


class ThreadDriver(WorkerBase):
    """``serve``: the claim loop and its runs in threads."""

    def serve(self) -> None:
        """Serve until ``stop`` is called, driving runs in up to ``concurrency`` threads."""
        check_async_steps(self.workflows)
        with _clock.using(self.clock):  # the worker's own clock, if given one
            self._serve()

    def _serve(self) -> None:
        logger.info("%r: serving %d workflows", self, len(self.workflows))
        ring = self._wake.set
        subscribed: list[Callable[[], None]] = []  # Subscribe's unsubscribe, until Drain
        opened: list[Listener | None] = []  # what Listen opened and Unlisten has not closed

        def perform(effect: Effect, drain: Callable[[], None]) -> Any:
            """Do a claim-loop effect other than ``Spawn`` (each caller spawns its own way)."""
            if isinstance(effect, Rest):
                # Cleared as the rest ends, just before the next look (``_claims``).
                woken = _clock.wait(self._wake, effect.seconds)
                self._wake.clear()
                return woken
            if isinstance(effect, Subscribe):
                subscribed.append(self.store.doorbell.subscribe(ring))
            elif isinstance(effect, Listen):
                opened.append(self._listen(ring))
            elif isinstance(effect, Unlisten):
                if opened:
                    self._unlisten(opened.pop())
            elif isinstance(effect, Drain):
                while subscribed:
                    subscribed.pop()()
                drain()
            else:
                return self._io(effect)
            return None

        try:
            if self.concurrency == 1:
                self._serve_alone(perform)
            else:
                self._serve_pooled(perform)
        except BaseException:
            # KeyboardInterrupt (Ctrl-C with no handler) or a failure of the loop: no
            # more claims, and each run in flight hands over at its next step boundary
            # instead of holding the process's exit until it finishes.
            self.stop()
            raise
        finally:
            # The loop was cut short (or its thread still drives a run past the grace):
            # end what it left open.
            while subscribed:
                subscribed.pop()()
            for listener in opened:
                self._unlisten(listener)
        logger.info("%r: stopped", self)

    def _serve_pooled(self, loop_effect: Callable[[Effect, Callable[[], None]], Any]) -> None:
        """Claim in this thread; drive each claimed run in a thread of a pool."""
        # Imported here: a process that only starts runs or calls the CLI never pays for it.
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="stepstone-worker")
        futures: set[Future[None]] = set()

        def perform(effect: Effect) -> Any:
            nonlocal futures
            if isinstance(effect, Spawn):
                futures = {f for f in futures if not f.done()}
                futures.add(pool.submit(self._clocked(partial(self._drive, effect.plan))))
                return None
            return loop_effect(effect, lambda: self._drain(futures))

        try:
            step_through(self._claims.serving(asynchronous=False), perform)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _serve_alone(self, loop_effect: Callable[[Effect, Callable[[], None]], Any]) -> None:
        """Concurrency 1: claim and drive in one thread of ours, each run where it was claimed.

        With one slot the loop has nothing to do while a run is driven (it could claim
        nothing), so handing each run to another thread would only add hand-offs a
        plain loop of ``run`` calls has none of. The loop runs in its own thread, not
        the caller's, so that ``stop`` keeps its meaning: the caller waits for the
        stop, then at most ``grace`` for the run in flight to hand over, and returns
        (the thread goes on, as a pool's thread would, and hands over at its next step
        boundary). Leases are renewed as under the pool (``_renewer``, its own thread).
        """
        failure: list[BaseException] = []

        def perform(effect: Effect) -> Any:
            if isinstance(effect, Spawn):
                self._drive(effect.plan)
                return None
            # Drain: nothing is in flight here, each run was driven where it was claimed.
            return loop_effect(effect, lambda: None)

        def loop() -> None:
            try:
                step_through(self._claims.serving(asynchronous=False), perform)
            except BaseException as exc:  # noqa: BLE001 - raised again by serve, below
                failure.append(exc)
                self._stopping.set()  # wakes the caller, which raises it

        # A daemon only if the caller is one: a worker served from the main thread holds
        # the exit with a run still in a step, as a pool's thread does; one served from
        # a daemon thread and never stopped must not hold it for ever (its loop would
        # not, under the pool: it ran in that daemon thread).
        daemon = threading.current_thread().daemon
        thread = threading.Thread(
            target=self._clocked(loop), name="stepstone-worker_0", daemon=daemon
        )
        thread.start()
        try:
            self._stopping.wait()  # interruptible: a signal handler may call stop
        except BaseException:
            self.stop()  # KeyboardInterrupt here: no more claims, the run hands over
            raise
        thread.join(self.grace)
        if failure:
            raise failure[0]
        if thread.is_alive():
            self._drain(set())  # logs the run still in a step

    def _io(self, effect: Effect) -> Any:
        """Perform one of the claim's or an execution's effects with a plain call."""
        return perform(self.store, effect)

    def _drive(self, plan: Plan) -> None:
        error: BaseException | None = None
        try:
            error = step_through(self._claims.execution(plan), self._io)
        except BaseException as exc:  # noqa: BLE001 - logged by Claims.ended; the worker lives on
            error = self._claims.ended(plan, exc)
        finally:
            # Always: a run this worker no longer drives is claimable again, its slot free.
            self._claims.finished(plan, error)

    def _drain(self, futures: set[Future[None]]) -> None:
        deadline = _clock.monotonic() + self.grace
        for future in futures:
            left = deadline - _clock.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(Exception):
                future.result(timeout=left)
        stuck = self._claims.busy()
        if stuck:
            logger.warning(
                "%r: %d runs still in a step after the %gs grace; serve returns and their "
                "threads go on (each hands over at its next step boundary)",
                self,
                len(stuck),
                self.grace,
            )
