"""``ctx.reserve`` in code workflows (journaled, settled by the charge, paused at the
limit), and reservations checked against a budgeted tree's pool (code and step lists)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from stepstone import (
    AsyncWorkflowContext,
    Budget,
    InvalidCharge,
    Map,
    Step,
    StepContext,
    Store,
    Suspended,
    Workflow,
    WorkflowContext,
    arun,
    open_store,
    run,
    signal,
    spend_of,
)
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, RESERVE_SIGNAL, SPEND_KEY
from stepstone._checkpoint import Signal, evolve, utcnow
from stepstone._journal import JOURNAL_KEY
from stepstone._spending import settle_reservations


@pytest.fixture(params=["memory", "sqlite", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each in-process backend."""
    configs = {
        "memory": f"memory://budgets-reserve-{tmp_path.name}",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
        "file": f"file://{tmp_path}/runs",
    }
    with open_store(configs[str(request.param)]) as opened:
        yield opened


CALLS: list[str] = []


def model(name: str) -> dict[str, Any]:
    CALLS.append(name)
    return {"id": f"resp-{name}", "usd": 0.75, "tokens": 10}


@stepstone.workflow("reserving-agent")
def agent(ctx: WorkflowContext, input: dict[str, Any]) -> list[str]:
    ids = []
    for name in "abc":
        ctx.reserve(usd=1.0, tokens=10)
        reply = ctx.step(name, model, name)
        ctx.charge(usd=reply["usd"], tokens=reply["tokens"], ref=reply["id"])
        ids.append(reply["id"])
    return ids


@stepstone.workflow("reserving-async-agent")
async def aagent(ctx: AsyncWorkflowContext, input: dict[str, Any]) -> list[str]:
    ids = []
    for name in "abc":
        await ctx.reserve(usd=1.0, tokens=10)
        reply = await ctx.step(name, model, name)
        await ctx.charge(usd=reply["usd"], tokens=reply["tokens"], ref=reply["id"])
        ids.append(reply["id"])
    return ids


def _go(mode: str, store: Store, budget: Budget | None = None) -> dict[str, Any]:
    if mode == "sync":
        return run("r", agent, store, budget=budget)
    return asyncio.run(arun("r", aagent, store, budget=budget))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_reservations_are_journaled_and_settled_by_the_charges(store: Store, mode: str) -> None:
    """Each reserve is one journal entry; each charge settles it: nothing unconfirmed."""
    CALLS.clear()
    final = _go(mode, store, Budget(usd=10))
    assert final["result"] == ["resp-a", "resp-b", "resp-c"] and CALLS == ["a", "b", "c"]
    reserves = [e for e in final[JOURNAL_KEY] if e["call"].startswith("@reserve")]
    assert len(reserves) == 3 and len({e["result"] for e in reserves}) == 3
    assert sorted(final[SPEND_KEY]["settled"]) == sorted(e["result"] for e in reserves)
    spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert (spend.usd, spend.tokens, spend.unconfirmed_usd, spend.unconfirmed) == (2.25, 30, 0, [])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_reservation_past_the_limit_pauses_before_the_call(store: Store, mode: str) -> None:
    """$0.75 + $0.75 spent of $2.4: reserving $1 more would pass it; c is not called."""
    CALLS.clear()
    with pytest.raises(Suspended) as paused:
        _go(mode, store, Budget(usd=2.4))
    assert paused.value.waiting_for == BUDGET_WAIT and CALLS == ["a", "b"]
    cp = store.load("r")
    assert cp is not None and "reserving would pass the budget" in cp.state[SPEND_KEY]["paused"]
    assert len([e for e in cp.state[JOURNAL_KEY] if e["call"].startswith("@reserve")]) == 2
    with pytest.raises(Suspended):
        _go(mode, store)  # not raised yet: still paused, nothing called
    assert CALLS == ["a", "b"]
    signal(store, "r", RAISE_SIGNAL, {"usd": 1})
    assert _go(mode, store)["result"] == ["resp-a", "resp-b", "resp-c"]
    assert CALLS == ["a", "b", "c"]
    spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert (spend.usd, spend.unconfirmed_usd, spend.limit_usd) == (2.25, 0.0, 3.4)


