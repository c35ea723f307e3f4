"""PostgreSQL push wake-ups: ``NOTIFY`` after a write that makes work, ``LISTEN`` in workers.

- The channel is derived from the table name (``stepstone.<table>``): stores on other
  tables of the database do not wake each other. The table name is checked when the
  store is opened (``check_table``); ``LISTEN`` quotes the channel as an identifier and
  ``pg_notify`` takes it as a parameter, so no text is ever spliced into SQL.
- A listener holds one connection of its own (autocommit, so each notification is
  delivered as soon as its sender commits) and a daemon thread that waits in ``poll``
  on its socket. Nothing is sent while idle except a ``SELECT 1`` every
  ``HEARTBEAT`` seconds, which (with the read timeout and TCP keepalives) notices a
  server that stopped answering without closing the connection.
- A dropped connection (server restart, ``pg_terminate_backend``, network) is
  reconnected with a doubling back-off, and the listener rings once after every
  ``LISTEN``: notifications sent while it was not listening are lost, and the worker's
  look at the claim index finds what they were about.
- ``close`` is prompt: it wakes the thread's ``poll`` and shuts the socket down, which
  ends a statement the server never answers. A connect stuck on such a server ends by
  ``connect_timeout``; the listener is closed already and rings nothing.
- Errors are logged with the store's ``where`` (never the password) and the driver's
  text scrubbed of it.
"""

from __future__ import annotations

import contextlib
import functools
import random
import socket
from collections.abc import Callable
from typing import Any, Final

from ..._observe import logger
from .._listening import RETRY_FIRST, RETRY_MAX, ListenerThread

__all__ = ["HEARTBEAT", "PostgresListener", "channel_of", "stream_channel_of"]

#: Seconds of silence after which the listener checks its connection with ``SELECT 1``.
HEARTBEAT: Final = 20.0
_OK: Final = 0  # libpq's CONNECTION_OK
#: What ``pg_stat_activity.application_name`` shows for a listener's connection.
APPLICATION_NAME: Final = "stepstone listener"


def channel_of(table: str) -> str:
    """Return the notification channel of the store on ``table`` (a checked table name)."""
    return f"stepstone.{table}"


def stream_channel_of(table: str) -> str:
    """Return the channel stream writers notify after each flush (issue 34).

    A channel of its own, so a flush wakes stream readers and not the workers; a table
    name has no dot, so it never equals another table's ``channel_of`` (60 bytes at
    most: under PostgreSQL's 63).
    """
    return f"stepstone.s.{table}"


@functools.cache
def _connection_class() -> type[Any]:
    """A psycopg connection whose statements time out, but whose ``notifies`` waits do not.

    The store's own class applies its read timeout to every wait; ``notifies`` passes a
    timeout of its own and handles it itself, so only waits without one get ours.
    """
    import psycopg  # noqa: PLC0415 - the driver is imported only by PostgreSQL users
    from psycopg import errors  # noqa: PLC0415

    # psycopg's own wait raises this private class on a timeout; nothing public names it.
    wait_timeout: type[BaseException] = errors._WaitTimeout  # noqa: SLF001

    class Connection(psycopg.Connection[Any]):
        read_timeout: float = 30.0

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            if timeout is not None:
                return super().wait(gen, interval=interval, timeout=timeout)
            try:
                return super().wait(gen, interval=interval, timeout=self.read_timeout)
            except wait_timeout:
                with contextlib.suppress(Exception):
                    self.pgconn.finish()
                raise psycopg.OperationalError(f"no answer within {self.read_timeout} s") from None

    return Connection


