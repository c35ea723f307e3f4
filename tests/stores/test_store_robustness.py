"""Storage hardening (issue 23, items 10-15), each class on every backend where it applies.

- Table names: SQL keywords work as table names (every identifier is quoted); names the
  servers keep for their catalogs are refused with a ``ConfigError`` saying what is
  allowed.
- MySQL's ``connect_timeout`` bounds the handshake too, sync and async.
- One undecodable or hand-edited record hides no other run from a listing.
- Nothing planted in the file store's directory (FIFO, symlink, directory) hangs a call.
- Two migrations of the same data never report a conflict.
- A store written to the previous ``Store`` contract still works under ``adelete``; the
  SQL stores leave no descriptor open after ``async with``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import logging
import os
import socket
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import pytest

from fresh_stores import MYSQL_URL, POSTGRES_URL, SERVERS, admin_connection, fresh_database
from stepstone import (
    Checkpoint,
    ConfigError,
    CorruptCheckpoint,
    Store,
    StoreError,
    StoreUnavailable,
    open_store,
)
from stepstone._migrate import migrate
from stepstone.cli import main

PG = POSTGRES_URL
MY = MYSQL_URL
FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
#: Generous bound for anything that must not hang; its failure names what hung.
HANG = 60.0


def _query(conn: Any, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def _quote(kind: str, name: str) -> str:
    return f'"{name}"' if kind == "postgresql" else f"`{name}`"


@pytest.fixture(params=["postgresql", "mysql"])
def kind(request: pytest.FixtureRequest) -> str:
    """Each SQL server."""
    return str(request.param)


@pytest.fixture
def admin(kind: str) -> Iterator[Any]:
    """An admin connection to the server of ``kind``."""
    conn = admin_connection(kind)
    yield conn
    conn.close()


def _drop(kind: str, admin: Any, *tables: str) -> None:
    for table in tables:
        for name in (table, f"{table}_meta"):
            _query(admin, f"DROP TABLE IF EXISTS {_quote(kind, name)}")


def _cp(run_id: str, **kwargs: Any) -> Checkpoint:
    return Checkpoint(run_id, state={"n": 1}, **kwargs)


def _bounded(what: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread; fail naming ``what`` if it does not return within HANG."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - the thread's outcome, whatever it is, goes to the test
            error.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG)
    if thread.is_alive():
        pytest.fail(f"{what} hung (still blocked after {HANG:g} s)")
    if error:
        raise error[0]
    return result[0]


# --- 10. table names ---------------------------------------------------------------------

KEYWORDS = ("select", "order", "table", "group", "user")


def test_sql_keywords_are_usable_table_names(kind: str, request: pytest.FixtureRequest) -> None:
    """?table=select (order, table, group, user) saves, lists, claims, deletes, sync and async."""
    # The names are fixed (they are the point), so they live in a database of their own.
    base, admin = fresh_database(request, kind)
    for name in KEYWORDS:
        with open_store(f"{base}?table={name}") as store:
            saved = store.save(_cp("r", queued=True))
            assert store.load("r") == saved
            assert [i.run_id for i in store.list_info()] == ["r"]
            assert [i.run_id for i in store.claimable(FUTURE)] == ["r"]

            async def main(s: Store = store) -> None:
                loaded = await s.aload("r")
                assert loaded is not None
                await s.asave(_cp("r", version=loaded.version))
                assert [r async for r in s.alist_runs()] == ["r"]

            asyncio.run(asyncio.wait_for(main(), HANG))
            assert store.delete("r") is True
            assert list(store.list_runs()) == []
        # The server has exactly that table, under its own name.
        assert _query(admin, f"SELECT COUNT(*) FROM {_quote(kind, name)}") == [(0,)]


_V1 = {
    "postgresql": [
        'CREATE TABLE "{t}" (run_key BYTEA NOT NULL, run_id TEXT NOT NULL, version '
        "VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL, step INTEGER NOT NULL, "
        "total_steps INTEGER, created_at TIMESTAMP WITH TIME ZONE, updated_at TIMESTAMP "
        "WITH TIME ZONE NOT NULL, document TEXT NOT NULL, PRIMARY KEY (run_key))",
        'CREATE TABLE "{t}_meta" (key VARCHAR(64) NOT NULL, value TEXT NOT NULL, '
        "PRIMARY KEY (key))",
        "INSERT INTO \"{t}_meta\" (key, value) VALUES ('schema_version', '1')",
    ],
    "mysql": [
        "CREATE TABLE `{t}` (run_key BINARY(32) NOT NULL, run_id VARCHAR(1024) NOT NULL, "
        "version VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL, step INTEGER NOT NULL, "
        "total_steps INTEGER, created_at DATETIME(6), updated_at DATETIME(6) NOT NULL, "
        "document LONGTEXT NOT NULL, PRIMARY KEY (run_key)) ENGINE=InnoDB CHARSET=utf8mb4 "
        "COLLATE utf8mb4_bin",
        "CREATE TABLE `{t}_meta` (`key` VARCHAR(64) NOT NULL, value TEXT NOT NULL, "
        "PRIMARY KEY (`key`)) ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin",
        "INSERT INTO `{t}_meta` (`key`, value) VALUES ('schema_version', '1')",
    ],
}


def test_a_schema_1_table_named_by_a_keyword_is_migrated(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The schema 1 -> 2 migration quotes the table name too: ?table=order migrates."""
    base, admin = fresh_database(request, kind)  # `order` is fixed: a database of its own
    for statement in _V1[kind]:
        _query(admin, statement.format(t="order"))
    with open_store(f"{base}?table=order") as store:
        store.save(_cp("new", queued=True))
        assert [i.run_id for i in store.claimable(FUTURE)] == ["new"]
    assert _query(admin, f"SELECT value FROM {_quote(kind, 'order_meta')}") == [("2",)]


