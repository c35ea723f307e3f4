"""The SQL store logic, once: what SQLiteStore, PostgresStore and MySQLStore share.

Shape (DBOS ``_sys_db.py``): the logic lives here; each dialect module supplies only
what differs: how to open a connection, how to run one statement on it, how its driver
reports errors (a table of ``ErrorRule``), how times are stored, and how the schema is
created and migrated under that server's locking rules.

- Each store method is written once, as a plan: a generator of ``Exec`` effects
  (``effects.py``) that ``drive`` runs with the sync ``_on_held`` (``_perform``) and
  ``adrive`` with the async ``_aexec``. Statements, parameters, error handling and
  document handling are therefore the same on both paths; only the I/O differs.
- Group commit (SQLite, ``_group.py``): concurrent saves of one process share one
  transaction and its fsync, each keeping its own compare-and-swap outcome; a lone save
  commits at once. A dialect opts in by implementing ``_run_batch``. The servers do not:
  each save stays one autocommit statement (one round trip, also alone; a save with
  pieces one transaction, ``server.py``), and the
  server already flushes the WAL / redo log of concurrent sessions together (measured
  on PostgreSQL with a slow fsync: 64 threads 11x one thread, one statement per save).
- Schema: a ``<meta>`` table holds ``schema_version`` (``TABLE_SCHEMA``, the version of
  the *tables*; documents carry their own). A missing schema is created, an older one
  migrated (each dialect serializes concurrent openers), a newer one refused.
- Foreign and hand-edited rows: a row holding another run's document, a bad timestamp
  or text that is not UTF-8 is that run's ``CorruptCheckpoint`` in ``load``, and is
  logged and skipped by ``list_info`` and ``claimable`` without hiding the others.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ... import _statelog
from ..._checkpoint import STATUSES, Checkpoint, check_run_id, utcnow
from ..._codec import (
    decode_document,
    encode_document,
    format_created,
)
from ..._errors import ConflictError, CorruptCheckpoint, StoreError
from ..._observe import logger
from ..._runinfo import PageAsk, ReadyAsk
from ..._store import Claim, RunInfo, Store
from ..._store_compat import _to_thread
from ..._store_many import check_many, save_in_order
from .._common import new_version
from .claim_plans import SQLClaims
from .connections import Connections, Held
from .effects import Exec, Plan, Result, adrive, drive
from .errors import Undecodable
from .pages import count_query, listed_fields, page_query
from .piece_plans import _Deleted, _Loading, _SavePlan, _Unreadable
from .save_many import save_together
from .schema import MIGRATABLE, TABLE_SCHEMA, SQLText

if TYPE_CHECKING:
    from ..._checkpoint import RunStatus

__all__ = ["SQLStore"]

#: Runs ``SQLStore._rows`` remembers before it starts again (~5 MB with 1,024-character ids).
_ROWS_KEPT = 4096

T = TypeVar("T")


class SQLStore(Connections, SQLClaims, Store):
    """The SQL store logic, once; subclasses supply the dialect hooks."""

    claims_by_kind: ClassVar[bool] = True  # claimable(status=, skip=): an indexed page

    #: ``_db_time(t)`` is ``t.isoformat()`` for a UTC ``t``: the save reuses the text it
    #: formatted for the document instead of formatting each time twice.
    _ISO_TIMES: ClassVar[bool] = False

    _sql: SQLText
    #: SQLite: each run's (version, status, owner) as this store last saved it, so that a
    #: save leaving status and owner as they are runs ``update_same``, which assigns
    #: neither and so enters no partial index (``tools/sqlgen.py``); None elsewhere.
    _rows: dict[str, tuple[str | None, str, str | None]] | None = None

    # --- dialect hooks ------------------------------------------------------------------

    def _key(self, run_id: str) -> Any:
        return run_id

    def _db_time(self, value: datetime | None) -> Any:
        raise NotImplementedError

    def _py_time(self, value: Any) -> datetime | None:
        raise NotImplementedError

    def _check_size(self, run_id: str, document: str) -> None:
        """Raise ``CheckpointTooLarge`` if the document cannot be stored."""

    def _salvage_key(self, raw: Any) -> Any:
        """The key of a raw key row (``Exec.keys``), or None to skip that row (logged)."""
        return raw

    def _skip_undecodable(self, key: Any, exc: Undecodable) -> None:
        """Log a row a listing skips because it holds text that is not UTF-8."""
        logger.warning("skipping a run in listing: %s: %s", self.where, exc)

    def _schema_version(self, held: Held) -> str | None:
        """Return the stored schema_version, or None when the meta table is missing."""
        raise NotImplementedError

    def _create_schema(self, held: Held) -> None:
        raise NotImplementedError

    def _migrate(self, held: Held, found: int) -> None:
        """Bring tables at schema ``found`` to ``TABLE_SCHEMA``, safe against racers."""
        raise NotImplementedError

    # --- the drivers --------------------------------------------------------------------

    def _perform(self, effect: Exec) -> Result:
        """Run one statement of a plan on this thread's connection (``_on_held``)."""
        sql, params = effect.sql, effect.params
        if not effect.save:
            return self._on_held(self._run_keys if effect.keys else self._run, sql, params)
        group = self._group
        if group is not None:
            return self._group_save(group, sql, params, effect.first), []
        return self._on_held(self._run_save, sql, params, effect.first), []

    def _aio(self) -> bool:
        """Whether the async methods run on native async connections (not on threads).

        A store on a user's sync ``Engine`` alone runs them on threads, on that pool; with
        an ``AsyncEngine`` too, on its native async connections.
        """
        return self.native_async and (self._engine is None or self._aengine is not None)

    async def _aperform(self, effect: Exec) -> Result:
        return await self._aexec(effect.sql, effect.params, save=effect.save, first=effect.first)

    # --- rows and documents -------------------------------------------------------------

    def _save_plan(self, checkpoint: Checkpoint) -> _SavePlan:
        """Return the checkpoint as it will be stored, the statement, its parameters and
        the state's plan (its pieces, written first)."""
        run_id = check_run_id(checkpoint.run_id)
        prepared = _statelog.prepare_save(self, checkpoint, piece_max=self._piece_max)
        text, copy = prepared.state_text, prepared.state
        expected = checkpoint.version
        version = new_version(expected)
        saved = checkpoint.stored(copy, text, version, utcnow(), prepared.bind(version))
        # Each time is formatted once, for the document and (when the text is the same)
        # the columns: ``stored`` sets both, and a first save shares one object.
        updated_at: datetime = saved.updated_at  # type: ignore[assignment]
        created_at: datetime = saved.created_at  # type: ignore[assignment]
        updated_text = updated_at.isoformat()
        created_text = updated_text if created_at is updated_at else format_created(created_at)
        document = encode_document(
            saved,
            text,
            created_at=created_text,
            updated_at=updated_text,
            **prepared.document_fields(),
        )
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
        sql = self._sql.insert if expected is None else self._sql.update
        rows = self._rows
        if rows is not None:
            owner = saved.owner
            if expected is not None and rows.get(run_id) == (expected, status, owner):
                sql = self._sql.update_same
            if len(rows) >= _ROWS_KEPT:
                rows.clear()
            # What the row holds if this save lands. Keyed by the version, a random
            # token no other save writes: a save that never lands leaves an entry that
            # no stored version will ever match.
            rows[run_id] = (saved.version, status, owner)
        return saved, sql, params, prepared

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

    def _undecodable(self, run_id: str, exc: Undecodable) -> CorruptCheckpoint:
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

    def _ensure_schema(self, held: Held) -> int:
        found = self._schema_version(held)
        found_missing = migrated = False
        if found is None:
            self._create_schema(held)
            found_missing = True
            found = self._schema_version(held)
        number = self._schema_number(found)
        if number < TABLE_SCHEMA and number in MIGRATABLE:
            self._migrate(held, number)
            migrated = True
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
        # ``_create_schema`` and ``_migrate`` make the pieces table with the others (in
        # one transaction where the database has them).
        self._pieces_ready = self._pieces_ready or found_missing or migrated
        return number

    def _schema_number(self, found: str | None) -> int:
        try:
            return int(found or "")
        except ValueError:
            raise CorruptCheckpoint(
                f"{self.where}: the meta table has schema_version {found!r}, not a number; "
                "left untouched"
            ) from None

    # --- the plans: each store method once, for both drivers ----------------------------

    def _load(self, run_id: str) -> Plan[Checkpoint | None]:
        check_run_id(run_id)
        try:
            _, rows = yield Exec(self._sql.load, {"run_key": self._key(run_id)})
        except Undecodable as exc:
            raise self._undecodable(run_id, exc) from exc
        if not rows:
            return None
        version, document = rows[0]
        source = self._source(run_id)
        doc = decode_document(document, source)
        try:
            return (yield from self._checkpoint(run_id, doc, version, source))
        except _Deleted:
            return None  # a delete landed while its pieces were read: the run is gone

    def _save(self, checkpoint: Checkpoint) -> Plan[Checkpoint]:
        return self._pieces_save(checkpoint)

    def _peek(self, run_id: str) -> Plan[list[Any] | None]:
        # Only on a losing path: read what is there, for the message or the outcome.
        try:
            _, rows = yield Exec(self._sql.version, {"run_key": self._key(run_id)})
        except (StoreError, Undecodable):
            return None
        return rows

    def _delete(self, run_id: str, expected: str | None) -> Plan[bool]:
        check_run_id(run_id)
        key = self._key(run_id)
        try:
            return (yield from self._pieces_delete(_Loading(key, run_id, ""), run_id, expected))
        except _Unreadable:
            return (yield from self._delete_blind(key, run_id, expected))

    def _delete_blind(self, key: Any, run_id: str, expected: str | None) -> Plan[bool]:
        """Delete a document that cannot be read (not UTF-8), leaving its pieces alone."""
        if expected is None:
            deleted, _ = yield Exec(self._sql.delete, {"run_key": key})
            return deleted > 0
        deleted, _ = yield Exec(self._sql.delete_cas, {"run_key": key, "expected": expected})
        if deleted:
            return True
        rows = yield from self._peek(run_id)
        if rows == []:
            return False
        raise self._conflict(run_id, expected, rows)

    def _listing(self, sql: str, params: Any = None, keys: str | None = None) -> Plan[list[Any]]:
        """Rows of a listing; after an undecodable row, the others one by one."""
        try:
            _, rows = yield Exec(sql, params)
        except Undecodable:
            rows = yield from self._salvage(keys or self._sql.keys, params)
        return rows

    def _salvage(self, keys_sql: str, params: Any = None) -> Plan[list[Any]]:
        """Read rows one by one after an undecodable one broke a listing; skip the bad."""
        _, keys = yield Exec(keys_sql, params, keys=True)
        rows: list[Any] = []
        for (raw,) in keys:
            key = self._salvage_key(raw)
            if key is None:
                continue
            try:
                _, found = yield Exec(self._sql.info_one, {"run_key": key})
            except Undecodable as exc:
                self._skip_undecodable(key, exc)
                continue
            rows.extend(found)
        return rows

    def _run_ids(self) -> Plan[list[str]]:
        rows = yield from self._listing(self._sql.list)
        return [row[0] for row in rows]

    def _run_infos(self) -> Plan[list[RunInfo]]:
        return self._infos((yield from self._listing(self._sql.info)))

    def load(self, run_id: str) -> Checkpoint | None:
        """Return the run's checkpoint, or None.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
            CorruptCheckpoint: the row is unreadable or holds another run's document.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        return drive(self._load(run_id), self._perform)

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
        return drive(self._save(checkpoint), self._perform)

    def save_many(self, checkpoints: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
        """``Store.save_many``: where ``saves_together``, in one transaction and one commit
        (SQLite: a batch of the group commit; PostgreSQL: one pipelined round trip)."""
        checkpoints = check_many(checkpoints)
        group = self._group
        if not self.saves_together or len(checkpoints) < 2:
            return save_in_order(self, checkpoints)
        plans = [self._save(checkpoint) for checkpoint in checkpoints]
        if group is not None:  # SQLite: one batch of the group commit
            return save_together(plans, self._perform, lambda items: self._group_many(group, items))
        # PostgreSQL: one transaction in one round trip on this thread's connection.
        return save_together(
            plans, self._perform, lambda items: self._on_held(self._run_many, items)
        )

    async def asave_many(self, checkpoints: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
        """Async ``save_many``: where the saves go together, on a thread (sync connections:
        the one transaction is the sync driver's); else one by one, natively."""
        if not self.saves_together:
            return await super().asave_many(checkpoints)
        return await _to_thread(self.save_many, checkpoints)  # checked there

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Delete the run's row; with ``expected_version``, only if it still holds it.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
            ConflictError: the stored version differs from ``expected_version``.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        return drive(self._delete(run_id, expected_version), self._perform)

    def list_runs(self) -> Iterator[str]:
        """Yield the stored run_ids (fetched eagerly: no cursor stays open).

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        return iter(drive(self._run_ids(), self._perform))

    def list_info(self) -> Iterator[RunInfo]:
        """Yield a ``RunInfo`` per run from the indexed columns, never the documents.

        A malformed row is logged and skipped; the others are still listed.

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        return iter(drive(self._run_infos(), self._perform))

    def piece_keys(self, run_id: str) -> list[str]:
        """Every piece key stored for ``run_id``, sorted."""
        return drive(self._piece_keys(run_id), self._perform)

    def pieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The data of those of ``keys`` stored for ``run_id``."""
        return drive(self._pieces_of(run_id, keys), self._perform)

    def put_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> None:
        """Store ``pieces`` for ``run_id``; a key already stored is kept as it is."""
        drive(self._put_pieces(run_id, pieces), self._perform)

    def collect_orphans(self, min_age: float = _statelog.ORPHAN_AGE) -> list[_statelog.Orphan]:
        """Delete orphaned pieces older than ``min_age`` seconds (``Store.collect_orphans``).

        A run with no document is named by its id on SQLite, by ``key <hex>`` (the hash
        the table is keyed by) elsewhere.

        Raises:
            StoreError: the database failed or is unreachable.
        """
        return drive(self._collect_orphans(min_age), self._perform)

    async def acollect_orphans(
        self, min_age: float = _statelog.ORPHAN_AGE
    ) -> list[_statelog.Orphan]:
        """Async ``collect_orphans``."""
        if not self._aio():
            return await super().acollect_orphans(min_age)
        return await adrive(self._collect_orphans(min_age), self._aperform)

    async def apiece_keys(self, run_id: str) -> list[str]:
        """Async ``piece_keys``."""
        if not self._aio():
            return await super().apiece_keys(run_id)
        return await adrive(self._piece_keys(run_id), self._aperform)

    async def apieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Async ``pieces``."""
        if not self._aio():
            return await super().apieces(run_id, keys)
        return await adrive(self._pieces_of(run_id, keys), self._aperform)

    async def aput_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> None:
        """Async ``put_pieces``."""
        if not self._aio():
            return await super().aput_pieces(run_id, pieces)
        await adrive(self._put_pieces(run_id, pieces), self._aperform)
        return None

    # --- async (native backends; the others run the sync methods on a thread) ----------

    async def aload(self, run_id: str) -> Checkpoint | None:
        """Async ``load``; same contract, same errors."""
        if not self._aio():
            return await super().aload(run_id)
        return await adrive(self._load(run_id), self._aperform)

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        """Async ``save``; same contract, same errors. Lands whole or not at all."""
        if not self._aio():
            return await super().asave(checkpoint)
        return await adrive(self._save(checkpoint), self._aperform)

    async def adelete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Async ``delete``; same contract, same errors."""
        if not self._aio():
            return await super().adelete(run_id, expected_version=expected_version)
        return await adrive(self._delete(run_id, expected_version), self._aperform)

    async def alist_runs(self) -> AsyncIterator[str]:
        """Async ``list_runs``."""
        async for run_id in self._aeach(self._run_ids(), super().alist_runs()):
            yield run_id

    async def alist_info(self) -> AsyncIterator[RunInfo]:
        """Async ``list_info``."""
        async for info in self._aeach(self._run_infos(), super().alist_info()):
            yield info

    async def _aeach(self, plan: Plan[list[T]], fallback: AsyncIterator[T]) -> AsyncIterator[T]:
        """Yield what ``plan`` lists, or what ``fallback`` (the threads' form) does."""
        if not self._aio():
            plan.close()
            async for item in fallback:
                yield item
            return
        for item in await adrive(plan, self._aperform):
            yield item

    async def aclaimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """Async ``claimable``."""
        if not self._aio():
            return await super().aclaimable(now, limit, status=status, skip=skip)
        return await adrive(self._claimable(now, limit, status, skip), self._aperform)

    async def _aclaim_asked(self, ask: ReadyAsk) -> list[Claim]:
        if not self._aio():
            return await super()._aclaim_asked(ask)
        return await adrive(self._claim_ready(ask), self._aperform)

    async def aclose(self) -> None:
        """Async ``close``: the sync close never waits on the loop's own connections."""
        if not self._aio():
            await super().aclose()
            return
        if self._aengine is not None:
            await self._agive_back()
        self.close()

    # --- the dashboard's listing (``Store.list_page``, ``Store.count_by_status``) --------

    def _list_page(self, ask: PageAsk) -> list[RunInfo]:
        """One page of the listing, newest first: a ``LIMIT`` query on the indexes.

        The (status, updated_at) index serves a status filter, the updated_at index the
        unfiltered list (SQLite's partial indexes: an arm per status, ``pages.py``); the
        cursor continues from the last row shown (keyset paging).

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        sql, params = page_query(self._sql.info, self.scheme, self._db_time, *ask)
        try:
            _, rows = self._exec(sql, params)
        except Undecodable:
            return super()._list_page(ask)
        found = []
        for row in rows:
            info = self._info(row[:8])
            if info is not None:
                for name, value in listed_fields(row[8] if len(row) > 8 else None).items():
                    setattr(info, name, value)
                found.append(info)
        return found

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
        """Count the runs per status with a ``GROUP BY`` over the status index.

        Raises:
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        query = count_query(self._sql.info, self.scheme, prefix)
        if query is None:  # pragma: no cover - the generated statement has this shape
            return super().count_by_status(prefix)
        _, rows = self._exec(*query)
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for status, count in rows:
            if status in counts:
                counts[status] = int(count)
        return counts
