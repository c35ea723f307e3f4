"""JSON encoding of states and checkpoint documents, shared by every backend.

One document layout for every store keeps migration between stores a copy, and the
``stepstone`` key (the schema version) marks a document as ours, so a foreign or
newer file is refused instead of misread.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ._checkpoint import (
    READABLE_SCHEMAS,
    SCHEMA_PIECES,
    SCHEMA_VERSION,
    Checkpoint,
    Failure,
    Signal,
    Stored,
)
from ._errors import CorruptCheckpoint
from ._statejson import (
    MAX_DEPTH,
    _dumps,
    _loads,
    copy_containers,
    decode_json,
    dump_json,
    encode_state,
    orjson_module,
)

__all__ = [
    "MAX_DEPTH",
    "REF_KEY",
    "PiecesNeeded",
    "check_document",
    "copy_containers",
    "checkpoint_from_doc",
    "checkpoint_meta",
    "decode_document",
    "decode_json",
    "dump_json",
    "encode_document",
    "encode_state",
    "format_created",
    "pristine",
]

#: The document's key naming a state kept in pieces (schema 3), instead of ``state``.
REF_KEY = "state_ref"


class PiecesNeeded(Exception):
    """The document keeps its state in pieces: the store must fetch them (``_statelog``).

    Internal: raised by ``checkpoint_from_doc`` when it is not handed the state, so a
    load path that forgets the pieces fails loudly instead of returning an empty state.
    """

    def __init__(self, ref: Any) -> None:
        super().__init__("the state is kept in pieces")
        self.ref = ref


_UNSET: Any = object()


def pristine(cp: Checkpoint) -> dict[str, Any]:
    """Return a fresh copy of the checkpoint's state that no step has touched."""
    if cp.state_json is not None:
        loaded: dict[str, Any] = _loads(cp.state_json)
        return loaded
    stored = cp.stored_state
    if stored is not None and stored.private is not None and stored.version == cp.version:
        # A long state: its store's private copy is what is stored (``cp.state`` is the
        # working copy a failed step may have changed in place).
        copy: dict[str, Any] = copy_containers(stored.private)
        return copy
    return encode_state(cp.state)[1]


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


#: The last ``created_at`` formatted and its text. A run's saves carry the same
#: ``created_at`` object from save to save, and ``isoformat`` is a tenth of a save's
#: instructions; one entry (replaced whole, so threads never see a torn pair) is enough.
_last_created: tuple[datetime | None, str | None] = (None, None)


def format_created(value: datetime | None) -> str | None:
    """Return ``value.isoformat()`` (None for None), remembering the last one formatted."""
    global _last_created  # noqa: PLW0603 - a one-entry cache
    last = _last_created
    if last[0] is value:
        return last[1]
    text = None if value is None else value.isoformat()
    _last_created = (value, text)
    return text


def checkpoint_meta(
    cp: Checkpoint, created_at: str | None = _UNSET, updated_at: str | None = _UNSET
) -> dict[str, Any]:
    """Return the document fields of ``cp`` other than its state, in stored order.

    ``created_at`` / ``updated_at``: the ``isoformat`` of those fields when the caller
    has formatted them already (a store that also writes them to columns).
    """
    failure = cp.failure
    if updated_at is _UNSET:
        updated_at = _time(cp.updated_at)
    if created_at is _UNSET:
        # A run's first save (and every save of a checkpoint built without one) sets
        # both times to one object: formatted once (``isoformat`` is ~12,000
        # instructions), as the SQL stores already do for their columns.
        created_at = updated_at if cp.created_at is cp.updated_at else format_created(cp.created_at)
    meta = {
        "stepstone": SCHEMA_VERSION,
        "run_id": cp.run_id,
        "step": cp.step,
        "step_names": list(cp.step_names),
        "total_steps": cp.total_steps,
        "attempt": cp.attempt,
        "failure": None
        if failure is None
        else {
            "step_index": failure.step_index,
            "step_name": failure.step_name,
            "error_type": failure.error_type,
            "message": failure.message,
            "attempt": failure.attempt,
            "at": failure.at.isoformat(),
        },
        "created_at": created_at,
        "updated_at": updated_at,
    }
    _add_runtime_meta(cp, meta)
    return meta


