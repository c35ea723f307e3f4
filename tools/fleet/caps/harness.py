"""A capability campaign: worker processes serve a workload while killed at its points.

The parent prepares the store (``Load.setup``), starts ``workers`` processes
(``child.py``) and, while they work, replaces each one that dies at once. A worker
started while fewer than ``kills`` kill plans were handed out gets one: a point of the
workload drawn at random and the firing to die at (1st to 4th), so deaths land at every
point across processes, threads and runs. Besides, ``freezes`` times a ready worker is
frozen (SIGSTOP) for ``lease + 1`` seconds, so its leases lapse and others take its runs
and slots, then thawed (SIGCONT: its work from before is fenced); and ``terms`` times a
ready worker is stopped gracefully (SIGTERM) and replaced. When the work is done (or, for
a load that ends by time, after its ``duration`` and then a fault-free drain), the
workers are stopped with SIGTERM and the load's invariants are checked from the store,
the workers' logs, their deaths and their freezes (``meta["freezes"]``).
"""

from __future__ import annotations

import contextlib
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
    #: Workers frozen (SIGSTOP, ``lease + 1`` s, SIGCONT) and stopped (SIGTERM) during
    #: the fault phase, one every ``fault_every`` seconds at most.
    freezes: int = 0
    terms: int = 0
    fault_every: float = 1.5


@dataclass
class CapResult:
    """What a campaign did and found."""

    load: str
    backend: str
    size: int
    mode: str = "sync"
    deaths: int = 0
    freezes: int = 0
    terms: int = 0
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
        # Freezes and graceful stops: the pids stopped on purpose, the frozen ones with
        # when to thaw them (monotonic), and the record of each freeze (wall times).
        self.termed: set[int] = set()
        self.frozen: dict[int, tuple[float, float]] = {}
        self.freezes: list[dict[str, float]] = []
        self.next_fault = time.monotonic() + opts.fault_every
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
            elif code == 0 and proc.pid in self.termed:
                pass  # stopped gracefully on purpose: replaced like the dead
            else:
                self.failures.append(f"worker {proc.pid} exited with {code}")
            self.spawn(extra, faults)

    def _ready(self, proc: subprocess.Popen[bytes]) -> bool:
        ready = os.path.join(self.logdir, f"ready-{proc.pid}")
        return proc.poll() is None and os.path.exists(ready)

    def fault(self) -> None:
        """Thaw the frozen workers that are due; freeze or stop one, if one is due."""
        now = time.monotonic()
        for pid, (thaw, began) in list(self.frozen.items()):
            if now >= thaw:
                self._thaw(pid, began)
        opts = self.opts
        if now < self.next_fault:
            return
        self.next_fault = now + opts.fault_every
        left = [
            k
            for k, n, done in (
                ("freeze", opts.freezes, len(self.freezes) + len(self.frozen)),
                ("term", opts.terms, len(self.termed)),
            )
            if done < n
        ]
        live = [
            p
            for p in self.procs
            if self._ready(p) and p.pid not in self.frozen and p.pid not in self.termed
        ]
        if not left or not live:
            return
        proc = self.rng.choice(live)
        if self.rng.choice(left) == "term":
            self.termed.add(proc.pid)
            proc.send_signal(signal.SIGTERM)
            return
        began = time.time()
        proc.send_signal(signal.SIGSTOP)
        self.frozen[proc.pid] = (now + opts.lease + 1.0, began)

    def _thaw(self, pid: int, began: float) -> None:
        del self.frozen[pid]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.freezes.append({"pid": pid, "t0": began, "t1": time.time()})

    def stop(self) -> None:
        for pid, (_, began) in list(self.frozen.items()):
            self._thaw(pid, began)
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
        if faults:
            fleet.fault()
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
        checked = {**meta, "freezes": fleet.freezes}
        result.verdict = load.check(store, checked, read_logs(logdir), deaths)
    result.verdict.failures[:0] = fleet.failures
    result.deaths = fleet.deaths
    result.freezes, result.terms = len(fleet.freezes), len(fleet.termed)
    for path in Path(logdir).glob("died-*.json"):
        point = json.loads(path.read_text())["point"]
        result.points[point] = result.points.get(point, 0) + 1
    result.seconds = time.monotonic() - began
    return result
