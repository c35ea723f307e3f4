"""Chaos for code workflows: a generated ``@workflow`` function, killed between journal appends.

Each case ``(seed, case)`` is one run of a function that makes a loop of ``ctx.step``
calls, a group of parallel calls (``ctx.submit`` in a plain ``def``, ``asyncio.gather``
in an ``async def``), and, by the case's draw, a ``ctx.wait_for``, a ``ctx.sleep``, a
``ctx.map`` over children and ``ctx.now``/``ctx.uuid``/``ctx.random``. Fresh processes
(``python -m chaos code-child SPEC``) run it one after another, each reopening the store
from its config string; most die by SIGKILL at a planned point:

- ``code.inside``: inside a call, after its side effect was noted;
- ``runner.after_step``: a call returned, its entry not saved yet;
- ``runner.after_save``: an entry saved (the call is journaled);
- ``wait.consumed``: a signal chosen, not yet saved; ``map.child_created``: a child
  run made, its parent not yet saved waiting.

Between processes the driver does what the world would: sends the signal a waiting run
waits for, runs the children of a ``ctx.map`` to the end. What must hold at the end
(``check``): the run is done with the result a crash-free run computes; its journal
holds each call once, at its position, named as the function calls it; every call's
side effect happened, no call already journaled when a process started ran again in
that process, and the calls that ran more than once are no more than the deaths.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["CodeCase", "POINTS", "child_main", "make_case", "run_case"]

#: Where a process may be killed (see the module docstring).
POINTS = (
    "code.inside",
    "runner.after_step",
    "runner.after_save",
    "wait.consumed",
    "map.child_created",
)
#: Seconds a whole child process may take.
CHILD_TIMEOUT = 120.0
SRC = str(Path(__file__).resolve().parents[2] / "src")
TOOLS = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class CodeCase:
    """One generated code workflow run: what its function does, by the case's draw."""

    seed: int
    case: int
    mode: str  # "sync" (a def under run) or "async" (an async def under arun)
    loop: int  # calls in the loop
    parallel: int  # calls in the parallel group (0: none)
    wait: bool
    sleep: bool
    kids: int  # children of the ctx.map (0: no map)
    extras: bool  # ctx.now, ctx.uuid, ctx.random

    @property
    def run_id(self) -> str:
        return f"code-chaos/{self.seed}-{self.case}-{self.mode}"

    def calls(self) -> list[str]:
        """The journal names of the function's calls, in call order."""
        names = [f"loop#{i + 1}" for i in range(self.loop)]
        if self.extras:
            names += ["@now#1", "@uuid#1", "@random#1"]
        names += [f"tool#{i + 1}" for i in range(self.parallel)]
        if self.wait:
            names.append("@wait:go#1")
        if self.sleep:
            names.append("@sleep#1")
        if self.kids:
            names.append("@map:kids#1")
        return [*names, "end#1"]

    def result(self) -> list[Any]:
        """What a crash-free run returns (the journaled extras left out: they are random)."""
        loop = sum(_value(self.case, i) for i in range(self.loop))
        tools = [_value(self.case, 100 + i) for i in range(self.parallel)]
        kids = [2 * k for k in range(self.kids)]
        waited = {"go": self.case} if self.wait else None
        return [loop, tools, waited, kids, _value(self.case, 999)]


def make_case(seed: int, case: int, mode: str) -> CodeCase:
    """Return case ``case`` of ``seed``: the same in every process."""
    rng = random.Random(f"stepstone-code-chaos:{seed}:{case}")
    return CodeCase(
        seed=seed,
        case=case,
        mode=mode,
        loop=rng.randint(1, 30),
        parallel=rng.choice((0, 2, 3)),
        wait=rng.random() < 0.5,
        sleep=rng.random() < 0.3,
        kids=rng.choice((0, 0, 2, 3)),
        extras=rng.random() < 0.5,
    )


def _value(case: int, i: int) -> int:
    return (case * 7919 + i * 104_729) % 1_000_003


# --- the child process -----------------------------------------------------------------


