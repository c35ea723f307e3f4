"""Spend ledgers survive real crashes: SIGKILL a charging run, check the ledger afresh.

A child process runs three charging steps and kills itself at a chosen point: between a
step's reservation and its charge (``budget.reserved``), after a step charged but before
its save (``runner.after_step``), or after the save (``runner.after_save``). A fresh
process finishes the run; the test then reads the store and checks the invariant: the
confirmed total is the sum of the charges of the committed attempts, each ref counted
once; the unconfirmed reservations are exactly those of the attempt that died after
reserving; and a run whose confirmed plus unconfirmed spend reached the hard limit
started no charged step until the budget was raised.
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
from fresh_stores import fresh_config as _config
from stepstone import open_store, signal, spend_of
from stepstone._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY

SRC = str(Path(stepstone.__file__).resolve().parents[1])

CHILD = r"""
import asyncio, json, os, signal, sys

from stepstone import Budget, Step, Suspended, _hooks, arun, open_store, run

config, side, mode, kill = sys.argv[1:5]
CHARGES = {"a": 0.75, "b": 0.5, "c": 0.25}


def note(what):
    with open(side, "a") as out:
        out.write(what + "\n")


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def make(name):
    def step(state, ctx):
        note(f"call {name}")
        if name == "a":
            ctx.reserve(usd=1.0)  # saved before the (pretend) model call
        ctx.charge(usd=CHARGES[name], tokens=10, ref=f"resp-{name}")
        return {name: True}
    return step


seen = []


def hook(point):
    seen.append(point)
    if kill == "reserve" and point == "budget.reserved":
        die()  # reserved, the call and its charge not made
    if kill == "after_step" and point == "runner.after_step" and seen.count(point) == 2:
        die()  # step b charged and returned, its save not made
    if kill == "after_save" and point == "runner.after_save" and seen.count(point) == 2:
        die()  # step b saved with its charge


if kill:
    _hooks.install(hook)
steps = [Step(n, make(n)) for n in "abc"]
budget = Budget(usd=2.2)
with open_store(config) as store:
    try:
        if mode == "sync":
            state = run("r", steps, store, budget=budget)
        else:
            state = asyncio.run(arun("r", steps, store, budget=budget))
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


def _killed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -signals.SIGKILL, (done.returncode, done.stderr[-2000:])


