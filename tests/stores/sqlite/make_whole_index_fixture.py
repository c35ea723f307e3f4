"""Write ``fixtures/whole_indexes.sql``: a SQLite store of the layout before partial indexes.

    PYTHONPATH=<src of the release before> python tests/stores/sqlite/make_whole_index_fixture.py

Until 2026-12-07 a new SQLite database had three indexes on the whole table: (status,
due_at), (status, updated_at) and (updated_at). The fixture is that release's own store,
written by its own code (c24e83f..e82cfb0), dumped as SQL text: runs of every status, one
owned, one due later, one whose state is in pieces. ``test_index_layouts.py`` opens it
with today's code.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from stepstone import Checkpoint
from stepstone._checkpoint import Failure
from stepstone.stores.sqlite import SQLiteStore

OUT = Path(__file__).with_name("fixtures") / "whole_indexes.sql"
WAKE = datetime(2030, 1, 1, tzinfo=UTC)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "old.db"
        with SQLiteStore(path) as store:
            store.save(Checkpoint("a-running", state={"n": 1}))
            store.save(Checkpoint("a-owned", state={"n": 2}, owner="worker-1"))
            store.save(Checkpoint("b-queued", state={"n": 3}, queued=True))
            store.save(Checkpoint("b-waiting", state={}, waiting_for="timer", wake_at=WAKE))
            store.save(Checkpoint("c-signal", state={}, waiting_for="signal go"))
            store.save(Checkpoint("c-done", step=0, step_names=("a",), total_steps=1, state={}))
            failure = Failure(0, "a", "ValueError", "no", 1, WAKE)
            store.save(Checkpoint("d-failed", state={}, total_steps=1, failure=failure))
            store.save(Checkpoint("d-cancelled", state={}, cancelled=True))
            store.save(Checkpoint("e-pieces", state={"text": "x" * 20_000}))
        conn = sqlite3.connect(path)
        lines = list(conn.iterdump())
        conn.close()
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(lines)} statements)", file=sys.stderr)


if __name__ == "__main__":
    main()
