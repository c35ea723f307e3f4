"""The pieces of a SQL store: the pieces protocol's hooks (``_pieces_protocol``) as
``Exec`` plans, and the plans of the pieces methods (``piece_keys``, ``collect_orphans``).

A mixin of ``SQLStore`` (``store.py``), which supplies the rows' side: ``_key``,
``_save_plan``, ``_peek``, ``_conflict`` and the statements ``_sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

from ... import _hooks, _statelog
from ..._checkpoint import Checkpoint, check_run_id
from ..._codec import checkpoint_from_doc, decode_document
from ..._errors import ConflictError, CorruptCheckpoint, StoreError
from ..._observe import logger
from .._pieces_protocol import Current, PiecesProtocol
from .effects import Exec, Plan
from .errors import Undecodable
from .pieces import IN_MAX, PieceSQL, piece_sql
from .schema import SQLText

__all__ = ["SQLPieces"]

#: A save's plan: the checkpoint as it will be stored, the statement, its parameters
#: and the state's plan (its pieces, written first).
_SavePlan = tuple[Checkpoint, str, dict[str, Any], _statelog.Prepared]


class _Deleted(CorruptCheckpoint):
    """A run deleted while its pieces were read: ``load`` answers None."""


class _Unreadable(Exception):
    """``delete`` found a document that is not UTF-8: it deletes it blind."""


class _Saving:
    """The ``ctx`` of a save: the run's key, the save's new version, and its pieces'
    statements, which ``_pp_write`` plans and ``_pp_commit`` runs in the transaction of
    its swap."""

    __slots__ = ("collected", "first", "key", "version")

    def __init__(self, key: Any, version: Any) -> None:
        self.key = key
        self.version = version
        self.first: tuple[tuple[str, Any], ...] = ()
        #: The base collection went into the swap's transaction (``_pp_commit``).
        self.collected = False


def _key_of(ctx: Any) -> Any:
    """The run's key of a save's ``ctx``: a ``_Saving``, or the bare key of a save
    without pieces (which a collection may follow: a state back under the inline size)."""
    return ctx.key if type(ctx) is _Saving else ctx


class _Loading(NamedTuple):
    """The ``ctx`` of the pieces protocol's loads and deletes: the run's key, id, source."""

    key: Any
    run_id: str
    source: str


class SQLPieces(PiecesProtocol[Exec]):
    """The pieces side of ``SQLStore``; ``ctx`` is a ``_Saving`` in a save with pieces
    (the run's key in one without), a ``_Loading`` in a load or delete.

    A save's pieces are written in the transaction of its compare-and-swap
    (``Exec.first``): one commit (on SQLite one fsync) for the save, not one per piece,
    and a lost or killed save leaves none behind.
    """

    _sql: SQLText
    where: str

    holds_pieces: ClassVar[bool] = True
    _pieces_in_commit: ClassVar[bool] = True
    piece_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.piece": False, "pieces.written": False, "pieces.collect": True}
    )
    cleanup_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.deleting": True, "pieces.collecting": True}
    )
    #: The dialect of the pieces table (``pieces.py``): "sqlite", "postgresql", "mysql".
    _DIALECT: ClassVar[str] = ""
    #: The driver runs a save's swap before its pieces, which are inserted only if it
    #: landed (``PieceSQL.insert_landed``): PostgreSQL, whose save is one round trip.
    _SWAP_FIRST: ClassVar[bool] = False
    #: The sweep after a new base rides the save's own transaction instead of a
    #: statement (and, on SQLite, a commit) of its own: PostgreSQL after the swap, only
    #: if it landed; SQLite before it, where a lost swap rolls it back with the pieces.
    #: Not MySQL: InnoDB's gap locks would hold the run's piece range to the commit.
    _SWEEP_IN_SAVE: ClassVar[bool] = False
    _pieces_text: PieceSQL | None = None
    #: Whether the pieces table is known to exist: this store created or migrated the
    #: tables, or ran the pieces DDL once. A table an earlier release made gains it on
    #: the first statement that needs it, so opening a store costs no extra round trip.
    _pieces_ready: bool = False

    @property
    def _pieces_sql(self) -> PieceSQL:
        text = self._pieces_text
        if text is None:
            text = self._pieces_text = piece_sql(self._DIALECT, getattr(self, "table", None))
        return text

    @property
    def _piece_max(self) -> int:
        """The largest piece this store is handed: under every packet and value limit."""
        limit = getattr(self, "_max_bytes", None)
        if isinstance(limit, int) and limit > 0:
            # Escaped on the wire at most twice over, with room for the statement.
            return max(min(_statelog.PIECE_MAX, limit // 4), 4096)
        return _statelog.PIECE_MAX

    def _pieces_table(self) -> Plan[None]:
        """Create the pieces table (``IF NOT EXISTS``) unless this store knows it is there."""
        if not self._pieces_ready:
            try:
                yield Exec(self._pieces_sql.create, None)
            except StoreError as exc:
                # Two processes creating it at once can collide even with IF NOT EXISTS
                # (PostgreSQL's catalog): the statement that follows says if it is there.
                logger.info("%s: creating the pieces table: %s", self.where, exc)
                return
            self._pieces_ready = True

    # --- the hooks of the pieces protocol (``_pieces_protocol``); ``ctx``: the run's key

    def _pp_plan(self, checkpoint: Checkpoint) -> _SavePlan:
        return self._save_plan(checkpoint)

    def _pp_prepared(self, plan: _SavePlan) -> _statelog.Prepared:
        return plan[3]

    def _pp_run_id(self, plan: _SavePlan) -> str:
        return plan[0].run_id

    def _pp_begin(self, plan: _SavePlan) -> Plan[Any]:
        params = plan[2]
        if not plan[3].pieces:
            return params["run_key"]  # most saves: no pieces, the bare key (``_key_of``)
        return _Saving(params["run_key"], params["version"])
        yield  # a generator that performs nothing

    def _pp_write(self, ctx: _Saving, pieces: Sequence[_statelog.Piece], retry: bool) -> Plan[None]:
        """Plan the pieces' statements; ``_pp_commit`` runs them in the swap's transaction
        (the drivers fire ``pieces.piece`` between two, ``pieces.written`` after them)."""
        yield from self._pieces_table()
        sql = self._pieces_sql
        key = ctx.key
        # Each its own statement (within every packet limit). A retry's pieces may be
        # there already (its first attempt landed): keep them.
        if self._SWAP_FIRST:
            insert = sql.insert_new_landed if retry else sql.insert_landed
            version = ctx.version
            ctx.first = tuple(
                (
                    insert,
                    {
                        "run_key": key,
                        "piece_key": p.key,
                        "gen": p.gen,
                        "data": p.data,
                        "version": version,
                    },
                )
                for p in pieces
            )
            return
        insert = sql.insert_new if retry else sql.insert
        ctx.first = tuple(
            (insert, {"run_key": key, "piece_key": p.key, "gen": p.gen, "data": p.data})
            for p in pieces
        )

    def _pp_commit(self, ctx: Any, plan: _SavePlan, checkpoint: Checkpoint) -> Plan[int]:
        saved, sql, params, prepared = plan
        if type(ctx) is _Saving:
            below, inc = prepared.collect_below, prepared.inc
            if self._SWEEP_IN_SAVE and below is not None and inc is not None:
                sweep = self._collect_params(ctx, below, inc)
                if self._SWAP_FIRST:
                    # PostgreSQL: after the swap, in its one round trip, deleting only
                    # if the swap landed.
                    sweep["version"] = ctx.version
                    statement = self._pieces_sql.delete_below_landed
                else:
                    # SQLite: before the swap, in its transaction: a lost swap rolls
                    # back the sweep with the pieces (``run_batch``), one that lands
                    # commits it: one commit per new base, not two. The new base's
                    # pieces are of generation ``below``, which the sweep keeps.
                    statement = self._pieces_sql.delete_below
                ctx.first = (*ctx.first, (statement, sweep))
                ctx.collected = True
            stored, _ = yield Exec(sql, params, True, False, ctx.first)
        else:
            stored, _ = yield Exec(sql, params, True)
        if stored != 1:
            rows = yield from self._peek(saved.run_id)
            raise self._conflict(saved.run_id, checkpoint.version, rows)
        return stored

    def _pp_own(self, ctx: Any, plan: _SavePlan) -> Plan[int | None]:
        rows = yield from self._peek(plan[0].run_id)
        # Nobody else writes a save's random version token.
        return 1 if rows and rows[0][0] == plan[0].version else None

    def _pp_saved(self, plan: _SavePlan, checkpoint: Checkpoint, result: Any) -> Checkpoint:
        return plan[0]

    def _pp_collect(self, ctx: Any, below: int, inc: str | None) -> Plan[None]:
        """One statement: this incarnation's pieces below ``below``, and orphans of other
        incarnations (``_statelog.is_orphan``). Never another incarnation's young pieces:
        the run may have been deleted and started again since this save's document landed."""
        sql = self._pieces_sql
        if inc is None:
            params = {"run_key": _key_of(ctx), "gen": below, "any_inc": "%:%"}
            yield Exec(sql.delete_below_legacy, params)
            return
        yield Exec(sql.delete_below, self._collect_params(ctx, below, inc))

    def _pp_collected(self, ctx: Any) -> bool:
        return type(ctx) is _Saving and ctx.collected

    @staticmethod
    def _collect_params(ctx: Any, below: int, inc: str) -> dict[str, Any]:
        """``delete_below``'s parameters: this incarnation below ``below``, and other
        incarnations' pieces made before the orphan age (``_statelog.is_orphan``)."""
        return {
            "run_key": _key_of(ctx),
            "gen": below,
            "inc_like": f"{inc}:%",
            "any_inc": "%:%",
            "cutoff": _statelog.inc_cutoff(_statelog.ORPHAN_AGE),
        }

    def _pp_drop(self, ctx: Any, keys: list[str]) -> Plan[None]:
        # Not called (``_pieces_in_commit``: a lost save's pieces went with its swap);
        # kept for the protocol's contract.
        pieces = self._pieces_sql
        for start in range(0, len(keys), IN_MAX):
            part = keys[start : start + IN_MAX]
            params = {"run_key": _key_of(ctx), **{f"k{n}": k for n, k in enumerate(part)}}
            yield Exec(pieces.delete_keys(len(part)), params)

    def _pp_fetch(self, ctx: _Loading, keys: Sequence[str]) -> Plan[dict[str, bytes]]:
        pieces = self._pieces_sql
        found: dict[str, bytes] = {}
        wanted = list(dict.fromkeys(keys))
        for start in range(0, len(wanted), IN_MAX):
            part = wanted[start : start + IN_MAX]
            params = {"run_key": ctx.key, **{f"k{n}": k for n, k in enumerate(part)}}
            _, rows = yield Exec(pieces.select(len(part)), params)
            for piece_key, data in rows:
                found[str(piece_key)] = bytes(data)
        return found

    def _pp_source(self, ctx: _Loading) -> str:
        return ctx.source

    def _pp_decode(
        self, ctx: _Loading, doc: Any, version: Any, found: dict[str, bytes] | None
    ) -> Checkpoint:
        if found is None:
            return checkpoint_from_doc(doc, version, ctx.source, ctx.run_id)
        return _statelog.checkpoint_with_pieces(self, doc, version, ctx.source, ctx.run_id, found)

    def _pp_read(self, ctx: _Loading) -> Plan[tuple[Any, Any] | None]:
        _, rows = yield Exec(self._sql.load, {"run_key": ctx.key})
        if not rows:
            return None
        version, document = rows[0]
        return decode_document(document, ctx.source), version

    def _checkpoint(
        self, run_id: str, doc: dict[str, Any], version: str | None, source: str
    ) -> Plan[Checkpoint]:
        """The checkpoint of a decoded document, its pieces fetched when it has them."""
        found = yield from self._pieces_load(
            _Loading(self._key(run_id), run_id, source), doc, version
        )
        if found is None:
            raise _Deleted(f"{source}: deleted while being read")
        return found  # type: ignore[no-any-return]

    def _piece_keys(self, run_id: str) -> Plan[list[str]]:
        check_run_id(run_id)
        yield from self._pieces_table()
        _, rows = yield Exec(self._pieces_sql.keys, {"run_key": self._key(run_id)})
        return [str(row[0]) for row in rows]

    def _pieces_of(self, run_id: str, keys: Sequence[str]) -> Plan[dict[str, bytes]]:
        check_run_id(run_id)
        return (yield from self._pp_fetch(_Loading(self._key(run_id), run_id, ""), keys))

    def _put_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> Plan[None]:
        check_run_id(run_id)
        key = self._key(run_id)
        yield from self._pieces_table()
        # One statement per piece that keeps a row already there: two copies racing (a
        # migration run twice at once) both succeed, where checking first would not.
        for piece in pieces:
            yield Exec(
                self._pieces_sql.insert_new,
                {"run_key": key, "piece_key": piece.key, "gen": piece.gen, "data": piece.data},
            )

    def _pp_current(self, ctx: _Loading) -> Plan[Current | None]:
        try:
            _, rows = yield Exec(self._sql.load, {"run_key": ctx.key})
        except Undecodable as exc:
            raise _Unreadable from exc
        if not rows:
            return None
        version, document = rows[0]
        try:
            has, inc = _statelog.inc_of_doc(decode_document(document, self._source(ctx.run_id)))
        except CorruptCheckpoint:
            # Deletable all the same; its pieces, if any, are left for collect_orphans.
            has, inc = False, None
        return Current(version, has, inc)

    def _pp_delete_conflict(self, run_id: str, expected: str, found: Any) -> ConflictError:
        return self._conflict(run_id, expected, [(found,)])

    def _pp_delete_cas(self, ctx: _Loading, version: Any) -> Plan[bool]:
        deleted, _ = yield Exec(self._sql.delete_cas, {"run_key": ctx.key, "expected": version})
        return bool(deleted)

    def _pp_delete_inc(self, ctx: _Loading, inc: str | None) -> Plan[None]:
        yield from self._pieces_table()
        sql = self._pieces_sql
        if inc is None:
            yield Exec(sql.delete_legacy, {"run_key": ctx.key, "any_inc": "%:%"})
        else:
            yield Exec(sql.delete_inc, {"run_key": ctx.key, "inc_like": f"{inc}:%"})

    def _collect_orphans(self, min_age: float) -> Plan[list[_statelog.Orphan]]:
        """Delete the pieces of runs with no document, of incarnations made more than
        ``min_age`` seconds ago; return what was deleted."""
        yield from self._pieces_table()
        sql = self._pieces_sql
        params = {"any_inc": "%:%", "cutoff": _statelog.inc_cutoff(min_age)}
        _, rows = yield Exec(sql.orphans, params)
        found: list[_statelog.Orphan] = []
        for run_key, listed, size in rows:
            piece = str(listed)
            if not _statelog.is_orphan(piece, None, min_age):
                continue
            # Re-checked in the statement: a run started again since keeps its pieces
            # (those are of a new incarnation anyway, too young to be listed).
            deleted, _ = yield Exec(sql.delete_orphan, {"run_key": run_key, "piece_key": piece})
            if deleted:
                _hooks.fire("pieces.collecting")  # chaos: a kill between two orphans
                run = run_key if isinstance(run_key, str) else "key " + bytes(run_key).hex()
                found.append(_statelog.Orphan(run, piece, int(size)))
        return found

    # --- what ``SQLStore`` supplies -----------------------------------------------------

    def _key(self, run_id: str) -> Any:
        raise NotImplementedError

    def _save_plan(self, checkpoint: Checkpoint) -> _SavePlan:
        raise NotImplementedError

    def _peek(self, run_id: str) -> Plan[list[Any] | None]:
        raise NotImplementedError

    def _conflict(self, run_id: str, expected: str | None, rows: list[Any] | None) -> ConflictError:
        raise NotImplementedError

    def _source(self, run_id: str) -> str:
        raise NotImplementedError