# One flat test per field, on purpose: this runs on every save (and the next on every
# load), where splitting it in two costs a call each time.
def _add_runtime_meta(cp: Checkpoint, meta: dict[str, Any]) -> None:  # noqa: C901 - see above
    """Add the schema-2 fields that differ from their defaults (most runs use none)."""
    if cp.input is not None:
        meta["input"] = cp.input
    if cp.workflow is not None:
        meta["workflow"] = cp.workflow
    if cp.workflow_version is not None:
        meta["workflow_version"] = cp.workflow_version
    if cp.queued:
        meta["queued"] = True
    if cp.cancelled:
        meta["cancelled"] = True
    if cp.cancel_requested:
        meta["cancel_requested"] = True
    if cp.history:
        meta["history"] = True
    if cp.owner is not None:
        meta["owner"] = cp.owner
    if cp.epoch:
        meta["epoch"] = cp.epoch
    if cp.lease is not None:
        meta["lease"] = cp.lease
    if cp.renewed_at is not None:
        meta["renewed_at"] = cp.renewed_at.isoformat()
    if cp.waiting_for is not None:
        meta["waiting_for"] = cp.waiting_for
    if cp.wake_at is not None:
        meta["wake_at"] = cp.wake_at.isoformat()
    if cp.signals:
        meta["signals"] = [
            {"name": s.name, "id": s.id, "payload": s.payload, "at": s.at.isoformat()}
            for s in cp.signals
        ]
    if cp.consumed:
        meta["consumed"] = dict(cp.consumed)
    if cp.parent is not None:
        meta["parent"] = cp.parent
    if cp.children:
        meta["children"] = list(cp.children)
    if cp.streams:  # streams (issue 34): absent unless a committing attempt emitted
        meta["streams"] = dict(cp.streams)
    if cp.timing:  # issue 33: absent on every run without a deadline
        meta["timing"] = cp.timing
    if cp.flow is not None:  # flow control (issue 37); older documents have none
        meta["flow"] = cp.flow


def _meta_json(cp: Checkpoint, meta: dict[str, Any]) -> str:
    """Return ``meta`` as the standard library's JSON text, with orjson where it is equal.

    orjson writes the same bytes as ``_dumps`` for str, int, bool, None, lists and
    dicts of them, and for floats from 1e-4 to 1e16 (the lease); it raises on what the
    standard library would write differently or refuse only partly (lone surrogates,
    integers over 64 bits), which then goes the standard way. Payloads a caller put in
    the checkpoint (``input``, signal payloads) may hold any float or a NaN, which
    orjson would write as null where ``_dumps`` refuses: those go the standard way (an
    input only if it holds more than ``_written_alike`` allows).
    """
    lease = cp.lease
    if (
        orjson_module() is not None
        and (cp.input is None or _written_alike(cp.input, 0))
        and cp.flow is None  # flow control's limits may hold any float: the standard way
        and not cp.signals
        and (lease is None or (type(lease) is float and 1e-4 <= lease < 1e16))
    ):
        return _standard_text(meta)
    return _dumps(meta)


def _standard_text(value: Any) -> str:
    """``_dumps(value)``'s text, written by orjson where it is installed.

    Only for a value its caller knows orjson writes as ``_dumps`` does (``_meta_json``'s
    rule); where orjson raises, the standard library writes it.
    """
    module = orjson_module()
    if module is not None:
        try:
            text: str = module.dumps(value).decode("utf-8")
        except (TypeError, ValueError):
            pass
        else:
            return text
    return _dumps(value)


_ALIKE_SCALARS = frozenset((str, int, bool, type(None)))


def _written_alike(value: Any, level: int) -> bool:
    """True if orjson writes ``value`` as ``_dumps`` does, or raises (then the standard way).

    Exactly dicts with str keys, lists, and str, int, bool or None: no float (its text
    may differ; NaN orjson writes as null), nothing orjson writes and the standard
    library refuses (a datetime, a dataclass); an int past 64 bits makes orjson raise.
    Most inputs are that, and the document of a long run then costs orjson's time for
    its ``step_names``, which grow with every step (issue 36), not the encoder's.
    """
    kind = type(value)
    if kind in _ALIKE_SCALARS:
        return True
    if level >= 64:  # deeper (or a cycle): the standard way decides
        return False
    if kind is dict:
        return all(
            type(key) is str and _written_alike(item, level + 1) for key, item in value.items()
        )
    if kind is list:
        return all(_written_alike(item, level + 1) for item in value)
    return False


