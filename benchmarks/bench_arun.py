"""Instructions per step of ``arun`` next to ``run``, counted by callgrind.

    python benchmarks/bench_arun.py [--stores memory,sqlite,file] [--steps 10,100]
        [--n 20] [--json]

Each (store, steps, driver) is run under ``valgrind --tool=callgrind`` twice, with N and
2N runs of that many steps after the same warm-up; (count(2N) - count(N)) / (N * steps)
is the cost of one step, start-up and imports cancelling out (as ``callgrind.sh`` does).
``run`` calls plain step functions, ``arun`` the same steps as ``async def`` functions
that await nothing, so the difference is the drivers' own. The ratio arun/run is the
figure (issue 20: at most 1.3x on the memory store); sqlite and file are for
information (their saves go to a thread under ``arun``). ``PYTHONHASHSEED=0`` keeps
the counts repeatable. Needs valgrind (``apt-get install valgrind``).

``--child DRIVER STORE STEPS N DIR`` is the measured process itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from _common import callgrind_count

from stepstone import Step, arun, open_store, run
from stepstone._bench_workload import make_steps, state_of_size

HERE = Path(__file__).resolve().parent
WARMUP = 20


def _async_of(steps: list[Step]) -> list[Step]:
    """The same steps as ``async def`` functions that await nothing."""

    def wrap(step: Step) -> Step:
        fn = step.fn

        async def call(state: dict[str, Any]) -> Any:
            return fn(state)

        return Step(step.name, call)

    return [wrap(step) for step in steps]


def _config(store: str, directory: str) -> str:
    return {
        "memory": "memory://",
        "sqlite": f"sqlite:///{directory}/arun.db?synchronous=full",
        "file": f"file://{directory}/arun-file",
    }[store]


def child(driver: str, store_name: str, count: int, n: int, directory: str) -> None:
    """Do WARMUP + n runs of ``count`` steps with ``driver`` on a new store."""
    steps = make_steps(state_of_size(1024), count)
    store = open_store(_config(store_name, directory))
    total = WARMUP + n
    if driver == "run":
        for i in range(total):
            run(f"cg-{i}", steps, store)
    else:
        async_steps = _async_of(steps)

        async def go() -> None:
            for i in range(total):
                await arun(f"cg-{i}", async_steps, store)

        asyncio.run(go())
    store.close()


def _count(driver: str, store: str, steps: int, n: int) -> int:
    directory = tempfile.mkdtemp(dir=HERE / ".tmp")
    try:
        return callgrind_count([__file__, "--child", driver, store, str(steps), str(n), directory])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def per_step(driver: str, store: str, steps: int, n: int) -> int:
    """Instructions per step: (count(2N runs) - count(N runs)) / (N * steps)."""
    return (_count(driver, store, steps, 2 * n) - _count(driver, store, steps, n)) // (n * steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="memory,sqlite,file")
    parser.add_argument("--steps", default="10,100")
    parser.add_argument("--n", type=int, default=20, help="runs in the shorter process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=5, metavar=("DRIVER", "STORE", "STEPS", "N", "DIR"))
    args = parser.parse_args()
    if args.child:
        driver, store, steps, n, directory = args.child
        child(driver, store, int(steps), int(n), directory)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (apt-get install valgrind)")
    (HERE / ".tmp").mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    for store in args.stores.split(","):
        for steps in (int(s) for s in args.steps.split(",")):
            # Fewer runs of 100 steps: the same number of steps per process.
            n = max(2, args.n * 10 // steps)
            sync = per_step("run", store, steps, n)
            asynchronous = per_step("arun", store, steps, n)
            row = {"store": store, "steps": steps, "run": sync, "arun": asynchronous}
            row["ratio"] = round(asynchronous / sync, 2)
            rows.append(row)
            if not args.json:
                print(
                    f"{store:7} {steps:4} steps: run {sync:9,} arun {asynchronous:9,} "
                    f"instructions per step, arun/run {row['ratio']:.2f}x",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"figure": "arun-callgrind", "rows": rows}))


if __name__ == "__main__":
    main()
