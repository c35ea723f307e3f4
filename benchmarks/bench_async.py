"""Async figures: ``arun`` per-step overhead next to ``run``, and throughput under asyncio.

Two figures per backend (memory, sqlite ``synchronous=FULL``, file, postgresql, mysql,
cosmos when an emulator can be started), all measured in this one process, interleaved
round by round with their order rotating:

- **per-step overhead**: (time of a 10-step ``await arun(...)`` with ``async def`` steps
  under a new run id - the same 10 step functions awaited plainly) / 10, next to the
  same figure for the sync ``run`` with plain steps. State: ~1 KB, as everywhere.
- **throughput**: N concurrent runs (1, 10, 100, 1,000) in one event loop, each task
  running 10-step runs back to back for a window after a warm-up; steps/s counted by
  step invocations inside the window, and p50/p99 of the ``asave`` calls that finished
  inside it (for a store without native async, ``asave`` runs ``save`` in a thread, so
  the latency includes waiting for one).

LangGraph's async savers run the same workload in ``benchmarks/.venv-peers`` (see
``peers/peers_async.py``), in a child process per saver that this script drives command
by command, so its rounds interleave with stepstone's: ``AsyncSqliteSaver`` (WAL +
``synchronous=FULL``) next to the sqlite store, ``AsyncPostgresSaver`` (server default
``synchronous_commit``) next to the postgresql store; ``durability="sync"``.

    .venv/bin/python benchmarks/bench_async.py [--quick] [--json] [--no-sql] [--no-cosmos]
        [--no-peers] [--concurrency 1,10,100,1000] [--backends memory,sqlite,...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import HERE, cosmos_config, fig, progress, scratch, sql_base, sql_config, table

import stepstone
from stepstone import Step, arun, open_store, run
from stepstone._bench import machine_info

STEPS = 10
PEERS_PY = HERE / ".venv-peers" / "bin" / "python"


def initial_payload() -> str:
    return "x" * 1000


class Counter:
    """Step invocations of every run in this process (the throughput count)."""

    steps = 0


def sync_steps() -> list[Step]:
    """10 plain steps: the first adds the ~1 KB payload, each adds one key."""
    payload = {"payload": initial_payload(), "meta": {"user": "u-123", "tags": ["a"], "n": 1}}

    def make(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        key = f"k{i}"
        if i == 0:
            return lambda state: {**payload, key: i}
        return lambda state: {key: i}

    return [Step(f"s{i}", make(i)) for i in range(STEPS)]


def async_steps() -> list[Step]:
    """The same 10 steps as ``async def`` functions that await nothing."""
    payload = {"payload": initial_payload(), "meta": {"user": "u-123", "tags": ["a"], "n": 1}}

    def make(i: int) -> Any:
        key = f"k{i}"

        async def step(state: dict[str, Any]) -> dict[str, Any]:
            Counter.steps += 1
            return {**payload, key: i} if i == 0 else {key: i}

        return step

    return [Step(f"s{i}", make(i)) for i in range(STEPS)]


def stats(values: list[float], scale: float = 1.0) -> dict[str, float]:
    vs = [v * scale for v in values]
    return {
        "median": statistics.median(vs),
        "min": min(vs),
        "max": max(vs),
        "repeats": len(vs),
    }


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


# --- stepstone side -------------------------------------------------------------------------


class Target:
    """One store under test: sequential overhead batches and throughput windows."""

    def __init__(self, name: str, config: str, via: str, loop: asyncio.AbstractEventLoop):
        self.name = name
        self.config = config
        self.via = via
        self.loop = loop
        self.store = open_store(config)
        self._n = 0
        self._prefix = f"bench-async-{os.getpid()}-{name}"
        self.sync_steps = sync_steps()
        self.async_steps = async_steps()
        self.sync_fns = [s.fn for s in self.sync_steps]
        self.async_fns = [s.fn for s in self.async_steps]
        self.overhead: dict[str, list[float]] = {"run": [], "arun": []}
        self.throughput: dict[int, dict[str, list[float]]] = {}
        self._recording = False
        self._latencies: list[float] = []
        orig = self.store.asave

        async def timed(cp: Any) -> Any:
            t0 = time.perf_counter()
            saved = await orig(cp)
            if self._recording:
                self._latencies.append(time.perf_counter() - t0)
            return saved

        # The runner calls ``store.asave``; an instance attribute shadows the method.
        self.store.asave = timed  # type: ignore[method-assign,assignment]

    def new_id(self) -> str:
        self._n += 1
        return f"{self._prefix}-{self._n}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.store.close()

    # Per-step overhead: n runs one after another.
    def sync_batch(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            run(self.new_id(), self.sync_steps, self.store)
        per_run = (time.perf_counter() - t0) / n
        m = max(100, n * 50)
        fns = self.sync_fns
        t0 = time.perf_counter()
        for _ in range(m):
            state: dict[str, Any] = {}
            for fn in fns:
                state.update(fn(state))
        return (per_run - (time.perf_counter() - t0) / m) / STEPS

    def async_batch(self, n: int) -> float:
        async def go() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                await arun(self.new_id(), self.async_steps, self.store)
            per_run = (time.perf_counter() - t0) / n
            m = max(100, n * 50)
            fns = self.async_fns
            t0 = time.perf_counter()
            for _ in range(m):
                state: dict[str, Any] = {}
                for fn in fns:
                    state.update(await fn(state))
            return (per_run - (time.perf_counter() - t0) / m) / STEPS

        return self.loop.run_until_complete(go())

    def window(self, n: int, warm: float, window: float) -> tuple[float, list[float]]:
        async def go() -> tuple[float, list[float]]:
            stop = False

            async def worker() -> None:
                while not stop:
                    await arun(self.new_id(), self.async_steps, self.store)

            start = Counter.steps
            tasks = [asyncio.ensure_future(worker()) for _ in range(n)]
            t_warm = time.perf_counter()
            await asyncio.sleep(warm)
            # Every run past its start before the window opens (steady state).
            # A poll, not an Event: the counter is bumped by every step of every run.
            while Counter.steps - start < n and time.perf_counter() - t_warm < 30:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            self._latencies = []
            self._recording = True
            c0, t0 = Counter.steps, time.perf_counter()
            await asyncio.sleep(window)
            steps, elapsed = Counter.steps - c0, time.perf_counter() - t0
            self._recording, stop = False, True
            lat = sorted(self._latencies)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for t in tasks:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            return steps / elapsed, lat

        return self.loop.run_until_complete(go())


class Peer:
    """A LangGraph async saver in its own process (peers/peers_async.py), one command a line."""

    def __init__(self, name: str, argv: list[str], pairs_with: str):
        self.name = name
        self.pairs_with = pairs_with
        self.proc = subprocess.Popen(
            [str(PEERS_PY), str(HERE / "peers" / "peers_async.py"), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._read()
        if "error" in ready:
            self.close()
            raise RuntimeError(ready["error"])
        self.via = ready["ready"]
        self.overhead: dict[str, list[float]] = {"arun": []}
        self.throughput: dict[int, dict[str, list[float]]] = {}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: peer process exited ({self.proc.wait()})")
        return json.loads(line)  # type: ignore[no-any-return]

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def async_batch(self, n: int) -> float:
        r = self.ask(op="overhead", n=n)
        return (float(r["run_s"]) - float(r["plain_s"])) / STEPS

    def window(self, n: int, warm: float, window: float) -> tuple[float, list[float]]:
        r = self.ask(op="throughput", n=n, warm=warm, window=window)
        return r["steps_per_s"], r["save_latencies_s"]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask(op="quit")
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()


# --- main -------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--repeats", type=int)
    p.add_argument("--no-sql", action="store_true")
    p.add_argument("--no-cosmos", action="store_true")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--concurrency", default="1,10,100,1000")
    p.add_argument("--backends", default="memory,sqlite,file,postgresql,mysql,cosmos")
    p.add_argument("--window", type=float, help="seconds per throughput window")
    return p.parse_args()


@contextlib.contextmanager
def targets(
    args: argparse.Namespace, base: Path, loop: asyncio.AbstractEventLoop, skipped: list[str]
) -> Iterator[list[Any]]:
    """Yield stepstone's targets, then the peers beside them; closed afterwards."""
    with contextlib.ExitStack() as stack:
        out: list[Any] = _own_targets(args, base, loop, stack, skipped)
        for t in out:
            stack.callback(t.close)
        out += _peer_targets(args, base, {t.name for t in out}, stack, skipped)
        for line in skipped:
            print(line, file=sys.stderr, flush=True)
        yield out


