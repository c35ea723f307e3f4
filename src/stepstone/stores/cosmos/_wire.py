"""What goes over the wire: item ids, the item layout both ways, and the queries.

Sync and async share all of it; nothing here sends a request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, cast

from ... import _statelog
from ..._checkpoint import (
    ACTIVE_STATUSES,
    READABLE_SCHEMAS,
    SCHEMA_PIECES,
    STATUSES,
    Checkpoint,
    RunStatus,
    check_run_id,
    run_status,
    utcnow,
)
from ..._codec import REF_KEY, check_document, checkpoint_from_doc, checkpoint_meta
from ..._errors import CheckpointTooLarge, CorruptCheckpoint, InvalidState, StoreError
from ..._observe import logger
from ..._store import RunInfo, check_page

__all__ = [
    "CLAIM_DUE",
    "CLAIM_RUNNING",
    "LIST_QUERY",
    "MAX_ITEM_BYTES",
    "NOT_PIECE",
    "PIECE_MARK",
    "Plan",
    "claim_queries",
    "claimed",
    "decode",
    "encode",
    "infos",
    "item_id",
    "page_query",
    "piece_id",
    "piece_item",
    "piece_ttl",
    "plan",
    "record_ttl",
    "saved",
    "sortable_time",
    "source",
    "time_text",
]

#: Cosmos DB's per-item limit. Checked client-side so an oversized checkpoint costs no
#: request and gets a clear error instead of a 413.
MAX_ITEM_BYTES: Final = 2 * 1024 * 1024

# Ids used verbatim: URL-safe, never percent-decoded or dot-segment-normalised by HTTP
# libraries, and without '~' or '!', which mark the encoded forms, so the three forms
# can never produce the same id for two run_ids.
_VERBATIM: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_MAX_B64_ID: Final = 250

#: Item fields holding arbitrary JSON besides the state. Stored as JSON *text*, like the
#: state, because Cosmos keeps numbers as IEEE doubles (see ``encode``).
_TEXT_FIELDS: Final = ("input", "signals")

#: Stepstone's records that hold configuration, not a run: the store's schedules
#: (``_cron.RECORD``) and flow control's limits (``_flow._limit.PREFIX`` + key). As text
#: here, so the store imports no runtime; tests/stores/cosmos/test_cosmos_records.py
#: checks they agree.
SCHEDULES_RECORD: Final = "~schedules"
LIMIT_PREFIX: Final = "~limit/"

#: The first character of a piece item's id (``piece_id``): no run's item id starts with
#: it (``item_id`` uses ``[A-Za-z0-9_.:-]``, ``~`` and ``!``), so the two never collide.
PIECE_MARK: Final = "^"
#: The filter that keeps piece items out of a listing: only they have ``piece_of``
#: (an indexed path, so the filter reads index entries, not items).
NOT_PIECE: Final = "NOT IS_DEFINED(c.piece_of)"

#: What listings and claims read of an item: never the state.
_INFO_FIELDS: Final = (
    "c.id, c.run_id, c.stepstone, c.step, c.total_steps, c.failure, c.updated_at, "
    "c.status, c.owner, c.due_at, c._etag"
)
#: What the dashboard's page (``list_page``) reads besides: the fields its rows show.
_PAGE_FIELDS: Final = f"{_INFO_FIELDS}, c.workflow, c.workflow_version, c.waiting_for"
LIST_QUERY: Final = f"SELECT {_INFO_FIELDS} FROM c WHERE {NOT_PIECE}"
#: One equality query per active status: the shape Cosmos documents a composite index
#: (status, due_at) serving for both the filter and the ORDER BY (an equality on the first
#: path, the ORDER BY naming both). One ``status IN (...)`` query ordered by due_at alone
#: would save a request but is not that shape.
CLAIM_RUNNING: Final = (
    f"SELECT TOP @limit {_INFO_FIELDS} FROM c WHERE c.status = @status "
    "ORDER BY c.status ASC, c.due_at ASC"
)
CLAIM_DUE: Final = (
    f"SELECT TOP @limit {_INFO_FIELDS} FROM c WHERE c.status = @status "
    "AND c.due_at <= @now ORDER BY c.status ASC, c.due_at ASC"
)
#: Newest first, in exactly the order of the listing's composite indexes (the emulator,
#: like the service, serves a multi-path ORDER BY only from a composite index of that
#: order).
_PAGE_ORDER: Final = "ORDER BY c.updated_at DESC, c.run_id DESC"
_PAGE_ORDER_STATUS: Final = "ORDER BY c.status ASC, c.updated_at DESC, c.run_id DESC"

Query = tuple[str, list[dict[str, Any]] | None]


def item_id(run_id: str) -> str:
    """Return the Cosmos item id for a (valid) run_id.

    - made only of ``[A-Za-z0-9_.:-]``, 1-200 characters, not only dots: used verbatim,
      so ids stay readable in the portal;
    - otherwise ``~`` + unpadded base64url of its UTF-8, if that fits in 250 characters
      (reversible, case-preserving: ``a/B`` and ``a/b`` stay apart);
    - otherwise ``!`` + the SHA-256 hex of its UTF-8 (65 characters). The item keeps the
      run_id and ``load`` compares it, so a collision could never return another run.
    """
    if _VERBATIM.fullmatch(run_id) and run_id.strip("."):
        return run_id
    raw = run_id.encode("utf-8")
    encoded = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(encoded) < _MAX_B64_ID:
        return "~" + encoded
    return "!" + hashlib.sha256(raw).hexdigest()


def sortable_time(value: datetime) -> str:
    """Return ``value`` as fixed-width UTC text (``2026-12-01T09:00:00.000000Z``).

    Every stored ``due_at`` and every ``@now`` has this one form, so comparing and
    ordering the strings in a Cosmos query is comparing and ordering the instants.

    Raises:
        ValueError: ``value`` is naive (no time zone): its instant is unknown.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{value!r} has no time zone; pass an aware datetime (UTC)")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def time_text(value: datetime) -> str:
    """Return ``value`` as a save stores ``updated_at``: UTC ``isoformat`` text."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # as ``page_key`` reads a naive time
    return value.astimezone(UTC).isoformat()


def _parse_time(value: Any) -> datetime | None:
    """Parse a stored timestamp; None stays None, anything else malformed raises."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"timestamp {value!r} is not text")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {value!r} has no time zone")
    return parsed


