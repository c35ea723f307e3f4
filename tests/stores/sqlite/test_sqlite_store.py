"""SQLite-specific behaviour of SQLiteStore; the generic Store contract is tested elsewhere."""

from __future__ import annotations

import multiprocessing
import os
import re
import sqlite3
import stat
import sys
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    SCHEMA_VERSION,
    Checkpoint,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    StoreError,
    StoreUnavailable,
    _hooks,
    open_store,
)
from stepstone._checkpoint import DUE_NOW, Stored, evolve
from stepstone.stores._sql import TABLE_SCHEMA
from stepstone.stores.sqlite import SQLiteStore, schema_ddl

TOOLS = str(Path(__file__).resolve().parents[3] / "tools")
if TOOLS not in sys.path:  # the generator is repository tooling, outside the wheel
    sys.path.insert(0, TOOLS)

import sqlgen  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "stepstone.db")


@pytest.fixture
def store(db: str) -> Any:
    with SQLiteStore(db) as s:
        yield s


def _pragma(store: SQLiteStore, name: str) -> Any:
    return store._conn().execute(f"PRAGMA {name}").fetchone()[0]


# --- config ---------------------------------------------------------------------------


def test_relative_config_is_resolved_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite:///rel.db opens rel.db in the current working directory, as an absolute path."""
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///sub.db") as s:
        assert isinstance(s, SQLiteStore)
        assert s.path == str(tmp_path / "sub.db")
    assert (tmp_path / "sub.db").exists()


def test_absolute_config_and_options(tmp_path: Path) -> None:
    """sqlite:////abs.db with options sets the path, synchronous level and busy timeout."""
    path = tmp_path / "abs.db"
    with SQLiteStore.from_config(f"sqlite:///{path}?synchronous=normal&busy_timeout=1234") as s:
        assert s.path == str(path)
        assert s.synchronous == "normal"
        assert s.busy_timeout_ms == 1234


@pytest.mark.parametrize(
    "config",
    [
        "sqlite://",
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite://host/x.db",
        "sqlite://host:5432/x.db",
        "sqlite:x.db",
        "sqlite:///x.db?bogus=1",
        "sqlite:///x.db#frag",
    ],
)
def test_malformed_configs_are_refused_listing_the_forms(
    config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-memory, host parts, missing slashes and unknown options: ConfigError with the forms."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"sqlite:///relative/path\.db.*sqlite:////absolute"):
        open_store(config)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "query", ["synchronous=off", "synchronous=FULLY", "busy_timeout=abc", "busy_timeout=-5"]
)
def test_bad_option_values_are_refused(query: str, tmp_path: Path) -> None:
    """Unknown synchronous levels and non-numeric timeouts raise ConfigError and create nothing."""
    with pytest.raises(ConfigError):
        SQLiteStore.from_config(f"sqlite:///{tmp_path}/x.db?{query}")
    assert not (tmp_path / "x.db").exists()


def test_in_memory_message_points_to_memory_store() -> None:
    """Refusing an in-memory database tells the user to use memory:// instead."""
    with pytest.raises(ConfigError, match="memory://"):
        SQLiteStore.from_config("sqlite://")
    with pytest.raises(ConfigError, match="memory://"):
        SQLiteStore(":memory:")


@pytest.mark.parametrize("kwargs", [{"synchronous": "off"}, {"busy_timeout_ms": -1}])
def test_constructor_validates_its_arguments(kwargs: dict[str, Any], db: str) -> None:
    """The constructor refuses an unknown synchronous level and a negative busy timeout."""
    with pytest.raises(ConfigError):
        SQLiteStore(db, **kwargs)


# --- pragmas ----------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "number"), [("full", 2), ("normal", 1), ("extra", 3)])
def test_pragmas_are_applied_on_every_connection(db: str, level: str, number: int) -> None:
    """WAL, the chosen synchronous level and busy_timeout hold on each thread's connection."""
    with SQLiteStore.from_config(f"sqlite:///{db}?synchronous={level}&busy_timeout=4321") as s:
        seen: list[tuple[Any, ...]] = []

        def check() -> None:
            seen.append(
                (_pragma(s, "journal_mode"), _pragma(s, "synchronous"), _pragma(s, "busy_timeout"))
            )

        check()
        thread = threading.Thread(target=check)
        thread.start()
        thread.join()
        assert seen == [("wal", number, 4321)] * 2
        assert s._conn() is not None


