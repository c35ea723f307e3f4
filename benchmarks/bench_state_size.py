"""Figure 4: save (and load) cost at 1 KB, 100 KB and 1 MB states.

Two shapes of state: ``text`` (one long string, as the peers comparison uses: the I/O
view) and ``records`` (many small records with numbers: the JSON-encoding view). Each
backend at its default durability, interleaved with its floor storing the same bytes.
``encode`` is ``stepstone._codec.encode_state`` alone (dump, reload and compare), the
CPU part every backend pays before any I/O. PostgreSQL and MySQL/MariaDB (a fresh table on
the loopback servers, dropped afterwards; ``--no-sql`` skips them) against the raw-driver
upsert floor.

    .venv/bin/python benchmarks/bench_state_size.py [--quick] [--json] [--no-sql]
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

from _common import (
    SQL_KINDS,
    emit,
    fig,
    floor_for,
    parse_args,
    progress,
    scratch,
    settings,
    sql_config,
    state_of_size,
    table,
)

from stepstone import open_store
from stepstone._bench import Stats, bench_store, machine_info
from stepstone._codec import encode_state

SIZES = [("1 KB", 1024), ("100 KB", 100 * 1024), ("1 MB", 1024 * 1024)]


def encode_cost(state: dict[str, Any], repeats: int, target_s: float) -> dict[str, Any]:
    """Seconds per ``encode_state`` of ``state``, median over repeats (as microseconds)."""
    t0 = time.perf_counter()
    encode_state(state)
    once = max(time.perf_counter() - t0, 1e-7)
    n = max(3, int(target_s / once))
    values = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(n):
            encode_state(state)
        values.append((time.perf_counter() - t0) / n)
    return Stats.of(values).to_json(1e6)


def main() -> None:
    args = parse_args(__doc__ or "")
    repeats, target_s = settings(args, full=(5, 0.2), quick=(3, 0.1))
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    with scratch("state-size") as base, contextlib.ExitStack() as servers:
        machine = machine_info(str(base))
        backends = [
            ("memory", "memory://"),
            ("file", f"file://{base}/file"),
            ("sqlite", f"sqlite:///{base}/runs.db"),
        ]
        if args.no_sql:
            skipped.append("postgresql, mysql skipped: --no-sql")
        else:
            for kind in SQL_KINDS:
                config, why = servers.enter_context(sql_config(kind, "state_size"))
                if config is None:
                    skipped.append(f"{kind} skipped: {why}")
                    progress(args, skipped[-1])
                else:
                    backends.append((kind, config))
        for shape in ("text", "records"):
            for label, size in SIZES:
                state = state_of_size(size, shape)
                full = {"payload": state} | {f"k{i}": i for i in range(10)}
                progress(args, f"state size: {shape} {label}: encode ...")
                enc = encode_cost(full, repeats, target_s)
                for backend, config in backends:
                    progress(args, f"state size: {shape} {label}: {backend} ...")
                    store = open_store(config)
                    try:
                        measured = bench_store(
                            store,
                            state=state,
                            repeats=repeats,
                            target_s=target_s,
                            what=("save", "load"),
                            floor=floor_for,
                        ).to_json()
                    finally:
                        store.close()
                    row = {
                        "shape": shape,
                        "size": label,
                        "backend": backend,
                        "encode_us": enc,
                    }
                    row.update(measured)
                    results.append(row)
    rows = [
        [
            r["shape"],
            r["size"],
            r["backend"],
            fig(r["save_us"]),
            fig(r["floor_us"]),
            fig(r["save_over_floor"], "x"),
            fig(r["encode_us"]),
            fig(r["load_us"]),
        ]
        for r in results
    ]
    text = "\n".join(
        [
            f"Figure 4: save cost by state size (default durability), {repeats} repeats, "
            "microseconds, median [min-max]",
            "",
            table(
                ["shape", "size", "backend", "save", "floor", "save/floor", "encode", "load"],
                rows,
            ),
            *skipped,
        ]
    )
    emit(
        args,
        {
            "figure": "state_size",
            "machine": machine,
            "repeats": repeats,
            "results": results,
            "skipped": skipped,
        },
        text,
    )


if __name__ == "__main__":
    main()
