"""A ``Map`` of N children against the same work as one run's N steps, under a worker.

One worker process at its defaults (``concurrency=8``, ``poll=1``) serves two
workflows: ``map`` (one ``Map`` over N items, each child a one-step workflow) and
``steps`` (one run of N steps). Each step does the same work (it merges one small key;
``--work-ms`` adds a sleep, as a step that waits on I/O). Both begin and end with a step
that stamps ``time.monotonic_ns()`` into the state, and the figure is end - begin: the
fan-out, the children's claims and the parent's wake-up, without the wait for the
first claim (``bench_wakeups.py`` measures that). This process starts one run of each
kind in turn, order alternating round by round, and waits for each to be done; the
ratio map/steps is taken per round, then its median. SQLite (``synchronous=full``) and
PostgreSQL.

    .venv/bin/python benchmarks/bench_map.py [--quick] [--json] [--no-sql]
        [--children 100] [--rounds 5] [--work-ms 0] [--callgrind] [--src DIR] [--in-process]

Target (issue 20): the Map at most 1.5x the steps.

``--in-process``: the worker is a thread of this process, so ``time.process_time`` counts
the CPU both kinds cost (worker, group committer, listener, this loop); per round, the
Map's wall time and CPU time over the steps' (medians). For a before/after, run it
twice, once with ``PYTHONPATH=<a git archive of the earlier src>``, alternating.

``--callgrind``: instructions instead of seconds, repeatable on a noisy machine. One
process per backend under valgrind's callgrind serves both workflows with a worker
thread (the same defaults) and runs a warm-up of each kind, then one Map and one run of
steps, each inside ``operator.call``; callgrind dumps its counters as that call is
entered and as it returns, so each kept dump holds every thread's instructions (the
worker's, its pool's, the group committer's, the listener's) during one run, from its
start to its end step. ``--src DIR`` puts ``DIR`` first on that process's
``PYTHONPATH`` (a ``git archive REV src`` of an earlier tree, for a before/after).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import operator
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from _common import callgrind_calls, emit, progress, scratch, sql_config, table

from stepstone import Map, Step, Worker, Workflow, open_store, start
from stepstone._store import Store

BACKENDS = ("sqlite", "postgresql")


def _work_step(work_s: float) -> Any:
    def work(state: dict[str, Any]) -> dict[str, Any]:
        if work_s:
            time.sleep(work_s)
        return {"n": int(state.get("n", 0)) + 1}

    return work


def _begin(state: dict[str, Any]) -> dict[str, Any]:
    return {"begin_ns": time.monotonic_ns()}


def _end(state: dict[str, Any]) -> dict[str, Any]:
    return {"end_ns": time.monotonic_ns()}


def workflows(children: int, work_ms: float, end: Any = _end) -> tuple[Workflow, Workflow]:
    """The two workflows of the figure: (a Map of ``children``, ``children`` steps)."""
    work = _work_step(work_ms / 1e3)
    child = Workflow(f"bench-map-child-{children}", [Step("w", work)])

    def items(state: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"i": i} for i in range(children)]

    begin, last = Step("begin", _begin), Step("end", end)
    mapped = Workflow(f"bench-map-{children}", [begin, Map("kids", child, items), last])
    stepped = Workflow(
        f"bench-map-steps-{children}",
        [begin, *(Step(f"s{i}", work) for i in range(children)), last],
    )
    return mapped, stepped


def _serve(config: str, children: int, work_ms: float, ready: Any, stop: Any) -> None:
    """The worker process: serve both workflows at default settings until ``stop``."""
    store = open_store(config)
    worker = Worker(store, list(workflows(children, work_ms)))
    thread = threading.Thread(target=worker.serve, name="bench-serve", daemon=True)
    thread.start()
    ready.set()
    stop.wait()
    worker.stop()
    thread.join(timeout=60)
    store.close()


@contextlib.contextmanager
def _worker_process(config: str, children: int, work_ms: float) -> Iterator[None]:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(config, children, work_ms, ready, stop), daemon=True)
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the worker process did not come up within 60 s")
        time.sleep(1.5)  # past its first look at the (empty) store
        yield
    finally:
        stop.set()
        proc.join(timeout=90)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _time_run(store: Store, workflow: Workflow, run_id: str, timeout: float) -> float:
    """Seconds from the run's first step to its last (stamped by them)."""
    start(store, workflow, run_id)
    deadline = time.monotonic() + timeout
    while True:
        cp = store.load(run_id)
        if cp is not None and cp.status == "done":
            return (int(cp.state["end_ns"]) - int(cp.state["begin_ns"])) / 1e9
        if cp is not None and cp.status in ("failed", "cancelled"):
            raise RuntimeError(f"run {run_id!r} ended {cp.status}")
        if time.monotonic() > deadline:
            status = None if cp is None else cp.status
            raise RuntimeError(f"run {run_id!r} not done within {timeout:g} s ({status})")
        time.sleep(0.01)