def test_default_durability_is_full(db: str) -> None:
    """Without options a store commits with synchronous=FULL and a 30 s busy timeout."""
    with SQLiteStore(db) as s:
        assert (_pragma(s, "synchronous"), _pragma(s, "busy_timeout")) == (2, 30000)


# --- schema -----------------------------------------------------------------------------


def test_schema_is_created_on_first_use(db: str) -> None:
    """Opening a new file creates both tables, the indexes and the schema_version row."""
    SQLiteStore(db).close()
    with sqlite3.connect(db) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        version = conn.execute(
            "SELECT value FROM stepstone_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert {
        "stepstone_checkpoints",
        "stepstone_meta",
        "ix_stepstone_checkpoints_queued",
        "ix_stepstone_checkpoints_waiting",
        "ix_stepstone_checkpoints_running",
        "ix_stepstone_checkpoints_at_rest",
    } <= names
    assert version == (str(SCHEMA_VERSION),)


def test_schema_sql_file_matches_the_code() -> None:
    """backends/sqlite/schema.sql is exactly the DDL generated from the Table objects."""
    on_disk = (REPO / "backends" / "sqlite" / "schema.sql").read_text(encoding="utf-8")
    assert on_disk == schema_ddl(), "regenerate backends/sqlite/schema.sql from schema_ddl()"


def test_schema_ddl_creates_what_the_store_uses(tmp_path: Path) -> None:
    """The documented DDL, run by hand, gives a database the store opens and writes."""
    path = tmp_path / "manual.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(schema_ddl())
    with SQLiteStore(path) as s:
        s.save(Checkpoint("r", state={"a": 1}))
        assert s.load("r") is not None


def test_newer_schema_version_is_refused(db: str) -> None:
    """A database written by a newer stepstone is refused with advice to upgrade, unchanged."""
    SQLiteStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE stepstone_meta SET value = ? WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    conn.close()
    with pytest.raises(StoreError, match="upgrade stepstone") as info:
        SQLiteStore(db)
    assert db in str(info.value)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM stepstone_meta").fetchone() == (
            str(SCHEMA_VERSION + 1),
        )
    conn.close()


def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """Garbage bytes raise CorruptCheckpoint naming the file; its bytes and mtime stay."""
    path = tmp_path / "notes.db"
    garbage = bytes(range(256)) * 32
    path.write_bytes(garbage)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    with pytest.raises(CorruptCheckpoint, match=str(path)) as info:
        SQLiteStore(path)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert path.read_bytes() == garbage
    assert path.stat().st_mtime == 1_000_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def _open_and_save(path: str, name: str, barrier: Any) -> str:
    barrier.wait()
    try:
        with SQLiteStore(path) as s:
            s.save(Checkpoint(name, state={"by": name}))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        return f"{type(exc).__name__}: {exc}"
    return "ok"


@pytest.mark.process
def test_several_processes_can_create_a_new_file_at_once(tmp_path: Path) -> None:
    """Processes opening one new file together all succeed and see one schema."""
    path = str(tmp_path / "new.db")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            results = pool.starmap(_open_and_save, [(path, f"run-{i}", barrier) for i in range(4)])
    assert results == ["ok"] * 4
    with SQLiteStore(path) as s:
        assert sorted(s.list_runs()) == [f"run-{i}" for i in range(4)]


# --- saves ------------------------------------------------------------------------------


def _row(path: str, run_id: str) -> tuple[Any, ...] | None:
    conn = sqlite3.connect(path)
    try:
        row: tuple[Any, ...] | None = conn.execute(
            "SELECT version, step, updated_at, document FROM stepstone_checkpoints "
            "WHERE run_id = ?",
            (run_id,),
        ).fetchone()
    finally:
        conn.close()
    return row


