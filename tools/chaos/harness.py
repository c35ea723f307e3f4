"""The driver: forks children, lets them die where planned, restarts them, checks the store.

A *case* is either

- **single**: one generated workflow (1-12 steps, states from a few bytes to the size
  budget, steps that fail and are retried, steps appended on a resume) run by a chain of
  child processes. Each child is given a kill plan (a point and an occurrence, chosen
  by a seeded RNG from what the child can reach) and dies there by ``SIGKILL``; the
  next child reopens the store from the config string and resumes, until the run is
  done. Deterministic: the same case dies at the same places every time, unless a step
  outlasts a third of the lease (its renewal is one more save, so one more firing of
  the store's kill points); on a loaded machine rerun a case with a longer ``--lease``.
- **concurrent** (every 5th case): several worker processes run the same few runs at
  once, losers of a save get ``ConflictError`` and call ``run`` again later, and workers
  are killed at random points and replaced. The plan is seeded; the interleaving is not.

``Options.mode`` says how each child drives its run: ``sync`` (``stepstone.run``) or
``async`` (``stepstone.arun``). The plan is the same in both modes, so a case dies at the
same points in either.

Children are ``os.fork``-ed from the warmed-up driver (stepstone already imported), or
with ``spawn=True`` started as ``python -m chaos child SPEC`` (``tools/`` on the path).
Either way each child is a separate process that really dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import select
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from stepstone._registry import open_store
from stepstone._store import Store

from .backends import BIG_BUDGET, REPO, kill_points, piece_kill_points, save_kill_points
from .child import ERROR_EXIT, MODES, STEP_FAILED_EXIT, child_main, read_lines, worker_main
from .churn import CHURN_EVERY, final_sweep, run_churn
from .invariants import (
    check_checkpoint,
    check_concurrent_end,
    check_final,
    check_save_kill,
    load_checked,
    seed_bystanders,
    snapshot,
)
from .workload import DEFAULT_BUDGET, Workflow, digest, expected_states, make_workflow

__all__ = [
    "LEASE",
    "RUNNER_POINTS",
    "CaseResult",
    "Exit",
    "Options",
    "Stats",
    "run_case",
    "run_child",
    "run_shard",
]

#: Kill points of the runner. ``step.inside`` is the step itself (after its side effect);
#: ``resume`` is ``runner.before_step`` of the first step a resuming process runs.
RUNNER_POINTS = (
    "runner.before_step",
    "step.inside",
    "runner.after_step",
    "runner.after_save",
    "runner.backoff",
    "resume",
)
CONCURRENT_EVERY = 5  # case % 5 == 4 is a concurrency case
#: Seconds a child (or a concurrent case's workers) may take before it counts as hung.
CHILD_TIMEOUT = 300.0
#: The children's lease. A killed child's run is taken over at once by the next one (its
#: owner was a process on this machine that no longer exists), so the length costs
#: sequential cases nothing; in concurrent cases it must outlast a save on a loaded
#: store, or a live owner "loses" its lease and repeats a step legitimately (the
#: at-least-once bound allows it) where this harness counts only deaths.
LEASE = 2.0


# -- starting children ------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment of a spawned child or shard: ``src`` and ``tools`` on the path."""
    env = dict(os.environ)
    paths = [str(REPO / "src"), str(REPO / "tools")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@dataclasses.dataclass
class Exit:
    """How a child ended: ``signal`` (9 for SIGKILL) or ``status``, plus its result."""

    status: int | None
    signal: int | None
    result: dict[str, Any]


def _fork(target: Callable[[], tuple[int, dict[str, Any]]]) -> tuple[int, int]:
    """Fork a child running ``target``; return (pid, read end of its result pipe)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = ERROR_EXIT
        try:
            os.close(read_fd)
            try:
                code, result = target()
            except BaseException as exc:  # noqa: BLE001 - reported to the driver, which calls it a violation
                result = {"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()}
                code = ERROR_EXIT
            data = json.dumps(result).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view) :]
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _collect(pid: int, read_fd: int, timeout: float = CHILD_TIMEOUT) -> Exit:
    """Read a forked child's result and reap it; a child that hangs is killed and reported."""
    chunks = []
    deadline = time.monotonic() + timeout
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([pipe], [], [], max(0.0, left))
            if not ready:
                _kill(pid)
                return Exit(ERROR_EXIT, None, {"error": f"hung: no exit within {timeout:g} s"})
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    return _exit_of(status, b"".join(chunks))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _exit_of(status: int, data: bytes) -> Exit:
    try:
        result = json.loads(data) if data.strip() else {}
    except ValueError:
        result = {"error": "unreadable child output", "raw": data[-2000:].decode(errors="replace")}
    if os.WIFSIGNALED(status):
        return Exit(None, os.WTERMSIG(status), result)
    return Exit(os.WEXITSTATUS(status), None, result)


def run_child(
    kind: str, spec: dict[str, Any], spawn: bool, local: Callable[[], tuple[int, dict[str, Any]]]
) -> Exit:
    """Run one child to its end (exit or death): forked, or a fresh interpreter if ``spawn``."""
    if not spawn:
        pid, fd = _fork(local)
        return _collect(pid, fd)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "chaos", kind, json.dumps(spec)],
            capture_output=True,
            env=child_env(),
            timeout=CHILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:  # killed by subprocess.run
        return Exit(ERROR_EXIT, None, {"error": f"hung: no exit within {CHILD_TIMEOUT:g} s"})
    status = proc.returncode
    if status < 0:
        return Exit(None, -status, {})
    out = proc.stdout if status != ERROR_EXIT else proc.stdout + proc.stderr
    return _exit_of(status << 8, out)


