"""Wake-ups: how soon a worker at its default settings acts on new work, and what idling costs.

Four figures, each with a ``Worker`` at its defaults (``concurrency=8``, ``poll=1``):

- **signal**: signal to resumed step, another process sending. A worker process serves
  runs of ``step, WaitFor("go"), step``; this process starts N of them, waits until all
  wait, then signals them one by one at random gaps (20-100 ms). Latency = the resumed
  step's ``time.monotonic_ns()`` (stored in its state) minus the moment this process
  called ``signal`` (``CLOCK_MONOTONIC`` is one clock for the host), so the signal's own
  write is included. Median and p99. SQLite and PostgreSQL.
- **sleep**: a ``Sleep(duration=1.3)`` followed by a step, served by a worker process,
  runs started at random gaps. Lateness = the step's wall-clock time minus the due time
  the ``Sleep`` merged into the state. Median and max. SQLite and PostgreSQL.
- **start**: ``start()`` in the worker's own process (same store object, ``serve`` in a
  thread) to the run's first step (the step stamps ``time.monotonic_ns()`` and hands it
  over a queue), one run at a time, random pauses of 0.2-1.2 s between (a start lands
  at any phase of the poll). Median and p99. Memory, SQLite and PostgreSQL.
- **idle**: CPU of an idle worker process at default settings: ``time.process_time()``
  over a window (10 s; 3 s with ``--quick``) after a 2 s warm-up, as % of one core, under
  ``serve`` and under ``aserve``. Memory, file, SQLite, PostgreSQL and MySQL/MariaDB; the
  processes idle side by side (CPU time, unlike wall time, is not inflated by sharing).

    .venv/bin/python benchmarks/bench_wakeups.py [--quick] [--json] [--no-sql]
        [--signals 200] [--only signal,sleep,start,idle]

Targets (issue 20): signal p99 <= 50 ms, Sleep at most 50 ms late, idle <= 1% of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import queue
import random
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from _common import emit, progress, scratch, sql_config, table

from stepstone import Sleep, Step, StepContext, WaitFor, Worker, Workflow, open_store, start
from stepstone import signal as send_signal
from stepstone._store import Store

#: Backends of each figure (``--no-sql`` drops postgresql and mysql).
BACKENDS = {
    "signal": ("sqlite", "postgresql"),
    "sleep": ("sqlite", "postgresql"),
    "start": ("memory", "sqlite", "postgresql"),
    "idle": ("memory", "file", "sqlite", "postgresql", "mysql"),
}
FIGURES = tuple(BACKENDS)
NAP = 1.3
#: Where the in-process start figure's step hands its stamp over.
_FIRST: queue.Queue[tuple[str, int]] = queue.Queue()


def _noop(state: dict[str, Any]) -> dict[str, Any]:
    return {}


def _stamp(state: dict[str, Any]) -> dict[str, Any]:
    return {"mono_ns": time.monotonic_ns(), "wall": time.time()}


def _first(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    _FIRST.put((ctx.run_id, time.monotonic_ns()))
    return {}


SIGNALLED = Workflow(
    "bench-wake-signal", [Step("a", _noop), WaitFor("go", "go"), Step("b", _stamp)]
)
NAPPING = Workflow("bench-wake-sleep", [Sleep("nap", duration=NAP), Step("b", _stamp)])
FIRST = Workflow("bench-wake-start", [Step("a", _first)])
WORKFLOWS = [SIGNALLED, NAPPING, FIRST]


def _percentile(values: list[float], p: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "median": statistics.median(values),
        "p99": _percentile(values, 99),
        "max": max(values),
        "min": min(values),
    }


@contextlib.contextmanager
def _config(backend: str, purpose: str) -> Iterator[tuple[str | None, str]]:
    """Yield (a fresh store config of ``backend``, description) or (None, why not)."""
    if backend == "memory":
        yield "memory://", "in-process"
    elif backend in ("file", "sqlite"):
        with scratch(f"wake-{purpose}") as path:
            if backend == "file":
                yield f"file://{path}/runs", "benchmarks/.tmp"
            else:
                yield f"sqlite:///{path}/runs.db", "benchmarks/.tmp"
    else:
        with sql_config(backend, f"wake_{purpose}") as found:
            yield found


# --- a worker in another process --------------------------------------------------------


def _serve(config: str, ready: Any, stop: Any) -> None:
    """The worker process: serve WORKFLOWS at default settings until ``stop`` is set."""
    store = open_store(config)
    worker = Worker(store, WORKFLOWS)
    thread = threading.Thread(target=worker.serve, name="bench-serve", daemon=True)
    thread.start()
    ready.set()
    stop.wait()
    worker.stop()
    thread.join(timeout=60)
    store.close()


@contextlib.contextmanager
def _worker_process(config: str) -> Iterator[None]:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(config, ready, stop), daemon=True)
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the worker process did not come up within 60 s")
        yield
    finally:
        stop.set()
        proc.join(timeout=90)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _wait_for(store: Store, run_ids: list[str], status: str, timeout: float) -> None:
    wanted = set(run_ids)
    deadline = time.monotonic() + timeout
    while True:
        have = {i.run_id for i in store.list_info() if i.status == status}
        if wanted <= have:
            return
        if time.monotonic() > deadline:
            left = sorted(wanted - have)
            raise RuntimeError(f"{len(left)} runs not {status} within {timeout:g} s: {left[:3]}")
        time.sleep(0.1)


# --- the figures --------------------------------------------------------------------------


def signal_latency(config: str, n: int, rng: random.Random) -> dict[str, float]:
    """Signal to resumed step (ms), sent from this process to a worker process."""
    store = open_store(config)
    try:
        with _worker_process(config):
            ids = [f"sig-{i}" for i in range(n)]
            for run_id in ids:
                start(store, SIGNALLED, run_id)
            _wait_for(store, ids, "waiting", 60 + n)
            time.sleep(1.5)  # the worker idle again, as between real signals
            sent: dict[str, int] = {}
            for run_id in ids:
                time.sleep(rng.uniform(0.02, 0.1))
                sent[run_id] = time.monotonic_ns()
                send_signal(store, run_id, "go", {"at": sent[run_id]})
            _wait_for(store, ids, "done", 60 + n)
            latencies = []
            for run_id in ids:
                cp = store.load(run_id)
                assert cp is not None
                latencies.append((cp.state["mono_ns"] - sent[run_id]) / 1e6)
    finally:
        store.close()
    return _ms(latencies)


def sleep_lateness(config: str, n: int, rng: random.Random) -> dict[str, float]:
    """How late (ms) a ``Sleep(1.3 s)``'s next step runs, on a worker process."""
    store = open_store(config)
    try:
        with _worker_process(config):
            ids = [f"nap-{i}" for i in range(n)]
            for run_id in ids:
                time.sleep(rng.uniform(0.05, 0.25))
                start(store, NAPPING, run_id)
            _wait_for(store, ids, "done", 60 + 3 * n)
            late = []
            for run_id in ids:
                cp = store.load(run_id)
                assert cp is not None
                due = datetime.fromisoformat(cp.state["nap"]).timestamp()
                late.append((cp.state["wall"] - due) * 1e3)
    finally:
        store.close()
    return _ms(late)


