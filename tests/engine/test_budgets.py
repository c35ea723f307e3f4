"""Spend budgets: the ledger saved with each step, refs, reservations, pauses and raises.

Every test runs on memory, SQLite and the file store (sync and async where the driver
matters); one test per SQL server runs the pause-and-raise round trip there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import fresh_config
from stepstone import (
    Budget,
    BudgetExhausted,
    InvalidCharge,
    InvalidWorkflow,
    Map,
    RunCancelled,
    Step,
    StepContext,
    Store,
    Suspended,
    Worker,
    Workflow,
    _hooks,
    arun,
    cancel,
    open_store,
    run,
    signal,
    spend_of,
    start,
)
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY


@pytest.fixture(params=["memory", "sqlite", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each in-process backend."""
    configs = {
        "memory": f"memory://budgets-{tmp_path.name}",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
        "file": f"file://{tmp_path}/runs",
    }
    with open_store(configs[str(request.param)]) as opened:
        yield opened


def _charging(name: str, usd: float, tokens: int = 0, ref: str | None = None) -> Step:
    def fn(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        ctx.charge(usd=usd, tokens=tokens, ref=ref)
        return {name: state.get(name, 0) + 1}

    return Step(name, fn)


def test_charges_are_saved_with_the_step_and_a_repeated_ref_counts_once(store: Store) -> None:
    """Two charges with one ref count once; totals and per-step sums land in the ledger."""

    def twice(state: dict[str, Any], ctx: StepContext) -> None:
        assert ctx.charge(usd=0.25, tokens=100, ref="resp-1") is True
        assert ctx.charge(usd=0.25, tokens=100, ref="resp-1") is False

    steps = [Step("a", twice), _charging("b", 0.5, 10, "resp-2"), _charging("c", 1.0)]
    final = run("r", steps, store)
    spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert (spend.usd, spend.tokens) == (1.75, 110)
    assert spend.by_step == {
        "a": {"usd": 0.25, "tokens": 100},
        "b": {"usd": 0.5, "tokens": 10},
        "c": {"usd": 1.0, "tokens": 0},
    }
    assert final[SPEND_KEY]["refs"] == {"resp-1": "a", "resp-2": "b"}
    assert spend.limit_usd is None and not spend.over


def test_a_ref_recorded_by_an_earlier_step_is_a_no_op(store: Store) -> None:
    """A later step charging a ref the ledger holds (a resumed call's response) adds nothing."""
    steps = [_charging("a", 1.0, ref="same"), _charging("b", 1.0, ref="same")]
    run("r", steps, store)
    assert spend_of(store.load("r")).usd == 1.0  # type: ignore[arg-type]


def test_a_run_at_its_hard_limit_pauses_and_a_raise_resumes_it(store: Store) -> None:
    """Over the limit the next step does not run; a raise signal lets it run, once."""
    ran: list[str] = []

    def last(state: dict[str, Any]) -> dict[str, Any]:
        ran.append("last")
        return {"last": True}

    steps = [_charging("a", 3.0), _charging("b", 2.5), Step("last", last)]
    with pytest.raises(Suspended) as paused:
        run("r", steps, store, budget=Budget(usd=5))
    assert paused.value.waiting_for == BUDGET_WAIT
    cp = store.load("r")
    assert cp is not None and cp.status == "waiting" and cp.owner is None
    assert cp.step == 1 and ran == []
    assert "spent $5.5 of $5" in cp.state[SPEND_KEY]["paused"]
    # Run again without a raise: still paused, nothing runs.
    with pytest.raises(Suspended):
        run("r", steps, store)
    assert signal(store, "r", RAISE_SIGNAL, {"usd": 10}) is True
    assert store.load("r").due_at is not None  # type: ignore[union-attr]
    final = run("r", steps, store)
    assert ran == ["last"] and final["last"] is True
    spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert (spend.usd, spend.limit_usd, spend.over) == (5.5, 15.0, False)
    assert "paused" not in final[SPEND_KEY]


def test_a_token_limit_pauses_too_and_cancel_ends_the_paused_run(store: Store) -> None:
    """A tokens-only budget pauses at its limit; cancel ends the paused run for good."""
    steps = [_charging("a", 0.0, tokens=1000), _charging("b", 0.0)]
    with pytest.raises(Suspended):
        run("r", steps, store, budget=Budget(tokens=1000))
    cancel(store, "r")
    assert store.load("r").status == "cancelled"  # type: ignore[union-attr]
    with pytest.raises(RunCancelled):
        run("r", steps, store)


def test_async_runs_charge_and_pause_the_same_way(store: Store) -> None:
    """Under arun an async step's charges and an areserve land in the same ledger."""

    async def spend(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        await ctx.areserve(usd=2.0)
        ctx.charge(usd=1.5, tokens=7, ref="x")
        return {"spent": True}

    def sync_spend(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.reserve(usd=0.5)  # a plain step runs in a thread: the sync save
        ctx.charge(usd=0.5)

    steps = [Step("s", spend), Step("t", sync_spend), _charging("u", 0.0)]
    with pytest.raises(Suspended):
        asyncio.run(arun("r", steps, store, budget=Budget(usd=2)))
    cp = store.load("r")
    assert cp is not None and cp.waiting_for == BUDGET_WAIT
    spend_now = spend_of(cp)
    assert (spend_now.usd, spend_now.unconfirmed_usd) == (2.0, 0.0)
    assert len(cp.state[SPEND_KEY]["settled"]) == 2


def test_a_reservation_of_a_dead_attempt_stays_spent_unconfirmed(store: Store) -> None:
    """An attempt that died after reserving leaves its reservation as unconfirmed spend."""

    class Died(BaseException):
        pass

    def die(point: str) -> None:
        if point == "budget.reserved":
            raise Died  # the process "dies" with the reservation saved, the call unmade

    def call(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.reserve(usd=1.0, tokens=50)
        ctx.charge(usd=0.75, tokens=40, ref="resp")

    steps = [Step("call", call)]
    _hooks.install(die)
    try:
        with pytest.raises(Died):
            run("r", steps, store, budget=Budget(usd=10))
    finally:
        _hooks.install(None)
    cp = store.load("r")
    assert cp is not None
    assert spend_of(cp).unconfirmed_usd == 1.0  # an open reservation counts at once
    run("r", steps, store)
    spend = spend_of(store.load("r"))  # type: ignore[arg-type]
    assert (spend.usd, spend.tokens) == (0.75, 40)
    assert (spend.unconfirmed_usd, spend.unconfirmed_tokens) == (1.0, 50)
    (dead,) = spend.unconfirmed
    assert dead["step"] == "call" and "open" not in dead


def test_a_reservation_past_the_limit_pauses_before_the_call(store: Store) -> None:
    """ctx.reserve over the limit pauses the run; after a raise the step runs from its start."""
    made: list[int] = []

    def call(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.reserve(usd=4.0)
        made.append(1)  # the expensive call
        ctx.charge(usd=3.0)

    steps = [_charging("a", 2.0), Step("call", call)]
    with pytest.raises(Suspended):
        run("r", steps, store, budget=Budget(usd=5))
    assert made == []
    cp = store.load("r")
    assert cp is not None and "reserving would pass" in cp.state[SPEND_KEY]["paused"]
    signal(store, "r", RAISE_SIGNAL, {"usd": 1})
    run("r", steps, store)
    assert made == [1]
    assert spend_of(store.load("r")).usd == 5.0  # type: ignore[arg-type]


def test_start_and_workflow_budgets_reach_the_run(store: Store) -> None:
    """Workflow(budget=) applies to its runs; start(budget=) overrides it for one run."""
    flow = Workflow("spender", [_charging("a", 1.0), _charging("b", 1.0)], budget=Budget(usd=1))
    with pytest.raises(Suspended):
        run("w", flow, store)
    start(store, flow, "s", budget=Budget(usd=100))
    run("s", flow, store)
    assert spend_of(store.load("s")).limit_usd == 100.0  # type: ignore[arg-type]
    assert store.load("s").status == "done"  # type: ignore[union-attr]


def test_a_worker_leaves_a_paused_run_and_resumes_it_once_raised(store: Store) -> None:
    """A worker pauses the run at its budget, holds nothing, and finishes it after a raise."""
    finished = threading.Event()
    flow = Workflow(
        "budgeted",
        [_charging("a", 1.0, ref="one"), Step("b", lambda state: finished.set())],
        budget=Budget(usd=1),
    )
    start(store, flow, "w")
    worker = Worker(store, [flow], concurrency=1, poll=0.05)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while (cp := store.load("w")) is None or cp.waiting_for != BUDGET_WAIT:
            assert time.monotonic() < deadline, "the worker never paused the run at its budget"
            time.sleep(0.01)
        assert cp.owner is None and not finished.is_set()
        signal(store, "w", RAISE_SIGNAL, {"usd": 1})
        assert finished.wait(30), "the worker never resumed the raised run"
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"
    cp = store.load("w")
    assert cp is not None and cp.status == "done"
    assert (spend_of(cp).usd, spend_of(cp).limit_usd) == (1.0, 2.0)


def test_passing_the_soft_limit_logs_once(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The soft threshold warns once, not at every later step."""
    steps = [_charging("a", 0.8), _charging("b", 0.05), _charging("c", 0.05)]
    with caplog.at_level(logging.WARNING, logger="stepstone"):
        run("r", steps, store, budget=Budget(usd=1, soft=0.75))
    warned = [r for r in caplog.records if "passed 75% of its budget" in r.getMessage()]
    assert len(warned) == 1


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"usd": -1}, "finite number >= 0"),
        ({"usd": "1"}, "number of dollars"),
        ({"usd": float("nan")}, "finite number"),
        ({"tokens": 1.5}, "tokens must be an int"),
        ({"eur": 2}, "unknown field 'eur'"),
        ({"ref": ""}, "ref must be a str"),
    ],
)
def test_a_bad_charge_is_refused_and_nothing_is_recorded(
    store: Store, kwargs: dict[str, Any], says: str
) -> None:
    """A bad charge raises InvalidCharge naming the problem; the ledger stays empty."""

    def bad(state: dict[str, Any], ctx: StepContext) -> None:
        with pytest.raises(InvalidCharge, match=says):
            ctx.charge(**kwargs)

    run("r", [Step("bad", bad)], store)
    assert SPEND_KEY not in store.load("r").state  # type: ignore[union-attr]


def test_a_charge_after_the_step_returned_or_outside_a_run_is_refused(store: Store) -> None:
    """A context kept past its step, or made by hand, refuses charges."""
    kept: list[StepContext] = []

    def keep(state: dict[str, Any], ctx: StepContext) -> None:
        kept.append(ctx)
        ctx.charge(usd=1)

    run("r", [Step("keep", keep)], store)
    with pytest.raises(InvalidCharge, match="has returned"):
        kept[0].charge(usd=1)
    with pytest.raises(InvalidCharge, match="not made by a run"):
        StepContext("r", 0, "s", 1, "k").charge(usd=1)
    assert spend_of(store.load("r")).usd == 1.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({}, "usd=, tokens= or both"),
        ({"usd": -5}, "finite number >= 0"),
        ({"usd": 5, "soft": 0}, "soft must be a fraction"),
        ({"tokens": True}, "tokens must be an int"),
    ],
)
def test_a_bad_budget_is_refused(kwargs: dict[str, Any], says: str) -> None:
    """Budget checks its arguments when made; run refuses a budget of another type."""
    with pytest.raises(InvalidWorkflow, match=says):
        Budget(**kwargs)


def test_a_budget_of_the_wrong_type_is_refused(store: Store) -> None:
    """run(budget=5) names what a budget must be; nothing is stored."""
    with pytest.raises(InvalidWorkflow, match="stepstone.Budget"):
        run("r", [_charging("a", 1.0)], store, budget=5)  # type: ignore[arg-type]
    assert store.load("r") is None


def test_budget_exhausted_is_public() -> None:
    """BudgetExhausted is what a step lets propagate from ctx.reserve."""
    assert issubclass(BudgetExhausted, Exception)


@pytest.mark.server
@pytest.mark.parametrize("server", ["postgresql", "mysql", "cosmos"])
def test_pause_and_raise_on_the_servers(
    request: pytest.FixtureRequest, tmp_path: Path, server: str
) -> None:
    """The pause, the raise and the exact ledger on PostgreSQL, MySQL and Cosmos."""
    with open_store(fresh_config(server, request, tmp_path)) as sql:

        def call(state: dict[str, Any], ctx: StepContext) -> None:
            ctx.reserve(usd=1)
            ctx.charge(usd=1, ref="one")

        steps = [Step("a", call), _charging("b", 1.0, ref="two"), _charging("c", 0.0)]
        with pytest.raises(Suspended):
            run("r", steps, sql, budget=Budget(usd=2))
        signal(sql, "r", RAISE_SIGNAL, {"usd": 1})
        run("r", steps, sql)
        spend = spend_of(sql.load("r"))  # type: ignore[arg-type]
        assert (spend.usd, spend.unconfirmed_usd, spend.limit_usd) == (2.0, 0.0, 3.0)


def test_map_children_draw_from_their_parents_pool(store: Store) -> None:
    """Children charge the root's pool; past its limit the next child pauses until raised."""
    kid = Workflow("kid", [_charging("work", 1.0)])
    parent = Workflow(
        "parent",
        [Map("kids", kid, lambda state: [{"i": i} for i in range(4)]), _charging("sum", 0.5)],
    )
    with pytest.raises(Suspended):
        run("p", parent, store, budget=Budget(usd=2.5))
    children = store.load("p").children  # type: ignore[union-attr]
    for child in children[:3]:
        run(child, kid, store)  # what a worker serving ``kid`` does
    with pytest.raises(Suspended) as paused:
        run(children[3], kid, store)  # $3 of the pool's $2.5 spent: it waits
    assert paused.value.waiting_for == BUDGET_WAIT and paused.value.wake_at is not None
    pool = spend_of(store.load("p"))  # type: ignore[arg-type]
    assert (pool.children_usd, pool.over) == (3.0, True)
    signal(store, "p", RAISE_SIGNAL, {"usd": 10})
    run(children[3], kid, store)
    final = run("p", parent, store)
    assert [kid_state["work"] for kid_state in final["kids"]] == [1, 1, 1, 1]
    pool = spend_of(store.load("p"))  # type: ignore[arg-type]
    assert (pool.usd, pool.children_usd, pool.limit_usd, pool.over) == (0.5, 4.0, 12.5, False)
    assert all(spend_of(store.load(c)).usd == 1.0 for c in children)  # type: ignore[arg-type]
