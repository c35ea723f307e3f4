"""Flow control (issue 37): the cost of an acquisition, and a key's cost to a fleet.

    python benchmarks/flow_control.py [--runs 1000] [--backends memory,sqlite,file]
                                      [--fleet sqlite] [--processes 4]

1. **Acquire cost.** One acquire and its release of a key with a concurrency and a
   request rate, on each backend: microseconds, and store round trips (loads and
   saves) per pair, counted at the Store.
2. **A fleet through one key.** ``--runs`` runs of a one-step workflow (a 10 ms call)
   served by ``--processes`` worker processes (2 threads each), all holding a
   concurrency-8 key, against the same runs with no limit: the throughput ratio. The
   fleet has 8 threads in all, so the key never takes capacity the fleet has; the ratio
   is the price of the two compare-and-swaps and of parking and waking.
3. **A hot key.** The same with 8 processes and a concurrency-2 key: most runs park,
   and each release hands its slot to a waiter. With ``--hot-profile`` only this one,
   with where its round trips go: loads and saves per run (on the key's record and on
   the runs) and claim calls, counted at the store's methods in every process.

Prints one line per figure; ``docs/flow-control.md`` quotes a run of it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from stepstone import Limit, Step, Store, Worker, Workflow, open_store, set_limit, start
from stepstone._flow import _ops
from stepstone._flow._api import drive


class _Counting:
    """Counts the loads and saves a store is asked for."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.loads = 0
        self.saves = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def load(self, run_id: str) -> Any:
        self.loads += 1
        return self.store.load(run_id)

    def save(self, cp: Any) -> Any:
        self.saves += 1
        return self.store.save(cp)


def acquire_cost(config: str, n: int) -> tuple[float, float, float]:
    """Return (microseconds, loads, saves) per acquire + release pair."""
    with open_store(config) as store:
        set_limit(store, Limit("bench", concurrency=8, rpm=10**9))
        counting: Any = _Counting(store)
        for i in range(20):  # warm-up
            drive(counting, _ops.acquire("bench", f"w{i}", 1, 0))
            drive(counting, _ops.release("bench", f"w{i}", 1))
        counting.loads = counting.saves = 0
        times = []
        for i in range(n):
            began = time.perf_counter()
            drive(counting, _ops.acquire("bench", f"r{i}", 1, 0))
            drive(counting, _ops.release("bench", f"r{i}", 1))
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e6, counting.loads / n, counting.saves / n