def test_a_charge_settles_its_epochs_reservations_and_leaves_a_dead_epochs_unconfirmed(
    store: Store,
) -> None:
    """A reservation of another lease epoch (its process died) is not settled by the
    charge: it moves to unconfirmed, and the cap keeps counting it."""

    @stepstone.workflow("one")
    def one(ctx: WorkflowContext, input: dict[str, Any]) -> bool:
        return ctx.charge(usd=0.5, ref="one")

    run("r", one, store, budget=Budget(usd=10))
    cp = store.load("r")
    assert cp is not None

    def reservation(signal_id: str, attempt: str) -> Signal:
        payload = {"step": "one", "attempt": attempt, "usd": 1.0, "tokens": 0}
        return Signal(RESERVE_SIGNAL, signal_id, payload, utcnow())

    mine, dead = reservation("mine", f"{cp.epoch}.code"), reservation("dead", "0.code")
    cp = evolve(cp, signals=(*cp.signals, mine, dead))
    ledger: dict[str, Any] = {}
    settle_reservations(cp, ledger)
    assert ledger["settled"] == ["mine"]
    assert ledger["unconfirmed"] == [{"id": "dead", **dead.payload}]
    settle_reservations(evolve(cp, state={SPEND_KEY: ledger}), ledger)  # settled once only
    assert ledger["settled"] == ["mine"] and len(ledger["unconfirmed"]) == 1
    spend = spend_of(evolve(cp, state={SPEND_KEY: ledger}))
    assert (spend.unconfirmed_usd, spend.unconfirmed[0]["id"]) == (1.0, "dead")


def test_a_bad_reservation_takes_no_place_in_the_journal(store: Store) -> None:
    """InvalidCharge before the call is numbered: nothing journaled or reserved."""

    @stepstone.workflow("bad-reserve")
    def bad(ctx: WorkflowContext, input: dict[str, Any]) -> str:
        with pytest.raises(InvalidCharge, match="finite number >= 0"):
            ctx.reserve(usd=-1)
        with pytest.raises(InvalidCharge, match="tokens must be an int"):
            ctx.reserve(tokens=1.5)  # type: ignore[arg-type]
        with pytest.raises(InvalidCharge, match="no ref="):
            ctx.reserve(usd=1, ref="x")
        with pytest.raises(InvalidCharge, match="unknown field 'eur'"):
            ctx.reserve(eur=1)
        return "ok"

    final = run("r", bad, store, budget=Budget(usd=5))
    assert final["result"] == "ok" and final.get(JOURNAL_KEY, []) == []
    cp = store.load("r")
    assert cp is not None and not [s for s in cp.signals if s.name == "~reserve"]


@stepstone.workflow("reserving-kid")
def reserving_kid(ctx: WorkflowContext, input: dict[str, Any]) -> str:
    ctx.reserve(usd=1.0)
    reply = ctx.step("ask", model, str(input["i"]))
    ctx.charge(usd=1.0, ref=reply["id"])
    return str(reply["id"])


def test_a_code_childs_reservation_is_checked_against_its_trees_pool(store: Store) -> None:
    """Two children spent $2 of the root's $2.5: the third's $1 reservation pauses it."""
    CALLS.clear()

    @stepstone.workflow("reserving-parent")
    def parent(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
        return ctx.map("kids", reserving_kid, [{"i": i} for i in range(3)])

    with pytest.raises(Suspended):
        run("p", parent, store, budget=Budget(usd=2.5))
    children = store.load("p").children  # type: ignore[union-attr]
    for child in children[:2]:
        run(child, reserving_kid, store)
    with pytest.raises(Suspended) as paused:
        run(children[2], reserving_kid, store)
    assert paused.value.waiting_for == BUDGET_WAIT and paused.value.wake_at is not None
    assert sorted(CALLS) == ["0", "1"]
    kid = store.load(children[2])
    assert kid is not None and "the pool of run 'p'" in kid.state[SPEND_KEY]["paused"]
    signal(store, "p", RAISE_SIGNAL, {"usd": 1})
    assert run(children[2], reserving_kid, store)["result"] == "resp-2"
    assert spend_of(store.load("p")).children_usd == 3.0  # type: ignore[arg-type]


def test_a_step_childs_reservation_is_checked_against_its_trees_pool(store: Store) -> None:
    """The same for a step list's ``ctx.reserve``: refused, the child waits for the root."""

    def work(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        ctx.reserve(usd=1.0)
        CALLS.append(str(state["i"]))
        ctx.charge(usd=1.0, ref=f"kid-{state['i']}")
        return {"work": 1}

    CALLS.clear()
    kid = Workflow("kid", [Step("work", work)])
    parent = Workflow("parent", [Map("kids", kid, lambda s: [{"i": i} for i in range(3)])])
    with pytest.raises(Suspended):
        run("p", parent, store, budget=Budget(usd=2.5))
    children = store.load("p").children  # type: ignore[union-attr]
    for child in children[:2]:
        run(child, kid, store)
    with pytest.raises(Suspended) as paused:
        run(children[2], kid, store)
    assert paused.value.waiting_for == BUDGET_WAIT and paused.value.wake_at is not None
    assert sorted(CALLS) == ["0", "1"]
    signal(store, "p", RAISE_SIGNAL, {"usd": 1})
    run(children[2], kid, store)
    assert sorted(CALLS) == ["0", "1", "2"]
    assert spend_of(store.load("p")).children_usd == 3.0  # type: ignore[arg-type]