def start_latency(config: str, n: int, rng: random.Random) -> dict[str, float]:
    """``start()`` to first step (ms) with the worker in this process, on the same store."""
    store = open_store(config)
    worker = Worker(store, WORKFLOWS)
    thread = threading.Thread(target=worker.serve, name="bench-serve", daemon=True)
    thread.start()
    latencies = []
    try:
        time.sleep(1.5)
        for i in range(n):
            run_id = f"first-{i}"
            began = time.monotonic_ns()
            start(store, FIRST, run_id)
            while True:
                try:
                    seen, at = _FIRST.get(timeout=30)
                except queue.Empty:
                    raise RuntimeError(f"run {run_id!r}: no first step within 30 s") from None
                if seen == run_id:
                    break
            latencies.append((at - began) / 1e6)
            # Over a whole default poll interval: a start lands at any phase of the poll.
            time.sleep(rng.uniform(0.2, 1.2))
    finally:
        worker.stop()
        thread.join(timeout=60)
        store.close()
    return _ms(latencies)


def _idle(config: str, mode: str, window: float, results: Any) -> None:
    """An idle worker process: report its CPU seconds over ``window`` after a warm-up."""
    try:
        store = open_store(config)
        worker = Worker(store, WORKFLOWS)
        target = worker.serve if mode == "serve" else lambda: asyncio.run(worker.aserve())
        thread = threading.Thread(target=target, name="bench-idle", daemon=True)
        thread.start()
        time.sleep(2.0)
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(window)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        worker.stop()
        thread.join(timeout=60)
        store.close()
        results.put((config, mode, cpu, wall, ""))
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which goes on
        results.put((config, mode, 0.0, 0.0, repr(exc)))


