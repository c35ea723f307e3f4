"""Checkpoints as JSON: Agent Framework's own types tagged by name, everything else JSON."""

from __future__ import annotations

import dataclasses
import enum
import importlib
from typing import Any, Final

from agent_framework import WorkflowCheckpoint, WorkflowEvent, WorkflowMessage

from ..._checkpoint import find_non_json
from ..._errors import (
    ConfigError,
    InvalidState,
)

# Agent Framework's own value types (chat ``Message``s, ``AgentExecutorResponse``, its
# enums) are stored as JSON under this key, naming the type; only types defined in these
# packages are ever rebuilt from a stored name, so stored data cannot pick the code run.
TYPE_KEY: Final = "__stepstone_maf_type__"
_FRAMEWORK_MODULES: Final = ("agent_framework.", "agent_framework_")


def _framework_type(cls: type) -> str | None:
    """Return ``module:qualname`` of a type from Agent Framework's packages, else None."""
    module = cls.__module__
    if module == "agent_framework" or module.startswith(("agent_framework.", "agent_framework_")):
        return f"{module}:{cls.__qualname__}"
    return None


def _to_json(value: Any, path: str) -> Any:
    """Return ``value`` with Agent Framework's types as tagged JSON; leave anything else.

    What is left that is not JSON is named by ``find_non_json`` afterwards.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, enum.Enum) and (key := _framework_type(type(value))) is not None:
        # Before the str/int test: a framework ``str`` enum must come back as itself.
        return {TYPE_KEY: key, "value": _to_json(value.value, f"{path}['value']")}
    if isinstance(value, (str, int, float)):
        return value
    if type(value) is dict:
        if TYPE_KEY in value:
            raise InvalidState(
                f"{path}: the key {TYPE_KEY!r} is reserved for stepstone's encoding of "
                "Agent Framework types; rename it",
                f"{path}[{TYPE_KEY!r}]",
            )
        return {k: _to_json(v, f"{path}[{k!r}]") for k, v in value.items()}
    if type(value) is list:
        return [_to_json(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, WorkflowMessage):
        fields = value.to_dict()
        fields["data"] = _to_json(fields["data"], f"{path}['data']")
        event = fields["original_request_info_event"]
        fields["original_request_info_event"] = _event_json(
            event, f"{path}['original_request_info_event']"
        )
        return fields
    key = _framework_type(type(value))
    if key is None:
        return value
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and callable(getattr(type(value), "from_dict", None)):
        # MAF's SerializationMixin: the type's own JSON form (it leaves out raw provider
        # payloads, ``raw_representation``, which pickling would have kept).
        return {TYPE_KEY: key, "value": _to_json(to_dict(), f"{path}['value']")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            TYPE_KEY: key,
            "fields": {
                f.name: _to_json(getattr(value, f.name), f"{path}.{f.name}")
                for f in dataclasses.fields(value)
                if f.init
            },
        }
    return value


def _event_json(event: object, path: str) -> object:
    """A ``request_info`` event as MAF's own ``to_dict`` writes it (types by name)."""
    if isinstance(event, WorkflowEvent) and event.type == "request_info":
        fields = event.to_dict()
        fields["data"] = _to_json(fields["data"], f"{path}['data']")
        return fields
    return event  # anything else is left for the JSON check to name by its path


def _framework_class(key: object) -> type:
    """Return the Agent Framework type named ``module:qualname``; refuse any other."""
    if not isinstance(key, str) or ":" not in key:
        raise ValueError(f"{TYPE_KEY} is {key!r}, not 'module:qualname'")
    module_name, _, qualname = key.partition(":")
    if not (module_name == "agent_framework" or module_name.startswith(_FRAMEWORK_MODULES)):
        raise ValueError(f"{key!r} is not an Agent Framework type; refusing to build it")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type) or _framework_type(found) != key:
        raise ValueError(f"{key!r} does not name an Agent Framework type")
    return found


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    if TYPE_KEY not in value:
        return {k: _from_json(v) for k, v in value.items()}
    cls = _framework_class(value[TYPE_KEY])
    if "fields" in value:
        return cls(**{k: _from_json(v) for k, v in value["fields"].items()})
    if issubclass(cls, enum.Enum):
        return cls(_from_json(value["value"]))
    return cls.from_dict(_from_json(value["value"]))  # type: ignore[attr-defined]


def _event(fields: object) -> Any:
    # from_dict resolves the request and response types by name among the modules
    # already imported; it never imports one named by stored data.
    if not isinstance(fields, dict):
        return fields
    return WorkflowEvent.from_dict({**fields, "data": _from_json(fields.get("data"))})


def encode_json(checkpoint: WorkflowCheckpoint) -> dict[str, Any]:
    """Return the checkpoint as plain JSON values, or raise ``InvalidState`` naming the path."""
    fields = checkpoint.to_dict()
    try:
        encoded: dict[str, Any] = {}
        for name, value in fields.items():
            path = f"checkpoint[{name!r}]"
            if name == "messages" and type(value) is dict:
                encoded[name] = {
                    source: [_to_json(m, f"{path}[{source!r}][{i}]") for i, m in enumerate(batch)]
                    if type(batch) is list
                    else batch
                    for source, batch in value.items()
                }
            elif name == "pending_request_info_events" and type(value) is dict:
                encoded[name] = {k: _event_json(v, f"{path}[{k!r}]") for k, v in value.items()}
            else:
                encoded[name] = _to_json(value, path)
        found = find_non_json(encoded, "checkpoint")
    except RecursionError:
        found = ("checkpoint", "it is nested too deeply to encode")
    if found is not None:
        path, reason = found
        raise InvalidState(
            f"MAF checkpoint {checkpoint.checkpoint_id!r}: {path}: {reason}; stepstone "
            "stores checkpoints as JSON (dict with str keys, list, str, int, finite float, "
            "bool, None, and Agent Framework's own types). Make the value JSON, or opt in "
            "to Agent Framework's pickle encoding with "
            "StepstoneCheckpointStorage(..., encoding='maf')",
            path,
        )
    return encoded


def decode_json(fields: dict[str, Any]) -> WorkflowCheckpoint:
    messages: dict[str, list[WorkflowMessage]] = {}
    for source, batch in fields.get("messages", {}).items():
        messages[source] = []
        for item in batch:
            message = WorkflowMessage.from_dict({**item, "data": _from_json(item.get("data"))})
            message.original_request_info_event = _event(message.original_request_info_event)
            messages[source].append(message)
    pending = {k: _event(v) for k, v in fields.get("pending_request_info_events", {}).items()}
    return WorkflowCheckpoint.from_dict(
        {
            **fields,
            "messages": messages,
            "pending_request_info_events": pending,
            "state": _from_json(fields.get("state", {})),
            "metadata": _from_json(fields.get("metadata", {})),
        }
    )


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
