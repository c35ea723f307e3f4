"""The dashboard's runs list: render time for runs with a large state vs a small one.

Fills a store with N runs (default 25, one page) whose states are ``--mb`` MB each
(kept in pieces) or a few bytes, then times (median of several) a full render of
``/runs`` through Starlette's test client, and the live poll's full re-render. A row
shows what ``list_page`` reports (status, progress, workflow, what a run waits for):
its cost must not grow with the states. Prints a table; not a test. Usage::

    python benchmarks/bench_ui_render.py [--runs 25] [--mb 4] [--backends memory,sqlite,file]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from starlette.testclient import TestClient

from stepstone import Checkpoint, open_store
from stepstone.ui import create_app


def _config(backend: str, work: Path) -> str:
    if backend == "memory":
        return f"memory://bench-ui-{uuid.uuid4().hex}"
    if backend == "sqlite":
        return f"sqlite:///{work}/runs.db?synchronous=normal"
    if backend == "file":
        return f"file://{work}/runs"
    raise SystemExit(f"unknown backend {backend!r}")


def bench(backend: str, runs: int, mb: float, repeat: int) -> tuple[float, float]:
    """Return the median render time (ms) of /runs with big states, then small ones."""
    results = []
    for size in (int(mb * 1024 * 1024), 0):
        with tempfile.TemporaryDirectory() as tmp:
            config = _config(backend, Path(tmp))
            with open_store(config) as store:
                store.init()
                for i in range(runs):
                    # A transcript: many small messages, as an agent's state grows.
                    count = max(1, size // 128)
                    messages = [{"role": "user", "text": "y" * 90, "n": k} for k in range(count)]
                    state = {"messages": messages if size else [], "n": i}
                    store.save(
                        Checkpoint(
                            f"run-{i:03d}",
                            state=state,
                            total_steps=3,
                            workflow="bench",
                            waiting_for="signal approval",
                        )
                    )
                with TestClient(create_app(config), base_url="http://127.0.0.1") as client:
                    assert client.get("/runs").status_code == 200  # opens the store
                    times = []
                    for _ in range(repeat):
                        start = time.perf_counter()
                        response = client.get("/runs")
                        times.append((time.perf_counter() - start) * 1000)
                        assert response.status_code == 200
                results.append(statistics.median(times))
    return results[0], results[1]


def main() -> None:
    """Parse the arguments, run each backend, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--mb", type=float, default=4.0)
    parser.add_argument("--backends", default="memory,sqlite,file")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"| backend | runs | /runs, {args.mb:g} MB states (ms) | /runs, small states (ms) |")
    print("|---|---:|---:|---:|")
    for backend in args.backends.split(","):
        big, small = bench(backend, args.runs, args.mb, args.repeat)
        print(f"| {backend} | {args.runs} | {big:.1f} | {small:.1f} |")


if __name__ == "__main__":
    main()
