"""``stepstone bench``: what checkpointing costs on *your* store, measured in place.

Figures, each a median over repeats with the min and max beside it:

- per-step overhead: ``(time of one 10-step run - time of the same 10 plain function
  calls) / 10``, with a ~1 KB state; a run is started under a new run_id each time;
- save: one ``store.save`` of a ~1 KB checkpoint over the previous version;
- load: one ``store.load`` of that checkpoint;
- floor (``file:`` and ``sqlite:`` only): the least any code can do to store the same
  bytes with the same durability, measured beside the store in the same process and
  interleaved with it, so a noisy disk moves both alike:

  - ``file:``: write the bytes to a temp file, fsync it, rename it over a target, fsync
    the directory (no fsyncs with ``durability=none``), in the store's directory;
  - ``sqlite:``: a raw ``sqlite3`` upsert + commit of the same JSON text into a separate
    database file beside the store's, WAL journal, the store's ``synchronous`` level.

  Ratios are computed per repeat from the paired measurements, then their median taken.

Runs created here use run_ids under ``__stepstone_bench__/`` and are deleted before the
command returns (floor files too), even when it fails. Wall-clock numbers on a shared
machine are noisy: read the spread, and compare ratios rather than absolute times.

This module holds what ``stepstone bench --store URL`` needs and nothing more. The
scripts in the repository's ``benchmarks/`` build on ``bench_store`` (their extra floors,
e.g. for PostgreSQL, go in through its ``floor=`` argument; they never patch this module)
and keep their own workloads; none of this is public API.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._bench_floors import FileFloor, Floor, FloorFactory, SQLiteFloor, floor_for
from ._bench_machine import machine_info, store_directory
from ._bench_workload import (
    BENCH_PREFIX,
    STEPS,
    bench_checkpoint,
    make_steps,
    plain_of,
    state_of_size,
)
from ._checkpoint import Checkpoint
from ._codec import encode_state
from ._redact import redact_url
from ._registry import open_store
from ._runner import run
from ._store import Store

# The workload, floors and machine description live in their own modules; their names
# stay importable from here, where ``stepstone bench`` and the benchmarks find them.
__all__ = [
    "BENCH_PREFIX",
    "STEPS",
    "FileFloor",
    "Floor",
    "FloorFactory",
    "SQLiteFloor",
    "Stats",
    "StoreBench",
    "bench_store",
    "floor_for",
    "machine_info",
    "main",
    "make_steps",
    "state_of_size",
]


_perf = time.perf_counter


# --- statistics ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stats:
    """Median, min and max of one figure over the repeats (all values kept)."""

    median: float
    min: float
    max: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Summarise ``values`` (at least one)."""
        return cls(statistics.median(values), min(values), max(values), tuple(values))

    def to_json(self, scale: float = 1.0, digits: int = 2) -> dict[str, Any]:
        """Return the figures multiplied by ``scale`` (e.g. 1e6 for microseconds)."""
        return {
            "median": round(self.median * scale, digits),
            "min": round(self.min * scale, digits),
            "max": round(self.max * scale, digits),
            "repeats": len(self.values),
        }


# --- measuring ----------------------------------------------------------------------------


class _RunIds:
    """Fresh run ids under the bench prefix; remembers them so they can all be deleted."""

    def __init__(self) -> None:
        self.prefix = f"{BENCH_PREFIX}{os.getpid()}-{secrets.token_hex(4)}/"
        self._count = 0
        self.pending: list[str] = []

    def take(self, n: int) -> list[str]:
        ids = [f"{self.prefix}{self._count + i}" for i in range(n)]
        self._count += n
        self.pending.extend(ids)
        return ids

    def delete_all(self, store: Store) -> None:
        for run_id in self.pending:
            with contextlib.suppress(Exception):
                store.delete(run_id)
        self.pending.clear()


class _Measure:
    """One figure measured in timed batches; ``batch`` returns seconds per operation."""

    def __init__(self, name: str, setup: Callable[[], None], batch: Callable[[int], float]):
        self.name = name
        self.setup = setup
        self.batch = batch
        self.per_batch = 1
        self.values: list[float] = []  # wall-clock seconds per operation, one per repeat
        self.cpu_values: list[float] = []  # CPU seconds of this process per operation

    def calibrate(self, target_s: float) -> None:
        """Pick a batch size so one batch takes about ``target_s``."""
        self.setup()
        n = 1
        while True:
            per_op = self.batch(n)
            if per_op * n >= target_s / 4 or n >= 1_000_000:
                break
            n *= 4
        self.per_batch = max(3, min(1_000_000, round(target_s / max(per_op, 1e-9))))


def measure_rounds(measures: Sequence[_Measure], repeats: int, target_s: float) -> None:
    """Run every measure ``repeats`` times, interleaved, rotating their order each round."""
    for m in measures:
        m.calibrate(target_s)
    for r in range(repeats):
        order = list(measures)
        shift = r % len(order)
        order = order[shift:] + order[:shift]
        for m in order:
            gc.collect()
            m.values.append(m.batch(m.per_batch))
            m.cpu_values.append(_last_cpu[0])


