"""Figure 3: durable save cost when the store already holds 1, 1,000 and 100,000 runs.

For the file and sqlite backends: the store is populated with ~1 KB runs through the
store's own ``save`` at its weaker setting (file ``durability=none``, sqlite
``synchronous=normal``: same documents, no fsync per save), the page cache is flushed
(``os.sync``), then durable saves and loads are measured at the default durability,
interleaved with the floor in the same directory. The populate time is reported too.

For PostgreSQL and MySQL/MariaDB (a fresh table on the loopback servers, dropped
afterwards; ``--no-sql`` skips them) the rows are bulk-inserted through the driver
(``executemany`` of the store's own INSERT with the parameters its ``save`` builds, in
transactions of 5,000 rows), then the tables are analyzed (and PostgreSQL checkpointed),
and durable saves and loads are measured against the raw-driver upsert floor.
``--quick`` stops at 10,000 runs.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--json] [--no-sql]
        [--levels 1,1000,100000]
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
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
    sql_connect,
    table,
)

from stepstone import Checkpoint, open_store
from stepstone._bench import BENCH_PREFIX, STEPS, bench_store, machine_info, state_of_size

#: Rows per transaction when bulk-loading a SQL server table.
SQL_BATCH = 5_000


def populate(config: str, start: int, stop: int, state: dict[str, Any]) -> float:
    """Save runs number start..stop-1 through the store; return the seconds it took."""
    store = open_store(config)
    names = tuple(f"s{i}" for i in range(STEPS))
    try:
        t0 = time.perf_counter()
        for i in range(start, stop):
            store.save(
                Checkpoint(
                    run_id=f"{BENCH_PREFIX}scale/{i:07d}",
                    step=STEPS - 1,
                    state=state,
                    step_names=names,
                    total_steps=STEPS,
                )
            )
        return time.perf_counter() - t0
    finally:
        store.close()


def populate_sql(kind: str, config: str, start: int, stop: int, state: dict[str, Any]) -> float:
    """Bulk-insert runs start..stop-1 into the store's table through the raw driver.

    The rows are exactly what the store's ``save`` writes for a first save (its own save
    plan: statement and parameters), ``SQL_BATCH`` rows per transaction: one commit per
    batch, not per run. Returns the seconds it took.
    """
    store = open_store(config)  # creates the tables; lends its INSERT statement
    conn = sql_connect(kind, config)
    names = tuple(f"s{i}" for i in range(STEPS))
    try:
        # The store's own save plan (statement and parameters), so each row is exactly
        # what its first save writes; only the commits are batched.
        plan = store._save_plan  # type: ignore[attr-defined]  # noqa: SLF001
        t0 = time.perf_counter()
        cursor = conn.cursor()
        for lo in range(start, stop, SQL_BATCH):
            batch = []
            insert = ""
            for i in range(lo, min(stop, lo + SQL_BATCH)):
                cp = Checkpoint(
                    run_id=f"{BENCH_PREFIX}scale/{i:07d}",
                    step=STEPS - 1,
                    state=state,
                    step_names=names,
                    total_steps=STEPS,
                )
                _, insert, params = plan(cp)
                batch.append(params)
            if kind == "postgresql":
                with conn.transaction():
                    cursor.executemany(insert, batch)
            else:
                conn.begin()
                cursor.executemany(insert, batch)
                conn.commit()
        took = time.perf_counter() - t0
        # What a long-lived table would have: statistics, and (PostgreSQL) the bulk load's
        # dirty pages written out now rather than by a checkpoint during the measurement.
        table_name = store.table  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            cursor.execute(f"ANALYZE {'' if kind == 'postgresql' else 'TABLE '}{table_name}")
            if kind == "mysql":
                cursor.fetchall()
        if kind == "postgresql":
            with contextlib.suppress(Exception):
                cursor.execute("CHECKPOINT")
        return took
    finally:
        conn.close()
        store.close()


def measure_levels(
    args: Any,
    backend: str,
    fill: Callable[[int, int], float],
    durable: str,
    levels: list[int],
    repeats: int,
    target_s: float,
) -> list[dict[str, Any]]:
    """Fill the store level by level; measure durable save and load at each."""
    results: list[dict[str, Any]] = []
    stored = 0
    for level in levels:
        progress(args, f"scale: {backend}: populating to {level:,} runs ...")
        took = fill(stored, level)
        added = level - stored
        stored = level
        t0 = time.perf_counter()
        os.sync()
        synced = time.perf_counter() - t0
        progress(args, f"scale: {backend}: measuring durable save at {level:,} runs ...")
        store = open_store(durable)
        try:
            measured = bench_store(
                store,
                state=state_of_size(1024),
                repeats=repeats,
                target_s=target_s,
                what=("save", "load"),
                floor=floor_for,
            ).to_json()
        finally:
            store.close()
        row = {
            "backend": backend,
            "stored_runs": level,
            "populated": added,
            "populate_s": round(took, 3),
            "populate_us_per_run": round(took / added * 1e6, 1) if added else None,
            "sync_s": round(synced, 3),
        }
        row.update(measured)
        results.append(row)
    # versus the smallest store, from the medians and from the floor-normalised ratio
    first = results[0]
    for r in results:
        r["save_vs_first"] = round(r["save_us"]["median"] / first["save_us"]["median"], 3)
        if r.get("save_over_floor") and first.get("save_over_floor"):
            r["save_over_floor_vs_first"] = round(
                r["save_over_floor"]["median"] / first["save_over_floor"]["median"], 3
            )
    return results


def main() -> None:
    levels_arg = None
    if "--levels" in sys.argv:
        at = sys.argv.index("--levels")
        levels_arg = sys.argv[at + 1]
        del sys.argv[at : at + 2]
    args = parse_args(__doc__ or "")
    repeats, target_s = settings(args, full=(7, 0.3), quick=(3, 0.15))
    if levels_arg:
        levels = [int(x) for x in levels_arg.split(",")]
    else:
        levels = [1, 1_000, 10_000] if args.quick else [1, 1_000, 100_000]
    state = {"payload": state_of_size(1024)} | {f"k{i}": i for i in range(STEPS)}
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    with scratch("scale") as base:
        machine = machine_info(str(base))
        backends = [
            ("file", f"file://{base}/runs?durability=none", f"file://{base}/runs"),
            (
                "sqlite",
                f"sqlite:///{base}/runs.db?synchronous=normal",
                f"sqlite:///{base}/runs.db",
            ),
        ]
        for backend, fast, durable in backends:
            results += measure_levels(
                args,
                backend,
                functools.partial(populate, fast, state=state),
                durable,
                levels,
                repeats,
                target_s,
            )
        if args.no_sql:
            skipped.append("postgresql, mysql skipped: --no-sql")
        else:
            for kind in SQL_KINDS:
                with sql_config(kind, "scale") as (config, why):
                    if config is None:
                        skipped.append(f"{kind} skipped: {why}")
                        progress(args, skipped[-1])
                        continue
                    results += measure_levels(
                        args,
                        kind,
                        functools.partial(populate_sql, kind, config, state=state),
                        config,
                        levels,
                        repeats,
                        target_s,
                    )
    rows = [
        [
            r["backend"],
            f"{r['stored_runs']:,}",
            f"{r['populate_s']:.2f} s ({r['populate_us_per_run'] or 0:.0f} us/run)",
            fig(r["save_us"]),
            fig(r["floor_us"]),
            fig(r["save_over_floor"], "x"),
            f"{r['save_vs_first']:.2f}x",
            f"{r.get('save_over_floor_vs_first', 0):.2f}x",
            fig(r["load_us"]),
        ]
        for r in results
    ]
    text = "\n".join(
        [
            f"Figure 3: durable save cost vs runs already stored, {repeats} repeats, "
            "microseconds, median [min-max]",
            "",
            table(
                [
                    "backend",
                    "stored runs",
                    "populate (weak durability)",
                    "save",
                    "floor",
                    "save/floor",
                    "save vs 1 run",
                    "(save/floor) vs 1 run",
                    "load",
                ],
                rows,
            ),
            "",
            "populate: file/sqlite through the store's save at weak durability; "
            f"postgresql/mysql bulk executemany through the driver, {SQL_BATCH:,} rows per "
            "commit.",
            *skipped,
        ]
    )
    emit(
        args,
        {
            "figure": "scale",
            "machine": machine,
            "repeats": repeats,
            "results": results,
            "skipped": skipped,
        },
        text,
    )


if __name__ == "__main__":
    main()