class PostgresListener(ListenerThread):
    """``LISTEN`` on the store's channel in a daemon thread; ring on every notification."""

    def __init__(
        self,
        ring: Callable[[], None],
        *,
        where: str,
        table: str,
        connect_args: dict[str, Any],
        read_timeout: float,
        scrub: Callable[[str], str],
        own: Callable[[], set[int]] = set,
        channel: str | None = None,
        deliver: Callable[[set[str]], None] | None = None,
    ) -> None:
        """Listen on ``table``'s channel with a connection opened from ``connect_args``.

        ``where`` names the store in messages; ``scrub`` removes the password from a
        driver's text; ``own`` returns the server pids of the store's own connections,
        whose notifications are not rung: ``announce`` rang this process's doorbell
        before sending them. ``channel`` replaces the table's workers' channel (stream
        readers listen on ``stream_channel_of``). ``deliver``, if given, is called
        instead of ``ring`` with the payloads of the notifications that arrived (the
        run ids a stream channel's writers send), so one connection can wake only the
        readers of those runs; ``ring`` still comes after every ``LISTEN``.
        """
        super().__init__(ring, f"stepstone-listen {where}")
        self._where = where
        self._scrub = scrub
        self._own = own
        self._read_timeout = read_timeout
        self._connect_args = {**connect_args, "application_name": APPLICATION_NAME}
        self._channel = channel if channel is not None else channel_of(table)
        self._conn: Any = None
        self._failing = False
        self._deliver = deliver

    @property
    def backend_pid(self) -> int | None:
        """The server process of the listening connection, None while not connected."""
        conn = self._conn
        try:
            return None if conn is None else int(conn.info.backend_pid)
        except Exception:  # noqa: BLE001 - closed under us: not connected
            return None

    # --- the connection -----------------------------------------------------------------

    def _connect(self) -> Any:
        from psycopg import sql  # noqa: PLC0415

        conn = _connection_class().connect(**self._connect_args)
        conn.read_timeout = self._read_timeout
        with self._lock:
            if self.closed:
                conn.close()
                return None
            self._conn = conn
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        return conn

    def _drop(self) -> None:
        # Under the lock: ``interrupt`` shuts the socket down only while it is open, so
        # a descriptor number reused by anyone else is never touched.
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def interrupt(self) -> None:
        conn = self._conn
        if conn is None:
            return
        with contextlib.suppress(Exception):
            fd = conn.pgconn.socket
            # A duplicate of the socket: shutting it down wakes a recv blocked on the
            # original (a statement the server never answers); closing it closes only
            # the duplicate.
            with socket.socket(fileno=socket.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        self._drop()

    # --- the thread ---------------------------------------------------------------------

    def serve(self) -> None:
        delay = RETRY_FIRST
        while not self.closed:
            try:
                conn = self._connect()
                if conn is None:
                    return
            except Exception as exc:  # noqa: BLE001 - any failure: try again later
                self._drop()
                if self.closed:
                    return  # interrupted by close
                self._report(exc)
                # Jitter: listeners that lost one server do not all come back at once.
                if not self.pause(delay * random.uniform(0.5, 1.0)):
                    return
                delay = min(delay * 2, RETRY_MAX)
                continue
            delay = RETRY_FIRST
            if self._failing:
                self._failing = False
                logger.info("%s: listening for new work again", self._where)
            # Announcements sent while nobody listened are lost: look once.
            self.ring()
            try:
                self._listen(conn)
            except Exception as exc:  # noqa: BLE001 - the connection failed: reconnect
                if self.closed:
                    return
                self._report(exc)
            finally:
                self._drop()

    def _listen(self, conn: Any) -> None:
        while True:
            ready = self.wait(conn.pgconn.socket, HEARTBEAT)
            if ready is None:
                return
            if not ready:
                conn.execute("SELECT 1")  # notifications meanwhile wait in the backlog
            # A tiny timeout: take what has arrived (and the backlog), never wait.
            notes = list(conn.notifies(timeout=0.001))
            if notes:
                own = self._own()
                payloads = {n.payload for n in notes if n.pid not in own}
                if payloads:
                    self._heard(payloads)
            if conn.closed or conn.broken or conn.pgconn.status != _OK:
                raise ConnectionError("the connection was closed")

    def _heard(self, payloads: set[str]) -> None:
        if self._deliver is None:
            self.ring()
            return
        # Under the lock, as ``ring``: nothing is delivered after ``close`` returns.
        with self._lock:
            if self.closed:
                return
            try:
                self._deliver(payloads)
            except Exception as exc:  # noqa: BLE001 - a reader's fault must not stop listening
                logger.debug("a stream wake-up raised %s; ignored", type(exc).__name__)

    def _report(self, exc: BaseException) -> None:
        text = self._scrub(f"{type(exc).__name__}: {exc}".strip())
        if not self._failing:
            self._failing = True
            logger.warning(
                "%s: not listening for new work (%s); reconnecting, workers poll meanwhile",
                self._where,
                text,
            )
        else:
            logger.debug("%s: still not listening (%s)", self._where, text)