def encode_document(
    cp: Checkpoint,
    state_text: str | None,
    extra: dict[str, Any] | None = None,
    *,
    created_at: str | None = _UNSET,
    updated_at: str | None = _UNSET,
    ref: dict[str, Any] | None = None,
    gen: int = 0,
    history_head: str | None = None,
    inc: str | None = None,
) -> str:
    """Return the stored JSON document for ``cp``: a line of metadata, then a line of state.

    ``state_text`` is the already validated JSON of ``cp.state``; splicing it in avoids
    encoding the state twice on the save path. Two lines keep the document readable with
    ``head`` and cheap to write (``stepstone runs show`` pretty-prints it).
    ``created_at`` / ``updated_at``: those fields already formatted (``isoformat``), for
    a store that formats them for its columns too.
    """
    meta = checkpoint_meta(cp, created_at, updated_at)
    if extra:
        meta.update(extra)
    if ref is not None:
        # The state lives in pieces (``_statelog``): the document names them instead.
        meta["stepstone"] = SCHEMA_PIECES
        # A ref holds ints, ASCII piece keys and the base's time (seconds, ~1e9): text
        # orjson writes as the standard library does, which cost 24,000 instructions a
        # save here, on every save of a run whose state is in pieces (issue 36).
        return f'{_meta_json(cp, meta)[:-1]},\n"{REF_KEY}":{_standard_text(ref)}}}\n'
    if gen:
        meta["state_gen"] = gen
        if inc is not None:
            meta["state_inc"] = inc
    if history_head is not None:
        meta["history_head"] = history_head
    return f'{_meta_json(cp, meta)[:-1]},\n"state":{state_text}}}\n'


def decode_document(data: bytes | str, source: str) -> dict[str, Any]:
    """Parse a stored document; raise ``CorruptCheckpoint`` naming ``source`` if not ours."""
    try:
        doc = _loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpoint(
            f"{source}: not a stepstone checkpoint (invalid JSON: {exc}); left untouched"
        ) from exc
    return check_document(doc, source)


def check_document(doc: object, source: str) -> dict[str, Any]:
    """Return ``doc`` if it is a stepstone document of our schema, else ``CorruptCheckpoint``.

    For backends whose driver hands back parsed JSON (Cosmos DB) as well as for
    ``decode_document``.
    """
    if not isinstance(doc, dict) or "stepstone" not in doc:
        raise CorruptCheckpoint(
            f"{source}: not a stepstone checkpoint (no 'stepstone' schema key); left untouched"
        )
    schema = doc["stepstone"]
    if type(schema) is not int or schema not in READABLE_SCHEMAS:
        raise CorruptCheckpoint(
            f"{source}: checkpoint schema {schema!r} is not supported by this stepstone "
            f"(reads schema {SCHEMA_VERSION}); upgrade stepstone to read it"
        )
    return doc


