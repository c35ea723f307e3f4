"""Claims in one call (issue 20): loads per claim across worker processes, and instructions.

    python benchmarks/bench_claims.py [--runs 400] [--n 40] [--no-sql] [--no-callgrind]
        [--json]

1. **Loads per successful claim**: RUNS queued runs of a one-step workflow, drained by
   1 and by 4 worker processes (``Worker``, concurrency 4, poll 0.02 s) on SQLite and
   on PostgreSQL; each process counts its ``Store.load`` calls and the runs it
   finished. ``one call`` is the store as shipped (``claims_in_one_call``); ``per run``
   the same store with the capability switched off on the instance (load and save each
   run, as before). Target: at most 1.2 with 4 processes. Also on MySQL/MariaDB
   (``STEPSTONE_BENCH_MYSQL``), unless ``--no-sql``.
2. **Instructions per run** (callgrind, like ``bench_arun.py``): a worker at
   concurrency 1 draining N queued runs of a 10-step workflow, against a loop of N
   ``run`` calls of the same steps, on the same SQLite store (``synchronous=normal``).
   ``worker`` counts the worker alone (the runs were queued before), ``start+worker``
   also the ``start`` calls. (count(2N) - count(N)) / N per run: start-up and warm-up
   cancel out. ``worker, listener open``: the same once the worker has gone idle once
   and opened its listener (``cg_listening``), which it keeps. Target: worker at most
   1.2x the ``run`` loop, with and without the listener. Needs valgrind.

3. **Throughput** (PostgreSQL): RUNS queued runs of the 10-step workflow drained by 4
   worker processes, and by 1, each at concurrency 1: runs per second from the first
   process's start of ``serve`` to the driver seeing every run done (it alone counts
   them, every 10 ms, whatever the number of processes), and the ratio.
   Target: 4 processes at least 2x one. ``--no-throughput`` skips it.

``--child ...`` is a measured process itself. Absolute times are not printed: only
counts and ratios, which do not move with the machine's load (figure 3's runs per
second do; its ratio is the figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import callgrind_count

from stepstone import Step, Store, Worker, Workflow, open_store, run, start
from stepstone._bench_workload import make_steps, state_of_size
from stepstone.testing import kill_point

HERE = Path(__file__).resolve().parent
POSTGRES = os.environ.get("STEPSTONE_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL = os.environ.get("STEPSTONE_BENCH_MYSQL", "mysql://root@127.0.0.1:3306/test")
WARMUP = 5


def _one_step() -> Workflow:
    return Workflow("bench", [Step("work", lambda state: {"ok": True})], version="1")


def _ten_steps() -> Workflow:
    return Workflow("bench10", make_steps(state_of_size(1024)), version="1")


def _counting(store: Store) -> list[int]:
    cell = [0]
    load = store.load

    def counted(run_id: str) -> Any:
        cell[0] += 1
        return load(run_id)

    store.load = counted  # type: ignore[method-assign]
    return cell


def loads_child(config: str, runs: int, one_call: bool, out: str) -> None:
    """One worker process: serve until every run is done; write its loads and runs."""
    store = open_store(config)
    if not one_call:
        setattr(store, "claims_in_one_call", False)  # noqa: B010 - on the instance only
    loads = _counting(store)
    worker = Worker(store, [_one_step()], concurrency=4, poll=0.02)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    with open_store(config) as probe:
        deadline = time.monotonic() + 600
        while probe.count_by_status()["done"] < runs and time.monotonic() < deadline:
            time.sleep(0.05)
    worker.stop()
    thread.join(60)
    store.close()
    Path(out).write_text(json.dumps({"loads": loads[0], "runs": worker.completed}))


def loads_per_claim(config: str, runs: int, processes: int, one_call: bool) -> float:
    """Drain ``runs`` queued runs with ``processes`` workers; return loads per run claimed."""
    with open_store(config) as store:
        for index in range(runs):
            start(store, _one_step(), f"b{index}")
    directory = Path(tempfile.mkdtemp(dir=HERE / ".tmp"))
    try:
        outs = [directory / f"{i}.json" for i in range(processes)]
        argv = [__file__, "--child", "loads", config, str(runs), str(int(one_call))]
        procs = [subprocess.Popen([sys.executable, *argv, str(out)]) for out in outs]
        for proc in procs:
            if proc.wait(timeout=900) != 0:
                raise SystemExit(f"a worker process failed: exit {proc.returncode}")
        results = [json.loads(out.read_text()) for out in outs]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    claimed: int = sum(r["runs"] for r in results)
    loads: int = sum(r["loads"] for r in results)
    return loads / max(claimed, 1)


def rate_child(config: str, runs: int, concurrency: int, out: str) -> None:
    """One worker process of figure 3: serve until every run is done; write its times."""
    store = open_store(config)
    worker = Worker(store, [_ten_steps()], concurrency=concurrency, poll=0.02)
    thread = threading.Thread(target=worker.serve, daemon=True)
    # Every process set up before any serves: start-up is not in the figure.
    Path(f"{out}.ready").touch()
    go, done = Path(out).with_name("go"), Path(out).with_name("done")
    while not go.exists():
        time.sleep(0.005)
    began = time.time()  # wall clock: compared across processes
    cpu = time.process_time()
    thread.start()
    # The driver (``runs_per_second``) counts the runs done, once for all processes:
    # a count by each process every 10 ms was 4x the queries at 4 processes, on the
    # server whose CPU the figure is about (a 2-core machine runs at ~1.8 cores there).
    deadline = time.monotonic() + 600
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    cpu = time.process_time() - cpu
    worker.stop()
    thread.join(60)
    store.close()
    result = {"runs": worker.completed, "began": began, "cpu": cpu}
    Path(out).write_text(json.dumps(result))


def runs_per_second(config: str, runs: int, processes: int) -> tuple[float, float]:
    """Drain ``runs`` queued 10-step runs with ``processes`` workers at concurrency 1.

    Returns runs per second and the workers' CPU in cores (CPU seconds per second).
    """
    with open_store(config) as store:
        for index in range(runs):
            start(store, _ten_steps(), f"t{index}")
    directory = Path(tempfile.mkdtemp(dir=HERE / ".tmp"))
    try:
        outs = [directory / f"{i}.json" for i in range(processes)]
        argv = [__file__, "--child", "rate", config, str(runs), "1"]
        procs = [subprocess.Popen([sys.executable, *argv, str(out)]) for out in outs]
        deadline = time.monotonic() + 120
        while not all(Path(f"{out}.ready").exists() for out in outs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit("throughput: a worker process did not get ready")
            time.sleep(0.01)
        with open_store(config) as probe:
            (directory / "go").touch()
            deadline = time.monotonic() + 600
            while probe.count_by_status()["done"] < runs and time.monotonic() < deadline:
                time.sleep(0.01)
            ended = time.time()  # wall clock: compared with the processes' starts
            (directory / "done").touch()
        for proc in procs:
            if proc.wait(timeout=900) != 0:
                raise SystemExit(f"a worker process failed: exit {proc.returncode}")
        results = [json.loads(out.read_text()) for out in outs]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if sum(r["runs"] for r in results) != runs:
        raise SystemExit(f"throughput: {sum(r['runs'] for r in results)} runs for {runs}")
    seconds: float = ended - min(r["began"] for r in results)
    seconds = max(seconds, 1e-9)
    return runs / seconds, sum(r["cpu"] for r in results) / seconds


def _my_config() -> tuple[str, Any] | None:
    try:
        import pymysql

        conn: Any = pymysql.connect(
            host="127.0.0.1", port=3306, user="root", database="test", connect_timeout=3
        )
    except Exception as exc:  # noqa: BLE001 - any failure means: skip MySQL, say why
        print(f"mysql skipped: {type(exc).__name__}: {exc}")
        return None
    table = f"stepstone_bench_claims_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    return f"{MYSQL}?table={table}", (conn, table)


def _my_drop(handle: Any) -> None:
    conn, table = handle
    with conn.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS `{table}`, `{table}_meta`, `{table}_pieces`")
    conn.close()


def cg_child(mode: str, n: int, directory: str) -> None:
    """The measured process of figure 2: WARMUP + n runs by ``mode``."""
    store = open_store(f"sqlite:///{directory}/cg.db?synchronous=normal")
    workflow = _ten_steps()
    total = WARMUP + n
    if mode == "run":
        for index in range(total):
            run(f"cg-{index}", workflow.steps, store)
    else:  # "start+worker": queue them, then drain them with one worker
        for index in range(total):
            start(store, workflow, f"cg-{index}")
        # max_runs: serve returns once it has drained them (a public seam, issue 30).
        worker = Worker(store, [workflow], concurrency=1, poll=5, max_runs=total)
        worker.serve()
        assert worker.completed == total, worker.completed
    store.close()


def cg_listening(n: int, directory: str) -> None:
    """Figure 2 with the listener open: the worker goes idle (opening it), then drains.

    The worker serves an empty store until its listener is open, then claims a run of
    a one-step ``gate`` workflow whose step holds until the WARMUP + n runs are queued,
    so it drains them all with the listener open, as a worker does once it has gone
    idle once. The gate's run is the same in both counts; the listener's looks at the
    ``start`` calls' commits are counted (they are its cost), the starts themselves
    are subtracted as in ``start+worker``.
    """
    store = open_store(f"sqlite:///{directory}/cg.db?synchronous=normal")
    workflow = _ten_steps()
    holding, release = threading.Event(), threading.Event()

    def hold(state: dict[str, Any]) -> dict[str, Any]:
        holding.set()
        if not release.wait(600):
            raise SystemExit("cg listening: the runs were never queued")
        return {}

    gate = Workflow("gate", [Step("hold", hold)], version="1")
    total = WARMUP + n
    worker = Worker(store, [workflow, gate], concurrency=1, poll=5, max_runs=total + 1)
    idle = threading.Event()
    # The first rest of a look that claimed nothing: the worker opens its listener next,
    # before its next look, which is the one that finds the gate's run.
    with kill_point("worker.resting", lambda point: idle.set()):
        thread = threading.Thread(target=worker.serve)
        thread.start()
        if not idle.wait(600):
            raise SystemExit("cg listening: the worker never went idle")
    start(store, gate, "gate")
    if not holding.wait(600):
        raise SystemExit("cg listening: the worker never claimed the gate's run")
    for index in range(total):
        start(store, workflow, f"cg-{index}")
    release.set()
    thread.join(600)
    assert worker.completed == total + 1, worker.completed
    store.close()


def _cg(mode: str, n: int) -> int:
    directory = tempfile.mkdtemp(dir=HERE / ".tmp")
    try:
        return callgrind_count([__file__, "--child", "cg", mode, str(n), directory])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def per_run(mode: str, n: int) -> int:
    """Instructions per run of ``mode``: (count(2N) - count(N)) / N."""
    return (_cg(mode, 2 * n) - _cg(mode, n)) // n


def _pg_config() -> tuple[str, Any] | None:
    try:
        import psycopg

        conn: Any = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=3)
    except Exception as exc:  # noqa: BLE001 - any failure means: skip PostgreSQL, say why
        print(f"postgresql skipped: {type(exc).__name__}: {exc}")
        return None
    table = f"stepstone_bench_claims_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    return f"{POSTGRES}?table={table}", (conn, table)


def _drop(handle: Any) -> None:
    conn, table = handle
    with conn.cursor() as cursor:
        cursor.execute(f'DROP TABLE IF EXISTS "{table}", "{table}_meta", "{table}_pieces"')
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--no-sql", action="store_true")
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-throughput", action="store_true")
    args = parser.parse_args()
    (HERE / ".tmp").mkdir(exist_ok=True)
    figures: dict[str, Any] = {"loads_per_claim": {}, "instructions_per_run": {}}
    backends: list[str] = ["sqlite"] + ([] if args.no_sql else ["postgresql", "mysql"])
    for backend in backends:
        for one_call in (True, False):
            for processes in (1, 4):
                handle = None
                if backend == "sqlite":
                    directory = tempfile.mkdtemp(dir=HERE / ".tmp")
                    config = f"sqlite:///{directory}/claims.db"
                else:
                    made = _pg_config() if backend == "postgresql" else _my_config()
                    if made is None:
                        break
                    config, handle = made
                try:
                    ratio = loads_per_claim(config, args.runs, processes, one_call)
                finally:
                    if handle is not None:
                        (_drop if backend == "postgresql" else _my_drop)(handle)
                    else:
                        shutil.rmtree(directory, ignore_errors=True)
                label = f"{backend} {'one call' if one_call else 'per run'} x{processes}"
                figures["loads_per_claim"][label] = round(ratio, 3)
                print(f"loads per claim, {label}: {ratio:.3f}", flush=True)
    if not (args.no_sql or args.no_throughput):
        figures["throughput"] = throughput(args.runs)
    if not args.no_callgrind and shutil.which("valgrind"):
        worker_all = per_run("start+worker", args.n)
        starts = per_run("start", args.n)
        looped = per_run("run", args.n)
        listening = per_run("start+listening", args.n) - starts
        worker = worker_all - starts
        figures["instructions_per_run"] = {
            "run loop": looped,
            "worker": worker,
            "start+worker": worker_all,
            "worker, listener open": listening,
            "worker / run": round(worker / looped, 3),
            "worker, listener open / run": round(listening / looped, 3),
            "start+worker / run": round(worker_all / looped, 3),
        }
        for name, value in figures["instructions_per_run"].items():
            print(f"instructions per run (sqlite, 10 steps), {name}: {value}", flush=True)
    elif not args.no_callgrind:
        print("callgrind skipped: valgrind is not installed")
    if args.json:
        print(json.dumps(figures))


def throughput(runs: int) -> dict[str, float]:
    """Figure 3: runs per second on PostgreSQL, 4 processes and 1, and their ratio."""
    rates: dict[str, float] = {}
    for processes in (1, 4):
        made = _pg_config()
        if made is None:
            return {}
        config, handle = made
        try:
            rate, cores = runs_per_second(config, runs, processes)
        finally:
            _drop(handle)
        rates[f"x{processes}"], rates[f"x{processes} cores"] = rate, round(cores, 2)
        print(
            f"throughput, postgresql 10-step runs, {processes} process(es) at concurrency "
            f"1: {rate:.1f} runs/s (workers' CPU: {cores:.2f} cores)",
            flush=True,
        )
    rates["x4 / x1"] = round(rates["x4"] / rates["x1"], 2)
    print(f"throughput, postgresql, 4 processes / 1: {rates['x4 / x1']:.2f}x", flush=True)
    return rates


def _child(argv: list[str]) -> None:
    if argv[0] == "loads":
        loads_child(argv[1], int(argv[2]), argv[3] == "1", argv[4])
    elif argv[0] == "rate":
        rate_child(argv[1], int(argv[2]), int(argv[3]), argv[4])
    elif argv[1] == "start":
        directory = argv[3]
        store = open_store(f"sqlite:///{directory}/cg.db?synchronous=normal")
        workflow = _ten_steps()
        for index in range(WARMUP + int(argv[2])):
            start(store, workflow, f"cg-{index}")
        store.close()
    elif argv[1] == "start+listening":
        cg_listening(int(argv[2]), argv[3])
    else:
        cg_child(argv[1], int(argv[2]), argv[3])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
    else:
        main()
