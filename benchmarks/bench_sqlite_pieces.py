"""The SQLite pieces table's two layouts: CPU per piece insert, rowid against WITHOUT ROWID.

    .venv/bin/python benchmarks/bench_sqlite_pieces.py [--sizes 2100,130000] [--n 200]
        [--rounds 5] [--json]

Releases before issue 36 made ``stepstone_pieces`` a ``WITHOUT ROWID`` table; new
databases make it a rowid table (``stores/_sql/pieces.py``). Each round inserts ``n``
pieces of each size into a fresh database of each layout, one ``BEGIN IMMEDIATE`` ...
``COMMIT`` per piece as a save does (WAL, ``synchronous=off``, so the figure is CPU and
not the disk), and takes ``time.process_time`` per insert; the layouts alternate within
a round, and the figure is the median over rounds of the per-round ratio
rowid / WITHOUT ROWID. Also printed: WAL bytes per insert (``wal_autocheckpoint=0``).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from typing import Any

from _common import emit, table

DDL = (
    "CREATE TABLE stepstone_pieces (run_id TEXT NOT NULL, piece_key TEXT NOT NULL, "
    "gen INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (run_id, piece_key))"
)


def _inserts(directory: str, without_rowid: bool, size: int, n: int) -> tuple[float, float]:
    """(CPU seconds per insert, WAL bytes per insert) on a fresh database."""
    path = os.path.join(directory, f"p-{without_rowid}-{size}-{time.monotonic_ns()}.db")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute(DDL + (" WITHOUT ROWID" if without_rowid else ""))
        blob = os.urandom(size)
        wal_before = os.path.getsize(path + "-wal")
        began = time.process_time()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO stepstone_pieces VALUES (?, ?, ?, ?)",
                ("run", f"6b16d28880be8b2e:{i}.2ad6350db503.0", i, blob),
            )
            conn.execute("COMMIT")
        cpu = (time.process_time() - began) / n
        return cpu, (os.path.getsize(path + "-wal") - wal_before) / n
    finally:
        conn.close()


def measure(sizes: list[int], n: int, rounds: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as directory:
        for size in sizes:
            ratios, rowid, without, wal = [], [], [], {}
            for r in range(rounds):
                order = [False, True] if r % 2 else [True, False]
                got = {w: _inserts(directory, w, size, n) for w in order}
                without.append(got[True][0])
                rowid.append(got[False][0])
                ratios.append(got[False][0] / got[True][0])
                wal = {"without_rowid": got[True][1], "rowid": got[False][1]}
            found[str(size)] = {
                "without_rowid_us": statistics.median(without) * 1e6,
                "rowid_us": statistics.median(rowid) * 1e6,
                "ratio": statistics.median(ratios),
                "wal_bytes": wal,
            }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2100,130000")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = measure([int(s) for s in args.sizes.split(",")], args.n, args.rounds)
    rows = [
        [
            f"{int(size):,} B",
            f"{f['without_rowid_us']:.0f}",
            f"{f['rowid_us']:.0f}",
            f"{f['ratio']:.2f}x",
            f"{f['wal_bytes']['without_rowid']:,.0f} / {f['wal_bytes']['rowid']:,.0f}",
        ]
        for size, f in found.items()
    ]
    header = ["piece", "WITHOUT ROWID µs", "rowid µs", "rowid / WITHOUT ROWID", "WAL bytes"]
    emit(args, found, table(header, rows))


if __name__ == "__main__":
    main()
