"""The fleet: worker processes draining started runs while the harness kills and freezes them.

``run_fleet(config, options)``:

1. starts ``options.workers`` worker processes (``python -m fleet worker``: each opens
   the store from the config string and calls ``Worker(...).serve()``), then records
   ``options.runs`` runs with ``stepstone.start`` (five kinds, see ``workload``);
2. while they drain, injects faults: SIGKILL of a worker (a replacement is started at
   once), SIGSTOP for longer than the lease, then SIGCONT (a frozen owner waking after
   a takeover), or SIGTERM (a graceful stop: the worker hands its runs over at a step
   boundary and exits 0; a replacement starts at once). Half the faults aim at the owner
   of a run that suspends (signal, timer, children) or of a child run (SIGKILL around
   signal delivery, timer wake-up and child completion), the rest at a random worker.
   The k-th of n faults fires once ``options.last_fault_at * (k+1)/n`` of the runs are
   done, so the last one lands near the end of the work and the drain after it means
   something;
3. sends each ``WaitFor`` run its signals at random times (before it waits, while it
   waits, while it runs), some ids sent twice with another payload;
4. after the last fault (and the last signal) measures how long the fleet takes to
   finish every run, stops the workers with SIGTERM, and checks the invariants
   (``invariants.check``) on the stored runs, the side-effect logs and the fault log.

With ``options.drop_rings`` every worker also loses that fraction of its wake-ups at
random (``worker.drop_rings``: lost notifications); the same invariants, and the same
drain bound, which counts polls and never a wake-up, must hold.

Every death and freeze is recorded with its monotonic times (the same clock the steps
write into their side-effect lines: ``CLOCK_MONOTONIC`` is one clock for the host).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from stepstone import open_store, start
from stepstone._errors import StepstoneError
from stepstone._store import Store

from .backends import REPO
from .invariants import Fault, Report, check
from .signals import deliver, signal_plan
from .workload import KIDS, WORKFLOWS, kind_of

__all__ = ["Options", "Result", "run_fleet"]


@dataclasses.dataclass
class Options:
    """What one fleet campaign on one backend does."""

    runs: int = 100
    workers: int = 4
    concurrency: int = 4
    #: Seconds of each worker's lease (renewed every third of it).
    lease: float = 1.5
    poll: float = 0.05
    kills: int = 10
    freezes: int = 3
    #: Graceful stops (SIGTERM: the worker hands its runs over at a step boundary).
    stops: int = 2
    #: Kills a worker deals itself at a named runtime point (``POINTS``, in turn): the
    #: harness arms the point (SIGUSR1) and the worker SIGKILLs itself the next time any
    #: of its threads passes it (an external SIGKILL if it does not within ``arm_wait``).
    point_kills: int = 0
    #: Fire the point kills before every other fault, not in the shuffled order: the
    #: first is armed at ``worker.claimed`` while most runs are still ahead, so the
    #: worker dies holding a run it just claimed and a takeover must follow (a campaign
    #: that asserts one does not then rest on a random kill finding an owner).
    points_first: bool = False
    #: The points armed, in turn (default: every one of ``POINTS``).
    points: tuple[str, ...] = ()
    arm_wait: float = 8.0
    seed: int = 1
    #: The kinds of run started, in turn (``workload.KINDS``); empty: all of them.
    kinds: tuple[str, ...] = ()
    #: Seconds a step sleeps after its side effect: picked in [step_min, step_max].
    step_min: float = 0.03
    step_max: float = 0.15
    #: Signals are sent at random times in [0, signal_window] seconds after the start.
    signal_window: float = 6.0
    #: Chance that a signal id is sent a second time (another payload, same id).
    repeat_rate: float = 0.3
    #: Chance that a WaitFor run gets one signal more than it consumes.
    extra_rate: float = 0.3
    #: A frozen worker stays stopped for [freeze_min, freeze_max] x lease.
    freeze_min: float = 1.5
    freeze_max: float = 2.5
    #: Fraction of the runs done when the last fault fires.
    last_fault_at: float = 0.85
    #: Least seconds between two faults.
    fault_gap: float = 0.3
    #: Fraction of faults aimed at the owner of a run at a suspending point.
    targeted: float = 0.5
    #: Give up (every unfinished run is then reported stranded) after this many seconds.
    timeout: float = 240.0
    #: One write lock for the whole store (always so for ``sqlite:``): a worker frozen
    #: while holding it stalls every worker's saves, so a freeze hits every worker.
    shared_lock: bool = False
    workdir: str = "/tmp/fleet"
    #: How workers serve: ``threads`` (``Worker.serve``), ``async`` (``Worker.aserve``
    #: under ``asyncio.run``) or ``mixed`` (alternately, one fleet of both kinds).
    mode: str = "threads"
    #: Seconds of wall-clock skew between workers: worker k's clock reads
    #: ``SKEWS[k % 4] * skew`` seconds off the host's (ahead, exact, behind, half ahead).
    skew: float = 0.0
    #: Fraction (0 to 1) of each worker's wake-ups dropped at random (the runtime point
    #: ``wake.ring``): lost notifications, which must only delay work until a poll.
    drop_rings: float = 0.0


#: The runtime's named points a worker may be armed to die at (see ``stepstone._hooks``):
#: a claim that landed, a renewal that landed, a signal consumed by a WaitFor before its
#: save, a Map child record created, and the runner's own points around a step.
POINTS = (
    "worker.claimed",
    "lease.renewed",
    "wait.consumed",
    "map.child_created",
    "runner.before_step",
    "runner.after_step",
    "runner.after_save",
)
#: The skew pattern, as multiples of ``Options.skew`` (worker number modulo its length).
SKEWS = (1.0, 0.0, -1.0, 0.5)
#: The serving modes ``Options.mode`` accepts.
MODES = ("threads", "async", "mixed")


def worker_mode(opts: Options, number: int) -> str:
    """How the ``number``-th worker started serves: ``threads`` or ``async``."""
    if opts.mode == "mixed":
        return ("threads", "async")[number % 2]
    return opts.mode


@dataclasses.dataclass
class Result:
    """What a campaign did and found: the figures of FLEET.md, and the violations."""

    backend: str
    options: Options
    report: Report
    seconds: float
    faults: list[Fault]
    skipped_faults: int
    signals_sent: int
    signals_repeated: int
    workers_started: int
    #: Points armed that the worker never passed within ``arm_wait`` (killed anyway).
    unreached: int = 0
    #: Wake-ups the workers saw at ``wake.ring`` while ``drop_rings`` was set, and of
    #: those the ones dropped (counted by each worker; a killed worker's last few may
    #: be missing).
    rings: int = 0
    rings_dropped: int = 0

    @property
    def ok(self) -> bool:
        """Whether no invariant was violated."""
        return not self.report.violations

    def summary(self) -> dict[str, Any]:
        """The figures, as one flat dict (a row of the FLEET.md table)."""
        kills = sum(f.kind == "kill" for f in self.faults)
        stops = sum(f.kind == "stop" for f in self.faults)
        return {
            "backend": self.backend,
            "mode": self.options.mode,
            "skew s": round(self.options.skew, 1),
            "dropped wake-ups": f"{self.rings_dropped}/{self.rings}",
            "runs": self.options.runs,
            "child runs": self.report.children,
            "workers": self.options.workers,
            "processes": self.workers_started,
            "kills": kills,
            "at points": sum(f.point is not None for f in self.faults),
            "points unreached": self.unreached,
            "freezes": len(self.faults) - kills - stops,
            "stops": stops,
            "aimed": sum(f.target is not None for f in self.faults),
            "takeovers": self.report.takeovers,
            "signals": self.signals_sent,
            "repeated ids": self.signals_repeated,
            "steps run": self.report.executions,
            "repeated steps": self.report.repeats,
            "max repeats": self.report.max_repeats,
            "repeats via lock": self.report.lock_repeats,
            "lost leases": self.report.unprovoked,
            "hand-over tracebacks": self.report.known_bug,
            "fenced steps": self.report.fenced,
            "drain s": round(self.report.drain, 1),
            "bound s": round(self.report.bound, 1),
            "violations": len(self.report.violations),
            "seconds": round(self.seconds, 1),
        }


class _Fleet:
    """The worker processes: start, kill, freeze, thaw, stop; with the fault log."""

    def __init__(self, config: str, opts: Options, logdir: Path) -> None:
        self.config = config
        self.opts = opts
        self.logdir = logdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.frozen: dict[int, tuple[Fault, threading.Timer]] = {}  # pid -> (fault, thaw)
        self.lock = threading.Lock()
        self.outs: dict[int, Path] = {}
        self.stopping: dict[int, tuple[Fault, subprocess.Popen[bytes]]] = {}
        self.started = 0
        self.unexpected: list[str] = []
        #: Workers armed to die at a point: pid -> (point, armed at ns, give up at ns).
        self.armed: dict[int, tuple[str, int, int]] = {}
        #: Point kills that happened (or were given up on), not yet in the fault log.
        self.point_faults: list[Fault] = []
        #: Points armed that no thread of the worker passed within ``arm_wait``.
        self.unreached: list[str] = []
        self.points_armed = 0
        env = dict(os.environ)
        tools = str(REPO / "tools")
        src = str(REPO / "src")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, tools, env.get("PYTHONPATH", "")) if p)
        self.env = env

    def spawn(self) -> int:
        spec = {
            "config": self.config,
            "logdir": str(self.logdir),
            "lease": self.opts.lease,
            "poll": self.opts.poll,
            "concurrency": self.opts.concurrency,
            "step_min": self.opts.step_min,
            "step_max": self.opts.step_max,
            "mode": worker_mode(self.opts, self.started),
            "skew": SKEWS[self.started % len(SKEWS)] * self.opts.skew,
            "drop_rings": self.opts.drop_rings,
            # Each worker its own random drops, repeatable from the campaign's seed.
            "seed": self.opts.seed * 1000 + self.started,
        }
        number = self.started
        self.started += 1
        with (
            open(self.logdir / f"worker-{number}.out", "wb") as out,
            open(self.logdir / f"worker-{number}.err", "wb") as err,
        ):
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleet", "worker", json.dumps(spec)],
                stdout=out,
                stderr=err,
                env=self.env,
                cwd=str(REPO),
            )
        self.procs[proc.pid] = proc
        self.outs[proc.pid] = self.logdir / f"worker-{number}.out"
        return proc.pid

    def ready(self, pid: int) -> bool:
        """Whether the worker said hello (its SIGTERM handler is installed by then)."""
        path = self.outs.get(pid)
        return path is not None and path.exists() and path.stat().st_size > 0

    def live(self) -> list[int]:
        """Workers no fault is acting on: not frozen, not armed to die at a point."""
        with self.lock:
            return [pid for pid in self.procs if pid not in self.frozen and pid not in self.armed]

    def kill(self, pid: int, target: str | None) -> Fault:
        now = time.monotonic_ns()
        os.kill(pid, signal.SIGKILL)
        self.procs.pop(pid).wait(timeout=30)
        self.spawn()
        return Fault("kill", pid, now, now, target)

    def point_kill(self, pid: int, point: str) -> None:
        """Arm ``point`` in ``pid``: it dies the next time one of its threads passes it.

        The worker goes on working meanwhile; ``reap`` notices the death (or, after
        ``arm_wait``, SIGKILLs a worker that never passed the point) and files the fault.
        """
        now = time.monotonic_ns()
        (self.logdir / f"arm-{pid}").write_text(point)
        self.armed[pid] = (point, now, now + int(self.opts.arm_wait * 1e9))
        os.kill(pid, signal.SIGUSR1)

    def _reap_armed(self) -> None:
        for pid, (point, armed_at, give_up) in list(self.armed.items()):
            proc = self.procs.get(pid)
            if proc is None:  # already filed by another path
                del self.armed[pid]
                continue
            if proc.poll() is None:
                if time.monotonic_ns() < give_up:
                    continue
                # Not passed in time (a quiet worker): an ordinary SIGKILL, filed as such.
                os.kill(pid, signal.SIGKILL)
                proc.wait(timeout=30)
                self.unreached.append(point)
                self.point_faults.append(Fault("kill", pid, armed_at, time.monotonic_ns()))
            else:
                died = self.logdir / f"died-{pid}.json"
                end = json.loads(died.read_text())["t"] if died.exists() else time.monotonic_ns()
                reached = point if died.exists() else None
                if reached is None:
                    self.unreached.append(point)
                self.point_faults.append(Fault("kill", pid, armed_at, int(end), None, reached))
            del self.armed[pid]
            self.procs.pop(pid)
            self.spawn()

    def terminate(self, pid: int, target: str | None) -> Fault:
        """SIGTERM: the worker hands its runs over and exits 0; a replacement starts now."""
        now = time.monotonic_ns()
        proc = self.procs.pop(pid)
        proc.send_signal(signal.SIGTERM)
        fault = Fault("stop", pid, now, now, target)
        self.stopping[pid] = (fault, proc)
        self.spawn()
        return fault

    def freeze(self, pid: int, target: str | None, rng: random.Random) -> Fault:
        """SIGSTOP ``pid``; a timer thread SIGCONTs it after 1.5-2.5 leases.

        The thaw runs on its own thread so that nothing the harness waits for can delay
        it: a worker frozen inside an SQLite write transaction holds the write lock,
        and the harness's own next write would wait for it.
        """
        now = time.monotonic_ns()
        os.kill(pid, signal.SIGSTOP)
        fault = Fault("freeze", pid, now, now, target)
        span = rng.uniform(self.opts.freeze_min, self.opts.freeze_max) * self.opts.lease
        timer = threading.Timer(span, self._thaw, (pid,))
        timer.daemon = True
        self.frozen[pid] = (fault, timer)
        timer.start()
        return fault

    def _thaw(self, pid: int) -> None:
        with self.lock:
            entry = self.frozen.pop(pid, None)
            if entry is not None:
                os.kill(pid, signal.SIGCONT)
                entry[0].end = time.monotonic_ns()

    def thaw_all(self) -> None:
        for pid, (_fault, timer) in list(self.frozen.items()):
            timer.cancel()
            self._thaw(pid)

    def reap(self) -> None:
        """Notice workers that exited by themselves (a bug): record and replace them."""
        self._reap_armed()
        for pid, (fault, proc) in list(self.stopping.items()):
            code = proc.poll()
            if code is None and time.monotonic_ns() - fault.start > 20e9:
                self.unexpected.append(f"worker pid {pid} did not stop within 20 s of SIGTERM")
                proc.kill()
                code = proc.wait(timeout=30)
            if code is not None:
                fault.end = time.monotonic_ns()
                del self.stopping[pid]
                if code != 0:
                    self.unexpected.append(f"worker pid {pid} exited {code} on SIGTERM")
        for pid, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                self.unexpected.append(f"worker pid {pid} exited by itself with status {code}")
                del self.procs[pid]
                self.frozen.pop(pid, None)
                self.spawn()

    def stop(self) -> None:
        self.thaw_all()
        while self.armed:  # each dies at its point or is killed after arm_wait
            self._reap_armed()
            time.sleep(0.02)
        while self.stopping:
            self.reap()
            time.sleep(0.05)
        # A worker still starting (importing, opening the store) has no SIGTERM handler
        # yet, and would die of it: let it come up first.
        up_by = time.monotonic() + 60
        for pid, proc in self.procs.items():
            while not self.ready(pid) and proc.poll() is None and time.monotonic() < up_by:
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for pid, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.unexpected.append(f"worker pid {pid} did not stop within 20 s of SIGTERM")
                proc.kill()
                proc.wait(timeout=30)
            else:
                if proc.returncode != 0:
                    self.unexpected.append(
                        f"worker pid {pid} exited with status {proc.returncode} on SIGTERM"
                    )
        self.procs.clear()


def _owner_pid(owner: str | None) -> int | None:
    """Return the pid in an owner name (``KIND:HOST:PID:...``, see ``_lease.new_owner``)."""
    parts = (owner or "").split(":")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def _rings(logdir: Path) -> tuple[int, int]:
    """(wake-ups seen, wake-ups dropped) by the workers, from their ``rings-PID.log``."""
    seen = lost = 0
    for path in logdir.glob("rings-*.log"):
        data = path.read_bytes()
        seen += len(data)
        lost += data.count(b"d")
    return seen, lost


def _statuses(store: Store) -> Counter[str]:
    return Counter(info.status for info in store.list_info())


def run_fleet(config: str, opts: Options, backend: str = "?") -> Result:  # noqa: C901 - the campaign's phases in order: start, fault, drain, check
    """Run one campaign on the store ``config``; return its figures and violations."""
    rng = random.Random(opts.seed)
    logdir = Path(opts.workdir) / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    store = open_store(config)
    fleet = _Fleet(config, opts, logdir)
    faults: list[Fault] = []
    try:
        for _ in range(opts.workers):
            fleet.spawn()
        kinds = {f"fleet-{opts.seed}-{i:04d}": kind_of(i, opts.kinds) for i in range(opts.runs)}
        inputs = {run_id: {"seed": f"{opts.seed}-{n}", "n": n} for n, run_id in enumerate(kinds)}
        for run_id, kind in kinds.items():
            start(store, WORKFLOWS[kind], run_id, inputs[run_id])
        children = KIDS * sum(kind in ("map", "mixed", "code") for kind in kinds.values())
        total = opts.runs + children
        t_start = time.monotonic()

        plan = signal_plan(rng, kinds, opts.extra_rate, opts.repeat_rate, opts.signal_window)
        delivered: dict[str, list[tuple[str, str]]] = {run_id: [] for run_id in kinds}
        sent = repeated = 0
        order = ["freeze"] * opts.freezes + ["kill"] * opts.kills + ["stop"] * opts.stops
        if opts.points_first:
            rng.shuffle(order)
            order = ["point"] * opts.point_kills + order
        else:
            order += ["point"] * opts.point_kills
            rng.shuffle(order)
        last_fault = 0.0
        last_event_ns = time.monotonic_ns()
        next_poll = 0.0
        done_top = 0
        all_done = False
        deadline = began + opts.timeout
        # The fault phase: until every fault fired and every signal was sent.
        while (order or plan or fleet.frozen or fleet.armed) and time.monotonic() < deadline:
            now = time.monotonic()
            while plan and now - t_start >= plan[0][0]:
                _at, run_id, sid, payload = plan.pop(0)
                outcome = deliver(store, run_id, sid, payload)
                sent += 1
                repeated += payload["rep"] == 1
                delivered[run_id].append((sid, outcome))
                if outcome == "new":  # a signal a run may have waited for
                    last_event_ns = max(last_event_ns, time.monotonic_ns())
            fleet.reap()
            faults += fleet.point_faults
            fleet.point_faults.clear()
            if now >= next_poll:
                next_poll = now + 0.5
                try:
                    infos = list(store.list_info())  # progress: how many runs are done
                except StepstoneError:
                    continue  # a flaky read: look again at the next poll
                done_top = sum(i.status == "done" and i.run_id in kinds for i in infos)
                all_done = sum(i.status == "done" for i in infos) == total
            if all_done and not plan and not fleet.armed:
                break
            fired = len(faults) + len(fleet.armed)
            n = opts.kills + opts.freezes + opts.stops + opts.point_kills
            if (
                order
                and done_top >= opts.last_fault_at * opts.runs * (fired + 1) / n
                and now - last_fault >= opts.fault_gap
            ):
                kind = order[0]
                live = fleet.live()
                if kind in ("stop", "point"):
                    # Only a worker that is up: a SIGTERM while it still imports is death,
                    # and a SIGUSR1 before its handler is installed too.
                    live = [pid for pid in live if fleet.ready(pid)]
                if kind == "freeze" and len(live) <= 2:
                    pass  # keep two workers running: wait for a thaw
                elif live:
                    # A leading point kill waits for a worker that owns a run: armed at
                    # one that owns none, it may never pass the point before the end.
                    must_aim = kind == "point" and opts.points_first
                    target_run, pid = _pick(rng, opts, store, live, kinds, must_aim)
                    if must_aim and target_run is None:
                        time.sleep(0.02)
                        continue
                    order.pop(0)
                    if kind == "kill":
                        fault = fleet.kill(pid, target_run)
                    elif kind == "point":
                        points = opts.points or POINTS
                        fleet.point_kill(pid, points[fleet.points_armed % len(points)])
                        fleet.points_armed += 1
                        last_fault = time.monotonic()
                        continue
                    elif kind == "stop":
                        fault = fleet.terminate(pid, target_run)
                    else:
                        fault = fleet.freeze(pid, target_run, rng)
                    faults.append(fault)
                    last_fault = time.monotonic()
            time.sleep(0.02)
        fleet.thaw_all()
        while fleet.armed:  # past the deadline: each dies at its point or is killed
            fleet.reap()
            time.sleep(0.02)
        faults += fleet.point_faults
        fleet.point_faults.clear()
        skipped = len(order)
        # From the blow itself (the SIGKILL, or the SIGSTOP: its takeover is the point).
        last_event_ns = max([last_event_ns, *(f.start for f in faults)])
        # The drain: every run done, counted from the last fault or signal.
        done_ns = None
        while time.monotonic() < deadline:
            fleet.reap()
            try:
                counts = _statuses(store)
            except StepstoneError:
                time.sleep(0.2)
                continue
            if counts.get("done", 0) == total:
                done_ns = time.monotonic_ns()
                break
            if counts.get("failed", 0) or counts.get("cancelled", 0):
                break  # nothing fails or is cancelled in the fleet: reported below
            time.sleep(0.2)
        fleet.stop()
        # Kept beside the logs, for whoever investigates a violation.
        (logdir / "faults.json").write_text(
            json.dumps([dataclasses.asdict(f) for f in faults], indent=1)
        )
        report = check(
            store,
            kinds,
            inputs,
            delivered,
            faults,
            logdir,
            opts.lease,
            opts.poll,
            last_event_ns,
            done_ns,
            fleet.unexpected,
            opts.workers,
            opts.shared_lock or config.startswith("sqlite:"),
        )
    finally:
        fleet.stop()
        store.close()
    rings, rings_dropped = _rings(logdir)
    return Result(
        backend=backend,
        options=opts,
        report=report,
        seconds=time.monotonic() - began,
        faults=faults,
        skipped_faults=skipped,
        signals_sent=sent,
        signals_repeated=repeated,
        workers_started=fleet.started,
        unreached=len(fleet.unreached),
        rings=rings,
        rings_dropped=rings_dropped,
    )


def _pick(
    rng: random.Random,
    opts: Options,
    store: Store,
    live: list[int],
    kinds: dict[str, str],
    must_aim: bool = False,
) -> tuple[str | None, int]:
    """Return (the run aimed at or None, the pid to hit); aimed always if ``must_aim``."""
    if must_aim or rng.random() < opts.targeted:
        infos = list(store.list_info())  # fresh: who owns what right now
        aimed = [
            (info.run_id, pid)
            for info in infos
            if info.owner
            and (pid := _owner_pid(info.owner)) in live
            and (info.run_id not in kinds or kinds[info.run_id] != "plain")
        ]
        if aimed:
            return rng.choice(aimed)
    return None, rng.choice(live)