@pytest.mark.parametrize(
    "name",
    ["pg_class", "pg_stepstone", "sqlite_master", "information_schema", "mysql", "sys"],
)
def test_system_table_names_are_refused_saying_what_is_allowed(kind: str, name: str) -> None:
    """A catalog or system-schema name is a ConfigError naming the rule, before any connection."""
    # Port 9 (discard): nothing listens, so reaching the server would be another error.
    config = f"{kind}://u@127.0.0.1:9/test?table={name}"
    with pytest.raises(ConfigError, match="reserved for the database's own catalogs") as caught:
        open_store(config)
    text = str(caught.value)
    assert repr(name) in text and "lower-case letters" in text and "pg_" in text


# --- 11. MySQL connect_timeout bounds the handshake ----------------------------------------


class _Gate:
    """A loopback TCP proxy to a server that, once ``silent``, accepts and never answers."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.target = port
        self.silent = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.silent.is_set():
                continue  # accepted, and not a byte ever: no greeting
            server = socket.create_connection(("127.0.0.1", self.target))
            self.sockets.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def test_mysql_open_against_a_silent_server_fails_in_the_connect_phase() -> None:
    """A server that never greets fails the open after connect_timeout, not read_timeout."""
    gate = _Gate(3306)
    gate.silent.set()
    config = f"mysql://root@127.0.0.1:{gate.port}/test?connect_timeout=1&read_timeout=600"
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            _bounded("opening a MySQL store on a silent server", lambda: open_store(config))
        elapsed = time.monotonic() - started
    finally:
        gate.close()
    text = str(caught.value)
    assert "cannot connect" in text and "handshake" in text and "connect_timeout=1" in text
    # Functional, not speed: the wait that ended was connect_timeout's, not read_timeout's.
    assert elapsed < 600


def test_mysql_async_connect_to_a_silent_server_fails_in_the_connect_phase() -> None:
    """A new async connection to a server that never greets fails within connect_timeout."""
    admin_connection("mysql").close()
    gate = _Gate(3306)
    table = f"t_{uuid.uuid4().hex}"
    config = (
        f"mysql://root@127.0.0.1:{gate.port}/test?table={table}&connect_timeout=1&read_timeout=600"
    )
    try:
        with open_store(config) as store:  # opened while the gate forwards
            gate.silent.set()  # from now on new connections get no greeting

            async def main() -> float:
                started = time.monotonic()
                with pytest.raises(StoreUnavailable) as caught:
                    await store.aload("r")
                text = str(caught.value)
                assert "cannot connect" in text and "handshake" in text
                return time.monotonic() - started

            elapsed = asyncio.run(
                asyncio.wait_for(main(), HANG), debug=False
            )  # failure here: the async connect hung
            assert elapsed < 600
    finally:
        gate.close()
        admin = admin_connection("mysql")
        _drop("mysql", admin, table)
        admin.close()


def test_mysql_a_login_refusal_is_still_a_permission_error() -> None:
    """The capped handshake keeps the server's own answers: a bad password is not a timeout."""
    from stepstone import StorePermissionError

    admin_connection("mysql").close()
    with pytest.raises(StorePermissionError):
        open_store("mysql://nobody_stepstone:wrong@127.0.0.1:3306/test?connect_timeout=5")