_last_cpu = [0.0]


def _timed(fn: Callable[[], object], n: int) -> float:
    """Return wall seconds per call of ``fn`` over ``n`` calls (CPU seconds: ``_last_cpu``).

    The garbage collector stays on: a real program pays for what a save allocates. CPU
    time leaves out the time this process waited for a CPU that other work held, so it
    is the steadier measure of pure-CPU figures (the memory store) on a busy machine.
    """
    c0 = time.process_time()
    t0 = _perf()
    for _ in range(n):
        fn()
    wall = (_perf() - t0) / n
    _last_cpu[0] = (time.process_time() - c0) / n
    return wall


@dataclass
class StoreBench:
    """What ``bench_store`` measured; times in seconds."""

    overhead_per_step: Stats | None
    overhead_per_step_cpu: Stats | None
    plain_per_run: Stats | None
    run_per_run: Stats | None
    save: Stats | None
    load: Stats | None
    floor: Stats | None
    floor_label: str | None
    save_ratio: Stats | None
    overhead_ratio: Stats | None
    state_bytes: int
    runs_created: int

    def to_json(self) -> dict[str, Any]:
        """Return the figures in microseconds (ratios as plain numbers)."""
        us = 1e6

        def fig(stats: Stats | None, scale: float = us) -> dict[str, Any] | None:
            return None if stats is None else stats.to_json(scale, 2 if scale == us else 3)

        return {
            "state_bytes": self.state_bytes,
            "overhead_per_step_us": fig(self.overhead_per_step),
            "overhead_per_step_cpu_us": fig(self.overhead_per_step_cpu),
            "plain_per_run_us": fig(self.plain_per_run),
            "run_per_run_us": fig(self.run_per_run),
            "save_us": fig(self.save),
            "load_us": fig(self.load),
            "floor_us": fig(self.floor),
            "floor": self.floor_label,
            "save_over_floor": fig(self.save_ratio, 1.0),
            "overhead_over_floor": fig(self.overhead_ratio, 1.0),
            "runs_created": self.runs_created,
        }


def bench_store(
    store: Store,
    *,
    state: Mapping[str, Any] | None = None,
    repeats: int = 7,
    target_s: float = 0.3,
    what: Sequence[str] = ("overhead", "save", "load"),
    floor: bool | FloorFactory = True,
) -> StoreBench:
    """Measure ``store``: per-step overhead, save, load and the floor, interleaved.

    ``floor`` True uses ``floor_for``; a callable makes the floor instead (the benchmark
    scripts pass one that knows more backends); False measures no floor.
    Every run created is deleted before returning, whatever happens.
    """
    payload = dict(state) if state is not None else state_of_size(1024)
    state_bytes = len(encode_state(payload)[0].encode("utf-8"))
    ids = _RunIds()
    save_id = f"{ids.prefix}save"
    created = 0
    make_floor: FloorFactory | None = floor_for if floor is True else (floor or None)
    the_floor = make_floor(store, payload) if make_floor is not None else None
    try:
        steps = make_steps(payload)
        plain = plain_of(steps)
        results: dict[str, _Measure] = {}

        if "overhead" in what:

            def plain_batch(n: int) -> float:
                return _timed(plain, n)

            def run_batch(n: int) -> float:
                nonlocal created
                run_ids = iter(ids.take(n))
                created += n
                try:
                    return _timed(lambda: run(next(run_ids), steps, store), n)
                finally:
                    ids.delete_all(store)

            results["plain"] = _Measure("plain", lambda: None, plain_batch)
            results["run"] = _Measure("run", lambda: None, run_batch)

        cp_box: list[Checkpoint] = []
        full_state = plain()  # what a run's checkpoints hold after its last step

        def save_setup() -> None:
            if not cp_box:
                cp_box.append(store.save(bench_checkpoint(save_id, full_state, None)))

        def save_once() -> None:
            cp_box[0] = store.save(bench_checkpoint(save_id, full_state, cp_box[0].version))

        if "save" in what:
            results["save"] = _Measure("save", save_setup, lambda n: _timed(save_once, n))
        if "load" in what:
            results["load"] = _Measure(
                "load", save_setup, lambda n: _timed(lambda: store.load(save_id), n)
            )
        if the_floor is not None:
            results["floor"] = _Measure("floor", lambda: None, lambda n: _timed(the_floor.op, n))
        measure_rounds(list(results.values()), repeats, target_s)

        def stats(name: str) -> Stats | None:
            found = results.get(name)
            return None if found is None else Stats.of(found.values)

        overhead = None
        overhead_cpu = None
        overhead_ratio = None
        if "run" in results:
            per_step = [
                (r - p) / STEPS
                for r, p in zip(results["run"].values, results["plain"].values, strict=True)
            ]
            overhead = Stats.of(per_step)
            overhead_cpu = Stats.of(
                [
                    (r - p) / STEPS
                    for r, p in zip(
                        results["run"].cpu_values, results["plain"].cpu_values, strict=True
                    )
                ]
            )
            if "floor" in results:
                overhead_ratio = Stats.of(
                    [o / f for o, f in zip(per_step, results["floor"].values, strict=True)]
                )
        save_ratio = None
        if "floor" in results and "save" in what:
            save_ratio = Stats.of(
                [
                    s / f
                    for s, f in zip(results["save"].values, results["floor"].values, strict=True)
                ]
            )
        return StoreBench(
            overhead_per_step=overhead,
            overhead_per_step_cpu=overhead_cpu,
            plain_per_run=stats("plain"),
            run_per_run=stats("run"),
            save=stats("save"),
            load=stats("load"),
            floor=stats("floor"),
            floor_label=None if the_floor is None else the_floor.label,
            save_ratio=save_ratio,
            overhead_ratio=overhead_ratio,
            state_bytes=state_bytes,
            runs_created=created + 1,
        )
    finally:
        ids.delete_all(store)
        with contextlib.suppress(Exception):
            store.delete(save_id)
        if the_floor is not None:
            the_floor.close()