def test_lost_compare_and_swap_stores_nothing_and_skips_the_commit(store: SQLiteStore) -> None:
    """A stale or first save over an existing row changes no byte and never reaches the hook."""
    first = store.save(Checkpoint("r", state={"n": 1}))
    store.save(Checkpoint("r", step=0, step_names=("a",), state={"n": 2}, version=first.version))
    before = _row(store.path, "r")
    points: list[str] = []
    _hooks.install(points.append)
    try:
        with pytest.raises(ConflictError):
            store.save(Checkpoint("r", state={"n": 3}, version=first.version))
        with pytest.raises(ConflictError):
            store.save(Checkpoint("r", state={"n": 4}))
    finally:
        _hooks.install(None)
    assert points == []
    assert _row(store.path, "r") == before


def test_failure_inside_the_transaction_rolls_back(store: SQLiteStore) -> None:
    """An error after the upsert executed but before commit leaves nothing stored."""
    saved = store.save(Checkpoint("r", state={"n": 1}))
    before = _row(store.path, "r")

    def boom(point: str) -> None:
        if point == "sqlite.in_transaction":
            raise RuntimeError("crash before commit")

    _hooks.install(boom)
    try:
        with pytest.raises(RuntimeError):
            store.save(Checkpoint("r", state={"n": 2}, version=saved.version))
    finally:
        _hooks.install(None)
    assert _row(store.path, "r") == before
    # The connection is usable again: no transaction was left open.
    again = store.save(Checkpoint("r", state={"n": 3}, version=saved.version))
    assert store.load("r") == again


def test_columns_mirror_the_document(store: SQLiteStore) -> None:
    """The indexed columns hold the checkpoint's status, step and times, as list_info reports."""
    saved = store.save(
        Checkpoint("r", step=1, step_names=("a", "b"), total_steps=2, state={"x": 1})
    )
    conn = sqlite3.connect(store.path)
    row = conn.execute(
        "SELECT status, step, total_steps, created_at, updated_at, version "
        "FROM stepstone_checkpoints"
    ).fetchone()
    conn.close()
    assert saved.created_at is not None and saved.updated_at is not None
    assert row == (
        "done",
        1,
        2,
        saved.created_at.isoformat(),
        saved.updated_at.isoformat(),
        saved.version,
    )


def test_list_info_reads_columns_not_documents(store: SQLiteStore) -> None:
    """list_info works from the indexed columns when a document is unreadable; load does not."""
    saved = store.save(Checkpoint("r", step=0, step_names=("a",), total_steps=3, state={}))
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("UPDATE stepstone_checkpoints SET document = 'garbage'")
    conn.close()
    [info] = list(store.list_info())
    assert (info.run_id, info.status, info.step, info.total_steps, info.updated_at) == (
        "r",
        "running",
        0,
        3,
        saved.updated_at,
    )
    with pytest.raises(CorruptCheckpoint, match=f"{store.path} run 'r'"):
        store.load("r")


def test_a_held_write_lock_becomes_store_unavailable(tmp_path: Path) -> None:
    """Another connection holding the write lock past busy_timeout makes save StoreUnavailable."""
    path = tmp_path / "locked.db"
    with SQLiteStore(path, busy_timeout_ms=50) as s:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailable, match=str(path)) as info:
                s.save(Checkpoint("r"))
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        finally:
            other.rollback()
            other.close()
        assert s.load("r") is None
        s.save(Checkpoint("r"))


def _race(path: str, run_id: str, rounds: int, barrier: Any) -> list[str]:
    outcomes: list[str] = []
    with SQLiteStore(path) as s:
        for _ in range(rounds):
            barrier.wait()
            current = s.load(run_id)
            barrier.wait()  # both loaded the same version
            assert current is not None
            try:
                s.save(
                    Checkpoint(
                        run_id,
                        step=current.step + 1,
                        step_names=(*current.step_names, f"s{current.step + 1}"),
                        state={"pid": os.getpid()},
                        version=current.version,
                    )
                )
                outcomes.append("won")
            except ConflictError:
                outcomes.append("lost")
            except Exception as exc:  # noqa: BLE001 - e.g. "database is locked": reported, fails it
                outcomes.append(f"{type(exc).__name__}: {exc}")
    return outcomes