def _own_targets(
    args: argparse.Namespace,
    base: Path,
    loop: asyncio.AbstractEventLoop,
    stack: contextlib.ExitStack,
    skipped: list[str],
) -> list[Target]:
    """A target for each backend asked for that can be reached; the others in ``skipped``."""
    local = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{base}/async.db?synchronous=full",
        "file": f"file://{base}/async-file",
    }
    out: list[Target] = []
    for name in args.backends.split(","):
        if name in local:
            out.append(Target(name, local[name], "", loop))
            continue
        if name in ("postgresql", "mysql"):
            off = "--no-sql" if args.no_sql else None
            opened = None if off else sql_config(name, "async")
        elif name == "cosmos":
            off = "--no-cosmos" if args.no_cosmos else None
            opened = None if off else cosmos_config()
        else:
            continue
        if opened is None:
            skipped.append(f"{name} skipped: {off}")
            continue
        config, why = stack.enter_context(opened)
        if config is None:
            skipped.append(f"{name} skipped: {why}")
            continue
        out.append(Target(name, config, why, loop))
    return out


def _peer_targets(
    args: argparse.Namespace,
    base: Path,
    names: set[str],
    stack: contextlib.ExitStack,
    skipped: list[str],
) -> list[Peer]:
    """LangGraph's async savers beside the stepstone backends they compare with."""
    if args.no_peers:
        skipped.append("langgraph async savers skipped: --no-peers")
        return []
    if not PEERS_PY.exists():
        skipped.append(
            "langgraph async savers skipped: no benchmarks/.venv-peers "
            "(bash benchmarks/peers/setup.sh)"
        )
        return []
    specs = []
    if "sqlite" in names:
        specs.append(
            (
                "langgraph-AsyncSqliteSaver",
                ["--saver", "sqlite", "--path", f"{base}/langgraph.db"],
                "sqlite",
            )
        )
    if "postgresql" in names:
        specs.append(
            (
                "langgraph-AsyncPostgresSaver",
                ["--saver", "postgres", "--dsn", sql_base("postgresql")],
                "postgresql",
            )
        )
    out: list[Peer] = []
    for name, argv, pair in specs:
        try:
            peer = Peer(name, argv, pair)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot start is skipped, saying why
            skipped.append(f"{name} skipped: {exc}")
            continue
        stack.callback(peer.close)
        out.append(peer)
    return out


