"""Reservations in code workflows and tenant caps survive real crashes: SIGKILL, check afresh.

A child process runs a code workflow that reserves $1 before each of three model calls
and charges what each cost after it, and kills itself between a reservation and its
call (``budget.reserved``), or after a call's result was journaled but before its charge
(``runner.after_save``). A fresh process finishes the run (its lease has a new epoch).
The invariant, read from the store: the confirmed total is the sum of the charges, each
ref once; the unconfirmed reservations are exactly those of the attempt that died after
reserving; and no call started while confirmed plus unconfirmed spend, with its
reservation, would pass the limit (the run paused instead, until raised).
"""

from __future__ import annotations

import json
import os
import signal as signals
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import stepstone
from fresh_stores import fresh_config
from stepstone import Spend, open_store, signal, spend_of
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY

SRC = str(Path(stepstone.__file__).resolve().parents[1])

CHILD = r"""
import asyncio, json, os, signal, sys

import stepstone
from stepstone import Budget, Suspended, _hooks, arun, open_store, run

config, side, mode, kill = sys.argv[1:5]
COST = {"a": 0.75, "b": 0.5, "c": 0.25}


def model(name):
    with open(side, "a") as out:
        out.write(f"call {name}\n")
    return {"id": f"resp-{name}", "usd": COST[name]}


@stepstone.workflow("reserving")
def agent(ctx, input):
    for name in "abc":
        ctx.reserve(usd=1.0)
        reply = ctx.step(name, model, name)
        ctx.charge(usd=reply["usd"], tokens=10, ref=reply["id"])
    return "done"


@stepstone.workflow("areserving")
async def aagent(ctx, input):
    for name in "abc":
        await ctx.reserve(usd=1.0)
        reply = await ctx.step(name, model, name)
        await ctx.charge(usd=reply["usd"], tokens=10, ref=reply["id"])
    return "done"


seen = []


def hook(point):
    seen.append(point)
    if kill == "reserve" and point == "budget.reserved":
        os.kill(os.getpid(), signal.SIGKILL)  # a's reservation saved, a not called
    if kill == "after_save" and point == "runner.after_save" and seen.count(point) == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # b called and journaled, not charged


if kill:
    _hooks.install(hook)
with open_store(config) as store:
    try:
        if mode == "sync":
            run("r", agent, store, budget=Budget(usd=3))
        else:
            asyncio.run(arun("r", aagent, store, budget=Budget(usd=3)))
    except Suspended as exc:
        print(json.dumps(exc.waiting_for))
        sys.exit(0)
print(json.dumps("done"))
"""


