"""The chaos harness: generated workflows, real process deaths at chosen points, resume.

Everything is derived from ``(seed, case)``, so any failing case reruns exactly with::

    scripts/chaos --backend file --seed 1234 --case 17

Backends: ``file``, ``sqlite``, ``cosmos`` (a local emulator, started by ``scripts/chaos``
itself unless ``--cosmos-config`` names one), ``postgresql`` and ``mysql`` (loopback
servers; every shard gets its own table, ``?table=chaos_...``, dropped at the end).

A *case* is either

- **single**: one generated workflow (1-12 steps, states from a few bytes to the size
  budget, steps that fail and are retried, steps appended on a resume) run by a chain of
  child processes. Each child is given a kill plan (a point and an occurrence, chosen
  by a seeded RNG from what the child can reach) and dies there by ``SIGKILL``; the
  next child reopens the store from the config string and resumes, until the run is
  done. Deterministic: the same case dies at the same places every time.
- **concurrent** (every 5th case): several worker processes run the same few runs at
  once, losers of a save get ``ConflictError`` and call ``run`` again later, and workers
  are killed at random points and replaced. The plan is seeded; the interleaving is not.

Children are ``os.fork``-ed from the warmed-up driver (stepstone already imported), or
with ``spawn=True`` started as ``python -m stepstone.testing._chaos child SPEC``. Either
way each child is a separate process that really dies.

Checked after every death and at the end (any failure is a *violation*):

- the checkpoint loads (never torn or unreadable), its completed steps are a prefix of
  the workflow, its state equals the crash-free state after that step, and progress
  never goes backwards;
- a kill inside a save leaves the old or the new checkpoint, as the backend promises;
- the final state equals the crash-free run's final state, computed in the driver
  from the same seed without the runner;
- each step's side effect (an fsynced line in an effects file) happened at least once
  and at most ``1 + deaths that hit that step's window`` times; no process ran a step
  that was already completed when it started; retried attempts are numbered strictly
  increasing across deaths (the attempt count is durable);
- the stored checkpoints of other runs (bystanders, and every run finished earlier in
  the shard) are unchanged; for the file store their raw bytes too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import _hooks
from .._errors import ConflictError, StepFailed
from .._registry import open_store
from .._runner import RetryPolicy, Step, StepContext, run
from .._store import Store

__all__ = [
    "BACKENDS",
    "STORE_POINTS",
    "CaseResult",
    "Stats",
    "Workflow",
    "expected_states",
    "make_workflow",
    "render_table",
    "run_case",
    "run_shard",
]

BACKENDS = ("file", "sqlite", "cosmos", "postgresql", "mysql")

#: Hook points inside a save, per backend, mapped to whether the checkpoint being saved is
#: visible after a death there (None: either is correct, e.g. a request on the wire).
STORE_POINTS: dict[str, dict[str, bool | None]] = {
    "file": {
        "file.after_temp_write": False,
        "file.after_rename": True,
        "file.before_dir_fsync": True,
    },
    "sqlite": {"sqlite.in_transaction": False},
    "cosmos": {"cosmos.before_request": False, "cosmos.request_sent": True},
    # One autocommit statement per save: not sent yet (old stays), or executed and
    # acknowledged with the result not read yet (new visible).
    "postgresql": {"sql.before_request": False, "sql.request_sent": True},
    "mysql": {"sql.before_request": False, "sql.request_sent": True},
}

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

#: Largest state a default (CI) run generates; ``big`` goes near each backend's limit.
DEFAULT_BUDGET = 256 * 1024
BIG_BUDGET = {
    "file": 60 * 1024 * 1024,  # limit 64 MiB per document
    "sqlite": 64 * 1024 * 1024,  # limit ~1 GB (SQLITE_MAX_LENGTH): 64 MiB is as far as is sane
    "cosmos": 1_900_000,  # limit 2 MB per item, metadata included
    "postgresql": 64 * 1024 * 1024,  # limit 1 GiB per value: 64 MiB is as far as is sane
    "mysql": 12 * 1024 * 1024,  # limit: the server's max_allowed_packet (16 MiB by default)
}
SLOTS = 3  # state keys the big payloads rotate through, so the state stays within budget
CONCURRENT_EVERY = 5  # case % 5 == 4 is a concurrency case
STEP_FAILED_EXIT = 11
ERROR_EXIT = 12


# -- the generated workflow ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One generated step: its name, payload size and slot, and how it fails."""

    index: int
    name: str
    size: int
    slot: int
    fail: int  # attempts that raise (attempt number <= fail)
    max_attempts: int | None  # None: no retry policy (a failure ends the process's run)


@dataclasses.dataclass(frozen=True)
class Workflow:
    """A generated workflow: its steps and the lengths it is run with, growing."""

    key: str
    steps: tuple[StepSpec, ...]
    stages: tuple[int, ...]  # step counts passed to run(); the last is len(steps)
    run_id: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)


_NAME_WORDS = ("fetch", "parse", "embed", "rank", "store", "notify", "ü-norm", "日本", "x y")
_RUN_ID_SHAPES = ("chaos/{k}", "Chaos {k}", "../chaos-{k}", "é-{k}-日本", "{k}?x=1#y", "{long}")


