"""The SQL base shared by SQLiteStore, PostgresStore and MySQLStore.

Shape (DBOS ``_sys_db.py``): the logic lives here, once; each dialect module supplies
only what differs: how to open a connection, how to run one statement on it, how its
driver reports errors (a table of ``ErrorRule``), how times are stored, and how the
schema is created and migrated under that server's locking rules.

- Connections: one per thread, kept in a thread-local (the thread-local *is* the pool),
  each with its own lock. A call holds its connection's lock while it uses it, and
  ``close`` takes every lock before closing: a connection is never closed under a call
  running on it (closing a SQLite connection mid-statement can crash the process). A
  call that finds the store closed raises ``StoreError`` saying so.
- Async (native backends): connections per event loop, handed to one task at a time
  and dropped, never reused, if the task was cancelled or failed mid-statement: a
  cancelled await must not leave a half-read result on a connection someone reuses.
- Statements, parameters, error translation and document handling are shared by the
  sync and async paths (LangGraph's ``base.py`` / ``aio.py`` shape): ``_save_plan``
  builds the statement and its parameters, ``_save_outcome`` judges the row count, and
  only the I/O differs between ``save`` and ``asave``.
- Group commit (SQLite, ``_group.py``): concurrent saves of one process share one
  transaction and its fsync, each keeping its own compare-and-swap outcome; a lone save
  commits at once. A dialect opts in by implementing ``_run_batch``. The servers do not:
  each save stays one autocommit statement (one round trip, also alone), and the
  server already flushes the WAL / redo log of concurrent sessions together (measured
  on PostgreSQL with a slow fsync: 64 threads 11x one thread, one statement per save).
- Fork safety: a forked child forgets the connections it inherited without touching
  them (the dialect says how to detach) and opens its own; its group committer starts
  empty (the parent's leader and waiters are threads the child does not have).
- Schema: a ``<meta>`` table holds ``schema_version`` (``TABLE_SCHEMA``, the version of
  the *tables*; documents carry their own). A missing schema is created, an older one
  migrated (each dialect serializes concurrent openers), a newer one refused.
- Foreign and hand-edited rows: a row holding another run's document, a bad timestamp
  or text that is not UTF-8 is that run's ``CorruptCheckpoint`` in ``load``, and is
  logged and skipped by ``list_info`` and ``claimable`` without hiding the others.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import hashlib
import math
import os
import re
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import unquote, urlsplit

from .. import _hooks
from .._checkpoint import STATUSES, Checkpoint, check_run_id, utcnow
from .._codec import (
    checkpoint_from_doc,
    decode_document,
    encode_document,
    encode_state,
    format_created,
)
from .._errors import (
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidState,
    StoreError,
    StoreUnavailable,
)
from .._observe import logger
from .._store import RunInfo, Store, check_page
from ._common import new_version, parse_options
from ._group import GroupCommit, Pending

if TYPE_CHECKING:
    import asyncio

    from .._checkpoint import RunStatus


__all__ = ["TABLE_SCHEMA", "ErrorRule", "SQLStore", "translate"]

#: Version of the tables' layout (not of the documents in them). 2 added ``due_at`` and
#: ``owner`` beside ``status`` and the (status, due_at) index that ``claimable`` reads.
TABLE_SCHEMA: Final = 2
#: How long ``close`` waits for a call in flight on another thread before leaving that
#: connection for its thread to close when the call returns.
CLOSE_WAIT: Final = 10.0
#: Async connections kept per event loop; more concurrent tasks wait for one.
ASYNC_POOL_SIZE: Final = 16

# --- errors -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorRule:
    """One row of a dialect's error table: which driver errors become which of ours.

    A rule matches when any of its criteria does: the driver's error ``codes`` (MySQL
    error numbers, SQLite primary result codes, PostgreSQL SQLSTATEs), a SQLSTATE class
    in ``prefixes``, the exception's class name in ``classes``, or a lower-case
    substring of its text in ``text``. ``message`` is formatted with ``where``, ``text``
    and ``table``.
    """

    error: type[StoreError]
    message: str
    codes: frozenset[int | str] = frozenset()
    prefixes: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    text: tuple[str, ...] = ()

    def matches(self, code: int | str | None, names: set[str], lowered: str) -> bool:
        """Return whether the error with this code, class names and text matches."""
        if code is not None and code in self.codes:
            return True
        if isinstance(code, str) and code and code.startswith(self.prefixes):
            return True
        if names.intersection(self.classes):
            return True
        return any(t in lowered for t in self.text)


def translate(
    rules: tuple[ErrorRule, ...],
    exc: BaseException,
    code: int | str | None,
    *,
    where: str,
    table: str,
    scrub: Callable[[str], str] = str,
) -> StoreError:
    """Return the stepstone error for driver error ``exc``: the first matching rule's."""
    text = scrub(" ".join(str(exc).split()))
    lowered = text.lower()
    names = {cls.__name__ for cls in type(exc).__mro__}
    for rule in rules:
        if rule.matches(code, names, lowered):
            error = rule.error(rule.message.format(where=where, text=text, table=table))
            return error
    return StoreError(f"{where}: {type(exc).__name__}: {text}")


class _Undecodable(Exception):
    """A row held text the driver could not decode (hand-edited, not UTF-8)."""


# --- connections ------------------------------------------------------------------------

_open_stores: weakref.WeakSet[SQLStore] = weakref.WeakSet()
# Connections a forked child inherited: kept referenced (never finalized) and unused.
_inherited: list[object] = []


def _after_fork_in_child() -> None:
    for store in list(_open_stores):
        store._forget_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Held:
    """One connection (and cursor), the lock a call holds while using it, and its state.

    When a thread ends, its thread-local values are dropped, this object with them, and
    ``__del__`` closes the connection: threads that come and go leak nothing.
    """

    __slots__ = (
        "__weakref__",
        "conn",
        "cursor",
        "doomed",
        "inherited",
        "is_async",
        "lock",
        "store",
    )

    def __init__(self, store: SQLStore, conn: Any, cursor: Any, is_async: bool = False) -> None:
        self.store = store
        self.is_async = is_async
        self.conn = conn
        self.cursor = cursor
        self.lock = threading.Lock()
        self.inherited = False
        # Set by ``close`` when a call held the lock too long: its thread closes it.
        self.doomed = False

    def close(self) -> None:
        if not self.inherited:
            with contextlib.suppress(Exception):
                if self.is_async:
                    self.store._adrop(self)
                else:
                    self.store._close_connection(self)

    def __del__(self) -> None:
        self.close()


