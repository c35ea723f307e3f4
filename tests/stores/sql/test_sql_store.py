"""PostgreSQL/MySQL-specific behaviour of PostgresStore and MySQLStore (not the contract).

Needs the loopback servers (PostgreSQL at 127.0.0.1:5432, MariaDB/MySQL at 127.0.0.1:3306,
database ``test``); without them the server tests skip, or fail under CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import FLUSHED_COMMITS, MYSQL_URL, POSTGRES_URL
from stepstone import (
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
from stepstone.stores import mysql as mysql_store
from stepstone.stores import postgres as postgres_store
from stepstone.stores._sql import TABLE_SCHEMA, ServerStore
from stepstone.testing import backend_unavailable

REPO = Path(__file__).resolve().parents[3]
PG = POSTGRES_URL
MY = MYSQL_URL
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
    except Exception as exc:  # noqa: BLE001 - a server that fails in any way is unavailable
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
    _query(admin, f"DROP TABLE IF EXISTS {name}, {name}_meta, {name}_pieces")


@pytest.fixture
def config(kind: str, table: str) -> str:
    return f"{PG if kind == 'postgresql' else MY}?table={table}"


@pytest.fixture
def store(config: str) -> Iterator[Any]:
    with open_store(config) as s:
        assert isinstance(s, ServerStore)
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
    with open_store(f"{config}?table={table}&connect_timeout=2.5") as opened:
        assert isinstance(opened, ServerStore)
        s: Any = opened
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
    assert SECRET not in repr(info.value.__cause__)
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


def _server_round_trips(store: Any, action: Any) -> int:
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


def test_one_round_trip_per_save_and_load(store: Any) -> None:
    """A first save, later saves and loads each take exactly one round trip; a delete two."""
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
    # A delete is two: the run's row, then its pieces (always, even for a short state: a
    # delete that died between the two left the pieces of a long one behind).
    assert _server_round_trips(store, lambda: store.delete("r")) == 2


def test_mysql_connections_do_not_use_found_rows(store: Any) -> None:
    """PyMySQL connections are opened without CLIENT.FOUND_ROWS, so 0 rows means unchanged."""
    if store.kind != "mysql":
        pytest.skip("MySQL only")
    import pymysql.constants.CLIENT as client_flags

    store.load("x")
    assert store._local.held.conn.client_flag & client_flags.FOUND_ROWS == 0


# --- compare-and-swap ---------------------------------------------------------------------


def _sockets() -> int:
    """This process's open socket descriptors."""
    fds = "/proc/self/fd"
    count = 0
    for name in os.listdir(fds):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            count += os.readlink(f"{fds}/{name}").startswith("socket:")
    return count


def test_an_event_loop_per_call_leaves_no_connection_open(config: str) -> None:
    """``asyncio.run`` around each call: the ended loops' connections are closed.

    Each loop gets its own connections. aiomysql's keep their loop alive, and with it the
    weak key of their pool, and closing one on a closed loop raised and left its socket
    open: 300 such calls reached MariaDB's ``max_connections``. Now a new loop's pool
    closes the ended loops' connections, and ``close`` closes them all.
    """
    store = open_store(config)
    cp = store.save(_cp("loops"))
    before = _sockets()
    for n in range(30):
        cp = asyncio.run(store.asave(_cp("loops", cp.version, n=n)))
    during = _sockets()
    store.close()
    after = _sockets()
    assert during <= before + 2, f"{during - before} sockets left open by 30 ended loops"
    assert after < before, "close() left the connections of ended loops open"


def test_compare_and_swap_on_the_server(store: Any, admin: Any, table: str) -> None:
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


def test_a_deleted_run_is_not_resurrected_by_a_stale_save(store: Any) -> None:
    """Saving with a version after the run was deleted conflicts and stores nothing."""
    saved = store.save(_cp("r", n=1))
    assert store.delete("r")
    with pytest.raises(ConflictError, match="deleted"):
        store.save(_cp("r", saved.version, n=2))
    assert store.load("r") is None


