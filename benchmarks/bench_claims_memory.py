"""Instructions per ``MemoryStore.claimable`` call against the number of runs stored.

    python benchmarks/bench_claims_memory.py [--levels 1000,10000,100000] [--n 20]
        [--scan-up-to 10000] [--json]

A memory store holds LEVEL runs, 100 of them due (queued) and the rest finished; each
measured process then makes N (and 2N) ``claimable(now, 100)`` calls after a warm-up,
under ``valgrind --tool=callgrind``; (count(2N) - count(N)) / N is one call, filling the
store and start-up cancelling out. ``index`` is the store's own ``claimable`` (the
(status, due_at) index); ``scan`` is ``Store.claimable``, the default that reads every
run (what the memory store did before it had an index), measured up to
``--scan-up-to`` runs only: at 100,000 it costs seconds per call under callgrind. A
flat ``index`` row is the target (issue 20). Needs valgrind.

``--child MODE LEVEL N`` is the measured process itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
from datetime import timedelta
from typing import Any

from _common import callgrind_count

from stepstone import Store
from stepstone._checkpoint import Checkpoint, utcnow
from stepstone.stores.memory import MemoryStore

DUE = 100
WARMUP = 3


def filled(level: int) -> MemoryStore:
    """A memory store with ``level`` runs: ``DUE`` queued, the rest done."""
    store = MemoryStore()
    for i in range(level):
        if i % max(1, level // DUE) == 0 and i // max(1, level // DUE) < DUE:
            cp = Checkpoint(f"queued-{i}", total_steps=3, queued=True)
        else:
            cp = Checkpoint(f"done-{i}", step=2, total_steps=3)
        store.save(cp)
    return store


def child(mode: str, level: int, n: int) -> None:
    """Make WARMUP + n claims of ``mode`` on a store of ``level`` runs."""
    store = filled(level)
    now = utcnow() + timedelta(seconds=1)
    claim: Any = store.claimable if mode == "index" else (lambda *a: Store.claimable(store, *a))
    for _ in range(WARMUP + n):
        found = claim(now, 100)
        assert len(found) == min(DUE, level), len(found)


def _count(mode: str, level: int, n: int) -> int:
    return callgrind_count([__file__, "--child", mode, str(level), str(n)])


def per_call(mode: str, level: int, n: int) -> int:
    """Instructions per claimable call: (count(2N) - count(N)) / N."""
    return (_count(mode, level, 2 * n) - _count(mode, level, n)) // n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1000,10000,100000")
    parser.add_argument("--n", type=int, default=20, help="claims in the shorter process")
    parser.add_argument("--scan-up-to", type=int, default=10000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "LEVEL", "N"))
    args = parser.parse_args()
    if args.child:
        mode, level, n = args.child
        child(mode, int(level), int(n))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (apt-get install valgrind)")
    rows: list[dict[str, Any]] = []
    for level in (int(s) for s in args.levels.split(",")):
        row: dict[str, Any] = {"runs": level, "index": per_call("index", level, args.n)}
        if level <= args.scan_up_to:
            row["scan"] = per_call("scan", level, max(2, args.n // 10))
        rows.append(row)
        if not args.json:
            scan = f"{row['scan']:,}" if "scan" in row else "-"
            print(
                f"{level:7,} runs ({DUE} due): index {row['index']:9,}  scan {scan:>12} "
                "instructions per claimable(now, 100)",
                flush=True,
            )
    if args.json:
        print(json.dumps({"figure": "claims-memory-callgrind", "rows": rows}))


if __name__ == "__main__":
    main()