def measure(config: str, children: int, rounds: int, work_ms: float) -> dict[str, Any]:
    """Both kinds, ``rounds`` times each, order alternating; the per-round ratios."""
    mapped, stepped = workflows(children, work_ms)
    store = open_store(config)
    seconds: dict[str, list[float]] = {"map": [], "steps": []}
    ratios: list[float] = []
    try:
        with _worker_process(config, children, work_ms):
            for r in range(rounds):
                kinds = [("map", mapped), ("steps", stepped)]
                if r % 2:
                    kinds.reverse()
                got = {
                    name: _time_run(store, wf, f"{name}-{r}", 120 + children) for name, wf in kinds
                }
                for name, value in got.items():
                    seconds[name].append(value)
                ratios.append(got["map"] / got["steps"])
    finally:
        store.close()
    return {
        name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
        for name, v in (*seconds.items(), ("ratio", ratios))
    }


#: Set by the end step of the workflows the callgrind child serves (one run at a time).
_ENDED = threading.Event()


def _end_and_tell(state: dict[str, Any]) -> dict[str, Any]:
    _ENDED.set()
    return _end(state)


def _counted_run(store: Store, workflow: Workflow, run_id: str) -> None:
    """Start ``run_id`` and return once its end step ran (no polling: an event)."""
    _ENDED.clear()
    start(store, workflow, run_id)
    if not _ENDED.wait(600):
        raise RuntimeError(f"run {run_id!r} did not reach its end step within 600 s")


def _child(config: str, children: int) -> None:
    """Under callgrind: serve both kinds in a thread; warm up, then count one of each."""
    mapped, stepped = workflows(children, 0.0, _end_and_tell)
    store = open_store(config)
    worker = Worker(store, [mapped, stepped])
    thread = threading.Thread(target=worker.serve, name="bench-serve", daemon=True)
    thread.start()
    try:
        for kind in ("warm", "again"):
            _counted_run(store, mapped, f"map-{kind}")
            _counted_run(store, stepped, f"steps-{kind}")
        operator.call(_counted_run, store, mapped, "map")
        operator.call(_counted_run, store, stepped, "steps")
    finally:
        worker.stop()
        thread.join(timeout=600)
        store.close()


