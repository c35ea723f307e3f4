"""What runs inside a child process: the kill hook, the generated steps, ``run`` or ``arun``.

A child is given a spec (a JSON dict) and dies by SIGKILL where the spec's kill plan
says, or runs its share of the case to the end. It runs with the spec's (short) lease:
the next process must wait that long for a dead owner's lease to expire before it takes
the run over, which is the recovery path every death exercises.

``mode`` in the spec picks the driver: ``sync`` calls ``stepstone.run``; ``async`` calls
``stepstone.arun`` in a fresh event loop, with most steps ``async def`` and the rest plain
functions (which ``arun`` runs in a worker thread), so a death lands in a coroutine, in a
worker thread, or inside an async save alike. The kill hook does not care which thread
fires it: SIGKILL ends the whole process.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from stepstone import _hooks
from stepstone._errors import ConflictError, StepFailed
from stepstone._registry import open_store
from stepstone._runner import RetryPolicy, Step, StepContext, run

from .workload import StepSpec, Workflow, digest, make_workflow, step_output

__all__ = [
    "ERROR_EXIT",
    "MODES",
    "STEP_FAILED_EXIT",
    "child_main",
    "read_lines",
    "worker_main",
]

#: How a child drives its run: ``stepstone.run`` or ``stepstone.arun``.
MODES = ("sync", "async")
STEP_FAILED_EXIT = 11
ERROR_EXIT = 12


class StepBoom(RuntimeError):
    """A planned step failure."""


def append_line(path: str, line: str, sync: bool = True) -> None:
    """Append one line to ``path`` (fsynced unless ``sync`` is False)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: str) -> list[str]:
    """Return the lines of ``path``, or none if it does not exist yet."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def _die(note_path: str | None, note: dict[str, Any]) -> None:
    if note_path is not None:
        append_line(note_path, json.dumps(note), sync=False)  # page cache outlives us
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached: SIGKILL cannot be caught


class Killer:
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
    return sum(1 for line in read_lines(effects) if want in line and line.endswith(" fail"))


def _is_async_step(spec: StepSpec) -> bool:
    # Two steps in three are coroutines; the third is a plain function that arun runs in
    # a worker thread, so deaths inside both kinds of step are covered.
    return spec.index % 3 != 1


def build_steps(
    wf: Workflow,
    length: int,
    effects: str,
    killer: Killer | None,
    tag: str,
    fsync: bool,
    run_key: str = "0",
    mode: str = "sync",
) -> list[Step]:
    """Return the first ``length`` steps of ``wf``; ``async`` mode makes most of them coroutines."""

    def make(spec: StepSpec) -> Step:
        index = spec.index

        def body(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            # The first ``fail`` invocations fail, counted across processes in the effects
            # file (attempt numbers restart after a final failure, so they cannot say).
            failing = spec.fail > 0 and _failures(effects, run_key, index) < spec.fail
            if killer is not None:
                killer.step = index
            outcome = "fail" if failing else "ok"
            append_line(effects, f"{tag} {run_key} {index} {ctx.attempt} {outcome}", fsync)
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

        fn: Callable[[dict[str, Any], StepContext], Any] = body
        if mode == "async" and _is_async_step(spec):

            async def abody(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
                await asyncio.sleep(0)  # a real suspension point before the side effect
                return body(state, ctx)

            fn = abody
        policy = None
        if spec.max_attempts is not None:
            policy = RetryPolicy(max_attempts=spec.max_attempts, initial_delay=0.0, jitter=0.0)
        return Step(spec.name, fn, retry=policy)

    return [make(spec) for spec in wf.steps[:length]]


def _arun() -> Callable[..., Awaitable[dict[str, Any]]]:
    # Imported when first needed, so that the sync mode works on a stepstone without arun.
    import stepstone  # noqa: PLC0415

    arun: Callable[..., Awaitable[dict[str, Any]]] = stepstone.arun
    return arun


def child_main(spec: dict[str, Any], wf: Workflow | None = None) -> tuple[int, dict[str, Any]]:
    """Run one child's share of a single case; return (exit status, result)."""
    if wf is None:
        wf = make_workflow(
            spec["seed"], spec["case"], spec["budget"], spec["max_deaths"], spec.get("long")
        )
    mode = spec.get("mode", "sync")
    killer = Killer(spec)
    _hooks.install(killer)
    steps = build_steps(
        wf,
        spec["length"],
        spec["effects"],
        killer,
        str(spec["proc"]),
        spec.get("fsync", True),
        mode=mode,
    )
    try:
        if mode == "async":
            final = asyncio.run(_achild(spec["config"], wf.run_id, steps, spec["lease"]))
        else:
            with open_store(spec["config"]) as store:
                final = run(wf.run_id, steps, store, lease=spec["lease"])
    except StepFailed as exc:
        return STEP_FAILED_EXIT, {"failed": exc.step_index, "attempt": exc.attempt}
    return 0, {"digest": digest(final), "keys": len(final)}


