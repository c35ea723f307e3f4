"""Workflows as code driven three ways, for the tests of ``@stepstone.workflow``.

One body serves all three ``MODES``: written ``async``, it is driven step by step by a
plain ``def`` whose context answers each ``await`` at once (``SyncAsAsync``), under
``run`` or ``arun``, or run as the ``async def`` it is under ``arun`` (``make``,
``drive``). ``store`` and ``mode`` are fixtures a test module imports to use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from fresh_stores import LOCAL_BACKENDS, fresh_config
from stepstone import CodeWorkflow, Store, arun, open_store, run
from stepstone._journal import JOURNAL_KEY

__all__ = [
    "MODES",
    "Body",
    "Done",
    "State",
    "SyncAsAsync",
    "calls_of",
    "drive",
    "make",
    "mode",
    "store",
]

State = dict[str, Any]
Body = Callable[[Any, State], Coroutine[Any, Any, Any]]
#: How a workflow is written and driven: a def under run, a def under arun, an async def.
MODES = ("def-run", "def-arun", "async-arun")


@pytest.fixture(params=LOCAL_BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each in-process backend."""
    with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """How the workflow is written and driven."""
    return str(request.param)


class Done:
    """An awaitable that is already done: a plain context's answer, for an async body."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, Any]:
        return self.value
        yield  # pragma: no cover - makes this a generator


class SyncAsAsync:
    """A ``WorkflowContext`` whose calls an ``async`` body can await."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.run_id = ctx.run_id

    def step(self, *args: Any, **kwargs: Any) -> Done:
        return Done(self.ctx.step(*args, **kwargs))

    def now(self) -> Done:
        return Done(self.ctx.now())

    def uuid(self) -> Done:
        return Done(self.ctx.uuid())

    def sleep(self, duration: Any) -> Done:
        return Done(self.ctx.sleep(duration))

    def wait_for(self, name: str, **kwargs: Any) -> Done:
        return Done(self.ctx.wait_for(name, **kwargs))

    def map(self, *args: Any) -> Done:
        return Done(self.ctx.map(*args))


def make(name: str, body: Body, mode: str, version: str = "1") -> CodeWorkflow:
    """Return ``body`` as a workflow of ``mode``: an async def, or a def driving it."""
    if mode == "async-arun":
        return stepstone.workflow(name, version=version)(body)

    def plain(ctx: Any, input: State) -> Any:
        coroutine = body(SyncAsAsync(ctx), input)
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value
        coroutine.close()
        raise AssertionError("a body driven by a plain def awaited something real")

    return stepstone.workflow(name, version=version)(plain)


def drive(mode: str, run_id: str, flow: CodeWorkflow, store: Store, **kwargs: Any) -> State:
    """Run ``flow`` under ``run`` or ``arun``, as ``mode`` says."""
    if mode == "def-run":
        return run(run_id, flow, store, **kwargs)
    return asyncio.run(arun(run_id, flow, store, **kwargs))


def calls_of(state: State) -> list[str]:
    """The journal's call names, in the order they were saved."""
    return [entry["call"] for entry in state[JOURNAL_KEY]]