class _AsyncPool:
    """The async connections of one event loop."""

    __slots__ = ("all", "idle", "slots")

    def __init__(self, size: int) -> None:
        import asyncio  # noqa: PLC0415 - asyncio costs sync users ~40 ms at import

        self.idle: list[Held] = []
        self.all: set[Held] = set()
        self.slots = asyncio.Semaphore(size)


# --- the base ---------------------------------------------------------------------------


class SQLStore(Store):
    """The SQL store logic, once; subclasses supply the dialect hooks below."""

    #: The dialect's error table, first match wins.
    _ERRORS: ClassVar[tuple[ErrorRule, ...]] = ()
    _CLOSED: ClassVar[str] = "the store is closed"
    #: ``_db_time(t)`` is ``t.isoformat()`` for a UTC ``t``: the save reuses the text it
    #: formatted for the document instead of formatting each time twice.
    _ISO_TIMES: ClassVar[bool] = False

    # Set by subclasses before ``_setup``.
    where: str
    table: str
    _sql: Any
    _driver_error: type[BaseException] = Exception

    def _setup(self) -> None:
        """Initialise the shared state; subclasses call it before opening anything."""
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._requests = 0
        self._local = threading.local()
        self._held: weakref.WeakSet[Held] = weakref.WeakSet()
        self._apools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncPool] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False
        #: Set by dialects that batch concurrent saves (``_run_batch``).
        self._group: GroupCommit | None = None

    def _register(self) -> None:
        _open_stores.add(self)

    # --- dialect hooks ------------------------------------------------------------------

    def _open_connection(self) -> tuple[Any, Any]:
        """Open a new sync connection; return it and the object statements run on."""
        raise NotImplementedError

    def _run(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        """Run one statement; return (rowcount, rows). Raises driver errors."""
        raise NotImplementedError

    def _run_save(self, held: Held, sql: str, params: Any) -> int:
        """Run a save's statement; return the rowcount. Servers: one autocommit statement."""
        raise NotImplementedError

    def _run_batch(self, held: Held, items: list[Pending]) -> None:
        """Run several saves' statements in ONE transaction and commit it (group commit).

        Sets each item's ``stored`` (rows changed) or ``error`` (its own statement
        failed: ``_statement_error``), and returns only after the COMMIT returned.
        Raises for a failure of the whole transaction (nothing of it was committed).
        """
        raise NotImplementedError

    def _close_connection(self, held: Held) -> None:
        held.conn.close()

    def _is_broken(self, held: Held) -> bool:
        """After a driver error: whether the connection can no longer be used."""
        return False

    def _error_code(self, exc: BaseException) -> int | str | None:
        return None

    def _detach(self, held: Held) -> None:
        """In a forked child: make ``held`` harmless without telling the server."""

    def _key(self, run_id: str) -> Any:
        return run_id

    def _db_time(self, value: datetime | None) -> Any:
        raise NotImplementedError

    def _py_time(self, value: Any) -> datetime | None:
        raise NotImplementedError

    def _check_size(self, run_id: str, document: str) -> None:
        """Raise ``CheckpointTooLarge`` if the document cannot be stored."""

    def _scrub(self, text: str) -> str:
        return text

    # async hooks (native backends only)

    async def _aopen_connection(self) -> tuple[Any, Any]:
        raise NotImplementedError

    async def _arun(self, held: Held, sql: str, params: Any) -> tuple[int, list[Any]]:
        raise NotImplementedError

    def _adrop(self, held: Held) -> None:
        """Close an async connection without awaiting (also from a cancelled task)."""

    # --- errors -------------------------------------------------------------------------

    def _closed_error(self) -> StoreError:
        return StoreError(f"{self.where}: {self._CLOSED}")

    def _translate(self, exc: BaseException) -> StoreError:
        return translate(
            self._ERRORS,
            exc,
            self._error_code(exc),
            where=self.where,
            table=self.table,
            scrub=self._scrub,
        )

    def _decoding_error(self, exc: BaseException) -> bool:
        """Whether a driver error means a stored text was not decodable."""
        return False

    # --- counters -----------------------------------------------------------------------

    @property
    def requests_sent(self) -> int:
        """Statements sent to the server by this store (one round trip each)."""
        return self._requests

    def _count(self) -> None:
        with self._count_lock:
            self._requests += 1

    # --- sync connections ---------------------------------------------------------------

    def _connect(self) -> Held:
        """Open this thread's connection (the slow path of every call)."""
        if self._closed:
            raise self._closed_error()
        try:
            conn, cursor = self._open_connection()
        except self._driver_error as exc:
            raise self._translate(exc) from exc
        held = Held(self, conn, cursor)
        with self._lock:
            if self._closed:
                held.close()
                raise self._closed_error()
            self._held.add(held)
            self._local.held = held
        return held

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

    def _exec(self, sql: str, params: Any = None, *, save: bool = False) -> tuple[int, list[Any]]:
        """Run one statement on this thread's connection, translating errors."""
        held = self._thread_held()
        with held.lock:
            if self._closed:
                raise self._closed_error()
            try:
                if save:
                    return self._run_save(held, sql, params), []
                return self._run(held, sql, params)
            except UnicodeEncodeError as exc:  # a lone surrogate in the state's strings
                raise _invalid_text(exc) from exc
            except UnicodeDecodeError as exc:
                self._drop(held)  # the driver stopped mid-result
                raise _Undecodable(str(exc)) from exc
            except self._driver_error as exc:
                if self._decoding_error(exc):
                    raise _Undecodable(str(exc)) from exc
                if self._is_broken(held):
                    self._drop(held)
                raise self._translate(exc) from exc
            except BaseException:
                # Anything else (a kill-point hook, KeyboardInterrupt) may have left the
                # connection mid-statement: never reuse it.
                self._drop(held)
                raise
            finally:
                if held.doomed:
                    self._drop(held)

    def _statement_error(self, exc: BaseException) -> BaseException:
        """The error one save of a batch raises when its own statement failed."""
        if isinstance(exc, UnicodeEncodeError):
            return _invalid_text(exc)
        if isinstance(exc, self._driver_error):
            error = self._translate(exc)
            error.__cause__ = exc
            return error
        return exc

    def _commit_batch(self, items: list[Pending]) -> None:
        """Run a batch of saves on this thread's connection (the group's ``execute``)."""
        held = self._thread_held()
        with held.lock:
            if self._closed:
                raise self._closed_error()
            try:
                self._run_batch(held, items)
            except self._driver_error as exc:
                if self._is_broken(held):
                    self._drop(held)
                raise self._translate(exc) from exc
            except BaseException:
                # A kill-point hook or an interrupt may have left the connection
                # mid-transaction: never reuse it.
                self._drop(held)
                raise
            finally:
                if held.doomed:
                    self._drop(held)

    def _forget_connections(self) -> None:
        """In a forked child: never touch the inherited connections again."""
        for held in [*self._held, *(h for p in self._apools.values() for h in p.all)]:
            held.inherited = True
            with contextlib.suppress(Exception):
                self._detach(held)
            _inherited.append(held)
        self._held = weakref.WeakSet()
        self._apools = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        if self._group is not None:
            self._group.reset()

    # --- async connections --------------------------------------------------------------

    def _apool(self) -> _AsyncPool:
        import asyncio  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        pool = self._apools.get(loop)
        if pool is None:
            pool = self._apools[loop] = _AsyncPool(ASYNC_POOL_SIZE)
        return pool

    async def _aexec(
        self, sql: str, params: Any = None, *, save: bool = False
    ) -> tuple[int, list[Any]]:
        """Run one statement on a connection of this loop, translating errors."""
        if self._closed:
            raise self._closed_error()
        pool = self._apool()
        async with pool.slots:
            if pool.idle:
                held = pool.idle.pop()
            else:
                try:
                    conn, cursor = await self._aopen_connection()
                except self._driver_error as exc:
                    raise self._translate(exc) from exc
                except (TimeoutError, OSError) as exc:
                    raise StoreUnavailable(
                        f"{self.where}: cannot connect ({type(exc).__name__}: {exc})"
                    ) from exc
                held = Held(self, conn, cursor, is_async=True)
                pool.all.add(held)
            reuse = False
            try:
                if self._closed:
                    raise self._closed_error()
                if save:
                    self._fire_before()
                result = await self._arun(held, sql, params)
                if save:
                    self._fire_after()
                reuse = True
                return result
            except UnicodeEncodeError as exc:
                raise _invalid_text(exc) from exc
            except UnicodeDecodeError as exc:
                raise _Undecodable(str(exc)) from exc
            except self._driver_error as exc:
                if self._decoding_error(exc):
                    raise _Undecodable(str(exc)) from exc
                if self._closed:  # closed from another thread under this call
                    raise self._closed_error() from exc
                reuse = not self._is_broken(held)
                raise self._translate(exc) from exc
            finally:
                # Cancelled, timed out or broken mid-statement: drop the connection.
                if reuse and not self._closed:
                    pool.idle.append(held)
                else:
                    pool.all.discard(held)
                    with contextlib.suppress(Exception):
                        self._adrop(held)

    def _fire_before(self) -> None:
        """Fire the save's hook before the request (servers override)."""

    def _fire_after(self) -> None:
        """Fire the save's hook after the request (servers override)."""

    # --- the logic, shared by the sync and async paths ----------------------------------

    def _save_plan(self, checkpoint: Checkpoint) -> tuple[Checkpoint, str, dict[str, Any]]:
        """Return the checkpoint as it will be stored, the statement and its parameters."""
        run_id = check_run_id(checkpoint.run_id)
        text, copy = encode_state(checkpoint.state)
        expected = checkpoint.version
        saved = checkpoint.stored(copy, text, new_version(expected), utcnow())
        # Each time is formatted once, for the document and (when the text is the same)
        # the columns: ``stored`` sets both, and a first save shares one object.
        updated_at: datetime = saved.updated_at  # type: ignore[assignment]
        created_at: datetime = saved.created_at  # type: ignore[assignment]
        updated_text = updated_at.isoformat()
        created_text = updated_text if created_at is updated_at else format_created(created_at)
        document = encode_document(saved, text, created_at=created_text, updated_at=updated_text)
        self._check_size(run_id, document)
        iso = self._ISO_TIMES
        updated = updated_text if iso and updated_at.tzinfo is UTC else self._db_time(updated_at)
        created = created_text if iso and created_at.tzinfo is UTC else self._db_time(created_at)
        status = saved.status
        # Most saves are of a running run, due when it was updated: format that once.
        due_at = saved.due_at if status != "running" or saved.lease is not None else updated_at
        due = updated if due_at is updated_at else self._db_time(due_at)
        params = {
            "run_key": self._key(run_id),
            "run_id": run_id,
            "version": saved.version,
            "status": status,
            "step": saved.step,
            "total_steps": saved.total_steps,
            "created_at": created,
            "updated_at": updated,
            "due_at": due,
            "owner": saved.owner,
            "document": document,
            "expected": expected,
        }
        return saved, self._sql.insert if expected is None else self._sql.update, params

    def _conflict(self, run_id: str, expected: str | None, rows: list[Any] | None) -> ConflictError:
        if rows is None:
            stored = "another version"
        elif rows:
            stored = repr(rows[0][0])
        else:
            stored = "nothing (the run was deleted)"
        return ConflictError(
            f"run {run_id!r}: expected version {expected!r}, stored {stored}", run_id
        )

    def _source(self, run_id: str) -> str:
        return f"{self.where} run {run_id!r}"

    def _loaded(self, run_id: str, rows: list[Any]) -> Checkpoint | None:
        if not rows:
            return None
        version, document = rows[0]
        source = self._source(run_id)
        return checkpoint_from_doc(decode_document(document, source), version, source, run_id)

    def _undecodable(self, run_id: str, exc: _Undecodable) -> CorruptCheckpoint:
        return CorruptCheckpoint(
            f"{self._source(run_id)}: the row holds text that is not UTF-8 ({exc}); left untouched"
        )

    def _info(self, row: Any) -> RunInfo | None:
        """Return the ``RunInfo`` of an info row, or None (logged) if it is malformed."""
        run_id, version, status, step, total_steps, updated_at, due_at, owner = row
        try:
            if status not in STATUSES:
                raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
            if type(step) is not int or not (total_steps is None or type(total_steps) is int):
                raise ValueError("step or total_steps is not an integer")
            return RunInfo(
                run_id,
                status,
                step,
                total_steps,
                self._py_time(updated_at),
                version=version,
                owner=owner,
                due_at=self._py_time(due_at),
            )
        except (TypeError, ValueError) as exc:
            logger.warning(
                "skipping run %r in listing: %s", run_id, f"{self._source(run_id)}: {exc}"
            )
            return None

    def _infos(self, rows: list[Any]) -> list[RunInfo]:
        return [info for info in map(self._info, rows) if info is not None]

    # --- schema (sync; run at open) -----------------------------------------------------

    def _schema_version(self, held: Held) -> str | None:
        """Return the stored schema_version, or None when the meta table is missing."""
        raise NotImplementedError

    def _create_schema(self, held: Held) -> None:
        raise NotImplementedError

    def _migrate(self, held: Held, found: int) -> None:
        """Bring tables at schema ``found`` to ``TABLE_SCHEMA``, safe against racers."""
        raise NotImplementedError

    def _ensure_schema(self, held: Held) -> int:
        found = self._schema_version(held)
        if found is None:
            self._create_schema(held)
            found = self._schema_version(held)
        number = self._schema_number(found)
        if number < TABLE_SCHEMA and number in _MIGRATABLE:
            self._migrate(held, number)
            number = self._schema_number(self._schema_version(held))
        if number > TABLE_SCHEMA:
            raise StoreError(
                f"{self.where}: schema version {number} is newer than this stepstone "
                f"supports ({TABLE_SCHEMA}); upgrade stepstone to open it"
            )
        if number < TABLE_SCHEMA:
            raise StoreError(
                f"{self.where}: schema version {number} is older than this stepstone "
                f"({TABLE_SCHEMA}) and no migration is known for it"
            )
        return number

    def _schema_number(self, found: str | None) -> int:
        try:
            return int(found or "")
        except ValueError:
            raise CorruptCheckpoint(
                f"{self.where}: the meta table has schema_version {found!r}, not a number; "
                "left untouched"
            ) from None

    # --- the Store contract -------------------------------------------------------------

    def load(self, run_id: str) -> Checkpoint | None:
        """Return the run's checkpoint, or None.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
            CorruptCheckpoint: the row is unreadable or holds another run's document.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        check_run_id(run_id)
        try:
            _, rows = self._exec(self._sql.load, {"run_key": self._key(run_id)})
        except _Undecodable as exc:
            raise self._undecodable(run_id, exc) from exc
        return self._loaded(run_id, rows)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Store ``checkpoint`` if the stored version is still ``checkpoint.version``.

        With group commit (SQLite) concurrent saves share a transaction; each keeps its
        own outcome and returns only after the COMMIT containing it returned.

        Raises:
            ConflictError: the stored version differs; nothing was stored.
            InvalidState: the state is not JSON or not encodable as UTF-8.
            CheckpointTooLarge: the document is over the database's limit.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        saved, sql, params = self._save_plan(checkpoint)
        group = self._group
        if group is None:
            stored, _ = self._exec(sql, params, save=True)
        else:
            if self._closed:
                raise self._closed_error()
            item = Pending(sql, params)
            group.submit(item)
            if item.error is not None:
                raise item.error
            stored = item.stored or 0
        if stored != 1:
            raise self._conflict(saved.run_id, checkpoint.version, self._peek(saved.run_id))
        return saved

    def _peek(self, run_id: str) -> list[Any] | None:
        # Only on a losing path: read what is there, for the message or the outcome.
        try:
            return self._exec(self._sql.version, {"run_key": self._key(run_id)})[1]
        except (StoreError, _Undecodable):
            return None

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Delete the run's row; with ``expected_version``, only if it still holds it.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
            ConflictError: the stored version differs from ``expected_version``.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        check_run_id(run_id)
        key = self._key(run_id)
        if expected_version is None:
            return self._exec(self._sql.delete, {"run_key": key})[0] > 0
        deleted, _ = self._exec(
            self._sql.delete_cas, {"run_key": key, "expected": expected_version}
        )
        return self._delete_outcome(
            run_id, expected_version, deleted, self._peek_if(deleted, run_id)
        )

    def _peek_if(self, deleted: int, run_id: str) -> list[Any] | None:
        return [] if deleted else self._peek(run_id)

    def _delete_outcome(
        self, run_id: str, expected: str, deleted: int, rows: list[Any] | None
    ) -> bool:
        if deleted:
            return True
        if rows == []:
            return False
        raise self._conflict(run_id, expected, rows)

    def list_runs(self) -> Iterator[str]:
        """Yield the stored run_ids (fetched eagerly: no cursor stays open).

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        try:
            _, rows = self._exec(self._sql.list)
        except _Undecodable:
            rows = self._salvage(self._sql.keys)
        return iter([row[0] for row in rows])

    def list_info(self) -> Iterator[RunInfo]:
        """Yield a ``RunInfo`` per run from the indexed columns, never the documents.

        A malformed row is logged and skipped; the others are still listed.

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        try:
            _, rows = self._exec(self._sql.info)
        except _Undecodable:
            rows = self._salvage(self._sql.keys)
        return iter(self._infos(rows))

    def claimable(
        self,
        now: datetime,
        limit: int = 100,
        *,
        status: RunStatus | None = None,
        skip: int = 0,
    ) -> list[RunInfo]:
        """Return the running runs and the queued/waiting ones due by ``now`` (indexed).

        With ``status``, one page of that kind only (``Store.claimable``).

        Raises:
            ValueError: ``status`` is not an active status, or ``skip`` is negative.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        params = {"now": self._db_time(now), "limit": int(limit), "skip": skip}
        parts: list[list[RunInfo]] = []
        for sql, keys in _claim_queries(self._sql.claims, status, skip):
            try:
                _, rows = self._exec(sql, params)
            except _Undecodable:
                rows = self._salvage(keys, params)
            parts.append(self._infos(rows))
        return _claim_result(parts, limit, status)

    def _salvage(self, keys_sql: str, params: Any = None) -> list[Any]:
        """Read rows one by one after an undecodable one broke a listing; skip the bad."""
        _, keys = self._exec(keys_sql, params)
        rows: list[Any] = []
        for (key,) in keys:
            try:
                _, found = self._exec(self._sql.info_one, {"run_key": key})
            except _Undecodable as exc:
                logger.warning("skipping a run in listing: %s: %s", self.where, exc)
                continue
            rows.extend(found)
        return rows

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
                with contextlib.suppress(Exception):
                    self._adrop(item)
        _open_stores.discard(self)

    # --- async (native backends) --------------------------------------------------------

    async def aload(self, run_id: str) -> Checkpoint | None:
        """Async ``load``; same contract, same errors."""
        if not self.native_async:
            return await super().aload(run_id)
        check_run_id(run_id)
        try:
            _, rows = await self._aexec(self._sql.load, {"run_key": self._key(run_id)})
        except _Undecodable as exc:
            raise self._undecodable(run_id, exc) from exc
        return self._loaded(run_id, rows)

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        """Async ``save``; same contract, same errors. Lands whole or not at all."""
        if not self.native_async:
            return await super().asave(checkpoint)
        saved, sql, params = self._save_plan(checkpoint)
        stored, _ = await self._aexec(sql, params, save=True)
        if stored != 1:
            raise self._conflict(saved.run_id, checkpoint.version, await self._apeek(saved.run_id))
        return saved

    async def _apeek(self, run_id: str) -> list[Any] | None:
        try:
            return (await self._aexec(self._sql.version, {"run_key": self._key(run_id)}))[1]
        except (StoreError, _Undecodable):
            return None

    async def adelete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Async ``delete``; same contract, same errors."""
        if not self.native_async:
            return await super().adelete(run_id, expected_version=expected_version)
        check_run_id(run_id)
        key = self._key(run_id)
        if expected_version is None:
            return (await self._aexec(self._sql.delete, {"run_key": key}))[0] > 0
        deleted, _ = await self._aexec(
            self._sql.delete_cas, {"run_key": key, "expected": expected_version}
        )
        rows = [] if deleted else await self._apeek(run_id)
        return self._delete_outcome(run_id, expected_version, deleted, rows)

    async def alist_runs(self) -> AsyncIterator[str]:
        """Async ``list_runs``."""
        if not self.native_async:
            async for run_id in super().alist_runs():
                yield run_id
            return
        try:
            _, rows = await self._aexec(self._sql.list)
        except _Undecodable:
            rows = await self._asalvage(self._sql.keys)
        for row in rows:
            yield row[0]

    async def alist_info(self) -> AsyncIterator[RunInfo]:
        """Async ``list_info``."""
        if not self.native_async:
            async for info in super().alist_info():
                yield info
            return
        try:
            _, rows = await self._aexec(self._sql.info)
        except _Undecodable:
            rows = await self._asalvage(self._sql.keys)
        for info in self._infos(rows):
            yield info

    async def aclaimable(
        self,
        now: datetime,
        limit: int = 100,
        *,
        status: RunStatus | None = None,
        skip: int = 0,
    ) -> list[RunInfo]:
        """Async ``claimable``."""
        if not self.native_async:
            return await super().aclaimable(now, limit, status=status, skip=skip)
        params = {"now": self._db_time(now), "limit": int(limit), "skip": skip}
        parts: list[list[RunInfo]] = []
        for sql, keys in _claim_queries(self._sql.claims, status, skip):
            try:
                _, rows = await self._aexec(sql, params)
            except _Undecodable:
                rows = await self._asalvage(keys, params)
            parts.append(self._infos(rows))
        return _claim_result(parts, limit, status)

    async def _asalvage(self, keys_sql: str, params: Any = None) -> list[Any]:
        _, keys = await self._aexec(keys_sql, params)
        rows: list[Any] = []
        for (key,) in keys:
            try:
                _, found = await self._aexec(self._sql.info_one, {"run_key": key})
            except _Undecodable as exc:
                logger.warning("skipping a run in listing: %s: %s", self.where, exc)
                continue
            rows.extend(found)
        return rows

    async def aclose(self) -> None:
        """Async ``close``: the sync close never waits on the loop's own connections."""
        if not self.native_async:
            await super().aclose()
            return
        self.close()

    # --- the dashboard's listing (``Store.list_page``, ``Store.count_by_status``) --------

    def _page_sql(
        self, status: str | None, prefix: str, after: tuple[datetime, str] | None, limit: int
    ) -> tuple[str, dict[str, Any]]:
        named = self.scheme == "sqlite"  # the drivers' paramstyles: named, else pyformat

        def p(name: str) -> str:
            return f":{name}" if named else f"%({name})s"

        # Run ids compare as code points on every dialect (PostgreSQL's "C" collation,
        # MySQL's utf8mb4_bin column, SQLite's BINARY), as the cursor does.
        rid = 'run_id COLLATE "C"' if self.scheme == "postgresql" else "run_id"
        where: list[str] = []
        params: dict[str, Any] = {"limit": int(limit)}
        if status is not None:
            where.append(f"status = {p('status')}")
            params["status"] = status
        if prefix:
            clause, values = self._prefix_clause(prefix)
            where.append(clause)
            params.update(values)
        if after is not None:
            where.append(
                f"(updated_at < {p('after_at')} OR "
                f"(updated_at = {p('after_at2')} AND {rid} < {p('after_id')}))"
            )
            params.update(
                after_at=self._db_time(after[0]),
                after_at2=self._db_time(after[0]),
                after_id=after[1],
            )
        sql = self._sql.info + (" WHERE " + " AND ".join(where) if where else "")
        return sql + f" ORDER BY updated_at DESC, {rid} DESC LIMIT {p('limit')}", params

    def _prefix_clause(self, prefix: str) -> tuple[str, dict[str, Any]]:
        """Return the condition "run_id starts with ``prefix``", case-sensitive."""
        if self.scheme == "sqlite":
            # SQLite's LIKE ignores ASCII case; a substring comparison does not.
            return "substr(run_id, 1, :prefix_len) = :prefix", {
                "prefix": prefix,
                "prefix_len": len(prefix),
            }
        escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
        return "run_id LIKE %(prefix)s ESCAPE '!'", {"prefix": escaped + "%"}

    def list_page(
        self,
        status: RunStatus | None = None,
        *,
        prefix: str = "",
        after: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[RunInfo]:
        """One page of the listing, newest first: a ``LIMIT`` query on the indexes.

        The (status, updated_at) index serves a status filter, the updated_at index the
        unfiltered list; the cursor continues from the last row shown (keyset paging).

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        sql, params = self._page_sql(status, prefix, after, limit)
        try:
            _, rows = self._exec(sql, params)
        except _Undecodable:
            return super().list_page(status, prefix=prefix, after=after, limit=limit)
        return self._infos(rows)

    def version_of(self, run_id: str) -> str | None:
        """Return the run's version from its row, without reading the document.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        check_run_id(run_id)
        _, rows = self._exec(self._sql.version, {"run_key": self._key(run_id)})
        return None if not rows else rows[0][0]

    def count_by_status(self, prefix: str = "") -> dict[str, int]:
        """Count the runs per status with one ``GROUP BY`` over the status index.

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        found = re.search(r"\sFROM\s+(\S+)\s*\Z", self._sql.info)  # the listing's own table
        if found is None:  # pragma: no cover - the generated statement has this shape
            return super().count_by_status(prefix)
        table = found[1]
        sql = f"SELECT status, COUNT(*) FROM {table}"
        params: dict[str, Any] = {}
        if prefix:
            clause, params = self._prefix_clause(prefix)
            sql += " WHERE " + clause
        _, rows = self._exec(sql + " GROUP BY status", params)
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for status, count in rows:
            if status in counts:
                counts[status] = int(count)
        return counts


_CLAIM_KINDS: Final = ("running", "queued", "waiting")


def _claim_queries(
    claims: list[tuple[str, str]], status: RunStatus | None, skip: int
) -> list[tuple[str, str]]:
    """Return the claim queries to run: all three, or the one of a paged ``status``."""
    check_page(status, skip)
    return claims if status is None else [claims[_CLAIM_KINDS.index(status)]]


def _claim_result(
    parts: list[list[RunInfo]], limit: int, status: RunStatus | None = None
) -> list[RunInfo]:
    if status is not None:
        return parts[0]
    running, queued, waiting = parts
    due = sorted(queued + waiting, key=lambda info: info.due_at or _MIN)
    return running[:limit] + due[:limit]


_MIN = datetime.min.replace(tzinfo=UTC)
_MIGRATABLE: Final = frozenset({1})


def _invalid_text(exc: UnicodeEncodeError) -> InvalidState:
    return InvalidState(
        f"state: a string holds a lone surrogate ({exc.reason}); a state must be "
        "encodable as UTF-8",
        "state",
    )


# --- statements -------------------------------------------------------------------------


class Statements:
    """Every statement a store runs, compiled once per (dialect, table) from SQLAlchemy.

    SQLAlchemy Core *describes* the tables and *builds* the statements, so the DDL in
    ``backends/*/schema.sql`` and the SQL we run come from one definition; it is
    imported only here, when a store is first opened, and no SQLAlchemy execution
    machinery runs per call.
    """

    def __init__(
        self,
        dialect: Any,
        checkpoints: Any,
        meta: Any,
        key: str,
        insert: Any,
        seed: Any,
    ) -> None:
        from sqlalchemy import bindparam, delete, literal_column, select, update  # noqa: PLC0415

        c = checkpoints.c
        k = c[key]
        self.dialect = dialect
        run_key: Any = bindparam("run_key")
        expected: Any = bindparam("expected")
        self.insert = self.compile(insert)
        self.update = self.compile(
            update(checkpoints)
            .where(k == run_key, c.version == expected)
            .values(
                {
                    col.name: bindparam(col.name)
                    for col in c
                    if col.name not in ("run_key", "run_id")
                }
            )
        )
        self.load = self.compile(select(c.version, c.document).where(k == run_key))
        self.version = self.compile(select(c.version).where(k == run_key))
        self.delete = self.compile(delete(checkpoints).where(k == run_key))
        self.delete_cas = self.compile(
            delete(checkpoints).where(k == run_key, c.version == expected)
        )
        self.list = self.compile(select(c.run_id))
        columns = (
            c.run_id,
            c.version,
            c.status,
            c.step,
            c.total_steps,
            c.updated_at,
            c.due_at,
            c.owner,
        )
        self.info = self.compile(select(*columns))
        self.info_one = self.compile(select(*columns).where(k == run_key))
        self.keys = self.compile(select(k))
        now: Any = bindparam("now")

        # Three index range scans on (status, due_at), never a finished run: running runs
        # (the worker watches their leases), then queued and waiting runs that are due.
        def status(name: str) -> Any:
            return c.status == literal_column(f"'{name}'")

        running = status("running")
        queued = status("queued") & (c.due_at <= now)
        waiting = status("waiting") & (c.due_at <= now)
        # LIMIT and OFFSET take parameters; SQLAlchemy would rename them, so they are
        # appended here. OFFSET pages past runs a worker leaves (``claimable(skip=)``).
        limit = (
            " LIMIT :limit OFFSET :skip"
            if dialect.paramstyle == "named"
            else " LIMIT %(limit)s OFFSET %(skip)s"
        )
        self.claims: list[tuple[str, str]] = [
            (
                self.compile(select(*columns).where(cond).order_by(c.due_at)) + limit,
                self.compile(select(k).where(cond).order_by(c.due_at)) + limit,
            )
            for cond in (running, queued, waiting)
        ]
        self.schema_version = self.compile(
            select(meta.c.value).where(meta.c.key == bindparam("key", "schema_version")),
            literal=True,
        )
        self.seed = self.compile(seed, literal=True)
        self.bump = self.compile(
            update(meta)
            .where(meta.c.key == "schema_version", meta.c.value == "1")
            .values(value=str(TABLE_SCHEMA)),
            literal=True,
        )

    def compile(self, statement: Any, literal: bool = False) -> str:
        """Return ``statement`` as this dialect's SQL text, tidily indented."""
        kwargs = {"literal_binds": True} if literal else {}
        text = str(statement.compile(dialect=self.dialect, compile_kwargs=kwargs))
        return "\n".join(line.rstrip().replace("\t", "    ") for line in text.strip().splitlines())

    def ddl(self, statement: Any) -> str:
        """Return a DDL element (``CreateTable``, ``CreateIndex``) as SQL text."""
        return self.compile(statement)


# --- the SQL servers --------------------------------------------------------------------


PASSWORD_ENV: Final = "STEPSTONE_SQL_PASSWORD"
DEFAULT_TABLE: Final = "stepstone_checkpoints"
# Lower case only: PostgreSQL folds unquoted names and MySQL on Linux does not, so mixed
# case would name different tables in hand-written SQL. 48 leaves room for the index and
# meta table names under PostgreSQL's 63-byte identifier limit.
_TABLE_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,47}")
# PostgreSQL's catalogs (searched before the user's schemas) and SQLite's internal tables.
_SYSTEM_PREFIXES: Final = ("pg_", "sqlite_")
# System schemas of PostgreSQL and MySQL / MariaDB.
_SYSTEM_NAMES: Final = frozenset({"information_schema", "mysql", "performance_schema", "sys"})
SUPPORTED: Final = "postgresql+psycopg, mysql+pymysql"


def mask(config: str) -> str:
    """Hide the password of a URL we could not parse, for error messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", config)


@dataclass(frozen=True, slots=True)
class ServerURL:
    """The parts of a ``scheme[+driver]://user[:password]@host[:port]/database`` URL."""

    user: str | None
    password: str | None
    host: str
    port: int
    database: str


def positive_seconds(name: str, value: object) -> float:
    """Return ``value`` as positive finite seconds, or raise ``ConfigError``."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = -1.0
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        number = -1.0
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
    return number


def parse_server_url(
    config: str, backend: str, driver: str, port: int, forms: str, options: tuple[str, ...]
) -> tuple[ServerURL, dict[str, str]]:
    """Parse a server URL and its options, refusing what this backend does not know.

    Raises:
        ConfigError: malformed, another driver, no database, unknown options.
    """
    parts = urlsplit(config)
    scheme, _, named = parts.scheme.lower().partition("+")
    if scheme != backend:
        raise ConfigError(f"not a {backend} store config: {mask(config)!r}; forms: {forms}")
    if named not in ("", driver):
        raise ConfigError(
            f"driver {scheme}+{named} is not supported; supported: {SUPPORTED} "
            f"(or plain postgresql / mysql). Forms: {forms}"
        )
    if parts.fragment:
        raise ConfigError(f"SQL store config has a #fragment; forms: {forms}")
    try:
        host = parts.hostname or "localhost"
        number = parts.port or port
    except ValueError:
        # ``from None``: the original's text may quote the URL, password included.
        raise ConfigError(
            f"malformed SQL store URL {mask(config)!r} (bad port); forms: {forms}"
        ) from None
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigError(f"SQL store URL names no database; forms: {forms}")
    values = parse_options(parts.query, dict.fromkeys(options), forms)
    return (
        ServerURL(
            None if parts.username is None else unquote(parts.username),
            None if parts.password is None else unquote(parts.password),
            host,
            number,
            database,
        ),
        values,
    )


def check_table(table: object) -> str:
    """Return ``table`` if it is a safe table name, else raise ``ConfigError``.

    Names are quoted in every statement, so SQL keywords (``select``, ``user``) are
    fine; names the servers keep for themselves are refused on every backend (one rule,
    so a table name that works on one server works on the other): on PostgreSQL a
    ``pg_*`` name resolves to the system catalog first, and a table named after a
    server's system schema is a trap for anyone writing SQL by hand.
    """
    allowed = (
        "use 1-48 lower-case letters, digits and underscores, not starting with a digit, "
        f"not starting with {' or '.join(_SYSTEM_PREFIXES)} and not one of "
        f"{', '.join(sorted(_SYSTEM_NAMES))}"
    )
    if not isinstance(table, str) or _TABLE_NAME.fullmatch(table) is None:
        raise ConfigError(f"table={table!r} is not allowed: {allowed}")
    if table.startswith(_SYSTEM_PREFIXES) or table in _SYSTEM_NAMES:
        raise ConfigError(
            f"table={table!r} is not allowed: the name is reserved for the database's "
            f"own catalogs; {allowed}"
        )
    return table


def run_key(run_id: str) -> bytes:
    """SHA-256 of the UTF-8 run_id: fixed length, so any run_id fits every index limit."""
    return hashlib.sha256(run_id.encode("utf-8")).digest()


def import_driver(module: str, scheme: str, extra: str) -> Any:
    """Import a driver module, or raise ``ConfigError`` naming the extra to install."""
    import importlib  # noqa: PLC0415

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"the {scheme}:// store needs the {module} driver, which is not installed "
            f"({exc}): pip install 'stepstone[{extra}]'"
        ) from exc


def detach_socket(fileno: int) -> None:
    """Point an inherited socket at /dev/null: the child can never speak on it."""
    if fileno >= 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(devnull, fileno)
        finally:
            os.close(devnull)


def server_tables(name: str) -> tuple[Any, Any, Any]:
    """Return the checkpoint and meta ``Table`` objects and the due index, for servers."""
    from sqlalchemy import (  # noqa: PLC0415
        Column,
        DateTime,
        Index,
        Integer,
        LargeBinary,
        MetaData,
        String,
        Table,
        Text,
    )
    from sqlalchemy.dialects import mysql  # noqa: PLC0415
    from sqlalchemy.sql.elements import quoted_name  # noqa: PLC0415

    def time() -> Any:
        # MySQL's DATETIME has no zone: UTC wall time is stored and read back as UTC.
        return DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

    my = ("mysql", "mariadb")
    metadata = MetaData()
    # Every name is quoted ("select", "user", "order" are valid table names): the
    # generated text then holds the table name only inside quotes, for any name.
    checkpoints = Table(
        name,
        metadata,
        # SHA-256 of the UTF-8 run_id: a 1024-character run_id is up to 4096 bytes, over
        # InnoDB's 3072-byte key limit and PostgreSQL's ~2700-byte btree tuple limit;
        # hashing also makes keys byte-exact on MySQL whatever the collation.
        Column("run_key", LargeBinary().with_variant(mysql.BINARY(32), *my), primary_key=True),
        Column("run_id", Text().with_variant(mysql.VARCHAR(1024), *my), nullable=False),
        Column("version", String(64), nullable=False),
        Column("status", String(16), nullable=False),
        Column("step", Integer, nullable=False),
        Column("total_steps", Integer),
        Column("created_at", time()),
        Column("updated_at", time(), nullable=False),
        Column("due_at", time()),
        Column("owner", Text().with_variant(mysql.VARCHAR(1024), *my)),
        # Last, so listing (which reads the columns before it) rarely touches it; large
        # documents live out of line (TOAST / InnoDB overflow pages) anyway.
        Column("document", Text().with_variant(mysql.LONGTEXT(), *my), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        quote=True,
    )
    Index(quoted_name(f"ix_{name}_updated_at", True), checkpoints.c.updated_at)
    Index(quoted_name(f"ix_{name}_status", True), checkpoints.c.status, checkpoints.c.updated_at)
    due = Index(quoted_name(f"ix_{name}_due", True), checkpoints.c.status, checkpoints.c.due_at)
    meta = Table(
        f"{name}_meta",
        metadata,
        Column("key", String(64), primary_key=True),
        Column("value", Text, nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        quote=True,
    )
    return checkpoints, meta, due


class ServerStore(SQLStore):
    """What PostgresStore and MySQLStore share: URL, password, timeouts, hooks."""

    kind: str
    _DRIVER: ClassVar[str]
    _EXTRA: ClassVar[str]
    _PORT: ClassVar[int]
    _FORMS: ClassVar[str]

    def _init_server(
        self,
        url: str,
        table: str,
        password: str | None,
        timeouts: dict[str, float],
    ) -> ServerURL:
        parsed, options = parse_server_url(
            url, self.kind, self._DRIVER, self._PORT, self._FORMS, ()
        )
        if options:  # pragma: no cover - parse_server_url refused them already
            raise ConfigError(f"URL options are not allowed here; forms: {self._FORMS}")
        self.table = check_table(table)
        for name, value in timeouts.items():
            setattr(self, name, positive_seconds(name, value))
        self._driver = import_driver(self._DRIVER, self.kind, self._EXTRA)
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
        self._driver_error = self._driver.Error
        self._setup()
        return parsed

    @classmethod
    def _config_options(cls, config: str, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
        _, options = parse_server_url(config, cls.kind, cls._DRIVER, cls._PORT, cls._FORMS, names)
        kwargs: dict[str, Any] = {}
        for name, value in options.items():
            kwargs[name] = value if name == "table" else positive_seconds(name, value)
        bare = urlsplit(config)._replace(query="").geturl()
        return bare, kwargs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, table={self.table!r})"

    def _scrub(self, text: str) -> str:
        password = self._password
        return text.replace(password, "***") if password else text

    def _key(self, run_id: str) -> Any:
        return run_key(run_id)

    def _fire_before(self) -> None:
        _hooks.fire("sql.before_request")

    def _fire_after(self) -> None:
        _hooks.fire("sql.request_sent")

    def _run_save(self, held: Held, sql: str, params: Any) -> int:
        # One statement in autocommit mode: its own atomic transaction, one round trip.
        # Nothing runs between the compare and the swap.
        _hooks.fire("sql.before_request")
        self._count()
        held.cursor.execute(sql, params)
        _hooks.fire("sql.request_sent")
        return int(held.cursor.rowcount)

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
        from .._errors import StorePermissionError  # noqa: PLC0415

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
        return [
            f"{self.kind} store {self.where}: tables {self.table} and {self.table}_meta "
            f"ready (schema version {found})"
        ]

    def _durability(self, held: Held) -> tuple[bool, str]:
        raise NotImplementedError

    def doctor(self) -> list[Any]:
        """The base probe checks, plus schema version and the server's durability settings."""
        from .._store import Diagnosis  # noqa: PLC0415

        results = super().doctor()
        try:
            held = self._thread_held()
            with held.lock:
                try:
                    found = self._schema_version(held)
                    durable, setting = self._durability(held)
                except self._driver_error as exc:
                    raise self._translate(exc) from exc
        except Exception as exc:
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
                self._ensure_schema(held)
                self._after_open(held)
            except self._driver_error as exc:
                raise self._create_error(exc) from exc

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


# --- the generated statement text -------------------------------------------------------

#: Stands for the table name in the generated text; table names are checked against
#: ``[a-z_][a-z0-9_]{0,47}``, so replacing it is exact.
PLACEHOLDER: Final = "stepstone__table__"
_FIELDS: Final = (
    "bump",
    "claims",
    "create",
    "delete",
    "delete_cas",
    "info",
    "info_one",
    "insert",
    "keys",
    "list",
    "load",
    "migrate_v1",
    "schema_version",
    "seed",
    "update",
    "version",
)
GENERATED: Final = os.path.join(os.path.dirname(__file__), "_sql_text.py")


class SQLText:
    """The statements of one store as text, read from the generated ``_sql_text`` module.

    Opening a store must not import SQLAlchemy (about 300 ms): SQLAlchemy stays the one
    definition of the schema, its output is checked in, and a test keeps the two equal.
    """

    bump: str
    claims: list[tuple[str, str]]
    create: list[str]
    delete: str
    delete_cas: str
    info: str
    info_one: str
    insert: str
    keys: str
    list: str
    load: str
    migrate_v1: builtins.list[str]
    schema_version: str
    seed: str
    update: str
    version: str

    def __init__(self, texts: Mapping[str, Any], table: str | None) -> None:
        def fill(value: Any) -> Any:
            if isinstance(value, str):
                return value if table is None else value.replace(PLACEHOLDER, table)
            if isinstance(value, tuple):
                return tuple(fill(v) for v in value)
            return [fill(v) for v in value]

        for name in _FIELDS:
            setattr(self, name, fill(texts[name]))


@functools.cache
def statements_of(kind: str, table: str | None = None) -> SQLText:
    """Return the statement text of ``kind`` ("sqlite", "postgresql", "mysql") for a table."""
    from ._sql_text import STATEMENTS  # noqa: PLC0415

    return SQLText(STATEMENTS[kind], table)


def generate() -> dict[str, dict[str, Any]]:
    """Compile every statement from the SQLAlchemy definitions (what ``_sql_text`` holds)."""
    from . import mysql, postgres, sqlite  # noqa: PLC0415

    built = {
        "sqlite": sqlite._SQLiteStatements(),
        "postgresql": postgres._PgStatements(PLACEHOLDER),
        "mysql": mysql._MyStatements(PLACEHOLDER),
    }
    return {
        kind: {name: getattr(statements, name) for name in _FIELDS}
        for kind, statements in built.items()
    }


def render_generated() -> str:
    """Return the source of the ``_sql_text`` module."""
    import pprint  # noqa: PLC0415

    return (
        '"""Generated by ``stepstone.stores._sql.write_generated()``; do not edit by hand.\n\n'
        "Every SQL statement the SQL stores run, compiled from the SQLAlchemy definitions in\n"
        "``sqlite.py``, ``postgres.py`` and ``mysql.py``; tests fail when it drifts.\n"
        '"""\n\n'
        "from typing import Any, Final\n\n"
        "STATEMENTS: Final[dict[str, dict[str, Any]]] = "
        + pprint.pformat(generate(), width=100, sort_dicts=True)
        + "\n"
    )


def write_generated() -> None:
    """Regenerate ``_sql_text.py`` after changing a table or a statement."""
    with open(GENERATED, "w", encoding="utf-8") as out:
        out.write(render_generated())
