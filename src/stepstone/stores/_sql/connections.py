"""The SQL stores' connections: one per thread (sync), a small pool per event loop (async).

- Sync: one connection per thread, kept in a thread-local (the thread-local *is* the
  pool), each with its own lock. A call holds its connection's lock while it uses it,
  and ``close`` takes every lock before closing: a connection is never closed under a
  call running on it (closing a SQLite connection mid-statement can crash the process).
  A call that finds the store closed raises ``StoreError`` saying so.
- Async (native backends): connections per event loop, handed to one task at a time
  and dropped, never reused, if the task was cancelled or failed mid-statement: a
  cancelled await must not leave a half-read result on a connection someone reuses.
- Fork safety: a forked child forgets the connections it inherited without touching
  them (the dialect says how to detach) and opens its own; its group committer starts
  empty (the parent's leader and waiters are threads the child does not have).
- Where a connection comes from is the dialect's hook (``_open_connection``): its own
  driver call, or a user's SQLAlchemy engine (``_engine.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from ..._errors import InvalidState, StoreError, StoreUnavailable
from .._common import Unanswered
from .._errortable import ErrorRule
from .._group import GroupCommit, Pending
from .engine import AsyncLease, Lease
from .errors import Undecodable, invalid_text, store_error

if TYPE_CHECKING:
    import asyncio

__all__ = ["ASYNC_POOL_SIZE", "CLOSE_WAIT", "Connections", "Held"]

#: How long ``close`` waits for a call in flight on another thread before leaving that
#: connection for its thread to close when the call returns.
CLOSE_WAIT: Final = 10.0
#: Async connections kept per event loop; more concurrent tasks wait for one.
ASYNC_POOL_SIZE: Final = 16

# Each open store's "forget your connections" (weakly: a store nobody holds is gone).
_forgetters: dict[int, weakref.WeakMethod[Callable[[], None]]] = {}
# Connections a forked child inherited: kept referenced (never finalized) and unused.
inherited: list[object] = []


def _after_fork_in_child() -> None:
    for ref in list(_forgetters.values()):
        forget = ref()
        if forget is not None:
            forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


_T = TypeVar("_T")
#: A save's piece statements, (sql, params) each (``effects.Exec.first``).
Pieces = tuple[tuple[str, Any], ...]


@dataclass(slots=True, weakref_slot=True, eq=False, repr=False)
class Held:
    """One connection (and cursor), the lock a call holds while using it, and its state.

    When a thread ends, its thread-local values are dropped, this object with them, and
    ``__del__`` closes the connection: threads that come and go leak nothing. Compared
    and hashed by identity (``eq=False``): stores keep their connections in lists.
    """

    closer: Callable[[Held], None]
    conn: Any
    cursor: Any
    is_async: bool = False
    #: From a user's SQLAlchemy engine: its pool's proxy, and how to give it back.
    lease: Lease | AsyncLease | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    #: A forked child's copy: never closed (the parent's session would end).
    inherited: bool = field(default=False, init=False)
    #: Set by ``close`` when a call held the lock too long: its thread closes it.
    doomed: bool = field(default=False, init=False)

    def close(self) -> None:
        """Close the connection, unless a forked child inherited it."""
        if not self.inherited:
            # Also run from ``__del__`` and at interpreter exit: nothing to report to.
            with contextlib.suppress(Exception):
                self.closer(self)

    def __del__(self) -> None:
        self.close()


class AsyncPool:
    """The async connections of one event loop."""

    __slots__ = ("all", "idle", "slots")

    def __init__(self, size: int) -> None:
        import asyncio  # noqa: PLC0415 - asyncio costs sync users ~40 ms at import

        self.idle: list[Held] = []
        self.all: set[Held] = set()
        self.slots = asyncio.Semaphore(size)


class Connections:
    """Connections of one store and the two I/O primitives, ``_on_held`` and ``_aexec``.

    ``_exec`` runs one plain statement on ``_on_held``.
    """

    #: The dialect's error table, first match wins.
    _ERRORS: ClassVar[tuple[ErrorRule, ...]] = ()
    _CLOSED: ClassVar[str] = "the store is closed"

    # Set by subclasses before ``_setup``.
    where: str
    table: str
    _driver_error: type[BaseException] = Exception
    #: A user's SQLAlchemy ``Engine`` whose pool the sync connections come from, and
    #: ``AsyncEngine`` for the async ones (``from_engine``); None: the store opens its own.
    _engine: Any = None
    _aengine: Any = None

    def _setup(self) -> None:
        """Initialise the shared state; subclasses call it before opening anything."""
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._requests = 0
        self._local = threading.local()
        self._held: weakref.WeakSet[Held] = weakref.WeakSet()
        self._apools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncPool] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False
        #: Set by dialects that batch concurrent saves (``_run_batch``).
        self._group: GroupCommit | None = None
        #: Saves whose answer was lost, for their retry (``stores._common.Unanswered``).
        self._unanswered = Unanswered()

    def _register(self) -> None:
        _forgetters[id(self)] = weakref.WeakMethod(self._forget_connections)

    def _open_first(self, open_first: Callable[[], None]) -> None:
        """End a constructor: ``open_first`` (the first connection, the schema), closing
        whatever it opened if it fails; then register the store for fork safety."""
        try:
            open_first()
        except BaseException:
            self.close()
            raise
        self._register()

    # --- dialect hooks ------------------------------------------------------------------

    def _open_connection(self) -> tuple[Any, Any]:
        """Open a new sync connection; return it and the object statements run on."""
        raise NotImplementedError

    def _run(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        """Run one statement; return (rowcount, rows). Raises driver errors."""
        raise NotImplementedError

    def _run_keys(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        """Run a statement reading keys that may not decode as text (``Exec.keys``)."""
        return self._run(held, sql, params)

    def _run_save(self, held: Held, sql: str, params: Any, first: Pieces = ()) -> int:
        """Run a save's statement; return the rowcount. Servers: one autocommit statement,
        or with ``first`` (its pieces: ``Exec.first``) one transaction holding them too."""
        raise NotImplementedError

    def _run_batch(self, held: Held, items: list[Pending]) -> None:
        """Run several saves' statements in ONE transaction and commit it (group commit).

        Sets each item's ``stored`` (rows changed) or ``error`` (its own statement
        failed: ``_statement_error``), and returns only after the COMMIT returned.
        Raises for a failure of the whole transaction (nothing of it was committed).
        """
        raise NotImplementedError

    def _run_many(self, held: Held, items: list[Pending]) -> None:
        """``save_many`` where ``saves_together`` without group commit (PostgreSQL): the
        saves in one transaction; sets each item's ``stored``, raises a driver error for
        the transaction as a whole (nothing of it committed)."""
        raise NotImplementedError

    def _close_connection(self, held: Held) -> None:
        if isinstance(held.lease, Lease):
            held.lease.give_back()
        else:
            held.conn.close()

    def _engine_session(self, conn: Any) -> tuple[Any, Callable[[], None]]:
        """Set up a connection the user's engine opened; return its cursor and an undo."""
        raise NotImplementedError

    async def _aengine_session(self, conn: Any) -> tuple[Any, Callable[[], Awaitable[None]]]:
        """``_engine_session`` for a connection of the user's ``AsyncEngine``."""
        raise NotImplementedError

    def _is_broken(self, held: Held) -> bool:
        """After a driver error: whether the connection can no longer be used."""
        return False

    def _error_code(self, exc: BaseException) -> int | str | None:
        return None

    def _detach(self, held: Held) -> None:
        """In a forked child: make ``held`` harmless without telling the server."""

    def _scrub(self, text: str) -> str:
        return text

    def _decoding_error(self, exc: BaseException) -> bool:
        """Whether a driver error means a stored text was not decodable."""
        return False

    async def _aopen_connection(self) -> tuple[Any, Any]:
        raise NotImplementedError

    async def _arun(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        raise NotImplementedError

    async def _arun_save(self, held: Held, sql: str, params: Any, first: Pieces) -> int:
        """Async ``_run_save`` of a save with pieces (``first``): one transaction."""
        raise NotImplementedError

    def _adrop(self, held: Held) -> None:
        """Close an async connection without awaiting (also from a cancelled task)."""

    def _fire_before(self) -> None:
        """Fire the save's hook before the request (servers override)."""

    def _fire_after(self) -> None:
        """Fire the save's hook after the request (servers override)."""

    # --- errors and counters ------------------------------------------------------------

    def _closed_error(self) -> StoreError:
        return StoreError(f"{self.where}: {self._CLOSED}")

    def _translate(self, exc: BaseException) -> StoreError:
        return store_error(
            self._ERRORS,
            exc,
            self._error_code(exc),
            where=self.where,
            table=self.table,
            scrub=self._scrub,
        )

    def _statement_error(self, exc: BaseException) -> BaseException:
        """The error one save of a batch raises when its own statement failed."""
        if isinstance(exc, UnicodeEncodeError):
            return invalid_text(exc)
        if isinstance(exc, self._driver_error):
            error = self._translate(exc)
            error.__cause__ = exc
            return error
        return exc

    @property
    def requests_sent(self) -> int:
        """Statements sent to the server by this store (one round trip each)."""
        return self._requests

    def _count(self) -> None:
        with self._count_lock:
            self._requests += 1

    # --- sync ---------------------------------------------------------------------------

    def _adopt(self, conn: Any, cursor: Any, lease: Lease | None = None) -> Held:
        """Make ``conn`` this thread's connection."""
        held = Held(self._close_connection, conn, cursor, lease=lease)
        with self._lock:
            if self._closed:
                held.close()
                raise self._closed_error()
            self._held.add(held)
            self._local.held = held
        return held

    def _connect(self) -> Held:
        """Open this thread's connection (the slow path of every call)."""
        if self._closed:
            raise self._closed_error()
        if self._engine is not None:
            return self._borrow()
        try:
            conn, cursor = self._open_connection()
        except self._driver_error as exc:
            raise self._translate(exc) from exc
        return self._adopt(conn, cursor)

    def _borrow(self) -> Held:
        """Take this thread's connection from the user's engine (their pool and hooks)."""
        with self._engine_errors():
            lease, cursor = Lease.borrow(self._engine, self._engine_session)
        return self._adopt(lease.conn, cursor, lease)

    @contextlib.contextmanager
    def _engine_errors(self) -> Iterator[None]:
        """Translate the driver error inside SQLAlchemy's wrapper (``DBAPIError.orig``)."""
        try:
            yield
        except Exception as exc:
            orig = getattr(exc, "orig", None)
            if isinstance(orig, self._driver_error):
                raise self._translate(orig) from exc
            raise

    def _release(self, held: Held) -> None:
        """After a call outside ``_exec``: give a user's engine its connection back."""
        if held.lease is not None:
            self._drop(held)

    def _thread_held(self) -> Held:
        try:
            return self._local.held  # type: ignore[no-any-return]
        except AttributeError:
            return self._connect()

    def _drop(self, held: Held) -> None:
        """Forget ``held`` (this thread reconnects on its next call) and close it."""
        if getattr(self._local, "held", None) is held:
            del self._local.held
        self._held.discard(held)
        held.close()

    def _exec(self, sql: str, params: Any = None) -> tuple[int, list[Any]]:
        """Run one statement on this thread's connection, translating errors.

        A plan's statements (a save, raw keys) go through ``SQLStore._perform``.
        """
        return self._on_held(self._run, sql, params)

    def _on_held(self, call: Callable[..., _T], *args: Any) -> _T:
        """Run ``call(held, *args)`` on this thread's connection, holding it; settle errors.

        No context manager: this runs once per statement, and a generator-based one
        costs more than the rest of the wrapper.
        """
        held = self._thread_held()
        with held.lock:
            if self._closed:
                raise self._closed_error()
            try:
                return call(held, *args)
            except BaseException as exc:
                error = self._settle(held, exc)
                if error is exc:
                    raise
                raise error from exc
            finally:
                # A user's engine gets its connection back after each call.
                if held.doomed or held.lease is not None:
                    self._drop(held)

    def _settle(self, held: Held, exc: BaseException) -> BaseException:
        """Return what to raise for ``exc`` raised while ``held`` ran a call.

        Driver errors are translated (``held`` dropped if they broke it); a value the call
        refused leaves the connection fine; anything else (a kill-point hook,
        KeyboardInterrupt) may have left it mid-statement or mid-transaction: it is
        dropped, never reused.
        """
        if isinstance(exc, UnicodeEncodeError):  # a lone surrogate in the state's strings
            return invalid_text(exc)
        if isinstance(exc, UnicodeDecodeError):
            self._drop(held)  # the driver stopped mid-result
            return Undecodable(str(exc))
        if isinstance(exc, self._driver_error):
            if self._decoding_error(exc):
                return Undecodable(str(exc))
            if self._is_broken(held):
                self._drop(held)
            return self._translate(exc)
        if not isinstance(exc, (InvalidState, Undecodable)):
            self._drop(held)
        return exc

    def _group_save(self, group: GroupCommit, sql: str, params: Any, first: Pieces = ()) -> int:
        """Submit one save to the group commit; return its rowcount once committed."""
        if self._closed:
            raise self._closed_error()
        item = Pending(sql, params, first)
        group.submit(item)
        if item.error is not None:
            raise item.error
        return item.stored or 0

    def _group_many(self, group: GroupCommit, items: list[Pending]) -> None:
        """Submit several saves to the group commit as one batch (``save_many``)."""
        if self._closed:
            raise self._closed_error()
        group.submit_many(items)

    def _commit_batch(self, items: list[Pending]) -> None:
        """Run a batch of saves on this thread's connection (the group's ``execute``)."""
        self._on_held(self._run_batch, items)

    # --- async --------------------------------------------------------------------------

    def _apool(self) -> AsyncPool:
        import asyncio  # noqa: PLC0415 - only async callers pay for asyncio

        loop = asyncio.get_running_loop()
        pool = self._apools.get(loop)
        if pool is None:
            pool = self._pool_for_new_loop(loop)
        return pool

    def _pool_for_new_loop(self, loop: Any) -> AsyncPool:
        """A pool for ``loop``; the connections of loops that have closed are closed.

        A caller that runs each call in its own loop (``asyncio.run`` per request) left
        one open connection per loop: a connection whose driver keeps its loop (aiomysql's
        transport) also keeps the loop, the weak key of its pool, alive, so nothing ever
        closed it, and MariaDB refused new ones at ``max_connections`` (seen: 152 after
        300 ``asyncio.run`` calls). Swept as each new loop's pool is made, so at most one
        ended loop's connections stay open between calls.
        """
        pool = AsyncPool(ASYNC_POOL_SIZE)
        with self._lock:  # the pools of other threads' loops come and go meanwhile
            ended = [p for known, p in self._apools.items() if known.is_closed()]
            self._apools = weakref.WeakKeyDictionary(
                (known, p) for known, p in self._apools.items() if not known.is_closed()
            )
            self._apools[loop] = pool
        for old in ended:
            old.idle = []
            for held in list(old.all):  # no call can be using them: their loop is closed
                old.all.discard(held)
                self._aforget(held)
        return pool

    async def _acheckout(self, pool: AsyncPool) -> Held:
        """An idle connection of this loop, or a new one."""
        if pool.idle:
            return pool.idle.pop()
        if self._aengine is not None:
            with self._engine_errors():
                lease, cursor = await AsyncLease.borrow(self._aengine, self._aengine_session)
            held = Held(self._aforget, lease.conn, cursor, is_async=True, lease=lease)
            pool.all.add(held)
            return held
        try:
            conn, cursor = await self._aopen_connection()
        except self._driver_error as exc:
            raise self._translate(exc) from exc
        except (TimeoutError, OSError) as exc:
            raise StoreUnavailable(
                f"{self.where}: cannot connect ({type(exc).__name__}: {exc})"
            ) from exc
        held = Held(self._aforget, conn, cursor, is_async=True)
        pool.all.add(held)
        return held

    async def _aexec(
        self, sql: str, params: Any = None, *, save: bool = False, first: Pieces = ()
    ) -> tuple[int, list[Any]]:
        """Run one statement on a connection of this loop, translating errors."""
        if self._closed:
            raise self._closed_error()
        pool = self._apool()
        async with pool.slots:
            held = await self._acheckout(pool)
            reuse = False
            try:
                if self._closed:
                    raise self._closed_error()
                if save:
                    self._fire_before()
                result: tuple[int, list[Any]]
                if first:
                    result = await self._arun_save(held, sql, params, first), []
                else:
                    result = await self._arun(held, sql, params)
                if save:
                    self._fire_after()
                reuse = True
                return result
            except UnicodeEncodeError as exc:
                raise invalid_text(exc) from exc
            except UnicodeDecodeError as exc:
                raise Undecodable(str(exc)) from exc
            except self._driver_error as exc:
                if self._decoding_error(exc):
                    raise Undecodable(str(exc)) from exc
                if self._closed:  # closed from another thread under this call
                    raise self._closed_error() from exc
                reuse = not self._is_broken(held)
                raise self._translate(exc) from exc
            finally:
                # Cancelled, timed out or broken mid-statement: drop the connection.
                if reuse and not self._closed and held.lease is None:
                    pool.idle.append(held)
                else:
                    pool.all.discard(held)
                    if reuse and isinstance(held.lease, AsyncLease):
                        await held.lease.give_back()  # a user's engine: after each call
                    else:
                        self._aforget(held)

    def _aforget(self, held: Held) -> None:
        """Close an async connection that will not be reused, without awaiting."""
        if isinstance(held.lease, AsyncLease) and held.lease.discard():
            return  # invalidated through the user's pool, on a task of its loop
        with contextlib.suppress(Exception):
            self._adrop(held)

    async def _agive_back(self) -> None:
        """Give this loop's idle connections back to the user's ``AsyncEngine``."""
        pool = self._apool()
        idle, pool.idle = pool.idle, []
        for held in idle:
            pool.all.discard(held)
            if isinstance(held.lease, AsyncLease):
                await held.lease.give_back()
            else:
                self._aforget(held)

    # --- close and fork -----------------------------------------------------------------

    def close(self) -> None:
        """Close every connection; calls in flight finish first. Closing twice is allowed.

        A call that starts after ``close`` raises ``StoreError`` saying the store is
        closed. A call still running after ``CLOSE_WAIT`` seconds keeps its connection
        until it returns, then its thread closes it.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held, self._held = list(self._held), weakref.WeakSet()
            self._local = threading.local()
            pools, self._apools = list(self._apools.values()), weakref.WeakKeyDictionary()
        for item in held:
            if item.lock.acquire(timeout=CLOSE_WAIT):
                try:
                    item.close()
                finally:
                    item.lock.release()
            else:
                item.doomed = True  # its thread closes it when its call returns
        for pool in pools:
            # Only the idle ones: a task using a connection drops it itself when its call
            # returns (it sees the store closed), so no call loses its socket mid-flight.
            idle, pool.idle = pool.idle, []
            for item in idle:
                pool.all.discard(item)
                self._aforget(item)
        _forgetters.pop(id(self), None)

    def _forget_connections(self) -> None:
        """In a forked child: never touch the inherited connections again."""
        for held in [*self._held, *(h for p in self._apools.values() for h in p.all)]:
            held.inherited = True
            with contextlib.suppress(Exception):
                self._detach(held)
            inherited.append(held)
        self._held = weakref.WeakSet()
        self._apools = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        if self._group is not None:
            self._group.reset()
