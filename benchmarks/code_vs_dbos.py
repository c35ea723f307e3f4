"""A 500-call agent loop: stepstone's ``@workflow`` next to a step list and to DBOS.

    python benchmarks/code_vs_dbos.py [--calls 500] [--sizes 50,100,200,500,1000]
        [--backends sqlite,postgresql] [--repeats 3] [--json]

The loop makes ``--calls`` calls, each returning ~2 KB (a dict with a 2,000-character
string), as an agent's model and tool calls do. Three systems, each in a process of its
own per backend (DBOS is a singleton per process), on the same database:

- ``code``: a ``@stepstone.workflow`` plain ``def`` whose loop calls ``ctx.step``;
- ``list``: a stepstone ``Workflow`` of as many ``Step``s (each merges its result under a
  key of its own, so both states grow alike): the 1.3x budget of issue 31 is per call
  of ``code`` over per step of ``list``;
- ``dbos``: DBOS Transact's ``@DBOS.workflow`` calling a ``@DBOS.step`` (its defaults:
  results pickled into its system database), on SQLite and on PostgreSQL (a database
  of its own, named by a uuid, dropped after).

Figures: per call, the median over ``--repeats`` runs of the wall time and of this
process's CPU time (``time.process_time``: all of SQLite's work, only the client's side
of PostgreSQL's); and the growth exponent over ``--sizes``: the slope of log(time of a
run) against log(calls), 1.0 for a cost per call that does not grow with the run.
Wall time depends on the machine's load; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PAYLOAD = "x" * 2000
POSTGRES = "postgresql://postgres@127.0.0.1:5432"
SYSTEMS = ("code", "list", "dbos")


def work(i: int) -> dict[str, Any]:
    """One call's work: nothing but a result of ~2 KB."""
    return {"i": i, "text": PAYLOAD}


# --- one system in one process -----------------------------------------------------------


@contextmanager
def _postgres_database() -> Iterator[str]:
    """A new PostgreSQL database named by a uuid, dropped after: its URL."""
    import psycopg

    name = f"bench_{uuid.uuid4().hex}"
    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _stepstone_runner(system: str, config: str) -> tuple[Callable[[str, int], Any], Any]:
    import stepstone

    store = stepstone.open_store(config)

    def loop(ctx: stepstone.WorkflowContext, input: dict[str, Any]) -> int:
        return sum(ctx.step("call", work, i)["i"] for i in range(input["n"]))

    code = stepstone.workflow("bench-code")(loop)

    def step(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda state: {f"r{i}": work(i)}

    def go(run_id: str, n: int) -> Any:
        if system == "code":
            return stepstone.run(run_id, code, store, input={"n": n})
        steps = stepstone.Workflow(
            "bench-list", [stepstone.Step(f"s{i}", step(i)) for i in range(n)]
        )
        return stepstone.run(run_id, steps, store)

    return go, store.close


def _dbos_runner(url: str) -> tuple[Callable[[str, int], Any], Any]:
    from dbos import DBOS, SetWorkflowID  # type: ignore[import-not-found, unused-ignore]

    @DBOS.step()  # type: ignore[untyped-decorator, unused-ignore]
    def call(i: int) -> dict[str, Any]:
        return work(i)

    @DBOS.workflow()  # type: ignore[untyped-decorator, unused-ignore]
    def loop(n: int) -> int:
        return sum(call(i)["i"] for i in range(n))

    DBOS(config={"name": "bench-dbos", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()

    def go(run_id: str, n: int) -> Any:
        with SetWorkflowID(run_id):
            return loop(n)

    return go, DBOS.destroy


def child(system: str, backend: str, sizes: list[int], repeats: int) -> dict[str, Any]:
    """Measure one system on one backend in this process: {size: [(wall, cpu), ...]}."""
    with tempfile.TemporaryDirectory() as directory, contextlib_for(backend) as database:
        if system == "dbos":
            url = f"sqlite:///{directory}/dbos.sqlite" if backend == "sqlite" else database
            go, close = _dbos_runner(url)
        else:
            if backend == "sqlite":
                config = f"sqlite:///{directory}/bench.db"
            else:
                config = f"{database}?table=t_{uuid.uuid4().hex}"
            go, close = _stepstone_runner(system, config)
        try:
            go(f"warm-{uuid.uuid4().hex}", 5)  # imports, tables, threads
            out: dict[str, Any] = {}
            for n in sizes:
                samples = []
                for _ in range(repeats):
                    wall, cpu = time.perf_counter(), time.process_time()
                    go(f"run-{uuid.uuid4().hex}", n)
                    samples.append((time.perf_counter() - wall, time.process_time() - cpu))
                out[str(n)] = samples
            return out
        finally:
            close()


@contextmanager
def contextlib_for(backend: str) -> Iterator[str]:
    """A fresh PostgreSQL database for ``postgresql``; nothing for ``sqlite``."""
    if backend == "postgresql":
        with _postgres_database() as url:
            yield url
    else:
        yield ""


# --- the driver -------------------------------------------------------------------------


def _exponent(points: dict[int, float]) -> float:
    """The least-squares slope of log(seconds) against log(calls)."""
    xs = [math.log(n) for n in points]
    ys = [math.log(t) for t in points.values()]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def measure(system: str, backend: str, sizes: list[int], repeats: int) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            system,
            backend,
            ",".join(map(str, sizes)),
            str(repeats),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    wall = {int(n): statistics.median(s[0] for s in v) for n, v in raw.items()}
    cpu = {int(n): statistics.median(s[1] for s in v) for n, v in raw.items()}
    return {
        "wall_us_per_call": {n: 1e6 * t / n for n, t in wall.items()},
        "cpu_us_per_call": {n: 1e6 * t / n for n, t in cpu.items()},
        "wall_exponent": _exponent(wall),
        "cpu_exponent": _exponent(cpu),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--sizes", default="50,100,200,500,1000")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=4, metavar=("SYSTEM", "BACKEND", "SIZES", "REPEATS"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.child:
        system, backend, sizes, repeats = args.child
        result = child(system, backend, [int(s) for s in sizes.split(",")], int(repeats))
        print(json.dumps(result))
        return
    sizes = sorted({*(int(s) for s in args.sizes.split(",")), args.calls})
    figures: dict[str, dict[str, Any]] = {}
    for backend in args.backends.split(","):
        for system in args.systems.split(","):
            figures[f"{system}/{backend}"] = measure(system, backend, sizes, args.repeats)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    n = args.calls
    print(f"{n} calls of ~2 KB each, median of {args.repeats} runs; growth over {sizes}:")
    for backend in args.backends.split(","):
        base = figures.get(f"list/{backend}", {}).get("cpu_us_per_call", {}).get(n)
        for system in args.systems.split(","):
            got = figures[f"{system}/{backend}"]
            if "error" in got:
                print(f"  {backend:<10} {system:<5} failed: {got['error']}")
                continue
            wall, cpu = got["wall_us_per_call"][n], got["cpu_us_per_call"][n]
            ratio = f"  {cpu / base:.2f}x list (CPU)" if base else ""
            print(
                f"  {backend:<10} {system:<5} {wall:8.0f} us/call wall {cpu:8.0f} us/call CPU"
                f"   growth n^{got['wall_exponent']:.2f} wall,"
                f" n^{got['cpu_exponent']:.2f} CPU{ratio}"
            )


if __name__ == "__main__":
    main()
