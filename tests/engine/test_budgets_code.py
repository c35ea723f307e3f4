"""Spend budgets in code workflows: ``ctx.charge`` journaled with the ledger, the pause."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from stepstone import (
    AsyncWorkflowContext,
    Budget,
    CallFailed,
    InvalidCharge,
    Store,
    Suspended,
    WorkflowContext,
    arun,
    open_store,
    run,
    signal,
    spend_of,
)
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY
from stepstone._journal import JOURNAL_KEY


@pytest.fixture(params=["memory", "sqlite", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each in-process backend."""
    configs = {
        "memory": f"memory://budgets-code-{tmp_path.name}",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
        "file": f"file://{tmp_path}/runs",
    }
    with open_store(configs[str(request.param)]) as opened:
        yield opened


CALLS: list[int] = []


def model(i: int) -> dict[str, Any]:
    CALLS.append(i)
    return {"id": f"resp-{i}", "usd": 2.0, "tokens": 10}


@stepstone.workflow("budgeted-agent")
def agent(ctx: WorkflowContext, input: dict[str, Any]) -> list[str]:
    ids = []
    for i in range(3):
        reply = ctx.step("draft", model, i)
        ctx.charge(usd=reply["usd"], tokens=reply["tokens"], ref=reply["id"])
        ids.append(reply["id"])
    return ids


@stepstone.workflow("budgeted-async-agent")
async def aagent(ctx: AsyncWorkflowContext, input: dict[str, Any]) -> list[str]:
    ids = []
    for i in range(3):
        reply = await ctx.step("draft", model, i)
        await ctx.charge(usd=reply["usd"], tokens=reply["tokens"], ref=reply["id"])
        ids.append(reply["id"])
    return ids


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_code_workflow_pauses_before_a_step_and_resumes_with_an_exact_ledger(
    store: Store, mode: str
) -> None:
    """Past $3 the next ctx.step waits; after a raise, replayed charges count once."""
    CALLS.clear()

    def go() -> dict[str, Any]:
        if mode == "sync":
            return run("r", agent, store, budget=Budget(usd=3))
        return asyncio.run(arun("r", aagent, store, budget=Budget(usd=3)))

    with pytest.raises(Suspended):
        go()
    cp = store.load("r")
    assert cp is not None and cp.status == "waiting" and cp.waiting_for == BUDGET_WAIT
    assert CALLS == [0, 1] and spend_of(cp).usd == 4.0
    with pytest.raises(Suspended):
        go()  # no raise yet: still paused, nothing called
    assert CALLS == [0, 1]
    signal(store, "r", RAISE_SIGNAL, {"usd": 10})
    final = go()
    assert final["result"] == ["resp-0", "resp-1", "resp-2"] and CALLS == [0, 1, 2]
    spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert (spend.usd, spend.tokens, spend.limit_usd) == (6.0, 30, 13.0)
    assert spend.by_step == {"draft": {"usd": 6.0, "tokens": 30}}
    charges = [e for e in final[JOURNAL_KEY] if e["call"].startswith("@charge")]
    assert [e["result"] for e in charges] == [True, True, True]


def test_a_repeated_ref_in_a_code_workflow_is_journaled_as_not_counted(store: Store) -> None:
    """The second charge of one ref answers False and adds nothing."""

    @stepstone.workflow("twice")
    def twice(ctx: WorkflowContext, input: dict[str, Any]) -> list[bool]:
        return [ctx.charge(usd=1, ref="same"), ctx.charge(usd=1, ref="same")]

    final = run("r", twice, store)
    assert final["result"] == [True, False]
    assert final[SPEND_KEY]["usd"] == 1.0


def test_a_bad_charge_in_a_code_workflow_takes_no_place_in_the_journal(store: Store) -> None:
    """InvalidCharge is raised before the call is numbered: nothing journaled or charged."""

    @stepstone.workflow("bad")
    def bad(ctx: WorkflowContext, input: dict[str, Any]) -> str:
        with pytest.raises(InvalidCharge, match="unknown field 'eur'"):
            ctx.charge(eur=1)
        with pytest.raises(InvalidCharge, match="finite number >= 0"):
            ctx.charge(usd=-1)
        return "ok"

    final = run("r", bad, store)
    assert final["result"] == "ok" and final.get(JOURNAL_KEY, []) == []
    assert SPEND_KEY not in final


def test_a_run_without_budget_asks_nothing_before_its_steps(store: Store) -> None:
    """Without a budget or a ledger a ctx.step makes no extra save (no budget check)."""

    @stepstone.workflow("free")
    def free(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
        return ctx.step("one", lambda: 1)

    final = run("r", free, store)
    assert final["result"] == 1 and SPEND_KEY not in final


def test_call_failed_is_unchanged_by_budgets(store: Store) -> None:
    """A failing call under a budget fails as before (the check does not swallow it)."""

    def boom() -> None:
        raise ValueError("no")

    @stepstone.workflow("fails")
    def fails(ctx: WorkflowContext, input: dict[str, Any]) -> str:
        try:
            ctx.step("boom", boom)
        except CallFailed as exc:
            return exc.error_type
        return "?"

    assert run("r", fails, store, budget=Budget(usd=1))["result"] == "ValueError"


def test_a_code_workflow_warns_once_past_the_soft_limit(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """ctx.charge past soft logs one warning, however many charges follow."""

    @stepstone.workflow("soft")
    def soft(ctx: WorkflowContext, input: dict[str, Any]) -> None:
        for i in range(4):
            ctx.charge(usd=0.3, ref=f"r{i}")

    with caplog.at_level(logging.WARNING, logger="stepstone"):
        run("r", soft, store, budget=Budget(usd=2, soft=0.5))
    assert sum("passed 50% of its budget" in r.getMessage() for r in caplog.records) == 1
