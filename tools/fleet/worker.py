"""One fleet worker process: ``python -m fleet worker SPEC`` (started by the harness).

Opens the store from its config string in this fresh process, points the workload's
steps at it and at this process's side-effect log, and serves the fleet's workflows
with ``Worker(...).serve()`` until SIGTERM (``stop``: hand the runs over) or SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import warnings
from typing import Any

from stepstone import Worker, open_store

from .workload import SERVED, Process

__all__ = ["worker_main"]


def worker_main(spec: dict[str, Any]) -> int:
    """Serve the fleet's workflows as ``spec`` says; return the exit status."""
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format=f"%(asctime)s pid={os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    # INFO for stepstone: each run's outcome, so a lease a live worker lost shows.
    logging.getLogger("stepstone").setLevel(logging.INFO)
    store = open_store(spec["config"])
    worker = Worker(
        store,
        SERVED,
        concurrency=int(spec["concurrency"]),
        lease=float(spec["lease"]),
        poll=float(spec["poll"]),
        grace=float(spec.get("grace", 5.0)),
    )
    Process.store = store
    Process.owner = worker.owner
    Process.step_seconds = (float(spec["step_min"]), float(spec["step_max"]))
    path = os.path.join(spec["logdir"], f"effects-{os.getpid()}.jsonl")
    Process.log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    # The harness reads this line to learn that the worker is up, and as whom.
    print(json.dumps({"pid": os.getpid(), "owner": worker.owner}), flush=True)
    try:
        worker.serve()
    finally:
        store.close()
    return 0