def main() -> None:
    args = parse()
    repeats = args.repeats or (2 if args.quick else 3)
    window = args.window or (0.75 if args.quick else 1.5)
    warm = 0.25 if args.quick else 0.5
    conc = [int(c) for c in args.concurrency.split(",")]
    skipped: list[str] = []
    started = time.time()
    load0 = os.getloadavg()
    loop = asyncio.new_event_loop()
    with scratch("async") as base, targets(args, base, loop, skipped) as ts:
        machine = machine_info(str(base))
        # Per-step overhead: calibrate each batch to ~0.2 s (~0.08 s quick) with one probe.
        batch_s = 0.08 if args.quick else 0.2
        sizes: dict[tuple[str, str], int] = {}
        for t in ts:
            kinds = ["run", "arun"] if isinstance(t, Target) else ["arun"]
            for kind in kinds:
                fn = t.sync_batch if kind == "run" else t.async_batch
                t0 = time.perf_counter()
                fn(3)
                per = (time.perf_counter() - t0) / 3
                sizes[(t.name, kind)] = max(3, min(2000, round(batch_s / max(per, 1e-6))))
        items = [
            (t, k) for t in ts for k in (["run", "arun"] if isinstance(t, Target) else ["arun"])
        ]
        for r in range(repeats):
            progress(args, f"async: per-step overhead, round {r + 1}/{repeats}")
            order = items[r % len(items) :] + items[: r % len(items)]
            for t, kind in order:
                gc.collect()
                fn = t.sync_batch if kind == "run" else t.async_batch
                t.overhead[kind].append(fn(sizes[(t.name, kind)]))
        # Throughput windows, every (target, N) once per round, order rotating.
        cells = [(t, n) for t in ts for n in conc]
        for r in range(repeats):
            progress(args, f"async: throughput, round {r + 1}/{repeats} ({len(cells)} windows)")
            rotated = cells[r % len(cells) :] + cells[: r % len(cells)]
            for t, n in rotated:
                gc.collect()
                sps, lat = t.window(n, warm, window)
                cell = t.throughput.setdefault(n, {"steps_per_s": [], "p50": [], "p99": []})
                cell["steps_per_s"].append(sps)
                p50, p99 = percentile(lat, 0.50), percentile(lat, 0.99)
                if p50 is not None and p99 is not None:
                    cell["p50"].append(p50)
                    cell["p99"].append(p99)
        results = []
        for t in ts:
            row: dict[str, Any] = {
                "system": t.name,
                "via": t.via,
                "config": getattr(t, "config", None) if isinstance(t, Target) else None,
                "overhead_per_step_us": {k: stats(v, 1e6) for k, v in t.overhead.items() if v},
                "throughput": {},
            }
            if isinstance(t, Peer):
                row["pairs_with"] = t.pairs_with
            for n, cell in sorted(t.throughput.items()):
                row["throughput"][str(n)] = {
                    "steps_per_s": stats(cell["steps_per_s"]),
                    "save_p50_us": stats(cell["p50"], 1e6) if cell["p50"] else None,
                    "save_p99_us": stats(cell["p99"], 1e6) if cell["p99"] else None,
                }
            if isinstance(t, Target) and "config" in row and row["config"]:
                row["config"] = row["config"].split("?table=")[0].replace(str(base), "<tmp>")
            results.append(row)
    loop.close()
    payload = {
        "figure": "async",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "load_avg_start": [round(x, 2) for x in load0],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "machine": machine,
        "stepstone": getattr(stepstone, "__version__", "?"),
        "repeats": repeats,
        "window_s": window,
        "concurrency": conc,
        "skipped": skipped,
        "results": results,
    }
    if args.json:
        print(json.dumps(payload))
    else:
        print(render(payload))


def render(p: dict[str, Any]) -> str:
    lines = [
        f"{p['date']}, {p['seconds']} s, load {p['load_avg_start']} -> {p['load_avg_end']}",
        "",
        "Per-step overhead (us), median [min-max]:",
    ]
    rows = []
    for r in p["results"]:
        o = r["overhead_per_step_us"]
        rows.append([r["system"], fig(o.get("run")), fig(o.get("arun"))])
    lines.append(table(["system", "run (sync)", "arun / ainvoke"], rows))
    lines += ["", "Throughput, N concurrent runs in one event loop:"]
    rows = []
    for r in p["results"]:
        for n, c in r["throughput"].items():
            rows.append(
                [
                    r["system"],
                    n,
                    fig(c["steps_per_s"]),
                    fig(c["save_p50_us"]),
                    fig(c["save_p99_us"]),
                ]
            )
    lines.append(table(["system", "N", "steps/s", "save p50 us", "save p99 us"], rows))
    for s in p["skipped"]:
        lines.append(s)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