def drop_tables(config: str) -> None:
    """Drop a server store's tables (the benchmark shares the servers with others)."""
    table = config.partition("table=")[2]
    if not table:
        return
    names = ", ".join(f"{table}{suffix}" for suffix in ("", "_meta", "_pieces"))
    if config.startswith("postgresql"):
        import psycopg

        with psycopg.connect(config.partition("?")[0], autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {names}")
    elif config.startswith("mysql"):
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", user="root", database="test")
        with conn.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {names}")
        conn.close()


def _call(state: dict[str, Any]) -> dict[str, Any]:
    threading.Event().wait(0.01)  # the model or API call the key protects
    return {"ok": True}


def _workflow(limited: bool, concurrency: int) -> Workflow:
    limits = [Limit("api", concurrency=concurrency)] if limited else []
    return Workflow(f"fleet-{limited}-{concurrency}", [Step("call", _call)], limits=limits)


_COUNTED = ("load", "save", "claimable", "claim_ready")


def _count_calls(store: Store, counts: dict[str, int]) -> None:
    """Count ``store``'s calls of ``_COUNTED`` into ``counts`` (loads and saves by kind)."""
    cls = type(store)
    for name in _COUNTED:
        method = getattr(cls, name, None)
        if method is None:
            continue

        def counted(self: Any, *args: Any, _m: Any = method, _n: str = name, **kw: Any) -> Any:
            key = _n
            if _n in ("load", "save"):
                run_id = str(args[0] if _n == "load" else args[0].run_id)
                key += ":limit" if run_id.startswith("~limit/") else ":run"
            counts[key] = counts.get(key, 0) + 1
            return _m(self, *args, **kw)

        setattr(cls, name, counted)


def _serve(
    config: str, limited: bool, concurrency: int, total: int, out: str | None = None
) -> None:
    store = open_store(config)
    counts: dict[str, int] = {}
    if out is not None:
        _count_calls(store, counts)
    worker = Worker(store, [_workflow(limited, concurrency)], concurrency=2, poll=0.05)
    thread = threading.Thread(target=worker.serve)
    thread.start()
    while store.count_by_status("run-").get("done", 0) < total:  # not ~limit/ records
        time.sleep(0.1)
    worker.stop()
    thread.join()
    if out is not None:
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(counts, fh)


def fleet(
    config: str, runs: int, processes: int, limited: bool, concurrency: int, profile: bool = False
) -> float:
    """Return runs per second of ``processes`` workers through the key (or none).

    ``profile``: print the store calls per run, summed over the processes.
    """
    prefix = uuid.uuid4().hex[:8]  # a server store may be shared by the three fleets
    with open_store(config) as store:
        flow = _workflow(limited, concurrency)
        done_before = store.count_by_status("run-").get("done", 0)
        for i in range(runs):
            start(store, flow, f"run-{prefix}-{i}")
    context = multiprocessing.get_context("spawn")
    began = time.perf_counter()
    outs = [
        f"{tempfile.gettempdir()}/hot-{prefix}-{i}.json" if profile else None
        for i in range(processes)
    ]
    procs = [
        context.Process(target=_serve, args=(config, limited, concurrency, done_before + runs, out))
        for out in outs
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    rate = runs / (time.perf_counter() - began)
    if profile:
        total: dict[str, int] = {}
        for out in outs:
            assert out is not None
            with open(out, encoding="utf-8") as fh:
                for key, n in json.load(fh).items():
                    total[key] = total.get(key, 0) + n
            os.unlink(out)
        print("per run: " + ", ".join(f"{k} {v / runs:.2f}" for k, v in sorted(total.items())))
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--acquires", type=int, default=500)
    parser.add_argument("--backends", default="memory,file,sqlite")
    parser.add_argument(
        "--fleet",
        default="sqlite",
        help="sqlite, or a server config string (its table is shared by the fleets; drop it)",
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hot-profile", action="store_true", help="only the hot key, with its store calls"
    )
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="flow-bench-")
    configs = {
        "memory": "memory://",
        "file": f"file://{directory}/runs",
        "sqlite": f"sqlite:///{directory}/cost.db",
        "postgresql": "postgresql://postgres@127.0.0.1:5432/test?table=flow_bench_"
        + uuid.uuid4().hex[:8],
        "mysql": "mysql://root@127.0.0.1:3306/test?table=flow_bench_" + uuid.uuid4().hex[:8],
    }
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    for backend in args.backends.split(","):
        try:
            micros, loads, saves = acquire_cost(configs[backend], args.acquires)
        finally:
            drop_tables(configs[backend])
        print(
            f"acquire+release {backend:<10} {micros:8.0f} us median  "
            f"{loads:.1f} loads + {saves:.1f} saves per pair"
        )
    if args.runs <= 0:
        return
    if args.hot_profile:
        hot = fleet(f"sqlite:///{directory}/hot.db", args.runs, 8, True, 2, profile=True)
        print(
            f"hot key: {args.runs} runs, 8 processes x 2 threads, concurrency 2: {hot:.1f} runs/s"
        )
        return

    def fresh() -> str:
        if args.fleet == "sqlite":
            return f"sqlite:///{directory}/fleet-{uuid.uuid4().hex[:8]}.db"
        return str(args.fleet)

    # Alternate the two, so that a machine getting busier or quieter favours neither.
    frees, helds = [], []
    for _ in range(args.rounds):
        frees.append(fleet(fresh(), args.runs, args.processes, False, 8))
        helds.append(fleet(fresh(), args.runs, args.processes, True, 8))
    free, held = statistics.median(frees), statistics.median(helds)
    print(
        f"fleet {args.runs} runs, {args.processes} processes x 2 threads, 10 ms step, "
        f"median of {args.rounds}: no limit {free:.0f} runs/s, concurrency-8 key "
        f"{held:.0f} runs/s, ratio {held / free:.2f}x "
        f"(rounds: {', '.join(f'{h / f:.2f}' for f, h in zip(frees, helds, strict=True))})"
    )
    hot = fleet(fresh(), args.runs, 8, True, 2)
    print(f"hot key: {args.runs} runs, 8 processes x 2 threads, concurrency 2: {hot:.0f} runs/s")


if __name__ == "__main__":
    main()
