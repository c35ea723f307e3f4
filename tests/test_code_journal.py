"""Workflows as code (issue 31): the journal's own values, upgrades, fork and rerun per call.

Pinned on the memory, file and SQLite stores, for a plain ``def`` workflow under ``run``
and under ``arun`` and an ``async def`` one under ``arun`` (``test_code_workflows``'s
``make``/``drive``).
"""

from __future__ import annotations

from typing import Any

import pytest

import stepstone
from stepstone import CodeWorkflow, Store, Suspended, signal
from stepstone._journal import JOURNAL_KEY
from test_code_workflows import MODES, Body, _Done, _SyncAsAsync, calls_of, drive, store

__all__ = ["MODES", "store"]

State = dict[str, Any]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """How the workflow is written and driven."""
    return str(request.param)


class _Ctx(_SyncAsAsync):
    """``_SyncAsAsync`` with the calls this module adds."""

    def random(self) -> _Done:
        return _Done(self.ctx.random())


def make(name: str, body: Body, mode: str, version: str = "1", **kwargs: Any) -> CodeWorkflow:
    """``test_code_workflows.make``, with ``_Ctx`` and ``workflow``'s keywords."""
    if mode == "async-arun":
        return stepstone.workflow(name, version=version, **kwargs)(body)

    def plain(ctx: Any, input: State) -> Any:
        coroutine = body(_Ctx(ctx), input)
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value
        coroutine.close()
        raise AssertionError("a body driven by a plain def awaited something real")

    return stepstone.workflow(name, version=version, **kwargs)(plain)


def test_random_is_journaled_and_replayed(store: Store, mode: str) -> None:
    """``ctx.random()`` draws in [0, 1) once: the function re-run gets the same numbers."""

    async def body(ctx: Any, input: State) -> Any:
        draws = [await ctx.random(), await ctx.random()]
        await ctx.wait_for("go")
        return draws

    flow = make("dice", body, mode)
    with pytest.raises(Suspended):
        drive(mode, "d", flow, store)
    first = store.load("d")
    assert first is not None
    recorded = [entry["result"] for entry in first.state[JOURNAL_KEY]]
    assert calls_of(first.state) == ["@random#1", "@random#2"]
    assert all(isinstance(x, float) and 0 <= x < 1 for x in recorded)
    assert recorded[0] != recorded[1]
    signal(store, "d", "go")
    assert drive(mode, "d", flow, store)["result"] == recorded
