"""PostgreSQL/MySQL-specific behaviour of SQLServerStore; the Store contract is tested elsewhere.

Needs the loopback servers (PostgreSQL at 127.0.0.1:5432, MariaDB/MySQL at 127.0.0.1:3306,
database ``test``); without them the server tests skip, or fail under CI.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    SCHEMA_VERSION,
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidState,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
    open_store,
)
from stepstone._checkpoint import Checkpoint
from stepstone.stores.sql import SQLServerStore, schema_ddl
from stepstone.testing import backend_unavailable

REPO = Path(__file__).resolve().parent.parent
PG = "postgresql://postgres@127.0.0.1:5432/test"
MY = "mysql://root@127.0.0.1:3306/test"
SECRET = "s3cr3t-Pa55word-xyzzy"


def _admin(kind: str) -> Any:
    """An autocommit driver connection for setting up and inspecting, or skip/fail."""
    try:
        if kind == "postgresql":
            import psycopg

            return psycopg.connect(PG, autocommit=True, connect_timeout=3)
        import pymysql

        return pymysql.connect(
            host="127.0.0.1", user="root", database="test", autocommit=True, connect_timeout=3
        )
    except Exception as exc:
        backend_unavailable(f"{kind} on 127.0.0.1: {type(exc).__name__}: {exc}")


def _query(conn: Any, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


@pytest.fixture(params=["postgresql", "mysql"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def admin(kind: str) -> Iterator[Any]:
    conn = _admin(kind)
    yield conn
    conn.close()


@pytest.fixture
def table(admin: Any) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex}"
    yield name
    _query(admin, f"DROP TABLE IF EXISTS {name}, {name}_meta")


@pytest.fixture
def config(kind: str, table: str) -> str:
    return f"{PG if kind == 'postgresql' else MY}?table={table}"


@pytest.fixture
def store(config: str) -> Iterator[SQLServerStore]:
    with SQLServerStore.from_config(config) as s:
        yield s


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cp(run_id: str, version: str | None = None, **state: Any) -> Checkpoint:
    return Checkpoint(run_id, state=state, version=version)


# --- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        (PG, "postgresql"),
        (PG.replace("postgresql:", "postgresql+psycopg:"), "postgresql"),
        (MY, "mysql"),
        (MY.replace("mysql:", "mysql+pymysql:"), "mysql"),
    ],
)
def test_url_forms_open_the_right_server(config: str, kind: str, table: str) -> None:
    """Plain and +driver URLs of both servers open a store of that kind with the options."""
    with open_store(f"{config}?table={table}&connect_timeout=2.5") as s:
        assert isinstance(s, SQLServerStore)
        assert (s.kind, s.table, s.connect_timeout, s.scheme) == (kind, table, 2.5, kind)


@pytest.mark.parametrize(
    "config",
    [
        "postgresql+psycopg2://u@127.0.0.1/test",
        "postgresql+asyncpg://u@127.0.0.1/test",
        "mysql+mysqldb://u@127.0.0.1/test",
        "mysql+mysqlconnector://u@127.0.0.1/test",
    ],
)
def test_unsupported_drivers_are_refused_listing_the_supported(config: str) -> None:
    """Another DBAPI driver gives a ConfigError naming psycopg and pymysql."""
    with pytest.raises(ConfigError, match=r"postgresql\+psycopg.*mysql\+pymysql"):
        open_store(config)


@pytest.mark.parametrize(
    "query",
    [
        "bogus=1",
        "table=Upper",
        "table=1starts_with_digit",
        "table=has-dash",
        "table=a%20b",
        "table=x;drop",
        "table=" + "x" * 49,
        "table=",
        "connect_timeout=0",
        "connect_timeout=-1",
        "connect_timeout=abc",
        "connect_timeout=nan",
        "connect_timeout=inf",
        "table=a&table=b",
    ],
)
def test_bad_options_are_refused(query: str) -> None:
    """Unknown options, unsafe table names and non-positive timeouts raise ConfigError."""
    with pytest.raises(ConfigError):
        open_store(f"postgresql://u@127.0.0.1:{_closed_port()}/test?{query}")


@pytest.mark.parametrize("config", ["postgresql://u@127.0.0.1", "mysql://u@127.0.0.1/"])
def test_url_without_database_is_refused(config: str) -> None:
    """A URL naming no database raises ConfigError listing the forms."""
    with pytest.raises(ConfigError, match="names no database.*USER"):
        open_store(config)


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PyMySQL installed, a mysql:// store says which extra to install."""
    monkeypatch.setitem(sys.modules, "pymysql", None)
    with pytest.raises(ConfigError, match=r"pip install 'stepstone\[mysql\]'"):
        open_store("mysql://u@127.0.0.1/test")


