"""One fleet worker process: ``python -m fleet worker SPEC`` (started by the harness).

Opens the store from its config string in this fresh process, points the workload's
steps at it and at this process's side-effect log, and serves the fleet's workflows
with ``Worker(...).serve()`` (or ``aserve()`` under ``asyncio.run`` when the spec's mode
is ``async``) until SIGTERM (``stop``: hand the runs over) or SIGKILL.

A spec ``skew`` of S seconds makes every wall-clock reading stepstone takes in this
process S seconds off the host's (``utcnow``, as imported by each stepstone module), the
way a host whose clock is wrong would write its records.

A spec ``drop_rings`` of F (0 to 1) loses that fraction of this worker's wake-ups at
random: at the runtime point ``wake.ring`` the hook raises ``WakeupDropped``, and the
ring is dropped as a lost notification would be; the worker must still find the work
by its poll. Each ring seen is one byte in ``rings-PID.log`` (``r`` rung, ``d``
dropped), for the fleet's report.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import warnings
from datetime import datetime, timedelta
from typing import Any

import stepstone._checkpoint
from stepstone import Worker, _hooks, open_store

from .workload import SERVED, Process

__all__ = ["WakeupDropped", "arm_points", "drop_rings", "skew_clock", "worker_main"]

try:
    from stepstone._wake import WakeupDropped
except ImportError:  # a tree without push wake-ups: nothing rings, nothing to drop
    WakeupDropped = None  # type: ignore[assignment,misc]

#: The runtime point where a wake-up is delivered (``stepstone._wake``).
RING = "wake.ring"


def arm_points(logdir: str) -> None:
    """Let the harness arm a runtime point: SIGUSR1 reads ``arm-PID``; at that point, die.

    The death is real (SIGKILL to itself, from whichever thread passes the point); the
    monotonic time and the point are written to ``died-PID.json`` first, for the fault log.
    """
    armed: list[str] = []
    pid = os.getpid()

    def arm(*_: object) -> None:
        with open(os.path.join(logdir, f"arm-{pid}")) as f:
            armed[:] = [f.read().strip()]

    def hook(point: str) -> None:
        if armed and point == armed[0]:
            record = json.dumps({"point": point, "t": time.monotonic_ns()})
            path = os.path.join(logdir, f"died-{pid}.json")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, record.encode())
            os.close(fd)
            os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGUSR1, arm)
    _hooks.install(hook)


def drop_rings(fraction: float, logdir: str, seed: int) -> None:
    """Drop ``fraction`` of this process's wake-ups at random (lost notifications).

    Chains to the hook installed before (``arm_points``), so a point kill still fires.
    Without ``stepstone._wake`` nothing rings and this installs nothing.
    """
    if not fraction or WakeupDropped is None:
        return
    dropped = WakeupDropped
    rng = random.Random(seed)
    before = _hooks.installed()
    path = os.path.join(logdir, f"rings-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def hook(point: str) -> None:
        if before is not None:
            before(point)
        if point == RING:
            lose = rng.random() < fraction
            os.write(fd, b"d" if lose else b"r")
            if lose:
                raise dropped(f"fleet fault: {fraction:.0%} of wake-ups dropped")

    _hooks.install(hook)


def skew_clock(seconds: float) -> None:
    """Make stepstone's wall clock in this process read ``seconds`` off the host's.

    Every stepstone module imports ``utcnow`` by name, so each loaded module's binding is
    replaced (call this after the store and the worker are imported).
    """
    if not seconds:
        return
    # The one clock every module reads by name: the skew fault needs the original.
    original = stepstone._checkpoint.utcnow  # noqa: SLF001 - a fault injector patches it
    offset = timedelta(seconds=seconds)

    def skewed() -> datetime:
        return original() + offset

    for name, module in list(sys.modules.items()):
        if name.startswith("stepstone") and getattr(module, "utcnow", None) is original:
            module.utcnow = skewed  # type: ignore[attr-defined]


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
    skew_clock(float(spec.get("skew", 0.0)))
    arm_points(spec["logdir"])
    drop_rings(float(spec.get("drop_rings", 0.0)), spec["logdir"], int(spec.get("seed", 0)))
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    _die_with(os.getppid())
    # The harness reads this line to learn that the worker is up, and as whom.
    print(json.dumps({"pid": os.getpid(), "owner": worker.owner}), flush=True)
    try:
        if spec.get("mode") == "async":
            asyncio.run(_aserve(worker))
        else:
            worker.serve()
    finally:
        store.close()
    return 0


def _die_with(parent: int) -> None:
    """End this worker when the harness that started it is gone.

    A harness that is killed (SIGKILL, a ``timeout``, a Ctrl-C of an ad-hoc script) runs
    no cleanup; its workers were seen polling a deleted store 95 minutes later. Once
    the parent dies this process is re-parented, and ``getppid`` says so.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="fleet-parent-watch", daemon=True).start()


async def _aserve(worker: Worker) -> None:
    # stop() is thread- and signal-safe; the handler above stays in force under asyncio.
    await worker.aserve()