def _note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def child_main(spec: dict[str, Any]) -> int:  # noqa: C901 - the case's calls, top to bottom
    """Run the case's function in this process, dying where ``spec["kill"]`` says."""
    import stepstone  # noqa: PLC0415 - imported in the child only
    from stepstone import Suspended, _hooks, open_store  # noqa: PLC0415

    case = CodeCase(**spec["case"])
    effects, proc = spec["effects"], spec["proc"]
    kill = spec.get("kill")
    seen: Counter[str] = Counter()

    def hook(point: str) -> None:
        if kill is not None and point == kill["point"]:
            seen[point] += 1
            if seen[point] == kill["nth"]:
                os.kill(os.getpid(), signal.SIGKILL)

    _hooks.install(hook)

    def effect(name: str, i: int) -> int:
        call = stepstone.current_call()
        assert call is not None
        _note(effects, f"{proc} {call.run_id} {call.step_name}")
        hook("code.inside")
        return _value(case.case, i) if name != "kid" else 2 * i

    @stepstone.workflow("code-chaos-kid")
    def kid(ctx: Any, input: dict[str, Any]) -> int:
        return int(ctx.step("double", effect, "kid", input["k"]))

    def plain(ctx: Any, input: dict[str, Any]) -> list[Any]:
        loop = sum(ctx.step("loop", effect, "loop", i) for i in range(case.loop))
        if case.extras:
            ctx.now(), ctx.uuid(), ctx.random()
        futures = [ctx.submit("tool", effect, "tool", 100 + i) for i in range(case.parallel)]
        tools = [f.result() for f in futures]
        waited = ctx.wait_for("go") if case.wait else None
        if case.sleep:
            ctx.sleep(0.2)
        kids = ctx.map("kids", kid, [{"k": k} for k in range(case.kids)]) if case.kids else []
        return [loop, tools, waited, kids, ctx.step("end", effect, "end", 999)]

    async def coroutine(ctx: Any, input: dict[str, Any]) -> list[Any]:
        loop = 0
        for i in range(case.loop):
            loop += await ctx.step("loop", effect, "loop", i)
        if case.extras:
            await ctx.now(), await ctx.uuid(), await ctx.random()
        calls = [ctx.step("tool", effect, "tool", 100 + i) for i in range(case.parallel)]
        tools = list(await asyncio.gather(*calls))
        waited = (await ctx.wait_for("go")) if case.wait else None
        if case.sleep:
            await ctx.sleep(0.2)
        kids = []
        if case.kids:
            kids = await ctx.map("kids", kid, [{"k": k} for k in range(case.kids)])
        return [loop, tools, waited, kids, await ctx.step("end", effect, "end", 999)]

    flow = stepstone.workflow("code-chaos")(plain if case.mode == "sync" else coroutine)
    with open_store(spec["config"]) as store:
        try:
            if case.mode == "sync":
                state = stepstone.run(case.run_id, flow, store, lease=spec["lease"])
            else:
                state = asyncio.run(stepstone.arun(case.run_id, flow, store, lease=spec["lease"]))
        except Suspended:
            cp = store.load(case.run_id)
            assert cp is not None
            for child in cp.children:  # what a worker serving the children does
                stepstone.run(child, kid, store, lease=spec["lease"])
            print(json.dumps({"suspended": cp.waiting_for}))
            return 0
    print(json.dumps({"result": state["result"]}))
    return 0


# --- the driver ------------------------------------------------------------------------


