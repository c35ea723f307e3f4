"""SQLServerStore: checkpoints in PostgreSQL (psycopg 3) or MySQL/MariaDB (PyMySQL).

Design, and why (it follows ``stepstone.stores.sqlite`` closely):

- SQLAlchemy Core *describes* the schema and *builds* the statements (``Table`` objects,
  the dialects' ``INSERT ... ON CONFLICT`` / ``ON DUPLICATE KEY UPDATE``), so the DDL in
  ``backends/postgres/schema.sql`` and ``backends/mysql/schema.sql`` and the SQL we run
  come from one definition. Statements are compiled to SQL text once per (dialect, table)
  and cached; no SQLAlchemy execution machinery runs per call. Hand-written SQL is
  limited to what is not about our tables: the PostgreSQL advisory lock taken while
  creating the schema, ``@@max_allowed_packet`` at open, and doctor's settings reads.
- Statements run on raw DBAPI connections, one per thread, opened with the driver
  directly rather than through an engine: SQLAlchemy's PyMySQL dialect adds
  ``CLIENT.FOUND_ROWS`` to every connection, which would make "matched" rows count as
  "changed" ones, and we want autocommit, timeouts and (on PostgreSQL) no server-side
  prepared statements set in one place. The thread-local *is* the pool.
- Connections are in autocommit mode and every store operation is ONE statement, so ONE
  round trip; the single statement is its own atomic, durable transaction:

  - first save (``version`` None): ``INSERT ... ON CONFLICT (run_key) DO NOTHING``
    (PostgreSQL) or ``INSERT ... ON DUPLICATE KEY UPDATE run_key = run_key`` (MySQL);
    0 rows affected means the run already exists -> ``ConflictError``.
  - later saves: ``UPDATE ... WHERE run_key = :key AND version = :expected``; 0 rows
    means the version moved on *or the run was deleted* -> ``ConflictError`` (as the
    memory and file stores do; a deleted run is never resurrected by a stale worker).

  Both servers re-check the ``WHERE`` against the latest committed row after waiting for
  a concurrent writer's row lock (PostgreSQL's EvalPlanQual, InnoDB's locking read), so
  exactly one of several racing saves wins. A save always changes ``version``, so
  "rows changed" and "rows matched" agree; ``FOUND_ROWS`` is kept off anyway, because the
  MySQL first-save form reports 0 for an existing row only without it.
- On PostgreSQL psycopg's automatic server-side prepare is off (``prepare_threshold``
  None): preparing costs a separate round trip per statement and connection, and unnamed
  statements keep every call at exactly one round trip (and work behind PgBouncer).
- Keys: ``run_key`` = SHA-256 of the UTF-8 run_id is the primary key (BYTEA /
  BINARY(32)); the full ``run_id`` is kept beside it. A 1024-character run_id is up to
  4096 bytes, over InnoDB's 3072-byte index key limit and PostgreSQL's ~2700-byte btree
  tuple limit, and hashing also makes keys byte-exact on MySQL whatever the collation.
  Tables use ``utf8mb4`` with ``utf8mb4_bin`` on MySQL, so stored text is exact too.
- Driver errors are translated in one place, ``_Guard``; a connection the error broke is
  dropped so the thread reconnects on its next call.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import math
import os
import re
import threading
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self, cast
from urllib.parse import urlsplit

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    delete,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects.mysql import pymysql as pymysql_dialect
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.elements import BindParameter

from .. import _hooks
from .._checkpoint import SCHEMA_VERSION, Checkpoint, check_run_id, utcnow
from .._codec import checkpoint_from_doc, decode_document, encode_document, encode_state
from .._errors import (
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidState,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
)
from .._store import Diagnosis, RunInfo, Store
from ._common import new_version, parse_options

if TYPE_CHECKING:
    from .._checkpoint import RunStatus

__all__ = ["DEFAULT_TABLE", "SQLServerStore", "schema_ddl"]

Kind = Literal["postgresql", "mysql"]

DEFAULT_TABLE: Final = "stepstone_checkpoints"
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
PASSWORD_ENV: Final = "STEPSTONE_SQL_PASSWORD"

_DRIVERS: Final[dict[Kind, str]] = {"postgresql": "psycopg", "mysql": "pymysql"}
_EXTRAS: Final[dict[Kind, str]] = {"postgresql": "postgres", "mysql": "mysql"}
_DEFAULT_PORTS: Final[dict[Kind, int]] = {"postgresql": 5432, "mysql": 3306}
_FORMS: Final = (
    "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (also postgresql+psycopg://) or "
    "mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (also mysql+pymysql://; MySQL or "
    "MariaDB); options: ?table=NAME&connect_timeout=SECONDS; give the password in "
    f"{PASSWORD_ENV} (or PGPASSWORD for PostgreSQL) rather than in the URL"
)
# Lower case only: PostgreSQL folds unquoted names and MySQL on Linux does not, so mixed
# case would name different tables in hand-written SQL. 48 leaves room for the index and
# meta table names under PostgreSQL's 63-byte identifier limit.
_TABLE_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,47}")
# A 1 GiB text value is PostgreSQL's hard limit (MaxAllocSize - 1).
_POSTGRES_MAX_BYTES: Final = (1 << 30) - 1
# Room for everything in a MySQL INSERT besides the escaped document (a 1024-character
# run_id escaped, the key, the other columns and the SQL text).
_MYSQL_STATEMENT_OVERHEAD: Final = 16 * 1024

# --- schema -----------------------------------------------------------------------------


def _tables(name: str) -> tuple[Table, Table]:
    """Return the checkpoint and meta ``Table`` objects for checkpoint table ``name``."""
    metadata = MetaData()
    checkpoints = Table(
        name,
        metadata,
        # SHA-256 of the UTF-8 run_id: fixed length, so any run_id fits every index limit.
        Column(
            "run_key",
            LargeBinary().with_variant(mysql_dialect.BINARY(32), "mysql", "mariadb"),
            primary_key=True,
        ),
        Column(
            "run_id",
            Text().with_variant(mysql_dialect.VARCHAR(1024), "mysql", "mariadb"),
            nullable=False,
        ),
        Column("version", String(64), nullable=False),
        Column("status", String(16), nullable=False),
        Column("step", Integer, nullable=False),
        Column("total_steps", Integer),
        Column(
            "created_at",
            DateTime(timezone=True).with_variant(mysql_dialect.DATETIME(fsp=6), "mysql", "mariadb"),
        ),
        Column(
            "updated_at",
            DateTime(timezone=True).with_variant(mysql_dialect.DATETIME(fsp=6), "mysql", "mariadb"),
            nullable=False,
        ),
        # Last, so listing (which reads the columns before it) rarely touches it; large
        # documents live out of line (TOAST / InnoDB overflow pages) anyway.
        Column(
            "document",
            Text().with_variant(mysql_dialect.LONGTEXT(), "mysql", "mariadb"),
            nullable=False,
        ),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
    )
    # Listing and pruning by age, and finding failed or running runs, read only these.
    Index(f"ix_{name}_updated_at", checkpoints.c.updated_at)
    Index(f"ix_{name}_status", checkpoints.c.status, checkpoints.c.updated_at)
    meta = Table(
        f"{name}_meta",
        metadata,
        Column("key", String(64), primary_key=True),
        Column("value", Text, nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
    )
    return checkpoints, meta


_DIALECTS: Final[dict[Kind, Dialect]] = {
    "postgresql": psycopg_dialect.dialect(paramstyle="pyformat"),  # type: ignore[no-untyped-call]
    "mysql": pymysql_dialect.dialect(paramstyle="pyformat"),
}


def _sql(kind: Kind, statement: Any, literal: bool = False) -> str:
    kwargs = {"literal_binds": True} if literal else {}
    text = str(statement.compile(dialect=_DIALECTS[kind], compile_kwargs=kwargs))
    return "\n".join(line.rstrip().replace("\t", "    ") for line in text.strip().splitlines())


class _Statements:
    """Every statement a store runs, compiled once per (dialect, table)."""

    __slots__ = (
        "create",
        "delete",
        "info",
        "insert",
        "list",
        "load",
        "schema_version",
        "update",
        "version",
    )

    def __init__(self, kind: Kind, table: str) -> None:
        checkpoints, meta = _tables(table)
        c = checkpoints.c
        key: BindParameter[bytes] = bindparam("run_key")
        self.create = _create_statements(kind, checkpoints, meta)
        values: dict[str, BindParameter[Any]] = {col.name: bindparam(col.name) for col in c}
        if kind == "postgresql":
            insert: Any = pg_dialect.insert(checkpoints).values(values)
            insert = insert.on_conflict_do_nothing(index_elements=[c.run_key])
        else:
            # A no-op assignment: an existing row is left alone and reports 0 rows
            # affected (without CLIENT.FOUND_ROWS), a new row 1.
            insert = mysql_dialect.insert(checkpoints).values(values)
            insert = insert.on_duplicate_key_update(run_key=c.run_key)
        self.insert = _sql(kind, insert)
        self.update = _sql(
            kind,
            update(checkpoints)
            .where(c.run_key == key, c.version == bindparam("expected"))
            .values(
                {
                    col.name: bindparam(col.name)
                    for col in c
                    if col.name not in ("run_key", "run_id")
                }
            ),
        )
        self.load = _sql(kind, select(c.version, c.document).where(c.run_key == key))
        self.version = _sql(kind, select(c.version).where(c.run_key == key))
        self.delete = _sql(kind, delete(checkpoints).where(c.run_key == key))
        self.list = _sql(kind, select(c.run_id))
        self.info = _sql(kind, select(c.run_id, c.status, c.step, c.total_steps, c.updated_at))
        self.schema_version = _sql(
            kind,
            select(meta.c.value).where(meta.c.key == bindparam("key", "schema_version")),
            literal=True,
        )


def _create_statements(kind: Kind, checkpoints: Table, meta: Table) -> list[str]:
    statements: list[str] = []
    for table in (checkpoints, meta):
        create = _sql(kind, CreateTable(table, if_not_exists=True))
        indexes = sorted(table.indexes, key=lambda ix: str(ix.name))
        if kind == "mysql" and indexes:
            # MySQL has no CREATE INDEX IF NOT EXISTS (MariaDB does): declare the indexes
            # inside CREATE TABLE IF NOT EXISTS, which also keeps creation one statement.
            inline = [_mysql_inline_index(ix) for ix in indexes]
            head, _, tail = create.rpartition("\n)")
            create = head + "".join(f",\n    {line}" for line in inline) + "\n)" + tail
            indexes = []
        statements.append(create)
        statements.extend(_sql(kind, CreateIndex(ix, if_not_exists=True)) for ix in indexes)
    value = {"key": "schema_version", "value": str(SCHEMA_VERSION)}
    if kind == "postgresql":
        seed: Any = pg_dialect.insert(meta).values(value).on_conflict_do_nothing()
    else:
        seed = mysql_dialect.insert(meta).values(value)
        seed = seed.on_duplicate_key_update(key=meta.c.key)
    statements.append(_sql(kind, seed, literal=True))
    return statements


def _mysql_inline_index(index: Index) -> str:
    created = _sql("mysql", CreateIndex(index))
    match = re.fullmatch(r"CREATE INDEX (\S+) ON \S+ (\(.*\))", created)
    if match is None:  # pragma: no cover - guards against a SQLAlchemy rendering change
        raise AssertionError(f"unexpected index DDL: {created}")
    return f"INDEX {match.group(1)} {match.group(2)}"


@functools.cache
def _statements(kind: Kind, table: str) -> _Statements:
    return _Statements(kind, table)


def schema_ddl(kind: Kind, table: str = DEFAULT_TABLE) -> str:
    """Return the SQL the store runs to create its schema (``backends/*/schema.sql``).

    Args:
        kind: ``"postgresql"`` or ``"mysql"`` (MySQL and MariaDB).
        table: The checkpoint table's name; the meta table is ``<table>_meta``.
    """
    if kind not in _DRIVERS:
        raise ConfigError(f"schema_ddl: kind must be 'postgresql' or 'mysql', got {kind!r}")
    how = (
        "in one transaction, holding an advisory lock on the table name"
        if kind == "postgresql"
        else "one by one (MySQL commits each DDL statement by itself)"
    )
    header = (
        f"-- Generated from stepstone.stores.sql (schema_ddl({kind!r})); do not edit by hand.\n"
        f"-- When the table is missing, SQLServerStore runs these statements {how}.\n"
    )
    return header + "\n\n".join(f"{s};" for s in _statements(kind, table).create) + "\n"


# --- errors -----------------------------------------------------------------------------

# PostgreSQL SQLSTATEs (https://www.postgresql.org/docs/current/errcodes-appendix.html).
_PG_UNAVAILABLE_PREFIXES: Final = ("08", "53", "57P", "40", "58")
_PG_PERMISSION: Final = frozenset({"42501"})
_PG_UNDEFINED_TABLE: Final = "42P01"
_PG_QUERY_CANCELED: Final = "57014"
# libpq reports connection failures without a SQLSTATE; recognise them by their text.
_PG_AUTH_TEXT: Final = (
    "password authentication failed",
    "no password supplied",
    "does not exist",  # role or database; the database case is refined below
    "is not permitted to log in",
    "pg_hba.conf",
    "permission denied",
    "authentication failed",
)

# MySQL / MariaDB error numbers.
_MY_UNAVAILABLE: Final = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1205,  # lock wait timeout exceeded
        1213,  # deadlock found; the statement was rolled back
        1927,  # connection was killed (MariaDB)
        2002,  # can't connect through socket
        2003,  # can't connect to server (refused, timed out)
        2005,  # unknown host
        2006,  # server has gone away
        2013,  # lost connection during query
        2055,  # lost connection (system error)
        3024,  # max_execution_time exceeded
    }
)
_MY_PERMISSION: Final = frozenset({1044, 1045, 1142, 1143, 1227, 1370, 1698})
_MY_NO_SUCH_TABLE: Final = 1146
_MY_UNKNOWN_DATABASE: Final = 1049
_MY_PACKET_TOO_LARGE: Final = frozenset({1153, 1301})


class _Guard:
    """Translates driver (and SQLAlchemy-wrapped) errors into stepstone's, in one place.

    A class rather than ``@contextmanager``: it sits on the save path, and entering a
    reusable object costs a fraction of creating a generator per call.
    """

    __slots__ = ("store",)

    def __init__(self, store: SQLServerStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        store = self.store
        original = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
        if isinstance(original, store._driver_error):
            store._drop_if_broken()
            raise self.translate(original) from original
        if isinstance(exc, sa_exc.SQLAlchemyError):
            raise StoreError(f"{store.where}: {store._scrub(str(exc))}") from exc

    def translate(self, exc: BaseException) -> StoreError:
        """Return the stepstone error for a driver error on this store's server."""
        store = self.store
        where = store.where
        text = store._scrub(" ".join(str(exc).split()))
        lowered = text.lower()
        if store.kind == "postgresql":
            state = getattr(exc, "sqlstate", None) or ""
            if state == _PG_UNDEFINED_TABLE:
                return StoreError(
                    f"{where}: table {store.table} is missing ({text}); run "
                    "`stepstone init` or backends/postgres/schema.sql"
                )
            if state.startswith("28") or state in _PG_PERMISSION:
                return StorePermissionError(f"{where}: permission denied ({text})")
            if state == _PG_QUERY_CANCELED or state.startswith(_PG_UNAVAILABLE_PREFIXES):
                return StoreUnavailable(f"{where}: server unavailable or busy ({text})")
            if state == "3D000" or (not state and "database" in lowered and "not exist" in lowered):
                return StoreError(f"{where}: the database does not exist ({text})")
            if not state and any(t in lowered for t in _PG_AUTH_TEXT):
                return StorePermissionError(f"{where}: authentication refused ({text})")
            if not state and isinstance(exc, store._operational_error):
                return StoreUnavailable(f"{where}: cannot reach the server ({text})")
            if "closed" in lowered and isinstance(exc, store._interface_error):
                return StoreUnavailable(f"{where}: connection closed ({text})")
            return StoreError(f"{where}: {type(exc).__name__}: {text}")
        args = getattr(exc, "args", ())
        code = args[0] if args and isinstance(args[0], int) else 0
        if code == _MY_NO_SUCH_TABLE:
            return StoreError(
                f"{where}: table {store.table} is missing ({text}); run `stepstone init` "
                "or backends/mysql/schema.sql"
            )
        if code in _MY_PERMISSION:
            return StorePermissionError(f"{where}: permission denied ({text})")
        if code in _MY_UNAVAILABLE:
            detail = (
                "the statement was rolled back; nothing was stored"
                if code in (1205, 1213)
                else "cannot reach the server or the connection broke"
            )
            return StoreUnavailable(f"{where}: {detail} ({text})")
        if code == _MY_UNKNOWN_DATABASE:
            return StoreError(f"{where}: the database does not exist ({text})")
        if code in _MY_PACKET_TOO_LARGE:
            return CheckpointTooLarge(
                f"{where}: statement over max_allowed_packet ({text})", -1, -1
            )
        if isinstance(exc, store._interface_error):
            return StoreUnavailable(f"{where}: connection closed ({text})")
        return StoreError(f"{where}: {type(exc).__name__}: {text}")


# --- fork safety ------------------------------------------------------------------------

# Connections a forked child inherited. The socket is shared with the parent: the child
# must never speak on it, and closing it normally would send the server a "terminate"
# message that ends the *parent's* session. Each is pointed at /dev/null in the child and
# kept referenced, so nothing the child does reaches the parent's connection.
_inherited: list[object] = []
_open_stores: weakref.WeakSet[SQLServerStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_open_stores):
        store._forget_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """Owns one thread's connection and cursor; weakly tracked so ``close`` reaches all.

    When a thread ends, its thread-local values are dropped, this object with them, and
    ``__del__`` closes the connection: threads that come and go leak nothing.
    """

    __slots__ = ("__weakref__", "conn", "cursor", "inherited")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cursor = conn.cursor()
        self.inherited = False

    def close(self) -> None:
        if not self.inherited:
            with contextlib.suppress(Exception):
                self.conn.close()

    def neutralize(self) -> None:
        """In a forked child: detach from the parent's socket without telling the server."""
        self.inherited = True
        with contextlib.suppress(Exception):
            sock = getattr(self.conn, "_sock", None)  # PyMySQL
            fileno = sock.fileno() if sock is not None else self.conn.fileno()
            if fileno >= 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                try:
                    os.dup2(devnull, fileno)
                finally:
                    os.close(devnull)

    def __del__(self) -> None:
        self.close()


# --- the store --------------------------------------------------------------------------


def _mask(config: str) -> str:
    """Hide the password of a URL we could not parse, for error messages."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", config)


def _import_driver(kind: Kind) -> ModuleType:
    # Imported here, not at the top: each server needs only its own driver installed.
    driver = _DRIVERS[kind]
    try:
        return importlib.import_module(driver)
    except ImportError as exc:
        raise ConfigError(
            f"the {kind}:// store needs the {driver} driver, which is not installed "
            f"({exc}): pip install 'stepstone[{_EXTRAS[kind]}]'"
        ) from exc


class SQLServerStore(Store):
    """Keeps checkpoints in a PostgreSQL or MySQL/MariaDB table, one row per run.

    Durability is the server's: a save returns after the server committed the single
    statement, which with default settings means its log was flushed to disk
    (``synchronous_commit=on`` on PostgreSQL, ``innodb_flush_log_at_trx_commit=1`` on
    InnoDB). ``doctor()`` reports both settings.

    Concurrency: any number of threads, processes and hosts may share the table. Each
    thread has its own connection, opened on first use. Saves are compare-and-swap in
    one statement; racing saves on one run serialize on the row lock and exactly one wins.

    Passwords: ``password`` argument, else the URL's, else ``STEPSTONE_SQL_PASSWORD``,
    else the driver's own sources (libpq's ``PGPASSWORD`` and ``~/.pgpass``). Prefer the
    environment: a URL is easily logged and shows in process listings. The password is
    never part of ``repr``, ``where`` or any error message.

    Open the store after ``fork``, or let the child open its own connections: a store
    inherited through ``fork`` leaves the parent's connections alone and reconnects.

    Args:
        url: SQLAlchemy-style URL, ``postgresql[+psycopg]://...`` or
            ``mysql[+pymysql]://...``, without query options.
        table: Checkpoint table name (lower case letters, digits, ``_``; up to 48).
        connect_timeout: Seconds to wait for a connection (PostgreSQL rounds up to
            whole seconds, minimum 2).
        password: Overrides the URL's and the environment's password.
    """

    scheme: ClassVar[str] = "postgresql"

    def __init__(
        self,
        url: str | URL,
        *,
        table: str = DEFAULT_TABLE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        password: str | None = None,
    ) -> None:
        if isinstance(url, str):
            text = url
            try:
                url = make_url(text)
            except Exception as exc:  # SQLAlchemy raises several types
                # ``from None``: the original's text may quote the URL, password included.
                raise ConfigError(
                    f"malformed SQL store URL {_mask(text)!r} ({type(exc).__name__}); "
                    f"forms: {_FORMS}"
                ) from None
        backend, _, driver = url.drivername.lower().partition("+")
        if backend not in _DRIVERS:
            raise ConfigError(f"not a SQL server URL: {backend!r}; forms: {_FORMS}")
        kind: Kind = backend
        if driver not in ("", _DRIVERS[kind]):
            supported = ", ".join(f"{k}+{d}" for k, d in _DRIVERS.items())
            raise ConfigError(
                f"driver {backend}+{driver} is not supported; supported: {supported} "
                f"(or plain {' / '.join(_DRIVERS)}). Forms: {_FORMS}"
            )
        if url.query:
            raise ConfigError(
                f"URL options {sorted(url.query)} are not allowed here; pass table= and "
                "connect_timeout= as arguments, or use from_config"
            )
        if not url.database:
            raise ConfigError(f"SQL store URL names no database; forms: {_FORMS}")
        if not isinstance(table, str) or _TABLE_NAME.fullmatch(table) is None:
            raise ConfigError(
                f"table={table!r} is not allowed: use 1-48 lower-case letters, digits and "
                "underscores, not starting with a digit"
            )
        if (
            isinstance(connect_timeout, bool)
            or not isinstance(connect_timeout, (int, float))
            or not math.isfinite(connect_timeout)
            or connect_timeout <= 0
        ):
            raise ConfigError(
                f"connect_timeout must be a positive number of seconds, got {connect_timeout!r}"
            )
        self._driver = _import_driver(kind)
        self.kind: Final[Kind] = kind
        # One class serves two schemes; ``Store.scheme`` is a ClassVar, so the instance's
        # own scheme goes in its __dict__ (reads find it first).
        self.__dict__["scheme"] = kind
        self.table: Final = table
        self.connect_timeout: Final = float(connect_timeout)
        self._password: str | None = (
            password
            if password is not None
            else url.password
            if url.password is not None
            else os.environ.get(PASSWORD_ENV)
        )
        # No password in here, ever: what repr and messages show.
        self.url: Final = url.set(drivername=f"{kind}+{_DRIVERS[kind]}").render_as_string(
            hide_password=True
        )
        self._connect_args = self._driver_args(url)
        self.where: Final = f"{self.url} table {table}"
        self._sql = _statements(kind, table)
        self._driver_error: type[BaseException] = self._driver.Error
        self._operational_error: type[BaseException] = self._driver.OperationalError
        self._interface_error: type[BaseException] = self._driver.InterfaceError
        self._guard = _Guard(self)
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._requests = 0
        self._local = threading.local()
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        self._closed = False
        self._max_bytes = _POSTGRES_MAX_BYTES
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        _open_stores.add(self)

    @classmethod
    def from_config(cls, config: str) -> Self:
        parts = urlsplit(config)
        scheme = parts.scheme.lower()
        if scheme.partition("+")[0] not in _DRIVERS:
            raise ConfigError(f"not a SQL server store config: {_mask(config)!r}; forms: {_FORMS}")
        if parts.fragment:
            raise ConfigError(f"SQL store config has a #fragment; forms: {_FORMS}")
        options = parse_options(parts.query, {"table": None, "connect_timeout": None}, _FORMS)
        timeout_text = options.get("connect_timeout", str(DEFAULT_CONNECT_TIMEOUT))
        try:
            timeout = float(timeout_text)
        except ValueError:
            timeout = -1.0
        if not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(
                f"option connect_timeout={timeout_text!r} must be a positive number of seconds"
            )
        bare = parts._replace(query="").geturl()
        return cls(bare, table=options.get("table", DEFAULT_TABLE), connect_timeout=timeout)

    def __repr__(self) -> str:
        return f"SQLServerStore({self.url!r}, table={self.table!r})"

    # --- counters -----------------------------------------------------------------------

    @property
    def requests_sent(self) -> int:
        """Statements sent to the server by this store (one round trip each)."""
        return self._requests

    def _count(self) -> None:
        with self._count_lock:
            self._requests += 1

    # --- connections --------------------------------------------------------------------

    def _driver_args(self, url: URL) -> dict[str, Any]:
        timeout = self.connect_timeout
        if self.kind == "postgresql":
            args: dict[str, Any] = {
                "host": url.host,
                "port": url.port,
                "user": url.username,
                "dbname": url.database,
                "connect_timeout": max(2, math.ceil(timeout)),
                "application_name": "stepstone",
                "autocommit": True,
            }
            if self._password is not None:
                args["password"] = self._password
            args = {k: v for k, v in args.items() if v is not None}
            # One round trip per statement, always: no separate Parse round trip to
            # prepare a statement (and nothing PgBouncer in transaction mode breaks).
            args["prepare_threshold"] = None
            return args
        args = {
            "host": url.host or "localhost",
            "port": url.port or _DEFAULT_PORTS["mysql"],
            "user": url.username,
            "password": self._password or "",
            "database": url.database,
            "connect_timeout": timeout,
            "autocommit": True,
            "charset": "utf8mb4",
            "collation": "utf8mb4_bin",
            # Not CLIENT.FOUND_ROWS: affected-row counts must mean rows *changed*.
            "client_flag": 0,
            # Let the server's max_allowed_packet be the only limit.
            "max_allowed_packet": 1 << 30,
        }
        return args

    def _new_connection(self) -> Any:
        conn = self._driver.connect(**self._connect_args)
        if self.kind == "mysql":
            found_rows = self._driver.constants.CLIENT.FOUND_ROWS
            if conn.client_flag & found_rows:  # pragma: no cover - a driver change
                conn.close()
                raise StoreError(f"{self.where}: the connection uses CLIENT.FOUND_ROWS")
        return conn

    def _connect(self) -> _Held:
        """Open this thread's connection (the slow path of every method)."""
        with self._lock:
            if self._closed:
                raise StoreError(f"{self.where}: the store is closed")
        with self._guard:
            conn = self._new_connection()
        held = _Held(conn)
        with self._lock:
            if self._closed:
                held.close()
                raise StoreError(f"{self.where}: the store is closed")
            self._held.add(held)
            self._local.held = held
        return held

    def _cursor(self) -> Any:
        try:
            return self._local.held.cursor
        except AttributeError:
            return self._connect().cursor

    def _drop_if_broken(self) -> None:
        """After a driver error: forget this thread's connection if the error broke it."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is None:
            return
        conn = held.conn
        broken = bool(conn.closed or conn.broken) if self.kind == "postgresql" else not conn.open
        if broken:
            with contextlib.suppress(AttributeError):
                del self._local.held
            self._held.discard(held)
            held.close()

    def _forget_connections(self) -> None:
        """In a forked child: never touch the inherited connections again."""
        for held in list(self._held):
            held.neutralize()
            _inherited.append(held)
        self._held = weakref.WeakSet()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()

    def _scrub(self, text: str) -> str:
        password = self._password
        return text.replace(password, "***") if password else text

    def _execute(self, cursor: Any, statement: str, params: Any = None) -> None:
        self._count()
        cursor.execute(statement, params)

    # --- schema -------------------------------------------------------------------------

    def _open(self) -> None:
        cursor = self._cursor()
        with self._guard:
            found = self._schema_version(cursor)
            if found is None:
                self._create_schema(cursor)
                found = self._schema_version(cursor)
            if self.kind == "mysql":
                self._execute(cursor, "SELECT @@max_allowed_packet")
                packet = int(cursor.fetchall()[0][0])
                self._max_bytes = max(0, packet - _MYSQL_STATEMENT_OVERHEAD)
        self._check_schema_version(found)

    def _check_schema_version(self, found: str | None) -> None:
        try:
            number = int(found or "")
        except ValueError:
            raise CorruptCheckpoint(
                f"{self.where}: {self.table}_meta has schema_version {found!r}, not a "
                "number; left untouched"
            ) from None
        if number > SCHEMA_VERSION:
            raise StoreError(
                f"{self.where}: schema version {number} is newer than this stepstone "
                f"supports ({SCHEMA_VERSION}); upgrade stepstone to open it"
            )
        if number < SCHEMA_VERSION:
            raise StoreError(
                f"{self.where}: schema version {number} is older than this stepstone "
                f"({SCHEMA_VERSION}) and no migration is known for it"
            )

    def _schema_version(self, cursor: Any) -> str | None:
        try:
            self._execute(cursor, self._sql.schema_version)
        except self._driver_error as exc:
            state = getattr(exc, "sqlstate", None)
            code = exc.args[0] if exc.args else None
            if state == _PG_UNDEFINED_TABLE or code == _MY_NO_SUCH_TABLE:
                return None
            raise
        rows = cursor.fetchall()
        return None if not rows else str(rows[0][0])

    def _create_schema(self, cursor: Any) -> None:
        try:
            if self.kind == "postgresql":
                # CREATE ... IF NOT EXISTS is not safe against a concurrent creator on
                # PostgreSQL (unique violation in pg_type): serialize creators on an
                # advisory lock, inside one transaction, so DDL and seed commit together.
                digest = hashlib.sha256(f"stepstone:{self.table}".encode()).digest()
                lock_key = int.from_bytes(digest[:8], "big", signed=True)
                with cursor.connection.transaction():
                    self._execute(cursor, "SELECT pg_advisory_xact_lock(%(k)s)", {"k": lock_key})
                    for statement in self._sql.create:
                        self._execute(cursor, statement)
            else:
                # Each MySQL DDL statement commits by itself; CREATE TABLE IF NOT EXISTS
                # waits on the metadata lock of a concurrent creator, then does nothing.
                for statement in self._sql.create:
                    self._execute(cursor, statement)
        except self._driver_error as exc:
            error = self._guard.translate(exc)
            if isinstance(error, StorePermissionError):
                folder = "postgres" if self.kind == "postgresql" else "mysql"
                raise StorePermissionError(
                    f"{error}. These credentials may not create the tables: have an "
                    f"administrator run backends/{folder}/schema.sql (schema_ddl("
                    f"{self.kind!r}, {self.table!r}) for this table name)"
                ) from exc
            raise error from exc

    def init(self) -> list[str]:
        """Create the checkpoint and meta tables if missing; report what is there."""
        cursor = self._cursor()
        with self._guard:
            self._create_schema(cursor)
            found = self._schema_version(cursor)
        self._check_schema_version(found)
        return [
            f"{self.kind} store {self.where}: tables {self.table} and {self.table}_meta "
            f"ready (schema version {found})"
        ]

    def doctor(self) -> list[Diagnosis]:
        """The base probe checks, plus schema version and the server's durability settings."""
        results = super().doctor()
        try:
            cursor = self._cursor()
            with self._guard:
                found = self._schema_version(cursor)
                if self.kind == "postgresql":
                    self._execute(
                        cursor,
                        "SELECT current_setting('synchronous_commit'), current_setting('fsync')",
                    )
                    sync, fsync = cursor.fetchall()[0]
                    durable = sync in ("on", "remote_write", "remote_apply") and fsync == "on"
                    setting = f"synchronous_commit={sync}, fsync={fsync}"
                else:
                    self._execute(cursor, "SELECT @@innodb_flush_log_at_trx_commit")
                    flush = int(cursor.fetchall()[0][0])
                    durable = flush == 1
                    setting = f"innodb_flush_log_at_trx_commit={flush}"
        except Exception as exc:
            results.append(Diagnosis("server settings", False, f"{type(exc).__name__}: {exc}"))
            return results
        results.append(
            Diagnosis(
                f"schema version {SCHEMA_VERSION}",
                found == str(SCHEMA_VERSION),
                "ok" if found == str(SCHEMA_VERSION) else f"found {found!r}",
            )
        )
        results.append(
            Diagnosis(
                "commits are flushed to disk",
                durable,
                setting if durable else f"{setting}: a server crash can lose returned saves",
            )
        )
        return results

    # --- the Store contract -------------------------------------------------------------

    @staticmethod
    def _key(run_id: str) -> bytes:
        return hashlib.sha256(run_id.encode("utf-8")).digest()

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        cursor = self._cursor()
        with self._guard:
            self._execute(cursor, self._sql.load, {"run_key": self._key(run_id)})
            rows = cursor.fetchall()
        if not rows:
            return None
        version, document = rows[0]
        source = f"{self.where} run {run_id!r}"
        return checkpoint_from_doc(decode_document(document, source), version, source)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        run_id = check_run_id(checkpoint.run_id)
        text, copy = encode_state(checkpoint.state)
        expected = checkpoint.version
        saved = checkpoint.stored(copy, text, new_version(expected), utcnow())
        document = encode_document(saved, text)
        self._check_size(run_id, document)
        created = saved.created_at
        updated = cast(datetime, saved.updated_at)
        if self.kind == "mysql":
            # DATETIME has no zone: store UTC wall time, read it back as UTC.
            created = None if created is None else _naive_utc(created)
            updated = _naive_utc(updated)
        params = {
            "run_key": self._key(run_id),
            "run_id": run_id,
            "version": saved.version,
            "status": saved.status,
            "step": saved.step,
            "total_steps": saved.total_steps,
            "created_at": created,
            "updated_at": updated,
            "document": document,
            "expected": expected,
        }
        statement = self._sql.insert if expected is None else self._sql.update
        cursor = self._cursor()
        try:
            with self._guard:
                # One statement in autocommit mode: its own atomic transaction, one round
                # trip. Nothing runs between the compare and the swap.
                _hooks.fire("sql.before_request")
                self._execute(cursor, statement, params)
                _hooks.fire("sql.request_sent")
                stored = cursor.rowcount
        except UnicodeEncodeError as exc:  # a lone surrogate in the state's strings
            raise InvalidState(
                f"state: a string holds a lone surrogate ({exc.reason}); a state must be "
                "encodable as UTF-8",
                "state",
            ) from exc
        if stored != 1:
            raise self._conflict(cursor, run_id, expected)
        return saved

    def _check_size(self, run_id: str, document: str) -> None:
        limit = self._max_bytes
        # Characters are at most 4 bytes of UTF-8 (8 once MySQL-escaped): only measure
        # bytes near the limit.
        factor = 8 if self.kind == "mysql" else 4
        if len(document) * factor <= limit:
            return
        data = document.encode("utf-8", "surrogatepass")
        if self.kind == "mysql":
            escaped = cast(str, self._driver.converters.escape_string(document))
            data = escaped.encode("utf-8", "surrogatepass")
        size = len(data)
        if size > limit:
            what = (
                "the server's max_allowed_packet less room for the statement"
                if self.kind == "mysql"
                else "PostgreSQL's 1 GiB value limit"
            )
            raise CheckpointTooLarge(
                f"run {run_id!r}: encoded checkpoint is {size} bytes on the wire, over "
                f"{what} ({limit} bytes) at {self.where}; nothing was stored",
                size,
                limit,
            )

    def _conflict(self, cursor: Any, run_id: str, expected: str | None) -> ConflictError:
        # Only on the (rare) losing path: read what is there, for the message.
        try:
            with self._guard:
                self._execute(cursor, self._sql.version, {"run_key": self._key(run_id)})
                rows = cursor.fetchall()
            stored = repr(rows[0][0]) if rows else "nothing (the run was deleted)"
        except StoreError:
            stored = "another version"
        return ConflictError(
            f"run {run_id!r}: expected version {expected!r}, stored {stored}", run_id
        )

    def delete(self, run_id: str) -> bool:
        check_run_id(run_id)
        cursor = self._cursor()
        with self._guard:
            self._execute(cursor, self._sql.delete, {"run_key": self._key(run_id)})
            return bool(cursor.rowcount > 0)

    def list_runs(self) -> Iterator[str]:
        cursor = self._cursor()
        with self._guard:
            self._execute(cursor, self._sql.list)
            rows = cursor.fetchall()
        return iter([row[0] for row in rows])

    def list_info(self) -> Iterator[RunInfo]:
        cursor = self._cursor()
        with self._guard:
            self._execute(cursor, self._sql.info)
            rows = cursor.fetchall()
        aware = self.kind == "postgresql"
        return iter(
            [
                RunInfo(
                    run_id,
                    cast("RunStatus", status),
                    step,
                    total_steps,
                    None
                    if updated_at is None
                    else updated_at.astimezone(UTC)
                    if aware
                    else updated_at.replace(tzinfo=UTC),
                )
                for run_id, status, step, total_steps, updated_at in rows
            ]
        )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held, self._held = list(self._held), weakref.WeakSet()
            self._local = threading.local()
        for item in held:
            # Best effort: every save already committed; the server ends the sessions.
            item.close()
        _open_stores.discard(self)


def _naive_utc(value: datetime) -> datetime:
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value
