"""The pieces of the Cosmos store: the pieces protocol's hooks (``_pieces_protocol``)
as SDK effects, the piece items' reads and writes, and orphan collection.

A mixin of ``CosmosStore`` (``_store.py``), which supplies the item side: ``_read``,
``_translate``, ``_plan``, ``_cas`` and the rest named at the end of the class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, NamedTuple

from azure.cosmos.exceptions import CosmosHttpResponseError, CosmosResourceNotFoundError

from ... import _hooks, _statelog
from ..._checkpoint import Checkpoint, check_run_id
from ..._codec import REF_KEY
from ..._errors import ConflictError
from .._pieces_protocol import Current, PiecesProtocol
from ._config import Settings
from ._effects import OPEN, Effect, Gather, Query, Send, Sleep, Steps
from ._errors import Call
from ._wire import (
    Plan,
    decode,
    item_id,
    piece_data,
    piece_id,
    piece_item,
    piece_ttl,
    record_ttl,
)

__all__ = ["CosmosPieces"]

#: A field an item lacks (``_pp_own``): unequal to any value, None included.
_ABSENT: Final = object()


class CosmosPieces(PiecesProtocol[Effect]):
    """The pieces side of ``CosmosStore``."""

    settings: Settings

    # -- the hooks of the pieces protocol (``_pieces_protocol``) ----------------------

    def _pp_source(self, ctx: _Ctx) -> str:
        return self._source(ctx.doc_id)

    def _pp_decode(
        self, ctx: _Ctx, doc: Any, version: Any, found: dict[str, bytes] | None
    ) -> Checkpoint:
        if found is None:
            return self._checkpoint(doc, ctx.run_id)
        return self._with_pieces(doc, ctx.run_id, found)

    def _pp_fetch(self, ctx: _Ctx, keys: Sequence[str]) -> Steps[dict[str, bytes]]:
        return self._fetch(ctx.container, ctx.doc_id, ctx.run_id, keys)

    def _pp_read(self, ctx: _Ctx) -> Steps[tuple[Any, Any] | None]:
        doc = yield from self._read(ctx.container, ctx.doc_id, ctx.run_id)
        return None if doc is None else (doc, None)

    def _pp_pause(self, attempt: int) -> Effect:
        return Sleep(0.05 * 2**attempt)

    def _with_pieces(self, doc: Any, run_id: str, found: dict[str, bytes]) -> Checkpoint:
        """The checkpoint of an item whose state is in ``found`` (``PiecesMissing``)."""
        where = self._source(doc.get("id") if isinstance(doc, Mapping) else None)
        return decode(doc, run_id, where, self, found)

    def _fetch(
        self, container: Any, doc_id: str, run_id: str, keys: Sequence[str]
    ) -> Steps[dict[str, bytes]]:
        """The pieces of ``keys`` there are: one query (a request per page, where point
        reads would cost one per piece), on the run and the oldest generation named
        (indexed), the keys checked on those items only.
        """
        if not keys:
            return {}
        wanted = set(keys)
        rows = yield from self._query(
            "SELECT c.key, c.data FROM c WHERE c.piece_of = @of AND c.gen >= @gen "
            "AND ARRAY_CONTAINS(@keys, c.key)",
            [
                {"name": "@of", "value": doc_id},
                {"name": "@gen", "value": min(map(_statelog.gen_of, keys))},
                {"name": "@keys", "value": sorted(wanted)},
            ],
        )
        where = self._where()
        found: dict[str, bytes] = {}
        for row in rows:
            key, data = piece_data(row, where)
            if key in wanted:
                found[key] = data
        return found

    def _piece_rows(
        self, container: Any, doc_id: str, run_id: str, below: int | None
    ) -> Steps[list[dict[str, Any]]]:
        """``{id, key}`` of the run's piece items (those below generation ``below``)."""
        query = "SELECT c.id, c.key FROM c WHERE c.piece_of = @of"
        params: list[dict[str, Any]] = [{"name": "@of", "value": doc_id}]
        if below is not None:
            query += " AND c.gen < @gen"
            params.append({"name": "@gen", "value": below})
        with self._translate(Call("list the pieces of", run_id)):
            rows = yield Query(container, query, params, self.settings.timeout)
        return [row for row in rows if isinstance(row, dict) and "id" in row and "key" in row]

    def _drop(self, container: Any, ids: Sequence[str], run_id: str) -> Steps[None]:
        """Delete these piece items; one already gone is fine (a racing collection)."""
        with self._translate(Call("delete the pieces of", run_id)):
            for ident in ids:
                try:
                    yield self._on_item(container, "delete_item", ident)
                except CosmosResourceNotFoundError as exc:
                    self._item_missing(exc)

    def _on_item(
        self, container: Any, method: str, doc_id: str, version: str | None = None
    ) -> Send:
        """``container.method(doc_id)`` on one item, in its own partition (the key is its
        id), under the call's timeout; with ``version``, only if it is still that one."""
        return Send(container, method, (doc_id,), {"partition_key": doc_id, **self._cas(version)})

    def _put(
        self, container: Any, doc_id: str, pieces: Sequence[_statelog.Piece], run_id: str
    ) -> Steps[None]:
        """Create ``pieces``; one already stored (409: a retry, a second copy) is kept.

        Concurrently on the aio SDK (a 64 MiB state is 64 items). With a test's hook
        installed (``_hooks``), the first piece goes alone and ``pieces.piece`` fires
        after it and after the rest: a kill there leaves some of a save's pieces
        written and some not, as between two pieces of the SQL and file stores. Without
        one, all go in one concurrent wave (the split would cost a round trip).
        """
        ttl = piece_ttl(record_ttl(run_id, self.settings.ttl))
        timeout = self.settings.timeout
        waves = [pieces]
        if _hooks.installed() is not None and len(pieces) > 1:
            waves = [pieces[:1], pieces[1:]]
        with self._translate(Call("write the pieces of", run_id)):
            for wave in waves:
                results = yield Gather(
                    tuple(
                        Send(
                            container,
                            "create_item",
                            (piece_item(doc_id, piece, ttl),),
                            {"timeout": timeout},
                        )
                        for piece in wave
                    ),
                    settle=True,
                )
                for result in results:
                    if isinstance(result, BaseException) and not (
                        isinstance(result, CosmosHttpResponseError) and result.status_code == 409
                    ):
                        raise result
                _hooks.fire("pieces.piece")  # chaos: a kill between two pieces of a save

    def _save(self, checkpoint: Checkpoint) -> Steps[Checkpoint]:
        return self._pieces_save(checkpoint)

    def _pp_plan(self, checkpoint: Checkpoint) -> Plan:
        return self._plan(checkpoint)

    def _pp_prepared(self, plan: Plan) -> _statelog.Prepared:
        return plan.prepared

    def _pp_run_id(self, plan: Plan) -> str:
        return plan.run_id

    def _pp_begin(self, plan: Plan) -> Steps[_Ctx]:
        container = yield OPEN
        return _Ctx(container, plan.doc_id, plan.run_id)

    def _pp_write(self, ctx: _Ctx, pieces: Sequence[_statelog.Piece], retry: bool) -> Steps[None]:
        # A piece already stored is kept (``_put``), on a retry or not.
        return self._put(ctx.container, ctx.doc_id, pieces, ctx.run_id)

    def _pp_commit(self, ctx: _Ctx, plan: Plan, checkpoint: Checkpoint) -> Steps[Any]:
        _hooks.fire("cosmos.before_request")
        container = ctx.container
        version = checkpoint.version
        if version is None:
            write = Send(container, "create_item", (plan.item,), self._cas(None), saving=True)
        else:
            args = (plan.doc_id, plan.item)
            write = Send(container, "replace_item", args, self._cas(version), saving=True)
        with self._translate(Call("save", plan.run_id, plan.size)):
            try:
                return (yield write)
            except CosmosResourceNotFoundError as exc:
                self._item_missing(exc)
                raise ConflictError(
                    f"run {plan.run_id!r}: the checkpoint was deleted since it was "
                    "loaded; nothing was stored",
                    plan.run_id,
                ) from exc

    def _pp_own(self, ctx: _Ctx, plan: Plan) -> Steps[Any]:
        """The stored item if it is the one ``plan`` wrote (a retry's landed write), else None.

        The ETag is the server's, so the item itself tells: the one stored is this plan's,
        field for field (its updated_at to the microsecond included), only if the first
        attempt landed.
        """
        found = yield from self._read(ctx.container, plan.doc_id, plan.run_id)
        if not isinstance(found, Mapping):
            return None
        item = plan.item
        if any(found.get(name, _ABSENT) != value for name, value in item.items()):
            return None
        return found

    def _pp_saved(self, plan: Plan, checkpoint: Checkpoint, result: Any) -> Checkpoint:
        return self._saved(plan, checkpoint, result)

    def _pp_drop(self, ctx: _Ctx, keys: list[str]) -> Steps[None]:
        ids = [piece_id(ctx.doc_id, key) for key in keys]
        return self._drop(ctx.container, ids, ctx.run_id)

    def _pp_collect(self, ctx: _Ctx, below: int, inc: str | None) -> Steps[None]:
        rows = yield from self._piece_rows(ctx.container, ctx.doc_id, ctx.run_id, None)
        yield from self._drop(ctx.container, _collectable(rows, below, inc), ctx.run_id)

    def _delete(self, run_id: str, expected_version: str | None) -> Steps[bool]:
        doc_id = item_id(check_run_id(run_id))
        container = yield OPEN
        return (
            yield from self._pieces_delete(
                _Ctx(container, doc_id, run_id), run_id, expected_version
            )
        )

    def _pp_current(self, ctx: _Ctx) -> Steps[Current | None]:
        doc = yield from self._read(ctx.container, ctx.doc_id, ctx.run_id)
        if doc is None:
            return None
        etag = doc.get("_etag") if isinstance(doc, Mapping) else None
        has, inc = _item_inc(doc)
        return Current(etag, has, inc)

    def _pp_delete_conflict(self, run_id: str, expected: str, found: Any) -> ConflictError:
        return ConflictError(
            f"run {run_id!r}: expected version {expected!r}, stored {found!r}; nothing was deleted",
            run_id,
        )

    def _pp_delete_cas(self, ctx: _Ctx, version: Any) -> Steps[bool]:
        try:
            with self._translate(Call("delete", ctx.run_id)):
                yield self._on_item(ctx.container, "delete_item", ctx.doc_id, version)
        except (ConflictError, CosmosResourceNotFoundError):
            return False
        return True

    def _pp_delete_inc(self, ctx: _Ctx, inc: str | None) -> Steps[None]:
        rows = yield from self._piece_rows(ctx.container, ctx.doc_id, ctx.run_id, None)
        ids = [row["id"] for row in rows if _statelog.inc_of(str(row["key"])) == inc]
        yield from self._drop(ctx.container, ids, ctx.run_id)

    # -- the pieces, for history and migration (``Store.piece_keys`` and the rest) ------

    def _keys(self, run_id: str) -> Steps[list[str]]:
        doc_id = item_id(check_run_id(run_id))
        container = yield OPEN
        rows = yield from self._piece_rows(container, doc_id, run_id, None)
        return sorted(row["key"] for row in rows)

    def _pieces_named(self, run_id: str, keys: Sequence[str]) -> Steps[dict[str, bytes]]:
        doc_id = item_id(check_run_id(run_id))
        container = yield OPEN
        return (yield from self._fetch(container, doc_id, run_id, list(keys)))

    def _put_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> Steps[None]:
        doc_id = item_id(check_run_id(run_id))
        container = yield OPEN
        if pieces:
            yield from self._put(container, doc_id, pieces, run_id)

    def _orphans(self, min_age: float) -> Steps[list[_statelog.Orphan]]:
        """Delete the piece items of runs with no item, of old incarnations."""
        container = yield OPEN
        rows = yield from self._query(
            "SELECT c.id, c.key, c.piece_of, LENGTH(c.data) AS size FROM c "
            "WHERE IS_DEFINED(c.piece_of)"
        )
        by_run: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            key = row.get("key") if isinstance(row, dict) else None
            if isinstance(key, str) and _statelog.is_orphan(key, None, min_age):
                by_run.setdefault(str(row["piece_of"]), []).append(row)
        found: list[_statelog.Orphan] = []
        for doc_id, pieces in by_run.items():
            doc = yield from self._read(container, doc_id, doc_id)
            if doc is not None:
                continue  # a run with an item: its own saves collect its orphans
            yield from self._drop(container, [row["id"] for row in pieces], doc_id)
            _hooks.fire("pieces.collecting")  # chaos: a kill between two runs' orphans
            # Base64 text: about 3 bytes per 4 characters.
            found.extend(
                _statelog.Orphan(doc_id, row["key"], int(row.get("size") or 0) * 3 // 4)
                for row in pieces
            )
        return found

    # -- what ``CosmosStore`` supplies -------------------------------------------------

    def _read(self, container: Any, doc_id: str, run_id: str) -> Steps[Any]:
        raise NotImplementedError

    def _translate(self, call: Call) -> AbstractContextManager[None]:
        raise NotImplementedError

    @staticmethod
    def _item_missing(exc: CosmosResourceNotFoundError) -> None:
        raise NotImplementedError

    def _where(self) -> str:
        raise NotImplementedError

    def _source(self, doc_id: object) -> str:
        raise NotImplementedError

    def _checkpoint(self, doc: Any, run_id: str) -> Checkpoint:
        raise NotImplementedError

    def _plan(self, checkpoint: Checkpoint) -> Plan:
        raise NotImplementedError

    @staticmethod
    def _saved(plan: Plan, checkpoint: Checkpoint, result: Any) -> Checkpoint:
        raise NotImplementedError

    def _cas(self, version: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def _query(self, query: str, parameters: list[dict[str, Any]] | None = None) -> Steps[Any]:
        raise NotImplementedError


class _Ctx(NamedTuple):
    """The ``ctx`` of the pieces protocol: the container, the run's item id and run id."""

    container: Any
    doc_id: str
    run_id: str


def _item_inc(doc: Any) -> tuple[bool, str | None]:
    """``_statelog.inc_of_doc`` of a run's item, whose ``state_ref`` is JSON text."""
    if not isinstance(doc, Mapping):
        return False, None
    ref = doc.get(REF_KEY)
    if isinstance(ref, str):
        try:
            ref = json.loads(ref)
        except ValueError:
            ref = None
    fields = {"state_gen": doc.get("state_gen"), "state_inc": doc.get("state_inc")}
    if isinstance(ref, dict):
        fields[REF_KEY] = ref
    return _statelog.inc_of_doc(fields)


def _collectable(rows: list[dict[str, Any]], below: int, inc: str | None) -> list[str]:
    """The ids of the piece items a new base of incarnation ``inc`` at ``below`` collects."""
    ids = []
    for row in rows:
        key = str(row["key"])
        try:
            mine = _statelog.inc_of(key) == inc and _statelog.gen_of(key) < below
        except ValueError:
            continue  # not a key stepstone wrote: left alone
        if mine or _statelog.is_orphan(key, inc, _statelog.ORPHAN_AGE):
            ids.append(row["id"])
    return ids