def test_password_is_hidden_in_repr_and_config_errors() -> None:
    """repr of a store, and errors about a malformed URL, never show the password."""
    with pytest.raises(ConfigError) as info:
        open_store(f"postgresql://u:{SECRET}@127.0.0.1:notaport/test")
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is not None
    with pytest.raises(ConfigError) as info:
        open_store(f"mysql+mysqldb://u:{SECRET}@127.0.0.1/test")
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_unreachable_port_is_store_unavailable_without_the_password(scheme: str) -> None:
    """A closed port on 127.0.0.1 gives StoreUnavailable; the password appears nowhere."""
    port = _closed_port()
    with pytest.raises(StoreUnavailable) as info:
        open_store(f"{scheme}://root:{SECRET}@127.0.0.1:{port}/test?connect_timeout=2")
    text = str(info.value)
    assert SECRET not in text and f"127.0.0.1:{port}" in text and "***" in text
    assert SECRET not in repr(info.value.__cause__)


def test_wrong_mysql_password_is_permission_error(
    table: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused password (from the URL or STEPSTONE_SQL_PASSWORD) is StorePermissionError."""
    if kind != "mysql":
        pytest.skip("the loopback PostgreSQL trusts every password; see the role test")
    with pytest.raises(StorePermissionError, match="Access denied") as info:
        open_store(f"mysql://root:{SECRET}@127.0.0.1/test?table={table}")
    assert SECRET not in str(info.value)
    monkeypatch.setenv("STEPSTONE_SQL_PASSWORD", SECRET)
    with pytest.raises(StorePermissionError, match="using password: YES") as info:
        open_store(f"mysql://root@127.0.0.1/test?table={table}")
    assert SECRET not in str(info.value)


def test_unknown_postgres_role_is_permission_error(kind: str, table: str) -> None:
    """A role the server does not know is refused with StorePermissionError."""
    if kind != "postgresql":
        pytest.skip("PostgreSQL only")
    with pytest.raises(StorePermissionError, match="nosuchrole"):
        open_store(f"postgresql://nosuchrole@127.0.0.1/test?table={table}")


def test_unknown_database_is_a_store_error(kind: str) -> None:
    """A database that does not exist is a StoreError saying so, not a permission error."""
    base = PG if kind == "postgresql" else MY
    _admin(kind).close()
    with pytest.raises(StoreError, match="database does not exist") as info:
        open_store(base.replace("/test", "/no_such_db_xyz"))
    assert not isinstance(info.value, (StorePermissionError, StoreUnavailable))


# --- round trips --------------------------------------------------------------------------


def _server_round_trips(store: SQLServerStore, action: Any) -> int:
    """Round trips ``action`` made on this thread's connection, measured by the server/libpq."""
    held = store._local.held
    if store.kind == "postgresql":
        trace = Path(f"/tmp/stepstone-pgtrace-{uuid.uuid4().hex}")
        with trace.open("w") as sink:
            held.conn.pgconn.trace(sink.fileno())
            try:
                action()
            finally:
                held.conn.pgconn.untrace()
        lines = trace.read_text().splitlines()
        trace.unlink()
        # Every round trip ends with the server's ReadyForQuery.
        return sum(1 for line in lines if "\tB\t" in line and "ReadyForQuery" in line)
    cursor = held.conn.cursor()

    def questions() -> int:
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])

    before = questions()
    action()
    return questions() - before - 1  # the second SHOW counts itself


def test_one_round_trip_per_save_and_load(store: SQLServerStore) -> None:
    """A first save, later saves, loads and a delete each take exactly one round trip."""
    store.load("warm-up")  # opens this thread's connection
    saved: list[Checkpoint] = []
    sent = store.requests_sent
    assert _server_round_trips(store, lambda: saved.append(store.save(_cp("r", n=0)))) == 1
    assert store.requests_sent - sent == 1
    for n in range(1, 12):  # past psycopg's default prepare threshold of 5
        sent = store.requests_sent
        trips = _server_round_trips(
            store, lambda n=n: saved.append(store.save(_cp("r", saved[-1].version, n=n)))
        )
        assert (trips, store.requests_sent - sent) == (1, 1), n
    for _ in range(8):
        sent = store.requests_sent
        assert _server_round_trips(store, lambda: store.load("r")) == 1
        assert store.requests_sent - sent == 1
    assert _server_round_trips(store, lambda: store.delete("r")) == 1