@pytest.mark.process
def test_two_processes_racing_on_one_run_never_see_locks(tmp_path: Path) -> None:
    """Two processes saving the same version each round: exactly one wins, no lock errors."""
    path = str(tmp_path / "race.db")
    rounds = 60
    with SQLiteStore(path) as s:
        s.save(Checkpoint("r"))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(2)
        with ctx.Pool(2) as pool:
            a, b = pool.starmap(_race, [(path, "r", rounds, barrier)] * 2)
    assert len(a) == len(b) == rounds
    for index, pair in enumerate(zip(a, b, strict=True)):
        assert sorted(pair) == ["lost", "won"], f"round {index}: {pair}"
    with SQLiteStore(path) as s:
        final = s.load("r")
    assert final is not None and final.step == rounds - 1


# --- files and lifecycle ----------------------------------------------------------------


def test_new_database_and_its_wal_files_are_private(tmp_path: Path) -> None:
    """A new database file is created 0600 and SQLite's -wal and -shm files follow it."""
    path = tmp_path / "private.db"
    old = os.umask(0o022)
    try:
        with SQLiteStore(path) as s:
            s.save(Checkpoint("r"))
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    finally:
        os.umask(old)
    assert modes == {"private.db": 0o600, "private.db-wal": 0o600, "private.db-shm": 0o600}


