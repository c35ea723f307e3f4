"""The Store contract suite, run against every built-in backend, in both forms.

Each subclass only says how to get a fresh, empty store; what the backend can do
(durability, kill points, request counting) comes from the store class itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import MYSQL_URL, POSTGRES_URL, cosmos_config, fresh_table
from stepstone import Store
from stepstone.testing import StoreContract


class TestMemoryStore(StoreContract):
    """memory://: process-local, so the cross-process and crash tests do not apply."""

    @pytest.fixture
    def store_config(self) -> str:
        """A fresh in-process store, named so that opening the config again shares it."""
        return f"memory://contract-{uuid.uuid4().hex}"


class TestFileStore(StoreContract):
    """file://: one JSON document per run in a directory."""

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> str:
        """A new directory per test."""
        return f"file://{tmp_path}/runs"


class TestSQLiteStore(StoreContract):
    """sqlite://: one row per run in a WAL-mode SQLite database."""

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> str:
        """A new database file per test."""
        return f"sqlite:///{tmp_path}/runs.db"


class TestCosmosStore(StoreContract):
    """cosmos://: one item per run, ETag compare-and-swap, against the emulator."""

    @pytest.fixture
    def store_config(self, request: pytest.FixtureRequest) -> str:
        """A fresh container per test, created on first use; the key comes from the env."""
        return cosmos_config(request)


class TestPostgresStore(StoreContract):
    """postgresql://: one row per run in PostgreSQL, a fresh table per test."""

    @pytest.fixture
    def store_config(self, request: pytest.FixtureRequest) -> str:
        """A new table per test in the loopback server's test database, dropped after."""
        return fresh_table(request, POSTGRES_URL)

    def hold_saves(
        self, store: Store, store_config: str
    ) -> AbstractContextManager[Callable[[], None]]:
        """EXCLUSIVE mode blocks every write to the table and lets plain reads through."""
        take = "BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE"
        return _table_lock(store_config, take, "COMMIT")


class TestMySQLStore(StoreContract):
    """mysql://: one row per run in MySQL/MariaDB, a fresh table per test."""

    @pytest.fixture
    def store_config(self, request: pytest.FixtureRequest) -> str:
        """A new table per test in the loopback server's test database, dropped after."""
        return fresh_table(request, MYSQL_URL)

    def hold_saves(
        self, store: Store, store_config: str
    ) -> AbstractContextManager[Callable[[], None]]:
        """A READ table lock from another session makes writes wait and lets reads through."""
        return _table_lock(store_config, "LOCK TABLES {table} READ", "UNLOCK TABLES")


@contextmanager
def _table_lock(store_config: str, take: str, give: str) -> Iterator[Callable[[], None]]:
    """Hold a lock on the store's table from another session: loads pass, saves wait."""
    table = store_config.rsplit("table=", 1)[1]
    if store_config.startswith("postgresql"):
        import psycopg

        conn: Any = psycopg.connect(store_config.split("?", maxsplit=1)[0], autocommit=True)
    else:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", user="root", database="test", autocommit=True)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            with conn.cursor() as cursor:
                cursor.execute(give)

    try:
        with conn.cursor() as cursor:
            for statement in take.format(table=table).split(";"):
                cursor.execute(statement)
        yield release
    finally:
        release()
        conn.close()
