"""Code workflows survive real crashes: SIGKILL a process mid-run, finish in a fresh one.

Each test runs a ``@stepstone.workflow`` in a child process that kills itself at a
chosen point (inside a call, between a call's return and its journal entry, inside a
gather, in a loop's 50th iteration, inside ``wait_for`` and ``map``), then a fresh process reopens
the store from its config string and finishes the run. Every call notes itself in a
side file when it starts: finished calls never ran again, the killed one once more. A
call that kills every process it runs in stops after its retry policy's attempts.
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
from stepstone import open_store, signal
from stepstone._journal import JOURNAL_KEY

SRC = str(Path(stepstone.__file__).resolve().parents[1])
BACKENDS = ("sqlite", "postgresql", "mysql")

CHILD = r"""
import asyncio, json, os, signal, sys, time

import stepstone
from stepstone import CallFailed, RetryPolicy, Suspended, _hooks, arun, open_store, run

config, run_id, side, mode, kind, kill = sys.argv[1:7]


def note(what):
    with open(side, "a") as out:
        out.write(what + "\n")


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def journaled():
    with open_store(config) as store:
        cp = store.load(run_id)
        return 0 if cp is None else len(cp.state.get("~journal", []))


def iteration(i):
    note(f"iter {i}")
    if kill == "loop" and i == 49:
        die()  # inside the 50th iteration's call: nothing of it journaled
    return {"i": i}


def plain(x):
    note(f"call {x}")
    return x


def doomed():
    note("doomed")
    die()  # every attempt kills its process


DOOMED = RetryPolicy(max_attempts=2, initial_delay=0)


def tool(i):
    note(f"tool {i}")
    if kill == "gather" and i == 0:
        deadline = time.monotonic() + 60
        while journaled() < 2:  # the other two calls of the gather are journaled first
            if time.monotonic() > deadline:
                raise SystemExit("tools 1 and 2 were never journaled")
            time.sleep(0.01)
        die()
    return i


if kill == "after_step":
    returned = []

    def hook(point):
        if point == "runner.after_step":
            returned.append(point)
            if len(returned) == 3:
                die()  # call 2 returned, its entry not saved

    _hooks.install(hook)
elif kill == "wait":
    _hooks.install(lambda point: die() if point == "wait.consumed" else None)
elif kill == "map":
    _hooks.install(lambda point: die() if point == "map.child_created" else None)


def kid_call(x):
    note(f"kid {x}")
    return x * 2


@stepstone.workflow("kid", version="1")
def kid(ctx, input):
    return ctx.step("double", kid_call, input["x"])


if mode == "sync":

    @stepstone.workflow("crash", version="1")
    def flow(ctx, input):
        if kind == "loop":
            return sum(ctx.step("iter", iteration, i)["i"] for i in range(60))
        if kind == "calls":
            return [ctx.step("call", plain, i) for i in range(5)]
        if kind == "gather":
            futures = [ctx.submit("tool", tool, i) for i in range(3)]
            return [future.result() for future in futures]
        if kind == "map":
            return ctx.map("kids", kid, [{"x": x} for x in range(3)])
        if kind == "doomed":
            try:
                return ctx.step("doomed", doomed, retry=DOOMED)
            except CallFailed as exc:
                return [exc.error_type, exc.attempt]
        first = ctx.step("call", plain, "a")
        got = ctx.wait_for("approve")
        return [first, got, ctx.step("call", plain, "b")]

else:

    @stepstone.workflow("crash", version="1")
    async def flow(ctx, input):
        if kind == "loop":
            total = 0
            for i in range(60):
                total += (await ctx.step("iter", iteration, i))["i"]
            return total
        if kind == "calls":
            return [await ctx.step("call", plain, i) for i in range(5)]
        if kind == "gather":
            return await asyncio.gather(*(ctx.step("tool", tool, i) for i in range(3)))
        if kind == "map":
            return await ctx.map("kids", kid, [{"x": x} for x in range(3)])
        if kind == "doomed":
            try:
                return await ctx.step("doomed", doomed, retry=DOOMED)
            except CallFailed as exc:
                return [exc.error_type, exc.attempt]
        first = await ctx.step("call", plain, "a")
        got = await ctx.wait_for("approve")
        return [first, got, await ctx.step("call", plain, "b")]


def drive(store):
    if mode == "sync":
        return run(run_id, flow, store, input={"kind": kind})
    return asyncio.run(arun(run_id, flow, store, input={"kind": kind}))


with open_store(config) as store:
    try:
        state = drive(store)
    except Suspended:
        if kind != "map":
            print(json.dumps("suspended"))
            sys.exit(0)
        for child in store.load(run_id).children:
            run(child, kid, store)  # what a worker serving ``kid`` does
        state = drive(store)
    print(json.dumps(state["result"]))
