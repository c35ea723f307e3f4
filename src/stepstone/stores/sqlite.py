"""SQLiteStore: checkpoints in one SQLite file, durable by default.

Design, and why:

- SQLAlchemy Core *describes* the schema and *builds* the statements (Table objects, the
  dialect's ``INSERT ... ON CONFLICT``), so the DDL in ``backends/sqlite/schema.sql`` and
  the SQL we run come from one definition. Everything is compiled to SQL text once, when
  the module is imported; no SQLAlchemy execution machinery runs per call.
- Statements run on raw ``sqlite3`` connections, one per thread, taken from the engine
  with ``raw_connection()`` and detached from its pool: a durable save is an fsync plus a
  few microseconds of Python, and a pool checkout or ``Connection.execute`` per save would
  be most of those microseconds. The thread-local *is* the pool.
- A save is ONE conditional statement inside an explicit transaction: a first save is
  ``INSERT ... ON CONFLICT DO NOTHING``, a later one ``UPDATE ... WHERE version =
  :expected``; ``rowcount`` 0 means the compare-and-swap lost. An update never inserts,
  so a stale worker cannot bring back a deleted run. No read before the write, so there
  is no window between check and write and no extra statement.
- Connections run in sqlite3 autocommit mode (``isolation_level=None``) and the save path
  issues ``BEGIN IMMEDIATE`` itself: the write lock is taken up front, where the busy
  handler can wait for it, and the ``sqlite.in_transaction`` hook sees a statement that
  executed but has not committed.
- WAL journal: readers never block the writer and a commit is one append + fsync.
- Driver errors are translated in one place, ``_Guard``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self, cast
from urllib.parse import unquote, urlsplit

from sqlalchemy import (
    Column,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    create_engine,
    delete,
    event,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool
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
    StoreError,
    StorePermissionError,
    StoreUnavailable,
)
from .._store import RunInfo, Store
from ._common import new_version, parse_options

if TYPE_CHECKING:
    from .._checkpoint import RunStatus

__all__ = ["SQLiteStore", "schema_ddl"]

Synchronous = Literal["full", "normal", "extra"]

_FORMS: Final = (
    "sqlite:///relative/path.db (relative to the working directory) or "
    "sqlite:////absolute/path.db; options: ?synchronous=full|normal|extra&busy_timeout=MS"
)
_SYNCHRONOUS: Final = ("full", "normal", "extra")
DEFAULT_BUSY_TIMEOUT_MS: Final = 30_000

# --- schema -----------------------------------------------------------------------------

metadata = MetaData()

checkpoints = Table(
    "stepstone_checkpoints",
    metadata,
    # A rowid table, not WITHOUT ROWID: documents are often larger than the ~1/20 of a page
    # where SQLite recommends WITHOUT ROWID.
    Column("run_id", Text, primary_key=True),
    Column("version", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("step", Integer, nullable=False),
    Column("total_steps", Integer),
    Column("created_at", Text),
    Column("updated_at", Text, nullable=False),
    # Last, so listing (which reads the columns before it) never touches overflow pages.
    Column("document", Text, nullable=False),
)
# Listing and pruning by age, and finding failed or running runs, read only these.
Index("ix_stepstone_checkpoints_updated_at", checkpoints.c.updated_at)
Index("ix_stepstone_checkpoints_status", checkpoints.c.status, checkpoints.c.updated_at)

meta = Table(
    "stepstone_meta",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)

_DIALECT: Final = sqlite_dialect.dialect(paramstyle="named")


def _sql(statement: Any, literal: bool = False) -> str:
    kwargs = {"literal_binds": True} if literal else {}
    text = str(statement.compile(dialect=_DIALECT, compile_kwargs=kwargs))
    return "\n".join(line.rstrip().replace("\t", "    ") for line in text.strip().splitlines())


def _schema_statements() -> list[str]:
    statements: list[str] = []
    for table in metadata.sorted_tables:
        statements.append(_sql(CreateTable(table, if_not_exists=True)))
        for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
            statements.append(_sql(CreateIndex(index, if_not_exists=True)))
    statements.append(
        _sql(
            sqlite_dialect.insert(meta)
            .values(key="schema_version", value=str(SCHEMA_VERSION))
            .on_conflict_do_nothing(),
            literal=True,
        )
    )
    return statements


def schema_ddl() -> str:
    """Return the SQL the store runs to create its schema, as in ``backends/sqlite/schema.sql``."""
    header = (
        "-- Generated from stepstone.stores.sqlite (schema_ddl()); do not edit by hand.\n"
        "-- SQLiteStore runs these statements in one BEGIN IMMEDIATE transaction on open.\n"
    )
    return header + "\n\n".join(f"{s};" for s in _SCHEMA_SQL) + "\n"


def _build_create() -> str:
    # A first save inserts or, if the run exists, changes nothing: rowcount 0, a conflict.
    insert = sqlite_dialect.insert(checkpoints).values(
        {c.name: bindparam(c.name) for c in checkpoints.c}
    )
    return _sql(insert.on_conflict_do_nothing(index_elements=[checkpoints.c.run_id]))


def _build_update() -> str:
    # A later save updates only the row still holding the expected version. It must never
    # insert: a stale worker saving after the run was deleted would bring it back.
    return _sql(
        update(checkpoints)
        .where(checkpoints.c.run_id == bindparam("run_id"))
        .where(checkpoints.c.version == bindparam("expected"))
        .values({c.name: bindparam(c.name) for c in checkpoints.c if c.name != "run_id"})
    )


_RUN: Final[BindParameter[str]] = bindparam("run_id")
_SCHEMA_SQL: Final = _schema_statements()
_CREATE: Final = _build_create()
_UPDATE: Final = _build_update()
_LOAD: Final = _sql(
    select(checkpoints.c.version, checkpoints.c.document).where(checkpoints.c.run_id == _RUN)
)
_VERSION: Final = _sql(select(checkpoints.c.version).where(checkpoints.c.run_id == _RUN))
_DELETE: Final = _sql(delete(checkpoints).where(checkpoints.c.run_id == _RUN))
_LIST: Final = _sql(select(checkpoints.c.run_id))
_INFO: Final = _sql(
    select(
        checkpoints.c.run_id,
        checkpoints.c.status,
        checkpoints.c.step,
        checkpoints.c.total_steps,
        checkpoints.c.updated_at,
    )
)
_SCHEMA_VERSION: Final = _sql(
    select(meta.c.value).where(meta.c.key == bindparam("key", "schema_version")), literal=True
)

# --- errors -----------------------------------------------------------------------------

# Primary result codes (extended codes carry them in the low byte).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_TOOBIG = 11, 13, 14, 18
_SQLITE_AUTH, _SQLITE_NOTADB = 23, 26


class _Guard:
    """Translates sqlite3 (and SQLAlchemy-wrapped) errors into stepstone's, in one place.

    A class rather than ``@contextmanager``: it sits on the save path, and entering a
    reusable object costs a fraction of creating a generator per call.
    """

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

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
        original = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
        if isinstance(original, sqlite3.Error):
            raise self.translate(original) from original
        if isinstance(exc, sa_exc.SQLAlchemyError):
            raise StoreError(f"{self.path}: {exc}") from exc

    def translate(self, exc: sqlite3.Error) -> StoreError:
        """Return the stepstone error for a sqlite3 error on this store's file."""
        path = self.path
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        text = str(exc)
        lowered = text.lower()
        if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in lowered or "busy" in lowered:
            return StoreUnavailable(
                f"{path}: database is locked by another connection and stayed locked for the "
                f"whole busy_timeout ({text}); raise busy_timeout or shorten other writers"
            )
        if code in (_SQLITE_NOTADB, _SQLITE_CORRUPT) or "not a database" in lowered:
            return CorruptCheckpoint(
                f"{path}: not a SQLite database or corrupted ({text}); left untouched"
            )
        if code in (_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_AUTH) or "readonly" in lowered:
            return StorePermissionError(f"{path}: permission denied ({text})")
        if code == _SQLITE_CANTOPEN or "unable to open" in lowered:
            parent = os.path.dirname(path) or "."
            if not os.path.isdir(parent):
                return StoreError(f"{path}: cannot open: directory {parent} does not exist")
            if not os.access(parent, os.W_OK | os.X_OK) or (
                os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK)
            ):
                return StorePermissionError(
                    f"{path}: cannot open: no read/write permission on the file or its "
                    f"directory ({text})"
                )
            return StoreError(f"{path}: cannot open the database file ({text})")
        if code == _SQLITE_FULL:
            return StoreError(f"{path}: disk or database full ({text})")
        if code == _SQLITE_TOOBIG:
            return CheckpointTooLarge(f"{path}: checkpoint too large ({text})", -1, -1)
        if isinstance(exc, sqlite3.ProgrammingError) and "closed" in lowered:
            return StoreError(f"{path}: the store is closed")
        return StoreError(f"{path}: {type(exc).__name__}: {text}")


