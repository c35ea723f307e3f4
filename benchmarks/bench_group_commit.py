"""Group commit: steps/s and save latency of concurrent runs on one store (issue 12).

Cells: 1, 8 and 64 threads each running 10-step runs under ``run`` back to back, and 1
and 100 asyncio tasks doing the same under ``arun``, on one shared store object: SQLite
at ``synchronous=FULL`` and PostgreSQL at the server's default durability (a fresh table,
dropped afterwards). After a warm-up, steps are counted for a window and every save that
finished inside it is timed (p50/p99). Cells are interleaved round by round, their order
rotating. State ~1 KB, as everywhere.

Also printed: the disk's raw fsync (p50, same directory), the p99 save latency expressed
in lone-save commits (p99 / the 1-thread p50), and, for SQLite, the mean batch size
(saves per shared commit) and the p99 of *commits waited*: how many commits (each one
fsync) finished while a save was in ``save``, its own included. The committer makes a
save wait for at most the commit in flight plus its own (plus one that finishes while it
is being encoded); the rest of its latency is waiting for the CPU (the GIL) behind the
other runs, which Little's law fixes at about N / (steps/s) once the CPU is saturated.

A ``sqlite-normal`` row (``synchronous=NORMAL``: the commit does not wait for an fsync)
gives the ceiling the same runs reach in this process when fsync costs nothing: once
64 threads at FULL reach it, fsync no longer bounds throughput and the CPU does.

Targets (issue 12): 64 threads >= 4x one thread on SQLite with p99 <= ~3 fsyncs;
PostgreSQL >= 3x.

    .venv/bin/python benchmarks/bench_group_commit.py [--quick] [--json] [--no-sql]
        [--threads 1,8,64] [--tasks 1,100] [--repeats N] [--window S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import scratch, sql_config, table

from stepstone import Step, arun, open_store, run
from stepstone._bench import machine_info

STEPS = 10
PAYLOAD = {"payload": "x" * 1000, "meta": {"user": "u-123", "tags": ["a"], "n": 1}}


def raw_fsync_us(directory: Path, n: int = 100) -> float:
    """Median time of a 4 KB pwrite + fsync in ``directory`` (the disk's floor)."""
    path = directory / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    times = []
    try:
        for i in range(n):
            os.pwrite(fd, b"x" * 4096, (i % 8) * 4096)
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1e6


class Bench:
    """One store shared by every thread or task of a cell."""

    def __init__(self, name: str, config: str, via: str) -> None:
        self.name = name
        self.via = via
        self.store = open_store(config)
        self.steps = 0
        self.recording = False
        self.latencies: list[float] = []
        self.waited: list[int] = []
        self.commits = 0
        self.cells: dict[str, dict[str, list[float]]] = {}
        self._ids = 0
        self._ids_lock = threading.Lock()
        save, asave = self.store.save, self.store.asave
        group = getattr(self.store, "_group", None)
        if group is not None:

            def count(batch: Any) -> None:
                self.commits += 1

            group.after_commit = count  # the store's test seam: after each COMMIT returned

        def timed(cp: Any) -> Any:
            t0, c0 = time.perf_counter(), self.commits
            saved = save(cp)
            if self.recording:
                self.latencies.append(time.perf_counter() - t0)
                self.waited.append(self.commits - c0)
            return saved

        async def atimed(cp: Any) -> Any:
            t0 = time.perf_counter()
            saved = await asave(cp)
            if self.recording:
                self.latencies.append(time.perf_counter() - t0)
            return saved

        # The runner calls ``store.save`` / ``store.asave``: instance attributes shadow them.
        self.store.save = timed  # type: ignore[method-assign, assignment]
        self.store.asave = atimed  # type: ignore[method-assign, assignment]
        self.sync_steps = [Step(f"s{i}", self._step(i)) for i in range(STEPS)]

    def _step(self, i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        key = f"k{i}"

        def step(state: dict[str, Any]) -> dict[str, Any]:
            self.steps += 1  # under the GIL; a lost increment is within the noise
            return {**PAYLOAD, key: i} if i == 0 else {key: i}

        return step

    def new_id(self) -> str:
        with self._ids_lock:
            self._ids += 1
            return f"bench-group-{os.getpid()}-{self._ids}"

    def batches(self) -> int | None:
        group = getattr(self.store, "_group", None)
        return None if group is None else sum(group.batch_sizes.values())

    def _measure(self, warm: float, window: float, stop: threading.Event) -> tuple[float, float]:
        time.sleep(warm)
        self.recording = True
        b0, s0 = self.batches(), len(self.latencies)
        c0, t0 = self.steps, time.perf_counter()
        time.sleep(window)
        steps, elapsed = self.steps - c0, time.perf_counter() - t0
        self.recording = False
        b1, saves = self.batches(), len(self.latencies) - s0
        stop.set()
        per_batch = saves / (b1 - b0) if b0 is not None and b1 is not None and b1 > b0 else 0.0
        return steps / elapsed, per_batch

    def threads(self, n: int, warm: float, window: float) -> tuple[float, float]:
        stop = threading.Event()
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                while not stop.is_set():
                    run(self.new_id(), self.sync_steps, self.store)
            except BaseException as exc:  # noqa: BLE001 - reported after the window
                errors.append(exc)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        sps, per_batch = self._measure(warm, window, stop)
        for t in threads:
            t.join(timeout=120)
            if t.is_alive():
                raise RuntimeError(f"{self.name}: a thread did not finish its run in 120 s")
        if errors:
            raise errors[0]
        return sps, per_batch

    def tasks(self, n: int, warm: float, window: float) -> tuple[float, float]:
        stop = threading.Event()

        async def worker() -> None:
            while not stop.is_set():
                await arun(self.new_id(), self.sync_steps, self.store)

        async def main() -> tuple[float, float]:
            tasks = [asyncio.ensure_future(worker()) for _ in range(n)]
            result = await asyncio.to_thread(self._measure, warm, window, stop)
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
            return result

        return asyncio.run(main())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.store.close()


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-sql", action="store_true")
    p.add_argument("--threads", default="1,8,64")
    p.add_argument("--tasks", default="1,100")
    p.add_argument("--repeats", type=int)
    p.add_argument("--window", type=float)
    args = p.parse_args()
    repeats = args.repeats or (2 if args.quick else 3)
    window = args.window or (1.0 if args.quick else 2.0)
    warm = 0.3 if args.quick else 0.5
    kinds = [("threads", int(x)) for x in args.threads.split(",") if x] + [
        ("tasks", int(x)) for x in args.tasks.split(",") if x
    ]
    started, load0 = time.time(), os.getloadavg()
    skipped: list[str] = []
    with scratch("group") as base, contextlib.ExitStack() as stack:
        machine = machine_info(str(base))
        fsync_us = raw_fsync_us(base)
        benches = [Bench("sqlite", f"sqlite:///{base}/g.db?synchronous=full", "FULL")]
        # The ceiling: the same runs when no commit waits for an fsync (threads only).
        normal = Bench("sqlite-normal", f"sqlite:///{base}/n.db?synchronous=normal", "NORMAL")
        benches.append(normal)
        if args.no_sql:
            skipped.append("postgresql skipped: --no-sql")
        else:
            config, why = stack.enter_context(sql_config("postgresql", "group"))
            if config is None:
                skipped.append(f"postgresql skipped: {why}")
            else:
                benches.append(Bench("postgresql", config, why))
        for b in benches:
            stack.callback(b.close)
        for line in skipped:
            print(line, file=sys.stderr, flush=True)
        most = max(n for kind, n in kinds if kind == "threads")
        cells = [
            (b, kind, n)
            for b in benches
            for kind, n in kinds
            if b is not normal or (kind == "threads" and n in (1, most))
        ]
        for r in range(repeats):
            print(f"group commit: round {r + 1}/{repeats}", file=sys.stderr, flush=True)
            order = cells[r % len(cells) :] + cells[: r % len(cells)]
            for b, kind, n in order:
                gc.collect()
                b.latencies, b.waited = [], []
                sps, per_batch = (b.threads if kind == "threads" else b.tasks)(n, warm, window)
                lat = sorted(b.latencies)
                cell = b.cells.setdefault(
                    f"{kind}:{n}", {"sps": [], "p50": [], "p99": [], "batch": [], "waited": []}
                )
                cell["waited"].append(pct(sorted(b.waited), 0.99))
                cell["sps"].append(sps)
                cell["p50"].append(pct(lat, 0.5) * 1e6)
                cell["p99"].append(pct(lat, 0.99) * 1e6)
                cell["batch"].append(per_batch)
        results: list[dict[str, Any]] = []
        for b in benches:
            one = statistics.median(b.cells["threads:1"]["sps"]) if "threads:1" in b.cells else 0
            lone = statistics.median(b.cells["threads:1"]["p50"]) if "threads:1" in b.cells else 0
            for kind, n in kinds:
                if f"{kind}:{n}" not in b.cells:
                    continue
                c = b.cells[f"{kind}:{n}"]
                sps = statistics.median(c["sps"])
                p99 = statistics.median(c["p99"])
                results.append(
                    {
                        "backend": b.name,
                        "via": b.via,
                        "kind": kind,
                        "n": n,
                        "steps_per_s": sps,
                        "steps_per_s_range": [min(c["sps"]), max(c["sps"])],
                        "vs_one_thread": sps / one if one else None,
                        "save_p50_us": statistics.median(c["p50"]),
                        "save_p99_us": p99,
                        "p99_in_lone_commits": p99 / lone if lone else None,
                        "p99_in_raw_fsyncs": p99 / fsync_us
                        if b.name.startswith("sqlite")
                        else None,
                        "saves_per_commit": statistics.median(c["batch"])
                        if b.name.startswith("sqlite")
                        else None,
                        "p99_commits_waited": max(c["waited"])
                        if b.name.startswith("sqlite") and kind == "threads"
                        else None,
                    }
                )
    payload = {
        "figure": "group_commit",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "load_avg_start": [round(x, 2) for x in load0],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "machine": machine,
        "raw_fsync_p50_us": fsync_us,
        "repeats": repeats,
        "window_s": window,
        "skipped": skipped,
        "results": results,
    }
    if args.json:
        print(json.dumps(payload))
        return
    print(
        f"{payload['date']}, {payload['seconds']} s, {repeats} rounds of {window} s windows, "
        f"load {payload['load_avg_start']} -> {payload['load_avg_end']}; "
        f"raw fsync p50 {fsync_us:,.0f} us"
    )

    def opt(value: float | None, form: str) -> str:
        return "-" if value is None else form.format(value)

    rows = [
        [
            r["backend"],
            f"{r['n']} {r['kind']}",
            f"{r['steps_per_s']:,.0f} [{r['steps_per_s_range'][0]:,.0f}-"
            f"{r['steps_per_s_range'][1]:,.0f}]",
            opt(r["vs_one_thread"], "{:.2f}x"),
            f"{r['save_p50_us']:,.0f}",
            f"{r['save_p99_us']:,.0f}",
            opt(r["p99_in_lone_commits"], "{:.1f}"),
            opt(r["p99_in_raw_fsyncs"], "{:.1f}"),
            opt(r["saves_per_commit"], "{:.1f}"),
            opt(r["p99_commits_waited"], "{:.0f}"),
        ]
        for r in results
    ]
    print(
        table(
            [
                "backend",
                "concurrency",
                "steps/s",
                "vs 1 thread",
                "save p50 us",
                "save p99 us",
                "p99 / lone commit",
                "p99 / fsync",
                "saves/commit",
                "p99 commits waited",
            ],
            rows,
        )
    )
    for s in skipped:
        print(s)


if __name__ == "__main__":
    main()
