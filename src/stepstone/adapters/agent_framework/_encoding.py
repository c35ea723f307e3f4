"""Checkpoints as JSON: every value tagged by type where it is not JSON (see ``_values``)."""

from __future__ import annotations

from typing import Any

from agent_framework import WorkflowCheckpoint, WorkflowMessage

from ..._checkpoint import find_non_json
from ..._errors import (
    ConfigError,
    InvalidState,
)
from ._values import (
    TYPE_KEY,
    VALUE_TAG,
    Refused,
    Types,
    from_json,
    item,
    item_json,
    message,
    message_json,
    to_json,
)

__all__ = ["TYPE_KEY", "Types", "decode_json", "encode_json", "maf_codec"]


def _str_dict(value: object) -> bool:
    return type(value) is dict and all(type(k) is str for k in value) and TYPE_KEY not in value


def _messages_json(value: Any, path: str, types: Types) -> Any:
    """``{source: [WorkflowMessage, ...]}`` in the layout stored since the first release;
    anything else there (a plain dict, a tuple) as a tagged value that loads back as itself."""
    if not (_str_dict(value) and all(type(b) is list for b in value.values())):
        return {TYPE_KEY: VALUE_TAG, "value": to_json(value, path, types)}
    return {
        source: [
            message_json(m, f"{path}[{source!r}][{i}]", types)
            if type(m) is WorkflowMessage
            else {TYPE_KEY: VALUE_TAG, "value": to_json(m, f"{path}[{source!r}][{i}]", types)}
            for i, m in enumerate(batch)
        ]
        for source, batch in value.items()
    }


def _messages(value: Any, types: Types) -> Any:
    if not isinstance(value, dict):
        return value
    if TYPE_KEY in value:
        return from_json(value, types)
    return {
        source: [
            from_json(m, types) if m.get(TYPE_KEY) == VALUE_TAG else message(m, types)
            for m in batch
        ]
        for source, batch in value.items()
    }


def _pending_json(value: Any, path: str, types: Types) -> Any:
    if not _str_dict(value):
        return {TYPE_KEY: VALUE_TAG, "value": to_json(value, path, types)}
    return {k: item_json(v, f"{path}[{k!r}]", types) for k, v in value.items()}


def _pending(value: Any, types: Types) -> Any:
    if not isinstance(value, dict):
        return value
    if TYPE_KEY in value:
        return from_json(value, types)
    return {k: item(v, types) for k, v in value.items()}


def encode_json(checkpoint: WorkflowCheckpoint, types: Types | None = None) -> dict[str, Any]:
    """Return the checkpoint as plain JSON values, or raise ``InvalidState`` naming the path."""
    types = types or Types()
    fields = checkpoint.to_dict()
    try:
        encoded: dict[str, Any] = {}
        for name, value in fields.items():
            path = f"checkpoint[{name!r}]"
            if name == "messages":
                encoded[name] = _messages_json(value, path, types)
            elif name == "pending_request_info_events":
                encoded[name] = _pending_json(value, path, types)
            else:
                encoded[name] = to_json(value, path, types)
        found = find_non_json(encoded, "checkpoint")
    except Refused as exc:
        found = (exc.path, exc.reason)
    except RecursionError:
        found = ("checkpoint", "it is nested too deeply to encode")
    if found is not None:
        path, reason = found
        raise InvalidState(
            f"MAF checkpoint {checkpoint.checkpoint_id!r}: {path}: {reason}. stepstone "
            "stores checkpoints as JSON: JSON values, the standard value types (tuple, "
            "set, bytes, datetime, UUID, Decimal, ...), Agent Framework's own types, and "
            "types declared in allowed_checkpoint_types. Or opt in to Agent Framework's "
            "pickle encoding with StepstoneCheckpointStorage(..., encoding='maf')",
            path,
        )
    return encoded


def decode_json(fields: dict[str, Any], types: Types | None = None) -> WorkflowCheckpoint:
    """Rebuild the checkpoint ``encode_json`` wrote (and any this adapter ever stored)."""
    types = types or Types()
    decoded = {
        name: from_json(value, types)
        for name, value in fields.items()
        if name not in ("messages", "pending_request_info_events")
    }
    decoded["messages"] = _messages(fields.get("messages", {}), types)
    decoded["pending_request_info_events"] = _pending(
        fields.get("pending_request_info_events", {}), types
    )
    return WorkflowCheckpoint.from_dict(decoded)


def maf_codec() -> Any:
    """Return MAF's checkpoint encoding module (pickle to base64 for non-JSON values).

    MAF exports no public name for it; its own Cosmos storage imports the same module.
    Imported only for ``encoding="maf"``, so the default path depends on public API only.
    """
    try:
        from agent_framework._workflows import _checkpoint_encoding  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - a MAF release that moved it
        raise ConfigError(
            "encoding='maf' needs agent_framework._workflows._checkpoint_encoding, which "
            "this agent-framework-core release does not have; use encoding='json'"
        ) from exc
    return _checkpoint_encoding