def _spawn(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TOOLS])}
    return subprocess.run(
        [sys.executable, "-m", "chaos", "code-child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )


def _journaled(store: Any, run_id: str) -> list[str]:
    cp = store.load(run_id)
    journal = [] if cp is None else cp.state.get("~journal", [])
    return [entry["call"] for entry in journal]


def run_case(
    config: str, seed: int, case: int, mode: str, workdir: str, max_deaths: int = 4
) -> tuple[list[str], dict[str, int]]:
    """Run one case to the end through kills; return (violations, figures)."""
    from stepstone import open_store  # noqa: PLC0415 - the driver's own handle
    from stepstone import signal as send  # noqa: PLC0415
    from stepstone._checkpoint import utcnow  # noqa: PLC0415

    spec_case = make_case(seed, case, mode)
    rng = random.Random(f"stepstone-code-chaos:{seed}:{case}:kills")
    effects = os.path.join(workdir, f"code-effects-{seed}-{case}-{mode}.log")
    bad: list[str] = []
    deaths = processes = 0
    before: dict[int, set[str]] = {}  # proc -> calls journaled when it started
    result: Any = None
    with open_store(config) as store:
        for proc in range(max_deaths + 12):
            cp = store.load(spec_case.run_id)
            if cp is not None and cp.waiting_for == "signal go":
                send(store, spec_case.run_id, "go", {"go": case}, signal_id="go")
            if cp is not None and cp.wake_at is not None and cp.waiting_for == "timer":
                time.sleep(max(0.0, (cp.wake_at - utcnow()).total_seconds()) + 0.01)
            before[proc] = set(_journaled(store, spec_case.run_id))
            kill = None
            if deaths < max_deaths and rng.random() < 0.75:
                kill = {"point": rng.choice(POINTS), "nth": rng.randint(1, 4)}
            spec = {
                "case": asdict(spec_case),
                "config": config,
                "effects": effects,
                "proc": proc,
                "kill": kill,
                "lease": 0.5,
            }
            done = _spawn(spec)
            processes += 1
            if done.returncode == -signal.SIGKILL:
                deaths += 1
                continue
            if done.returncode != 0:
                bad.append(f"case {case}: process {proc} failed: {done.stderr[-1500:]}")
                break
            said = json.loads(done.stdout.strip().splitlines()[-1])
            if "result" in said:
                result = said["result"]
                break
        else:
            bad.append(f"case {case}: not done after {processes} processes")
    bad += check(config, spec_case, result, effects, before, deaths)
    return bad, {"processes": processes, "deaths": deaths, "calls": len(spec_case.calls())}


def check(
    config: str,
    case: CodeCase,
    result: Any,
    effects: str,
    before: dict[int, set[str]],
    deaths: int,
) -> list[str]:
    """What must hold once the case's run is done (see the module docstring)."""
    from stepstone import open_store  # noqa: PLC0415

    bad: list[str] = []
    where = f"case {case.case} ({case.mode}, run {case.run_id!r})"
    if result != case.result():
        bad.append(f"{where}: returned {result!r}, a crash-free run returns {case.result()!r}")
    with open_store(config) as store:
        cp = store.load(case.run_id)
        if cp is None or cp.status != "done":
            return [*bad, f"{where}: the run is {None if cp is None else cp.status}, not done"]
        journal = cp.state.get("~journal", [])
        seqs = sorted(entry["seq"] for entry in journal)
        if seqs != list(range(len(case.calls()))):
            bad.append(f"{where}: journal positions {seqs} are not each call once")
        named = [entry["call"] for entry in sorted(journal, key=lambda e: e["seq"])]
        if named != case.calls():
            bad.append(f"{where}: journal {named} is not the function's calls {case.calls()}")
    lines = Path(effects).read_text().splitlines() if os.path.exists(effects) else []
    ran: Counter[tuple[str, str]] = Counter()
    for line in lines:
        proc, run_id, call = line.split(" ", 2)
        ran[(run_id, call)] += 1
        if run_id == case.run_id and call in before.get(int(proc), set()):
            bad.append(f"{where}: {call} ran in process {proc}, which started with it journaled")
    mine = [c for c in case.calls() if not c.startswith("@")]
    missing = [c for c in mine if ran[(case.run_id, c)] == 0]
    if missing:
        bad.append(f"{where}: no side effect for calls {missing}")
    kids = [f"{case.run_id}/@map:kids#1/{k}" for k in range(case.kids)]
    missing_kids = [k for k in kids if ran[(k, "double#1")] == 0]
    if missing_kids:
        bad.append(f"{where}: no side effect for children {missing_kids}")
    repeats = sum(n - 1 for n in ran.values() if n > 1)
    if repeats > deaths:
        bad.append(f"{where}: {repeats} calls ran again, but only {deaths} processes died")
    return bad