# --- 12. one bad record hides no other run -----------------------------------------------


def _names(infos: Any) -> list[str]:
    return sorted(i.run_id for i in infos)


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    stepstone_logger = logging.getLogger("stepstone")
    saved = (stepstone_logger.handlers[:], stepstone_logger.level, stepstone_logger.propagate)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        stepstone_logger.handlers[:], stepstone_logger.level = saved[0], saved[1]
        stepstone_logger.propagate = saved[2]
    return code, out.getvalue(), err.getvalue()


def test_sqlite_a_run_id_that_is_not_utf8_hides_no_other_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A non-UTF-8 run_id is that run's reported error; listings and `runs list` show the rest."""
    path = tmp_path / "runs.db"
    config = f"sqlite:///{path}"
    with open_store(config) as store:
        store.save(_cp("good", queued=True))
        store.save(_cp("also-good", queued=True))
        store.save(_cp("bad", queued=True))
        conn = sqlite3.connect(path)
        with conn:
            conn.execute(
                "UPDATE stepstone_checkpoints SET run_id = CAST(X'66ff6f' AS TEXT) "
                "WHERE run_id = 'bad'"
            )
        conn.close()
        with caplog.at_level(logging.WARNING, logger="stepstone"):
            assert sorted(store.list_runs()) == ["also-good", "good"]
            assert _names(store.list_info()) == ["also-good", "good"]
            assert _names(store.claimable(FUTURE)) == ["also-good", "good"]

            async def main() -> tuple[list[str], list[str]]:
                infos = [i.run_id async for i in store.alist_info()]
                claims = [i.run_id for i in await store.aclaimable(FUTURE)]
                return sorted(infos), sorted(claims)

            assert asyncio.run(main()) == (["also-good", "good"], ["also-good", "good"])
        assert "'f\\\\xffo'" in caplog.text and "not UTF-8" in caplog.text
    code, out, err = _cli("runs", "list", "--store", config)
    assert code == 0 and "good" in out and "also-good" in out
    assert "not UTF-8" in err and "f\\\\xffo" in err


def test_file_store_foreign_names_and_a_corrupt_document_hide_no_other_run(
    tmp_path: Path,
) -> None:
    """A non-UTF-8 file name, a garbage document and a planted marker leave the good runs listed."""
    directory = tmp_path / "runs"
    with open_store(f"file://{directory}") as store:
        store.save(_cp("good", queued=True))
        store.save(_cp("bad", queued=True))
        (directory / "bad.json").write_bytes(b"\xff\xfe{not json")
        os.close(os.open(os.fsencode(directory) + b"/\xff.json", os.O_CREAT | os.O_WRONLY))
        os.close(os.open(os.fsencode(directory) + b"/.active/\xff", os.O_CREAT | os.O_WRONLY))
        assert sorted(store.list_runs()) == ["bad", "good"]  # names alone are fine
        assert _names(store.list_info()) == ["good"]
        assert _names(store.claimable(FUTURE)) == ["good"]
        with pytest.raises(CorruptCheckpoint):
            store.load("bad")


def test_sql_servers_hand_edited_rows_hide_no_other_run(kind: str, admin: Any) -> None:
    """A bad status, and text a server would not store, hide no other run from any listing."""
    table = f"t_{uuid.uuid4().hex}"
    try:
        with open_store(f"{SERVERS[kind]}?table={table}") as store:
            for name in ("good", "badstatus", "badtext"):
                store.save(_cp(name, queued=True))
            _query(admin, f"UPDATE {table} SET status = 'exploded' WHERE run_id = 'badstatus'")
            # PostgreSQL refuses bytes that are not UTF-8; MySQL's utf8mb4 column replaces
            # them: either way no undecodable text reaches a listing.
            with contextlib.suppress(Exception):
                if kind == "mysql":
                    _query(admin, "SET SESSION sql_mode = ''")
                    _query(admin, f"UPDATE {table} SET owner = X'66ff6f' WHERE run_id = 'badtext'")
                else:
                    _query(
                        admin,
                        f"UPDATE {table} SET owner = convert_from('\\x66ff6f', 'UTF8') "
                        "WHERE run_id = 'badtext'",
                    )
            assert "good" in _names(store.list_info())
            assert "badstatus" not in _names(store.list_info())
            assert _names(store.claimable(FUTURE)) == ["badtext", "good"]
            assert sorted(store.list_runs()) == ["badstatus", "badtext", "good"]
    finally:
        _drop(kind, admin, table)


