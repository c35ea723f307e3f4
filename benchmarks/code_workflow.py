"""Per-call cost of a code workflow's journal next to a step list's per-step cost.

    python benchmarks/code_workflow.py [--calls 200] [--repeats 5] [--store sqlite]
        [--payload 100] [--callgrind] [--json]

One process, one store: a ``@stepstone.workflow`` whose loop makes ``--calls``
``ctx.step`` calls, and a ``Workflow`` of as many ``Step``s doing the same work (each
call returns ~120 bytes, or ~20 more than ``--payload`` characters; the step list
merges each under a key of its own, so both states grow alike). Both are run
``--repeats`` times, interleaved, each under a fresh run_id; the figure is the median
wall time per call (or step), and their ratio. The same for ``arun`` (an ``async def``
workflow next to ``async def`` steps). Then the cost of a replay: resuming a run whose
journal already answers every call (its function re-runs, answered from the journal),
per call.

``--callgrind`` counts instructions instead (valgrind's callgrind, ``PYTHONHASHSEED=0``):
each workload runs once with N and once with 2N calls after the same warm-up, and
(count(2N) - count(N)) / N is one call's cost, start-up cancelling out. The counts do
not depend on the machine's load, but they miss what threads cost in waiting (a plain
workflow's function runs in a thread of its own: each call is two hand-overs).
Without it the figures are wall time: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _common import callgrind_count

import stepstone
from stepstone import Step, Store, Workflow, arun, open_store, run

#: Each call's result carries this many characters (``--payload``; children read it back).
PAYLOAD = "x" * int(os.environ.get("STEPSTONE_BENCH_PAYLOAD", "100"))


def work(i: int) -> dict[str, Any]:
    """One call's work: nothing but a result of ~120 bytes."""
    return {"i": i, "text": PAYLOAD}


async def awork(i: int) -> dict[str, Any]:
    """``work`` as an ``async def`` (awaiting nothing), for the async workloads."""
    return work(i)