def _callgrind(config: str, children: int, src: str | None) -> dict[str, int]:
    """Instructions of one Map and one run of steps on ``config`` (every thread)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    argv = [__file__, "--child", config, "--children", str(children)]
    counts = callgrind_calls(argv, env)
    assert len(counts) == 2, f"{len(counts)} counted dumps, expected 2"
    return {"map": counts[0], "steps": counts[1]}


def _in_process(config: str, children: int, rounds: int) -> dict[str, float]:
    """Median wall and CPU ratios (Map over steps) with the worker a thread of this process."""
    mapped, stepped = workflows(children, 0.0, _end_and_tell)
    store = open_store(config)
    worker = Worker(store, [mapped, stepped])
    thread = threading.Thread(target=worker.serve, name="bench-serve", daemon=True)
    thread.start()
    walls: list[float] = []
    cpus: list[float] = []
    try:
        _counted_run(store, mapped, "warm-map")
        _counted_run(store, stepped, "warm-steps")
        for r in range(rounds):
            got: dict[str, tuple[float, float]] = {}
            kinds = [("map", mapped), ("steps", stepped)]
            for name, workflow in kinds if r % 2 == 0 else kinds[::-1]:
                wall, cpu = time.monotonic(), time.process_time()
                _counted_run(store, workflow, f"{name}-{r}")
                got[name] = (time.monotonic() - wall, time.process_time() - cpu)
            walls.append(got["map"][0] / got["steps"][0])
            cpus.append(got["map"][1] / got["steps"][1])
    finally:
        worker.stop()
        thread.join(timeout=600)
        store.close()
    return {"wall_ratio": statistics.median(walls), "cpu_ratio": statistics.median(cpus)}


def _main_in_process(args: argparse.Namespace) -> None:
    rounds = args.rounds or 5
    payload: dict[str, Any] = {"children": args.children, "rounds": rounds}
    found, skipped = _per_backend(
        args,
        f"in one process, {rounds} rounds",
        lambda config: _in_process(config, args.children, rounds),
    )
    payload.update(found)
    rows = [[b, f"{g['wall_ratio']:.2f}x", f"{g['cpu_ratio']:.2f}x"] for b, g in found.items()]
    head = (
        f"Map of {args.children} children over one run of {args.children} steps, the worker "
        f"in this process (median of {rounds} rounds)"
    )
    text = [head, table(["backend", "wall", "CPU"], rows), *skipped]
    emit(args, payload, "\n".join(text))


def _per_backend(
    args: argparse.Namespace, what: str, measure_one: Callable[[str], Any]
) -> tuple[dict[str, Any], list[str]]:
    """``measure_one(config)`` on each backend's fresh store (SQLite only with
    ``--no-sql``); the figures by backend, and a line for each one skipped."""
    found: dict[str, Any] = {}
    skipped: list[str] = []
    for backend in BACKENDS:
        if args.no_sql and backend != "sqlite":
            continue
        with _config(backend) as (config, about):
            if config is None:
                skipped.append(f"{backend} skipped: {about}")
                continue
            progress(args, f"map: {backend}, {what}...")
            found[backend] = measure_one(config)
    return found, skipped


def _main_callgrind(args: argparse.Namespace) -> None:
    payload: dict[str, Any] = {"children": args.children, "unit": "instructions"}
    found, skipped = _per_backend(
        args, "under callgrind", lambda config: _callgrind(config, args.children, args.src)
    )
    rows = []
    for backend, got in found.items():
        ratio = got["map"] / got["steps"]
        payload[backend] = {**got, "ratio": ratio}
        rows.append([backend, f"{got['map']:,}", f"{got['steps']:,}", f"{ratio:.2f}x"])
    head = (
        f"Map of {args.children} children vs one run of {args.children} steps "
        "(instructions of every thread, callgrind, one run each after a warm-up)"
    )
    text = [head, table(["backend", "map", "steps", "map/steps"], rows), *skipped]
    emit(args, payload, "\n".join(text))


@contextlib.contextmanager
def _config(backend: str) -> Iterator[tuple[str | None, str]]:
    if backend == "sqlite":
        with scratch("map") as path:
            yield f"sqlite:///{path}/runs.db", "benchmarks/.tmp"
    else:
        with sql_config(backend, "map") as found:
            yield found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--no-sql", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--children", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5)")
    parser.add_argument("--work-ms", type=float, default=0.0, help="sleep in each step")
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--in-process", action="store_true", help="worker thread; CPU time")
    parser.add_argument("--src", default=None, help="PYTHONPATH first (--callgrind)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.children)
        return
    if args.callgrind:
        _main_callgrind(args)
        return
    if args.in_process:
        _main_in_process(args)
        return
    rounds = args.rounds or (3 if args.quick else 5)
    payload: dict[str, Any] = {"children": args.children, "rounds": rounds}
    found, skipped = _per_backend(
        args,
        f"{rounds} rounds of {args.children}",
        lambda config: measure(config, args.children, rounds, args.work_ms),
    )
    payload.update(found)
    rows = []
    for backend, got in found.items():
        m, s, x = got["map"], got["steps"], got["ratio"]
        rows.append(
            [
                backend,
                f"{m['median']:.2f} [{m['min']:.2f}-{m['max']:.2f}]",
                f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]",
                f"{x['median']:.2f}x [{x['min']:.2f}-{x['max']:.2f}]",
            ]
        )
    head = (
        f"Map of {args.children} children vs one run of {args.children} steps "
        f"(s, first step to last, median [min-max] of {rounds} rounds; "
        f"work {args.work_ms:g} ms/step)"
    )
    text = [head, table(["backend", "map s", "steps s", "map/steps"], rows), *skipped]
    emit(args, payload, "\n".join(text))


if __name__ == "__main__":
    main()
