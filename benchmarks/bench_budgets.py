"""What a spend budget costs per step: charge, reserve and the budget check.

Runs the same 20-step workflow four ways on the memory store and on SQLite (default
``synchronous=FULL``): plain steps; each step charging (``ctx.charge`` with a ref);
each step charging under a ``Budget`` (the check before every step, the ledger in
every save); each step reserving first (one more compare-and-swap per step); each step
charging under a budget naming a tenant with a cap (one read of the tenant's record
before each step, one compare-and-swap on it before each save). Prints the median time
per step of each, over ``--repeats`` runs, and the extra over plain steps.

    .venv/bin/python benchmarks/bench_budgets.py [--steps 20] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from typing import Any

from stepstone import Budget, Step, StepContext, TenantCap, open_store, run, set_tenant_cap


def plain(state: dict[str, Any]) -> dict[str, Any]:
    return {"n": state.get("n", 0) + 1}


def charging(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    ctx.charge(usd=0.001, tokens=100, ref=f"{ctx.idempotency_key}")
    return {"n": state.get("n", 0) + 1}


def reserving(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    ctx.reserve(usd=0.002)
    ctx.charge(usd=0.001, tokens=100, ref=f"{ctx.idempotency_key}")
    return {"n": state.get("n", 0) + 1}


def per_step(config: str, fn: Any, budget: Budget | None, steps: int, repeats: int) -> float:
    """Median microseconds per step of a ``steps``-step run (a new run id each time)."""
    workflow = [Step(f"s{i}", fn) for i in range(steps)]
    times = []
    with open_store(config) as store:
        for _ in range(repeats + 2):
            started = time.perf_counter()
            run(uuid.uuid4().hex, workflow, store, budget=budget)
            times.append((time.perf_counter() - started) / steps * 1e6)
    return statistics.median(times[2:])  # the first two warm up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    budget = Budget(usd=1_000, tokens=10**9)
    tenant = Budget(usd=1_000, tenant="bench")
    with tempfile.TemporaryDirectory() as tmp:
        stores = {"memory": "memory://bench-budgets", "sqlite": f"sqlite:///{tmp}/b.db"}
        print(f"{'store':8} {'steps':38} {'us/step':>9} {'extra':>8}")
        for name, config in stores.items():
            with open_store(config) as store:
                set_tenant_cap(store, TenantCap("bench", usd=10**9))
            base = per_step(config, plain, None, args.steps, args.repeats)
            rows = [
                ("plain", base),
                ("ctx.charge", per_step(config, charging, None, args.steps, args.repeats)),
                (
                    "ctx.charge under a Budget",
                    per_step(config, charging, budget, args.steps, args.repeats),
                ),
                (
                    "ctx.reserve + ctx.charge under a Budget",
                    per_step(config, reserving, budget, args.steps, args.repeats),
                ),
                (
                    "ctx.charge under a tenant's cap",
                    per_step(config, charging, tenant, args.steps, args.repeats),
                ),
            ]
            for label, value in rows:
                print(f"{name:8} {label:38} {value:9.1f} {value - base:+8.1f}")


if __name__ == "__main__":
    main()