def flows(calls: int) -> dict[str, Any]:
    """The four workloads: code and list, sync and async."""

    @stepstone.workflow("bench-code")
    def code(ctx: stepstone.WorkflowContext, input: dict[str, Any]) -> int:
        return sum(ctx.step("call", work, i)["i"] for i in range(calls))

    @stepstone.workflow("bench-acode")
    async def acode(ctx: stepstone.AsyncWorkflowContext, input: dict[str, Any]) -> int:
        total = 0
        for i in range(calls):
            total += (await ctx.step("call", awork, i))["i"]
        return total

    def step(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda state: {f"r{i}": work(i)}

    def astep(i: int) -> Callable[[dict[str, Any]], Any]:
        async def call(state: dict[str, Any]) -> dict[str, Any]:
            return {f"r{i}": await awork(i)}

        return call

    steps = Workflow("bench-list", [Step(f"s{i}", step(i)) for i in range(calls)])
    asteps = Workflow("bench-alist", [Step(f"s{i}", astep(i)) for i in range(calls)])
    return {"code": code, "list": steps, "acode": acode, "alist": asteps}


def timed(store: Store, kind: str, flow: Any, run_id: str) -> float:
    """Run ``flow`` once under a fresh run_id; return the seconds it took."""
    began = time.perf_counter()
    if kind.startswith("a"):
        asyncio.run(arun(run_id, flow, store))
    else:
        run(run_id, flow, store)
    return time.perf_counter() - began


def _store_config(store: str, directory: str) -> str:
    return {
        "sqlite": f"sqlite:///{directory}/bench.db",
        "memory": "memory://bench-code",
        "file": f"file://{directory}/runs",
    }[store]


def child(kind: str, store: str, calls: int) -> None:
    """The process callgrind measures: one run of ``kind`` with ``calls`` calls, warmed up."""
    with (
        tempfile.TemporaryDirectory() as directory,
        open_store(_store_config(store, directory)) as opened,
    ):
        timed(opened, kind, flows(5)[kind], "warm")  # imports, tables, threads
        timed(opened, kind, flows(calls)[kind], "measured")


def instructions(store: str, calls: int) -> dict[str, float]:
    """Instructions per call (or step) of each workload: (count(2N) - count(N)) / N."""
    per: dict[str, float] = {}
    for kind in ("code", "list", "acode", "alist"):
        counts = [
            callgrind_count([__file__, "--child", kind, store, str(n)]) for n in (calls, 2 * calls)
        ]
        per[kind] = (counts[1] - counts[0]) / calls
    return per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "memory", "file"])
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "STORE", "CALLS"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--payload", type=int, help="characters in each call's result")
    args = parser.parse_args()
    if args.payload is not None:
        os.environ["STEPSTONE_BENCH_PAYLOAD"] = str(args.payload)  # for the children
        global PAYLOAD  # noqa: PLW0603 - the workloads of this process read it
        PAYLOAD = "x" * args.payload
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    if args.callgrind:
        counted = instructions(args.store, args.calls)
        figures = {
            "store": args.store,
            "calls": args.calls,
            "instructions_per_call": {kind: round(value) for kind, value in counted.items()},
            "ratio_sync": round(counted["code"] / counted["list"], 3),
            "ratio_async": round(counted["acode"] / counted["alist"], 3),
        }
        if args.json:
            print(json.dumps(figures))
            return
        print(f"instructions per call from {args.calls} to {2 * args.calls} calls on {args.store}:")
        for mode, code, steps in (("run ", "code", "list"), ("arun", "acode", "alist")):
            print(
                f"  {mode}: code workflow {counted[code]:12,.0f}   step list "
                f"{counted[steps]:12,.0f}   ratio {counted[code] / counted[steps]:.2f}x"
            )
        return
    with (
        tempfile.TemporaryDirectory() as directory,
        open_store(_store_config(args.store, directory)) as store,
    ):
        workloads = flows(args.calls)
        times: dict[str, list[float]] = {kind: [] for kind in workloads}
        for kind, flow in workloads.items():  # warm-up: imports, tables, caches
            timed(store, kind, flow, f"warm-{kind}")
        for repeat in range(args.repeats):
            for kind, flow in workloads.items():
                times[kind].append(timed(store, kind, flow, f"{kind}-{repeat}"))
        replays = [replay(store, args.calls, f"replay-{n}") for n in range(args.repeats)]
    per = {kind: statistics.median(values) / args.calls * 1e6 for kind, values in times.items()}
    figures = {
        "store": args.store,
        "calls": args.calls,
        "us_per_call": {kind: round(value, 1) for kind, value in per.items()},
        "ratio_sync": round(per["code"] / per["list"], 3),
        "ratio_async": round(per["acode"] / per["alist"], 3),
        "replay_us_per_call": round(min(replays) / args.calls * 1e6, 2),
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{args.calls} calls on {args.store}, median of {args.repeats} runs each:")
    print(
        f"  run : code workflow {per['code']:8.1f} us/call   step list {per['list']:8.1f} us/step"
        f"   ratio {figures['ratio_sync']:.2f}x"
    )
    print(
        f"  arun: code workflow {per['acode']:8.1f} us/call   step list {per['alist']:8.1f} us/step"
        f"   ratio {figures['ratio_async']:.2f}x"
    )
    print(f"  replay of a finished journal: {figures['replay_us_per_call']:.2f} us/call")


def replay(store: Store, calls: int, run_id: str) -> float:
    """Seconds to resume a run whose journal answers ``calls`` calls, then a signal.

    The resume claims the run, re-runs the function (the journal answers every call),
    consumes the signal and finishes: two saves besides the claim.
    """

    @stepstone.workflow("bench-replay")
    def waiting(ctx: stepstone.WorkflowContext, input: dict[str, Any]) -> int:
        total: int = sum(ctx.step("call", work, i)["i"] for i in range(calls))
        return total + int(ctx.wait_for("go"))

    with contextlib.suppress(stepstone.Suspended):
        run(run_id, waiting, store)
    stepstone.signal(store, run_id, "go", 1)
    began = time.perf_counter()
    run(run_id, waiting, store)
    return time.perf_counter() - began


if __name__ == "__main__":
    main()
