"""The fleet workload of ``flow_control.py`` in one process, beside DBOS queues' limits.

    python benchmarks/flow_control_dbos.py [--runs 1000] [--system dbos|stepstone]

``--runs`` workflows of one 10 ms step on a SQLite database, 8 threads: through a
concurrency-8 limit (stepstone: a ``Limit`` the workflow holds; DBOS: a ``Queue`` with
``concurrency=8``) and with none (stepstone: no limit; DBOS: a queue without one). Each
system runs in its own process (DBOS is process-wide), so run it once per ``--system``.
Prints runs per second; ``docs/flow-control.md`` quotes a run of it. DBOS is the
version in ``benchmarks/peers/requirements.txt``.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from typing import Any


def _call() -> None:
    threading.Event().wait(0.01)  # the model or API call the limit protects


def stepstone_rate(runs: int, limited: bool) -> float:
    """Runs per second of one stepstone worker (8 threads) on SQLite."""
    from stepstone import Limit, Step, Worker, Workflow, open_store, start

    directory = tempfile.mkdtemp(prefix="flow-vs-dbos-")
    limits = [Limit("api", concurrency=8)] if limited else []
    flow = Workflow("call", [Step("call", lambda state: _call())], limits=limits)
    with open_store(f"sqlite:///{directory}/runs.db") as store:
        for i in range(runs):
            start(store, flow, f"r{i}")
        worker = Worker(store, [flow], concurrency=8, poll=0.05)
        thread = threading.Thread(target=worker.serve)
        began = time.perf_counter()
        thread.start()
        while store.count_by_status("r").get("done", 0) < runs:  # not ~limit/ records
            time.sleep(0.02)
        elapsed = time.perf_counter() - began
        worker.stop()
        thread.join()
    return runs / elapsed


def dbos_rate(runs: int) -> tuple[float, float]:
    """Runs per second of DBOS on a SQLite system database: (no limit, concurrency 8)."""
    # DBOS is installed in the peers' venv (benchmarks/peers/setup.sh).
    from dbos import DBOS  # type: ignore[import-not-found, unused-ignore]

    logging.getLogger("dbos").setLevel(logging.WARNING)
    directory = tempfile.mkdtemp(prefix="flow-vs-dbos-")

    @DBOS.step()  # type: ignore[untyped-decorator, unused-ignore]
    def call() -> None:
        _call()

    @DBOS.workflow()  # type: ignore[untyped-decorator, unused-ignore]
    def flow() -> None:
        call()

    config: Any = {
        "name": "flow-vs-dbos",
        "system_database_url": f"sqlite:///{directory}/dbos.sqlite",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    # Queues are registered (and their settings stored) once DBOS is launched.
    free_queue = DBOS.register_queue("free", worker_concurrency=8, polling_interval_sec=0.05)
    held_queue = DBOS.register_queue("held", global_concurrency=8, polling_interval_sec=0.05)
    try:
        rates = []
        for queue in (free_queue, held_queue):
            began = time.perf_counter()
            handles = [queue.enqueue(flow) for _ in range(runs)]
            for handle in handles:
                handle.get_result()
            rates.append(runs / (time.perf_counter() - began))
        return rates[0], rates[1]
    finally:
        DBOS.destroy(destroy_registry=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--system", choices=("stepstone", "dbos"), default="stepstone")
    args = parser.parse_args()
    print(f"{args.system}: {args.runs} runs of a 10 ms step, SQLite, 8 threads, pid {os.getpid()}")
    if args.system == "dbos":
        free, held = dbos_rate(args.runs)
    else:
        free, held = stepstone_rate(args.runs, False), stepstone_rate(args.runs, True)
    print(
        f"  no limit {free:.0f} runs/s, concurrency 8: {held:.0f} runs/s, ratio {held / free:.2f}x"
    )


if __name__ == "__main__":
    main()
