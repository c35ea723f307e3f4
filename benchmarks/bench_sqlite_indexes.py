"""What a running run's save writes into SQLite's indexes (issue 36: bytes and instructions).

    python benchmarks/bench_sqlite_indexes.py [--saves 200] [--rows 1000] [--callgrind]
        [--json]

Every save changes ``updated_at``, and today's table (``stores/_sql_text.py``, the
SQLite ``create`` statements, as the store makes it) has three indexes holding
``updated_at`` or the status: each save of a running run rewrites index pages as well
as the row's. This measures, with the store's own DDL and its own compare-and-swap
``UPDATE`` (its ``update`` statement, ``synchronous=full``, WAL), one running run saved
SAVES times beside ROWS finished runs:

- **WAL bytes per save** (``wal_autocheckpoint=0``, the WAL's growth / SAVES): whole
  4 KiB pages, one per page the commit changed;
- with ``--callgrind``, **instructions per save** ((count(2N) - count(N)) / N of the
  same loop under valgrind's callgrind; user space only, the fsync is kernel time).

Layouts: ``today`` (the shipped DDL) and ``at rest`` (a candidate for the next schema,
``AT_REST``: indexes partial on the statuses the claim queries name, and the running
rows by id, so that a running run's save enters none). ``--plans`` prints how SQLite
plans the store's claim queries under each layout.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from _common import callgrind_count

from stepstone.stores._sql_text import STATEMENTS

SQL = STATEMENTS["sqlite"]
TABLE = "stepstone_checkpoints"
#: The candidate: each claim query's index made partial on the status it names, so a
#: running run's save (status unchanged, ``due_at`` and ``updated_at`` changed) enters
#: none of them; the running rows found by their id (a save does not change it). With
#: it the three claim queries stay indexed (``EXPLAIN QUERY PLAN``: queued and waiting
#: search their index by ``due_at``, running scans its index and sorts the few rows);
#: the listing pages (``ORDER BY updated_at``, any status) would not, not yet planned.
AT_REST = [
    f"CREATE INDEX ix_queued ON {TABLE} (due_at) WHERE status = 'queued'",
    f"CREATE INDEX ix_waiting ON {TABLE} (due_at) WHERE status = 'waiting'",
    f"CREATE INDEX ix_running ON {TABLE} (run_id) WHERE status = 'running'",
    f"CREATE INDEX ix_status ON {TABLE} (status, updated_at) WHERE status != 'running'",
    f"CREATE INDEX ix_updated ON {TABLE} (updated_at) WHERE status != 'running'",
]
LAYOUTS = ("today", "at rest")
DOCUMENT = json.dumps({"state": {"text": "x" * 1000}})


def _create(db: sqlite3.Connection, layout: str) -> None:
    for statement in SQL["create"]:
        if layout == "today" or not statement.startswith("CREATE INDEX"):
            db.execute(statement)
    if layout == "at rest":
        for statement in AT_REST:
            db.execute(statement)


def _row(run_id: str, version: str, status: str, step: int, stamp: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "version": version,
        "status": status,
        "step": step,
        "total_steps": 1_000_000,
        "created_at": "2026-12-06T00:00:00.000000+00:00",
        "updated_at": stamp,
        "due_at": None,
        "owner": "worker:bench" if status == "running" else None,
        "document": DOCUMENT if status == "running" else "{}",
    }


def _stamp(index: int) -> str:
    return (
        f"2026-12-06T{index // 3600 % 24:02d}:{index // 60 % 60:02d}:{index % 60:02d}.000000+00:00"
    )


def saves(path: str, layout: str, count: int, rows: int) -> float:
    """Save one running run ``count`` times; return the WAL bytes per save."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=wal")
    db.execute("PRAGMA synchronous=full")
    db.execute("PRAGMA wal_autocheckpoint=0")
    _create(db, layout)
    db.execute("BEGIN")
    for index in range(rows):
        db.execute(SQL["insert"], _row(f"done-{index}", "v", "done", 9, _stamp(index)))
    db.execute(SQL["insert"], _row("hot", "v0", "running", 0, _stamp(0)))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(path + "-wal")
    before = wal.stat().st_size if wal.exists() else 0
    for index in range(count):
        values = _row("hot", f"v{index + 1}", "running", index + 1, _stamp(index + 1))
        db.execute("BEGIN IMMEDIATE")
        changed = db.execute(SQL["update"], {**values, "run_key": "hot", "expected": f"v{index}"})
        assert changed.rowcount == 1, "the compare-and-swap missed: the benchmark is wrong"
        db.execute("COMMIT")
    grown = wal.stat().st_size - before
    db.close()
    return grown / count


def _instructions(layout: str, count: int, rows: int) -> int:
    """Instructions of the whole child process doing ``count`` saves (callgrind)."""
    with tempfile.TemporaryDirectory() as directory:
        database = os.path.join(directory, "cg.db")
        return callgrind_count([__file__, "--child", layout, str(count), str(rows), database])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plans", action="store_true", help="print the claim queries' plans")
    parser.add_argument("--child", nargs=4, metavar=("LAYOUT", "N", "ROWS", "PATH"))
    args = parser.parse_args()
    if args.child:
        layout, count, rows, path = args.child
        saves(path, layout, int(count), int(rows))
        return
    if args.plans:
        for layout in LAYOUTS:
            db = sqlite3.connect(":memory:")
            _create(db, layout)
            for full, _ids in SQL["claims"]:
                status = full.split("status = '")[1].split("'")[0]
                bind = {"now": "", "limit": 100, "skip": 0}
                plan = db.execute("EXPLAIN QUERY PLAN " + full, bind).fetchall()
                print(f"{layout:8} claims {status:8}: " + "; ".join(row[3] for row in plan))
            db.close()
        return
    figures: dict[str, dict[str, float]] = {}
    for layout in LAYOUTS:
        with tempfile.TemporaryDirectory() as directory:
            per_save = saves(os.path.join(directory, "b.db"), layout, args.saves, args.rows)
        figures[layout] = {"wal_bytes_per_save": per_save}
        if args.callgrind:
            first = _instructions(layout, args.saves, args.rows)
            second = _instructions(layout, 2 * args.saves, args.rows)
            figures[layout]["instructions_per_save"] = (second - first) / args.saves
    if args.json:
        print(json.dumps({"figure": "sqlite-indexes", "saves": args.saves, **figures}))
        return
    print(f"one running run saved {args.saves} times beside {args.rows} finished runs:")
    for layout, row in figures.items():
        text = f"  {layout:8} WAL bytes per save {row['wal_bytes_per_save']:8.0f}"
        if "instructions_per_save" in row:
            text += f"   instructions per save {row['instructions_per_save']:9,.0f}"
        print(text)


if __name__ == "__main__":
    main()
