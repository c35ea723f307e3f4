"""PostgresStore: checkpoints in a PostgreSQL table, through psycopg 3 (sync and async).

The logic is the SQL base's (``stepstone.stores._sql``); this module supplies
PostgreSQL's hooks: connection set-up, the error table, the advisory-locked schema
creation and migration. Design, and why:

- Autocommit connections; every store operation is ONE statement, so ONE round trip,
  its own atomic, durable transaction: a first save is ``INSERT ... ON CONFLICT
  (run_key) DO NOTHING`` (0 rows: the run exists -> ``ConflictError``), later saves
  ``UPDATE ... WHERE run_key = :key AND version = :expected`` (0 rows: the version moved
  on or the run was deleted). PostgreSQL re-checks the ``WHERE`` against the latest
  committed row after waiting for a concurrent writer's row lock (EvalPlanQual), so
  exactly one of several racing saves wins.
- psycopg's automatic server-side prepare is off (``prepare_threshold`` None): preparing
  costs a separate round trip per statement and connection, and unnamed statements keep
  every call at exactly one round trip (and work behind PgBouncer).
- No group commit in the client: PostgreSQL flushes the WAL of concurrently committing
  sessions together (its own group commit), so concurrent saves on separate connections
  already share flushes, and each save stays one statement, one round trip, even when
  alone. The backend READMEs give the figures. A save with pieces is one transaction in
  one round trip (psycopg's pipeline): BEGIN, the swap, its pieces, COMMIT; each piece
  is inserted only if the swap landed, so a lost swap commits nothing.
- Async: ``psycopg.AsyncConnection``, the same statements, parameters and error table;
  only the awaits differ (``_sql.SQLStore.asave`` against ``save``).
- Timeouts (URL options, seconds): ``connect_timeout`` (default 10) bounds connecting;
  ``statement_timeout`` (default 30) is set on the session so the server cancels a
  statement stuck on a lock; ``read_timeout`` (default 30) bounds how long the client
  waits for any answer, so a server that stops answering (hung, partitioned, stopped)
  raises ``StoreUnavailable`` instead of blocking forever; TCP keepalives and
  ``tcp_user_timeout`` let the kernel notice a dead peer too. A save that timed out may
  or may not have committed: the next save's compare-and-swap tells.
- ``PGOPTIONS`` in the environment (libpq's session settings) is kept: the store passes
  it before its own ``-c statement_timeout``, where libpq would let the store's
  ``options`` replace it. ``doctor()`` reports a session that does not flush commits.
- Wake-ups: ``announce`` sends ``NOTIFY`` on the table's channel, ``listen`` holds a
  ``LISTEN`` connection in a thread (``_sql.listen_pg``), so a worker in another process
  wakes when a run is started or signalled instead of at its next poll.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Final, Self

from .. import _hooks
from .._errors import CheckpointTooLarge, StoreError, StorePermissionError, StoreUnavailable
from ._errortable import ErrorRule
from ._group import Pending
from ._sql import (
    DEFAULT_TABLE,
    PASSWORD_ENV,
    Held,
    Pieces,
    ServerStore,
    detach_socket,
)
from ._sql.listen_pg import PostgresListener, channel_of, stream_channel_of
from ._sql.pieces import schema_script
from ._sql.save_pg import asave_pieces, save_many, save_pieces
from ._sql.stream_hub_pg import StreamHub, Subscription, join

__all__ = ["DEFAULT_TABLE", "ERRORS", "PostgresStore", "schema_ddl"]

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
DEFAULT_READ_TIMEOUT: Final = 30.0
DEFAULT_STATEMENT_TIMEOUT: Final = 30.0
_FORMS: Final = (
    "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (also postgresql+psycopg://); "
    "options: ?table=NAME&connect_timeout=S&read_timeout=S&statement_timeout=S"
    "&create=true|false; give the password in "
    f"{PASSWORD_ENV} (or PGPASSWORD) rather than in the URL"
)
_OPTIONS: Final = ("table", "connect_timeout", "read_timeout", "statement_timeout", "create")
# The channel is a parameter, never spliced into the text.
_NOTIFY: Final = "SELECT pg_notify(%(channel)s, '')"
_NOTIFY_RUN: Final = "SELECT pg_notify(%(channel)s, %(run)s)"
# PostgreSQL's payload limit is 8000 bytes; a run id over this rings every reader.
_MAX_PAYLOAD: Final = 7999
# A 1 GiB text value is PostgreSQL's hard limit (MaxAllocSize - 1).
_MAX_BYTES: Final = (1 << 30) - 1

# --- schema -----------------------------------------------------------------------------


def schema_ddl(table: str = DEFAULT_TABLE) -> str:
    """Return the SQL the store runs to create its schema (``backends/postgres/schema.sql``).

    Args:
        table: The checkpoint table's name; the meta table is ``<table>_meta``.
    """
    how = (
        "-- When the table is missing, PostgresStore runs these statements in one "
        "transaction,\n-- holding an advisory lock on the table name.\n"
    )
    return schema_script("postgresql", table, how)


# --- errors -----------------------------------------------------------------------------

#: psycopg errors -> stepstone errors, first match wins. SQLSTATEs:
#: https://www.postgresql.org/docs/current/errcodes-appendix.html. libpq reports
#: connection failures without a SQLSTATE; those are recognised by class and text.
ERRORS: Final = (
    ErrorRule(
        StoreUnavailable,
        "{where}: the server did not answer within read_timeout ({text}); the connection "
        "was dropped",
        classes=("ReadTimeout",),
    ),
    ErrorRule(
        StoreError,
        "{where}: table {table} is missing ({text}); run `stepstone init` or "
        "backends/postgres/schema.sql",
        codes=frozenset({"42P01"}),
    ),
    ErrorRule(
        StorePermissionError,
        "{where}: permission denied ({text})",
        codes=frozenset({"42501"}),
        prefixes=("28",),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: statement timed out or was cancelled ({text})",
        codes=frozenset({"57014"}),
    ),
    ErrorRule(
        StoreError, "{where}: the database does not exist ({text})", codes=frozenset({"3D000"})
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: server unavailable or busy ({text})",
        prefixes=("08", "53", "57P", "40", "58"),
    ),
    ErrorRule(
        StorePermissionError,
        "{where}: authentication refused ({text})",
        text=(
            "password authentication failed",
            "no password supplied",
            "does not exist",  # the role; a missing database matched above
            "is not permitted to log in",
            "pg_hba.conf",
            "permission denied",
            "authentication failed",
        ),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: cannot reach the server ({text})",
        classes=("OperationalError", "ConnectionTimeout"),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: connection closed ({text})",
        classes=("InterfaceError",),
        text=("connection is closed", "the connection is lost"),
    ),
)


@functools.cache
def _connection_classes() -> tuple[type[Any], type[Any], type[Any]]:
    """psycopg connection classes whose waits time out after the store's read_timeout."""
    import psycopg  # noqa: PLC0415
    from psycopg import errors  # noqa: PLC0415

    class ReadTimeout(psycopg.OperationalError):
        """The server sent no answer within read_timeout."""

    # psycopg's own wait raises this private class on a timeout; nothing public names it.
    wait_timeout: type[BaseException] = errors._WaitTimeout  # noqa: SLF001

    class Connection(psycopg.Connection[Any]):
        # psycopg waits for the server without a deadline; this one has one. After a
        # timeout the protocol state is unknown, so the connection is closed.
        read_timeout: float | None = None

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            try:
                return super().wait(gen, interval=interval, timeout=timeout or self.read_timeout)
            except wait_timeout:
                with contextlib.suppress(Exception):
                    self.pgconn.finish()
                raise ReadTimeout(f"no answer within {self.read_timeout} s") from None

    class AsyncConnection(psycopg.AsyncConnection[Any]):
        read_timeout: float | None = None

        # psycopg's own signature, overridden: its ``timeout`` is psycopg's, not ours.
        async def wait(
            self,
            gen: Any,
            interval: float = 0.1,
            timeout: float | None = None,  # noqa: ASYNC109
        ) -> Any:
            try:
                return await super().wait(
                    gen, interval=interval, timeout=timeout or self.read_timeout
                )
            except wait_timeout:
                with contextlib.suppress(Exception):
                    self.pgconn.finish()
                raise ReadTimeout(f"no answer within {self.read_timeout} s") from None

    return Connection, AsyncConnection, ReadTimeout


