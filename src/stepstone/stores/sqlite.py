"""SQLiteStore: checkpoints in one SQLite file, durable by default.

The logic is the SQL base's (``stepstone.stores._sql``); this module supplies SQLite's
hooks. Design, and why:

- Statements run on raw ``sqlite3`` connections, one per thread, opened directly: a
  durable save is an fsync plus a few microseconds of Python, and a pool checkout per
  save would be most of those microseconds. SQLAlchemy only describes the schema and
  compiles the statements, in ``tools/sqlgen.py``: the store reads their checked-in
  text (``_sql_text.py``) and never imports SQLAlchemy.
- A save is ONE conditional statement inside an explicit transaction: a first save is
  ``INSERT ... ON CONFLICT DO NOTHING``, a later one ``UPDATE ... WHERE version =
  :expected``; ``rowcount`` 0 means the compare-and-swap lost. An update never inserts,
  so a stale worker cannot bring back a deleted run. No read before the write.
- Connections run in sqlite3 autocommit mode (``isolation_level=None``) and the save path
  issues ``BEGIN IMMEDIATE`` itself: the write lock is taken up front, where the busy
  handler can wait for it, and the ``sqlite.in_transaction`` hook sees a statement that
  executed but has not committed.
- WAL journal: readers never block the writer and a commit is one append + fsync.
- Group commit (``_group.py``): concurrent saves of this process share one
  ``BEGIN IMMEDIATE`` ... ``COMMIT`` and so one fsync. The save that finds no commit in
  progress commits at once; saves arriving meanwhile are the next batch, run by the
  first of them. In a batch each save is its own statement with its own rowcount, so a
  lost compare-and-swap fails that save alone; a statement that raises is rolled back
  by SQLite alone (statement journal) and fails that save alone; if SQLite rolled back
  the whole transaction instead (disk full, I/O error), the other saves run again in a
  new one. A save returns only after the COMMIT containing it returned, at the same
  ``synchronous`` setting: durability is exactly a lone save's. Without this every save
  held the write lock through its own fsync and 64 threads went no faster than one.
- Async: a worker thread per call from a pool of this store's (up to ``ASYNC_THREADS``),
  each thread with its own connection, so up to that many tasks' saves meet in one
  group commit (the event loop's default pool has ``cpu_count + 4`` threads). The event
  loop never waits on an fsync or the write lock; sqlite3 releases the GIL while it does
  either. aiosqlite is the same design (a thread per connection) with a second queue in
  front, so it would add a hop and a dependency and remove nothing. A cancelled
  ``asave`` lets its thread finish: the transaction commits whole or rolls back, never
  torn.
- Wake-ups: ``listen`` watches ``PRAGMA data_version`` (``_sql.listen_sqlite``), which
  changes whenever another connection commits, looking when inotify reports a write to
  the WAL, so a worker wakes within milliseconds of a start or signal from another
  process and an idle one costs nothing.
- Foreign files are never modified: a file that has tables but no ``stepstone_meta``
  is refused before its journal mode is touched; a symlink at the path is refused.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self, cast
from urllib.parse import unquote, urlsplit

from .._checkpoint import Checkpoint
from .._errors import (
    CheckpointTooLarge,
    ConfigError,
    StoreError,
)
from .._observe import logger
from ._errortable import ErrorRule
from ._group import GroupCommit, Pending
from ._options import Option, parse, text
from ._sql import Held, SQLStore
from ._sql.engine import check_engine
from ._sql.errors import Undecodable
from ._sql.files import create_database_file
from ._sql.listen_sqlite import SQLiteListener
from ._sql.transactions import rollback, run_batch
from ._sqlite_dialect import ERRORS, _statements, schema_ddl

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["SQLiteStore", "schema_ddl"]

Synchronous = Literal["full", "normal", "extra"]

_FORMS: Final = (
    "sqlite:///relative/path.db (relative to the working directory) or "
    "sqlite:////absolute/path.db; options: ?synchronous=full|normal|extra&busy_timeout=MS"
)
_SYNCHRONOUS: Final = ("full", "normal", "extra")
DEFAULT_BUSY_TIMEOUT_MS: Final = 30_000
#: Threads of a store's pool for async calls: how many tasks' saves can share a commit.
ASYNC_THREADS: Final = 64


def _milliseconds(raw: str) -> int:
    if not raw.isdigit():
        raise ValueError(raw)
    return int(raw)


_OPTIONS: Final[tuple[Option[Any], ...]] = (
    text("synchronous", _SYNCHRONOUS),
    Option("busy_timeout", _milliseconds, "a whole number of milliseconds"),
)
TABLE: Final = "stepstone_checkpoints"
META: Final = "stepstone_meta"

# --- the store --------------------------------------------------------------------------


class SQLiteStore(SQLStore):
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
    its own connection. Concurrent saves of one process share a transaction and its
    fsync (group commit), each with its own compare-and-swap outcome, each returning
    after that commit. Writers of other processes queue on SQLite's write lock for up to
    ``busy_timeout_ms`` (then ``StoreUnavailable``), and readers never wait for writers.
    Not for network file systems (NFS, SMB): WAL needs shared memory between processes
    on one host.

    ``close`` while other threads are saving is safe: their calls finish (or, if they
    start after it, raise ``StoreError`` saying the store is closed).

    Open the store after ``fork``, not before: SQLite forbids carrying a connection across
    ``fork``. A store inherited through ``fork`` opens fresh connections in the child.

    Args:
        path: The database file; relative paths are resolved against the working
            directory now. Created with mode 0600 if missing. A symlink is refused.
        synchronous: ``"full"``, ``"normal"`` or ``"extra"``, as above.
        busy_timeout_ms: How long a write waits for another writer's lock.

    Raises:
        ConfigError: bad arguments.
        StoreError: the file belongs to another application (it has tables but no
            ``stepstone_meta``), or the path is a symlink; nothing was changed.
        CorruptCheckpoint: the file is not a SQLite database; it is left untouched.
    """

    scheme: ClassVar[str] = "sqlite"
    _DIALECT: ClassVar[str] = "sqlite"
    _SWEEP_IN_SAVE: ClassVar[bool] = True  # in the save's transaction (``_pp_commit``)
    claims_in_one_call: ClassVar[bool] = True  # one UPDATE ... RETURNING (one writer)
    saves_together: ClassVar[bool] = True  # save_many: one batch of the group commit
    durability_levels: ClassVar[tuple[str, ...]] = _SYNCHRONOUS
    kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType({"sqlite.in_transaction": False})
    counts_requests: ClassVar[bool] = False
    native_async: ClassVar[bool] = False
    pushes_wakeups: ClassVar[bool] = True
    _ERRORS: ClassVar[tuple[ErrorRule, ...]] = ERRORS
    _ISO_TIMES: ClassVar[bool] = True

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
        self.where = self.path
        self.table = TABLE
        self.synchronous: Final[Synchronous] = synchronous
        self.busy_timeout_ms: Final = busy_timeout_ms
        self._driver_error = sqlite3.Error
        self._max_length = 1_000_000_000  # SQLITE_MAX_LENGTH; replaced by the real limit
        self._setup()
        self._group = GroupCommit(self._commit_batch, self.path)
        self._pool: ThreadPoolExecutor | None = None
        self._sql = _statements()
        self._rows = {}
        self._create_file()
        self._open_first(self._open)

    def _open(self) -> None:
        held = self._first_connection()
        try:
            self._max_length = held.conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
            self._ensure_schema(held)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        finally:
            self._release(held)

    @classmethod
    def from_engine(
        cls,
        engine: Any,
        synchronous: Synchronous = "full",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> Self:
        """Open a store on a SQLAlchemy ``Engine`` (``sqlite+pysqlite``) of a database file.

        The engine's pool and ``connect`` events open every connection the store uses;
        the store borrows one per call and sets autocommit, WAL, ``synchronous`` and
        ``busy_timeout`` on it (the pragmas stay; autocommit is restored).

        Raises:
            ConfigError: not a sync SQLite engine on a file, or bad arguments.
        """
        check_engine(engine, "sqlite", ("pysqlite",))
        store = cls.__new__(cls)
        store._engine = engine  # noqa: SLF001 - the class's own constructor, before __init__
        store.__init__(engine.url.database or "", synchronous, busy_timeout_ms)  # type: ignore[misc]
        return store

    def _engine_session(self, conn: Any) -> tuple[Any, Callable[[], None]]:
        level = conn.isolation_level
        conn.isolation_level = None  # autocommit: we issue BEGIN IMMEDIATE where we write
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms:d}")
        self._set_pragmas(conn)

        def restore() -> None:
            conn.isolation_level = level

        return conn, restore

    @classmethod
    def from_config(cls, config: str) -> Self:
        """Open ``sqlite:///path.db?synchronous=...&busy_timeout=...``.

        Raises:
            ConfigError: the string is malformed; the message lists the forms.
        """
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
        options = parse(parts.query, _OPTIONS, _FORMS)
        return cls(
            path,
            synchronous=cast(Synchronous, options.get("synchronous", "full")),
            busy_timeout_ms=cast(int, options.get("busy_timeout", DEFAULT_BUSY_TIMEOUT_MS)),
        )

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    # --- files and connections ----------------------------------------------------------

    def _create_file(self) -> None:
        create_database_file(self.path, durable=self.synchronous != "normal")

    def _raw_connection(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_ms / 1000,
            isolation_level=None,  # autocommit: we issue BEGIN IMMEDIATE where we write
            check_same_thread=False,  # close() may run on another thread, under our lock
        )
        # busy_timeout first, so switching to WAL waits for a concurrent opener.
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms:d}")
        return conn

    def _set_pragmas(self, conn: sqlite3.Connection) -> None:
        mode = self._switch_to_wal(conn)
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreError(
                f"{self.path}: SQLite refused WAL journal mode (got {mode!r}); is the file on "
                "a network file system? Use a local disk"
            )
        conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")

    def _switch_to_wal(self, conn: sqlite3.Connection) -> Any:
        """Run ``PRAGMA journal_mode = WAL``, retrying SQLite's deadlock refusal.

        Switching a rollback-journal file needs its exclusive lock. When two processes
        switch at once, each holds a shared lock and one asks for more: SQLite refuses
        that one at once ("database is locked") without calling the busy handler, since
        waiting could deadlock. The refusal drops its lock, so retrying is safe; keep
        trying for the whole busy_timeout, as a busy handler would.
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        pause = 0.001
        while True:
            try:
                return conn.execute("PRAGMA journal_mode = WAL").fetchone()
            except sqlite3.OperationalError as exc:
                locked = "database is locked" in str(exc)
                if not locked or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _first_connection(self) -> Held:
        """Refuse another application's file, then open the opening thread's connection."""
        self._check_foreign()
        return self._connect()

    def _check_foreign(self) -> None:
        """Raise ``StoreError`` if the file has tables but no stepstone meta table.

        Read on a connection of its own, closed before any other opens: a connection
        that has read the schema and then switches the journal mode can get SQLITE_BUSY
        at once, without the busy handler, when another process switches it at the same
        time.
        """
        try:
            conn = self._raw_connection()
            try:
                rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                names = {row[0] for row in rows.fetchall()}
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        if names and META not in names:
            shown = ", ".join(sorted(names)[:5])
            raise StoreError(
                f"{self.path}: belongs to another application (tables {shown}; no "
                f"{META}); refusing to modify it. Give stepstone its own file"
            )

    def _open_connection(self) -> tuple[Any, Any]:
        conn = self._raw_connection()
        try:
            self._set_pragmas(conn)
        except BaseException:
            conn.close()
            raise
        return conn, conn

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (for tests and tools)."""
        return cast(sqlite3.Connection, self._thread_held().conn)

    def _detach(self, held: Held) -> None:
        # SQLite forbids using an inherited connection, and closing it would drop the
        # child's own POSIX locks on the file: keep it open and unused.
        pass

    def _error_code(self, exc: BaseException) -> int | str | None:
        return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF

    def _decoding_error(self, exc: BaseException) -> bool:
        return "could not decode to utf-8" in str(exc).lower()

    # --- statements ---------------------------------------------------------------------

    def _run(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        cursor = held.conn.execute(sql, params or ())
        return cursor.rowcount, cursor.fetchall()

    def _run_batch(self, held: Held, items: list[Pending]) -> None:
        run_batch(held.conn, items, self._statement_error)

    # --- salvaging a listing after an undecodable row -----------------------------------

    # SQLite's key *is* the run_id, the very text that may not decode: the keys are read
    # as bytes, a run_id that is not UTF-8 is that run's error (logged), and each other
    # row is read by itself, so one bad row hides no other run.

    def _run_keys(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        conn: sqlite3.Connection = held.conn
        conn.text_factory = bytes
        try:
            return self._run(held, sql, params)
        finally:
            conn.text_factory = str

    def _salvage_key(self, raw: Any) -> Any:
        try:
            return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError as exc:
            shown = raw.decode("utf-8", "backslashreplace")
            logger.warning(
                "skipping run %r in listing: %s: its run_id is not UTF-8 (%s); left untouched",
                shown,
                self.where,
                exc,
            )
            return None

    def _skip_undecodable(self, key: Any, exc: Undecodable) -> None:
        logger.warning("skipping run %r in listing: %s", key, self._undecodable(key, exc))

    # --- async ----------------------------------------------------------------------------

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        """Async ``save``; same contract, same errors. Lands whole or not at all.

        Runs ``save`` on a thread of this store's pool, so concurrent tasks' saves share
        a group commit. A cancelled call stops waiting; its thread finishes the save.
        """
        import asyncio  # noqa: PLC0415
        import contextvars  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        call = contextvars.copy_context().run
        return await loop.run_in_executor(self._executor(), call, self.save, checkpoint)

    def _executor(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

            with self._lock:
                if self._closed:
                    raise self._closed_error()
                pool = self._pool
                if pool is None:
                    pool = self._pool = ThreadPoolExecutor(
                        ASYNC_THREADS, thread_name_prefix="stepstone-sqlite"
                    )
        return pool

    def close(self) -> None:
        """Close every connection; calls in flight finish first. Closing twice is allowed.

        A call that starts after ``close`` raises ``StoreError`` saying the store is
        closed; saves waiting in a group commit either land with their batch or raise
        that error.
        """
        super().close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def listen(self, ring: Callable[[], None]) -> SQLiteListener:
        """Watch the file for commits by other connections; call ``ring`` after each.

        A thread reads ``PRAGMA data_version`` on a connection of its own when inotify
        reports a write to the ``-wal`` file (without inotify: every 25 ms);
        ``_sql.listen_sqlite`` says why that and not a notification table. Nothing to
        ``announce``: a commit is the announcement.

        Raises:
            StoreError: the store is closed, or the file cannot be read.
        """
        if self._closed:
            raise self._closed_error()
        try:
            listener = SQLiteListener(self.path, self.busy_timeout_ms, ring)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        listener.start()
        return listener

    def _forget_connections(self) -> None:
        # A forked child has none of the pool's threads: it starts its own when needed.
        super()._forget_connections()
        self._pool = None

    def _db_time(self, value: datetime | None) -> Any:
        if value is None:
            return None
        # Text that sorts as time: always UTC ("+00:00"). Without microseconds isoformat
        # leaves them out, and "+" sorts before ".", so the order still holds.
        if value.tzinfo is not UTC:
            value = value.astimezone(UTC)
        return value.isoformat()

    def _py_time(self, value: Any) -> datetime | None:
        if value is None:
            return None
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError(f"timestamp {value!r} has no time zone")
        return parsed

    def _check_size(self, run_id: str, document: str) -> None:
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

    # --- schema -------------------------------------------------------------------------

    def _schema_version(self, held: Held) -> str | None:
        try:
            row = held.conn.execute(self._sql.schema_version).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        return None if row is None else str(row[0])

    def _create_schema(self, held: Held) -> None:
        # Concurrent openers of a new file serialize on the write lock; IF NOT EXISTS and
        # ON CONFLICT DO NOTHING make the loser's statements no-ops.
        self._in_transaction(held, [*self._sql.create, self._pieces_sql.create], None)

    def _migrate(self, held: Held, found: int) -> None:
        # Under the write lock, re-read the version: a concurrent opener may have
        # migrated already, and ALTER TABLE ADD COLUMN must run exactly once.
        self._in_transaction(held, [self._pieces_sql.create, *self._sql.migrate_v1], "1")

    def _in_transaction(self, held: Held, statements: list[str], only_at: str | None) -> None:
        conn: sqlite3.Connection = held.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if only_at is None or self._schema_version(held) == only_at:
                for statement in statements:
                    conn.execute(statement)
            conn.commit()
        except BaseException:
            rollback(conn)
            raise