# -- the item, both ways ----------------------------------------------------------------


class Plan(NamedTuple):
    """A save, prepared and checked before any request: what to send, what to return.

    ``prepared`` is the state's plan (``_statelog``): its ``pieces`` are written before
    the item, which names them, and ``collect_below`` says what to delete after.
    """

    run_id: str
    doc_id: str
    item: dict[str, Any]
    size: int
    prepared: _statelog.Prepared
    now: datetime


def encode(
    cp: Checkpoint,
    doc_id: str,
    state_text: str | None,
    ttl: int | None,
    prepared: _statelog.Prepared | None = None,
) -> tuple[dict[str, Any], int]:
    """Return the item for ``cp`` and its size in bytes as the SDK will send it.

    With a ``prepared`` plan whose state is in pieces, the item holds its ``state_ref``
    (as JSON text, schema 3) instead of the state.
    """
    meta: dict[str, Any] = {"id": doc_id, **checkpoint_meta(cp)}
    # The state, the input and signal payloads go in as JSON *text*, not nested.
    # Cosmos DB keeps numbers as IEEE doubles: an int above 2**53 would lose digits,
    # 1.0 would come back as 1 and -0.0 as 0. As strings they round-trip exactly, as
    # on every other backend; they are never queried, so nothing is lost.
    for name in _TEXT_FIELDS:
        if name in meta:
            try:
                meta[name] = json.dumps(
                    meta[name], ensure_ascii=False, allow_nan=False, separators=(",", ":")
                )
            except (TypeError, ValueError) as exc:
                raise InvalidState(
                    f"run {cp.run_id!r}: the {name} does not encode as JSON: {exc}", name
                ) from exc
    # The listing fields, beside the document so queries never parse it.
    meta["status"] = cp.status
    due = cp.due_at
    if due is not None:
        meta["due_at"] = sortable_time(due)
    ttl = record_ttl(cp.run_id, ttl)
    if ttl is not None:
        meta["ttl"] = ttl
    if prepared is not None and prepared.ref is not None:
        meta["stepstone"] = SCHEMA_PIECES
        item = {**meta, REF_KEY: json.dumps(prepared.ref, separators=(",", ":"))}
    else:
        if prepared is not None:
            if prepared.gen:
                meta["state_gen"] = prepared.gen
                if prepared.inc is not None:
                    meta["state_inc"] = prepared.inc
            if prepared.history is not None:
                meta["history_head"] = prepared.history
        item = {**meta, "state": state_text}
    # The SDK sends json.dumps(item, separators=(",", ":")) (ASCII, so characters
    # are bytes): measure exactly that.
    size = len(json.dumps(item, separators=(",", ":")))
    return item, size