def _race(config: str, rounds: int, barrier: Any) -> list[str]:
    outcomes: list[str] = []
    with open_store(config) as s:
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
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
                outcomes.append(f"{type(exc).__name__}: {exc}")
    return outcomes


def test_two_processes_racing_on_one_run(store: Any, config: str) -> None:
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


def test_case_and_unicode_variants_are_distinct_runs(store: Any) -> None:
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


def test_schema_is_created_on_first_use(store: Any, admin: Any, table: str) -> None:
    """Opening a store on a new table creates both tables, the indexes and the version row."""
    assert _query(admin, f"SELECT value FROM {table}_meta") == [(str(TABLE_SCHEMA),)]
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


def test_mysql_table_is_utf8mb4_binary(store: Any, admin: Any, table: str) -> None:
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
    module = postgres_store if kind_ == "postgresql" else mysql_store
    assert on_disk == module.schema_ddl(), f"regenerate backends/{folder}/schema.sql"


def test_schema_ddl_run_by_hand_gives_a_usable_store(kind: str, admin: Any, table: str) -> None:
    """The documented DDL, run by hand for a table name, gives tables the store opens and uses."""
    module = postgres_store if kind == "postgresql" else mysql_store
    for statement in module.schema_ddl(table).split(";\n")[:-1]:
        lines = [line for line in statement.splitlines() if not line.startswith("--")]
        _query(admin, "\n".join(lines))
    base = PG if kind == "postgresql" else MY
    with open_store(f"{base}?table={table}") as s:
        assert isinstance(s, ServerStore)
        assert s.requests_sent == 1 + (kind == "mysql")  # version check (+ packet size)
        s.save(_cp("r", a=1))
        assert s.load("r") is not None


def test_tables_an_earlier_release_made_gain_the_pieces_table_on_first_need(
    kind: str, admin: Any, table: str
) -> None:
    """Tables without the pieces table open as cheaply as before; a long save creates it."""
    module = postgres_store if kind == "postgresql" else mysql_store
    statements = module.schema_ddl(table).split(";\n")[:-1]
    assert "_pieces" in statements[-1]  # the pieces table comes last
    for statement in statements[:-1]:  # what the previous release's DDL made
        lines = [line for line in statement.splitlines() if not line.startswith("--")]
        _query(admin, "\n".join(lines))
    base = PG if kind == "postgresql" else MY
    with open_store(f"{base}?table={table}") as s:
        assert isinstance(s, ServerStore)
        assert s.requests_sent == 1 + (kind == "mysql")  # no pieces DDL on open
        s.save(_cp("short", a=1))
        long = s.save(_cp("long", blob="x" * 20_000))
        loaded = s.load("long")
        assert loaded is not None and loaded.state == long.state
        assert s.piece_keys("long")
    rows = _query(admin, f"SELECT COUNT(*) FROM {table}_pieces")
    assert rows[0][0] >= 1


def test_newer_schema_version_is_refused(store: Any, admin: Any, table: str) -> None:
    """A table written by a newer stepstone is refused with advice to upgrade, unchanged."""
    config = f"{PG if store.kind == 'postgresql' else MY}?table={table}"
    _query(admin, f"UPDATE {table}_meta SET value = %s", (str(TABLE_SCHEMA + 1),))
    with pytest.raises(StoreError, match="upgrade stepstone"):
        open_store(config)
    assert _query(admin, f"SELECT value FROM {table}_meta") == [(str(TABLE_SCHEMA + 1),)]


def test_init_is_idempotent_and_reports_the_tables(store: Any) -> None:
    """init() on existing tables succeeds again and names both tables and the version."""
    for _ in range(2):
        [line] = store.init()
        assert store.table in line and f"{store.table}_meta" in line
        assert f"schema version {TABLE_SCHEMA}" in line


def _open_and_save(config: str, name: str, barrier: Any) -> str:
    barrier.wait()
    try:
        with open_store(config) as s:
            s.save(_cp(name, by=name))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
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
    with open_store(config) as s:
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
        open_store(f"{restricted}?table={table}")
    assert SECRET not in str(info.value)


# --- rows ---------------------------------------------------------------------------------