def _child(config: str, side: Path, mode: str, kill: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, config, str(side), mode, kill],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _said(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ledger(config: str) -> tuple[Spend, dict[str, Any]]:
    with open_store(config) as store:
        cp = store.load("r")
    assert cp is not None
    return spend_of(cp), cp.state[SPEND_KEY]


@pytest.mark.crash
@pytest.mark.parametrize(
    ("kind", "mode", "kill"),
    [
        ("sqlite", "sync", "reserve"),
        ("sqlite", "async", "reserve"),
        ("postgresql", "sync", "reserve"),
        ("mysql", "async", "reserve"),
        ("sqlite", "sync", "after_save"),
    ],
)
def test_a_killed_code_workflows_reservation_stays_unconfirmed_and_counts_to_the_cap(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, mode: str, kill: str
) -> None:
    """The dead attempt's $1 stays unconfirmed; with it, c's reservation would pass $3."""
    config = fresh_config(kind, request, tmp_path)
    side = tmp_path / "calls.txt"
    died = _child(config, side, mode, kill)
    assert died.returncode == -signals.SIGKILL, (died.returncode, died.stderr[-2000:])
    spend, _ = _ledger(config)
    assert spend.unconfirmed_usd == 1.0 and spend.unconfirmed[0].get("open") is True
    # Fresh process: the journal answers what was saved; the dead epoch's reservation is
    # not settled by the new epoch's charge. Confirmed $1.25 + unconfirmed $1 + c's $1
    # would pass $3: c is not called, the run waits for a raise.
    assert _said(_child(config, side, mode)) == BUDGET_WAIT
    assert Counter(side.read_text().splitlines()) == {"call a": 1, "call b": 1}
    spend, ledger = _ledger(config)
    assert (spend.usd, spend.tokens) == (1.25, 20)
    assert (spend.unconfirmed_usd, len(spend.unconfirmed)) == (1.0, 1)
    assert spend.unconfirmed[0]["step"].endswith("reserving")  # the workflow's name
    assert "open" not in spend.unconfirmed[0]
    assert len(ledger["settled"]) == 1 and ledger["refs"] == {"resp-a": "a", "resp-b": "b"}
    assert "reserving would pass the budget" in ledger["paused"]
    with open_store(config) as store:
        signal(store, "r", RAISE_SIGNAL, {"usd": 1})
    assert _said(_child(config, side, mode)) == "done"
    spend, ledger = _ledger(config)
    assert (spend.usd, spend.unconfirmed_usd, spend.limit_usd) == (1.5, 1.0, 4.0)
    assert len(ledger["settled"]) == 2 and set(ledger["refs"]) == {"resp-a", "resp-b", "resp-c"}
    assert spend.by_step == {
        "a": {"usd": 0.75, "tokens": 10},
        "b": {"usd": 0.5, "tokens": 10},
        "c": {"usd": 0.25, "tokens": 10},
    }
    assert Counter(side.read_text().splitlines()) == {"call a": 1, "call b": 1, "call c": 1}


TENANT_CHILD = r"""
import json, os, signal, sys

from stepstone import Budget, Step, _hooks, open_store, run

config, side, kill = sys.argv[1:4]


def make(name, usd):
    def step(state, ctx):
        with open(side, "a") as out:
            out.write(f"call {name}\n")
        ctx.charge(usd=usd, tokens=10, ref=f"resp-{name}")
        return {name: True}
    return step


seen = []


def hook(point):
    seen.append(point)
    if point == kill and seen.count(point) == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # step b's charge: around its push and save


if kill:
    _hooks.install(hook)
steps = [Step(n, make(n, usd)) for n, usd in (("a", 0.75), ("b", 0.5), ("c", 0.25))]
with open_store(config) as store:
    run("r", steps, store, budget=Budget(usd=10, tenant="acme"))
print(json.dumps("done"))
"""


@pytest.mark.crash
@pytest.mark.parametrize(
    ("kind", "kill"),
    [
        ("sqlite", "runner.after_step"),  # b returned: neither counted nor saved
        ("sqlite", "budget.tenant"),  # b counted for the tenant, its save not made
        ("postgresql", "budget.tenant"),
        ("mysql", "runner.after_save"),  # b saved with its charge
    ],
)
def test_a_tenants_window_never_misses_a_committed_charge_across_a_kill(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, kill: str
) -> None:
    """The tenant's total is exactly the run's confirmed total, however the run died: an
    attempt killed between the tenant's count and its save is rerun with the same refs,
    and its count, named by them, is found and not made again."""
    config = fresh_config(kind, request, tmp_path)
    side = tmp_path / "calls.txt"

    def child(kill: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", TENANT_CHILD, config, str(side), kill],
            env={**os.environ, "PYTHONPATH": SRC},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    died = child(kill)
    assert died.returncode == -signals.SIGKILL, (died.returncode, died.stderr[-2000:])
    assert _said(child("")) == "done"
    spend, ledger = _ledger(config)
    assert (spend.usd, set(ledger["refs"])) == (1.5, {"resp-a", "resp-b", "resp-c"})
    with open_store(config) as store:
        spent = stepstone.tenant_spend(store, "acme")
    assert (spent.usd, spent.tokens) == (1.5, 30)