# --- the store --------------------------------------------------------------------------


class PostgresStore(ServerStore):
    """Keeps checkpoints in a PostgreSQL table, one row per run.

    Durability is the server's: a save returns after the server committed the single
    statement, which with default settings means its WAL was flushed to disk
    (``synchronous_commit=on``). ``doctor()`` reports the setting.

    Concurrency: any number of threads, tasks, processes and hosts may share the table.
    Each thread has its own connection; async calls use connections of their event loop,
    one task at a time. Racing saves on one run serialize on the row lock; one wins.

    Passwords: ``password`` argument, else the URL's, else ``STEPSTONE_SQL_PASSWORD``,
    else libpq's own sources (``PGPASSWORD``, ``~/.pgpass``). The password is never part
    of ``repr``, ``where`` or any error message.

    Args:
        url: ``postgresql[+psycopg]://USER[:PASSWORD]@HOST[:PORT]/DATABASE``, no options.
        table: Checkpoint table name (lower case letters, digits, ``_``; up to 48).
        connect_timeout: Seconds to wait for a connection (rounded up, minimum 2).
        read_timeout: Seconds to wait for any answer from the server.
        statement_timeout: Seconds the server lets one statement run.
        password: Overrides the URL's and the environment's password.
        create: False: refuse to open (``StoreError``) when the tables do not exist,
            instead of creating them; read-only tools open a store so.

    Raises:
        ConfigError: a malformed URL or option, or psycopg is not installed.
        StoreUnavailable: the server cannot be reached or did not answer in time.
        StorePermissionError: the credentials are refused or may not create the tables.
    """

    scheme: ClassVar[str] = "postgresql"
    _DIALECT: ClassVar[str] = "postgresql"
    _SWAP_FIRST: ClassVar[bool] = True
    _SWEEP_IN_SAVE: ClassVar[bool] = True
    #: ``save_many``: one transaction in one round trip (``_sql.save_pg.save_many``).
    saves_together: ClassVar[bool] = True
    # claims_in_one_call (``ServerStore``): one UPDATE over a FOR UPDATE SKIP LOCKED
    # pick, RETURNING the claimed rows.
    _LIST_PARAMS: ClassVar[bool] = True
    kind: ClassVar[str] = "postgresql"  # type: ignore[misc]
    pushes_wakeups: ClassVar[bool] = True
    _ERRORS: ClassVar[tuple[ErrorRule, ...]] = ERRORS
    _DRIVER: ClassVar[str] = "psycopg"
    _EXTRA: ClassVar[str] = "postgres"
    _PORT: ClassVar[int] = 5432
    _FORMS: ClassVar[str] = _FORMS
    _OPTIONS: ClassVar[tuple[str, ...]] = _OPTIONS
    _NO_SUCH_TABLE: ClassVar[int | str] = "42P01"

    connect_timeout: float
    read_timeout: float
    statement_timeout: float

    def __init__(
        self,
        url: str,
        *,
        table: str = DEFAULT_TABLE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        password: str | None = None,
        create: bool = True,
    ) -> None:
        parsed = self._init_server(
            url,
            table,
            password,
            {
                "connect_timeout": connect_timeout,
                "read_timeout": read_timeout,
                "statement_timeout": statement_timeout,
            },
            create,
        )
        timeout_ms = int(self.statement_timeout * 1000)
        args: dict[str, Any] = {
            "host": parsed.host,
            "port": parsed.port,
            "user": parsed.user,
            "dbname": parsed.database,
            "connect_timeout": max(2, math.ceil(self.connect_timeout)),
            "application_name": "stepstone",
            "autocommit": True,
            # libpq reads PGOPTIONS only when no options are given: keep the user's.
            "options": f"{os.environ.get('PGOPTIONS', '')} -c statement_timeout={timeout_ms}",
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": int(self.read_timeout * 1000),
        }
        if self._password is not None:
            args["password"] = self._password
        self._connect_args = {k: v for k, v in args.items() if v is not None}
        # One round trip per statement, always: no separate Parse round trip to prepare
        # a statement (and nothing PgBouncer in transaction mode breaks).
        self._connect_args["prepare_threshold"] = None
        self._max_bytes = _MAX_BYTES
        self._open_first(self._open)

    @classmethod
    def from_engine(
        cls,
        engine: Any,
        *,
        async_engine: Any = None,
        table: str = DEFAULT_TABLE,
    ) -> Self:
        """Open a store on a SQLAlchemy ``Engine`` (``postgresql+psycopg``): its pool, its hooks.

        The engine opens every connection (its pool, TLS settings and ``do_connect``
        events, such as one that sets an Entra ID token as the password); the store
        borrows one per call, in autocommit mode, and restores the mode when it gives it
        back (free with ``isolation_level="AUTOCOMMIT"``). The engine's connect
        arguments bound connecting and statements (``connect_timeout``, ``options="-c
        statement_timeout=30000"``); the store's own timeouts do not apply.

        ``async_engine``: an ``AsyncEngine`` (``postgresql+psycopg``) for the async
        methods, on its native async connections; without it they run on threads.

        Raises:
            ConfigError: not a ``postgresql+psycopg`` engine of the right kind, or a bad
                option.
            StoreUnavailable: the server cannot be reached.
        """
        return cls._on_engines(engine, async_engine, table, "psycopg", "psycopg")

    def _engine_session(self, conn: Any) -> tuple[Any, Callable[[], None]]:
        autocommit, threshold = conn.autocommit, conn.prepare_threshold
        conn.autocommit = True
        conn.prepare_threshold = None  # one round trip per statement, as on our own

        def restore() -> None:
            conn.prepare_threshold = threshold
            conn.autocommit = autocommit

        return conn.cursor(), restore

    async def _aengine_session(self, conn: Any) -> tuple[Any, Callable[[], Awaitable[None]]]:
        autocommit, threshold = conn.autocommit, conn.prepare_threshold
        await conn.set_autocommit(True)
        conn.prepare_threshold = None

        async def restore() -> None:
            conn.prepare_threshold = threshold
            await conn.set_autocommit(autocommit)

        return conn.cursor(), restore

    # --- wake-ups (``_sql.listen_pg``) -------------------------------------------------

    def announce(self) -> None:
        """Send a ``NOTIFY`` on this table's channel: listening workers look now.

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        self._exec(_NOTIFY, {"channel": channel_of(self.table)})

    async def aannounce(self) -> None:
        """Async ``announce``, on this loop's connections."""
        await self._aexec(_NOTIFY, {"channel": channel_of(self.table)})

    def announce_stream(self, run_id: str) -> None:
        """Send a ``NOTIFY`` on this table's stream channel: ``run_id``'s readers look now.

        The payload is the run id (empty, ringing every reader, if it is too long for
        one): a process's shared listener rings only that run's readers.

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        payload = run_id if len(run_id.encode()) <= _MAX_PAYLOAD else ""
        self._exec(_NOTIFY_RUN, {"channel": stream_channel_of(self.table), "run": payload})

    def listen_stream(
        self, ring: Callable[[], None], *, run_id: str | None = None
    ) -> Subscription | None:
        """Ring on this table's stream channel after ``run_id``'s flushes (any run's if None).

        The readers of one process share one ``LISTEN`` connection per server, database,
        user and table (``_sql.stream_hub_pg``): the first opens it, the last one's
        ``close`` closes it.

        Raises:
            StoreError: the store is closed.
        """
        if not self._may_listen():
            return None
        args = tuple(sorted((k, repr(v)) for k, v in self._connect_args.items()))

        def make(hub: StreamHub) -> PostgresListener:
            # Rung by its own process's flushes too (``own`` none): the writer rings no
            # doorbell of this process first, as ``announce``'s callers do.
            return self._listener(
                hub.ring_all, set, channel=stream_channel_of(self.table), deliver=hub.deliver
            )

        return join((args, self.table, self.read_timeout), run_id, ring, make)

    def listen(self, ring: Callable[[], None]) -> PostgresListener | None:
        """``LISTEN`` on this table's channel in a thread; call ``ring`` on each ``NOTIFY``.

        None for a store on a user's SQLAlchemy engine: its credentials may come from the
        engine's hooks (an Entra ID token), which a connection of our own would not have,
        and holding one of its pool's connections for ever would starve the pool.

        Raises:
            StoreError: the store is closed.
        """
        if not self._may_listen():
            return None
        listener = self._listener(ring, self._backend_pids)
        listener.start()
        return listener

    def _may_listen(self) -> bool:
        """False on a user's engine (``listen`` says why); raises when the store is closed."""
        if self._closed:
            raise self._closed_error()
        return self._engine is None

    def _listener(
        self,
        ring: Callable[[], None],
        own: Callable[[], set[int]],
        channel: str | None = None,
        deliver: Callable[[set[str]], None] | None = None,
    ) -> PostgresListener:
        """A listener on a connection of this store's own (``PostgresListener`` says how)."""
        return PostgresListener(
            ring,
            where=self.where,
            table=self.table,
            connect_args=self._connect_args,
            read_timeout=self.read_timeout,
            scrub=self._scrub,
            own=own,
            channel=channel,
            deliver=deliver,
        )

    def _backend_pids(self) -> set[int]:
        """The server pids of this store's connections (their NOTIFYs rang here already)."""
        try:
            with self._lock:
                held = [*self._held, *(h for pool in self._apools.values() for h in pool.all)]
            return {int(h.conn.info.backend_pid) for h in held}
        except Exception:  # noqa: BLE001 - changed meanwhile: ring rather than guess
            return set()

    # --- connections --------------------------------------------------------------------

    def _open_connection(self) -> tuple[Any, Any]:
        connection, _, _ = _connection_classes()
        conn = connection.connect(**self._connect_args)
        conn.read_timeout = self.read_timeout
        return conn, conn.cursor()

    async def _aopen_connection(self) -> tuple[Any, Any]:
        _, connection, _ = _connection_classes()
        conn = await connection.connect(**self._connect_args)
        conn.read_timeout = self.read_timeout
        return conn, conn.cursor()

    def _save_in_transaction(self, held: Held, sql: str, params: Any, first: Pieces) -> int:
        # One round trip: ``_sql.save_pg`` (``_SWAP_FIRST``: the swap, then its pieces).
        try:
            return save_pieces(held.conn, held.cursor, sql, params, first, self._count)
        except BaseException as exc:
            self._abandon(held, exc)
            raise

    def _run_many(self, held: Held, items: list[Pending]) -> None:
        # ``save_many``: one transaction, one round trip (``_sql.save_pg.save_many``).
        _hooks.fire("sql.before_request")
        try:
            save_many(held.conn, held.cursor, items, self._count)
        except BaseException as exc:
            self._abandon(held, exc)
            raise
        _hooks.fire("sql.request_sent")

    async def _arun_save(self, held: Held, sql: str, params: Any, first: Pieces) -> int:
        try:
            return await asave_pieces(held.conn, held.cursor, sql, params, first, self._count)
        except Exception:
            await self._aabandon(held)
            raise

    def _adrop(self, held: Held) -> None:
        # pgconn.finish closes the socket without awaiting: fine from a cancelled task.
        held.conn.pgconn.finish()

    def _is_broken(self, held: Held) -> bool:
        return bool(held.conn.closed or held.conn.broken)

    def _error_code(self, exc: BaseException) -> int | str | None:
        state = getattr(exc, "sqlstate", None) or ""
        if not state:
            # libpq's connection failures carry no SQLSTATE; a missing database is
            # told from a missing role by its text.
            text = str(exc).lower()
            if "database" in text and "does not exist" in text:
                return "3D000"
        return state

    def _detach(self, held: Held) -> None:
        # The socket is shared with the parent: closing it normally would send the
        # server a "terminate" message that ends the *parent's* session.
        detach_socket(held.conn.fileno())

    def _check_size(self, run_id: str, document: str) -> None:
        # Characters are at most 4 bytes of UTF-8: only measure bytes near the limit.
        if len(document) * 4 <= self._max_bytes:
            return
        size = len(document.encode("utf-8", "surrogatepass"))
        if size > self._max_bytes:
            raise CheckpointTooLarge(
                f"run {run_id!r}: encoded checkpoint is {size} bytes, over PostgreSQL's "
                f"1 GiB value limit ({self._max_bytes} bytes) at {self.where}; nothing "
                "was stored",
                size,
                self._max_bytes,
            )

    # --- schema -------------------------------------------------------------------------

    def _locked(self, held: Held, statements: list[str], only_at: str | None) -> None:
        # CREATE ... IF NOT EXISTS is not safe against a concurrent creator (unique
        # violation in pg_type): serialize creators and migrators on an advisory lock,
        # inside one transaction, so DDL and the version row commit together.
        digest = hashlib.sha256(f"stepstone:{self.table}".encode()).digest()
        lock_key = int.from_bytes(digest[:8], "big", signed=True)
        with held.conn.transaction():
            self._run(held, "SELECT pg_advisory_xact_lock(%(k)s)", {"k": lock_key})
            if only_at is None or self._schema_version(held) == only_at:
                for statement in statements:
                    self._run(held, statement, None)

    def _create_schema(self, held: Held) -> None:
        self._locked(held, [*self._sql.create, self._pieces_sql.create], None)

    def _migrate(self, held: Held, found: int) -> None:
        self._locked(held, [self._pieces_sql.create, *self._sql.migrate_v1], "1")

    def _durability(self, held: Held) -> tuple[bool, str]:
        _, rows = self._run(
            held, "SELECT current_setting('synchronous_commit'), current_setting('fsync')", None
        )
        sync, fsync = rows[0]
        durable = sync in ("on", "remote_write", "remote_apply") and fsync == "on"
        return durable, f"synchronous_commit={sync}, fsync={fsync}"