def plan(store: object, checkpoint: Checkpoint, ttl: int | None) -> Plan:
    """Encode and check a save before any request (InvalidState, CheckpointTooLarge).

    A state past ``_statelog.INLINE_MAX`` goes to pieces (each its own item, under the
    2 MB limit). With a ``ttl``, a base older than half of it is rewritten rather than
    logged against (``piece_ttl``): no item may name a piece that expires before it.
    """
    run_id = check_run_id(checkpoint.run_id)
    ttl = record_ttl(run_id, ttl)
    max_age = None if ttl is None or ttl < 0 else ttl / 2
    prepared = _statelog.prepare_save(store, checkpoint, max_base_age=max_age)
    now = utcnow()
    stored = checkpoint.stored(prepared.state, prepared.state_text, "", now)
    doc_id = item_id(run_id)
    item, size = encode(stored, doc_id, prepared.state_text, ttl, prepared)
    if size > MAX_ITEM_BYTES:
        raise CheckpointTooLarge(
            f"run {run_id!r}: the checkpoint is {size:,} bytes as a Cosmos DB item, over "
            f"the {MAX_ITEM_BYTES:,}-byte limit without its state (the input or signal "
            "payloads); nothing was sent. Keep large data elsewhere (e.g. Blob Storage) "
            "and put its reference in the input",
            size,
            MAX_ITEM_BYTES,
        )
    return Plan(run_id, doc_id, item, size, prepared, now)


def saved(plan: Plan, checkpoint: Checkpoint, result: Any) -> Checkpoint:
    """The checkpoint a save stored, with the ETag the service answered."""
    etag = result.get("_etag") if isinstance(result, Mapping) else None
    if not isinstance(etag, str):
        raise StoreError(f"run {plan.run_id!r}: Cosmos DB answered the save without an _etag")
    prepared = plan.prepared
    return checkpoint.stored(
        prepared.state, prepared.state_text, etag, plan.now, prepared.bind(etag)
    )


# -- pieces: a long state's immutable parts, one item each ------------------------------


def piece_id(doc_id: str, key: str) -> str:
    """The item id of a run's piece: ``^`` + the run's item id + ``^`` + the piece key.

    A run item id longer than fits (Cosmos ids are at most 255 characters) is replaced
    by its SHA-256; the item also carries ``piece_of`` (the run's item id), which is
    what queries select by.
    """
    whole = f"{PIECE_MARK}{doc_id}{PIECE_MARK}{key}"
    if len(whole) <= 255:
        return whole
    digest = hashlib.sha256(doc_id.encode("utf-8")).hexdigest()
    return f"{PIECE_MARK}#{digest}{PIECE_MARK}{key}"


#: The head of a stream block's id (``_stream._events.HEAD``; ``_reserved``).
STREAM_PREFIX: Final = "stream:"


def record_ttl(run_id: str, ttl: int | None) -> int | None:
    """The ``ttl`` of ``run_id``'s item under the store's ``ttl`` option.

    The option retires old runs; the schedules record and the limit records are
    written only when changed (a weekly schedule, a limit set once), so with it they
    would expire and take the configuration with them. They get ``-1``: never, whatever
    the option or the container's default.
    """
    if run_id == SCHEDULES_RECORD or run_id.startswith(LIMIT_PREFIX):
        return -1
    if ttl is not None and ttl > 0 and run_id.startswith(STREAM_PREFIX):
        # A stream's block (issue 34) is written once, early: under the run's ttl it
        # would expire while its run, rewritten at every step, is still active, and the
        # stream would lose its start. It waits (-1) until the run rests, which gives
        # it the run's ttl (``CosmosStore.save``), or ``prune`` removes it with its run.
        return -1
    return ttl


