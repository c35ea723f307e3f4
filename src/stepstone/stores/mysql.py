"""MySQLStore: checkpoints in a MySQL or MariaDB table, through PyMySQL and aiomysql.

The logic is the SQL base's (``stepstone.stores._sql``); this module supplies MySQL's
hooks. Design, and why:

- Autocommit connections; every store operation is ONE statement, so ONE round trip:
  a first save is ``INSERT ... ON DUPLICATE KEY UPDATE run_key = run_key`` (a no-op
  assignment: an existing row reports 0 rows affected -> ``ConflictError``), later
  saves ``UPDATE ... WHERE run_key = :key AND version = :expected``. InnoDB re-checks the
  ``WHERE`` under the row lock, so exactly one of several racing saves wins. A save of a
  long state is one transaction: ``BEGIN``, a statement per piece (each under the
  packet limit), the swap, ``COMMIT`` (``ROLLBACK`` if the swap lost): one commit. Connections
  never use ``CLIENT.FOUND_ROWS``: row counts must mean rows *changed*.
- No group commit in the client: InnoDB flushes the redo log of concurrently committing
  sessions together (its own group commit), so concurrent saves on separate connections
  already share flushes, and each save stays one statement, one round trip, even when
  alone. The backend READMEs give the figures.
- Async: aiomysql. It is PyMySQL's protocol code driven by asyncio (it imports PyMySQL
  and raises PyMySQL's own exception classes with the same error numbers), so the error
  table below serves both paths unchanged; it is maintained under aio-libs, in
  production use for years, and tested against MariaDB as well as MySQL. asyncmy is
  faster but a Cython rewrite with its own error classes (a second table) and a thinner
  MariaDB record.
- Timeouts (URL options, seconds): ``connect_timeout`` (default 10) bounds connecting
  *and the handshake*, sync and async: PyMySQL reads the server's greeting under
  ``read_timeout``, so the sync socket's timeouts are capped by the connect deadline
  until the connection is set up, and a server that accepts and never answers fails
  the open with ``StoreUnavailable`` after ``connect_timeout``. ``read_timeout`` and
  ``write_timeout`` (default 30) bound every read and write on the socket; async calls
  are bounded by ``read_timeout`` as a whole. After a timeout the call raises
  ``StoreUnavailable`` and the connection is dropped. A save that timed out may or may
  not have committed: the next save's compare-and-swap tells.
- Claims in one call (``claim_ready``; MySQL 8.0.21+, MariaDB 10.6+): one READ COMMITTED
  transaction on one connection: a ``SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`` per
  kind, so workers spread over the queue, then one ``UPDATE`` of the picked rows that
  appends the claim's fields to the metadata line as the other dialects do, and a read
  of the rows as written (there is no ``UPDATE ... RETURNING``). READ COMMITTED: no gap
  locks, so a concurrent ``start`` never waits on a claim. Older servers keep the
  per-run path; the store logs why when it opens.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final, Self, cast

from .._errors import (
    CheckpointTooLarge,
    ConfigError,
    StoreError,
    StoreUnavailable,
)
from .._observe import logger
from ._errortable import ErrorRule
from ._mysql_dialect import (
    _FORMS,
    _NO_SUCH_TABLE,
    _OPTIONS,
    ERRORS,
    one_call_reason,
    schema_ddl,
)
from ._mysql_wire import _HandshakeSocket, _quiet
from ._sql import (
    DEFAULT_TABLE,
    Held,
    ServerStore,
    detach_socket,
)
from ._sql.effects import Exec, Result, adrive, drive

if TYPE_CHECKING:
    from .._runinfo import ReadyAsk
    from .._store import Claim
    from ._sql.effects import Plan

__all__ = ["DEFAULT_TABLE", "ERRORS", "MySQLStore", "schema_ddl"]

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
DEFAULT_READ_TIMEOUT: Final = 30.0
DEFAULT_WRITE_TIMEOUT: Final = 30.0
# Room for everything in an INSERT besides the escaped document (a 1024-character
# run_id escaped, the key, the other columns and the SQL text).
_STATEMENT_OVERHEAD: Final = 16 * 1024
#: Between the statements of ``claim_ready``'s transaction (``tools/sqlgen.py``).
_SEPARATOR: Final = "\n;\n"
_MIN_DUE: Final = datetime.min.replace(tzinfo=UTC)


# --- the store --------------------------------------------------------------------------


class MySQLStore(ServerStore):
    """Keeps checkpoints in a MySQL or MariaDB (InnoDB) table, one row per run.

    Durability is the server's: a save returns after the server committed the single
    statement; with ``innodb_flush_log_at_trx_commit=1`` (the default) its redo log was
    flushed to disk. ``doctor()`` reports the setting.

    Concurrency: any number of threads, tasks, processes and hosts may share the table.
    Each thread has its own connection; async calls use connections of their event loop,
    one task at a time. Racing saves on one run serialize on the row lock; one wins.

    Passwords: ``password`` argument, else the URL's, else ``STEPSTONE_SQL_PASSWORD``.
    The password is never part of ``repr``, ``where`` or any error message.

    Args:
        url: ``mysql[+pymysql]://USER[:PASSWORD]@HOST[:PORT]/DATABASE``, no options.
        table: Checkpoint table name (lower case letters, digits, ``_``; up to 48).
        connect_timeout: Seconds to wait for a connection and the server's greeting.
        read_timeout: Seconds to wait for any read from the server.
        write_timeout: Seconds to wait for any write to the server.
        password: Overrides the URL's and the environment's password.
        create: False: refuse to open (``StoreError``) when the tables do not exist,
            instead of creating them; read-only tools open a store so.

    Raises:
        ConfigError: a malformed URL or option, or PyMySQL is not installed.
        StoreUnavailable: the server cannot be reached or did not answer in time.
        StorePermissionError: the credentials are refused or may not create the tables.
    """

    scheme: ClassVar[str] = "mysql"
    _DIALECT: ClassVar[str] = "mysql"
    kind: ClassVar[str] = "mysql"  # type: ignore[misc]
    # claims_in_one_call (``ServerStore``): one transaction (SELECT ... FOR UPDATE SKIP
    # LOCKED, UPDATE); False on the instance of a server too old for it (``_after_open``).
    # No push wake-ups (listen: None, workers back off): no LISTEN/NOTIFY; a table is a poll.
    _ERRORS: ClassVar[tuple[ErrorRule, ...]] = ERRORS
    _DRIVER: ClassVar[str] = "pymysql"
    _EXTRA: ClassVar[str] = "mysql"
    _PORT: ClassVar[int] = 3306
    _FORMS: ClassVar[str] = _FORMS
    _OPTIONS: ClassVar[tuple[str, ...]] = _OPTIONS
    _NO_SUCH_TABLE: ClassVar[int | str] = _NO_SUCH_TABLE

    connect_timeout: float
    read_timeout: float
    write_timeout: float

    def __init__(
        self,
        url: str,
        *,
        table: str = DEFAULT_TABLE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
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
                "write_timeout": write_timeout,
            },
            create,
        )
        self._connect_args: dict[str, Any] = {
            "host": parsed.host,
            "port": parsed.port,
            "user": parsed.user,
            "password": self._password or "",
            "database": parsed.database,
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "write_timeout": self.write_timeout,
            "autocommit": True,
            "charset": "utf8mb4",
            "collation": "utf8mb4_bin",
            # Not CLIENT.FOUND_ROWS: affected-row counts must mean rows *changed*.
            "client_flag": 0,
            # Let the server's max_allowed_packet be the only limit.
            "max_allowed_packet": 1 << 30,
        }
        self._max_bytes = 1 << 30
        self._open_first(self._open)

    @classmethod
    def from_engine(
        cls, engine: Any, *, async_engine: Any = None, table: str = DEFAULT_TABLE
    ) -> Self:
        """Open a store on a SQLAlchemy ``Engine`` (``mysql+pymysql``): its pool, its hooks.

        The engine opens every connection (its pool, TLS settings and ``do_connect``
        events); the store borrows one per call, in autocommit mode, and restores the
        mode when it gives it back (free with ``isolation_level="AUTOCOMMIT"``); the
        engine's connect arguments bound connecting, reads and writes. SQLAlchemy asks
        the server for ``CLIENT.FOUND_ROWS`` by default, which makes a lost
        compare-and-swap look like a stored save: create the engine with
        ``connect_args={"client_flag": 0}`` (the store refuses it otherwise).

        ``async_engine``: an ``AsyncEngine`` (``mysql+aiomysql``, also with
        ``client_flag`` 0) for the async methods, on its native async connections;
        without it they run on threads.

        Raises:
            ConfigError: not a ``mysql+pymysql`` (``mysql+aiomysql``) engine, a bad
                option, or the engine's connections use ``CLIENT.FOUND_ROWS``.
            StoreUnavailable: the server cannot be reached.
        """
        return cls._on_engines(engine, async_engine, table, "pymysql", "aiomysql")

    def _refuse_found_rows(self, client_flag: int) -> None:
        if client_flag & self._driver.constants.CLIENT.FOUND_ROWS:
            raise ConfigError(
                f"{self.where}: the engine's connections use CLIENT.FOUND_ROWS (SQLAlchemy's "
                "default), so a lost compare-and-swap would count as stored; create the "
                'engine with connect_args={"client_flag": 0}'
            )

    def _engine_session(self, conn: Any) -> tuple[Any, Callable[[], None]]:
        self._refuse_found_rows(conn.client_flag)
        autocommit = conn.get_autocommit()
        conn.autocommit(True)
        cursor = conn.cursor()

        def restore() -> None:
            conn.autocommit(autocommit)

        return cursor, restore

    async def _aengine_session(self, conn: Any) -> tuple[Any, Callable[[], Awaitable[None]]]:
        # aiomysql keeps the flags it connected with under a private name only.
        self._refuse_found_rows(getattr(conn, "_client_flag", 0))
        autocommit = conn.get_autocommit()
        await conn.autocommit(True)
        cursor = await self._apatched(conn).cursor(_quiet(conn.cursorclass))

        async def restore() -> None:
            await conn.autocommit(autocommit)

        return cursor, restore

    # --- connections --------------------------------------------------------------------

    def _open_connection(self) -> tuple[Any, Any]:
        # PyMySQL reads the server's greeting and runs its set-up queries under
        # read_timeout: a server that accepts and never answers would hold the open for
        # read_timeout, not connect_timeout. So the socket is ours, its timeouts capped
        # by the connect deadline until the connection is set up.
        host, port = self._connect_args["host"], self._connect_args["port"]
        try:
            plain = socket.create_connection((host, port), self.connect_timeout)
        except OSError as exc:
            raise self._driver.err.OperationalError(
                2003, f"Can't connect to MySQL server on {host!r} ({exc})"
            ) from exc
        plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        plain.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock = _HandshakeSocket(fileno=plain.detach())
        sock.deadline = time.monotonic() + self.connect_timeout
        conn = self._driver.connect(**self._connect_args, defer_connect=True)
        try:
            conn.connect(sock)  # closes the socket if it fails
        except self._driver.err.OperationalError as exc:
            if sock.expired():
                raise self._connect_timed_out(exc) from exc
            raise
        sock.release()
        if conn.client_flag & self._driver.constants.CLIENT.FOUND_ROWS:  # pragma: no cover
            conn.close()
            raise StoreError(f"{self.where}: the connection uses CLIENT.FOUND_ROWS")
        return conn, conn.cursor()

    def _connect_timed_out(self, exc: BaseException) -> StoreUnavailable:
        args = self._connect_args
        return StoreUnavailable(
            f"{self.where}: cannot connect: {args['host']}:{args['port']} accepted the "
            f"connection but did not complete the MySQL handshake within "
            f"connect_timeout={self.connect_timeout:g} s ({self._scrub(str(exc))})"
        )

    async def _aopen_connection(self) -> tuple[Any, Any]:
        import asyncio  # noqa: PLC0415

        aiomysql = self._import_driver("aiomysql")
        args = self._connect_args
        # Not ``aiomysql.connect``: when the deadline cancels it, the connection it was
        # making is out of reach and its socket stays open until the loop closes.
        conn = aiomysql.Connection(
            host=args["host"],
            port=args["port"],
            user=args["user"],
            password=args["password"],
            db=args["database"],
            connect_timeout=self.connect_timeout,
            autocommit=True,
            charset="utf8mb4",
            client_flag=0,
        )
        try:
            # One deadline for the TCP connect, the greeting, the login and SET NAMES:
            # aiomysql bounds only the TCP connect by connect_timeout.
            # asyncio.timeout, not wait_for: wait_for loses a cancel that arrives as the
            # call completes (3.11), and the caller's task would not stop.
            async with asyncio.timeout(self.connect_timeout):
                cursor = await self._ahandshake(conn)
        except TimeoutError as exc:
            conn.close()
            raise self._connect_timed_out(exc) from None
        except BaseException:
            conn.close()
            raise
        return conn, cursor

    async def _ahandshake(self, conn: Any) -> Any:
        await conn._connect()  # noqa: SLF001 - what ``aiomysql.connect`` awaits (see above)
        return await self._asession(conn)

    async def _asession(self, conn: Any) -> Any:
        """Set up an aiomysql connection as the sync path's; return its cursor."""
        # aiomysql takes no collation argument: set the one the sync path uses.
        cursor = await self._apatched(conn).cursor(_quiet(conn.cursorclass))
        await cursor.execute("SET NAMES utf8mb4 COLLATE utf8mb4_bin")
        return cursor

    @staticmethod
    def _apatched(conn: Any) -> Any:
        """``conn`` escaping bytes the way PyMySQL does."""
        # aiomysql (0.3) escapes bytes with a PyMySQL helper that PyMySQL 1.2 removed;
        # escape them as PyMySQL itself now does, as a hex literal.
        escape = conn.escape
        if getattr(escape, "patched", False):  # a user's pooled connection, borrowed again
            return conn

        def patched(value: Any) -> Any:
            return f"X'{value.hex()}'" if isinstance(value, bytes) else escape(value)

        patched.patched = True  # type: ignore[attr-defined]
        conn.escape = patched
        return conn

    async def _arun(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        import asyncio  # noqa: PLC0415

        # aiomysql has no socket timeouts: bound the whole call instead. A timeout
        # cancels the call, and the base drops the connection.
        call = (
            self._arun_claim(held, params)
            if sql is self._sql.claim_ready
            else super()._arun(held, sql, params)
        )
        try:
            async with asyncio.timeout(self.read_timeout):  # not wait_for: see _aopen_connection
                return await call
        except TimeoutError:
            raise self._driver.err.OperationalError(
                2013, f"Lost connection to server (no answer within {self.read_timeout} s)"
            ) from None

    def _adrop(self, held: Held) -> None:
        writer = getattr(held.conn, "_writer", None)
        transport = getattr(writer, "transport", None)
        loop = getattr(transport, "_loop", None)
        if loop is not None and loop.is_closed():
            # aiomysql's close() closes the socket on the loop's next turn, and a closed
            # loop has none (it raises, and the socket stays open): close it here. The
            # transport's own socket object (private to asyncio's selector transports),
            # so that nothing closes the same descriptor number again later.
            sock = getattr(transport, "_sock", None)
            if sock is not None:
                sock.close()
            # Else its __del__ calls close() again, which raises on the closed loop.
            held.conn._writer = held.conn._reader = None  # noqa: SLF001 - see above
            return
        held.conn.close()

    async def aclose(self) -> None:
        """Async ``close``; returns once this loop's idle connections' sockets are closed.

        aiomysql closes a socket on the event loop's next turn, not in ``close()``: without
        the wait, ``async with`` would exit with a descriptor still open.
        """
        import asyncio  # noqa: PLC0415

        if self._aengine is not None:  # the user's pool keeps its connections open
            await super().aclose()
            return
        pool = self._apools.get(asyncio.get_running_loop())
        idle = list(pool.idle) if pool is not None else []
        writers = [w for w in (getattr(h.conn, "_writer", None) for h in idle) if w is not None]
        await super().aclose()
        for writer in writers:
            try:
                async with asyncio.timeout(self.write_timeout):
                    await writer.wait_closed()
            except Exception:  # noqa: BLE001 - whatever stopped a clean close, end it hard
                writer.transport.abort()

    def _is_broken(self, held: Held) -> bool:
        # PyMySQL says ``open``, aiomysql ``closed``.
        return bool(held.conn.closed) if held.is_async else not held.conn.open

    def _error_code(self, exc: BaseException) -> int | str | None:
        args = getattr(exc, "args", ())
        return args[0] if args and isinstance(args[0], int) else None

    def _detach(self, held: Held) -> None:
        sock = getattr(held.conn, "_sock", None)
        if sock is not None:
            detach_socket(sock.fileno())
        else:  # aiomysql: the transport's socket
            transport = getattr(held.conn, "_writer", None)
            info = transport.get_extra_info("socket") if transport is not None else None
            if info is not None:
                detach_socket(info.fileno())

    def _check_size(self, run_id: str, document: str) -> None:
        limit = self._max_bytes
        # Characters are at most 4 bytes of UTF-8, 8 once escaped: only measure near it.
        if len(document) * 8 <= limit:
            return
        escaped = cast(str, self._driver.converters.escape_string(document))
        size = len(escaped.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise CheckpointTooLarge(
                f"run {run_id!r}: encoded checkpoint is {size} bytes on the wire, over the "
                f"server's max_allowed_packet less room for the statement ({limit} bytes) "
                f"at {self.where}; nothing was stored",
                size,
                limit,
            )

    # --- schema -------------------------------------------------------------------------

    def _after_open(self, held: Held) -> None:
        _, rows = self._run(held, "SELECT @@max_allowed_packet, VERSION()", None)
        self._max_bytes = max(0, int(rows[0][0]) - _STATEMENT_OVERHEAD)
        reason = one_call_reason(str(rows[0][1]))
        if reason is not None:
            logger.info("%s: claiming run by run: %s", self.where, reason)
            # Shadows the class's declaration for this store only (the worker reads it).
            self.__dict__["claims_in_one_call"] = False

    # --- claims in one call -------------------------------------------------------------

    def _claim_ready(self, ask: ReadyAsk) -> Plan[list[Claim]]:
        if not self.claims_in_one_call:
            raise StoreError(
                f"{self.where}: this server cannot claim in one statement (see the log of "
                "its opening); load and save each run instead"
            )
        return super()._claim_ready(ask)

    def _claim_steps(self, params: dict[str, Any]) -> Plan[list[Any]]:
        """The claim's transaction, as the other dialects' one statement.

        Returns rows shaped as their ``RETURNING``: run_id, version, document, the
        version it replaced. Driven by ``drive`` or ``adrive`` on one connection (its
        statements are not ``_run``'s, which would start over at this one).
        """
        for statement in _BEGIN:
            yield Exec(statement)
        *picks, update, read = self._sql.claim_ready.split(_SEPARATOR)
        found: list[Any] = []
        for sql in picks:
            _, rows = yield Exec(sql, params)
            found.extend(rows)
        # The kinds' pages, cut to ``limit`` earliest due first (a UNION's ORDER BY).
        found.sort(key=lambda row: row[2] or _MIN_DUE)
        was = {bytes(row[0]): row[1] for row in found[: params["limit"]]}
        claimed: list[Any] = []
        if was:
            marks = ", ".join(f"%(k{i})s" for i in range(len(was)))
            keyed = {**params, **{f"k{i}": key for i, key in enumerate(was)}}
            yield Exec(update.replace("{picked}", marks), keyed)
            _, rows = yield Exec(read.replace("{picked}", marks), keyed)
            claimed = [(row[1], row[2], row[3], was[bytes(row[0])]) for row in rows]
        yield Exec("COMMIT")
        return claimed

    def _run(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        if sql is not self._sql.claim_ready:
            return super()._run(held, sql, params)
        cursor = held.cursor

        def perform(effect: Exec) -> Result:
            self._count()
            cursor.execute(effect.sql, effect.params)
            return int(cursor.rowcount), list(cursor.fetchall()) if cursor.description else []

        try:
            claimed = drive(self._claim_steps(params), perform)
        except BaseException:
            try:
                cursor.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                held.conn.close()  # a transaction may be open: never reuse it
            raise
        return len(claimed), claimed

    async def _arun_claim(self, held: Held, params: Any) -> tuple[int, list[Any]]:
        cursor = held.cursor

        async def perform(effect: Exec) -> Result:
            self._count()
            await cursor.execute(effect.sql, effect.params)
            return int(cursor.rowcount), list(await cursor.fetchall()) if cursor.description else []

        try:
            claimed = await adrive(self._claim_steps(params), perform)
        except Exception:
            try:
                await cursor.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                held.conn.close()  # a transaction may be open: never reuse it
            raise
        # Cancelled (a timeout): the caller drops the connection; the server rolls back.
        return len(claimed), claimed

    def _create_schema(self, held: Held) -> None:
        # Each DDL statement commits by itself; CREATE TABLE IF NOT EXISTS waits on the
        # metadata lock of a concurrent creator, then does nothing.
        for statement in [*self._sql.create, self._pieces_sql.create]:
            self._run(held, statement, None)

    def _migrate(self, held: Held, found: int) -> None:
        # Concurrent openers serialize on a named lock and re-read the version under it;
        # a statement a crashed migrator already ran fails with 1060/1061 and is skipped.
        name = f"stepstone:{self.table}"
        _, rows = self._run(held, "SELECT GET_LOCK(%(n)s, %(t)s)", {"n": name, "t": 60})
        if not rows or rows[0][0] != 1:
            raise StoreUnavailable(f"{self.where}: another process holds the migration lock")
        try:
            if self._schema_version(held) != "1":
                return
            # The pieces table first: the version bump, last, marks the whole migration.
            for statement in [self._pieces_sql.create, *self._sql.migrate_v1]:
                try:
                    self._run(held, statement, None)
                except self._driver_error as exc:
                    if self._error_code(exc) not in (1060, 1061):  # duplicate column/key
                        raise
        finally:
            self._run(held, "SELECT RELEASE_LOCK(%(n)s)", {"n": name})

    def _durability(self, held: Held) -> tuple[bool, str]:
        _, rows = self._run(held, "SELECT @@innodb_flush_log_at_trx_commit", None)
        flush = int(rows[0][0])
        return flush == 1, f"innodb_flush_log_at_trx_commit={flush}"


#: Before the claim's statements: no gap locks (a ``start`` never waits on a claim).
_BEGIN: Final = ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", "START TRANSACTION")
