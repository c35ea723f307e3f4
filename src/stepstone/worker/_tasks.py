"""The task driver: ``aserve`` performs the claim loop's effects with awaits.

The same loop as ``serve`` (``_claims.Claims.serving``), in the caller's task; each
claimed run is driven as a task (``_adrive``). A rest awaits an ``asyncio.Event`` on the
clock seam, which a ring (from any thread, through the loop) or a run ending sets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from .. import _clock
from .._effects import Effect, astep_through
from .._observe import logger
from .._plan import Plan
from .._store import Listener
from ._base import WorkerBase
from ._io import Drain, Listen, Rest, Spawn, Subscribe, Unlisten, aperform

__all__ = ["TaskDriver"]


class TaskDriver(WorkerBase):
    """``aserve``: the claim loop in a task, its runs as tasks."""

    async def aserve(self) -> None:
        """Serve until ``stop`` is called, driving runs as up to ``concurrency`` tasks.

        Cancelling the task that awaits ``aserve`` stops at once: each run's step in
        flight is cancelled and its lease given back.
        """
        with _clock.using(self.clock):  # the worker's own clock, if given one: its tasks too
            await self._aserve()

    async def _aserve(self) -> None:
        import asyncio  # noqa: PLC0415 - sync users and the CLI never pay for importing it

        logger.info("%r: serving %d workflows (async)", self, len(self.workflows))
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        subscribed: list[Callable[[], None]] = []  # Subscribe's unsubscribe, until Drain
        opened: list[Listener | None] = []  # what Listen opened and Unlisten has not closed

        async def perform(effect: Effect) -> Any:
            if isinstance(effect, Spawn):
                task = asyncio.create_task(self._adrive(effect.plan, wake))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                return None
            if isinstance(effect, Rest):
                # Cleared as the rest ends, just before the next look (as in ``serve``).
                # On the seam's clock (asyncio.timeout, not wait_for, in the real one).
                woken = await _clock.await_event(wake, effect.seconds)
                wake.clear()
                return woken
            if isinstance(effect, Subscribe):
                subscribed.append(self.store.doorbell.subscribe(ring))
            elif isinstance(effect, Listen):
                opened.append(await self._alisten(ring))
            elif isinstance(effect, Unlisten):
                if opened:
                    await asyncio.to_thread(self._unlisten, opened.pop())
            elif isinstance(effect, Drain):
                while subscribed:
                    subscribed.pop()()
                await self._adrain(tasks)
            else:
                return await self._aio(effect)
            return None

        def ring() -> None:
            # RuntimeError: the loop is closed, aserve has returned already.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

        with self._claims.lock:
            self._async_wake = (loop, wake)
        try:
            await astep_through(self._claims.serving(asynchronous=True), perform)
        finally:
            while subscribed:  # the loop was cut short: end what it left open
                subscribed.pop()()
            for task in tasks:
                task.cancel()
            try:
                if tasks:
                    # Let each cancelled run give its lease back before the loop goes away.
                    await asyncio.wait(tasks, timeout=10)
            finally:
                with self._claims.lock:
                    self._async_wake = None
                for listener in opened:  # the loop was cut short: close what it left open
                    await asyncio.to_thread(self._unlisten, listener)
        logger.info("%r: stopped", self)

    async def _alisten(self, ring: Callable[[], None]) -> Listener | None:
        """Open the store's listener in a thread: listening may connect to a server."""
        import asyncio  # noqa: PLC0415 - imported already by aserve, which calls this

        opening = asyncio.ensure_future(asyncio.to_thread(self._listen, ring))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(self._unlisten_opened)
            raise

    async def _adrain(self, tasks: set[Any]) -> None:
        """Wait up to the grace for the runs in flight, then cancel what is left."""
        import asyncio  # noqa: PLC0415 - imported already by aserve, which calls this

        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=self.grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)

    def _unlisten_opened(self, opening: Any) -> None:
        """Close what ``listen`` opened in ``opening`` (aserve was cancelled meanwhile)."""
        if not opening.cancelled() and opening.exception() is None:
            self._unlisten(opening.result())

    async def _aio(self, effect: Effect) -> Any:
        """Perform one of the claim's or an execution's effects, awaited."""
        return await aperform(self.store, effect)

    async def _adrive(self, plan: Plan, wake: Any) -> None:
        import asyncio  # noqa: PLC0415 - imported already by aserve, which calls this

        error: BaseException | None = None
        try:
            error = await astep_through(self._claims.execution(plan), self._aio)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # aserve is stopping this run
            logger.exception("run %r: a step raised CancelledError", plan.run_id)
        except BaseException as exc:  # noqa: BLE001 - logged by Claims.ended; the worker lives on
            error = self._claims.ended(plan, exc)
        finally:
            wake.set()
            self._claims.finished(plan, error)
