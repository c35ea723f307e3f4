"""A fresh store of each backend for a test: the backends, their config strings, their servers.

One place for what many test files copied: the tuple of backends, the config string of
a new, empty store of each kind (a new table on the shared PostgreSQL and MariaDB
servers, dropped after the test; a new Cosmos container; a new directory or file), and
admin connections to the servers. Everything a test creates on a shared server has a
unique name (uuid), so tests running at once never meet.

    from fresh_stores import BACKENDS, fresh_config

    @pytest.mark.parametrize("kind", BACKENDS)
    def test_x(kind, request, tmp_path):
        with open_store(fresh_config(kind, request, tmp_path)) as store: ...
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from stepstone import open_store
from stepstone.testing import backend_unavailable

__all__ = [
    "BACKENDS",
    "DURABLE_BACKENDS",
    "FLUSHED_COMMITS",
    "LOCAL_BACKENDS",
    "MYSQL_URL",
    "POSTGRES_URL",
    "QUICK_BACKENDS",
    "SERVERS",
    "admin_connection",
    "cosmos_config",
    "fresh_config",
    "fresh_database",
    "fresh_table",
    "store_fixture",
]

#: Every built-in backend, in the order the suites list them.
BACKENDS = ("memory", "file", "sqlite", "postgresql", "mysql", "cosmos")
#: The backends that need no server.
LOCAL_BACKENDS = ("memory", "file", "sqlite")
#: The backends another process can open too (all but memory): for crash and takeover tests.
DURABLE_BACKENDS = tuple(kind for kind in BACKENDS if kind != "memory")
#: One store in memory, one on disk: for behaviour no backend changes, pinned quickly.
QUICK_BACKENDS = ("memory", "sqlite")
#: The loopback servers' test databases (PostgreSQL trusts, MariaDB's root has no password).
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
MYSQL_URL = "mysql://root@127.0.0.1:3306/test"
SERVERS = {"postgresql": POSTGRES_URL, "mysql": MYSQL_URL}
#: The environment under which a new PostgreSQL session flushes each commit to disk, the
#: server's default. ``scripts/test`` runs the suite with ``synchronous_commit=off``
#: (``PGOPTIONS``; docs/development.md): a test that checks the setting sets it back.
FLUSHED_COMMITS = {"PGOPTIONS": "-c synchronous_commit=on"}


def admin_connection(kind: str, database: str = "test") -> Any:
    """An autocommit driver connection to the loopback server of ``kind``, or skip (fail in CI)."""
    try:
        if kind == "postgresql":
            import psycopg

            url = POSTGRES_URL.rsplit("/", 1)[0] + "/" + database
            return psycopg.connect(url, autocommit=True, connect_timeout=3)
        import pymysql

        return pymysql.connect(
            host="127.0.0.1", user="root", database=database, autocommit=True, connect_timeout=3
        )
    except Exception as exc:  # noqa: BLE001 - a server that fails in any way is unavailable: skip, loudly
        backend_unavailable(f"{kind} on 127.0.0.1: {type(exc).__name__}: {exc}")


def _execute(conn: Any, sql: str) -> None:
    with conn.cursor() as cursor:
        cursor.execute(sql)


def fresh_table(request: pytest.FixtureRequest, config: str) -> str:
    """Return ``config`` naming a new table, skip if the server is down; drop it after."""
    table = f"t_{uuid.uuid4().hex}"
    conn = admin_connection("postgresql" if config.startswith("postgresql") else "mysql")

    def drop() -> None:
        _execute(conn, f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")
        conn.close()

    request.addfinalizer(drop)
    return f"{config}?table={table}"


def fresh_database(request: pytest.FixtureRequest, kind: str) -> tuple[str, Any]:
    """A new, empty database on the server of ``kind``: (its URL, an admin connection to it).

    For tests whose table names are fixed (SQL keywords, say): in a database of their
    own they meet no other test's tables. Dropped after the test.
    """
    name = f"db_{uuid.uuid4().hex}"
    server = admin_connection(kind)
    _execute(server, f"CREATE DATABASE {name}")
    conn = admin_connection(kind, name)

    def drop() -> None:
        conn.close()
        # PostgreSQL refuses to drop a database with sessions; FORCE ends any a store left.
        force = " WITH (FORCE)" if kind == "postgresql" else ""
        _execute(server, f"DROP DATABASE IF EXISTS {name}{force}")
        server.close()

    request.addfinalizer(drop)
    return SERVERS[kind].rsplit("/", 1)[0] + "/" + name, conn


def cosmos_config(request: pytest.FixtureRequest, database: str = "contract") -> str:
    """A new container on the session's Cosmos emulator, its key in the environment."""
    emulator: Any = request.getfixturevalue("emulator")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("AZURE_COSMOS_KEY", emulator.key)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    protocol = "&protocol=http" if emulator.endpoint.startswith("http://") else ""
    return (
        f"cosmos://{emulator.host}:{emulator.port}/{database}/runs-{uuid.uuid4().hex[:12]}"
        f"?verify=false&create=true{protocol}"
    )


def fresh_config(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Return the config string of a new, empty store of ``kind`` (cleaned up after)."""
    if kind == "memory":
        return f"memory://fresh-{uuid.uuid4().hex}"
    if kind == "file":
        return f"file://{tmp_path}/runs"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    if kind in SERVERS:
        return fresh_table(request, SERVERS[kind])
    if kind == "cosmos":
        return cosmos_config(request)
    raise ValueError(f"unknown backend {kind!r}; one of {', '.join(BACKENDS)}")


def store_fixture(backends: Sequence[str]) -> Any:
    """A ``store`` fixture for a test module: a fresh store of each of ``backends``, open.

    ``store = store_fixture(QUICK_BACKENDS)`` at module level, in place of the pair of a
    ``config`` fixture and a ``store`` fixture that opens it.
    """

    @pytest.fixture(params=backends)
    def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
        with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
            yield opened

    return store
