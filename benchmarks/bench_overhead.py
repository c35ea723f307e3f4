"""Figures 1 and 2: per-step overhead, save and load cost per backend, against the floor.

Per-step overhead = (time of a 10-step ``run`` with a ~1 KB state - time of the same 10
plain function calls) / 10. Every backend at its default durability and at its
documented weaker setting (file ``?durability=none``, sqlite ``?synchronous=normal``);
the floor of each (see ``stepstone._bench``) is measured interleaved with it, and the
ratios are taken per repeat. PostgreSQL and MySQL/MariaDB (a fresh table on the loopback
servers, dropped afterwards; ``--no-sql`` skips them) at the server's durability, against
a raw-driver floor: one autocommit upsert of the same JSON text. Cosmos with ``--cosmos``
when an emulator can be started.

    .venv/bin/python benchmarks/bench_overhead.py [--quick] [--json] [--cosmos] [--no-sql]
"""

from __future__ import annotations

from typing import Any

from _common import (
    SQL_KINDS,
    cosmos_config,
    emit,
    fig,
    floor_for,
    parse_args,
    progress,
    scratch,
    settings,
    sql_config,
    table,
)

from stepstone import open_store
from stepstone._bench import bench_store, machine_info


def configs(base: str) -> list[tuple[str, str, str]]:
    """(backend, durability, config string) for every local configuration measured."""
    return [
        ("memory", "none (process memory)", "memory://"),
        ("file", "full (default)", f"file://{base}/file-full"),
        ("file", "none", f"file://{base}/file-none?durability=none"),
        ("sqlite", "full (default)", f"sqlite:///{base}/full.db"),
        ("sqlite", "normal", f"sqlite:///{base}/normal.db?synchronous=normal"),
    ]


def measure(config: str, repeats: int, target_s: float) -> dict[str, Any]:
    store = open_store(config)
    try:
        return bench_store(store, repeats=repeats, target_s=target_s, floor=floor_for).to_json()
    finally:
        store.close()


def main() -> None:
    args = parse_args(__doc__ or "", extra=("cosmos",))
    repeats, target_s = settings(args, full=(7, 0.3), quick=(3, 0.1))
    results: list[dict[str, Any]] = []
    with scratch("overhead") as base:
        machine = machine_info(str(base))
        for backend, durability, config in configs(str(base)):
            progress(args, f"overhead: {backend} durability={durability} ...")
            row = {"backend": backend, "durability": durability}
            row.update(measure(config, repeats, target_s))
            results.append(row)
    skipped: list[str] = []
    if args.no_sql:
        skipped.append("postgresql, mysql skipped: --no-sql")
    else:
        for kind in SQL_KINDS:
            with sql_config(kind, "overhead") as (server, why):
                if server is None:
                    skipped.append(f"{kind} skipped: {why}")
                    progress(args, skipped[-1])
                    continue
                progress(args, f"overhead: {kind} ({why}) ...")
                row = {"backend": kind, "durability": "server (default)", "via": why}
                row.update(measure(server, repeats, target_s))
                results.append(row)
    if getattr(args, "cosmos", False):
        with cosmos_config() as (emulator, why):
            if emulator is None:
                skipped.append(f"cosmos skipped: {why}")
                progress(args, skipped[-1])
            else:
                progress(args, f"overhead: cosmos via {why} ...")
                row = {"backend": "cosmos", "durability": "service (default)", "via": why}
                row.update(measure(emulator, max(3, repeats // 2), target_s))
                results.append(row)

    rows = [
        [
            r["backend"],
            r["durability"],
            fig(r["overhead_per_step_us"]),
            fig(r["floor_us"]),
            fig(r["overhead_over_floor"], "x"),
            fig(r["save_us"]),
            fig(r["save_over_floor"], "x"),
            fig(r["load_us"]),
        ]
        for r in results
    ]
    text = "\n".join(
        [
            f"Figures 1+2: per-step overhead of run() and save/load cost, {repeats} repeats, "
            f"microseconds, median [min-max]; {machine['nproc']} CPUs, Python {machine['python']}, "
            f"{machine.get('disk', {}).get('fstype')} disk",
            "",
            table(
                [
                    "backend",
                    "durability",
                    "per-step overhead",
                    "floor",
                    "overhead/floor",
                    "save",
                    "save/floor",
                    "load",
                ],
                rows,
            ),
            "",
            "floor: file = write+fsync+rename+fsync(dir) of the same bytes in the same directory "
            "(no fsyncs for durability=none); sqlite = raw sqlite3 upsert+commit, WAL, same "
            "synchronous level, separate db file beside the store's; postgresql/mysql = one "
            "autocommit upsert of the same JSON text through psycopg/pymysql, own table, "
            "separate connection.",
            *skipped,
        ]
    )
    emit(
        args,
        {
            "figure": "overhead",
            "machine": machine,
            "repeats": repeats,
            "results": results,
            "skipped": skipped,
        },
        text,
    )


if __name__ == "__main__":
    main()