def test_existing_file_permissions_are_kept(tmp_path: Path) -> None:
    """Opening an existing database leaves its mode alone (an operator may have widened it)."""
    path = tmp_path / "shared.db"
    SQLiteStore(path).close()
    path.chmod(0o640)
    with SQLiteStore(path) as s:
        s.save(Checkpoint("r"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_missing_directory_is_a_store_error_naming_the_file(tmp_path: Path) -> None:
    """A database in a directory that does not exist raises StoreError naming the path."""
    path = tmp_path / "nope" / "x.db"
    with pytest.raises(StoreError, match=str(path)):
        SQLiteStore(path)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores file modes"
)
def test_unwritable_directory_is_a_permission_error(tmp_path: Path) -> None:
    """Creating a database where the user may not write raises StorePermissionError."""
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(PermissionError, match="permission denied"):
            SQLiteStore(locked / "x.db")
    finally:
        locked.chmod(0o700)


def test_close_closes_every_threads_connection(tmp_path: Path) -> None:
    """close() closes the connections of all threads (SQLite then removes the WAL) and is final."""
    path = tmp_path / "c.db"
    s = SQLiteStore(path)
    s.save(Checkpoint("main"))
    used, release = threading.Event(), threading.Event()

    def worker() -> None:
        s.save(Checkpoint("thread"))
        used.set()
        release.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    assert used.wait(10)
    assert (tmp_path / "c.db-wal").exists()
    s.close()
    s.close()  # twice is allowed
    try:
        # The last connection to close checkpoints and deletes the WAL: none is left open.
        assert not (tmp_path / "c.db-wal").exists()
        with pytest.raises(StoreError, match="closed"):
            s.load("main")
    finally:
        release.set()
        thread.join()


# --- schema 2: migration, claimable, capabilities ---------------------------------------

# The DDL stepstone 0.1 (table schema 1) created, verbatim.
V1_DDL = """
CREATE TABLE IF NOT EXISTS stepstone_checkpoints (
    run_id TEXT NOT NULL,
    version TEXT NOT NULL,
    status TEXT NOT NULL,
    step INTEGER NOT NULL,
    total_steps INTEGER,
    created_at TEXT,
    updated_at TEXT NOT NULL,
    document TEXT NOT NULL,
    PRIMARY KEY (run_id)
);
CREATE INDEX IF NOT EXISTS ix_stepstone_checkpoints_status
    ON stepstone_checkpoints (status, updated_at);
CREATE INDEX IF NOT EXISTS ix_stepstone_checkpoints_updated_at
    ON stepstone_checkpoints (updated_at);
CREATE TABLE IF NOT EXISTS stepstone_meta (
    "key" TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY ("key")
);
INSERT INTO stepstone_meta ("key", value) VALUES ('schema_version', '1') ON CONFLICT DO NOTHING;
"""

V1_DOC = (
    '{"stepstone":1,"run_id":"old","step":0,"step_names":["a"],"total_steps":3,'
    '"attempt":0,"failure":null,"created_at":"2025-01-01T00:00:00+00:00",'
    '"updated_at":"2025-01-01T00:00:00+00:00","state":{"n":1}}'
)


def _v1_database(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(V1_DDL)
        conn.execute(
            "INSERT INTO stepstone_checkpoints VALUES ('old', '1.abc', 'running', 0, 3, "
            "'2025-01-01T00:00:00+00:00', '2025-01-01T00:00:00+00:00', ?)",
            (V1_DOC,),
        )
    conn.close()


def _open_only(path: str, barrier: Any) -> str:
    barrier.wait()
    try:
        SQLiteStore(path).close()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_a_schema_1_database_is_migrated_on_open(tmp_path: Path) -> None:
    """A v1 file gains due_at, owner and the (status, due_at) index; its runs stay readable."""
    path = tmp_path / "v1.db"
    _v1_database(path)
    with SQLiteStore(path) as s:
        loaded = s.load("old")
        assert loaded is not None and loaded.state == {"n": 1} and loaded.version == "1.abc"
        [info] = list(s.list_info())
        assert (info.run_id, info.version, info.due_at, info.owner) == ("old", "1.abc", None, None)
        s.save(Checkpoint("new", state={}, queued=True))
    conn = sqlite3.connect(path)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(stepstone_checkpoints)")}
    indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    version = conn.execute("SELECT value FROM stepstone_meta").fetchall()
    conn.close()
    assert {"due_at", "owner"} <= columns
    assert "ix_stepstone_checkpoints_due" in indexes
    assert version == [(str(TABLE_SCHEMA),)]


@pytest.mark.process
def test_concurrent_openers_migrate_a_schema_1_database_once(tmp_path: Path) -> None:
    """Six processes opening one v1 file together all succeed; the columns are added once.

    Three rounds, each on a fresh rollback-journal file: when two openers switch it to
    WAL at once SQLite refuses one without waiting, which must be retried, not reported
    as a lock held for the whole busy_timeout (one round in eight failed before that).
    """
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(6) as pool:
        for round_ in range(3):
            path = tmp_path / f"v1-{round_}.db"
            _v1_database(path)
            barrier = manager.Barrier(6)
            results = pool.starmap(_open_only, [(str(path), barrier)] * 6)
            assert results == ["ok"] * 6, f"round {round_}"
            with SQLiteStore(path) as s:
                assert s.load("old") is not None


def test_list_info_reports_version_owner_and_due_at(store: SQLiteStore) -> None:
    """list_info fills version, owner and due_at from the columns, as the checkpoint has them.

    An owned waiting run is due now (someone must watch that owner's lease); an unowned
    one at its ``wake_at``.
    """
    wake = datetime(2030, 1, 1, tzinfo=UTC)
    owned = store.save(
        Checkpoint("w", state={}, owner="worker-1", waiting_for="timer", wake_at=wake)
    )
    free = store.save(Checkpoint("t", state={}, waiting_for="timer", wake_at=wake))
    infos = {info.run_id: info for info in store.list_info()}
    got = [(i.status, i.version, i.owner, i.due_at) for i in (infos["w"], infos["t"])]
    assert got == [
        ("waiting", owned.version, "worker-1", DUE_NOW),
        ("waiting", free.version, None, wake),
    ]
    assert (owned.due_at, free.due_at) == (DUE_NOW, wake)


def test_claimable_returns_running_and_due_runs_only(store: SQLiteStore) -> None:
    """claimable: every running run, queued/waiting runs due by now in due order, no others."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    store.save(Checkpoint("running", state={}))
    store.save(Checkpoint("done", step=0, step_names=("a",), total_steps=1, state={}))
    store.save(Checkpoint("late", state={}, waiting_for="timer", wake_at=now + timedelta(1)))
    store.save(Checkpoint("w2", state={}, waiting_for="timer", wake_at=now - timedelta(1)))
    store.save(Checkpoint("w1", state={}, waiting_for="timer", wake_at=now - timedelta(2)))
    store.save(Checkpoint("signal", state={}, waiting_for="signal go"))
    store.save(Checkpoint("q", state={}, queued=True))  # due since its creation, today
    assert [info.run_id for info in store.claimable(now)] == ["running", "q", "w1", "w2"]
    assert [i.run_id for i in store.claimable(now, limit=1)] == ["running", "q"]


def test_claimable_uses_each_statuss_index(store: SQLiteStore) -> None:
    """Each claimable query reads its status's partial index, never the table: running
    runs by owner, queued and waiting runs searched by due_at."""
    for (sql, _), status in zip(store._sql.claims, ("running", "queued", "waiting"), strict=True):
        plan = " ".join(
            str(row[-1])
            for row in store._conn().execute(
                f"EXPLAIN QUERY PLAN {sql}", {"now": "2030", "limit": 10, "skip": 0}
            )
        )
        assert f"USING INDEX ix_stepstone_checkpoints_{status}" in plan, plan
        assert not re.search(r"SCAN stepstone_checkpoints(?! USING)", plan), plan
        if status != "running":
            assert (
                f"SEARCH stepstone_checkpoints USING INDEX ix_stepstone_checkpoints_{status}"
                in plan
            )


def test_delete_with_expected_version_is_compare_and_swap(store: SQLiteStore) -> None:
    """A stale expected version raises ConflictError and keeps the run; a missing run is False."""
    first = store.save(Checkpoint("r", state={}))
    second = store.save(Checkpoint("r", state={"n": 2}, version=first.version))
    with pytest.raises(ConflictError):
        store.delete("r", expected_version=first.version)
    assert store.load("r") == second
    assert store.delete("r", expected_version=second.version) is True
    assert store.delete("r", expected_version=second.version) is False
    assert store.delete("r") is False


def test_capabilities_are_declared() -> None:
    """SQLiteStore declares its durability levels, kill point and thread-based async."""
    assert SQLiteStore.durability_levels == ("full", "normal", "extra")
    assert dict(SQLiteStore.kill_points) == {"sqlite.in_transaction": False}
    assert (SQLiteStore.counts_requests, SQLiteStore.native_async) == (False, False)


# --- hardening --------------------------------------------------------------------------


def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    """A file with tables but no stepstone_meta is refused naming it; mode and tables stay."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match=f"{path}.*another application"):
        SQLiteStore(path)
    assert path.read_bytes() == before
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["users"]
    conn.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_a_dangling_symlink_is_refused_and_nothing_created(tmp_path: Path) -> None:
    """A symlink at the database path (dangling or not) is refused; its target is not created."""
    target = tmp_path / "elsewhere.db"
    link = tmp_path / "link.db"
    link.symlink_to(target)
    with pytest.raises(StoreError, match="symbolic link"):
        SQLiteStore(link)
    assert not target.exists()
    SQLiteStore(target).close()
    with pytest.raises(StoreError, match="symbolic link"):
        SQLiteStore(link)


def test_a_row_holding_another_runs_document_is_that_runs_corruption(store: SQLiteStore) -> None:
    """A row whose document names another run is CorruptCheckpoint on load, not that run."""
    store.save(Checkpoint("a", state={"who": "a"}))
    store.save(Checkpoint("b", state={"who": "b"}))
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute(
            "UPDATE stepstone_checkpoints SET document = "
            "(SELECT document FROM stepstone_checkpoints WHERE run_id = 'b') WHERE run_id = 'a'"
        )
    conn.close()
    with pytest.raises(CorruptCheckpoint, match="'a'"):
        store.load("a")
    loaded = store.load("b")
    assert loaded is not None and loaded.state == {"who": "b"}


def test_hand_edited_rows_are_skipped_in_listings_and_corrupt_on_load(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A bad timestamp or non-UTF-8 text hides only its own run from list_info and claimable."""
    for name in ("good", "badtime", "badtext"):
        store.save(Checkpoint(name, state={}))
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute(
            "UPDATE stepstone_checkpoints SET updated_at = 'yesterday' WHERE run_id = 'badtime'"
        )
        conn.execute(
            "UPDATE stepstone_checkpoints SET document = CAST(X'FFFE7B' AS TEXT), "
            "owner = CAST(X'FF' AS TEXT) WHERE run_id = 'badtext'"
        )
    conn.close()
    assert [i.run_id for i in store.list_info()] == ["good"]
    assert sorted(store.list_runs()) == ["badtext", "badtime", "good"]  # ids are fine
    now = datetime(2100, 1, 1, tzinfo=UTC)
    assert [i.run_id for i in store.claimable(now)] == ["good"]
    with pytest.raises(CorruptCheckpoint, match="'badtext'"):
        store.load("badtext")
    assert store.load("good") is not None
    assert "skipping" in caplog.text


_CLOSE_RACE = r"""
import sys, threading
from stepstone import Checkpoint, StoreError
from stepstone.stores.sqlite import SQLiteStore

store = SQLiteStore(sys.argv[1])
started = threading.Barrier(9, timeout=30)
errors = []

def work(n):
    started.wait()
    version = None
    try:
        while True:
            version = store.save(Checkpoint(f"r{n}", state={"n": n}, version=version)).version
            store.load(f"r{n}")
    except StoreError as exc:
        if "closed" not in str(exc):
            errors.append(repr(exc))
    except BaseException as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
for t in threads:
    t.start()
started.wait()
store.close()
for t in threads:
    t.join(60)
    assert not t.is_alive(), "a saving thread hung after close()"
assert not errors, errors
print("ok")
"""


@pytest.mark.crash
def test_close_while_eight_threads_save_never_crashes(tmp_path: Path) -> None:
    """close() under 8 saving threads: each call finishes or raises 'closed'; no SIGSEGV."""
    import subprocess
    import sys

    for attempt in range(5):
        result = subprocess.run(
            [sys.executable, "-c", _CLOSE_RACE, str(tmp_path / f"race{attempt}.db")],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-2000:])
        assert result.stdout.strip() == "ok"


_ACLOSE_RACE = r"""
import asyncio, sys
from stepstone import Checkpoint, StoreError
from stepstone.stores.sqlite import SQLiteStore

async def main():
    store = SQLiteStore(sys.argv[1])
    errors = []
    ready = asyncio.Event()
    count = 0

    async def work(n):
        nonlocal count
        version = None
        try:
            while True:
                saved = await store.asave(Checkpoint(f"r{n}", state={"n": n}, version=version))
                version = saved.version
                count += 1
                if count >= 16:
                    ready.set()
        except StoreError as exc:
            if "closed" not in str(exc):
                errors.append(repr(exc))

    tasks = [asyncio.create_task(work(n)) for n in range(8)]
    await asyncio.wait_for(ready.wait(), 60)
    await store.aclose()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert not errors, errors
    print("ok")

asyncio.run(main())
"""


@pytest.mark.crash
def test_aclose_while_eight_tasks_save_never_crashes(tmp_path: Path) -> None:
    """aclose() under 8 saving tasks: each call finishes or raises 'closed'; no SIGSEGV."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _ACLOSE_RACE, str(tmp_path / "arace.db")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.strip() == "ok"


@pytest.mark.process
def test_importing_the_module_does_not_import_sqlalchemy() -> None:
    """Importing the SQL store modules and using a SQLite store never imports SQLAlchemy."""
    import subprocess
    import sys

    code = (
        "import sys, tempfile, stepstone.stores.sqlite, stepstone.stores.postgres, "
        "stepstone.stores.mysql\n"
        "store = stepstone.stores.sqlite.SQLiteStore(tempfile.mkdtemp() + '/x.db')\n"
        "store.save(stepstone.Checkpoint('r')); store.close()\n"
        "print('sqlalchemy' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr


def test_the_checked_in_sql_equals_what_sqlalchemy_compiles() -> None:
    """stores/_sql_text.py holds exactly the statements SQLAlchemy compiles from the tables."""
    from stepstone.stores import _sql_text

    checked_in = _sql_text.STATEMENTS
    assert sqlgen.generate() == checked_in, "regenerate: python tools/sqlgen.py --write"


def test_the_generator_check_fails_when_the_text_drifts(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tools/sqlgen.py --check`` exits 0 on the checked-in text and 1 when it drifts."""
    from stepstone.stores import _sql_text

    assert sqlgen.main(["--check"]) == 0
    drifted = {kind: {**texts, "load": "SELECT 1"} for kind, texts in _sql_text.STATEMENTS.items()}
    monkeypatch.setattr(sqlgen, "STATEMENTS", drifted)
    assert sqlgen.main(["--check"]) == 1


def test_the_wheel_code_never_imports_the_generator() -> None:
    """Nothing under src/ imports SQLAlchemy at module level: the generator lives in tools/."""
    src = Path(__file__).resolve().parents[3] / "src" / "stepstone"
    offenders = [
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if "\nfrom sqlalchemy" in path.read_text() or "\nimport sqlalchemy" in path.read_text()
    ]
    assert offenders == []


def test_a_fifo_at_the_path_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO (or anything not a regular file) at the database path is refused at once."""
    fifo = tmp_path / "planted.db"
    os.mkfifo(fifo)
    with pytest.raises(StoreError, match="not a regular file"):
        SQLiteStore(fifo)


# --- the pieces table's layout (issue 36) ----------------------------------------------

#: The pieces table as releases before issue 36 made it, verbatim.
_PIECES_WITHOUT_ROWID = (
    "CREATE TABLE IF NOT EXISTS stepstone_pieces (run_id TEXT NOT NULL, piece_key TEXT NOT "
    "NULL, gen INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (run_id, piece_key)) "
    "WITHOUT ROWID"
)


def _pieces_ddl(path: str | Path) -> str:
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'stepstone_pieces'"
        ).fetchone()
    conn.close()
    assert row is not None, "no pieces table"
    return str(row[0])


def _long_run(s: SQLiteStore, run_id: str) -> None:
    """A long state saved whole, then by deltas, then whole again (a new base, which
    collects the old one), each load checked; then deleted with its pieces."""
    big = "\u00e9" * 30_000  # past INLINE_MAX, in several pieces of non-ASCII UTF-8
    cp = s.save(Checkpoint(run_id, state={"log": [big], "n": 0}))
    for n in range(1, 4):  # deltas: the list grows, a key changes
        cp = s.save(evolve(cp, state={"log": [*cp.state["log"], f"m{n}"], "n": n}))
        loaded = s.load(run_id)
        assert loaded is not None and loaded.state == cp.state
    first_keys = set(s.piece_keys(run_id))
    handle = cp.stored_state
    assert isinstance(handle, Stored)
    # A handle without its private copy: a whole save, a new base, which collects.
    rebased = evolve(cp, stored_state=replace(handle, private=None))
    cp = s.save(evolve(rebased, state={"log": ["x" * 40_000], "n": 9}))
    loaded = s.load(run_id)
    assert loaded is not None and loaded.state == {"log": ["x" * 40_000], "n": 9}
    assert first_keys and not first_keys & set(s.piece_keys(run_id)), "old base not collected"
    assert s.delete(run_id)
    assert s.piece_keys(run_id) == []


def test_a_new_database_keeps_pieces_in_a_rowid_table(db: str) -> None:
    """New databases get a rowid pieces table (cheaper for pieces of up to 1 MiB)."""
    with SQLiteStore(db) as s:
        _long_run(s, "long")
    assert "WITHOUT ROWID" not in _pieces_ddl(db).upper()


def test_a_without_rowid_pieces_table_of_an_earlier_release_is_kept_and_works(
    tmp_path: Path,
) -> None:
    """A database whose pieces table an earlier release made WITHOUT ROWID (its DDL,
    verbatim) opens as it is (no rebuild, nothing copied) and stores, loads and collects
    long states alike, pieces written before a reopen included."""
    path = tmp_path / "earlier.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            schema_ddl().replace(
                next(line for line in schema_ddl().splitlines() if "stepstone_pieces" in line),
                _PIECES_WITHOUT_ROWID + ";",
            )
        )
    conn.close()
    assert "WITHOUT ROWID" in _pieces_ddl(path)
    with SQLiteStore(path) as s:
        kept = s.save(Checkpoint("kept", state={"blob": "k" * 50_000}))
    with SQLiteStore(path) as s:  # reopened: what was written is read back
        loaded = s.load("kept")
        assert loaded is not None and loaded.state == kept.state
        _long_run(s, "long")
    assert "WITHOUT ROWID" in _pieces_ddl(path)