def test_columns_mirror_the_document(store: Any) -> None:
    """list_info reports status, step, total steps and updated_at exactly as saved."""
    saved = store.save(
        Checkpoint("r", step=1, step_names=("a", "b"), total_steps=2, state={"x": 1})
    )
    [info] = list(store.list_info())
    assert (info.run_id, info.status, info.step, info.total_steps) == ("r", "done", 1, 2)
    assert info.updated_at == saved.updated_at


def test_list_info_reads_columns_not_documents(store: Any, admin: Any, table: str) -> None:
    """list_info works when a document is unreadable; load raises CorruptCheckpoint."""
    store.save(Checkpoint("r", step=0, step_names=("a",), total_steps=3, state={}))
    _query(admin, f"UPDATE {table} SET document = 'garbage'")
    [info] = list(store.list_info())
    assert (info.run_id, info.status, info.step) == ("r", "running", 0)
    with pytest.raises(CorruptCheckpoint, match=f"table {table} run 'r'"):
        store.load("r")


def test_a_state_over_max_allowed_packet_is_saved_in_pieces(store: Any) -> None:
    """A state over MySQL's max_allowed_packet is saved in pieces and loads back whole."""
    if store.kind != "mysql":
        pytest.skip("the PostgreSQL limit is 1 GiB; too slow to test here")
    limit = store._max_bytes
    sent = store.requests_sent
    # Quotes double when escaped: under the limit as characters, over it on the wire.
    saved = store.save(_cp("big", blob='"' * (limit // 2 + 1)))
    assert store.requests_sent - sent > 2  # pieces, each under the limit, then the row
    loaded = store.load("big")
    assert loaded is not None and loaded.state == saved.state
    assert len(loaded.state["blob"]) == limit // 2 + 1


def test_lone_surrogate_in_state_is_invalid_state(store: Any) -> None:
    """A string that cannot be UTF-8 raises InvalidState and stores nothing."""
    with pytest.raises(InvalidState):
        store.save(_cp("r", text="\ud800"))
    assert store.load("r") is None


# --- connections --------------------------------------------------------------------------


def test_a_killed_session_is_unavailable_then_reconnects(store: Any, admin: Any) -> None:
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


def test_each_thread_has_its_own_connection_and_close_ends_all(store: Any) -> None:
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


def _child_uses_inherited_store(store: Any) -> None:
    import gc

    from stepstone.stores._sql import connections

    saved = store.load("r")
    assert saved is not None
    store.save(_cp("r", saved.version, by="child"))
    store.close()
    # What interpreter shutdown may do: finalize the inherited connections.
    connections.inherited.clear()
    gc.collect()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_disturb_the_parents_connection(store: Any) -> None:
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


def test_doctor_reports_schema_and_durability(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor() passes the probe checks and reports the schema version and commit flushing."""
    for key, value in FLUSHED_COMMITS.items():
        monkeypatch.setenv(key, value)
    with open_store(config) as store:
        results = {d.check: d for d in store.doctor()}
    assert all(d.ok for d in results.values()), results
    assert f"schema version {TABLE_SCHEMA}" in results
    detail = results["commits are flushed to disk"].detail
    assert ("synchronous_commit=on" if "postgresql" in config else "flush_log") in detail


@pytest.mark.parametrize("kind", ["postgresql"])  # MariaDB's flush setting is global only
def test_doctor_fails_a_postgresql_session_that_does_not_flush_its_commits(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session with ``synchronous_commit=off`` (a server or role default, or PGOPTIONS)
    can lose acknowledged saves in a power cut: doctor says so, and names the setting."""
    monkeypatch.setenv("PGOPTIONS", "-c synchronous_commit=off")
    with open_store(config) as store:
        check = {d.check: d for d in store.doctor()}["commits are flushed to disk"]
    assert not check.ok
    assert "synchronous_commit=off" in check.detail


# --- schema 2: migration, claimable, delete, capabilities ---------------------------------

_V1_PG = """
CREATE TABLE {t} (
    run_key BYTEA NOT NULL, run_id TEXT NOT NULL, version VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL, step INTEGER NOT NULL, total_steps INTEGER,
    created_at TIMESTAMP WITH TIME ZONE, updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    document TEXT NOT NULL, PRIMARY KEY (run_key)
);
CREATE INDEX ix_{t}_status ON {t} (status, updated_at);
CREATE INDEX ix_{t}_updated_at ON {t} (updated_at);
CREATE TABLE {t}_meta (key VARCHAR(64) NOT NULL, value TEXT NOT NULL, PRIMARY KEY (key));
INSERT INTO {t}_meta (key, value) VALUES ('schema_version', '1')
"""
_V1_MY = """
CREATE TABLE {t} (
    run_key BINARY(32) NOT NULL, run_id VARCHAR(1024) NOT NULL, version VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL, step INTEGER NOT NULL, total_steps INTEGER,
    created_at DATETIME(6), updated_at DATETIME(6) NOT NULL, document LONGTEXT NOT NULL,
    PRIMARY KEY (run_key),
    INDEX ix_{t}_status (status, updated_at), INDEX ix_{t}_updated_at (updated_at)
) ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;
CREATE TABLE {t}_meta (`key` VARCHAR(64) NOT NULL, value TEXT NOT NULL, PRIMARY KEY (`key`))
    ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;
INSERT INTO {t}_meta (`key`, value) VALUES ('schema_version', '1')
"""
_V1_DOC = (
    '{"stepstone":1,"run_id":"old","step":0,"step_names":["a"],"total_steps":3,'
    '"attempt":0,"failure":null,"created_at":"2025-01-01T00:00:00+00:00",'
    '"updated_at":"2025-01-01T00:00:00+00:00","state":{"n":1}}'
)


def _v1_table(kind: str, admin: Any, table: str) -> None:
    import hashlib

    for statement in (_V1_PG if kind == "postgresql" else _V1_MY).format(t=table).split(";\n"):
        _query(admin, statement)
    _query(
        admin,
        f"INSERT INTO {table} (run_key, run_id, version, status, step, total_steps, "
        "created_at, updated_at, document) VALUES (%s, 'old', '1.abc', 'running', 0, 3, "
        "'2025-01-01 00:00:00', '2025-01-01 00:00:00', %s)",
        (hashlib.sha256(b"old").digest(), _V1_DOC),
    )


def _columns_and_indexes(kind: str, admin: Any, table: str) -> tuple[set[str], set[str]]:
    if kind == "postgresql":
        columns = _query(
            admin,
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
            (table,),
        )
        indexes = _query(admin, "SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))
    else:
        columns = _query(
            admin,
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'test' AND table_name = %s",
            (table,),
        )
        indexes = _query(
            admin,
            "SELECT DISTINCT index_name FROM information_schema.statistics "
            "WHERE table_schema = 'test' AND table_name = %s",
            (table,),
        )
    return {row[0].lower() for row in columns}, {row[0] for row in indexes}


def test_a_schema_1_table_is_migrated_on_open(kind: str, admin: Any, table: str) -> None:
    """A v1 table gains due_at, owner and the (status, due_at) index; old rows stay readable."""
    _v1_table(kind, admin, table)
    with open_store(f"{PG if kind == 'postgresql' else MY}?table={table}") as s:
        loaded = s.load("old")
        assert loaded is not None and loaded.state == {"n": 1} and loaded.version == "1.abc"
        [info] = list(s.list_info())
        assert (info.run_id, info.version, info.due_at, info.owner) == ("old", "1.abc", None, None)
        s.save(Checkpoint("new", state={}, queued=True))
        assert [i.run_id for i in s.claimable(datetime.now(UTC))] == ["old", "new"]
    columns, indexes = _columns_and_indexes(kind, admin, table)
    assert {"due_at", "owner"} <= columns and f"ix_{table}_due" in indexes
    assert _query(admin, f"SELECT value FROM {table}_meta") == [(str(TABLE_SCHEMA),)]


def test_concurrent_openers_migrate_a_schema_1_table_once(
    kind: str, admin: Any, table: str
) -> None:
    """Four processes opening one v1 table together all succeed and save."""
    _v1_table(kind, admin, table)
    config = f"{PG if kind == 'postgresql' else MY}?table={table}"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            results = pool.starmap(
                _open_and_save, [(config, f"run-{i}", barrier) for i in range(4)]
            )
    assert results == ["ok"] * 4
    with open_store(config) as s:
        assert sorted(s.list_runs()) == ["old"] + [f"run-{i}" for i in range(4)]


def test_list_info_and_claimable_read_version_owner_and_due_at(store: Any) -> None:
    """list_info fills version/owner/due_at; claimable returns running then due runs only."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    store.save(Checkpoint("running", state={}, owner="w-1"))
    store.save(Checkpoint("done", step=0, step_names=("a",), total_steps=1, state={}))
    store.save(Checkpoint("late", state={}, waiting_for="timer", wake_at=now + timedelta(1)))
    w2 = store.save(Checkpoint("w2", state={}, waiting_for="timer", wake_at=now - timedelta(1)))
    store.save(Checkpoint("w1", state={}, waiting_for="timer", wake_at=now - timedelta(2)))
    store.save(Checkpoint("q", state={}, queued=True))
    infos = {i.run_id: i for i in store.list_info()}
    assert (infos["w2"].version, infos["w2"].due_at, infos["running"].owner) == (
        w2.version,
        now - timedelta(1),
        "w-1",
    )
    assert [i.run_id for i in store.claimable(now)] == ["running", "q", "w1", "w2"]
    assert [i.run_id for i in store.claimable(now, limit=1)] == ["running", "q"]


def test_claimable_is_an_index_search(store: Any) -> None:
    """The claimable queries use the (status, due_at) index, not a scan of the table."""
    for n in range(50):
        store.save(Checkpoint(f"done-{n}", step=0, step_names=("a",), total_steps=1, state={}))
    params = {"now": datetime(2030, 1, 1, tzinfo=UTC), "limit": 10, "skip": 0}
    for sql, _ in store._sql.claims:
        if store.kind == "postgresql":
            store._exec("SET enable_seqscan = off")
            plan = " ".join(str(r[0]) for r in store._exec(f"EXPLAIN {sql}", params)[1])
            assert f"ix_{store.table}_due" in plan, plan
        else:
            [row] = store._exec(f"EXPLAIN {sql}", params)[1][:1]
            assert row[6] == f"ix_{store.table}_due" or f"ix_{store.table}_due" in str(row), row


def test_delete_with_expected_version_is_compare_and_swap(store: Any) -> None:
    """A stale expected version raises ConflictError and keeps the row; gone is False."""
    first = store.save(_cp("r", n=1))
    second = store.save(_cp("r", first.version, n=2))
    with pytest.raises(ConflictError):
        store.delete("r", expected_version=first.version)
    assert store.load("r") == second
    sent = store.requests_sent
    assert store.delete("r", expected_version=second.version) is True
    assert store.requests_sent - sent == 2  # the row, then the run's pieces
    assert store.delete("r", expected_version=second.version) is False


def test_capabilities_are_declared(kind: str) -> None:
    """Each server store declares its kill points, request counting and native async."""
    cls = postgres_store.PostgresStore if kind == "postgresql" else mysql_store.MySQLStore
    assert cls.scheme == kind and cls.durability_levels == ()
    assert dict(cls.kill_points) == {"sql.before_request": False, "sql.request_sent": True}
    assert cls.counts_requests and cls.native_async


# --- async -------------------------------------------------------------------------------


def test_async_one_request_per_save_and_load(store: Any) -> None:
    """asave, aload and adelete each send exactly one statement on a native connection."""

    async def main() -> None:
        await store.aload("warm-up")
        saved = None
        for n in range(8):
            sent = store.requests_sent
            saved = await store.asave(_cp("r", None if saved is None else saved.version, n=n))
            assert store.requests_sent - sent == 1
            sent = store.requests_sent
            assert await store.aload("r") == saved
            assert store.requests_sent - sent == 1
        with pytest.raises(ConflictError):
            await store.asave(_cp("r", None))
        assert saved is not None
        assert await store.adelete("r", expected_version=saved.version)
        assert [r async for r in store.alist_runs()] == []

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_cancelled_asave_lands_whole_or_not_and_drops_its_connection(
    store: Any,
) -> None:
    """Cancelling asave mid-flight stores the old or the new row, and never reuses that socket."""

    async def main() -> None:
        first = await store.asave(_cp("r", n=0))
        pool = store._apool()
        [held] = pool.idle
        task = asyncio.create_task(store.asave(_cp("r", first.version, n=1)))
        await asyncio.sleep(0)  # the save has started: its statement is on the wire
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConflictError):
            await task
        assert held not in pool.idle and held not in pool.all
        loaded = await store.aload("r")
        assert loaded is not None and loaded.state in ({"n": 0}, {"n": 1})

    asyncio.run(asyncio.wait_for(main(), 60))


# --- hardening ---------------------------------------------------------------------------


class _Freezer:
    """A TCP proxy to a server that can stop forwarding: the server then 'never answers'."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.target = port
        self.frozen = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if self.frozen.is_set():
                    continue  # swallowed: the peer waits for an answer that never comes
                sink.sendall(data)

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def _silent_server() -> tuple[socket.socket, int]:
    """A TCP server on 127.0.0.1 that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    return listener, int(listener.getsockname()[1])


def test_a_server_that_accepts_and_never_answers_is_unavailable(kind: str, config: str) -> None:
    """Connecting to a silent server raises StoreUnavailable after the timeouts, sync and async."""
    listener, port = _silent_server()
    try:
        with pytest.raises(StoreUnavailable):
            open_store(f"{kind}://root@127.0.0.1:{port}/test?connect_timeout=1&read_timeout=1")
        with open_store(f"{config}&connect_timeout=1&read_timeout=1") as opened:
            s: Any = opened
            s._connect_args["port"] = port  # new connections now go to the silent server

            async def main() -> None:
                with pytest.raises(StoreUnavailable):
                    await s.aload("r")

            asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        listener.close()


def test_a_server_that_stops_answering_mid_session_is_unavailable(kind: str, table: str) -> None:
    """A frozen connection raises StoreUnavailable after read_timeout, sync and async."""
    proxy = _Freezer(5432 if kind == "postgresql" else 3306)
    user = "postgres" if kind == "postgresql" else "root"
    config = f"{kind}://{user}@127.0.0.1:{proxy.port}/test?table={table}&read_timeout=1"
    try:
        with open_store(config) as s:
            s.save(_cp("r", n=1))

            async def warm() -> None:
                await s.aload("r")
                proxy.frozen.set()
                with pytest.raises(StoreUnavailable):
                    await s.aload("r")

            asyncio.run(asyncio.wait_for(warm(), 30))
            with pytest.raises(StoreUnavailable):
                s.load("r")
    finally:
        proxy.close()


def test_a_row_holding_another_runs_document_is_that_runs_corruption(
    store: Any, admin: Any, table: str
) -> None:
    """A row whose document names another run is CorruptCheckpoint on load, not returned."""
    store.save(_cp("a", who="a"))
    store.save(_cp("b", who="b"))
    [(document,)] = _query(admin, f"SELECT document FROM {table} WHERE run_id = 'b'")
    _query(admin, f"UPDATE {table} SET document = %s WHERE run_id = 'a'", (document,))
    with pytest.raises(CorruptCheckpoint, match="'a'"):
        store.load("a")
    with pytest.raises(CorruptCheckpoint, match="'a'"):
        asyncio.run(store.aload("a"))
    loaded = store.load("b")
    assert loaded is not None and loaded.state == {"who": "b"}


def test_a_hand_edited_bad_timestamp_hides_only_its_run(store: Any, admin: Any, table: str) -> None:
    """MySQL's zero date in one row: list_info and claimable skip it and list the others."""
    if store.kind != "mysql":
        pytest.skip("PostgreSQL's timestamptz cannot hold an invalid time")
    store.save(_cp("good"))
    store.save(_cp("bad"))
    _query(admin, "SET SESSION sql_mode = ''")
    _query(admin, f"UPDATE {table} SET updated_at = '0000-00-00 00:00:00' WHERE run_id = 'bad'")
    assert [i.run_id for i in store.list_info()] == ["good"]
    assert [i.run_id for i in store.claimable(datetime(2100, 1, 1, tzinfo=UTC))] == ["good"]


_CLOSE_RACE = r"""
import asyncio, sys, threading
from stepstone import Checkpoint, StoreError, open_store

store = open_store(sys.argv[1])
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

async def amain():
    store = open_store(sys.argv[1])
    ready = asyncio.Event()
    aerrors = []

    async def awork(n):
        version = None
        try:
            while True:
                saved = await store.asave(Checkpoint(f"a{n}", state={}, version=version))
                version = saved.version
                ready.set()
        except StoreError as exc:
            if "closed" not in str(exc):
                aerrors.append(repr(exc))

    tasks = [asyncio.create_task(awork(n)) for n in range(8)]
    await asyncio.wait_for(ready.wait(), 30)
    await store.aclose()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert not aerrors, aerrors

asyncio.run(amain())
print("ok")
"""


@pytest.mark.crash
def test_close_while_threads_and_tasks_save_never_crashes(config: str) -> None:
    """close()/aclose() under 8 saving threads or tasks: calls finish or raise 'closed'."""
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", _CLOSE_RACE, config],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert result.stdout.strip() == "ok"


def test_the_loop_keeps_running_while_an_asave_waits_on_the_server(
    store: Any, admin: Any, table: str
) -> None:
    """While asave waits on a row lock another session holds, other tasks keep running."""
    saved = store.save(_cp("r", n=0))

    async def main() -> None:
        _query(admin, "BEGIN")
        _query(admin, f"SELECT version FROM {table} WHERE run_id = 'r' FOR UPDATE")
        try:
            save = asyncio.create_task(store.asave(_cp("r", saved.version, n=1)))
            ticks = 0
            ticked = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while ticks < 20:
                    await asyncio.sleep(0.005)
                    ticks += 1
                ticked.set()

            tick = asyncio.create_task(ticker())
            await asyncio.wait_for(ticked.wait(), 30)  # the loop ran 20 times meanwhile
            assert not save.done(), "the save should still wait on the row lock"
        finally:
            _query(admin, "COMMIT")
        await asyncio.wait_for(save, 30)
        await tick

    asyncio.run(main())
    loaded = store.load("r")
    assert loaded is not None and loaded.state == {"n": 1}


def test_a_save_stuck_on_a_lock_times_out_as_unavailable(
    kind: str, admin: Any, table: str, config: str
) -> None:
    """A save blocked past statement_timeout (PG) or read_timeout (MySQL) is StoreUnavailable."""
    extra = "&statement_timeout=1&read_timeout=5" if kind == "postgresql" else "&read_timeout=1"
    with open_store(config + extra) as s:
        saved = s.save(_cp("r", n=0))
        _query(admin, "BEGIN")
        try:
            _query(admin, f"SELECT version FROM {table} WHERE run_id = 'r' FOR UPDATE")
            with pytest.raises(StoreUnavailable):
                s.save(_cp("r", saved.version, n=1))
        finally:
            _query(admin, "ROLLBACK")
        loaded = s.load("r")  # the store reconnects if the timeout dropped the connection
        assert loaded is not None and loaded.state in ({"n": 0}, {"n": 1})


def _child_uses_inherited_store_async(store: Any) -> None:
    async def main() -> None:
        saved = await store.aload("r")
        assert saved is not None
        await store.asave(_cp("r", saved.version, by="child"))

    asyncio.run(main())
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_leaves_the_parents_async_connections_alone(store: Any) -> None:
    """A child forked while the parent's loop holds async connections never touches them."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(store.asave(_cp("r", by="parent")))
        pool = loop.run_until_complete(_pool_of(store))
        [held] = pool.idle
        ctx = multiprocessing.get_context("fork")
        child = ctx.Process(target=_child_uses_inherited_store_async, args=(store,))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        loaded = loop.run_until_complete(store.aload("r"))
        assert loaded is not None and loaded.state == {"by": "child"}
        assert pool.idle == [held]  # the same connection served the parent again
    finally:
        store.close()
        loop.close()


async def _pool_of(store: Any) -> Any:
    return store._apool()
