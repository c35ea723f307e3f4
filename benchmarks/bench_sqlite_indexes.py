"""What a save writes into SQLite's indexes (issue 36: bytes and instructions).

    python benchmarks/bench_sqlite_indexes.py [--saves 200] [--rows 1000] [--callgrind]
        [--json] [--plans]

Every save changes ``updated_at``. A database of the earlier layout (``WHOLE``: three
indexes on the whole table, (status, due_at), (status, updated_at) and (updated_at))
rewrites index pages with every save; a new database's indexes are partial
(``stores/_sql_text.py``, the SQLite ``create`` statements, as the store makes them):
queued and waiting runs by ``due_at``, running runs by ``owner``, the others by (status,
updated_at), and a save that keeps status and owner runs ``update_same``, which does
not assign them. This measures, with the store's own statements (``synchronous=full``,
WAL), one run saved SAVES times beside ROWS finished runs, for a running run (a step of
``run``) and a finished one (the LangGraph saver's head record):

- **WAL bytes per save** (``wal_autocheckpoint=0``, the WAL's growth / SAVES): whole
  4 KiB pages, one per page the commit changed (each is written again into the
  database at the checkpoint);
- with ``--callgrind``, **instructions per save** ((count(2N) - count(N)) / N of the
  same loop under valgrind's callgrind; user space only, the fsync is kernel time).

``--plans`` prints how SQLite plans the store's claim queries under each layout.
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
#: The earlier layout's indexes, as its ``create`` made them.
WHOLE = [
    f"CREATE INDEX ix_{TABLE}_due ON {TABLE} (status, due_at)",
    f"CREATE INDEX ix_{TABLE}_status ON {TABLE} (status, updated_at)",
    f"CREATE INDEX ix_{TABLE}_updated_at ON {TABLE} (updated_at)",
]
LAYOUTS = ("whole", "partial")
KINDS = ("running", "done")
DOCUMENT = json.dumps({"state": {"text": "x" * 1000}})


def _create(db: sqlite3.Connection, layout: str) -> None:
    for statement in SQL["create"]:
        if layout == "partial" or not statement.startswith("CREATE INDEX"):
            db.execute(statement)
    if layout == "whole":
        for statement in WHOLE:
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


def saves(path: str, layout: str, count: int, rows: int, kind: str = "running") -> float:
    """Save one run of status ``kind`` ``count`` times; return the WAL bytes per save."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=wal")
    db.execute("PRAGMA synchronous=full")
    db.execute("PRAGMA wal_autocheckpoint=0")
    _create(db, layout)
    db.execute("BEGIN")
    for index in range(rows):
        db.execute(SQL["insert"], _row(f"done-{index}", "v", "done", 9, _stamp(index)))
    db.execute(SQL["insert"], _row("hot", "v0", kind, 0, _stamp(0)))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(path + "-wal")
    before = wal.stat().st_size if wal.exists() else 0
    # What the store runs: ``update_same`` once it has saved the run (status and owner
    # kept), on either layout (the earlier release ran ``update``, the same pages).
    statement = SQL["update_same"]
    for index in range(count):
        values = _row("hot", f"v{index + 1}", kind, index + 1, _stamp(index + 1))
        db.execute("BEGIN IMMEDIATE")
        changed = db.execute(statement, {**values, "run_key": "hot", "expected": f"v{index}"})
        assert changed.rowcount == 1, "the compare-and-swap missed: the benchmark is wrong"
        db.execute("COMMIT")
    grown = wal.stat().st_size - before
    db.close()
    return grown / count


def _instructions(layout: str, kind: str, count: int, rows: int) -> int:
    """Instructions of the whole child process doing ``count`` saves (callgrind)."""
    with tempfile.TemporaryDirectory() as directory:
        database = os.path.join(directory, "cg.db")
        child = ["--child", layout, kind, str(count), str(rows), database]
        return callgrind_count([__file__, *child])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plans", action="store_true", help="print the claim queries' plans")
    parser.add_argument("--child", nargs=5, metavar=("LAYOUT", "KIND", "N", "ROWS", "PATH"))
    args = parser.parse_args()
    if args.child:
        layout, kind, count, rows, path = args.child
        saves(path, layout, int(count), int(rows), kind)
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
    for kind in KINDS:
        for layout in LAYOUTS:
            with tempfile.TemporaryDirectory() as directory:
                path = os.path.join(directory, "b.db")
                per_save = saves(path, layout, args.saves, args.rows, kind)
            row = figures[f"{kind} {layout}"] = {"wal_bytes_per_save": per_save}
            if args.callgrind:
                first = _instructions(layout, kind, args.saves, args.rows)
                second = _instructions(layout, kind, 2 * args.saves, args.rows)
                row["instructions_per_save"] = (second - first) / args.saves
    if args.json:
        print(json.dumps({"figure": "sqlite-indexes", "saves": args.saves, **figures}))
        return
    print(f"one run saved {args.saves} times beside {args.rows} finished runs:")
    for name, row in figures.items():
        text = f"  {name:16} WAL bytes per save {row['wal_bytes_per_save']:8.0f}"
        if "instructions_per_save" in row:
            text += f"   instructions per save {row['instructions_per_save']:9,.0f}"
        print(text)


if __name__ == "__main__":
    main()
