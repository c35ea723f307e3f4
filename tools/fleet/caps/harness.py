"""A capability campaign: worker processes serve a workload while killed at its points.

The parent prepares the store (``Load.setup``), starts ``workers`` processes
(``child.py``) and, while they work, replaces each one that dies at once. A worker
started while fewer than ``kills`` kill plans were handed out gets one: a point of the
workload drawn at random and the firing to die at (1st to 4th), so deaths land at every
point across processes, threads and runs. When the work is done (or, for a load that
ends by time, after its ``duration`` and then a fault-free drain), the workers are
stopped with SIGTERM and the load's invariants are checked from the store, the workers'
logs and their deaths.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stepstone
from stepstone import open_store

from .common import Verdict, read_deaths, read_logs
from .loads import LOADS

__all__ = ["CapOptions", "CapResult", "run_campaign"]


@dataclass
class CapOptions:
    """One campaign: a workload on one store."""

    load: str
    backend: str
    config: str
    size: int
    workers: int = 3
    kills: int = 6
    lease: float = 5.0
    poll: float = 0.05
    timeout: float = 180.0
    seed: int = 0
    #: ``sync`` (``Worker.serve``) or ``async`` (``Worker.aserve``).
    mode: str = "sync"


@dataclass
class CapResult:
    """What a campaign did and found."""

    load: str
    backend: str
    size: int
    mode: str = "sync"
    deaths: int = 0
    points: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    verdict: Verdict = field(default_factory=Verdict)


class _Fleet:
    def __init__(self, opts: CapOptions, logdir: str, meta: dict[str, Any]) -> None:
        self.opts, self.logdir, self.meta = opts, logdir, meta
        self.rng = random.Random(opts.seed)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.planned = self.deaths = self.spawned = 0
        self.failures: list[str] = []
        tools = str(Path(__file__).resolve().parents[2])
        src = str(Path(stepstone.__file__).resolve().parents[1])
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join((src, tools))}

    def spawn(self, extra: dict[str, Any], faults: bool) -> None:
        load = LOADS[self.opts.load]
        kill = None
        if faults and self.planned < self.opts.kills:
            self.planned += 1
            kill = {"point": self.rng.choice(load.points), "nth": self.rng.randint(1, 4)}
        spec = {
            "load": self.opts.load,
            "config": self.opts.config,
            "logdir": self.logdir,
            "concurrency": load.concurrency,
            "lease": self.opts.lease,
            "poll": self.opts.poll,
            "meta": self.meta,
            "kill": kill,
            "mode": self.opts.mode,
            **extra,
        }
        self.spawned += 1
        err = open(os.path.join(self.logdir, f"err-{self.spawned}.txt"), "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", "fleet.caps", "worker", json.dumps(spec)]
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=err, stderr=err))
        err.close()

    def tend(self, extra: dict[str, Any], faults: bool) -> None:
        """Replace every worker that died (a kill plan) and note any other exit."""
        for proc in list(self.procs):
            code = proc.poll()
            if code is None:
                continue
            self.procs.remove(proc)
            if code == -signal.SIGKILL:
                self.deaths += 1
            else:
                self.failures.append(f"worker {proc.pid} exited with {code}")
            self.spawn(extra, faults)

    def stop(self) -> None:
        for proc in self.procs:
            # A worker still starting has no SIGTERM handler yet: wait until it says so.
            ready = os.path.join(self.logdir, f"ready-{proc.pid}")
            deadline = time.monotonic() + 60
            while not os.path.exists(ready) and proc.poll() is None:
                if time.monotonic() > deadline:
                    self.failures.append(f"worker {proc.pid} not ready within 60 s")
                    break
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.failures.append(f"worker {proc.pid} did not stop within 60 s of SIGTERM")
                continue
            if code == -signal.SIGKILL:
                self.deaths += 1  # died at its point while being stopped
            elif code != 0:
                self.failures.append(f"worker {proc.pid} exited with {code} when stopped")
        self.procs.clear()


def _phase(
    fleet: _Fleet, store: Any, extra: dict[str, Any], faults: bool, until: float | None
) -> None:
    opts, load = fleet.opts, LOADS[fleet.opts.load]
    for _ in range(opts.workers):
        fleet.spawn(extra, faults)
    began = time.monotonic()
    next_look = began
    while True:
        fleet.tend(extra, faults)
        now = time.monotonic()
        if until is not None and now - began >= until:
            break
        if until is None and now >= next_look:
            if load.done(store, fleet.meta):
                break
            next_look = now + 0.25
        if now - began > opts.timeout:
            fleet.failures.append(f"{opts.load} on {opts.backend}: not done in {opts.timeout:g}s")
            break
        time.sleep(0.05)
    fleet.stop()


def run_campaign(opts: CapOptions, logdir: str) -> CapResult:
    """Run one campaign in ``logdir`` (its logs stay there) and check its invariants."""
    load = LOADS[opts.load]
    os.makedirs(logdir, exist_ok=True)
    began = time.monotonic()
    result = CapResult(opts.load, opts.backend, opts.size, opts.mode)
    with open_store(opts.config) as store:
        meta = load.setup(store, opts.size)
        fleet = _Fleet(opts, logdir, meta)
        if load.duration is not None:
            _phase(fleet, store, {}, True, load.duration)
            _phase(fleet, store, load.drain(meta), False, None)
        else:
            _phase(fleet, store, {}, True, None)
        deaths = read_deaths(logdir)
        result.verdict = load.check(store, meta, read_logs(logdir), deaths)
    result.verdict.failures[:0] = fleet.failures
    result.deaths = fleet.deaths
    for path in Path(logdir).glob("died-*.json"):
        point = json.loads(path.read_text())["point"]
        result.points[point] = result.points.get(point, 0) + 1
    result.seconds = time.monotonic() - began
    return result
