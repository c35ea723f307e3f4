"""SQLite's index layouts: a running run's save enters no index; both layouts read alike.

A new database's indexes are partial (``tools/sqlgen.py``): queued and waiting runs by
``due_at``, running runs by ``owner``, the runs at rest by (status, updated_at). The save
of a running run changes its ``updated_at`` (and, unleased, its ``due_at``) and nothing
else indexed, so it writes no index page: before, three index pages went into the WAL
and again into the database with every step (issue 36). A database of the earlier
layout (three indexes on the whole table) is kept as it is and read by the same
statements: ``fixtures/whole_indexes.sql`` is such a store, written by that release.
"""

from __future__ import annotations

import sqlite3
import struct
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stepstone import Checkpoint, Store
from stepstone._checkpoint import evolve
from stepstone._runinfo import PageAsk
from stepstone._status import STATUSES, RunStatus
from stepstone.stores._sql.pages import count_query, page_query
from stepstone.stores.sqlite import SQLiteStore

FIXTURE = Path(__file__).with_name("fixtures") / "whole_indexes.sql"
TABLE = "stepstone_checkpoints"
PARTIAL = {
    f"ix_{TABLE}_queued": "(due_at) WHERE status = 'queued'",
    f"ix_{TABLE}_waiting": "(due_at) WHERE status = 'waiting'",
    f"ix_{TABLE}_running": "(owner) WHERE status = 'running'",
    f"ix_{TABLE}_at_rest": "(status, updated_at) WHERE status != 'running'",
}
WHOLE = {f"ix_{TABLE}_due", f"ix_{TABLE}_status", f"ix_{TABLE}_updated_at"}
LAYOUTS = ("partial", "whole")


def _indexes(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
            "AND sql IS NOT NULL",
            (TABLE,),
        ).fetchall()
    finally:
        conn.close()
    return dict(rows)