def _said(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ledger(config: str) -> tuple[Any, dict[str, Any]]:
    with open_store(config) as store:
        cp = store.load("r")
    assert cp is not None
    return spend_of(cp), cp.state[SPEND_KEY]


@pytest.mark.crash
@pytest.mark.parametrize(
    ("kind", "mode"),
    [
        ("sqlite", "sync"),
        ("sqlite", "async"),
        ("postgresql", "sync"),
        ("mysql", "async"),
        ("cosmos", "sync"),
    ],
)
def test_a_kill_between_reserve_and_charge_leaves_it_unconfirmed_and_pauses_at_the_cap(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, mode: str
) -> None:
    """The dead attempt's $1 stays unconfirmed; with it the cap is reached before step c."""
    config = _config(kind, request, tmp_path)
    side = tmp_path / "calls.txt"
    _killed(_child(config, side, mode, kill="reserve"))
    spend, _ = _ledger(config)
    # Open (the attempt is dead), and the run's budget is on record before any charge.
    assert (spend.usd, spend.unconfirmed_usd, spend.limit_usd) == (0.0, 1.0, 2.2)
    # Fresh process: a reruns (a new attempt, a new reservation, settled), then b; the
    # confirmed $1.25 plus the dead attempt's $1 reach the $2.2 cap: c does not start.
    assert _said(_child(config, side, mode)) == BUDGET_WAIT
    assert Counter(side.read_text().splitlines()) == {"call a": 2, "call b": 1}
    spend, ledger = _ledger(config)
    assert (spend.usd, spend.tokens) == (1.25, 20)
    assert (spend.unconfirmed_usd, len(spend.unconfirmed)) == (1.0, 1)
    assert spend.unconfirmed[0]["step"] == "a" and "open" not in spend.unconfirmed[0]
    assert len(ledger["settled"]) == 1 and ledger["refs"] == {"resp-a": "a", "resp-b": "b"}
    with open_store(config) as store:
        signal(store, "r", RAISE_SIGNAL, {"usd": 1})
    assert _said(_child(config, side, mode)) == "done"
    spend, ledger = _ledger(config)
    assert (spend.usd, spend.unconfirmed_usd, spend.limit_usd) == (1.5, 1.0, 3.2)
    assert spend.by_step == {
        "a": {"usd": 0.75, "tokens": 10},
        "b": {"usd": 0.5, "tokens": 10},
        "c": {"usd": 0.25, "tokens": 10},
    }
    assert Counter(side.read_text().splitlines()) == {"call a": 2, "call b": 1, "call c": 1}


@pytest.mark.crash
@pytest.mark.parametrize("kill", ["after_step", "after_save"])
def test_a_kill_around_a_charged_save_counts_the_charge_exactly_once(
    request: pytest.FixtureRequest, tmp_path: Path, kill: str
) -> None:
    """Killed before or after step b's save, the finished ledger holds b's charge once."""
    config = _config("sqlite", request, tmp_path)
    side = tmp_path / "calls.txt"
    _killed(_child(config, side, "sync", kill=kill))
    spend, _ = _ledger(config)
    assert spend.usd == (0.75 if kill == "after_step" else 1.25)
    assert _said(_child(config, side, "sync")) == "done"
    spend, ledger = _ledger(config)
    assert (spend.usd, spend.tokens, spend.unconfirmed_usd) == (1.5, 30, 0.0)
    assert ledger["refs"] == {"resp-a": "a", "resp-b": "b", "resp-c": "c"}
    calls = Counter(side.read_text().splitlines())
    assert calls == {"call a": 1, "call b": 2 if kill == "after_step" else 1, "call c": 1}


POOL_CHILD = r"""
import json, os, signal, sys

from stepstone import Budget, Map, Step, Suspended, Workflow, _hooks, open_store, run

config, kill = sys.argv[1:3]


def work(state, ctx):
    ctx.charge(usd=1.0, ref=f"resp-{state['i']}")
    return {"done": True}


kid = Workflow("kid", [Step("work", work)])
parent = Workflow("parent", [Map("kids", kid, lambda s: [{"i": i} for i in range(2)])])


def die(point):
    if point == "budget.pooled":
        os.kill(os.getpid(), signal.SIGKILL)  # in the root's pool, the child's save not made


if kill:
    _hooks.install(die)
with open_store(config) as store:
    try:
        run("p", parent, store, budget=Budget(usd=10))
    except Suspended:
        pass
    for child in store.load("p").children:
        run(child, kid, store)  # what a worker serving ``kid`` does; the kill is in the first
    run("p", parent, store)
    print(json.dumps("done"))
"""


@pytest.mark.crash
def test_a_child_killed_after_charging_the_pool_is_counted_there_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Killed between its pool charge and its save, a Map child's rerun, charging the
    same ref, finds its count in the pool: the pool holds it once, as its own ledger does."""
    config = _config("sqlite", request, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", POOL_CHILD, config, "kill"],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    _killed(done)
    finished = subprocess.run(
        [sys.executable, "-c", POOL_CHILD, config, ""],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert _said(finished) == "done"
    with open_store(config) as store:
        root = store.load("p")
        assert root is not None and root.status == "done"
        kids = [store.load(child) for child in ("p/kids/0", "p/kids/1")]
        pushes = [s.payload for s in root.signals if s.name == "~pool"]
    assert [spend_of(k).usd for k in kids if k is not None] == [1.0, 1.0]  # exact, each once
    # Named by its ref, the dead attempt's push is the rerun's: each child once.
    assert sorted((p["run"], p["usd"]) for p in pushes) == [("p/kids/0", 1.0), ("p/kids/1", 1.0)]
    assert spend_of(root).children_usd == 2.0