# --- command line -------------------------------------------------------------------------


def _fmt_us(stats: Stats | None) -> str:
    if stats is None:
        return "-"
    return f"{_us(stats.median)} us  (min {_us(stats.min)}, max {_us(stats.max)})"


def _us(seconds: float) -> str:
    value = seconds * 1e6
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _fmt_ratio(stats: Stats | None) -> str:
    if stats is None:
        return "-"
    return f"{stats.median:.2f}x  (min {stats.min:.2f}x, max {stats.max:.2f}x)"


def render(config: str, result: StoreBench, machine: Mapping[str, Any]) -> str:
    """Return the human-readable table for one store's results."""
    rows = [
        ("per-step overhead", _fmt_us(result.overhead_per_step)),
        ("  of it CPU time", _fmt_us(result.overhead_per_step_cpu)),
        ("  10-step run", _fmt_us(result.run_per_run)),
        ("  10 plain calls", _fmt_us(result.plain_per_run)),
        ("save", _fmt_us(result.save)),
        ("load", _fmt_us(result.load)),
    ]
    if result.floor is not None:
        rows += [
            ("floor", _fmt_us(result.floor)),
            ("  (floor is)", result.floor_label or ""),
            ("save / floor", _fmt_ratio(result.save_ratio)),
            ("per-step overhead / floor", _fmt_ratio(result.overhead_ratio)),
        ]
    width = max(len(name) for name, _ in rows)
    disk = machine.get("disk") or {}
    lines = [
        f"stepstone bench: {redact_url(config)}",
        f"  {result.state_bytes}-byte state, {STEPS} steps per run, "
        f"{len(result.save.values) if result.save else 0} repeats; "
        f"{machine.get('nproc')} CPUs, Python {machine.get('python')}"
        + (f", {disk.get('fstype')} on {disk.get('device')}" if disk.get("fstype") else ""),
        "",
    ]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    lines += [
        "",
        "  median over repeats (min, max). per-step overhead = (run - plain calls) / steps;",
        "  a ratio is taken per repeat from interleaved measurements. Timings on a busy",
        "  machine vary: compare ratios, and rerun before drawing conclusions.",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run ``stepstone bench`` with ``argv`` (the arguments after ``bench``); return its code."""
    parser = argparse.ArgumentParser(
        prog="stepstone bench",
        description="Measure per-step overhead, save and load cost of a store, against "
        "the floor for file: and sqlite: stores. Creates runs under "
        f"{BENCH_PREFIX!r} and deletes them.",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="store config string (default: $STEPSTONE_STORE, else sqlite:///stepstone.db)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (~5 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    target_s = 0.1 if args.quick else 0.3
    config = args.store or os.environ.get("STEPSTONE_STORE") or "sqlite:///stepstone.db"
    try:
        store = open_store(config)
    except Exception as exc:  # noqa: BLE001 - the command's answer to any failure: a line, exit 2
        print(f"stepstone bench: cannot open store {redact_url(config)}: {exc}", file=sys.stderr)
        return 2
    try:
        result = bench_store(store, repeats=repeats, target_s=target_s)
        machine = machine_info(store_directory(store))
    except KeyboardInterrupt:
        print("stepstone bench: interrupted; benchmark runs deleted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command's answer to any failure: a line, exit 1
        print(f"stepstone bench: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        out = {"store": redact_url(config), "backend": type(store).scheme, "machine": machine}
        out.update(result.to_json())
        print(json.dumps(out, indent=2))
    else:
        print(render(config, result, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