async def _achild(config: str, run_id: str, steps: list[Step], lease: float) -> dict[str, Any]:
    arun = _arun()
    async with open_store(config) as store:
        return await arun(run_id, steps, store, lease=lease)


def worker_main(
    spec: dict[str, Any], wfs: list[Workflow] | None = None
) -> tuple[int, dict[str, Any]]:
    """One concurrent worker: run every run to the end, retrying after conflicts.

    In ``async`` mode the worker drives all its runs at once, one task per run in one
    event loop, so a process dies with several runs in flight.
    """
    if wfs is None:
        wfs = [
            make_workflow(spec["seed"], case, spec["budget"], spec["max_deaths"], spec.get("long"))
            for case in spec["cases"]
        ]
    killer = Killer(spec)
    _hooks.install(killer)
    rng = random.Random(f"{spec['seed']}:{spec['proc']}:worker")
    mode = spec.get("mode", "sync")
    order = list(range(len(wfs)))
    rng.shuffle(order)
    steps = {
        i: build_steps(
            wfs[i],
            len(wfs[i].steps),
            spec["effects"],
            killer,
            str(spec["proc"]),
            spec["fsync"],
            str(i),
            mode,
        )
        for i in order
    }
    tally = Counter[str]()
    if mode == "async":
        asyncio.run(_aworker(spec["config"], wfs, steps, order, rng, tally, spec["lease"]))
    else:
        with open_store(spec["config"]) as store:
            pending = list(order)
            while pending:
                i = pending.pop(0)
                try:
                    run(wfs[i].run_id, steps[i], store, lease=spec["lease"])
                except ConflictError:  # RunOwned and LeaseLost too: another worker has it
                    tally["conflicts"] += 1
                    pending.append(i)
                    time.sleep(rng.random() * 0.002)
                except StepFailed:
                    _count_failure(tally)
                    pending.append(i)
    return 0, {"conflicts": tally["conflicts"], "failures": tally["failures"]}


def _count_failure(tally: Counter[str]) -> None:
    tally["failures"] += 1
    if tally["failures"] > 1000:
        raise RuntimeError("more than 1000 StepFailed in one worker: the retry budget is wrong")


async def _aworker(
    config: str,
    wfs: list[Workflow],
    steps: dict[int, list[Step]],
    order: list[int],
    rng: random.Random,
    tally: Counter[str],
    lease: float,
) -> None:
    arun = _arun()
    async with open_store(config) as store:

        async def drive(i: int) -> None:
            while True:
                try:
                    await arun(wfs[i].run_id, steps[i], store, lease=lease)
                    return
                except ConflictError:
                    tally["conflicts"] += 1
                    await asyncio.sleep(rng.random() * 0.002)
                except StepFailed:
                    _count_failure(tally)

        await asyncio.gather(*(drive(i) for i in order))