# --- 13. nothing planted in a file store hangs a call -------------------------------------


@pytest.fixture
def file_dir(tmp_path: Path) -> Path:
    """A file store directory with its index, opened once and closed."""
    directory = tmp_path / "runs"
    open_store(f"file://{directory}").close()
    return directory


def _release_fifo(path: Path) -> None:
    """Open a FIFO for reading, so that a writer stuck on it (a regression) is let go."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))


def test_a_fifo_at_an_index_marker_fails_the_save_instead_of_hanging(file_dir: Path) -> None:
    """save raises StoreError naming the FIFO and leaves it; other runs still save."""
    fifo = file_dir / ".active" / "r1"
    os.mkfifo(fifo)
    with open_store(f"file://{file_dir}") as store:
        try:
            with pytest.raises(StoreError, match="a FIFO, not an index marker") as caught:
                _bounded("save with a FIFO at the run's marker", lambda: store.save(_cp("r1")))
        finally:
            _release_fifo(fifo)
        assert str(fifo) in str(caught.value) and "nothing was saved" in str(caught.value)
        assert store.load("r1") is None  # nothing was saved, as it says
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # left as it was
        assert store.save(_cp("r2")).version is not None
        assert _names(store.claimable(FUTURE)) == ["r2"]


@pytest.mark.parametrize("planted", ["directory", "symlink"])
def test_a_directory_or_symlink_at_an_index_marker_fails_the_save_clearly(
    file_dir: Path, tmp_path: Path, planted: str
) -> None:
    """save raises StoreError saying what is at the marker; a symlink is never written through."""
    marker = file_dir / ".active" / "r1"
    target = tmp_path / "elsewhere"
    if planted == "directory":
        marker.mkdir()
    else:
        marker.symlink_to(target)
    with open_store(f"file://{file_dir}") as store:
        with pytest.raises(StoreError, match=f"a {planted}, not an index marker"):
            _bounded(f"save with a {planted} at the marker", lambda: store.save(_cp("r1")))
        assert store.load("r1") is None
    assert not target.exists()


def test_a_directory_planted_at_a_live_runs_marker_never_fails_its_last_save(
    file_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The marker cannot be removed when the run finishes: the save still lands, with a warning."""
    with open_store(f"file://{file_dir}") as store:
        saved = store.save(_cp("r1", queued=True))
        marker = file_dir / ".active" / "r1"
        marker.unlink()
        marker.mkdir()
        with caplog.at_level(logging.WARNING, logger="stepstone"):
            done = store.save(
                Checkpoint(
                    "r1",
                    state={"n": 2},
                    step=0,
                    step_names=("a",),
                    total_steps=1,
                    version=saved.version,
                )
            )
        assert store.load("r1") == done and done.status == "done"
        assert "a directory, not an index marker" in caplog.text
        assert store.claimable(FUTURE) == []