def make_workflow(
    seed: int, case: int, budget: int = DEFAULT_BUDGET, max_deaths: int = 8
) -> Workflow:
    """Return the workflow of ``(seed, case)``: the same one in every process, every time."""
    rng = random.Random(f"stepstone-chaos:{seed}:{case}:workflow")
    count = rng.randint(1, 12)
    slot_size = max(1, int(budget * 0.9) // SLOTS - 64)
    big_step = rng.randrange(count) if rng.random() < 0.3 else -1
    steps = []
    for index in range(count):
        if index == big_step:
            size = rng.randint(slot_size // 2, slot_size)
        else:
            size = int(math.exp(rng.uniform(0, math.log(slot_size + 1)))) - 1
        kind = rng.random()
        if kind < 0.25:  # retried with zero delay; the budget covers every planned death
            fail = rng.randint(1, 3)
            policy: int | None = fail + 1 + max_deaths
        elif kind < 0.35:  # retried, never fails: attempts are still counted durably
            fail, policy = 0, 1 + max_deaths
        elif kind < 0.40:  # no retry: StepFailed, and the next process's run() tries again
            fail, policy = 1, None
        else:
            fail, policy = 0, None
        name = f"s{index}-{rng.choice(_NAME_WORDS)}"
        steps.append(StepSpec(index, name, size, rng.randrange(SLOTS), fail, policy))
    stages = sorted({rng.randint(1, count) for _ in range(rng.randint(0, 2))} | {count})
    shape = rng.choice(_RUN_ID_SHAPES)
    run_id = shape.format(k=f"{seed}-{case}", long=f"{seed}-{case}-" + "L" * 600)
    return Workflow(f"{seed}:{case}", tuple(steps), tuple(stages), run_id)


def payload(key: str, size: int) -> str:
    """Return a deterministic string of ``size`` characters (non-ASCII at the front)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return ("é🚀" + digest * (size // 64 + 1))[:size]


def step_output(wf: Workflow, index: int, state: dict[str, Any]) -> dict[str, Any]:
    """The step's update: depends on the incoming state, so a wrong input shows in the output."""
    spec = wf.steps[index]
    acc = state.get("acc", 7)
    if not isinstance(acc, int):
        acc = -999_999  # a state the step never produced: the result will not match
    # Mostly above 2**53 on purpose: Cosmos DB keeps JSON numbers as doubles, and a store
    # that let it round them would change the state across a resume (found here; fixed
    # in 39a5ecd, test_regressions.py: test_cosmos_rounds_integers_beyond_2_53_silently).
    acc = (acc * 1_000_003 + (index + 1) * 7919 + len(state)) % (2**61 - 1)
    return {
        "acc": acc,
        "last": spec.name,
        f"n{index}": [index, spec.size],
        f"slot{spec.slot}": payload(f"{wf.key}:{index}", spec.size),
    }


def expected_states(wf: Workflow) -> list[dict[str, Any]]:
    """Return the crash-free state after each step, computed without the runner or a store."""
    states: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    for index in range(len(wf.steps)):
        state = json.loads(json.dumps({**state, **step_output(wf, index, state)}))
        states.append(state)
    return states


def digest(state: Any) -> str:
    """Return a short digest of a JSON value (key order ignored)."""
    text = json.dumps(state, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# -- the child process ------------------------------------------------------------------


class StepBoom(RuntimeError):
    """A planned step failure."""


def _append(path: str, line: str, sync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _die(note_path: str | None, note: dict[str, Any]) -> None:
    if note_path is not None:
        _append(note_path, json.dumps(note), sync=False)  # page cache outlives the process
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached: SIGKILL cannot be caught


class _Killer:
    """The installed hook: counts firings of the planned point and dies at the planned one."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.kill: dict[str, Any] | None = spec.get("kill")
        self.note_path: str | None = spec.get("notes")
        self.proc = spec.get("proc", 0)
        self.counts: Counter[str] = Counter()
        self.step = int(spec.get("start_step", -1)) + 1  # index of the step in progress
        self.ok: set[int] = set()
        self.phase = "other"
        self.first_before = True

    def __call__(self, point: str) -> None:
        if point == "runner.after_step":
            self.phase = "step_save"
        kill = self.kill
        if kill is not None:
            name = point
            if point == "runner.before_step" and self.first_before:
                self.first_before = False
                if kill["point"] == "resume":
                    name = "resume"
            if name == kill["point"]:
                self.counts[name] += 1
                if self.counts[name] == kill["nth"]:
                    _die(
                        self.note_path,
                        {
                            "proc": self.proc,
                            "point": kill["point"],
                            "nth": kill["nth"],
                            "step": self.step,
                            "phase": self.phase,
                            "ok": self.step in self.ok,
                        },
                    )
        if point == "runner.after_save":
            self.phase = "other"
            self.step += 1


def _failures(effects: str, run_key: str, index: int) -> int:
    want = f" {run_key} {index} "
    return sum(1 for line in _read_lines(effects) if want in line and line.endswith(" fail"))


def _build_steps(
    wf: Workflow,
    length: int,
    effects: str,
    killer: _Killer | None,
    tag: str,
    fsync: bool,
    run_key: str = "0",
) -> list[Step]:
    def make(spec: StepSpec) -> Step:
        index = spec.index

        def fn(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            # The first ``fail`` invocations fail, counted across processes in the effects
            # file (attempt numbers restart after a final failure, so they cannot say).
            failing = spec.fail > 0 and _failures(effects, run_key, index) < spec.fail
            if killer is not None:
                killer.step = index
            outcome = "fail" if failing else "ok"
            _append(effects, f"{tag} {run_key} {index} {ctx.attempt} {outcome}", fsync)
            if killer is not None:
                if not failing:
                    killer.ok.add(index)
                killer("step.inside")
            if failing:
                # Dirty the working state first: the next attempt must get a pristine copy.
                state["acc"] = "dirty"
                state["junk"] = ctx.attempt
                raise StepBoom(f"{spec.name} fails on attempt {ctx.attempt}")
            return step_output(wf, index, state)

        policy = None
        if spec.max_attempts is not None:
            policy = RetryPolicy(max_attempts=spec.max_attempts, initial_delay=0.0, jitter=0.0)
        return Step(spec.name, fn, retry=policy)

    return [make(spec) for spec in wf.steps[:length]]


def child_main(spec: dict[str, Any], wf: Workflow | None = None) -> tuple[int, dict[str, Any]]:
    """Run one child's share of a single case; return (exit status, result)."""
    if wf is None:
        wf = make_workflow(spec["seed"], spec["case"], spec["budget"], spec["max_deaths"])
    killer = _Killer(spec)
    _hooks.install(killer)
    steps = _build_steps(
        wf, spec["length"], spec["effects"], killer, str(spec["proc"]), spec.get("fsync", True)
    )
    with open_store(spec["config"]) as store:
        try:
            final = run(wf.run_id, steps, store)
        except StepFailed as exc:
            return STEP_FAILED_EXIT, {"failed": exc.step_index, "attempt": exc.attempt}
    return 0, {"digest": digest(final), "keys": len(final)}


def worker_main(
    spec: dict[str, Any], wfs: list[Workflow] | None = None
) -> tuple[int, dict[str, Any]]:
    """One concurrent worker: run every run to the end, retrying after conflicts."""
    if wfs is None:
        wfs = [
            make_workflow(spec["seed"], case, spec["budget"], spec["max_deaths"])
            for case in spec["cases"]
        ]
    killer = _Killer(spec)
    _hooks.install(killer)
    rng = random.Random(f"{spec['seed']}:{spec['proc']}:worker")
    conflicts = failures = 0
    with open_store(spec["config"]) as store:
        pending = list(range(len(wfs)))
        rng.shuffle(pending)
        while pending:
            i = pending.pop(0)
            wf = wfs[i]
            steps = _build_steps(
                wf, len(wf.steps), spec["effects"], killer, str(spec["proc"]), spec["fsync"], str(i)
            )
            try:
                run(wf.run_id, steps, store)
            except ConflictError:
                conflicts += 1
                pending.append(i)
                time.sleep(rng.random() * 0.002)
            except StepFailed:
                failures += 1
                if failures > 1000:
                    raise
                pending.append(i)
    return 0, {"conflicts": conflicts, "failures": failures}


# -- starting children ------------------------------------------------------------------


def _src_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
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
            except BaseException as exc:  # reported to the driver, which calls it a violation
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


def _collect(pid: int, read_fd: int) -> Exit:
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        chunks.append(pipe.read())
    _, status = os.waitpid(pid, 0)
    return _exit_of(status, b"".join(chunks))


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
    proc = subprocess.run(
        [sys.executable, "-m", "stepstone.testing._chaos", kind, json.dumps(spec)],
        capture_output=True,
        env=_src_env(),
        timeout=600,
        check=False,
    )
    status = proc.returncode
    if status < 0:
        return Exit(None, -status, {})
    out = proc.stdout if status != ERROR_EXIT else proc.stdout + proc.stderr
    return _exit_of(status << 8, out)


# -- bystanders -------------------------------------------------------------------------

BYSTANDER_IDS = ("bystander", "Bystander", "bystander/ü", "by/" + "z" * 400)


def _raw_bytes(store: Store, run_id: str) -> bytes | None:
    """SHA-256 of the stored bytes of a run where the backend makes them cheap to get."""
    from ..stores.file import FileStore, encode_name  # noqa: PLC0415

    if isinstance(store, FileStore):
        path = os.path.join(store.path, encode_name(run_id) + ".json")
        with contextlib.suppress(FileNotFoundError):
            # A digest, not the bytes: the driver forks thousands of times, keep it small.
            return hashlib.sha256(Path(path).read_bytes()).digest()
    return None


def snapshot(store: Store, run_id: str) -> tuple[Any, ...]:
    """What must not change about a run another case never touches."""
    cp = store.load(run_id)
    if cp is None:
        return (None,)
    return (
        cp.version,
        cp.step,
        cp.step_names,
        digest(cp.state),
        cp.updated_at,
        _raw_bytes(store, run_id),
    )


def seed_bystanders(store: Store, seed: int, shard: int = 0) -> dict[str, tuple[Any, ...]]:
    """Create the bystander runs (varied sizes and ids) and return their snapshots."""
    from .._checkpoint import Checkpoint  # noqa: PLC0415

    snaps = {}
    for n, base in enumerate(BYSTANDER_IDS):
        run_id = f"{base}#{shard}"
        if store.load(run_id) is None:
            state = {"who": run_id, "blob": payload(f"by{seed}{n}", 10 ** (n + 1)), "n": n}
            store.save(
                Checkpoint(run_id=run_id, step=0, state=state, step_names=("only",), total_steps=2)
            )
        snaps[run_id] = snapshot(store, run_id)
    return snaps


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

    def repro(self, big: bool = False) -> str:
        extra = " --big" if big else ""
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

    @property
    def budget(self) -> int:
        return BIG_BUDGET[self.backend] if self.big else DEFAULT_BUDGET


def _check_cp(
    res: CaseResult, wf: Workflow, expected: list[dict[str, Any]], cp: Any, where: str
) -> None:
    if cp is None:
        return
    k = cp.step
    if not -1 <= k < len(wf.steps):
        res.violations.append(f"{where}: checkpoint step {k} outside the workflow")
        return
    if cp.step_names != wf.names[: k + 1]:
        res.violations.append(f"{where}: step_names {cp.step_names!r} not a prefix of the workflow")
    want = expected[k] if k >= 0 else {}
    if cp.state != want:
        res.violations.append(
            f"{where}: state after step {k} differs from the crash-free state "
            f"(digest {digest(cp.state)} != {digest(want)}; keys {sorted(cp.state)[:8]})"
        )


def _load(res: CaseResult, store: Store, run_id: str, where: str) -> Any:
    try:
        return store.load(run_id)
    except Exception as exc:
        res.violations.append(f"{where}: checkpoint does not load: {type(exc).__name__}: {exc}")
        return None


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
    points += [(p, saves) for p in STORE_POINTS[opts.backend]]
    attempt = 0 if cp is None else cp.attempt
    fails = sum(
        max(0, s.fail - (attempt if s is remaining[0] else 0)) for s in remaining if s.max_attempts
    )
    if fails:
        points.append(("runner.backoff", fails))
    if cp is not None:
        points.append(("resume", 1))
    point, most = rng.choice(points)
    # Early occurrences more often: a process that dies early leaves more for the next.
    nth = min(most, 1 + int(rng.expovariate(1.0) * max(1, most) / 2))
    return {"point": point, "nth": nth}


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def run_case(
    opts: Options,
    case: int,
    store: Store,
    watch: Callable[[CaseResult, str], None] | None = None,
) -> CaseResult:
    """Run one case against the open ``store`` (the driver's own handle, for checks)."""
    if case % CONCURRENT_EVERY == CONCURRENT_EVERY - 1:
        return _run_concurrent(opts, case, store, watch)
    res = CaseResult(opts.backend, opts.seed, case, "single")
    wf = make_workflow(opts.seed, case, opts.budget, opts.max_deaths)
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
    cp = _load(res, store, wf.run_id, "before the first process")
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
            "max_deaths": opts.max_deaths,
            "length": length,
            "effects": effects,
            "notes": notes,
            "proc": proc,
            "start_step": start,
            "kill": kill,
            "fsync": opts.fsync_effects,
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
        cp = _load(res, store, wf.run_id, where)
        if cp is None and res.violations:
            break
        _check_cp(res, wf, expected, cp, where)
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
            notes_now = [json.loads(line) for line in _read_lines(notes)]
            note = next((n for n in notes_now if n["proc"] == proc), None)
            if note is None:
                res.violations.append(f"{where}: killed without a death note")
            else:
                died[proc] = note
                _check_save_kill(res, opts, note, step, where)
                if note["ok"] and note["step"] > step:
                    hits[note["step"]] += 1
        if watch is not None:
            watch(res, where)
        if res.violations:
            break
    else:
        res.violations.append(f"run not finished after {limit} processes")
    if not res.violations:
        _check_final(res, wf, expected, effects, starts, ends, died, hits, last_exit)
    if not res.violations:
        for path in (effects, notes):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return res


def _check_save_kill(
    res: CaseResult, opts: Options, note: dict[str, Any], step: int, where: str
) -> None:
    visible = STORE_POINTS[opts.backend].get(note["point"])
    if visible is None or note["phase"] != "step_save":
        return
    want = note["step"] if visible else note["step"] - 1
    if step != want:
        res.violations.append(
            f"{where}: killed at {note['point']} while saving step {note['step']}: the "
            f"checkpoint should be at step {want} ({'new' if visible else 'old'}), it is at {step}"
        )


def _check_final(
    res: CaseResult,
    wf: Workflow,
    expected: list[dict[str, Any]],
    effects: str,
    starts: dict[int, int],
    ends: dict[int, int],
    died: dict[int, dict[str, Any]],
    hits: Counter[int],
    last_exit: Exit | None,
) -> None:
    if last_exit is None or last_exit.status != 0:
        res.violations.append(f"the last process did not finish the run: {last_exit}")
    ok: Counter[int] = Counter()
    attempts: dict[int, list[int]] = {}
    per_proc: dict[int, list[int]] = {}
    for line in _read_lines(effects):
        proc_s, _run, index_s, attempt_s, outcome = line.split()
        proc, index, attempt = int(proc_s), int(index_s), int(attempt_s)
        if index <= starts.get(proc, -1):
            res.violations.append(
                f"process {proc} ran step {index}, completed before it started (at {starts[proc]})"
            )
        attempts.setdefault(index, []).append(attempt)
        if outcome == "ok":
            ok[index] += 1
            per_proc.setdefault(proc, []).append(index)
    for proc, indexes in per_proc.items():
        if len(set(indexes)) != len(indexes):
            res.violations.append(f"process {proc} ran a step to success twice: {indexes}")
        lost = [i for i in indexes if i > ends.get(proc, -1)]
        if proc not in died and lost:
            res.violations.append(f"process {proc} ended normally but steps {lost} are not saved")
        if proc in died and len(lost) > 1:
            res.violations.append(f"process {proc} died with more than one unsaved step: {lost}")
    for spec in wf.steps:
        i = spec.index
        if ok[i] < 1:
            res.violations.append(f"step {i} ({spec.name!r}): side effect never happened")
        if ok[i] > 1 + hits[i]:
            res.violations.append(
                f"step {i} ({spec.name!r}): side effect happened {ok[i]} times, allowed "
                f"1 + {hits[i]} deaths in its window"
            )
        seen = attempts.get(i, [])
        if spec.max_attempts is not None and seen != sorted(set(seen)):
            res.violations.append(
                f"step {i} ({spec.name!r}): attempt numbers repeat or go back across deaths: {seen}"
            )


# -- concurrency ------------------------------------------------------------------------


def _run_concurrent(
    opts: Options, case: int, store: Store, watch: Callable[[CaseResult, str], None] | None
) -> CaseResult:
    res = CaseResult(opts.backend, opts.seed, case, "concurrent")
    rng = random.Random(f"stepstone-chaos:{opts.seed}:{case}:concurrent")
    n_runs = rng.randint(1, 3)
    n_workers = rng.randint(2, 4)
    budget = min(opts.budget, 64 * 1024)
    # Generous attempt budgets: racing workers each begin attempts of the same step.
    wf_cases = [case * 100 + j for j in range(n_runs)]
    wfs = [make_workflow(opts.seed, c, budget, max_deaths=200) for c in wf_cases]
    wfs = [dataclasses.replace(wf, run_id=f"{wf.run_id}/c{case}") for wf in wfs]
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
        *STORE_POINTS[opts.backend],
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
            "max_deaths": 200,
            "effects": effects,
            "notes": notes,
            "proc": next_proc,
            "kill": kill,
            "fsync": opts.fsync_effects,
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
    while running:
        # Wait for whichever worker ends first.
        pid, status = os.wait()
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
            cp = _load(res, store, wf.run_id, where)
            _check_cp(res, wf, expected[j], cp, f"{where}, run {j}")
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
        ok: Counter[tuple[int, int]] = Counter()
        for line in _read_lines(effects):
            _proc, run_key, index, _attempt, outcome = line.split()
            if outcome == "ok":
                ok[(int(run_key), int(index))] += 1
        for j, wf in enumerate(wfs):
            cp = _load(res, store, wf.run_id, "at the end")
            if cp is None or cp.step != len(wf.steps) - 1 or cp.state != expected[j][-1]:
                res.violations.append(
                    f"run {j} ({wf.run_id!r}) did not finish exactly: step "
                    f"{None if cp is None else cp.step} of {len(wf.steps)}"
                )
            for spec in wf.steps:
                if ok[(j, spec.index)] < 1:
                    res.violations.append(f"run {j} step {spec.index}: side effect never happened")
    if not res.violations:
        for path in (effects, notes):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return res


# -- a shard: many cases on one store -----------------------------------------------------


@dataclasses.dataclass
class Stats:
    """Totals of a shard (or of many, added up)."""

    backend: str
    scenarios: Counter[str] = dataclasses.field(default_factory=Counter)
    processes: int = 0
    deaths: Counter[str] = dataclasses.field(default_factory=Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    conflicts: int = 0

    def add(self, other: Stats) -> None:
        self.scenarios.update(other.scenarios)
        self.processes += other.processes
        self.deaths.update(other.deaths)
        self.violations += other.violations
        self.seconds = max(self.seconds, other.seconds)
        self.conflicts += other.conflicts

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "scenarios": dict(self.scenarios),
            "processes": self.processes,
            "deaths": dict(self.deaths),
            "violations": self.violations,
            "seconds": self.seconds,
            "conflicts": self.conflicts,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(
            data["backend"],
            Counter(data["scenarios"]),
            data["processes"],
            Counter(data["deaths"]),
            list(data["violations"]),
            data["seconds"],
            data.get("conflicts", 0),
        )


def run_shard(
    opts: Options,
    cases: Iterator[int] | list[int],
    deaths_target: int | None = None,
    time_limit: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Stats:
    """Run ``cases`` on one store, checking the bystanders after every death.

    Stops early at ``deaths_target`` deaths or ``time_limit`` seconds, if given.
    """
    stats = Stats(opts.backend)
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

        def watch(res: CaseResult, where: str) -> None:
            for run_id, snap in bystanders.items():
                try:
                    now = snapshot(store, run_id)
                except Exception as exc:
                    now = (f"{type(exc).__name__}: {exc}",)
                if now != snap:
                    res.violations.append(f"{where}: bystander run {run_id!r} changed")

        for case in cases:
            res = run_case(opts, case, store, watch)
            stats.scenarios[res.kind] += 1
            stats.processes += res.processes
            stats.deaths.update(res.deaths)
            stats.conflicts += res.conflicts
            if res.violations:
                line = f"VIOLATION {res.repro(opts.big)}  # {res.violations[0]}"
                stats.violations.append(line)
                if log is not None:
                    log(line)
                    for extra in res.violations[1:5]:
                        log(f"    also: {extra}")
            elif res.kind == "single":
                wf = make_workflow(opts.seed, case, opts.budget, opts.max_deaths)
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
    finally:
        store.close()
    stats.seconds = time.monotonic() - began
    return stats


# -- the table ----------------------------------------------------------------------------

TABLE_TITLE = "### Chaos run"


def machine_line(workdir: str | None = None) -> str:
    """``Machine: N cores, OS, Python; where the stores' files were; date -u``."""
    import platform  # noqa: PLC0415

    where = ""
    if workdir is not None:
        where = f"; files on {_filesystem(workdir)}"
    date = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    return (
        f"Machine: {os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}{where}; `date -u`: {date}."
    )


def _filesystem(path: str) -> str:
    """Return ``DEVICE (FSTYPE)`` of the mount holding ``path``, from /proc/mounts."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="utf-8") as fh:
        for line in fh:
            device, mount, fstype = line.split()[:3]
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best[0]):
                best = (mount, device, fstype)
    kind = "tmpfs, in memory" if best[2] == "tmpfs" else "the real disk, not tmpfs"
    return f"{best[1]} ({best[2]}: {kind})"


def render_table(
    stats: list[Stats], command: str, seconds: float, machine: str | None = None
) -> str:
    """Return the markdown results table (what RESULTS.md and the README hold)."""
    backends = [s.backend for s in stats]
    head = "| | " + " | ".join(backends) + " | total |"
    rule = "|---|" + "---:|" * (len(backends) + 1)
    rows = [TABLE_TITLE, "", f"Command: `{command}`", "", head, rule]

    def row(label: str, values: list[int]) -> str:
        return f"| {label} | " + " | ".join(str(v) for v in values) + f" | {sum(values)} |"

    rows.append(row("scenarios: single workflow", [s.scenarios["single"] for s in stats]))
    rows.append(row("scenarios: concurrent workers", [s.scenarios["concurrent"] for s in stats]))
    rows.append(row("processes started", [s.processes for s in stats]))
    points = list(RUNNER_POINTS) + [p for b in BACKENDS for p in STORE_POINTS[b]]
    for point in dict.fromkeys(points):
        values = [s.deaths[point] for s in stats]
        if any(values):
            rows.append(row(f"deaths at `{point}`", values))
    rows.append(row("**deaths (SIGKILL)**", [sum(s.deaths.values()) for s in stats]))
    rows.append(row("save conflicts (concurrent)", [s.conflicts for s in stats]))
    rows.append(row("**violations**", [len(s.violations) for s in stats]))
    deaths = sum(sum(s.deaths.values()) for s in stats)
    rate = deaths / seconds if seconds > 0 else 0.0
    rows += ["", f"{deaths} process deaths in {seconds:.0f} s wall clock ({rate:.0f} deaths/s)."]
    per = ", ".join(
        f"{s.backend} {sum(s.deaths.values()) / s.seconds:.1f}" for s in stats if s.seconds > 0
    )
    if per:
        rows += ["", f"Deaths/s per backend (each backend's own driver time): {per}."]
    if machine:
        rows += ["", machine]
    return "\n".join(rows) + "\n"


# -- servers: SQL tables, the Cosmos emulator, the README block -------------------------------

#: Where the SQL backends' servers are (loopback, as in tests/test_contract.py); override
#: with STEPSTONE_CHAOS_POSTGRESQL / STEPSTONE_CHAOS_MYSQL (a URL without ``?table=``).
SQL_SERVERS: dict[str, str] = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


def sql_server(backend: str) -> str:
    """Return the server URL of a SQL backend (env override, else the loopback default)."""
    return os.environ.get(f"STEPSTONE_CHAOS_{backend.upper()}") or SQL_SERVERS[backend]


def new_table_name(tag: str = "") -> str:
    """A fresh table name the SQL store accepts (``[a-z_][a-z0-9_]{0,47}``)."""
    import uuid  # noqa: PLC0415

    return f"chaos_{uuid.uuid4().hex[:16]}{tag}"[:40]


def sql_config(backend: str, table: str) -> str:
    return f"{sql_server(backend)}?table={table}"


@contextlib.contextmanager
def _sql_admin(backend: str) -> Iterator[Any]:
    """A plain DBAPI connection (autocommit) to ``backend``'s server, for DDL."""
    from urllib.parse import unquote, urlsplit  # noqa: PLC0415

    url = sql_server(backend)
    if backend == "postgresql":
        import psycopg  # noqa: PLC0415

        conn: Any = psycopg.connect(url, autocommit=True, connect_timeout=3)
    else:
        import pymysql  # noqa: PLC0415

        parts = urlsplit(url)
        conn = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or os.environ.get("STEPSTONE_SQL_PASSWORD", "")),
            database=parts.path.lstrip("/"),
            connect_timeout=3,
            autocommit=True,
        )
    try:
        yield conn
    finally:
        conn.close()


def check_sql_server(backend: str) -> None:
    """Raise (any exception, with the driver's reason) if the server cannot be reached."""
    with _sql_admin(backend) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT 1")


def drop_sql_tables(backend: str, tables: list[str]) -> None:
    """Drop the checkpoint and meta tables a chaos run created."""
    if not tables:
        return
    with _sql_admin(backend) as conn, conn.cursor() as cursor:
        for table in tables:
            cursor.execute(f"DROP TABLE IF EXISTS {table}, {table}_meta")


def load_cosmos_emulator_module() -> Any:
    """Import ``tests/cosmos_emulator.py`` by path (it is a test helper, not a package)."""
    import importlib.util  # noqa: PLC0415

    path = Path(__file__).resolve().parents[3] / "tests" / "cosmos_emulator.py"
    if not path.exists():
        raise SystemExit(f"{path} is missing: give --cosmos-config for an emulator or account")
    spec = importlib.util.spec_from_file_location("cosmos_emulator", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cosmos_emulator", module)
    spec.loader.exec_module(module)
    return module


def cosmos_config(host: str, port: int, container: str, http: bool = False) -> str:
    """The config string of a chaos container on an emulator (key in AZURE_COSMOS_KEY)."""
    protocol = "&protocol=http" if http else ""
    return f"cosmos://{host}:{port}/chaos/{container}?verify=false{protocol}&create=true"


README_BEGIN = "<!-- chaos:begin -->"
README_END = "<!-- chaos:end -->"


def readme_block(readme: str) -> str | None:
    """Return the text between the chaos markers, stripped; None if there are no markers.

    Raises ValueError if the markers are not exactly one begin followed by one end.
    """
    begins, ends = readme.count(README_BEGIN), readme.count(README_END)
    if begins == ends == 0:
        return None
    if begins != 1 or ends != 1:
        raise ValueError(
            f"README.md needs exactly one {README_BEGIN} and one {README_END} "
            f"(found {begins} and {ends})"
        )
    _head, rest = readme.split(README_BEGIN, 1)
    if README_END not in rest:
        raise ValueError(f"{README_END} comes before {README_BEGIN} in README.md")
    return rest.split(README_END, 1)[0].strip()


def update_readme(readme_path: Path, results_path: Path) -> bool:
    """Rewrite the text between the chaos markers with RESULTS.md; True if it changed."""
    readme = readme_path.read_text(encoding="utf-8")
    results = results_path.read_text(encoding="utf-8").strip()
    if readme_block(readme) is None:
        raise SystemExit(
            f"{readme_path} has no {README_BEGIN} / {README_END} markers: add them (each on "
            "its own line) where the table goes, then run scripts/chaos --update-readme"
        )
    head, rest = readme.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    new = f"{head}{README_BEGIN}\n{results}\n{README_END}{tail}"
    if new == readme:
        return False
    readme_path.write_text(new, encoding="utf-8")
    return True


# -- command line ----------------------------------------------------------------------------


def _start_shard(opts: Options, cases: tuple[int, int, int], deaths: int | None) -> Any:
    os.makedirs(opts.workdir, exist_ok=True)
    spec = {
        "options": dataclasses.asdict(opts),
        "cases": list(cases),
        "deaths": deaths,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "stepstone.testing._chaos", "shard", json.dumps(spec)],
        stdout=subprocess.PIPE,
        env=_src_env(),
    )


class _Servers:
    """Config strings per (backend, shard), and what to clean up after the run."""

    def __init__(self, workdir: str, cosmos: str | None, stack: contextlib.ExitStack) -> None:
        self.workdir = workdir
        self.cosmos = cosmos
        self.stack = stack
        self.emulator: Any = None
        self.tables: dict[str, list[str]] = {}

    def prepare(self, backend: str) -> None:
        """Check the backend's server is there (start the Cosmos emulator if needed)."""
        if backend in SQL_SERVERS:
            try:
                check_sql_server(backend)
            except Exception as exc:
                raise SystemExit(
                    f"{backend}: server {sql_server(backend)} unreachable: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            self.tables.setdefault(backend, [])
            self.stack.callback(self._drop, backend)
        elif backend == "cosmos" and not self.cosmos and self.emulator is None:
            module = load_cosmos_emulator_module()
            print("cosmos: starting the emulator (tests/cosmos_emulator.py)...", flush=True)
            try:
                self.emulator = self.stack.enter_context(module.cosmos_emulator())
            except module.CosmosEmulatorError as exc:
                raise SystemExit(f"cosmos: no emulator: {exc}") from None
            os.environ["AZURE_COSMOS_KEY"] = self.emulator.key
            os.environ.pop("AZURE_COSMOS_CONNECTION_STRING", None)
            print(f"cosmos: emulator at {self.emulator.endpoint}", flush=True)

    def _drop(self, backend: str) -> None:
        try:
            drop_sql_tables(backend, self.tables.get(backend, []))
        except Exception as exc:  # reported, never hides the run's own result
            print(f"{backend}: dropping tables {self.tables[backend]} failed: {exc}")

    def config(self, backend: str, shard: int) -> str:
        if backend == "file":
            return f"file://{self.workdir}/{backend}-{shard}/runs"
        if backend == "sqlite":
            return f"sqlite:///{self.workdir}/{backend}-{shard}/runs.db"
        if backend == "cosmos":
            if self.cosmos:
                return self.cosmos
            emu = self.emulator
            http = emu.endpoint.startswith("http://")
            return cosmos_config(emu.host, emu.port, f"chaos-{uuid4_hex()}-{shard}", http)
        if backend in SQL_SERVERS:
            table = new_table_name(f"_{shard}")
            self.tables[backend].append(table)
            return sql_config(backend, table)
        raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def uuid4_hex() -> str:
    import uuid  # noqa: PLC0415

    return uuid.uuid4().hex[:10]


def _deaths_of(values: list[str]) -> dict[str, int]:
    out = {}
    for value in values:
        backend, _, n = value.partition("=")
        if backend not in BACKENDS or not n.isdigit():
            raise SystemExit(f"--deaths-of wants BACKEND=N with BACKEND in {BACKENDS}: {value!r}")
        out[backend] = int(n)
    return out


def cli(argv: list[str]) -> int:
    """``scripts/chaos``: run the harness and print (and save) the results table."""
    import argparse  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    repo = Path(__file__).resolve().parents[3]
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend",
        action="append",
        choices=(*BACKENDS, "all"),
        help="repeatable; 'all' is every backend; default file, sqlite",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--case", type=int, help="rerun exactly this case, verbosely")
    parser.add_argument(
        "--deaths", type=int, default=400, help="process deaths to inject per backend (default 400)"
    )
    parser.add_argument(
        "--deaths-of",
        action="append",
        default=[],
        metavar="BACKEND=N",
        help="deaths for one backend, overriding --deaths (repeatable)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel drivers")
    parser.add_argument("--big", action="store_true", help="states near each backend's limit")
    parser.add_argument("--spawn", action="store_true", help="fresh interpreters, not fork")
    parser.add_argument("--max-deaths", type=int, default=8, help="deaths per case at most")
    parser.add_argument("--workdir", help="where stores and effects go (default: a temp dir)")
    parser.add_argument("--tmpfs", action="store_true", help="temp dir in /dev/shm (fast fsync)")
    parser.add_argument(
        "--cosmos-config",
        default=os.environ.get("STEPSTONE_CHAOS_COSMOS"),
        help="a cosmos:// config (key in AZURE_COSMOS_KEY); default: start the local "
        "emulator with tests/cosmos_emulator.py (Docker, or node off CI)",
    )
    parser.add_argument(
        "--results",
        default=str(repo / "tests" / "chaos" / "RESULTS.md"),
        help="markdown file the table is written to (with --case: not written)",
    )
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="only copy RESULTS.md into README.md between <!-- chaos:begin --> and "
        "<!-- chaos:end --> (nothing else in README.md changes), then exit",
    )
    args = parser.parse_args(argv)
    if args.update_readme:
        readme = repo / "README.md"
        changed = update_readme(readme, Path(args.results))
        print(f"{readme}: chaos block {'updated' if changed else 'already up to date'}")
        return 0
    chosen = args.backend or ["file", "sqlite"]
    backends = list(BACKENDS) if "all" in chosen else list(dict.fromkeys(chosen))
    deaths_of = _deaths_of(args.deaths_of)
    keep = args.workdir is not None
    base = tempfile.gettempdir() if not args.tmpfs else "/dev/shm"
    workdir = args.workdir or tempfile.mkdtemp(prefix="stepstone-chaos-", dir=base)
    with contextlib.ExitStack() as stack:
        servers = _Servers(workdir, args.cosmos_config, stack)
        for backend in backends:
            servers.prepare(backend)
        if args.case is not None:
            return _cli_case(args, backends, servers, workdir)
        return _cli_run(args, argv, backends, deaths_of, servers, workdir, keep)
    return 1  # unreachable


def _cli_case(args: Any, backends: list[str], servers: _Servers, workdir: str) -> int:
    total = 0
    for backend in backends:
        opts = Options(
            backend,
            servers.config(backend, 0),
            os.path.join(workdir, f"{backend}-0"),
            seed=args.seed,
            big=args.big,
            spawn=args.spawn,
            max_deaths=args.max_deaths,
            verbose=True,
        )
        os.makedirs(opts.workdir, exist_ok=True)
        print(f"{backend}: case {args.case} (seed {args.seed}), store {opts.config}")
        stats = run_shard(opts, [args.case], log=print)
        total += len(stats.violations)
        died = sum(stats.deaths.values())
        print(f"{backend}: {died} deaths, {len(stats.violations)} violations")
    print(f"files kept in {workdir}")
    return 1 if total else 0


def _cli_run(
    args: Any,
    argv: list[str],
    backends: list[str],
    deaths_of: dict[str, int],
    servers: _Servers,
    workdir: str,
    keep: bool,
) -> int:
    began = time.monotonic()
    per_backend = max(1, args.jobs // len(backends))
    procs = []
    for backend in backends:
        shards = 1 if backend == "cosmos" and servers.cosmos else per_backend
        deaths = deaths_of.get(backend, args.deaths)
        for shard in range(shards):
            opts = Options(
                backend,
                servers.config(backend, shard),
                # Each shard its own directory: effects files are named by case number.
                os.path.join(workdir, f"{backend}-{shard}"),
                seed=args.seed,
                big=args.big,
                spawn=args.spawn,
                max_deaths=args.max_deaths,
                shard=shard,
            )
            target = -(-deaths // shards)
            procs.append((backend, _start_shard(opts, (shard, 10**9, shards), target)))
    totals = {b: Stats(b) for b in backends}
    failed = False
    for backend, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            print(f"{backend}: a driver failed with status {proc.returncode}", file=sys.stderr)
            failed = True
            continue
        totals[backend].add(Stats.from_json(json.loads(out.decode().strip().splitlines()[-1])))
    seconds = time.monotonic() - began
    command = "scripts/chaos " + " ".join(argv) if argv else "scripts/chaos"
    table = render_table(
        [totals[b] for b in backends], command.strip(), seconds, machine_line(workdir)
    )
    print(table)
    for stats in totals.values():
        for line in stats.violations:
            print(line)
    if not args.no_write:
        Path(args.results).write_text(table, encoding="utf-8")
        print(f"written to {args.results}")
    if not keep and not failed and not any(s.violations for s in totals.values()):
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed or any(s.violations for s in totals.values()) else 0


# -- command line (children and shards) -----------------------------------------------------


def main(argv: list[str]) -> int:
    """``child SPEC`` / ``worker SPEC`` (spawn mode) or ``shard OPTIONS`` (one driver)."""
    if not argv or argv[0] not in ("child", "shard"):
        return cli(argv)
    kind, payload_json = argv[0], argv[1]
    # The local emulator's self-signed certificate (verify=false): one warning per request.
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    spec = json.loads(payload_json)
    if kind == "child":
        try:
            code, result = child_main(spec)
        except BaseException as exc:
            code, result = ERROR_EXIT, {"error": repr(exc), "tb": traceback.format_exc()}
        print(json.dumps(result))
        return code
    if kind == "shard":
        opts = Options(**spec["options"])
        cases = spec["cases"]
        stats = run_shard(
            opts,
            iter(range(cases[0], cases[1], cases[2])),
            deaths_target=spec.get("deaths"),
            time_limit=spec.get("time_limit"),
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
        print(json.dumps(stats.to_json()))
        return 0
    raise SystemExit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
