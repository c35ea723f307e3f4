"""The Store contract suite, run against every built-in backend."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest

from stepstone.testing import StoreContract


class TestMemoryStore(StoreContract):
    """memory://: process-local, so the cross-process and crash tests do not apply."""

    durable = False

    @pytest.fixture
    def store_config(self) -> str:
        """A fresh in-process store."""
        return "memory://"


class TestFileStore(StoreContract):
    """file://: one JSON document per run in a directory."""

    save_kill_points: ClassVar[dict[str, bool]] = {
        "file.after_temp_write": False,
        "file.after_rename": True,
        "file.before_dir_fsync": True,
    }

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> str:
        """A new directory per test."""
        return f"file://{tmp_path}/runs"


class TestSQLiteStore(StoreContract):
    """sqlite://: one row per run in a WAL-mode SQLite database."""

    save_kill_points: ClassVar[dict[str, bool]] = {"sqlite.in_transaction": False}

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> str:
        """A new database file per test."""
        return f"sqlite:///{tmp_path}/runs.db"


class TestCosmosStore(StoreContract):
    """cosmos://: one item per run, ETag compare-and-swap, against the emulator."""

    save_kill_points: ClassVar[dict[str, bool]] = {
        "cosmos.before_request": False,
        "cosmos.request_sent": True,
    }

    @pytest.fixture
    def store_config(self, emulator: Any, monkeypatch: pytest.MonkeyPatch) -> str:
        """A fresh container per test, created on first use; the key comes from the env."""
        monkeypatch.setenv("AZURE_COSMOS_KEY", emulator.key)
        monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
        protocol = "&protocol=http" if emulator.endpoint.startswith("http://") else ""
        container = f"runs-{uuid.uuid4().hex[:12]}"
        return (
            f"cosmos://{emulator.host}:{emulator.port}/contract/{container}"
            f"?verify=false&create=true{protocol}"
        )


class TestPostgresStore(StoreContract):
    """postgresql://: one row per run in PostgreSQL, a fresh table per test."""

    save_kill_points: ClassVar[dict[str, bool]] = {
        "sql.before_request": False,
        "sql.request_sent": True,
    }

    @pytest.fixture
    def store_config(self, request: pytest.FixtureRequest) -> str:
        """A new table per test in the loopback server's test database, dropped after."""
        return self.fresh_table(request, "postgresql://postgres@127.0.0.1:5432/test")

    @staticmethod
    def fresh_table(request: pytest.FixtureRequest, config: str) -> str:
        """Return ``config`` naming a new table, skip if the server is down; drop it after."""
        import uuid

        from stepstone.testing import backend_unavailable

        table = f"t_{uuid.uuid4().hex}"
        try:
            if config.startswith("postgresql"):
                import psycopg

                conn = psycopg.connect(config, autocommit=True, connect_timeout=3)
            else:
                import pymysql

                conn = pymysql.connect(
                    host="127.0.0.1", user="root", database="test", connect_timeout=3
                )
        except Exception as exc:
            backend_unavailable(f"{config}: {type(exc).__name__}: {exc}")

        def drop() -> None:
            with conn.cursor() as cursor:
                cursor.execute(f"DROP TABLE IF EXISTS {table}, {table}_meta")
            conn.close()

        request.addfinalizer(drop)
        return f"{config}?table={table}"


class TestMySQLStore(StoreContract):
    """mysql://: one row per run in MySQL/MariaDB, a fresh table per test."""

    save_kill_points: ClassVar[dict[str, bool]] = {
        "sql.before_request": False,
        "sql.request_sent": True,
    }

    @pytest.fixture
    def store_config(self, request: pytest.FixtureRequest) -> str:
        """A new table per test in the loopback server's test database, dropped after."""
        return TestPostgresStore.fresh_table(request, "mysql://root@127.0.0.1:3306/test")
