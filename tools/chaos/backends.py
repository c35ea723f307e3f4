"""Per-backend set-up: what each backend promises, and the servers and tables it needs.

``BACKENDS`` are the durable backends the harness knows how to set up. What a backend
can do is read from its class (``Store.kill_points``, ``durable``), never probed: a new
kill point in a backend is covered by the harness the day the backend declares it.

- ``file``, ``sqlite``: a directory per shard under the work directory;
- ``cosmos``: a local emulator, started by ``scripts/chaos`` itself (``tests/cosmos_emulator.py``)
  unless ``--cosmos-config`` names one; a fresh container per shard;
- ``postgresql``, ``mysql``: loopback servers (``STEPSTONE_CHAOS_POSTGRESQL`` /
  ``STEPSTONE_CHAOS_MYSQL`` override); every shard gets its own table, ``?table=chaos_...``,
  created by the store and dropped here at the end (the only DDL the harness runs).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from stepstone._registry import store_class
from stepstone._store import Store

__all__ = [
    "BACKENDS",
    "BIG_BUDGET",
    "REPO",
    "SQL_SERVERS",
    "Servers",
    "check_sql_server",
    "cleanup_kill_points",
    "cosmos_config",
    "drop_sql_tables",
    "kill_points",
    "new_table_name",
    "piece_kill_points",
    "save_kill_points",
    "sql_config",
    "sql_server",
]

#: The repository this harness lives in (``tools/chaos/`` is two levels down).
REPO = Path(__file__).resolve().parents[2]

BACKENDS = ("file", "sqlite", "cosmos", "postgresql", "mysql")

#: Largest state ``--big`` generates per backend: near each backend's own limit.
BIG_BUDGET = {
    "file": 60 * 1024 * 1024,  # limit 64 MiB per document
    "sqlite": 64 * 1024 * 1024,  # limit ~1 GB (SQLITE_MAX_LENGTH): 64 MiB is as far as is sane
    "cosmos": 1_900_000,  # limit 2 MB per item, metadata included
    "postgresql": 64 * 1024 * 1024,  # limit 1 GiB per value: 64 MiB is as far as is sane
    "mysql": 12 * 1024 * 1024,  # limit: the server's max_allowed_packet (16 MiB by default)
}


def backend_class(backend: str) -> type[Store]:
    """Return the Store class of ``backend`` (a scheme), importing it lazily."""
    return store_class(backend)


def kill_points(backend: str) -> Mapping[str, bool]:
    """Return ``backend``'s save kill points, as its class declares (``Store.kill_points``).

    Hook point inside a save -> the new checkpoint is visible after a kill there; in the
    order they fire. A subclass (a test's lossy store, say) inherits its base's points.
    """
    return backend_class(backend).kill_points


def piece_kill_points(backend: str) -> Mapping[str, bool]:
    """Return ``backend``'s kill points inside a long state's save (``Store.piece_kill_points``).

    Reached only by a save whose state is kept in pieces (the long-state cases).
    """
    return backend_class(backend).piece_kill_points


def cleanup_kill_points(backend: str) -> Mapping[str, bool]:
    """Return ``backend``'s kill points inside ``delete`` and ``collect_orphans``
    (``Store.cleanup_kill_points``), reached by the churn cases."""
    return backend_class(backend).cleanup_kill_points


def save_kill_points(backend: str) -> dict[str, bool]:
    """Every kill point inside ``backend``'s saves: ``kill_points`` and ``piece_kill_points``."""
    return {**kill_points(backend), **piece_kill_points(backend)}


def check_durable(backend: str) -> None:
    """Refuse a backend whose checkpoints do not outlive the process (``Store.durable``)."""
    cls = backend_class(backend)
    if not cls.durable:
        raise SystemExit(
            f"{backend}: {cls.__name__}.durable is False: its checkpoints die with the "
            "process, so there is nothing for the chaos harness to resume"
        )


# -- SQL servers: the tables, the only DDL ----------------------------------------------------

#: Where the SQL backends' servers are (loopback, as in tests/stores/test_contract.py); override
#: with STEPSTONE_CHAOS_POSTGRESQL / STEPSTONE_CHAOS_MYSQL (a URL without ``?table=``).
SQL_SERVERS: dict[str, str] = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


def sql_server(backend: str) -> str:
    """Return the server URL of a SQL backend (env override, else the loopback default)."""
    return os.environ.get(f"STEPSTONE_CHAOS_{backend.upper()}") or SQL_SERVERS[backend]


def new_table_name(tag: str = "") -> str:
    """A fresh table name the SQL store accepts (``[a-z_][a-z0-9_]{0,47}``)."""
    return f"chaos_{uuid.uuid4().hex[:16]}{tag}"[:40]


def sql_config(backend: str, table: str) -> str:
    """Return the config string of ``table`` on ``backend``'s server."""
    return f"{sql_server(backend)}?table={table}"


@contextlib.contextmanager
def _sql_admin(backend: str) -> Iterator[Any]:
    """A plain DBAPI connection (autocommit) to ``backend``'s server, for DDL."""
    from urllib.parse import unquote, urlsplit  # noqa: PLC0415

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


def check_sql_server(backend: str) -> None:
    """Raise (any exception, with the driver's reason) if the server cannot be reached."""
    with _sql_admin(backend) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT 1")


def drop_sql_tables(backend: str, tables: list[str]) -> None:
    """Drop the checkpoint and meta tables a chaos run created."""
    if not tables:
        return
    with _sql_admin(backend) as conn, conn.cursor() as cursor:
        for table in tables:
            cursor.execute(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")


def load_cosmos_emulator_module() -> Any:
    """Import ``tests/cosmos_emulator.py`` by path (it is a test helper, not a package)."""
    path = REPO / "tests" / "cosmos_emulator.py"
    if not path.exists():
        raise SystemExit(f"{path} is missing: give --cosmos-config for an emulator or account")
    spec = importlib.util.spec_from_file_location("cosmos_emulator", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cosmos_emulator", module)
    spec.loader.exec_module(module)
    return module


def cosmos_config(host: str, port: int, container: str, http: bool = False) -> str:
    """The config string of a chaos container on an emulator (key in AZURE_COSMOS_KEY)."""
    protocol = "&protocol=http" if http else ""
    return f"cosmos://{host}:{port}/chaos/{container}?verify=false{protocol}&create=true"


# -- per shard: config strings and clean-up ------------------------------------------------


class Servers:
    """Config strings per (backend, shard), and what to clean up after the run."""

    def __init__(self, workdir: str, cosmos: str | None, stack: contextlib.ExitStack) -> None:
        self.workdir = workdir
        self.cosmos = cosmos
        self.stack = stack
        self.emulator: Any = None
        self.tables: dict[str, list[str]] = {}

    def prepare(self, backend: str) -> None:
        """Check the backend's server is there (start the Cosmos emulator if needed)."""
        if backend not in BACKENDS:
            raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
        check_durable(backend)
        if backend in SQL_SERVERS:
            try:
                check_sql_server(backend)
            except Exception as exc:  # noqa: BLE001 - any failure to reach the server ends the campaign with its text
                raise SystemExit(
                    f"{backend}: server {sql_server(backend)} unreachable: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            self.tables.setdefault(backend, [])
            self.stack.callback(self._drop, backend)
        elif backend == "cosmos" and not self.cosmos and self.emulator is None:
            module = load_cosmos_emulator_module()
            print("cosmos: starting the emulator (tests/cosmos_emulator.py)...", flush=True)
            try:
                self.emulator = self.stack.enter_context(module.cosmos_emulator())
            except module.CosmosEmulatorError as exc:
                raise SystemExit(f"cosmos: no emulator: {exc}") from None
            os.environ["AZURE_COSMOS_KEY"] = self.emulator.key
            os.environ.pop("AZURE_COSMOS_CONNECTION_STRING", None)
            print(f"cosmos: emulator at {self.emulator.endpoint}", flush=True)

    def _drop(self, backend: str) -> None:
        try:
            drop_sql_tables(backend, self.tables.get(backend, []))
        except Exception as exc:  # noqa: BLE001 - reported, never hides the run's own result
            print(f"{backend}: dropping tables {self.tables[backend]} failed: {exc}")

    def config(self, backend: str, shard: int, mode: str = "sync") -> str:
        """Return a fresh store's config string for one shard of ``backend`` in ``mode``."""
        tag = f"{mode}-{shard}"
        if backend == "file":
            return f"file://{self.workdir}/{backend}-{tag}/runs"
        if backend == "sqlite":
            return f"sqlite:///{self.workdir}/{backend}-{tag}/runs.db"
        if backend == "cosmos":
            if self.cosmos:
                return self.cosmos
            emu = self.emulator
            http = emu.endpoint.startswith("http://")
            return cosmos_config(emu.host, emu.port, f"chaos-{uuid.uuid4().hex[:10]}-{tag}", http)
        if backend in SQL_SERVERS:
            table = new_table_name(f"_{mode[0]}{shard}")
            self.tables[backend].append(table)
            return sql_config(backend, table)
        raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