def piece_ttl(ttl: int | None) -> int | None:
    """The ``ttl`` a piece gets under a run item ``ttl``: twice it (None/-1: the same).

    A save rewrites a base once it is older than half the ``ttl`` (``plan``), so every
    piece an item names outlives the item by at least half the ``ttl``, clock skew
    between writers included up to that much.
    """
    if ttl is None or ttl < 0:
        return ttl
    return ttl * 2


def piece_item(doc_id: str, piece: _statelog.Piece, ttl: int | None) -> dict[str, Any]:
    """The item holding ``piece``: its bytes as base64 text (4/3 of them, under 2 MB)."""
    item: dict[str, Any] = {
        "id": piece_id(doc_id, piece.key),
        "piece_of": doc_id,
        "key": piece.key,
        "gen": piece.gen,
        "data": base64.b64encode(piece.data).decode("ascii"),
    }
    if ttl is not None:
        item["ttl"] = ttl
    return item


def piece_data(row: Any, where: str) -> tuple[str, bytes]:
    """(key, bytes) of a piece row read back; ``CorruptCheckpoint`` if malformed."""
    try:
        key, data = row["key"], row["data"]
        if not isinstance(key, str) or not isinstance(data, str):
            raise TypeError("key or data is not text")
        return key, base64.b64decode(data, validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        ident = row.get("id") if isinstance(row, dict) else None
        raise CorruptCheckpoint(
            f"{source(ident, where)}: a malformed piece item ({type(exc).__name__}: {exc}); "
            "left untouched"
        ) from exc


def decode(
    answer: Any,
    run_id: str,
    source: str,
    store: object = None,
    pieces: dict[str, bytes] | None = None,
) -> Checkpoint:
    """Return the checkpoint an item holds, refusing one that is not ``run_id``'s.

    An item whose state is in pieces raises ``PiecesNeeded`` (its ``state_ref``), unless
    ``pieces`` holds them (then ``PiecesMissing`` if some are not there).
    """
    if not isinstance(answer, Mapping):
        raise CorruptCheckpoint(
            f"{source}: the service returned {type(answer).__name__}, not an item"
        )
    doc = dict(answer)
    check_document(doc, source)
    if doc.get("run_id") != run_id or doc.get("id") != item_id(run_id):
        raise CorruptCheckpoint(
            f"{source}: holds run {doc.get('run_id')!r} under id {doc.get('id')!r}, not "
            f"run {run_id!r}; left untouched"
        )
    etag = doc.get("_etag")
    if not isinstance(etag, str):
        raise CorruptCheckpoint(f"{source}: the service returned no _etag")
    for name in ("state", REF_KEY, *_TEXT_FIELDS):
        text = doc.get(name)
        if isinstance(text, str):  # see encode: stored as JSON text
            try:
                doc[name] = json.loads(text)
            except ValueError as exc:
                raise CorruptCheckpoint(
                    f"{source}: the {name} is not valid JSON text ({exc}); left untouched"
                ) from exc
    if pieces is not None and REF_KEY in doc:
        return _statelog.checkpoint_with_pieces(store, doc, etag, source, run_id, pieces)
    return checkpoint_from_doc(doc, etag, source)


# -- listing rows -----------------------------------------------------------------------


def _run_info(row: Any) -> RunInfo:
    """Build a ``RunInfo`` from a listing row, raising on anything malformed."""
    if not isinstance(row, dict):
        raise TypeError("the row is not an object")
    run_id, doc_id, step = row.get("run_id"), row.get("id"), row.get("step")
    if not isinstance(run_id, str) or not isinstance(doc_id, str):
        raise TypeError("no run_id or id")
    if doc_id != item_id(run_id):
        # A copy of another run's item: listing it would show that run twice.
        raise ValueError(f"holds run {run_id!r}, whose item id is {item_id(run_id)!r}")
    schema = row.get("stepstone")
    if type(schema) is not int or schema not in READABLE_SCHEMAS:
        raise ValueError(f"checkpoint schema {schema!r} is not readable")
    if type(step) is not int or step < -1:
        raise TypeError(f"step {step!r} is not an integer")
    total = row.get("total_steps")
    if total is not None and type(total) is not int:
        raise TypeError(f"total_steps {total!r} is not an integer")
    status = row.get("status")
    if status is None:
        # Written before schema 2 stored the status: derive it as a load would.
        status = run_status(step, total, row.get("failure") is not None)
    elif status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    owner = row.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise TypeError(f"owner {owner!r} is not text")
    etag = row.get("_etag")
    if not isinstance(etag, str):
        raise TypeError("no _etag")
    return RunInfo(
        run_id,
        cast(RunStatus, status),
        step,
        total,
        _parse_time(row.get("updated_at")),
        version=etag,
        owner=owner,
        due_at=_parse_time(row.get("due_at")),
        # Read by the listing's page only; anything but text is shown as nothing.
        workflow=_text(row.get("workflow")),
        workflow_version=_text(row.get("workflow_version")),
        waiting_for=_text(row.get("waiting_for")),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def source(doc_id: object, where: str) -> str:
    """Name an item in a message: its id and the ``DATABASE/CONTAINER`` it is in."""
    return f"cosmos item {doc_id!r} in {where}"


def infos(rows: Iterable[Any], where: str) -> list[RunInfo]:
    """Return listing rows as ``RunInfo``; log and skip a malformed one."""
    found: list[RunInfo] = []
    for row in rows:
        try:
            found.append(_run_info(row))
        except (KeyError, TypeError, ValueError) as exc:
            ident = row.get("id") if isinstance(row, dict) else None
            logger.warning("skipping %s in listing: %s", source(ident, where), exc)
    return found


_FAR_PAST: Final = datetime(1, 1, 1, tzinfo=UTC)


def _due_key(info: RunInfo) -> datetime:
    return info.due_at or _FAR_PAST


def claimed(rows: list[Any], limit: int, where: str) -> list[RunInfo]:
    """Merge the three ``claimable`` answers (running, queued, waiting): running first."""
    running, queued, waiting = (infos(answer, where) for answer in rows)
    # Each list came back in due_at order; merge the two due kinds by it.
    due = sorted(queued + waiting, key=_due_key)
    return running[:limit] + due[:limit]


def claim_queries(
    now: datetime, limit: int, status: RunStatus | None = None, skip: int = 0
) -> list[Query]:
    """The three ``claimable`` queries with their parameters, running first.

    With ``status``, the one query of that kind, for the first ``skip + limit`` runs: the
    caller drops ``skip`` of them. (``OFFSET ... LIMIT`` would cost the same request
    units, the skipped items being read either way, and not every emulator parses it.)
    """
    if type(limit) is not int or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    check_page(status, skip)
    at = sortable_time(now)
    if status is not None:
        page: list[dict[str, Any]] = [
            {"name": "@limit", "value": skip + limit},
            {"name": "@status", "value": status},
        ]
        if status == "running":
            return [(CLAIM_RUNNING, page)]
        return [(CLAIM_DUE, [*page, {"name": "@now", "value": at}])]
    queries: list[Query] = [
        (
            CLAIM_RUNNING,
            [{"name": "@limit", "value": limit}, {"name": "@status", "value": "running"}],
        )
    ]
    for kind in ACTIVE_STATUSES:
        if kind != "running":
            params: list[dict[str, Any]] = [
                {"name": "@limit", "value": limit},
                {"name": "@status", "value": kind},
                {"name": "@now", "value": at},
            ]
            queries.append((CLAIM_DUE, params))
    return queries


def page_query(
    status: str | None, prefix: str, after: tuple[str, str] | None, limit: int
) -> tuple[str, list[dict[str, Any]]]:
    """Return the query of one listing page and its parameters.

    ``after`` is the stored (updated_at, run_id) text of the last row already read.
    """
    where: list[str] = []
    params: list[dict[str, Any]] = [{"name": "@limit", "value": limit}]
    if status is not None:
        where.append("c.status = @status")
        params.append({"name": "@status", "value": status})
    if prefix:
        where.append("STARTSWITH(c.run_id, @prefix)")
        params.append({"name": "@prefix", "value": prefix})
    if after is not None:
        where.append("(c.updated_at < @at OR (c.updated_at = @at AND c.run_id < @after))")
        params += [{"name": "@at", "value": after[0]}, {"name": "@after", "value": after[1]}]
    if status is None:
        where.append(NOT_PIECE)
    query = f"SELECT TOP @limit {_PAGE_FIELDS} FROM c"
    if where:
        query += " WHERE " + " AND ".join(where)
    order = _PAGE_ORDER if status is None else _PAGE_ORDER_STATUS
    return f"{query} {order}", params