def _parse_time(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


_FLAGS = ("queued", "cancelled", "cancel_requested", "history")


def _runtime_fields(doc: dict[str, Any]) -> dict[str, Any]:  # noqa: C901 - see above
    """Return the schema-2 fields of ``doc`` as ``Checkpoint`` arguments, type-checked."""
    fields: dict[str, Any] = {}
    value = doc.get("input")
    if value is not None:
        if not isinstance(value, dict):
            raise TypeError("input is not an object")
        fields["input"] = value
    for name in ("workflow", "workflow_version", "owner", "waiting_for", "parent"):
        value = doc.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(f"{name} is not a string")
            fields[name] = value
    for name in _FLAGS:
        value = doc.get(name, False)
        if type(value) is not bool:
            raise TypeError(f"{name} is not a boolean")
        if value:
            fields[name] = True
    epoch = doc.get("epoch", 0)
    if type(epoch) is not int or epoch < 0:
        raise TypeError("epoch is not a non-negative integer")
    fields["epoch"] = epoch
    lease = doc.get("lease")
    if lease is not None:
        if type(lease) not in (int, float) or lease <= 0:
            raise TypeError("lease is not a positive number")
        fields["lease"] = float(lease)
    for name in ("renewed_at", "wake_at"):
        value = doc.get(name)
        if value is not None:
            fields[name] = _aware(datetime.fromisoformat(value))
    signals = doc.get("signals")
    if signals:
        fields["signals"] = tuple(
            Signal(
                name=_str(item["name"]),
                id=_str(item["id"]),
                payload=item["payload"],
                at=_aware(datetime.fromisoformat(item["at"])),
            )
            for item in signals
        )
    timing = doc.get("timing")
    if timing is not None:  # issue 33; documents of earlier releases have none
        if not isinstance(timing, dict):
            raise TypeError("timing is not an object")
        fields["timing"] = timing
    children = doc.get("children")
    if children:
        if not isinstance(children, list):
            raise TypeError("children is not a list")
        for child in children:  # a plain loop: a Map's parent lists thousands
            if type(child) is not str:
                raise TypeError(f"{child!r} is not a string")
        fields["children"] = tuple(children)
    consumed = doc.get("consumed")
    if consumed:
        if not isinstance(consumed, dict) or not all(
            type(n) is int and n >= 0 for n in consumed.values()
        ):
            raise TypeError("consumed is not an object of counts")
        fields["consumed"] = dict(consumed)
    streams = doc.get("streams")  # streams (issue 34); absent in older documents
    if streams:
        if not isinstance(streams, dict) or not all(isinstance(t, str) for t in streams.values()):
            raise TypeError("streams is not an object of attempt tokens")
        fields["streams"] = dict(streams)
    flow = doc.get("flow")  # flow control (issue 37)
    if flow is not None:
        if not isinstance(flow, dict):
            raise TypeError("flow is not an object")
        fields["flow"] = flow
    return fields


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"timestamp {value.isoformat()} has no time zone")
    return value


def checkpoint_from_doc(
    doc: dict[str, Any],
    version: str | None,
    source: str,
    run_id: str | None = None,
    *,
    state: dict[str, Any] | None = None,
    stored: Stored | None = None,
) -> Checkpoint:
    """Build a ``Checkpoint`` from a decoded document; ``CorruptCheckpoint`` if malformed.

    With ``run_id``, also refuse a document that belongs to another run: an encoding bug
    or a hand-copied file must not hand one run's state to another.

    A document whose state is kept in pieces raises ``PiecesNeeded`` unless ``state``
    (assembled by ``_statelog.checkpoint_with_pieces``) is given.
    """
    if run_id is not None and doc.get("run_id") != run_id:
        raise CorruptCheckpoint(
            f"{source}: holds run {doc.get('run_id')!r}, not {run_id!r}; left untouched"
        )
    try:
        failure = doc.get("failure")
        if state is None:
            if REF_KEY in doc:
                raise PiecesNeeded(doc[REF_KEY])
            state = doc["state"]
            gen = doc.get("state_gen")
            if gen is not None and stored is None:
                if type(gen) is not int or gen < 0:
                    raise TypeError("state_gen is not a non-negative integer")
                head = doc.get("history_head")
                if head is not None and not isinstance(head, str):
                    raise TypeError("history_head is not a string")
                inc = doc.get("state_inc")
                if inc is not None and not isinstance(inc, str):
                    raise TypeError("state_inc is not a string")
                stored = Stored(0, doc["run_id"], version, gen, None, None, None, head, None, inc)
        step = doc["step"]
        names = doc["step_names"]
        if (
            not isinstance(state, dict)
            or type(step) is not int
            or not isinstance(names, list)
            or len(names) != step + 1
        ):
            raise TypeError("state, step or step_names have the wrong shape")
        return Checkpoint(
            run_id=doc["run_id"],
            step=step,
            state=state,
            version=version,
            step_names=tuple(names),
            total_steps=doc.get("total_steps"),
            attempt=doc.get("attempt", 0),
            failure=None
            if failure is None
            else Failure(
                step_index=failure["step_index"],
                step_name=failure["step_name"],
                error_type=failure["error_type"],
                message=failure["message"],
                attempt=failure["attempt"],
                at=datetime.fromisoformat(failure["at"]),
            ),
            created_at=_parse_time(doc.get("created_at")),
            updated_at=_parse_time(doc.get("updated_at")),
            stored_state=stored,
            **_runtime_fields(doc),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpoint(
            f"{source}: malformed stepstone checkpoint ({type(exc).__name__}: {exc}); "
            "left untouched"
        ) from exc