# -- the driver -------------------------------------------------------------------------


@dataclasses.dataclass
class CaseResult:
    """What one case did, and what went wrong."""

    backend: str
    seed: int
    case: int
    kind: str
    processes: int = 0
    deaths: Counter[str] = dataclasses.field(default_factory=Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    conflicts: int = 0
    mode: str = "sync"
    lease: float = LEASE
    #: Every run id the case used (the final sweep looks for pieces under each).
    run_ids: list[str] = dataclasses.field(default_factory=list)
    #: Acknowledged saves (churn cases; the runner's saves are not counted).
    saves: int = 0

    def repro(self, big: bool = False) -> str:
        """The command line that reruns exactly this case."""
        extra = " --big" if big else ""
        if self.mode != "sync":
            extra += f" --mode {self.mode}"
        if self.lease != LEASE:
            extra += f" --lease {self.lease:g}"
        return (
            f"scripts/chaos --backend {self.backend} --seed {self.seed} --case {self.case}{extra}"
        )


@dataclasses.dataclass
class Options:
    """How a shard runs."""

    backend: str
    config: str
    workdir: str
    seed: int = 1
    big: bool = False
    spawn: bool = False
    max_deaths: int = 8
    fsync_effects: bool = True
    kill_probability: float = 0.9
    shard: int = 0
    verbose: bool = False
    mode: str = "sync"
    #: Seconds of the children's lease (``run(..., lease=)``): each death makes the next
    #: process wait this long for the dead owner's lease to expire. Short, so deaths stay
    #: cheap; long enough that a live worker renews it on a busy machine.
    lease: float = LEASE
    #: Long-state cases (a growing transcript saved in pieces): None, half the cases
    #: (seeded); True, every case; False, none (the cases as they were before pieces).
    long: bool | None = None
    #: Churn cases (``churn.py``: long states deleted and started again, killed inside
    #: piece writes, deletes and collections) as every 5th case, and the final sweep.
    churn: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    @property
    def budget(self) -> int:
        """The largest state this shard's workflows generate."""
        return BIG_BUDGET.get(self.backend, DEFAULT_BUDGET) if self.big else DEFAULT_BUDGET


def _plan_kill(
    rng: random.Random, opts: Options, wf: Workflow, length: int, cp: Any
) -> dict[str, Any] | None:
    """Choose a point this child can reach and the occurrence to die at."""
    start = -1 if cp is None else cp.step
    remaining = wf.steps[start + 1 : length]
    if not remaining:
        return None
    n = len(remaining)
    points: list[tuple[str, int]] = [
        ("runner.before_step", n),
        ("step.inside", n),
        ("runner.after_step", n),
        ("runner.after_save", n),
    ]
    saves = n + sum(1 for s in remaining if s.max_attempts is not None)
    points += [(p, saves) for p in kill_points(opts.backend)]
    if wf.grow:
        # Only a long state's saves reach these, and a collection only the saves that
        # write a new base: the first occurrence, twice the weight, so a small run
        # still dies at each of them.
        points += [(p, 1) for p in piece_kill_points(opts.backend)] * 2
    attempt = 0 if cp is None else cp.attempt
    fails = sum(
        max(0, s.fail - (attempt if s is remaining[0] else 0)) for s in remaining if s.max_attempts
    )
    # Only some children can reach these two: twice the weight, so that a small (CI) run
    # still dies at each of them.
    if fails:
        points += [("runner.backoff", fails)] * 2
    if cp is not None:
        points += [("resume", 1)] * 2
    point, most = rng.choice(points)
    # Early occurrences more often: a process that dies early leaves more for the next.
    nth = min(most, 1 + int(rng.expovariate(1.0) * max(1, most) / 2))
    return {"point": point, "nth": nth}


def run_case(  # noqa: C901 - one branch per kill point of a case, read top to bottom
    opts: Options,
    case: int,
    store: Store,
    watch: Callable[[CaseResult, str], None] | None = None,
) -> CaseResult:
    """Run one case against the open ``store`` (the driver's own handle, for checks)."""
    if case % CONCURRENT_EVERY == CONCURRENT_EVERY - 1:
        return _run_concurrent(opts, case, store, watch)
    if opts.churn and case % CHURN_EVERY == 2:
        return run_churn(opts, case, store, watch)  # type: ignore[no-any-return]
    res = CaseResult(opts.backend, opts.seed, case, "single", mode=opts.mode, lease=opts.lease)
    save_points = save_kill_points(opts.backend)
    wf = make_workflow(opts.seed, case, opts.budget, opts.max_deaths, opts.long)
    res.run_ids = [wf.run_id]
    expected = expected_states(wf)
    rng = random.Random(f"stepstone-chaos:{opts.seed}:{case}:kills")
    effects = os.path.join(opts.workdir, f"effects-{case}.log")
    notes = os.path.join(opts.workdir, f"notes-{case}.log")
    for path in (effects, notes):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    stage = 0
    deaths = 0
    starts: dict[int, int] = {}  # proc -> last completed step when it started
    ends: dict[int, int] = {}
    died: dict[int, dict[str, Any]] = {}
    hits: Counter[int] = Counter()
    prev = -1
    last_exit: Exit | None = None
    cp = load_checked(res.violations, store, wf.run_id, "before the first process")
    if cp is not None:
        res.violations.append(f"run {wf.run_id!r} exists before the case started")
        return res
    limit = opts.max_deaths * 3 + 3 * len(wf.steps) + 10
    for proc in range(limit):
        length = wf.stages[stage]
        done = False
        if cp is not None and cp.step + 1 >= length:
            if stage + 1 == len(wf.stages):
                if last_exit is not None and last_exit.status == 0:
                    break
                # A death finished the run: one more process must find it done, run nothing.
                done = True
            else:
                stage += 1  # the run is done at this length: resume it with steps appended
                length = wf.stages[stage]
        elif cp is not None and stage + 1 < len(wf.stages) and rng.random() < 0.1:
            stage += 1  # append steps to a run that is not done yet
            length = wf.stages[stage]
        kill = None
        if not done and deaths < opts.max_deaths and rng.random() < opts.kill_probability:
            kill = _plan_kill(rng, opts, wf, length, cp)
        start = -1 if cp is None else cp.step
        starts[proc] = start
        spec = {
            "config": opts.config,
            "seed": opts.seed,
            "case": case,
            "budget": opts.budget,
            "long": opts.long,
            "max_deaths": opts.max_deaths,
            "length": length,
            "effects": effects,
            "notes": notes,
            "proc": proc,
            "start_step": start,
            "kill": kill,
            "fsync": opts.fsync_effects,
            "mode": opts.mode,
            "lease": opts.lease,
        }
        ex = run_child("child", spec, opts.spawn, functools.partial(child_main, spec, wf))
        res.processes += 1
        last_exit = ex
        if opts.verbose:
            how = f"killed (SIGKILL) at {kill}" if ex.signal else f"exit {ex.status} {ex.result}"
            print(f"  process {proc}: length {length}, started at step {start}: {how}", flush=True)
        where = f"after process {proc} ({'killed at ' + str(kill) if ex.signal else 'exit'})"
        if ex.signal is not None:
            if ex.signal != signal.SIGKILL or kill is None:
                res.violations.append(f"process {proc} died of signal {ex.signal} unplanned")
                break
            deaths += 1
            res.deaths[kill["point"]] += 1
        elif ex.status == STEP_FAILED_EXIT:
            spec_failed = wf.steps[ex.result["failed"]]
            if spec_failed.max_attempts is not None:
                res.violations.append(
                    f"process {proc}: step {spec_failed.name!r} failed with its retry budget "
                    f"({spec_failed.max_attempts} attempts for {spec_failed.fail} planned "
                    f"failures and at most {opts.max_deaths} deaths) exhausted: {ex.result}"
                )
                break
        elif ex.status != 0:
            res.violations.append(f"process {proc} crashed: {ex.result.get('tb') or ex.result}")
            break
        cp = load_checked(res.violations, store, wf.run_id, where)
        if cp is None and res.violations:
            break
        check_checkpoint(res.violations, wf, expected, cp, where)
        step = -1 if cp is None else cp.step
        ends[proc] = step
        if step < prev:
            res.violations.append(f"{where}: progress went back from step {prev} to {step}")
        prev = step
        if ex.status == 0 and (
            step + 1 != length or ex.result.get("digest") != digest(expected[length - 1])
        ):
            res.violations.append(
                f"{where}: run() returned but the run is at step {step} of {length} or "
                f"its result differs from the crash-free state"
            )
        if ex.signal is not None:
            notes_now = [json.loads(line) for line in read_lines(notes)]
            note = next((n for n in notes_now if n["proc"] == proc), None)
            if note is None:
                res.violations.append(f"{where}: killed without a death note")
            else:
                died[proc] = note
                check_save_kill(res.violations, save_points, note, step, where)
                if note["ok"] and note["step"] > step:
                    hits[note["step"]] += 1
        if watch is not None:
            watch(res, where)
        if res.violations:
            break
    else:
        res.violations.append(f"run not finished after {limit} processes")
    if not res.violations:
        if last_exit is None or last_exit.status != 0:
            res.violations.append(f"the last process did not finish the run: {last_exit}")
        check_final(res.violations, wf, effects, starts, ends, died, hits)
    if not res.violations:
        for path in (effects, notes):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return res


# -- concurrency ------------------------------------------------------------------------


def _run_concurrent(  # noqa: C901 - one branch per racing writer's outcome, read top to bottom
    opts: Options, case: int, store: Store, watch: Callable[[CaseResult, str], None] | None
) -> CaseResult:
    res = CaseResult(opts.backend, opts.seed, case, "concurrent", mode=opts.mode, lease=opts.lease)
    rng = random.Random(f"stepstone-chaos:{opts.seed}:{case}:concurrent")
    n_runs = rng.randint(1, 3)
    n_workers = rng.randint(2, 4)
    budget = min(opts.budget, 64 * 1024)
    # Generous attempt budgets: racing workers each begin attempts of the same step.
    wf_cases = [case * 100 + j for j in range(n_runs)]
    wfs = [make_workflow(opts.seed, c, budget, 200, opts.long) for c in wf_cases]
    wfs = [dataclasses.replace(wf, run_id=f"{wf.run_id}/c{case}") for wf in wfs]
    res.run_ids = [wf.run_id for wf in wfs]
    expected = [expected_states(wf) for wf in wfs]
    effects = os.path.join(opts.workdir, f"effects-{case}.log")
    notes = os.path.join(opts.workdir, f"notes-{case}.log")
    for path in (effects, notes):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    death_budget = opts.max_deaths * 2
    deaths = planned = 0
    running: dict[int, tuple[int, int, dict[str, Any] | None]] = {}  # pid -> (proc, fd, kill)
    next_proc = 0
    prev = [-1] * n_runs
    points = [
        "runner.before_step",
        "step.inside",
        "runner.after_step",
        "runner.after_save",
        "runner.backoff",
        *save_kill_points(opts.backend),
    ]

    def start() -> None:
        nonlocal next_proc, planned
        kill = None
        if planned < death_budget:
            planned += 1
            kill = {"point": rng.choice(points), "nth": rng.randint(1, 6)}
        spec = {
            "config": opts.config,
            "seed": opts.seed,
            "cases": wf_cases,
            "budget": budget,
            "long": opts.long,
            "max_deaths": 200,
            "effects": effects,
            "notes": notes,
            "proc": next_proc,
            "kill": kill,
            "fsync": opts.fsync_effects,
            "mode": opts.mode,
            "lease": opts.lease,
        }
        pid, fd = _fork(lambda: worker_main(spec, wfs))
        running[pid] = (next_proc, fd, kill)
        next_proc += 1

    if opts.spawn:
        res.violations.append("concurrent cases run forked only")
        return res
    for _ in range(n_workers):
        start()
    finished = 0
    deadline = time.monotonic() + CHILD_TIMEOUT
    while running:
        # Wait for whichever worker ends first.
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if time.monotonic() > deadline:
                res.violations.append(
                    f"concurrent case {case}: workers {sorted(p for p, _, _ in running.values())} "
                    f"hung (no exit within {CHILD_TIMEOUT:g} s); killed"
                )
                break
            time.sleep(0.002)  # polling: os.wait() has no timeout
            continue
        if pid not in running:
            continue
        proc, fd, kill = running.pop(pid)
        with os.fdopen(fd, "rb") as pipe:
            ex = _exit_of(status, pipe.read())
        res.processes += 1
        where = f"after worker {proc} of concurrent case {case}"
        if ex.signal is not None:
            if ex.signal != signal.SIGKILL or kill is None:
                res.violations.append(f"worker {proc} died of signal {ex.signal} unplanned")
                break
            deaths += 1
            res.deaths[kill["point"]] += 1
            start()
        elif ex.status != 0:
            res.violations.append(f"worker {proc} crashed: {ex.result.get('tb') or ex.result}")
            break
        else:
            res.conflicts += ex.result.get("conflicts", 0)
            finished += 1
        for j, wf in enumerate(wfs):
            cp = load_checked(res.violations, store, wf.run_id, where)
            check_checkpoint(res.violations, wf, expected[j], cp, f"{where}, run {j}")
            step = -1 if cp is None else cp.step
            if step < prev[j]:
                res.violations.append(f"{where}: run {j} went back from step {prev[j]} to {step}")
            prev[j] = max(prev[j], step)
        if watch is not None:
            watch(res, where)
        if res.violations:
            break
    for pid, (_, fd, _) in list(running.items()):  # only after a violation
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    if not res.violations:
        check_concurrent_end(res.violations, store, wfs, expected, effects)
    if not res.violations:
        for path in (effects, notes):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return res


# -- a shard: many cases on one store -----------------------------------------------------


@dataclasses.dataclass
class Stats:
    """Totals of a shard (or of many of one backend and mode, added up)."""

    backend: str
    scenarios: Counter[str] = dataclasses.field(default_factory=Counter)
    processes: int = 0
    deaths: Counter[str] = dataclasses.field(default_factory=Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    conflicts: int = 0
    mode: str = "sync"
    #: Acknowledged saves of churn cases; orphans the final sweep collected; pieces it
    #: found left after deleting every run and collecting (must be 0).
    saves: int = 0
    orphans: int = 0
    pieces_left: int = 0

    def add(self, other: Stats) -> None:
        """Add another shard's totals (its seconds overlap ours: the longest counts)."""
        self.scenarios.update(other.scenarios)
        self.processes += other.processes
        self.deaths.update(other.deaths)
        self.violations += other.violations
        self.seconds = max(self.seconds, other.seconds)
        self.conflicts += other.conflicts
        self.saves += other.saves
        self.orphans += other.orphans
        self.pieces_left += other.pieces_left

    def to_json(self) -> dict[str, Any]:
        """Return the totals as a JSON object (a shard's last line of output)."""
        return {
            "backend": self.backend,
            "mode": self.mode,
            "scenarios": dict(self.scenarios),
            "processes": self.processes,
            "deaths": dict(self.deaths),
            "violations": self.violations,
            "seconds": self.seconds,
            "conflicts": self.conflicts,
            "saves": self.saves,
            "orphans": self.orphans,
            "pieces_left": self.pieces_left,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        """Read what ``to_json`` wrote."""
        return cls(
            data["backend"],
            Counter(data["scenarios"]),
            data["processes"],
            Counter(data["deaths"]),
            list(data["violations"]),
            data["seconds"],
            data.get("conflicts", 0),
            data.get("mode", "sync"),
            data.get("saves", 0),
            data.get("orphans", 0),
            data.get("pieces_left", 0),
        )


def run_shard(  # noqa: C901 - the cases, then the shard's end checks, top to bottom
    opts: Options,
    cases: Iterable[int],
    deaths_target: int | None = None,
    time_limit: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Stats:
    """Run ``cases`` on one store, checking the bystanders after every death.

    Stops early at ``deaths_target`` deaths or ``time_limit`` seconds, if given.
    """
    stats = Stats(opts.backend, mode=opts.mode)
    began = time.monotonic()
    quiet = logging.getLogger("stepstone")  # retries log warnings; thousands of them
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    os.makedirs(opts.workdir, exist_ok=True)
    store = open_store(opts.config)
    try:
        bystanders = seed_bystanders(store, opts.seed, opts.shard)
        fixed = set(bystanders)
        finished: dict[str, tuple[Any, ...]] = {}
        used: set[str] = set(bystanders)

        def watch(res: CaseResult, where: str) -> None:
            for run_id, snap in bystanders.items():
                try:
                    now = snapshot(store, run_id)
                except Exception as exc:  # noqa: BLE001 - any error is the bystander's new state, compared below
                    now = (f"{type(exc).__name__}: {exc}",)
                if now != snap:
                    res.violations.append(f"{where}: bystander run {run_id!r} changed")

        for case in cases:
            res = run_case(opts, case, store, watch)
            stats.scenarios[res.kind] += 1
            stats.processes += res.processes
            stats.deaths.update(res.deaths)
            stats.conflicts += res.conflicts
            stats.saves += res.saves
            used.update(res.run_ids)
            if res.violations:
                line = f"VIOLATION {res.repro(opts.big)}  # {res.violations[0]}"
                stats.violations.append(line)
                if log is not None:
                    log(line)
                    for extra in res.violations[1:5]:
                        log(f"    also: {extra}")
            elif res.kind == "single":
                wf = make_workflow(opts.seed, case, opts.budget, opts.max_deaths, opts.long)
                finished[wf.run_id] = snapshot(store, wf.run_id)
                # Recent finished runs join the bystanders watched after every death.
                bystanders[wf.run_id] = finished[wf.run_id]
                if len(bystanders) > len(fixed) + 4:
                    oldest = next(k for k in bystanders if k not in fixed)
                    del bystanders[oldest]
            total = sum(stats.deaths.values())
            if deaths_target is not None and total >= deaths_target:
                break
            if time_limit is not None and time.monotonic() - began > time_limit:
                break
        for run_id, snap in finished.items():  # every run finished in this shard, untouched
            if snapshot(store, run_id) != snap:
                stats.violations.append(f"VIOLATION finished run {run_id!r} changed later")
        if opts.churn and not stats.violations:
            swept: list[str] = []
            stats.orphans, stats.pieces_left = final_sweep(swept, store, used)
            stats.violations += [f"VIOLATION {line}" for line in swept]
    finally:
        store.close()
    stats.seconds = time.monotonic() - began
    return stats