# --- fork safety ------------------------------------------------------------------------

# Connections a forked child inherited. SQLite forbids using them in the child, and closing
# them would drop the child's own POSIX locks on the file (closing any descriptor of a file
# releases all of the process's fcntl locks on it), so they are kept open and unused.
_inherited: list[object] = []
_open_stores: weakref.WeakSet[SQLiteStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_open_stores):
        store._forget_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """Owns one thread's connection; weakly tracked so ``close`` can reach every thread's.

    When a thread ends, its thread-local values are dropped, this object with them, and
    the connection is closed by sqlite3's finalizer: threads that come and go leak nothing.
    """

    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


# --- the store --------------------------------------------------------------------------


class SQLiteStore(Store):
    """Keeps checkpoints in a SQLite file (WAL journal), one row per run.

    Durability, chosen with ``synchronous`` (config ``?synchronous=``):

    - ``full`` (default): every commit fsyncs the WAL. A save that returned survives a
      process crash *and* a power cut or kernel panic (given storage that honours fsync).
    - ``normal``: WAL with ``synchronous=NORMAL``; fsync happens only at checkpoints. A save
      that returned survives a process crash, but a power cut may lose the last commits
      (the database stays consistent: those runs resume from an earlier step, and the
      runner re-executes the lost steps). Several times faster on slow disks.
    - ``extra``: like ``full`` plus the additional syncs SQLite performs at this level; for
      file systems where you want belt and braces. Slowest.

    Concurrency: any number of threads and processes may share the file. Each thread gets
    its own connection; writers queue on SQLite's write lock for up to ``busy_timeout_ms``
    (then ``StoreUnavailable``), and readers never wait for writers. Not for network file
    systems (NFS, SMB): WAL needs shared memory between processes on one host.

    Open the store after ``fork``, not before: SQLite forbids carrying a connection across
    ``fork``. A store inherited through ``fork`` opens fresh connections in the child.

    Args:
        path: The database file; relative paths are resolved against the working
            directory now. Created with mode 0600 if missing.
        synchronous: ``"full"``, ``"normal"`` or ``"extra"``, as above.
        busy_timeout_ms: How long a write waits for another writer's lock.
    """

    scheme: ClassVar[str] = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        synchronous: Synchronous = "full",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> None:
        raw = os.fspath(path)
        if not isinstance(raw, str) or raw in ("", ":memory:"):
            raise ConfigError(
                f"SQLiteStore needs a database file path, got {raw!r}; for a store that does "
                "not outlive the process use memory://"
            )
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError(
                f"synchronous={synchronous!r} is not allowed; choose one of: "
                f"{', '.join(_SYNCHRONOUS)}"
            )
        if type(busy_timeout_ms) is not int or busy_timeout_ms < 0:
            raise ConfigError(
                f"busy_timeout_ms must be a non-negative int, got {busy_timeout_ms!r}"
            )
        self.path: Final = os.path.abspath(raw)
        self.synchronous: Final[Synchronous] = synchronous
        self.busy_timeout_ms: Final = busy_timeout_ms
        self._guard = _Guard(self.path)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        self._closed = False
        self._max_length = 1_000_000_000  # SQLITE_MAX_LENGTH; replaced by the real limit

        self._create_file()
        # NullPool: connections are detached and cached per thread, so the engine never
        # keeps one; it only creates them and runs the "connect" listener on each.
        self._engine = create_engine(
            URL.create("sqlite", database=self.path),
            poolclass=NullPool,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
        )
        event.listen(self._engine, "connect", self._on_connect)
        try:
            conn = self._connect()
            with self._guard:
                self._max_length = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
                self._ensure_schema(conn)
        except BaseException:
            self.close()
            raise
        _open_stores.add(self)

    @classmethod
    def from_config(cls, config: str) -> Self:
        parts = urlsplit(config)
        if parts.scheme.lower() != "sqlite":
            raise ConfigError(f"not a sqlite store config: {config!r}; forms: {_FORMS}")
        if parts.fragment:
            raise ConfigError(f"sqlite store config {config!r} has a #fragment; forms: {_FORMS}")
        if parts.netloc:
            raise ConfigError(
                f"sqlite store config {config!r} has a host part ({parts.netloc!r}); "
                f"a SQLite file is local. Forms: {_FORMS}"
            )
        if not config.lower().startswith("sqlite://"):
            raise ConfigError(f"malformed sqlite store config {config!r}; forms: {_FORMS}")
        path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        if path in ("", ":memory:"):
            raise ConfigError(
                f"sqlite store config {config!r} names no file: an in-memory SQLite database "
                f"is not durable, use memory:// for that. Forms: {_FORMS}"
            )
        options = parse_options(
            parts.query, {"synchronous": _SYNCHRONOUS, "busy_timeout": None}, _FORMS
        )
        timeout = options.get("busy_timeout", str(DEFAULT_BUSY_TIMEOUT_MS))
        if not timeout.isdigit():
            raise ConfigError(
                f"option busy_timeout={timeout!r} must be a whole number of milliseconds"
            )
        return cls(
            path,
            synchronous=cast(Synchronous, options.get("synchronous", "full")),
            busy_timeout_ms=int(timeout),
        )

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    # --- connections --------------------------------------------------------------------

    def _create_file(self) -> None:
        # Create the file ourselves with 0600 before SQLite does (it would use 0644): SQLite
        # gives the -wal and -shm files the database file's permissions, so they follow.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return
        except FileNotFoundError as exc:
            raise StoreError(
                f"{self.path}: cannot create the database: directory "
                f"{os.path.dirname(self.path)} does not exist"
            ) from exc
        except PermissionError as exc:
            raise StorePermissionError(
                f"{self.path}: cannot create the database: permission denied"
            ) from exc
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create the database: {exc}") from exc
        os.close(fd)
        if self.synchronous != "normal":
            # The new directory entry must survive a power cut too, not just what is in it.
            _fsync_dir(os.path.dirname(self.path))

    def _on_connect(self, dbapi_connection: Any, connection_record: Any) -> None:
        conn = cast(sqlite3.Connection, dbapi_connection)
        # Autocommit at the driver: we issue BEGIN IMMEDIATE ourselves where we write.
        conn.isolation_level = None
        # busy_timeout first, so switching to WAL waits for a concurrent opener.
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms:d}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreError(
                f"{self.path}: SQLite refused WAL journal mode (got {mode!r}); is the file on "
                "a network file system? Use a local disk"
            )
        conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")

    def _connect(self) -> sqlite3.Connection:
        """Open this thread's connection (the slow path of every method)."""
        with self._lock:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            with self._guard:
                fairy = self._engine.raw_connection()
                conn = cast(sqlite3.Connection, fairy.driver_connection)
                # Take it out of the pool's hands: closing or collecting the proxy must not
                # close the connection this thread keeps.
                fairy.detach()
            held = _Held(conn)
            self._held.add(held)
            local = self._local
            local.held = held
            local.conn = conn
        return conn

    def _conn(self) -> sqlite3.Connection:
        try:
            return cast(sqlite3.Connection, self._local.conn)
        except AttributeError:
            return self._connect()

    def _forget_connections(self) -> None:
        """In a forked child: keep the inherited connections alive but never use them."""
        _inherited.extend(self._held)
        self._held = weakref.WeakSet()
        self._local = threading.local()
        self._lock = threading.Lock()

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        found = self._schema_version(conn)
        if found is None:
            # Concurrent openers of a new file serialize on the write lock; IF NOT EXISTS
            # and ON CONFLICT DO NOTHING make the loser's statements no-ops.
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA_SQL:
                    conn.execute(statement)
                found = self._schema_version(conn)
                conn.commit()
            except BaseException:
                _rollback(conn)
                raise
        try:
            number = int(found or "")
        except ValueError:
            raise CorruptCheckpoint(
                f"{self.path}: stepstone_meta has schema_version {found!r}, not a number; "
                "left untouched"
            ) from None
        if number > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: database schema version {number} is newer than this stepstone "
                f"supports ({SCHEMA_VERSION}); upgrade stepstone to open it"
            )
        if number < SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: database schema version {number} is older than this stepstone "
                f"({SCHEMA_VERSION}) and no migration is known for it"
            )

    @staticmethod
    def _schema_version(conn: sqlite3.Connection) -> str | None:
        try:
            row = conn.execute(_SCHEMA_VERSION).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        return None if row is None else str(row[0])

    # --- the Store contract -------------------------------------------------------------

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        with self._guard:
            rows = self._conn().execute(_LOAD, {"run_id": run_id}).fetchall()
        if not rows:
            return None
        version, document = rows[0]
        source = f"{self.path} run {run_id!r}"
        return checkpoint_from_doc(decode_document(document, source), version, source)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        run_id = check_run_id(checkpoint.run_id)
        text, copy = encode_state(checkpoint.state)
        expected = checkpoint.version
        saved = checkpoint.stored(copy, text, new_version(expected), utcnow())
        document = encode_document(saved, text)
        # Characters are at most 4 bytes of UTF-8: only measure bytes near the limit.
        if len(document) * 4 > self._max_length:
            size = len(document.encode("utf-8", "surrogatepass"))
            if size > self._max_length:
                raise CheckpointTooLarge(
                    f"run {run_id!r}: encoded checkpoint is {size} bytes, over SQLite's "
                    f"limit of {self._max_length}; nothing was stored",
                    size,
                    self._max_length,
                )
        created = saved.created_at
        params = {
            "run_id": run_id,
            "version": saved.version,
            "status": saved.status,
            "step": saved.step,
            "total_steps": saved.total_steps,
            "created_at": None if created is None else created.isoformat(),
            "updated_at": cast(datetime, saved.updated_at).isoformat(),
            "document": document,
            "expected": expected,
        }
        conn = self._conn()
        with self._guard:
            conn.execute("BEGIN IMMEDIATE")
            try:
                statement = _CREATE if expected is None else _UPDATE
                stored = conn.execute(statement, params).rowcount
                if stored != 1:
                    _rollback(conn)
                    raise self._conflict(conn, run_id, expected)
                _hooks.fire("sqlite.in_transaction")
                conn.commit()
            except BaseException:
                _rollback(conn)
                raise
        return saved

    def _conflict(
        self, conn: sqlite3.Connection, run_id: str, expected: str | None
    ) -> ConflictError:
        # Only on the (rare) losing path: read what is there, for the message.
        try:
            row = conn.execute(_VERSION, {"run_id": run_id}).fetchone()
            stored = repr(row[0]) if row is not None else "nothing"
        except sqlite3.Error:
            stored = "another version"
        return ConflictError(
            f"run {run_id!r}: expected version {expected!r}, stored {stored}", run_id
        )

    def delete(self, run_id: str) -> bool:
        check_run_id(run_id)
        with self._guard:
            # Autocommit: a single DELETE is its own atomic, durable transaction.
            return self._conn().execute(_DELETE, {"run_id": run_id}).rowcount > 0

    def list_runs(self) -> Iterator[str]:
        with self._guard:
            rows = self._conn().execute(_LIST).fetchall()
        # Fetched eagerly: an open cursor would pin a read snapshot (blocking WAL
        # checkpoints) for as long as the caller takes to iterate.
        return iter([row[0] for row in rows])

    def list_info(self) -> Iterator[RunInfo]:
        with self._guard:
            rows = self._conn().execute(_INFO).fetchall()
        return iter(
            [
                RunInfo(
                    run_id,
                    cast("RunStatus", status),
                    step,
                    total_steps,
                    datetime.fromisoformat(updated_at) if updated_at else None,
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
            # Best effort: the file is consistent whether or not a close fails.
            with contextlib.suppress(sqlite3.Error):
                item.conn.close()
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.dispose()
        _open_stores.discard(self)


def _rollback(conn: sqlite3.Connection) -> None:
    # The original error matters more; SQLite rolls back on close anyway.
    with contextlib.suppress(sqlite3.Error):
        conn.rollback()


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; nothing more we can do
    finally:
        os.close(fd)
