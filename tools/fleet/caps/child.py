"""One worker process of a capability campaign: ``python -m fleet.caps worker SPEC``.

Opens the store from its config string, lets the campaign's workload prepare the
process (its log, a hook, a fast schedule clock), arms its kill plan and serves the
workload's workflows with ``Worker(...).serve()`` (``aserve()`` under ``asyncio.run``
when the spec's mode is ``async``) until SIGTERM (a graceful stop).

The kill plan (``spec["kill"]``: a point and an ``nth``) is a real death: at the
``nth`` firing of the point, from whichever thread passes it, the process writes
``died-PID.json`` (the point and the wall time) and SIGKILLs itself. The workload's
own hook runs first, so what it logs at a point (an acquisition, a reservation, a pool
charge) is on disk before the death.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from stepstone import Worker, _hooks, open_store

from .common import Ctx
from .loads import LOADS

__all__ = ["child_main", "log_line"]


def log_line(fd: int, record: dict[str, Any]) -> None:
    """Append one JSON line with one ``write`` to an ``O_APPEND`` descriptor (never torn)."""
    os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def _killer(spec: dict[str, Any], before: Callable[[str], None] | None) -> Callable[[str], None]:
    kill = spec.get("kill")
    seen = [0]
    lock = threading.Lock()
    died = os.path.join(spec["logdir"], f"died-{os.getpid()}.json")

    def hook(point: str) -> None:
        if before is not None:
            before(point)
        if kill is None or point != kill["point"]:
            return
        with lock:
            seen[0] += 1
            if seen[0] != kill["nth"]:
                return
            fd = os.open(died, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, json.dumps({"point": point, "t": time.time()}).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def child_main(spec: dict[str, Any]) -> int:
    """Serve the campaign's workload as ``spec`` says; return the exit status."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    # The local Cosmos emulator's certificate is self-signed (config says verify=false).
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    load = LOADS[spec["load"]]
    store = open_store(spec["config"])
    path = os.path.join(spec["logdir"], f"log-{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    Ctx.store, Ctx.log = store, (lambda record: log_line(fd, record))
    hook = load.prepare(spec)
    _hooks.install(_killer(spec, hook))
    worker = Worker(
        store,
        load.workflows(),
        concurrency=int(spec["concurrency"]),
        lease=float(spec["lease"]),
        poll=float(spec["poll"]),
    )
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    # The harness sends SIGTERM only once this file exists: the handler is in place.
    open(os.path.join(spec["logdir"], f"ready-{os.getpid()}"), "w").close()
    try:
        if spec.get("mode") == "async":
            asyncio.run(worker.aserve())
        else:
            worker.serve()
    finally:
        store.close()
    return 0
