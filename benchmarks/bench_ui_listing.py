"""The dashboard's listing at scale: a page and the counts, indexed vs the default scan.

Fills a store with N runs over every status, then times (median of several calls)
``list_page`` (first page, a page deep in one status, a prefix page) and
``count_by_status``, each against the default ``Store`` implementation (a pass over
``list_info``). Prints a table; not a test. Usage::

    python benchmarks/bench_ui_listing.py [--runs 100000] [--backends memory,sqlite]
    python benchmarks/bench_ui_listing.py --backends cosmos --runs 2000  # emulator

Cosmos runs against the local emulator (tests/cosmos_emulator.py), which is slow to
fill; use a smaller N there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from stepstone import Checkpoint, Failure, Store, open_store
from stepstone._checkpoint import STATUSES, evolve
from stepstone._store import page_key


def _checkpoint(i: int) -> Checkpoint:
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=i)
    cp = Checkpoint(f"run-{i:07d}", total_steps=3, updated_at=at, created_at=at)
    status = STATUSES[i % len(STATUSES)]
    if status == "done":
        return evolve(cp, step=2, step_names=("a", "b", "c"))
    if status == "queued":
        return evolve(cp, queued=True)
    if status == "waiting":
        return evolve(cp, waiting_for="signal approval")
    if status == "cancelled":
        return evolve(cp, cancelled=True)
    if status == "failed":
        return evolve(cp, failure=Failure(0, "a", "RuntimeError", "503", 3, at))
    return cp


@contextmanager
def _store(backend: str, work: Path) -> Iterator[Store]:
    if backend == "memory":
        config = "memory://"
    elif backend == "sqlite":
        config = f"sqlite:///{work}/runs.db?synchronous=normal"
    elif backend == "cosmos":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from cosmos_emulator import cosmos_emulator

        with cosmos_emulator() as emu:
            os.environ["AZURE_COSMOS_KEY"] = emu.key
            protocol = "&protocol=http" if emu.endpoint.startswith("http://") else ""
            config = (
                f"cosmos://{emu.host}:{emu.port}/bench/runs-{uuid.uuid4().hex[:8]}"
                f"?verify=false&create=true{protocol}"
            )
            with open_store(config) as store:
                yield store
            return
    else:
        raise SystemExit(f"unknown backend {backend!r}")
    with open_store(config) as store:
        yield store


def _median_ms(call: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def bench(backend: str, runs: int, repeat: int) -> list[tuple[str, float, float]]:
    """Return (what, indexed ms, default ms) rows for ``backend`` filled with ``runs``."""
    with tempfile.TemporaryDirectory() as tmp, _store(backend, Path(tmp)) as store:
        start = time.perf_counter()
        for i in range(runs):
            store.import_checkpoint(_checkpoint(i))
        print(f"# {backend}: filled {runs:,} runs in {time.perf_counter() - start:.1f} s")
        deep = store.list_page("waiting", limit=50)
        depth = 2  # the page timed: after ``deep``, up to 22 (fewer in a small store)
        while depth < 22:
            page = store.list_page("waiting", after=page_key(deep[-1]), limit=50)
            if len(page) < 50:
                break
            deep, depth = page, depth + 1
        cursor = page_key(deep[-1])
        cases: list[tuple[str, Callable[[Store], Any]]] = [
            ("first page, all runs", lambda s: s.list_page(limit=50)),
            ("first page, status=failed", lambda s: s.list_page("failed", limit=50)),
            (
                f"page {depth}, status=waiting",
                lambda s: s.list_page("waiting", after=cursor, limit=50),
            ),
            ("page, prefix 'run-00012'", lambda s: s.list_page(prefix="run-00012", limit=50)),
            ("counts per status", lambda s: s.count_by_status()),
            ("counts, prefix 'run-00012'", lambda s: s.count_by_status("run-00012")),
        ]
        rows = []
        for what, case in cases:
            fast = _median_ms(lambda case=case: case(store), repeat)  # type: ignore[misc]
            default = _median_ms(
                lambda case=case: case(_Default(store)),  # type: ignore[misc]
                max(1, repeat // 5),
            )
            rows.append((what, fast, default))
        return rows


class _Default:
    """The store seen through the base ``Store`` methods (the default scan)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def list_page(self, *args: Any, **kwargs: Any) -> Any:
        return Store.list_page(self._store, *args, **kwargs)

    def count_by_status(self, *args: Any) -> Any:
        return Store.count_by_status(self._store, *args)


def main() -> None:
    """Parse the arguments, run each backend, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--backends", default="memory,sqlite")
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()
    print("| backend | runs | call | indexed (ms) | default scan (ms) |")
    print("|---|---:|---|---:|---:|")
    for backend in args.backends.split(","):
        for what, fast, default in bench(backend, args.runs, args.repeat):
            print(f"| {backend} | {args.runs:,} | {what} | {fast:.2f} | {default:.1f} |")


if __name__ == "__main__":
    main()