def _from_fixture(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(FIXTURE.read_text(encoding="utf-8"))
    finally:
        conn.close()


def _open(tmp_path: Path, layout: str) -> SQLiteStore:
    """The fixture's runs in a store of ``layout``: the fixture itself, or its rows copied
    into a database the store creates today."""
    path = tmp_path / f"{layout}.db"
    if layout == "whole":
        _from_fixture(path)
        return SQLiteStore(path)
    SQLiteStore(path).close()
    old = tmp_path / "source.db"
    _from_fixture(old)
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute("ATTACH DATABASE ? AS old", (str(old),))
            for table in (TABLE, "stepstone_pieces"):
                conn.execute(f"INSERT INTO {table} SELECT * FROM old.{table}")
        conn.execute("DETACH DATABASE old")
    finally:
        conn.close()
    return SQLiteStore(path)


@pytest.fixture(params=LAYOUTS)
def layout_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    store = _open(tmp_path, request.param)
    try:
        yield store
    finally:
        store.close()


def test_a_new_database_indexes_each_status_apart(tmp_path: Path) -> None:
    """A new database has the four partial indexes and none of the whole-table ones."""
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    found = _indexes(path)
    assert set(found) == set(PARTIAL), found
    for name, shape in PARTIAL.items():
        assert found[name].endswith(f"ON {TABLE} {shape}"), found[name]


def test_the_fixture_is_the_earlier_layout(tmp_path: Path) -> None:
    """The fixture's database has the three whole-table indexes, and the store keeps them."""
    path = tmp_path / "old.db"
    _from_fixture(path)
    with SQLiteStore(path) as store:
        store.save(Checkpoint("new", state={}))
    assert set(_indexes(path)) == WHOLE


def _wal_pages(wal: Path, start: int, page_size: int) -> set[int]:
    """The page numbers of the WAL frames from byte ``start`` on (a frame: a 24-byte
    header whose first four bytes are the page number, then the page)."""
    data = wal.read_bytes()
    pages = set()
    for offset in range(max(start, 32), len(data) - 24, 24 + page_size):
        pages.add(struct.unpack(">I", data[offset : offset + 4])[0])
    return pages


def _index_pages(store: SQLiteStore) -> dict[str, set[int]]:
    rows = store._conn().execute(
        "SELECT name, pageno FROM dbstat WHERE name IN "
        "(SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?)",
        (TABLE,),
    )
    found: dict[str, set[int]] = {}
    for name, page in rows:
        found.setdefault(name, set()).add(page)
    return found


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_running_runs_save_writes_no_index_page(tmp_path: Path, layout: str) -> None:
    """The frames a running run's save adds to the WAL, after this store's own save of it:
    on the partial layout no page of any index, on the earlier one the three indexes'
    pages (which shows that the probe sees an index page when one is written)."""
    store = _open(tmp_path, layout)
    try:
        run = store.load("a-running")
        assert run is not None and run.status == "running"
        conn = store._conn()
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        indexes = _index_pages(store)
        keys = indexes.pop(f"sqlite_autoindex_{TABLE}_1")  # the run_id key: never changes
        assert keys and len(indexes) == (4 if layout == "partial" else 3), indexes
        # The first save after a load sets every column: this store has not written the
        # run, so it does not know the row's status and owner. The next ones do.
        run = store.save(evolve(run, state={"n": 2}))
        wal = Path(f"{store.path}-wal")
        before = wal.stat().st_size
        run = store.save(evolve(run, state={"n": 3}))
        written = _wal_pages(wal, before, page_size)
    finally:
        store.close()
    assert written, "the save wrote no frame to the WAL"
    touched = {name for name, pages in indexes.items() if pages & written}
    if layout == "partial":
        assert touched == set(), f"a running run's save wrote pages of {sorted(touched)}"
    else:
        assert touched == WHOLE, touched


def _plan(store: SQLiteStore, sql: str, params: dict[str, object]) -> str:
    rows = store._conn().execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
    return "; ".join(str(row[-1]) for row in rows)


def test_every_listing_and_claim_query_reads_an_index(tmp_path: Path) -> None:
    """On the partial layout each listing page (any status, with and without a cursor),
    the counts and each claim query search or scan an index, never the table."""
    with _open(tmp_path, "partial") as store:
        queries: list[tuple[str, dict[str, object]]] = []
        after = (datetime(2030, 1, 1, tzinfo=UTC), "r")
        for status in (None, *STATUSES):
            for cursor in (None, after):
                ask = PageAsk(status, "", cursor, 10)
                queries.append(page_query(store._sql.info, "sqlite", store._db_time, *ask))
                if cursor is not None and status != "running":
                    # A later page starts its range at the cursor: page n does not read
                    # the n - 1 pages before it.
                    plan = _plan(store, *queries[-1])
                    assert "(status=? AND updated_at<?)" in plan, plan
        counted = count_query(store._sql.info, "sqlite", "")
        assert counted is not None
        queries.append(counted)
        claims = {"now": "2030", "limit": 10, "skip": 0}
        queries += [(sql, claims) for pair in store._sql.claims for sql in pair]
        for sql, params in queries:
            plan = _plan(store, sql, params)
            assert "USING" in plan, plan
            bare = [part for part in plan.split("; ") if part == f"SCAN {TABLE}"]
            assert not bare, f"{sql}: {plan}"
        for (sql, _ids), kind in zip(
            store._sql.claims, ("running", "queued", "waiting"), strict=True
        ):
            assert f"ix_{TABLE}_{kind}" in _plan(store, sql, claims), sql
        # claim_ready's three branches: due waiting and queued runs searched by due_at,
        # the running runs nobody owns (given back) searched by owner.
        ready: dict[str, object] = {"owner": "w", "token": "t", "due_now": "", "stamp": ""}
        ready |= {"due_running": "", "fields": "", "served": "[]", "exclude": "[]"}
        ready |= {"limit": 5, "now": "2030"}
        plan = _plan(store, store._sql.claim_ready, ready)
        for searched in ("waiting (due_at<?)", "running (owner=?)", "queued (due_at<?)"):
            assert f"SEARCH {TABLE} USING INDEX ix_{TABLE}_{searched}" in plan, plan


def _pages(store: Store, status: str | None, size: int) -> list[str]:
    """Every run of the listing of ``status``, paged ``size`` at a time with the cursor."""
    seen: list[str] = []
    after = None
    while True:
        page = store.list_page(status, after=after, limit=size)  # type: ignore[arg-type]
        seen += [info.run_id for info in page]
        if len(page) < size:
            return seen
        after = (page[-1].updated_at, page[-1].run_id)


@pytest.mark.parametrize("size", [1, 2, 50])
def test_the_listing_is_the_scans_on_either_layout(layout_store: SQLiteStore, size: int) -> None:
    """Pages of every status (and of a status no run has), paged by the cursor, and the
    counts are what a scan of ``list_info`` gives, on either layout."""
    infos = list(layout_store.list_info())
    assert len(infos) == 9 and {info.status for info in infos} == set(STATUSES) - set()
    for status in (None, *STATUSES, "bogus"):
        expected = [
            info.run_id
            for info in Store._list_page(layout_store, PageAsk(status, "", None, 100))  # type: ignore[arg-type]
        ]
        assert _pages(layout_store, status, size) == expected, status
    by_scan = Counter(info.status for info in infos)
    assert layout_store.count_by_status() == {status: by_scan[status] for status in STATUSES}
    assert layout_store.count_by_status("a-") == {
        status: int(status == "running") * 2 for status in STATUSES
    }


def test_claims_and_loads_agree_on_both_layouts(tmp_path: Path) -> None:
    """The fixture's runs claim in the same order and load the same on either layout."""
    now = datetime(2031, 1, 1, tzinfo=UTC)
    found = []
    for layout in LAYOUTS:
        with _open(tmp_path, layout) as store:
            claimable = [info.run_id for info in store.claimable(now)]
            loaded = {}
            for info in store.list_info():
                run = store.load(info.run_id)
                assert run is not None
                loaded[info.run_id] = (run.version, run.status, run.state)
            found.append((claimable, loaded))
    assert found[0] == found[1]
    claimable, loaded = found[0]
    assert set(claimable) == {"a-running", "a-owned", "e-pieces", "b-queued", "b-waiting"}
    assert loaded["e-pieces"][2] == {"text": "x" * 20_000}


def _columns(store: SQLiteStore, run_id: str) -> tuple[object, ...]:
    row = (
        store._conn()
        .execute(
            f"SELECT version, status, owner FROM {TABLE} WHERE run_id = ?",
            (run_id,),
        )
        .fetchone()
    )
    return tuple(row)


def test_status_and_owner_columns_follow_every_change(tmp_path: Path) -> None:
    """Saves that keep status and owner (which skip assigning them) and saves that change
    either (which assign them) leave the row's columns as the checkpoint says, and the
    listing and counts with them."""
    with SQLiteStore(tmp_path / "r.db") as store:
        run = store.save(Checkpoint("r", state={}, step_names=(), total_steps=3))
        changes = [
            {"state": {"n": 1}},  # running, unowned: same
            {"owner": "worker-1"},  # owner changes
            {"state": {"n": 2}},  # same
            {"waiting_for": "signal go"},  # status changes
            {"waiting_for": None, "owner": None},  # both change
            {"step": 0, "step_names": ("a",)},  # same
            {"step": 2, "step_names": ("a", "b", "c")},  # done
            {"state": {"n": 3}},  # done, same
        ]
        for change in changes:
            run = store.save(evolve(run, **change))  # type: ignore[arg-type]
            assert _columns(store, "r") == (run.version, run.status, run.owner), change
            [info] = store.list_page(run.status)
            assert (info.run_id, info.version) == ("r", run.version)
            assert store.count_by_status()[run.status] == 1
        assert run.status == "done"


def test_a_row_changed_behind_the_stores_back_is_a_lost_swap(tmp_path: Path) -> None:
    """A save that would leave status and owner unassigned compares them: a row whose status
    someone changed by hand (its version kept) makes the save a ``ConflictError``, and the
    row stays as it was, never a document that disagrees with its columns."""
    from stepstone import ConflictError

    with SQLiteStore(tmp_path / "r.db") as store:
        run = store.save(Checkpoint("r", state={"n": 0}))
        conn = store._conn()
        with conn:
            conn.execute(f"UPDATE {TABLE} SET status = 'cancelled' WHERE run_id = 'r'")
        with pytest.raises(ConflictError):
            store.save(evolve(run, state={"n": 1}))
        assert _columns(store, "r") == (run.version, "cancelled", None)
        loaded = store.load("r")
        assert loaded is not None and loaded.state == {"n": 0}


EDGE_IDS = [
    "p",
    "p\U0010ffff",
    "p\U0010ffffz",
    "p\ud7ff",
    "p\ue000",
    "pz",
    "q",
    "\U0010ffff",
    "\U0010ffff\U0010ffff",
    "o\U0010ffff",
]


@pytest.mark.parametrize(
    "prefix", ["p", "p\U0010ffff", "p\ud7ff", "\U0010ffff", "o\U0010ffff", "pz", "r", "P"]
)
def test_a_prefix_finds_its_ids_by_the_keys_range(tmp_path: Path, prefix: str) -> None:
    """A prefix page and count (a range of the primary key, then the prefix compared) hold
    exactly the ids a scan finds, where the range's end is past U+10FFFF or a surrogate."""
    with SQLiteStore(tmp_path / "p.db") as store:
        for index, run_id in enumerate(EDGE_IDS):
            done = {"step": 0, "step_names": ("a",), "total_steps": 1} if index % 2 else {}
            store.save(Checkpoint(run_id, state={}, **done))  # type: ignore[arg-type]
        statuses: tuple[RunStatus | None, ...] = (None, "running", "done")
        for status in statuses:
            ask = PageAsk(status, prefix, None, 100)
            got = [info.run_id for info in store.list_page(status, prefix=prefix, limit=100)]
            assert got == [info.run_id for info in Store._list_page(store, ask)], status
        expected = Store.count_by_status(store, prefix)
        assert store.count_by_status(prefix) == expected
        assert sum(expected.values()) == sum(i.startswith(prefix) for i in EDGE_IDS)
        sql, params = page_query(store._sql.info, "sqlite", store._db_time, None, prefix, None, 9)
        assert "USING INDEX sqlite_autoindex" in _plan(store, sql, params), sql