def test_mysql_connections_do_not_use_found_rows(store: SQLServerStore) -> None:
    """PyMySQL connections are opened without CLIENT.FOUND_ROWS, so 0 rows means unchanged."""
    if store.kind != "mysql":
        pytest.skip("MySQL only")
    import pymysql.constants.CLIENT as client_flags

    store.load("x")
    assert store._local.held.conn.client_flag & client_flags.FOUND_ROWS == 0


# --- compare-and-swap ---------------------------------------------------------------------


def test_compare_and_swap_on_the_server(store: SQLServerStore, admin: Any, table: str) -> None:
    """Stale, made-up and first saves over a row conflict and leave the stored row as it was."""
    first = store.save(_cp("r", n=1))
    second = store.save(_cp("r", first.version, n=2))
    row = f"SELECT version, document FROM {table}"
    before = _query(admin, row)
    for version in (first.version, "not-a-version", None):
        with pytest.raises(ConflictError, match=repr(second.version)):
            store.save(_cp("r", version, n=3))
    assert _query(admin, row) == before
    loaded = store.load("r")
    assert loaded is not None and loaded.state == {"n": 2}


def test_a_deleted_run_is_not_resurrected_by_a_stale_save(store: SQLServerStore) -> None:
    """Saving with a version after the run was deleted conflicts and stores nothing."""
    saved = store.save(_cp("r", n=1))
    assert store.delete("r")
    with pytest.raises(ConflictError, match="deleted"):
        store.save(_cp("r", saved.version, n=2))
    assert store.load("r") is None


def _race(config: str, rounds: int, barrier: Any) -> list[str]:
    outcomes: list[str] = []
    with SQLServerStore.from_config(config) as s:
        for _ in range(rounds):
            barrier.wait()
            current = s.load("r")
            barrier.wait()
            assert current is not None
            try:
                s.save(_cp("r", current.version, pid=os.getpid()))
                outcomes.append("won")
            except ConflictError:
                outcomes.append("lost")
            except Exception as exc:  # reported to the parent, which fails the test
                outcomes.append(f"{type(exc).__name__}: {exc}")
    return outcomes


def test_two_processes_racing_on_one_run(store: SQLServerStore, config: str) -> None:
    """Two processes saving on the same version each round: exactly one wins, no errors."""
    store.save(_cp("r"))
    rounds = 40
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(2)
        with ctx.Pool(2) as pool:
            a, b = pool.starmap(_race, [(config, rounds, barrier)] * 2)
    for index, pair in enumerate(zip(a, b, strict=True)):
        assert sorted(pair) == ["lost", "won"], f"round {index}: {pair}"


# --- keys ---------------------------------------------------------------------------------


def test_case_and_unicode_variants_are_distinct_runs(store: SQLServerStore) -> None:
    """Ids equal under case folding, Unicode normalization or PAD SPACE stay separate runs."""
    ids = [
        "a",
        "A",
        "a ",
        "ü",
        "u\u0308",
        "ß",
        "ss",
        "SS",
        "ﬀ",
        "ff",
        "İ",
        "i",
        "\U0001f680" * 1024,
    ]
    for index, run_id in enumerate(ids):
        store.save(_cp(run_id, i=index))
    for index, run_id in enumerate(ids):
        loaded = store.load(run_id)
        assert loaded is not None and loaded.state == {"i": index}, run_id
        assert loaded.run_id == run_id
    assert sorted(store.list_runs()) == sorted(ids)
    assert store.delete("A") and store.load("a") is not None


# --- schema -------------------------------------------------------------------------------


