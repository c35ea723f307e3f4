"""Keys and encoding of the LangGraph saver's records (the layout the package docstring draws).

Keys percent-encode thread ids, namespaces and checkpoint ids; channel values and writes
go through the saver's ``serde`` into JSON strings; metadata stays plain JSON when it is.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import quote, unquote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
from langgraph.checkpoint.base import (
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint
from ..._errors import ConfigError, CorruptCheckpoint, safe_text
from ..._statejson import is_json
from ._errors import UnsafeCheckpoint


def stdlib_b64_text(data: bytes) -> str:
    """``data`` as base64 text by the standard library (the fallback, and the reference)."""
    return base64.b64encode(data).decode("ascii")


def stdlib_b64_bytes(text: str) -> bytes:
    """The bytes of base64 ``text`` by the standard library (the fallback, the reference)."""
    return base64.b64decode(text)


b64_text: Callable[[bytes], str] = stdlib_b64_text
b64_bytes: Callable[[str], bytes] = stdlib_b64_bytes
try:
    # SIMD base64 (the langgraph extra installs it): the standard library's encoder and
    # its decode to str were a fifth of a checkpoint's instructions on SQLite (issue 36).
    # Same alphabet, same padding, same text: records either writes, the other reads.
    import pybase64
except ImportError:  # pragma: no cover - without the extra's pybase64
    pass
else:
    b64_text = pybase64.b64encode_as_string
    b64_bytes = pybase64.b64decode


def _shown(value: object) -> str:
    """What a stored value is, for an error message: its shape, never its content (a
    channel's value may hold what its graph was told in confidence)."""
    if isinstance(value, list):
        kinds = ", ".join(type(item).__name__ for item in value[:4])
        return f"a list of {len(value)} ({kinds}{', ...' if len(value) > 4 else ''})"
    return f"a {type(value).__name__}"


#: The ``workflow`` name every record of this adapter carries (CLI and dashboard).
WORKFLOW = "langgraph"


#: What ``quote(part, safe="")`` leaves as it is: ASCII letters, digits and ``_.-~``.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch


def q(part: str) -> str:
    """Percent-encode one segment of a key."""
    # Most segments (checkpoint ids are uuids, thread ids often are) need no encoding:
    # one C match instead of quote's encode and scan, with the same answer.
    if _UNRESERVED(part) is not None:
        return part
    return quote(part, safe="")


class AddressedId(str):
    """A checkpoint id its reader asked for by id, or found in a listing or as a parent.

    The saver hands ids out in this form from ``get_tuple(config with checkpoint_id)``,
    from ``list`` and in every ``parent_config``; LangGraph copies the value into the
    config of the ``put`` that descends from it, so the saver sees what the writer read:
    a descendant of an addressed checkpoint may branch (time travel, forks, subgraph
    replay), one of a plain id (the latest, or a ``put``'s answer) must extend the head.
    It is an ordinary ``str`` everywhere else (equality, hashing, repr, JSON).
    """

    __slots__ = ()

    # Compared with another str subclass, that one decides, as it would against a plain
    # str (a test's "any string" matcher, say); str's own rule would ask this class.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, str) and type(other) not in (str, AddressedId):
            return NotImplemented
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if isinstance(other, str) and type(other) not in (str, AddressedId):
            return NotImplemented
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def kind_of(record: Checkpoint | None, kind: str) -> dict[str, Any] | None:
    """The record's state if it is one of ours of ``kind``, else None."""
    if record is None or record.state.get("kind") != kind:
        return None
    return record.state


class Codec:
    """The saver's keys and encodings; ``StepstoneSaver`` sets the attributes."""

    prefix: str
    serde: SerializerProtocol
    allow_pickle: bool

    def _ns_key(self, thread_id: str, ns: str) -> str:
        if not isinstance(thread_id, str) or not thread_id:
            raise ConfigError(f"configurable.thread_id must be a non-empty str, got {thread_id!r}")
        key = f"{self.prefix}/{q(thread_id)}/{q(ns)}"
        # Room for "/{checkpoint_id}/writes" (a uuid is 36 characters).
        if len(key) > MAX_RUN_ID_LENGTH - 60:
            raise ConfigError(
                f"thread_id and checkpoint_ns are too long to store ({len(key)} characters "
                f"once encoded; at most {MAX_RUN_ID_LENGTH - 60} with the prefix)"
            )
        return key

    def _cp_key(self, thread_id: str, ns: str, checkpoint_id: str) -> str:
        return f"{self._ns_key(thread_id, ns)}/{q(checkpoint_id)}"

    def _parse(self, key: str) -> tuple[str, str, str | None, bool] | None:
        """``(thread_id, ns, checkpoint_id or None for a head, is_writes)`` of a key."""
        parts = key.split("/")
        if len(parts) < 3 or parts[0] != self.prefix:
            return None
        thread_id, ns = unquote(parts[1]), unquote(parts[2])
        if len(parts) == 3:
            return thread_id, ns, None, False
        if len(parts) == 4:
            return thread_id, ns, unquote(parts[3]), False
        if len(parts) == 5 and parts[4] == "writes":
            return thread_id, ns, unquote(parts[3]), True
        return None

    def _dump(self, value: Any, where: str) -> list[str]:
        type_, data = self.serde.dumps_typed(value)
        if type_ == "pickle" and not self.allow_pickle:
            raise UnsafeCheckpoint(
                f"{where}: the serializer produced pickle; pass allow_pickle=True to "
                "StepstoneSaver to store pickled values, or store msgpack-serializable ones"
            )
        # Bytes as base64: ASCII, so the store's JSON encoder and its UTF-8 encoding
        # copy it without transcoding. (The previous release also wrote "text", one
        # character per byte, which is not ASCII and cost three conversions a save;
        # _undump still reads it.)
        return [type_, "b64", b64_text(data)]

    def _undump(self, packed: list[str], where: str) -> Any:
        # A record edited or damaged outside the saver gets an error that names the
        # value and what a stored value is, never a bare unpacking or base64 error.
        if (
            not isinstance(packed, list)
            or len(packed) != 3
            or not all(isinstance(part, str) for part in packed)
            or packed[1] not in ("b64", "text")
        ):
            raise CorruptCheckpoint(
                f"{where}: stored as {_shown(packed)}, which is not a serialized value "
                '(a list [type, "b64" or "text", data] of three strings); left untouched'
            )
        type_, encoding, data = packed
        if type_ == "pickle" and not self.allow_pickle:
            raise UnsafeCheckpoint(
                f"{where} is stored as pickle, which runs code when loaded; refused. "
                "Pass allow_pickle=True to StepstoneSaver only if nobody else can write "
                "to the store"
            )
        try:
            raw = data.encode("latin-1") if encoding == "text" else b64_bytes(data)
        except ValueError as exc:  # binascii.Error, UnicodeEncodeError, non-ASCII text
            raise CorruptCheckpoint(
                f"{where}: its stored data is not valid {encoding} ({safe_text(exc, 200)}); "
                "left untouched"
            ) from None
        return self.serde.loads_typed((type_, raw))

    def _pack(self, value: Any, where: str) -> dict[str, Any]:
        # Plain JSON stays readable in the store (operators filter and read metadata);
        # anything else goes through the serializer, so nothing is lost.
        if isinstance(value, dict) and is_json(value):
            return {"json": value}
        return {"serde": self._dump(value, where)}

    def _unpack(self, packed: dict[str, Any], where: str) -> Any:
        if "json" in packed:
            return packed["json"]
        return self._undump(packed["serde"], where)

    def _record(self, key: str, state: dict[str, Any], version: str | None) -> Checkpoint:
        # total_steps=0 with no step completed: status "done", never claimed by a worker.
        return Checkpoint(
            run_id=key, state=state, version=version, total_steps=0, workflow=WORKFLOW
        )

    def _config(self, thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
        # checkpoint_id may be an AddressedId: kept as given, it is the writer's read.
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def _tuple(
        self, record: dict[str, Any], writes: dict[str, Any] | None, *, latest: bool = False
    ) -> CheckpointTuple:
        """The tuple of a stored checkpoint; ``latest``: read as the namespace's head."""
        thread_id, ns, cp_id = record["thread_id"], record["checkpoint_ns"], record["id"]
        where = f"checkpoint {cp_id!r} of thread {thread_id!r}"
        checkpoint = cast(dict[str, Any], self._unpack(record["checkpoint"], where))
        checkpoint["channel_values"] = {
            channel: self._undump(packed, f"{where}, channel {channel!r}")
            for channel, packed in record["values"].items()
        }
        parent = record.get("parent")
        return CheckpointTuple(
            config=self._config(thread_id, ns, cp_id if latest else AddressedId(cp_id)),
            checkpoint=cast(LGCheckpoint, checkpoint),
            metadata=cast(CheckpointMetadata, self._unpack(record["metadata"], where)),
            parent_config=self._config(thread_id, ns, AddressedId(parent)) if parent else None,
            pending_writes=self._pending(writes, where),
        )

    def _pending(self, writes: dict[str, Any] | None, where: str) -> list[PendingWrite]:
        if writes is None:
            return []
        entries = sorted(
            writes["writes"].values(),
            key=lambda e: writes_sort_key(e["task_path"], e["task_id"], e["idx"]),
        )
        return [
            (
                e["task_id"],
                e["channel"],
                self._undump(e["value"], f"{where}, write to {e['channel']!r}"),
            )
            for e in entries
        ]