"""


def _child(
    config: str, side: Path, mode: str, kind: str, kill: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run the workflow in a fresh process (killing itself at ``kill``, if given)."""
    return subprocess.run(
        [sys.executable, "-c", CHILD, config, "r", str(side), mode, kind, kill],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _killed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -signals.SIGKILL, (done.returncode, done.stderr[-2000:])


def _result(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _starts(side: Path) -> Counter[str]:
    return Counter(side.read_text().splitlines())


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh durable store's config string (the server's backends skip if it is down)."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_in_a_loops_50th_call_reruns_that_call_alone(
    config: str, mode: str, tmp_path: Path
) -> None:
    """Killed inside iteration 49 of 60, a fresh process reruns it alone and finishes."""
    side = tmp_path / "starts.txt"
    _killed(_child(config, side, mode, "loop", kill="loop"))
    assert _starts(side) == Counter(f"iter {i}" for i in range(50))
    assert _result(_child(config, side, mode, "loop")) == sum(range(60))
    starts = _starts(side)
    assert starts["iter 49"] == 2
    assert all(starts[f"iter {i}"] == 1 for i in range(60) if i != 49), starts


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_between_a_call_and_its_entry_reruns_that_call_once(
    config: str, mode: str, tmp_path: Path
) -> None:
    """Killed after call 2 returned but before it was journaled: only call 2 runs again."""
    side = tmp_path / "starts.txt"
    _killed(_child(config, side, mode, "calls", kill="after_step"))
    with open_store(config) as store:
        cp = store.load("r")
        assert cp is not None and len(cp.state[JOURNAL_KEY]) == 2
    assert _result(_child(config, side, mode, "calls")) == list(range(5))
    assert _starts(side) == Counter(
        {"call 0": 1, "call 1": 1, "call 2": 2, "call 3": 1, "call 4": 1}
    )


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_inside_a_gather_reruns_only_the_unfinished_call(
    config: str, mode: str, tmp_path: Path
) -> None:
    """Killed while one of three parallel calls runs, only that one runs again.

    ``asyncio.gather`` in an async workflow, ``ctx.submit`` in a plain one.
    """
    side = tmp_path / "starts.txt"
    _killed(_child(config, side, mode, "gather", kill="gather"))
    with open_store(config) as store:
        cp = store.load("r")
        assert cp is not None
        assert sorted(e["call"] for e in cp.state[JOURNAL_KEY]) == ["tool#2", "tool#3"]
    assert _result(_child(config, side, mode, "gather")) == [0, 1, 2]
    assert _starts(side) == Counter({"tool 0": 2, "tool 1": 1, "tool 2": 1})


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_inside_wait_for_keeps_the_signal_for_the_next_process(
    config: str, mode: str, tmp_path: Path
) -> None:
    """Killed as ``wait_for`` takes its signal, the next process consumes it exactly once."""
    side = tmp_path / "starts.txt"
    assert _result(_child(config, side, mode, "wait")) == "suspended"
    with open_store(config) as store:
        assert signal(store, "r", "approve", {"ok": 1})
    _killed(_child(config, side, mode, "wait", kill="wait"))
    assert _result(_child(config, side, mode, "wait")) == ["a", {"ok": 1}, "b"]
    assert _starts(side) == Counter({"call a": 1, "call b": 1})
    with open_store(config) as store:
        cp = store.load("r")
        assert cp is not None and cp.status == "done" and cp.consumed == {"approve": 1}


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_while_map_makes_its_children_makes_each_child_once(
    config: str, mode: str, tmp_path: Path
) -> None:
    """Killed once ``ctx.map`` made a child, before the parent saved its wait: each child once."""
    side = tmp_path / "starts.txt"
    _killed(_child(config, side, mode, "map", kill="map"))
    with open_store(config) as store:
        assert store.load("r/@map:kids#1/0") is not None  # made, its parent not yet saved
        parent = store.load("r")
        # Not saved waiting; its children listed (a Map lists them before it makes them).
        assert parent is not None and parent.waiting_for is None
        assert parent.children == tuple(f"r/@map:kids#1/{n}" for n in range(3))
    assert _result(_child(config, side, mode, "map")) == [0, 2, 4]
    assert _starts(side) == Counter({"kid 0": 1, "kid 1": 1, "kid 2": 1})


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_that_kills_every_process_stops_after_its_attempts(
    config: str, mode: str, tmp_path: Path
) -> None:
    """Attempts are counted before they are made: a call killing each process stops at 2."""
    side = tmp_path / "starts.txt"
    _killed(_child(config, side, mode, "doomed"))
    _killed(_child(config, side, mode, "doomed"))
    assert _result(_child(config, side, mode, "doomed")) == ["AttemptsExhausted", 2]
    assert _starts(side) == Counter({"doomed": 2})
