"""Tenant-wide daily and monthly caps: every run of a tenant counts against one record."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import stepstone
from stepstone import (
    Budget,
    ConfigError,
    InvalidWorkflow,
    Map,
    Step,
    StepContext,
    Store,
    Suspended,
    TenantCap,
    Workflow,
    WorkflowContext,
    arun,
    aset_tenant_cap,
    atenant_spend,
    open_store,
    run,
    set_tenant_cap,
    signal,
    spend_of,
    tenant_spend,
)
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY
from stepstone.testing import FakeClock


@pytest.fixture(params=["memory", "sqlite", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each in-process backend."""
    configs = {
        "memory": f"memory://budgets-tenant-{tmp_path.name}",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
        "file": f"file://{tmp_path}/runs",
    }
    with open_store(configs[str(request.param)]) as opened:
        yield opened


CALLS: list[str] = []


def _charging(name: str, usd: float) -> Step:
    def step(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        CALLS.append(name)
        ctx.charge(usd=usd, tokens=10, ref=f"{ctx.run_id}-{name}")
        return {name: True}

    return Step(name, step)


STEPS = [_charging("a", 1.0), _charging("b", 1.0)]


def test_runs_of_a_tenant_share_its_daily_cap_until_it_is_raised(store: Store) -> None:
    """Run 1 spends $2 of acme's $3; run 2's second step waits; a higher cap resumes it."""
    CALLS.clear()
    set_tenant_cap(store, TenantCap("acme", usd=3))
    run("r1", STEPS, store, budget=Budget(tenant="acme"))
    with pytest.raises(Suspended) as paused:
        run("r2", STEPS, store, budget=Budget(usd=10, tenant="acme"))
    assert paused.value.waiting_for == BUDGET_WAIT and paused.value.wake_at is not None
    assert CALLS == ["a", "b", "a"]
    cp = store.load("r2")
    assert (
        cp is not None and "tenant 'acme' spent $3 of its daily $3" in cp.state[SPEND_KEY]["paused"]
    )
    spent = tenant_spend(store, "acme")
    assert (spent.usd, spent.tokens, spent.over) == (3.0, 30, True)
    run("other", STEPS, store, budget=Budget(usd=10, tenant="globex"))  # another tenant
    set_tenant_cap(store, TenantCap("acme", usd=5))
    run("r2", STEPS, store)
    assert CALLS == ["a", "b", "a", "a", "b", "b"]
    spent = tenant_spend(store, "acme")
    assert (spent.usd, spent.over, spent.cap) == (4.0, False, TenantCap("acme", usd=5))
    assert tenant_spend(store, "globex").usd == 2.0


def test_a_new_day_starts_the_window_from_zero(store: Store) -> None:
    """Paused by the day's cap, the run goes on once the clock passes midnight UTC."""
    CALLS.clear()
    start = datetime(2026, 12, 6, 23, 0, tzinfo=UTC)
    with FakeClock(start) as clock:
        set_tenant_cap(store, TenantCap("acme", usd=1, period="day"))
        with pytest.raises(Suspended):
            run("r", STEPS, store, budget=Budget(tenant="acme"))
        assert CALLS == ["a"] and tenant_spend(store, "acme").window == "2026-12-06"
        clock.advance(timedelta(hours=2))
        assert tenant_spend(store, "acme").usd == 0.0  # a new window
        run("r", STEPS, store)
        spent = tenant_spend(store, "acme")
    assert CALLS == ["a", "b"] and (spent.window, spent.usd) == ("2026-12-07", 1.0)


def test_a_monthly_cap_counts_tokens_over_the_month(store: Store) -> None:
    """A token cap per month: 30 of 25 tokens after three steps; the window is the month."""
    with FakeClock(datetime(2026, 12, 6, tzinfo=UTC)):
        set_tenant_cap(store, TenantCap("acme", tokens=25, period="month"))
        steps = [*STEPS, _charging("c", 0.0), _charging("d", 0.0)]
        with pytest.raises(Suspended):
            run("r", steps, store, budget=Budget(tenant="acme"))
        spent = tenant_spend(store, "acme")
    assert (spent.window, spent.tokens, spent.over) == ("2026-12", 30, True)
    assert "of its monthly 25 tokens" in store.load("r").state[SPEND_KEY]["paused"]  # type: ignore[union-attr]


@stepstone.workflow("tenant-agent")
def agent(ctx: WorkflowContext, input: dict[str, Any]) -> int:
    for i in range(3):
        reply = ctx.step("ask", lambda i: {"id": f"resp-{i}", "usd": 1.0}, i)
        ctx.charge(usd=reply["usd"], ref=reply["id"])
    return 3


def test_a_code_workflows_charges_count_once_against_its_tenant(store: Store) -> None:
    """Paused at the cap, raised, replayed: each journaled charge is counted once."""
    set_tenant_cap(store, TenantCap("acme", usd=2))
    with pytest.raises(Suspended):
        run("r", agent, store, budget=Budget(tenant="acme"))
    assert tenant_spend(store, "acme").usd == 2.0
    set_tenant_cap(store, TenantCap("acme", usd=10))
    assert run("r", agent, store)["result"] == 3
    assert tenant_spend(store, "acme").usd == 3.0 == spend_of(store.load("r")).usd  # type: ignore[arg-type]


def test_a_reservation_past_the_tenants_cap_pauses_the_run(store: Store) -> None:
    """Code workflows and steps: a reservation that would pass the cap is refused."""

    @stepstone.workflow("tenant-reserver")
    def reserver(ctx: WorkflowContext, input: dict[str, Any]) -> str:
        ctx.reserve(usd=2.0)
        return "reserved"

    def step(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        ctx.reserve(usd=2.0)
        return {"reserved": True}

    set_tenant_cap(store, TenantCap("acme", usd=2.5))
    run("spent", [_charging("a", 1.0)], store, budget=Budget(tenant="acme"))
    for run_id, work in (("code", reserver), ("steps", [Step("s", step)])):
        with pytest.raises(Suspended):
            run(run_id, work, store, budget=Budget(tenant="acme"))
        cp = store.load(run_id)
        assert (
            cp is not None
            and "reserving would pass the budget: tenant 'acme'" in (cp.state[SPEND_KEY]["paused"])
        )
    set_tenant_cap(store, TenantCap("acme", usd=10))
    assert run("code", reserver, store)["result"] == "reserved"
    assert run("steps", [Step("s", step)], store)["reserved"] is True


def test_map_children_count_against_their_roots_tenant(store: Store) -> None:
    """The children of a tenant's run inherit the tenant: their charges count too."""
    kid = Workflow("kid", [_charging("work", 1.0)])
    parent = Workflow("parent", [Map("kids", kid, lambda s: [{"i": i} for i in range(2)])])
    with pytest.raises(Suspended):
        run("p", parent, store, budget=Budget(usd=10, tenant="acme"))
    for child in store.load("p").children:  # type: ignore[union-attr]
        assert store.load(child).state[SPEND_KEY]["tenant"] == "acme"  # type: ignore[union-attr]
        run(child, kid, store)
    run("p", parent, store)
    assert tenant_spend(store, "acme").usd == 2.0


def test_a_raise_of_the_runs_own_budget_does_not_pass_the_tenants_cap(store: Store) -> None:
    """The tenant's cap binds whatever the run's own limit: a raise alone does not resume."""
    set_tenant_cap(store, TenantCap("acme", usd=1))
    with pytest.raises(Suspended):
        run("r", STEPS, store, budget=Budget(usd=5, tenant="acme"))
    signal(store, "r", RAISE_SIGNAL, {"usd": 5})
    with pytest.raises(Suspended):
        run("r", STEPS, store)
    assert spend_of(store.load("r")).usd == 1.0  # type: ignore[arg-type]


def test_async_caps_and_runs(store: Store) -> None:
    """aset_tenant_cap, atenant_spend and arun keep to the same cap."""

    async def main() -> None:
        await aset_tenant_cap(store, TenantCap("acme", usd=1))
        with pytest.raises(Suspended):
            await arun("r", STEPS, store, budget=Budget(tenant="acme"))
        spent = await atenant_spend(store, "acme")
        assert (spent.usd, spent.over) == (1.0, True)

    asyncio.run(main())


def test_bad_caps_and_tenants_are_refused_with_what_is_allowed(store: Store) -> None:
    """A clear error; nothing stored."""
    with pytest.raises(ConfigError, match="period must be 'day' or 'month'"):
        TenantCap("acme", usd=1, period="week")
    with pytest.raises(ConfigError, match="usd must be a finite number >= 0"):
        TenantCap("acme", usd=-1)
    with pytest.raises(ConfigError, match="needs usd=, tokens= or both"):
        TenantCap("acme")
    with pytest.raises(ConfigError, match="tenant must be a name"):
        TenantCap("", usd=1)
    with pytest.raises(InvalidWorkflow, match="tenant must be a name"):
        Budget(tenant="a/b")
    with pytest.raises(ConfigError, match="must be a stepstone.TenantCap"):
        set_tenant_cap(store, "acme")  # type: ignore[arg-type]
    spent = tenant_spend(store, "acme")
    assert (spent.usd, spent.cap, spent.over) == (0.0, None, False)


def test_the_record_keeps_only_the_latest_push_ids(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many charges a window counts, the record holds at most MAX_IDS ids."""
    from stepstone import _tenant
    from stepstone._flow._api import drive

    monkeypatch.setattr(_tenant, "MAX_IDS", 5)
    for i in range(8):
        drive(store, _tenant.push("acme", f"run#{i}", 0.001, 1))
    drive(store, _tenant.push("acme", "run#7", 0.001, 1))  # a repeat: not counted
    record = store.load(_tenant.PREFIX + "acme")
    assert record is not None and record.state["ids"] == [f"run#{i}" for i in range(3, 8)]
    assert tenant_spend(store, "acme").tokens == 8
