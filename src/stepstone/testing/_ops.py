"""``Ops``: one way to call a store and the runner, in the sync or the async form.

Every contract test is written once against ``Ops``. In the ``sync`` form each call is
the sync method (``store.load``, ``stepstone.run``); in the ``async`` form it is the
async one (``store.aload``, ``stepstone.arun``) run to completion on the test's own
event loop, one ``asyncio.Runner`` per test, so a native async backend keeps its
connections on a single loop from the first call to ``aclose``. Tests that need
several things in flight at once (tasks racing, cancellation) are async-only and live
in ``_contract_async.py``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Literal, TypeVar

from .._checkpoint import Checkpoint, RunStatus
from .._registry import open_store
from .._runner import RetryPolicy, Step, StepContext
from .._steps import Workflow
from .._store import RunInfo, Store

__all__ = ["MODES", "Mode", "Ops"]

Mode = Literal["sync", "async"]
MODES: tuple[Mode, ...] = ("sync", "async")
T = TypeVar("T")
State = dict[str, Any]


async def _collect(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]


class Ops:
    """The store under test and the runner, called in one form (``mode``).

    Attributes:
        mode: ``"sync"`` or ``"async"``.
        store: The store under test (the same object in both forms).
    """

    def __init__(self, mode: Mode, store: Store) -> None:
        self.mode: Mode = mode
        self.store = store
        self._loop = asyncio.Runner() if mode == "async" else None

    @property
    def is_async(self) -> bool:
        """True in the async form."""
        return self._loop is not None

    def call(self, sync: Callable[[], T], coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Return ``sync()`` in the sync form, else ``coro()`` run on this test's loop."""
        if self._loop is None:
            return sync()
        return self._loop.run(coro())

    def aio(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this test's loop (async form only)."""
        assert self._loop is not None, "Ops.aio is for the async form"
        return self._loop.run(coro)

    # -- the Store methods -------------------------------------------------------------

    def load(self, run_id: str, store: Store | None = None) -> Checkpoint | None:
        """``load`` / ``aload``."""
        s = store or self.store
        return self.call(lambda: s.load(run_id), lambda: s.aload(run_id))

    def save(self, checkpoint: Checkpoint, store: Store | None = None) -> Checkpoint:
        """``save`` / ``asave``."""
        s = store or self.store
        return self.call(lambda: s.save(checkpoint), lambda: s.asave(checkpoint))

    def save_many(
        self, checkpoints: list[Checkpoint], store: Store | None = None
    ) -> list[Checkpoint | Exception]:
        """``save_many`` / ``asave_many``."""
        s = store or self.store
        return self.call(lambda: s.save_many(checkpoints), lambda: s.asave_many(checkpoints))

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """``delete`` / ``adelete``, with the optional compare-and-swap version."""
        s = self.store
        if expected_version is None:
            # Without the keyword, so a backend not yet taking it still runs the rest.
            return self.call(lambda: s.delete(run_id), lambda: s.adelete(run_id))
        return self.call(
            lambda: s.delete(run_id, expected_version=expected_version),
            lambda: s.adelete(run_id, expected_version=expected_version),
        )

    def list_runs(self) -> list[str]:
        """``list_runs`` / ``alist_runs``, collected."""
        s = self.store
        return self.call(lambda: list(s.list_runs()), lambda: _collect(s.alist_runs()))

    def list_info(self) -> list[RunInfo]:
        """``list_info`` / ``alist_info``, collected."""
        s = self.store
        return self.call(lambda: list(s.list_info()), lambda: _collect(s.alist_info()))

    def claimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """``claimable`` / ``aclaimable``; ``status``/``skip`` (a page) only when given."""
        s = self.store
        if status is None and skip == 0:
            # Without the keywords, so a backend not yet taking them still runs the rest.
            return self.call(lambda: s.claimable(now, limit), lambda: s.aclaimable(now, limit))
        return self.call(
            lambda: s.claimable(now, limit, status=status, skip=skip),
            lambda: s.aclaimable(now, limit, status=status, skip=skip),
        )

    @contextmanager
    def open(self, config: str) -> Iterator[Store]:
        """Open another store from ``config``: ``with`` in the sync form, ``async with`` else."""
        store = open_store(config)
        if self._loop is None:
            with store as entered:
                yield entered
            return
        entered = self._loop.run(store.__aenter__())
        try:
            yield entered
        finally:
            self._loop.run(store.__aexit__(None, None, None))

    def close_store(self, store: Store) -> None:
        """``close`` / ``aclose``."""
        self.call(store.close, store.aclose)

    # -- the runner ----------------------------------------------------------------------

    def run(
        self,
        run_id: str,
        steps: Sequence[Any] | Workflow,
        store: Store | None = None,
        *,
        input: State | None = None,
        **options: Any,
    ) -> State:
        """``stepstone.run`` / ``stepstone.arun``; ``options`` (``lease=``) are passed on."""
        s = store or self.store
        kwargs: dict[str, Any] = {"input": input, **options}
        if self._loop is None:
            from .._runner import run  # noqa: PLC0415

            return run(run_id, steps, s, **kwargs)
        from .._runner import arun  # noqa: PLC0415

        return self._loop.run(arun(run_id, steps, s, **kwargs))

    def add(self, name: str, value: Any, log: list[str] | None = None) -> Step:
        """A step setting ``state[name] = value``: an ``async def`` in the async form."""

        def fn(state: State) -> State:
            if log is not None:
                log.append(name)
            return {name: value}

        return self.step(name, fn)

    def step(self, name: str, fn: Callable[..., Any], retry: RetryPolicy | None = None) -> Step:
        """``Step(name, fn)``; in the async form ``fn`` is wrapped in an ``async def``.

        The wrapper keeps ``fn``'s arity, so a step taking the context still gets it.
        Tests that need a plain function under ``arun`` build ``Step`` directly.
        """
        if self._loop is None or inspect.iscoroutinefunction(fn):
            return Step(name, fn, retry=retry)
        if Step(name, fn).takes_context:

            async def with_ctx(state: State, ctx: StepContext) -> Mapping[str, Any] | None:
                await asyncio.sleep(0)  # a real suspension point, as a model call has
                result: Mapping[str, Any] | None = fn(state, ctx)
                return result

            return Step(name, with_ctx, retry=retry)

        async def plain(state: State) -> Mapping[str, Any] | None:
            await asyncio.sleep(0)
            result: Mapping[str, Any] | None = fn(state)
            return result

        return Step(name, plain, retry=retry)

    def close(self) -> None:
        """Close the store on this test's loop (async form), then the loop."""
        if self._loop is not None:
            try:
                self._loop.run(self.store.aclose())
            finally:
                self._loop.close()
                self._loop = None