def idle_cpu(
    configs: dict[str, str], window: float, errors: list[str]
) -> dict[str, dict[str, float]]:
    """% of a core each backend's idle worker uses, under ``serve`` and ``aserve``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    for config in configs.values():
        for mode in ("serve", "aserve"):
            proc = ctx.Process(target=_idle, args=(config, mode, window, results), daemon=True)
            proc.start()
            procs.append(proc)
    found: dict[str, dict[str, float]] = {}
    by_config = {config: backend for backend, config in configs.items()}
    for _ in procs:
        config, mode, cpu, wall, error = results.get(timeout=120 + window)
        backend = by_config[config]
        if error:
            errors.append(f"idle {backend} {mode} failed: {error}")
            continue
        found.setdefault(backend, {})[mode] = 100 * cpu / wall
    for proc in procs:
        proc.join(timeout=60)
    return found


# --- the command line -----------------------------------------------------------------------


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer signals, shorter windows")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--no-sql", action="store_true", help="skip PostgreSQL and MySQL")
    parser.add_argument("--signals", type=int, default=None, help="signals per backend (200)")
    parser.add_argument("--only", default=",".join(FIGURES), help="comma list of figures")
    parser.add_argument("--seed", type=int, default=20)
    return parser.parse_args()


def main() -> None:
    args = _parse()
    only = [f for f in args.only.split(",") if f]
    for figure in only:
        if figure not in FIGURES:
            raise SystemExit(f"unknown figure {figure!r}; choose from {', '.join(FIGURES)}")
    rng = random.Random(args.seed)
    signals = args.signals or (50 if args.quick else 200)
    naps = 10 if args.quick else 30
    starts = 10 if args.quick else 20
    window = 3.0 if args.quick else 10.0
    payload: dict[str, Any] = {"signals": signals, "naps": naps, "starts": starts}
    rows: list[list[str]] = []
    skipped: list[str] = []

    def backends(figure: str) -> list[str]:
        return [b for b in BACKENDS[figure] if not (args.no_sql and b in ("postgresql", "mysql"))]

    for figure, measure, count in (
        ("signal", signal_latency, signals),
        ("sleep", sleep_lateness, naps),
        ("start", start_latency, starts),
    ):
        if figure not in only:
            continue
        for backend in backends(figure):
            with _config(backend, figure) as (config, about):
                if config is None:
                    skipped.append(f"{figure} {backend} skipped: {about}")
                    continue
                progress(args, f"{figure}: {backend} ({count} runs)...")
                got = measure(config, count, rng)
            payload.setdefault(figure, {})[backend] = got
            rows.append(
                [
                    figure,
                    backend,
                    str(got["n"]),
                    f"{got['median']:.1f}",
                    f"{got['p99']:.1f}",
                    f"{got['max']:.1f}",
                ]
            )
    idle_rows: list[list[str]] = []
    if "idle" in only:
        with contextlib.ExitStack() as stack:
            configs: dict[str, str] = {}
            for backend in backends("idle"):
                config, about = stack.enter_context(_config(backend, "idle"))
                if config is None:
                    skipped.append(f"idle {backend} skipped: {about}")
                else:
                    configs[backend] = config
            progress(args, f"idle: {', '.join(configs)} side by side, {window:g} s...")
            cpu = idle_cpu(configs, window, skipped)
        payload["idle"] = cpu
        for backend, modes in cpu.items():
            idle_rows.append(
                [
                    backend,
                    f"{modes.get('serve', float('nan')):.2f}",
                    f"{modes.get('aserve', float('nan')):.2f}",
                ]
            )
    text = [
        "wake-ups, Worker at default settings (ms; signal/start: from the call; sleep: from due)",
        table(["figure", "backend", "n", "median", "p99", "max"], rows) if rows else "",
    ]
    if idle_rows:
        text += [
            "",
            f"idle worker, % of one core over {window:g} s",
            table(["backend", "serve", "aserve"], idle_rows),
        ]
    text += skipped
    emit(args, payload, "\n".join(t for t in text if t is not None))


if __name__ == "__main__":
    main()
