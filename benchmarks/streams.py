"""Streams (issue 34): what emitting costs a step, what reading costs, how soon a reader sees.

1. Emit overhead, on each local backend: a step reading a fake model's stream of 10,000
   small tokens (parsing each server-sent chunk, as any client of a streaming model
   does) and emitting each, against the same step without the emits (the issue's
   target: at most 10% more); and the pure emit loop (``ctx.emit("tokens", "tok")``
   against an empty loop) in microseconds per event. A real model streams at 50-200
   tokens/s (5,000-20,000 us a token), which makes any per-event cost here vanish;
   benchmarks/callgrind.sh --modes emit,emit-none counts the instructions of one event.
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


def fake_model(tokens: int) -> list[bytes]:
    """The server-sent lines of a chat model streaming ``tokens`` small tokens.

    One OpenAI-style ``chat.completion.chunk`` per token, as its API sends them: what a
    client of a streaming model gets, and must split and parse, for every token.
    """
    words = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."]
    return [
        b"data: "
        + json.dumps(
            {
                "id": "chatcmpl-9a8b7c6d5e4f",
                "object": "chat.completion.chunk",
                "created": 1733479200,
                "model": "gpt-4o-mini-2024-07-18",
                "system_fingerprint": "fp_0ba0d124f1",
                "choices": [
                    {"index": 0, "delta": {"content": words[i % 10]}, "finish_reason": None}
                ],
            }
        ).encode()
        for i in range(tokens)
    ]


def emit_overhead(config: str, events: int, repeats: int) -> dict[str, float]:
    """Seconds of steps with and without ``events`` token events, best of ``repeats``.

    ``pure``: a step whose only work is emitting (``ctx.emit("tokens", "tok")`` in a
    loop), against an empty loop: the cost of one event. ``model``: a step that reads a
    fake model's stream (``fake_model``: parse each server-sent chunk, take its token)
    and emits each token, against the same step without the emit: the issue's target,
    at most 10% more.
    """
    lines = fake_model(events)

    def pure(state: dict[str, Any], ctx: StepContext) -> None:
        for _ in range(events):
            ctx.emit("tokens", "tok")

    def empty(state: dict[str, Any], ctx: StepContext) -> None:
        for _ in range(events):
            pass

    def model(emitting: bool) -> Any:
        def talk(state: dict[str, Any], ctx: StepContext) -> None:
            text = []
            for line in lines:
                chunk = json.loads(line[6:])
                token = chunk["choices"][0]["delta"].get("content")
                if token:
                    text.append(token)
                    if emitting:
                        ctx.emit("tokens", token)
            state["text"] = "".join(text)

        return talk

    steps = {"empty": empty, "pure": pure, "model": model(False), "model+emit": model(True)}
    timings: dict[str, list[float]] = {name: [] for name in steps}
    with open_store(config) as store:
        for _ in range(repeats):
            for name, fn in steps.items():
                started = time.perf_counter()
                run(f"{name}-{uuid.uuid4().hex}", [Step("talk", fn)], store)
                timings[name].append(time.perf_counter() - started)
    best = {name: min(values) for name, values in timings.items()}
    return {
        "pure_per_event_us": (best["pure"] - best["empty"]) / events * 1e6,
        "model_s": best["model"],
        "model_emit_s": best["model+emit"],
        "model_token_us": best["model"] / events * 1e6,
        "model_overhead_pct": (best["model+emit"] / best["model"] - 1) * 100,
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
        print(f"1. emit overhead: {events:,} token events in one step")
        for name, config in {} if args.latency else local.items():
            r = emit_overhead(config, events, 3 if args.quick else 7)
            print(
                f"  {name:7} pure emit {r['pure_per_event_us']:5.2f} us/event"
                f"   fake model {r['model_s'] * 1000:7.1f} ms ({r['model_token_us']:4.1f} us/token)"
                f"  with events {r['model_emit_s'] * 1000:7.1f} ms"
                f"  = {r['model_overhead_pct']:+5.1f}%"
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
