"""Streams (issue 34): what emitting costs a step, what reading costs, how soon a reader sees.

1. Emit overhead: one step emitting 10,000 small token events (``ctx.emit("tokens",
   "tok")``) against the same step without them, on each local backend; reported as
   microseconds per event and as a share of a step whose tokens cost 20 us each to make
   (a fast tokenizer's loop; a model streaming at 100 tokens/s costs 10,000 us each).
2. Read cost: a run with 100,000 events; reading all of them from offset 0, and the last
   1,000 from an offset near the end (time and store loads: O(events) and O(what remains)).
3. Latency: a writer process flushes one event every 20 ms; a reader in another process
   records when it sees each (p50/p99 after the flush returned), on SQLite and, with a
   server, PostgreSQL.

    .venv/bin/python benchmarks/streams.py [--quick] [--pg postgresql://postgres@127.0.0.1/test]

With ``--pg`` the script makes a table of its own there (``t_streams_<random>``) and drops
it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from stepstone import Step, StepContext, open_store, run, stream

SRC = str(Path(__file__).resolve().parents[1] / "src")


def emit_overhead(config: str, events: int, repeats: int) -> dict[str, float]:
    """Seconds of a step emitting ``events`` tokens, and of the same step without."""

    def with_events(state: dict[str, Any], ctx: StepContext) -> None:
        for _ in range(events):
            ctx.emit("tokens", "tok")

    def without(state: dict[str, Any], ctx: StepContext) -> None:
        for _ in range(events):
            pass

    timings: dict[str, list[float]] = {"with": [], "without": []}
    with open_store(config) as store:
        for _ in range(repeats):
            for name, fn in (("without", without), ("with", with_events)):
                started = time.perf_counter()
                run(f"{name}-{uuid.uuid4().hex}", [Step("talk", fn)], store)
                timings[name].append(time.perf_counter() - started)
    best = {name: min(values) for name, values in timings.items()}
    per_event_us = (best["with"] - best["without"]) / events * 1e6
    return {
        "with_s": best["with"],
        "without_s": best["without"],
        "per_event_us": per_event_us,
        "share_of_20us_tokens_pct": per_event_us / 20 * 100,
    }


class CountingLoads:
    """Counts the loads a reader makes (wraps one store's ``load``)."""

    def __init__(self, store: Any) -> None:
        self.loads = 0
        inner = store.load

        def load(run_id: str) -> Any:
            self.loads += 1
            return inner(run_id)

        store.load = load


def read_cost(config: str, events: int) -> dict[str, float]:
    """Time and loads to read ``events`` events from 0, and the last 1,000 from near the end."""

    def talk(state: dict[str, Any], ctx: StepContext) -> None:
        for i in range(events):
            ctx.emit("tokens", f"token {i}")

    with open_store(config) as store:
        run("big", [Step("talk", talk)], store)
        counter = CountingLoads(store)
        started = time.perf_counter()
        everything = list(stream(store, "big"))
        whole_s, whole_loads = time.perf_counter() - started, counter.loads
        assert len(everything) == events
        cut = everything[-1001].id
        counter.loads = 0
        started = time.perf_counter()
        tail = list(stream(store, "big", after=cut))
        tail_s, tail_loads = time.perf_counter() - started, counter.loads
        assert len(tail) == 1000
    return {
        "from_0_s": whole_s,
        "from_0_loads": whole_loads,
        "near_end_s": tail_s,
        "near_end_loads": tail_loads,
    }


WRITER = r"""
import sys, time, json
from stepstone import Step, open_store, run
from stepstone._stream._writer import current
config, count = sys.argv[1], int(sys.argv[2])
def talk(state, ctx):
    for i in range(count):
        ctx.emit("tick", i)
        current.get().writer.flush()
        print(json.dumps([i, time.time()]), flush=True)
        time.sleep(0.02)
with open_store(config) as store:
    run("live", [Step("talk", talk)], store)
"""

READER = r"""
import sys, time, json
from stepstone import open_store, stream
config = sys.argv[1]
with open_store(config) as store:
    while store.load("live") is None:
        time.sleep(0.005)
    for event in stream(store, "live"):
        print(json.dumps([event.data, time.time()]), flush=True)
"""


def latency(config: str, count: int) -> dict[str, float]:
    """p50/p99 seconds from a flush returning in one process to a reader seeing it in another."""
    env = {**os.environ, "PYTHONPATH": SRC}
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, config], stdout=subprocess.PIPE, text=True, env=env
    )
    writer = subprocess.run(
        [sys.executable, "-c", WRITER, config, str(count)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    seen_out, _ = reader.communicate(timeout=60)
    flushed = dict(json.loads(line) for line in writer.stdout.splitlines())
    seen = dict(json.loads(line) for line in seen_out.splitlines())
    delays = sorted(seen[i] - flushed[i] for i in flushed if i in seen)
    return {
        "events": len(delays),
        "p50_ms": statistics.median(delays) * 1000,
        "p99_ms": delays[int(len(delays) * 0.99) - 1] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg", help="a PostgreSQL config string to measure too")
    parser.add_argument("--latency", action="store_true", help="measure only 3. (latency)")
    args = parser.parse_args()
    events = 2_000 if args.quick else 10_000
    stored = 10_000 if args.quick else 100_000
    samples = 50 if args.quick else 200
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent) as base:
        local = {
            "memory": "memory://bench",
            "sqlite": f"sqlite:///{base}/s.db",
            "file": f"file://{base}/files",
        }
        print(f"1. emit overhead: a step emitting {events:,} token events")
        for name, config in {} if args.latency else local.items():
            r = emit_overhead(config, events, 3 if args.quick else 5)
            print(
                f"  {name:7} with {r['with_s'] * 1000:8.1f} ms"
                f"  without {r['without_s'] * 1000:6.1f} ms"
                f"  {r['per_event_us']:5.2f} us/event"
                f"  = {r['share_of_20us_tokens_pct']:4.1f}% of 20 us tokens"
            )
        print(f"2. read cost: a run with {stored:,} stored events")
        readers = {
            "memory": "memory://read",
            "sqlite": f"sqlite:///{base}/read.db",
            "file": f"file://{base}/read-files",
        }
        for name, config in {} if args.latency else readers.items():
            r = read_cost(config, stored)
            print(
                f"  {name:7} from 0: {r['from_0_s'] * 1000:7.1f} ms, {r['from_0_loads']:4d} loads"
                f"   last 1,000: {r['near_end_s'] * 1000:6.1f} ms, {r['near_end_loads']:3d} loads"
            )
        print(f"3. latency: flush in one process -> seen in another ({samples} events)")
        targets = {"sqlite": f"sqlite:///{base}/live.db"}
        table = f"t_streams_{uuid.uuid4().hex}"
        if args.pg:
            targets["postgresql"] = f"{args.pg}?table={table}"
        try:
            for name, config in targets.items():
                r = latency(config, samples)
                print(
                    f"  {name:10} p50 {r['p50_ms']:5.1f} ms  p99 {r['p99_ms']:5.1f} ms"
                    f"  ({r['events']} events)"
                )
        finally:
            if args.pg:
                drop(args.pg, table)


def drop(config: str, table: str) -> None:
    """Drop the benchmark's table (and the store's side tables) from the PostgreSQL server."""
    import psycopg

    with psycopg.connect(config, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")


if __name__ == "__main__":
    main()
