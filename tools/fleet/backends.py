"""Per-backend set-up for the fleet: a fresh store's config string, and its clean-up.

- ``file``, ``sqlite``: a directory under the campaign's work directory;
- ``postgresql``, ``mysql``: the loopback servers (``STEPSTONE_FLEET_POSTGRESQL`` /
  ``STEPSTONE_FLEET_MYSQL`` override, a URL without ``?table=``), a fresh table
  ``fleet_<hex>`` created by the store and dropped here at the end;
- ``cosmos``: a fresh container on an emulator; the caller provides the emulator (the
  test session's fixture, or ``cosmos_emulator()`` below for the command line).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = [
    "BACKENDS",
    "REPO",
    "check_sql",
    "cosmos_config",
    "cosmos_emulator_module",
    "drop_table",
    "local_config",
    "sql_config",
]

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("file", "sqlite", "postgresql", "mysql", "cosmos")
SQL_SERVERS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


def local_config(backend: str, workdir: str) -> str:
    """Return a fresh file or sqlite store under ``workdir``."""
    if backend == "file":
        return f"file://{workdir}/runs"
    if backend == "sqlite":
        return f"sqlite:///{workdir}/runs.db"
    raise ValueError(f"{backend!r} is not a local backend")


def sql_server(backend: str) -> str:
    """Return the server URL of a SQL backend (environment override, else loopback)."""
    return os.environ.get(f"STEPSTONE_FLEET_{backend.upper()}") or SQL_SERVERS[backend]


def sql_config(backend: str) -> tuple[str, str]:
    """Return (config string, table) of a fresh table on ``backend``'s server."""
    table = f"fleet_{uuid.uuid4().hex[:16]}"
    return f"{sql_server(backend)}?table={table}", table


@contextlib.contextmanager
def _admin(backend: str) -> Iterator[Any]:
    url = sql_server(backend)
    if backend == "postgresql":
        import psycopg  # noqa: PLC0415

        conn: Any = psycopg.connect(url, autocommit=True, connect_timeout=3)
    else:
        import pymysql  # noqa: PLC0415

        parts = urlsplit(url)
        conn = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or os.environ.get("STEPSTONE_SQL_PASSWORD", "")),
            database=parts.path.lstrip("/"),
            connect_timeout=3,
            autocommit=True,
        )
    try:
        yield conn
    finally:
        conn.close()


def check_sql(backend: str) -> None:
    """Raise (the driver's error) if ``backend``'s server cannot be reached."""
    with _admin(backend) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT 1")


def drop_table(backend: str, table: str) -> None:
    """Drop a fleet table and its meta table (the only DDL the fleet runs)."""
    with _admin(backend) as conn, conn.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")


def cosmos_config(emulator: Any) -> str:
    """Return a fresh container's config string on ``emulator`` (key: AZURE_COSMOS_KEY)."""
    protocol = "&protocol=http" if emulator.endpoint.startswith("http://") else ""
    container = f"fleet-{uuid.uuid4().hex[:10]}"
    return (
        f"cosmos://{emulator.host}:{emulator.port}/fleet/{container}"
        f"?verify=false{protocol}&create=true"
    )


def cosmos_emulator_module() -> Any:
    """Import ``tests/cosmos_emulator.py`` by path (a test helper, not a package)."""
    path = REPO / "tests" / "cosmos_emulator.py"
    spec = importlib.util.spec_from_file_location("cosmos_emulator", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("cosmos_emulator")
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["cosmos_emulator"] = module
        spec.loader.exec_module(module)
    return module
