"""Figure 5: throughput (steps/s) with 1, 2, 4 and 8 processes sharing one store.

Each process opens the store itself and drives its own runs (10 steps, ~1 KB state,
new run_id each) for a fixed window; all processes start each window together (a
barrier). Throughput = sum over processes of steps completed / that process's elapsed
time. Runs are deleted between windows, outside them. File and sqlite at default and
weaker durability; PostgreSQL and MySQL/MariaDB at the server's (a fresh table on the
loopback servers, shared by the processes and dropped afterwards; ``--no-sql`` skips
them; the servers' own processes share the same CPUs); memory cannot be shared between
processes.

    .venv/bin/python benchmarks/bench_processes.py [--quick] [--json] [--no-sql]
        [--procs 1,2,4,8]
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
import time
from typing import Any

from _common import (
    SQL_KINDS,
    emit,
    fig,
    parse_args,
    progress,
    scratch,
    settings,
    sql_config,
    table,
)

from stepstone import open_store, run
from stepstone._bench import BENCH_PREFIX, STEPS, Stats, machine_info, make_steps, state_of_size


def worker(
    config: str,
    wid: int,
    repeats: int,
    window_s: float,
    barrier: Any,
    results: Any,
) -> None:
    store = open_store(config)
    steps = make_steps(state_of_size(1024))
    try:
        run(f"{BENCH_PREFIX}procs/{wid}/warmup", steps, store)
        store.delete(f"{BENCH_PREFIX}procs/{wid}/warmup")
        n = 0
        for r in range(repeats):
            barrier.wait()
            done: list[str] = []
            t0 = time.perf_counter()
            end = t0 + window_s
            while time.perf_counter() < end:
                run_id = f"{BENCH_PREFIX}procs/{wid}/{n}"
                n += 1
                run(run_id, steps, store)
                done.append(run_id)
            elapsed = time.perf_counter() - t0
            results.put((r, wid, len(done) * STEPS, elapsed))
            barrier.wait()  # everyone is out of the window before anyone deletes
            for run_id in done:
                store.delete(run_id)
    except BaseException as exc:
        results.put(("error", wid, repr(exc), 0.0))
        barrier.abort()
        raise
    finally:
        store.close()


def measure(config: str, procs: int, repeats: int, window_s: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=worker, args=(config, w, repeats, window_s, barrier, results))
        for w in range(procs)
    ]
    for p in workers:
        p.start()
    per_repeat: dict[int, float] = {}
    per_proc: list[float] = []
    errors: list[str] = []
    for _ in range(repeats * procs):
        r, wid, steps, elapsed = results.get(timeout=120 + window_s * repeats)
        if r == "error":
            errors.append(f"worker {wid}: {steps}")
            break
        per_repeat[r] = per_repeat.get(r, 0.0) + steps / elapsed
        per_proc.append(steps / elapsed)
    for p in workers:
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
    if errors:
        return {"error": "; ".join(errors)}
    through = Stats.of(list(per_repeat.values()))
    return {
        "steps_per_s": through.to_json(1.0, 0),
        "per_process_steps_per_s": Stats.of(per_proc).to_json(1.0, 0),
    }


def main() -> None:
    procs_arg = None
    if "--procs" in sys.argv:
        at = sys.argv.index("--procs")
        procs_arg = sys.argv[at + 1]
        del sys.argv[at : at + 2]
    args = parse_args(__doc__ or "")
    repeats, window_s = settings(args, full=(3, 1.0), quick=(2, 0.5))
    counts = [int(x) for x in procs_arg.split(",")] if procs_arg else [1, 2, 4, 8]
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    with scratch("processes") as base, contextlib.ExitStack() as servers:
        machine = machine_info(str(base))
        configs = [
            ("file", "full (default)", f"file://{base}/file-full"),
            ("file", "none", f"file://{base}/file-none?durability=none"),
            ("sqlite", "full (default)", f"sqlite:///{base}/full.db"),
            ("sqlite", "normal", f"sqlite:///{base}/normal.db?synchronous=normal"),
        ]
        if args.no_sql:
            skipped.append("postgresql, mysql skipped: --no-sql")
        else:
            for kind in SQL_KINDS:
                config, why = servers.enter_context(sql_config(kind, "processes"))
                if config is None:
                    skipped.append(f"{kind} skipped: {why}")
                    progress(args, skipped[-1])
                else:
                    configs.append((kind, "server (default)", config))
        for backend, durability, config in configs:
            open_store(config).close()  # create it once, outside the timed windows
            for n in counts:
                progress(args, f"processes: {backend} durability={durability}, {n} processes ...")
                row = {"backend": backend, "durability": durability, "processes": n}
                row.update(measure(config, n, repeats, window_s))
                results.append(row)
        for r in results:
            one = next(
                x
                for x in results
                if x["backend"] == r["backend"]
                and x["durability"] == r["durability"]
                and x["processes"] == min(counts)
            )
            if "steps_per_s" in r and "steps_per_s" in one:
                r["speedup_vs_1"] = round(
                    r["steps_per_s"]["median"] / one["steps_per_s"]["median"], 2
                )
    rows = [
        [
            r["backend"],
            r["durability"],
            str(r["processes"]),
            fig(r.get("steps_per_s")) if "error" not in r else r["error"],
            f"{r.get('speedup_vs_1', 0):.2f}x",
            fig(r.get("per_process_steps_per_s")),
        ]
        for r in results
    ]
    text = "\n".join(
        [
            f"Figure 5: throughput with N processes on one store, {repeats} windows of "
            f"{window_s} s, steps/s, median [min-max]; {machine['nproc']} CPUs",
            "",
            table(["backend", "durability", "procs", "steps/s", "vs 1 proc", "per process"], rows),
            *skipped,
        ]
    )
    emit(
        args,
        {
            "figure": "processes",
            "machine": machine,
            "repeats": repeats,
            "window_s": window_s,
            "results": results,
            "skipped": skipped,
        },
        text,
    )


if __name__ == "__main__":
    main()