def test_schema_is_created_on_first_use(store: SQLServerStore, admin: Any, table: str) -> None:
    """Opening a store on a new table creates both tables, the indexes and the version row."""
    assert _query(admin, f"SELECT value FROM {table}_meta") == [(str(SCHEMA_VERSION),)]
    if store.kind == "postgresql":
        found = _query(admin, "SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))
    else:
        found = _query(
            admin,
            "SELECT DISTINCT index_name FROM information_schema.statistics "
            "WHERE table_schema = 'test' AND table_name = %s",
            (table,),
        )
    names = {row[0] for row in found}
    assert {f"ix_{table}_updated_at", f"ix_{table}_status"} <= names


def test_mysql_table_is_utf8mb4_binary(store: SQLServerStore, admin: Any, table: str) -> None:
    """On MySQL the checkpoint table is InnoDB, utf8mb4 with the binary collation."""
    if store.kind != "mysql":
        pytest.skip("MySQL only")
    assert _query(
        admin,
        "SELECT engine, table_collation FROM information_schema.tables "
        "WHERE table_schema = 'test' AND table_name = %s",
        (table,),
    ) == [("InnoDB", "utf8mb4_bin")]


@pytest.mark.parametrize(("kind_", "folder"), [("postgresql", "postgres"), ("mysql", "mysql")])
def test_schema_sql_files_match_the_code(kind_: str, folder: str) -> None:
    """backends/*/schema.sql are exactly the DDL generated from the Table objects."""
    on_disk = (REPO / "backends" / folder / "schema.sql").read_text(encoding="utf-8")
    assert on_disk == schema_ddl(kind_), f"regenerate backends/{folder}/schema.sql"  # type: ignore[arg-type]


def test_schema_ddl_run_by_hand_gives_a_usable_store(kind: str, admin: Any, table: str) -> None:
    """The documented DDL, run by hand for a table name, gives tables the store opens and uses."""
    for statement in schema_ddl(kind, table).split(";\n")[:-1]:  # type: ignore[arg-type]
        lines = [line for line in statement.splitlines() if not line.startswith("--")]
        _query(admin, "\n".join(lines))
    base = PG if kind == "postgresql" else MY
    with SQLServerStore.from_config(f"{base}?table={table}") as s:
        assert s.requests_sent == 1 + (kind == "mysql")  # version check (+ packet size)
        s.save(_cp("r", a=1))
        assert s.load("r") is not None


def test_newer_schema_version_is_refused(store: SQLServerStore, admin: Any, table: str) -> None:
    """A table written by a newer stepstone is refused with advice to upgrade, unchanged."""
    config = f"{PG if store.kind == 'postgresql' else MY}?table={table}"
    _query(admin, f"UPDATE {table}_meta SET value = %s", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(StoreError, match="upgrade stepstone"):
        SQLServerStore.from_config(config)
    assert _query(admin, f"SELECT value FROM {table}_meta") == [(str(SCHEMA_VERSION + 1),)]


def test_init_is_idempotent_and_reports_the_tables(store: SQLServerStore) -> None:
    """init() on existing tables succeeds again and names both tables and the version."""
    for _ in range(2):
        [line] = store.init()
        assert store.table in line and f"{store.table}_meta" in line
        assert f"schema version {SCHEMA_VERSION}" in line


def _open_and_save(config: str, name: str, barrier: Any) -> str:
    barrier.wait()
    try:
        with SQLServerStore.from_config(config) as s:
            s.save(_cp(name, by=name))
    except Exception as exc:  # reported to the parent, which fails the test
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_several_processes_can_create_a_new_table_at_once(
    kind: str, admin: Any, table: str
) -> None:
    """Processes opening one new table together all succeed and see one schema."""
    config = f"{PG if kind == 'postgresql' else MY}?table={table}"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            args = [(config, f"run-{i}", barrier) for i in range(4)]
            results = pool.starmap(_open_and_save, args)
    assert results == ["ok"] * 4
    with SQLServerStore.from_config(config) as s:
        assert sorted(s.list_runs()) == [f"run-{i}" for i in range(4)]


@pytest.fixture
def restricted(kind: str, admin: Any) -> Iterator[str]:
    """A login that may connect and read but not create tables; dropped afterwards."""
    if kind == "postgresql":
        _query(admin, "DROP ROLE IF EXISTS stepstone_ro")
        _query(admin, "CREATE ROLE stepstone_ro LOGIN")
        [(may_create,)] = _query(
            admin, "SELECT has_schema_privilege('stepstone_ro', 'public', 'CREATE')"
        )
        if may_create:  # PostgreSQL < 15 lets everyone create in public
            _query(admin, "DROP ROLE stepstone_ro")
            pytest.skip("every role may create tables in schema public on this server")
        yield "postgresql://stepstone_ro@127.0.0.1/test"
        _query(admin, "DROP ROLE IF EXISTS stepstone_ro")
    else:
        _query(admin, "DROP USER IF EXISTS 'stepstone_ro'@'%'")
        _query(admin, "CREATE USER 'stepstone_ro'@'%%' IDENTIFIED BY %s", (SECRET,))
        _query(admin, "GRANT SELECT ON test.* TO 'stepstone_ro'@'%'")
        yield f"mysql://stepstone_ro:{SECRET}@127.0.0.1/test"
        _query(admin, "DROP USER IF EXISTS 'stepstone_ro'@'%'")


def test_no_create_privilege_says_what_to_provision(restricted: str, table: str) -> None:
    """Credentials that may not create tables get StorePermissionError pointing to schema.sql."""
    with pytest.raises(StorePermissionError, match=r"schema\.sql") as info:
        SQLServerStore.from_config(f"{restricted}?table={table}")
    assert SECRET not in str(info.value)


# --- rows ---------------------------------------------------------------------------------


def test_columns_mirror_the_document(store: SQLServerStore) -> None:
    """list_info reports status, step, total steps and updated_at exactly as saved."""
    saved = store.save(
        Checkpoint("r", step=1, step_names=("a", "b"), total_steps=2, state={"x": 1})
    )
    [info] = list(store.list_info())
    assert (info.run_id, info.status, info.step, info.total_steps) == ("r", "done", 1, 2)
    assert info.updated_at == saved.updated_at


def test_list_info_reads_columns_not_documents(
    store: SQLServerStore, admin: Any, table: str
) -> None:
    """list_info works when a document is unreadable; load raises CorruptCheckpoint."""
    store.save(Checkpoint("r", step=0, step_names=("a",), total_steps=3, state={}))
    _query(admin, f"UPDATE {table} SET document = 'garbage'")
    [info] = list(store.list_info())
    assert (info.run_id, info.status, info.step) == ("r", "running", 0)
    with pytest.raises(CorruptCheckpoint, match=f"table {table} run 'r'"):
        store.load("r")


def test_oversized_checkpoint_is_refused_before_sending(store: SQLServerStore) -> None:
    """A document over MySQL's max_allowed_packet raises CheckpointTooLarge and sends nothing."""
    if store.kind != "mysql":
        pytest.skip("the PostgreSQL limit is 1 GiB; too slow to test here")
    limit = store._max_bytes
    sent = store.requests_sent
    # Quotes double when escaped: under the limit as characters, over it on the wire.
    with pytest.raises(CheckpointTooLarge) as info:
        store.save(_cp("big", blob='"' * (limit // 2 + 1)))
    assert info.value.limit == limit and info.value.size > limit
    assert store.requests_sent == sent
    assert store.load("big") is None


def test_lone_surrogate_in_state_is_invalid_state(store: SQLServerStore) -> None:
    """A string that cannot be UTF-8 raises InvalidState and stores nothing."""
    with pytest.raises(InvalidState):
        store.save(_cp("r", text="\ud800"))
    assert store.load("r") is None


# --- connections --------------------------------------------------------------------------


def test_a_killed_session_is_unavailable_then_reconnects(store: SQLServerStore, admin: Any) -> None:
    """When the server ends the session, the call raises StoreUnavailable and the next works."""
    saved = store.save(_cp("r", n=1))
    conn = store._local.held.conn
    if store.kind == "postgresql":
        _query(admin, "SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    else:
        _query(admin, f"KILL {int(conn.thread_id())}")
    with pytest.raises(StoreUnavailable):
        store.load("r")
    loaded = store.load("r")
    assert loaded is not None and loaded.version == saved.version
    assert store._local.held.conn is not conn


def test_each_thread_has_its_own_connection_and_close_ends_all(store: SQLServerStore) -> None:
    """Threads get separate connections; close() closes every one and later calls fail."""
    store.load("x")
    conns = [store._local.held.conn]

    def work() -> None:
        store.load("x")
        conns.append(store._local.held.conn)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert conns[0] is not conns[1]
    store.close()
    store.close()
    for conn in conns:
        assert conn.closed if store.kind == "postgresql" else not conn.open
    with pytest.raises(StoreError, match="closed"):
        store.load("x")


def _child_uses_inherited_store(store: SQLServerStore) -> None:
    import gc

    from stepstone.stores import sql

    saved = store.load("r")
    assert saved is not None
    store.save(_cp("r", saved.version, by="child"))
    store.close()
    # What interpreter shutdown may do: finalize the inherited connections.
    sql._inherited.clear()
    gc.collect()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_disturb_the_parents_connection(store: SQLServerStore) -> None:
    """A forked child saves through the inherited store; the parent's session survives."""
    store.save(_cp("r", by="parent"))
    conn = store._local.held.conn
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child_uses_inherited_store, args=(store,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    loaded = store.load("r")
    assert loaded is not None and loaded.state == {"by": "child"}
    assert store._local.held.conn is conn  # the same session, still working


def test_doctor_reports_schema_and_durability(store: SQLServerStore) -> None:
    """doctor() passes the probe checks and reports the schema version and commit flushing."""
    results = {d.check: d for d in store.doctor()}
    assert all(d.ok for d in results.values()), results
    assert f"schema version {SCHEMA_VERSION}" in results
    detail = results["commits are flushed to disk"].detail
    assert ("synchronous_commit=on" if store.kind == "postgresql" else "flush_log") in detail