@pytest.mark.parametrize("swapped", ["symlink", "fifo"])
def test_an_index_directory_swapped_after_open_is_never_read_through(
    file_dir: Path, tmp_path: Path, swapped: str
) -> None:
    """claimable reads the index the store opened, not a symlink or FIFO put in its place."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "ghost").write_text("running")
    with open_store(f"file://{file_dir}") as store:
        store.save(_cp("r1", queued=True))
        index = file_dir / ".active"
        index.rename(file_dir / "moved")
        if swapped == "symlink":
            index.symlink_to(decoy)
        else:
            os.mkfifo(index)
        try:
            found = _bounded(
                "claimable after the index was swapped", lambda: store.claimable(FUTURE)
            )
        finally:
            if swapped == "fifo":
                _release_fifo(index)
        assert _names(found) == ["r1"]
        store.save(_cp("r2", queued=True))
    assert (file_dir / "moved" / "r2").is_file()  # marked in the index it opened
    assert sorted(p.name for p in decoy.iterdir()) == ["ghost"]


@pytest.mark.parametrize("planted", ["fifo", "directory", "symlink"])
def test_anything_planted_at_a_document_is_that_runs_corruption_without_hanging(
    file_dir: Path, tmp_path: Path, planted: str
) -> None:
    """load and save of a run whose document is a FIFO, directory or symlink raise at once."""
    document = file_dir / "r1.json"
    if planted == "fifo":
        os.mkfifo(document)
    elif planted == "directory":
        document.mkdir()
    else:
        (tmp_path / "real.json").write_text("{}")
        document.symlink_to(tmp_path / "real.json")
    with open_store(f"file://{file_dir}") as store:
        try:
            with pytest.raises(CorruptCheckpoint):
                _bounded(f"load of a {planted}", lambda: store.load("r1"))
            with pytest.raises(CorruptCheckpoint):
                _bounded(f"save over a {planted}", lambda: store.save(_cp("r1")))
        finally:
            if planted == "fifo":
                _release_fifo(document)
        store.save(_cp("r2"))
        assert sorted(store.list_runs()) == ["r2"]


def test_a_fifo_at_the_store_directory_fails_the_open_at_once(tmp_path: Path) -> None:
    """Opening a file store whose path is a FIFO raises StoreError instead of blocking."""
    path = tmp_path / "runs"
    os.mkfifo(path)
    try:
        with pytest.raises(StoreError, match=errno.errorcode[errno.ENOTDIR]):
            _bounded("opening a store at a FIFO", lambda: open_store(f"file://{path}"))
    finally:
        _release_fifo(path)


# --- 14. two migrations of the same data -------------------------------------------------


class _Racing(Store):
    """A destination where another migration copies the run between our look and our write."""

    scheme = "racing"

    def __init__(self, inner: Store, source: Store, content: Callable[[Checkpoint], Checkpoint]):
        self.inner = inner
        self.source = source
        self.content = content
        self.raced: set[str] = set()

    @classmethod
    def from_config(cls, config: str) -> Self:
        raise NotImplementedError

    def load(self, run_id: str) -> Checkpoint | None:
        found = self.inner.load(run_id)
        if found is None and run_id not in self.raced:
            self.raced.add(run_id)
            # The other migrator: read the same source run and create it first.
            cp = self.source.load(run_id)
            assert cp is not None
            self.inner.import_checkpoint(self.content(cp))
        return found

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        return self.inner.save(checkpoint)

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        return self.inner.delete(run_id, expected_version=expected_version)

    def list_runs(self) -> Iterator[str]:
        return self.inner.list_runs()

    def close(self) -> None:
        self.inner.close()


def _copy_of(cp: Checkpoint) -> Checkpoint:
    from dataclasses import replace

    return replace(cp, version=None, state_json=None, owner=None, lease=None, renewed_at=None)


def _changed(cp: Checkpoint) -> Checkpoint:
    from dataclasses import replace

    return replace(_copy_of(cp), state={"someone": "else"})


@pytest.fixture(params=["memory", "file", "sqlite", "cosmos", "postgresql", "mysql"])
def destination(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    """A fresh, empty store of every backend."""
    name = str(request.param)
    if name == "memory":
        config = f"memory://migrate-{uuid.uuid4().hex}"
    elif name == "file":
        config = f"file://{tmp_path}/dst"
    elif name == "sqlite":
        config = f"sqlite:///{tmp_path}/dst.db"
    elif name == "cosmos":
        emulator = request.getfixturevalue("emulator")
        monkeypatch.setenv("AZURE_COSMOS_KEY", emulator.key)
        monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
        protocol = "&protocol=http" if emulator.endpoint.startswith("http://") else ""
        config = (
            f"cosmos://{emulator.host}:{emulator.port}/hardening/dst-{uuid.uuid4().hex[:12]}"
            f"?verify=false&create=true{protocol}"
        )
    else:
        admin = admin_connection(name)
        table = f"t_{uuid.uuid4().hex}"

        def drop() -> None:
            _drop(name, admin, table)
            admin.close()

        request.addfinalizer(drop)
        config = f"{SERVERS[name]}?table={table}"
    store = open_store(config)
    yield store
    store.close()


def test_two_migrations_of_identical_data_report_no_conflict(destination: Store) -> None:
    """A run another migration created meanwhile, with the same content, is skipped."""
    with open_store(f"memory://src-{uuid.uuid4().hex}") as src:
        for n in range(3):
            src.save(Checkpoint(f"r{n}", state={"n": n}, queued=True))
        report = migrate(src, _Racing(destination, src, _copy_of))
        assert (report.copied, report.skipped, report.conflicts, report.failed) == (0, 3, 0, 0)
        assert report.complete and report.problems == []
        again = migrate(src, destination)
        assert (again.skipped, again.conflicts) == (3, 0)


def test_a_different_run_created_during_a_migration_is_still_a_conflict(
    destination: Store,
) -> None:
    """Content that differs is a conflict, named as created during the migration."""
    with open_store(f"memory://src-{uuid.uuid4().hex}") as src:
        src.save(Checkpoint("r", state={"n": 1}))
        report = migrate(src, _Racing(destination, src, _changed))
        assert report.conflicts == 1 and not report.complete
        [(run_id, outcome, detail)] = report.problems
        assert (run_id, outcome) == ("r", "conflict") and "during the migration" in detail


# --- 15. the Store contract, old and new ---------------------------------------------------


class _OldStore(Store):
    """A third-party store written to the previous contract: ``delete(run_id)`` only."""

    scheme = "old"

    def __init__(self) -> None:
        self.runs: dict[str, Checkpoint] = {}
        self.deleted: list[str] = []

    @classmethod
    def from_config(cls, config: str) -> Self:
        return cls()

    def load(self, run_id: str) -> Checkpoint | None:
        return self.runs.get(run_id)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        saved = checkpoint.stored(dict(checkpoint.state), "{}", uuid.uuid4().hex, datetime.now(UTC))
        self.runs[saved.run_id] = saved
        return saved

    def delete(self, run_id: str) -> bool:  # type: ignore[override]
        self.deleted.append(run_id)
        return self.runs.pop(run_id, None) is not None

    def list_runs(self) -> Iterator[str]:
        return iter(list(self.runs))

    def close(self) -> None:
        pass


def test_adelete_calls_a_previous_contract_delete_without_the_keyword() -> None:
    """adelete(run_id) works on a store whose delete takes no expected_version."""
    store = _OldStore()
    store.save(Checkpoint("r", state={}))

    async def main() -> tuple[bool, bool]:
        return await store.adelete("r"), await store.adelete("r")

    assert asyncio.run(main()) == (True, False)
    assert store.deleted == ["r", "r"] and store.load("r") is None


def test_adelete_with_a_version_on_a_previous_contract_store_says_why_it_cannot() -> None:
    """A compare-and-swap delete on such a store is a StoreError naming the missing argument."""
    store = _OldStore()
    saved = store.save(Checkpoint("r", state={}))
    with pytest.raises(StoreError, match="takes no expected_version") as caught:
        asyncio.run(store.adelete("r", expected_version=saved.version))
    assert "_OldStore.delete" in str(caught.value)
    assert store.deleted == [] and store.load("r") is not None  # nothing was deleted


def _fds() -> set[tuple[str, str]]:
    """Each open descriptor as (number, what it points at).

    The target (``socket:[inode]`` for a socket) is part of the identity: a descriptor that a
    collected object closes during the test can have its number reused by the store, and a set
    of bare numbers would then see nothing opened.
    """
    found: set[tuple[str, str]] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # closed between the listing and the readlink (the listing's own fd)
            continue
    return found


@pytest.mark.parametrize("name", ["sqlite", "postgresql", "mysql"])
def test_async_with_leaves_no_descriptor_open(name: str, tmp_path: Path) -> None:
    """When ``async with`` exits, every descriptor the store opened (sync and async) is closed."""
    if name == "sqlite":
        config, table = f"sqlite:///{tmp_path}/runs.db", ""
    else:
        admin_connection(name).close()
        table = f"t_{uuid.uuid4().hex}"
        config = f"{SERVERS[name]}?table={table}"

    async def main() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        before = _fds()  # the event loop's own descriptors are open already
        async with open_store(config) as store:
            saved = await store.asave(_cp("r"))
            await store.aload("r")
            await store.adelete("r", expected_version=saved.version)
            opened = _fds() - before
        return opened, _fds() - before

    try:
        opened, left = asyncio.run(main())
        assert opened, "the store opened no descriptor: the test would measure nothing"
        assert left == set(), f"descriptors still open after async with: {sorted(left)}"
    finally:
        if table:
            admin = admin_connection(name)
            _drop(name, admin, table)
            admin.close()
