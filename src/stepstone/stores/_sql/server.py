"""What PostgresStore and MySQLStore share: URL, password, timeouts, hooks, init, doctor."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from ... import _hooks
from ..._errors import ConfigError, StoreError, StorePermissionError
from ..._store import Diagnosis
from .config import (
    PASSWORD_ENV,
    ServerURL,
    check_table,
    import_driver,
    parse_server_url,
    positive_seconds,
    run_key,
)
from .connections import Held, Pieces
from .engine import check_engine, server_url_of
from .schema import TABLE_SCHEMA, statements_of
from .store import SQLStore

__all__ = ["ServerStore"]

#: The server's clock, by store kind: the time rates and schedules are judged on
#: (``Store.server_now``). ``clock_timestamp()``, not ``now()``: the time of the call,
#: not of a transaction begun earlier.
_NOW_SQL = {"postgresql": "SELECT clock_timestamp()", "mysql": "SELECT UTC_TIMESTAMP(6)"}


def _aware(value: datetime) -> datetime:
    """Return ``value`` in UTC; a naive one (MySQL's ``UTC_TIMESTAMP``) is UTC already."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class ServerStore(SQLStore):
    """What PostgresStore and MySQLStore share: URL, password, timeouts, hooks."""

    kind: str
    # Every server store: durability is the server's, each call a request (counted, and
    # a kill before or after it sent), native async drivers, claims in one call.
    durability_levels: ClassVar[tuple[str, ...]] = ()
    kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"sql.before_request": False, "sql.request_sent": True}
    )
    counts_requests: ClassVar[bool] = True
    native_async: ClassVar[bool] = True
    claims_in_one_call: ClassVar[bool] = True
    _DRIVER: ClassVar[str]
    _EXTRA: ClassVar[str]
    _PORT: ClassVar[int]
    _FORMS: ClassVar[str]
    #: The URL options ``from_config`` accepts: the constructor's keywords.
    _OPTIONS: ClassVar[tuple[str, ...]]
    #: The driver's error code of a missing table (``_error_code``).
    _NO_SUCH_TABLE: ClassVar[int | str]

    def _init_server(
        self,
        url: str,
        table: str,
        password: str | None,
        timeouts: dict[str, float],
        create: bool = True,
    ) -> ServerURL:
        parsed, options = parse_server_url(
            url, self.kind, self._DRIVER, self._PORT, self._FORMS, ()
        )
        if options:  # pragma: no cover - parse_server_url refused them already
            raise ConfigError(f"URL options are not allowed here; forms: {self._FORMS}")
        self.table = check_table(table)
        if not isinstance(create, bool):
            raise ConfigError(f"create must be True or False, got {create!r}")
        #: False: opening refuses missing tables instead of creating them (``_open``).
        self._creates = create
        for name, value in timeouts.items():
            setattr(self, name, positive_seconds(name, value))
        self._driver = self._import_driver(self._DRIVER)
        self._password: str | None = (
            password
            if password is not None
            else parsed.password
            if parsed.password is not None
            else os.environ.get(PASSWORD_ENV)
        )
        secret = ":***" if self._password else ""
        user = f"{parsed.user}{secret}@" if parsed.user else ""
        host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
        # No password in here, ever: what repr and messages show.
        self.url = f"{self.kind}+{self._DRIVER}://{user}{host}:{parsed.port}/{parsed.database}"
        self.where = f"{self.url} table {self.table}"
        self._sql = statements_of(self._DIALECT, self.table)
        self._driver_error = self._driver.Error
        self._setup()
        return parsed

    @classmethod
    def _on_engines(
        cls, engine: Any, async_engine: Any, table: str, driver: str, async_driver: str
    ) -> Self:
        """``from_engine`` of each server store: check the engines, then construct."""
        check_engine(engine, cls.kind, (driver,))
        if async_engine is not None:
            check_engine(async_engine, cls.kind, (async_driver,), is_async=True)
        store = cls.__new__(cls)
        # The class's own constructor, before __init__ opens the first connection.
        store._engine, store._aengine = engine, async_engine  # noqa: SLF001
        store.__init__(server_url_of(engine), table=table)  # type: ignore[misc]
        return store

    def _import_driver(self, module: str) -> Any:
        return import_driver(module, self.kind, self._EXTRA)

    @classmethod
    def from_config(cls, config: str) -> Self:
        """Open ``SCHEME://USER@HOST[:PORT]/DATABASE?OPTIONS``; the options are the
        constructor's keywords (``table``, its timeouts, ``create``).

        Raises:
            ConfigError: the string is malformed; the message lists the forms.
        """
        _, options = parse_server_url(
            config, cls.kind, cls._DRIVER, cls._PORT, cls._FORMS, cls._OPTIONS
        )
        bare = urlsplit(config)._replace(query="").geturl()
        # Each store's own constructor, whose keywords the options are.
        opener: Callable[..., Self] = cls
        return opener(bare, **options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, table={self.table!r})"

    def _scrub(self, text: str) -> str:
        password = self._password
        return text.replace(password, "***") if password else text

    def _key(self, run_id: str) -> Any:
        return run_key(run_id)

    def server_now(self) -> datetime:
        """Return the server's clock in one ``SELECT`` (``clock_timestamp()``, MySQL's UTC)."""
        _, rows = self._exec(_NOW_SQL[self.kind])
        return _aware(rows[0][0])

    async def aserver_now(self) -> datetime:
        """Async ``server_now``, on the native async driver."""
        _, rows = await self._aexec(_NOW_SQL[self.kind])
        return _aware(rows[0][0])

    def _fire_before(self) -> None:
        _hooks.fire("sql.before_request")

    def _fire_after(self) -> None:
        _hooks.fire("sql.request_sent")

    def _run_save(self, held: Held, sql: str, params: Any, first: Pieces = ()) -> int:
        # One statement in autocommit mode: its own atomic transaction, one round trip.
        # Nothing runs between the compare and the swap. A save with pieces: one
        # transaction, so they land with the swap or not at all, with one commit.
        _hooks.fire("sql.before_request")
        if first:
            stored = self._save_in_transaction(held, sql, params, first)
        else:
            self._count()
            held.cursor.execute(sql, params)
            stored = int(held.cursor.rowcount)
        _hooks.fire("sql.request_sent")
        return stored

    # --- a save with pieces: BEGIN, its pieces, its swap, then COMMIT (ROLLBACK if lost)

    def _save_in_transaction(self, held: Held, sql: str, params: Any, first: Pieces) -> int:
        try:
            stored = self._pieces_then_swap(held, sql, params, first)
            # A lost swap takes its pieces back with it: nothing of the save lands.
            self._run(held, "COMMIT" if stored == 1 else "ROLLBACK", None)
        except BaseException as exc:
            self._abandon(held, exc)
            raise
        return stored

    def _pieces_then_swap(self, held: Held, sql: str, params: Any, first: Pieces) -> int:
        """Open a transaction, write the pieces, run the swap; return its rowcount.

        Each piece is its own statement, under the server's packet limit (``_piece_max``).
        """
        self._run(held, "BEGIN", None)
        for statement, values in first:
            self._run(held, statement, values)
            _hooks.fire("pieces.piece")  # chaos: a kill between two pieces of a save
        _hooks.fire("pieces.written")  # chaos: the pieces written, the swap not yet run
        return self._run(held, sql, params)[0]

    def _abandon(self, held: Held, exc: BaseException) -> None:
        """After a failure inside a save's transaction: roll it back, or close the
        connection (never reused with a transaction open)."""
        if isinstance(exc, Exception) and not self._is_broken(held):
            try:
                held.cursor.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                held.conn.close()
        else:  # interrupted, maybe mid-statement (^C): the call drops the connection
            with contextlib.suppress(Exception):
                held.conn.close()

    async def _arun_save(self, held: Held, sql: str, params: Any, first: Pieces) -> int:
        try:
            stored = await self._apieces_then_swap(held, sql, params, first)
            await self._arun(held, "COMMIT" if stored == 1 else "ROLLBACK", None)
        except Exception:
            await self._aabandon(held)
            raise
        return stored

    async def _aabandon(self, held: Held) -> None:
        """Async ``_abandon`` after an error (cancelled or interrupted, the call drops the
        connection itself): a driver error leaves it reusable once rolled back."""
        if not self._is_broken(held):
            try:
                await held.cursor.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                self._adrop(held)

    async def _apieces_then_swap(self, held: Held, sql: str, params: Any, first: Pieces) -> int:
        """Async ``_pieces_then_swap``."""
        await self._arun(held, "BEGIN", None)
        for statement, values in first:
            await self._arun(held, statement, values)
            _hooks.fire("pieces.piece")
        _hooks.fire("pieces.written")
        return (await self._arun(held, sql, params))[0]

    def _run(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        cursor = held.cursor
        self._count()
        cursor.execute(sql, params)
        rows = list(cursor.fetchall()) if cursor.description else []
        return int(cursor.rowcount), rows

    async def _arun(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        cursor = held.cursor
        self._count()
        await cursor.execute(sql, params)
        rows = list(await cursor.fetchall()) if cursor.description else []
        return int(cursor.rowcount), rows

    def _create_error(self, exc: BaseException) -> StoreError:
        error = self._translate(exc)
        if isinstance(error, StorePermissionError):
            folder = "postgres" if self.kind == "postgresql" else "mysql"
            return StorePermissionError(
                f"{error}. These credentials may not create the tables: have an "
                f"administrator run backends/{folder}/schema.sql (schema_ddl("
                f"{self.table!r}) for this table name)"
            )
        return error

    def init(self) -> list[str]:
        """Create the checkpoint and meta tables if missing; report what is there.

        Raises:
            StorePermissionError: the credentials may not create tables.
        """
        held = self._thread_held()
        with held.lock:
            try:
                self._create_schema(held)
                found = self._schema_version(held)
            except self._driver_error as exc:
                raise self._create_error(exc) from exc
            finally:
                self._release(held)
        return [
            f"{self.kind} store {self.where}: tables {self.table} and {self.table}_meta "
            f"ready (schema version {found})"
        ]

    def _schema_version(self, held: Held) -> str | None:
        try:
            _, rows = self._run(held, self._sql.schema_version, None)
        except self._driver_error as exc:
            if self._error_code(exc) == self._NO_SUCH_TABLE:
                return None
            raise
        return None if not rows else str(rows[0][0])

    def _durability(self, held: Held) -> tuple[bool, str]:
        raise NotImplementedError

    def _server_settings(self) -> tuple[str | None, bool, str]:
        held = self._thread_held()
        with held.lock:
            try:
                found = self._schema_version(held)
                durable, setting = self._durability(held)
            except self._driver_error as exc:
                raise self._translate(exc) from exc
            finally:
                self._release(held)
        return found, durable, setting

    def doctor(self) -> list[Any]:
        """The base probe checks, plus schema version and the server's durability settings."""
        results = super().doctor()
        try:
            found, durable, setting = self._server_settings()
        except Exception as exc:  # noqa: BLE001 - a diagnosis reports any failure, never raises
            results.append(Diagnosis("server settings", False, f"{type(exc).__name__}: {exc}"))
            return results
        ok = found == str(TABLE_SCHEMA)
        results.append(
            Diagnosis(f"schema version {TABLE_SCHEMA}", ok, "ok" if ok else f"found {found!r}")
        )
        results.append(
            Diagnosis(
                "commits are flushed to disk",
                durable,
                setting if durable else f"{setting}: a server crash can lose returned saves",
            )
        )
        return results

    def _open(self) -> None:
        held = self._thread_held()
        with held.lock:
            try:
                if not self._creates and self._schema_version(held) is None:
                    raise StoreError(
                        f"no store at {self.where}: table {self.table} (or its "
                        f"{self.table}_meta) does not exist, and create=false never creates "
                        "it (check the URL and the table name; `stepstone init --store URL` "
                        "creates the tables)"
                    )
                self._ensure_schema(held)
                self._after_open(held)
            except self._driver_error as exc:
                raise self._create_error(exc) from exc
            finally:
                self._release(held)

    def _after_open(self, held: Held) -> None:
        """Read server limits after the schema check (MySQL: max_allowed_packet)."""

    def _db_time(self, value: datetime | None) -> Any:
        return value

    def _py_time(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise ValueError(f"timestamp {value!r} is not a valid time")  # noqa: TRY004 - a bad value
        return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)
