"""A user's SQLAlchemy ``Engine`` under a SQL store (``SQLiteStore.from_engine`` & co.).

The store takes its sync connections from the engine's pool (``engine.raw_connection()``),
so the user's pool settings, TLS arguments and connection hooks (a ``do_connect`` event
that puts a fresh Entra ID token in the password, say) apply to every connection the
store uses. Statements still run on the raw driver connection, exactly as on a store's
own connections: SQLAlchemy's execution machinery never runs per call, and this module
never imports SQLAlchemy (the engine is the user's; they installed it).

Each connection is borrowed for one call and given back after it (a user's pool is
sized for connections that come back; a store's threads would otherwise hold one each
for good), set up for the store when borrowed (autocommit) and restored when given
back. An engine created with ``isolation_level="AUTOCOMMIT"`` makes both free; else
they cost the driver's autocommit switch, and the pool's reset costs what it costs.

A store needs sync connections (it creates its tables when it opens, and serves the
sync methods), so it takes a sync ``Engine``; with
an ``AsyncEngine`` beside it, the async methods borrow that engine's native async
connections, else they run the sync methods on threads.

A connection the store will not reuse (a cancelled or failed call) is invalidated in
the user's pool on a task of its event loop: the cancelled call never waits for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..._errors import ConfigError

if TYPE_CHECKING:
    import asyncio

__all__ = ["AsyncLease", "Lease", "check_engine", "server_url_of"]

# Tasks invalidating dropped connections, kept referenced until they end.
_tasks: set[asyncio.Task[None]] = set()


class Lease:
    """A connection borrowed from a user's sync pool (``engine.raw_connection()``)."""

    __slots__ = ("conn", "done", "proxy", "restore")

    def __init__(self, proxy: Any, restore: Callable[[], None]) -> None:
        self.done = False
        self.proxy = proxy
        self.conn = proxy.driver_connection
        self.restore = restore

    @classmethod
    def borrow(
        cls, engine: Any, session: Callable[[Any], tuple[Any, Callable[[], None]]]
    ) -> tuple[Lease, Any]:
        """Check a connection out of ``engine``, set up by ``session``; return it and its cursor."""
        proxy = engine.raw_connection()
        try:
            cursor, restore = session(proxy.driver_connection)
        except BaseException:
            proxy.invalidate()
            proxy.close()
            raise
        return cls(proxy, restore), cursor

    def give_back(self) -> None:
        """Return the connection to the pool; one the store cannot restore is discarded."""
        if self.done:
            return
        self.done = True
        try:
            self.restore()
        except Exception:  # noqa: BLE001 - a session we cannot reset must not be reused
            if not self.proxy.invalidated:
                self.proxy.invalidate()
        self.proxy.close()


class AsyncLease:
    """A connection borrowed from a user's ``AsyncEngine`` (``AsyncConnection``)."""

    __slots__ = ("conn", "connection", "done", "loop", "restore")

    def __init__(self, connection: Any, conn: Any, restore: Callable[[], Awaitable[None]]) -> None:
        import asyncio  # noqa: PLC0415 - only async callers pay for asyncio

        self.done = False
        self.connection = connection
        self.conn = conn
        self.restore = restore
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def borrow(
        cls,
        engine: Any,
        session: Callable[[Any], Awaitable[tuple[Any, Callable[[], Awaitable[None]]]]],
    ) -> tuple[AsyncLease, Any]:
        """``Lease.borrow`` for an ``AsyncEngine``: its native async driver connection."""
        connection = await engine.connect()
        try:
            raw = await connection.get_raw_connection()
            conn = raw.driver_connection
            cursor, restore = await session(conn)
        except BaseException:
            await connection.invalidate()
            await connection.close()
            raise
        return cls(connection, conn, restore), cursor

    async def give_back(self) -> None:
        """Return the connection to the pool as the user's code expects it."""
        if self.done:
            return
        self.done = True
        try:
            await self.restore()
        except Exception:  # noqa: BLE001 - a session we cannot reset must not be reused
            await self.connection.invalidate()
        await self.connection.close()

    async def _invalidate(self) -> None:
        try:
            await self.connection.invalidate()
        finally:
            await self.connection.close()

    def discard(self) -> bool:
        """Invalidate the connection on a task of its loop; False if that loop is gone."""
        import asyncio  # noqa: PLC0415 - only async callers pay for asyncio

        if self.done:
            return True
        if self.loop.is_closed() or not self.loop.is_running():
            return False
        self.done = True

        def start() -> None:
            task = self.loop.create_task(self._invalidate())
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            start()
        else:
            self.loop.call_soon_threadsafe(start)
        return True


def check_engine(
    engine: Any, kind: str, drivers: tuple[str, ...], *, is_async: bool = False
) -> Any:
    """Return ``engine`` if it is a SQLAlchemy engine of ``kind`` on one of ``drivers``.

    A sync ``Engine``, or with ``is_async`` an ``AsyncEngine``.

    Raises:
        ConfigError: an engine of the other kind, another database, or another driver.
    """
    if is_async:
        if not hasattr(engine, "sync_engine"):
            raise ConfigError(f"async_engine needs an AsyncEngine, got {type(engine).__name__}")
        check_engine(engine.sync_engine, kind, drivers)
        return engine
    if hasattr(engine, "sync_engine"):
        raise ConfigError(
            "an AsyncEngine cannot be a store's only engine (the store creates its tables "
            "and serves its sync methods on sync connections): pass a sync Engine, and the "
            "AsyncEngine as async_engine="
        )
    dialect = getattr(engine, "dialect", None)
    if not callable(getattr(engine, "raw_connection", None)) or dialect is None:
        raise ConfigError(f"from_engine needs a SQLAlchemy Engine, got {type(engine).__name__}")
    if dialect.name != kind or dialect.driver not in drivers:
        raise ConfigError(
            f"the engine is {dialect.name}+{dialect.driver}; this store needs "
            f"{' or '.join(f'{kind}+{d}' for d in drivers)}"
        )
    return engine


def server_url_of(engine: Any) -> str:
    """The engine's URL without password and options: what the store shows and parses.

    The engine keeps its own credentials and connect arguments; the store never sees them.
    """
    url = engine.url.set(password=None, query={})
    return str(url.render_as_string(hide_password=False))
