"""A Microsoft Agent Framework ``CheckpointStorage`` on any stepstone store.

Pass it where an Agent Framework (MAF) workflow takes checkpoint storage, opened from a
config string or on an open ``Store``::

    from stepstone.adapters.agent_framework import StepstoneCheckpointStorage

    storage = StepstoneCheckpointStorage("postgresql://app@db/agents")
    workflow = WorkflowBuilder(start_executor=start, checkpoint_storage=storage).build()
    ...
    latest = await storage.get_latest(workflow_name=workflow.name)
    await workflow.run(checkpoint_id=latest.checkpoint_id)  # resume after a crash

Implements MAF 1.23's ``CheckpointStorage`` protocol (async ``save``, ``load``,
``list_checkpoints``, ``delete``, ``get_latest``, ``list_checkpoint_ids``) through the
public ``Store`` API only, so every backend works unchanged, on its native async path
where it has one. What it does that MAF's own storages do not:

- **Write-once, by compare-and-swap.** A checkpoint is saved with "nothing may be stored
  yet" (``version=None``). Saving an id again with the same content is a no-op (a retry);
  with other content it raises ``ConflictError`` and stores nothing. MAF's file and
  Cosmos storages overwrite blindly, so two processes writing one id lose one silently.
- **JSON only, by default.** A checkpoint is stored as plain JSON. Agent Framework's
  own types are written in their own JSON forms: ``WorkflowMessage`` field by field,
  pending ``request_info`` events (human in the loop) as ``WorkflowEvent.to_dict`` writes
  them (request and response types by name, resolved on load only among modules already
  imported), chat ``Message``s and other ``SerializationMixin`` types by their
  ``to_dict``, its dataclasses (``AgentExecutorResponse``) field by field and its enums by
  value, each tagged ``{"__stepstone_maf_type__": "module:qualname", ...}``; a stored tag
  is only ever resolved to a type of Agent Framework's own packages. Everything else
  must already be JSON. A value that is not (your dataclass, a tuple, a datetime) is
  refused with ``InvalidState`` naming its path, e.g.
  ``checkpoint['messages']['upper'][0]['data']``. MAF's storages pickle such values
  to base64; opt in to exactly that with ``encoding="maf"``, and only then does ``load``
  ever unpickle, through MAF's restricted unpickler and ``allowed_checkpoint_types``. A
  record written with ``encoding="maf"`` is refused by a storage opened without it.

Record ids (the scheme the CLI, the dashboard and the other adapters match on): each
checkpoint is one stepstone record, so Cosmos' 2 MB item limit applies per checkpoint
(``CheckpointTooLarge`` otherwise), with no index record beside it::

    maf/<workflow name>/<checkpoint id>

each part after ``maf`` percent-encoded (``urllib.parse.quote(part, safe="")``), so the
id splits on ``/`` into exactly three parts; the same shape as the LangGraph adapter's
``langgraph/<thread>/<ns>/<checkpoint id>``. The record's ``workflow`` is ``"maf"`` (the
LangGraph adapter's is ``"langgraph"``), its ``state`` is ``{"format": "stepstone.maf/1",
"encoding": "json" | "maf", "checkpoint": {...}}``, its ``created_at`` and
``updated_at`` are the checkpoint's own ``timestamp`` (so ``stepstone runs prune
--older-than`` ages checkpoints by when MAF made them, and listings need no load), and
it is saved with status ``done`` (``total_steps=0``), so stepstone workers never claim it.

Costs: ``save`` is one conditional write. ``list_checkpoint_ids`` and ``get_latest``
read the store's run index (``list_info``: ids and times, no payloads) and load only
what they return. ``load`` and ``delete`` by checkpoint id alone read the index of ids
once, unless this storage object saved or listed that id already.

Limits: MAF's runner logs a failed checkpoint save as a warning and carries on; this
storage cannot change that, so it also logs each failure at ERROR level on the
``stepstone`` logger and keeps the last one in ``last_error``.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, Self
from urllib.parse import quote, unquote

from agent_framework import WorkflowCheckpoint, WorkflowEvent, WorkflowMessage
from agent_framework.exceptions import WorkflowCheckpointException

from .._checkpoint import Checkpoint, _keep_times, check_run_id, find_non_json
from .._errors import (
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidRunId,
    InvalidState,
    StepstoneError,
)
from .._observe import logger

if TYPE_CHECKING:
    from .._store import Store

__all__ = [
    "FORMAT",
    "PREFIX",
    "TYPE_KEY",
    "WORKFLOW",
    "AgentFrameworkCheckpointError",
    "CheckpointNotFound",
    "StepstoneCheckpointStorage",
    "parse_record_id",
    "record_id",
]

#: The first segment of the record id of every checkpoint this adapter writes.
PREFIX: Final = "maf/"
#: The ``workflow`` every record of this adapter carries (CLI and dashboard).
WORKFLOW: Final = "maf"
#: The ``format`` tag in each record's state; bumped if the layout ever changes.
FORMAT: Final = "stepstone.maf/1"

Encoding = Literal["json", "maf"]
_ENCODINGS: Final = ("json", "maf")


class AgentFrameworkCheckpointError(StepstoneError, WorkflowCheckpointException):
    """A checkpoint this storage cannot hand to MAF; also a ``WorkflowCheckpointException``.

    Raised for an id stored under several workflow names, and for a record written with
    ``encoding="maf"`` read by a storage that did not opt in to unpickling.
    """

    def __init__(self, message: str) -> None:
        # AgentFrameworkException's __init__ logs and takes extra arguments; the message
        # is all either tree needs.
        Exception.__init__(self, message)


class CheckpointNotFound(AgentFrameworkCheckpointError, LookupError):
    """No checkpoint with this id is stored (the protocol's ``WorkflowCheckpointException``)."""

    def __init__(self, checkpoint_id: str) -> None:
        super().__init__(f"No checkpoint found with ID {checkpoint_id}")
        self.checkpoint_id = checkpoint_id


def record_id(workflow_name: str, checkpoint_id: str) -> str:
    """Return the stepstone record id of a MAF checkpoint (see the module docstring)."""
    return f"{_workflow_prefix(workflow_name)}{quote(checkpoint_id, safe='')}"


def parse_record_id(run_id: str) -> tuple[str, str] | None:
    """Return ``(workflow_name, checkpoint_id)`` of a record id this adapter writes, else None."""
    parts = run_id.split("/")
    if len(parts) != 3 or f"{parts[0]}/" != PREFIX or not parts[2]:
        return None
    return unquote(parts[1]), unquote(parts[2])


def _workflow_prefix(workflow_name: str) -> str:
    return f"{PREFIX}{quote(workflow_name, safe='')}/"


def _timestamp(checkpoint: WorkflowCheckpoint) -> datetime:
    """Parse the checkpoint's ISO timestamp (naive read as UTC), or refuse it."""
    text = checkpoint.timestamp
    try:
        parsed = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise InvalidState(
            f"MAF checkpoint {checkpoint.checkpoint_id!r}: checkpoint['timestamp'] is "
            f"{text!r}; it must be an ISO 8601 timestamp, as MAF writes it "
            "(get_latest orders checkpoints by it)",
            "checkpoint['timestamp']",
        )
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


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


def _encode_json(checkpoint: WorkflowCheckpoint) -> dict[str, Any]:
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


def _decode_json(fields: dict[str, Any]) -> WorkflowCheckpoint:
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


def _maf_codec() -> Any:
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


class StepstoneCheckpointStorage:
    """An Agent Framework ``CheckpointStorage`` that keeps each checkpoint in a stepstone store.

    Args:
        store: An open ``Store`` (left open by ``close``), or a config string such as
            ``"sqlite:///agents.db"`` (opened here and closed by ``close``); None reads
            ``STEPSTONE_STORE``, as ``stepstone.open_store`` does.
        encoding: ``"json"`` (default): store JSON, Agent Framework's own types in
            their JSON forms, and refuse anything else (see the module docstring).
            ``"maf"``: Agent Framework's own encoding, which pickles non-JSON values;
            only a storage opened with it unpickles on ``load``.
        allowed_checkpoint_types: With ``encoding="maf"``, the extra ``"module:qualname"``
            types MAF's restricted unpickler may build (as for MAF's own storages).

    Raises:
        ConfigError: a bad config string, an unknown ``encoding``, or
            ``allowed_checkpoint_types`` without ``encoding="maf"``.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        encoding: Encoding = "json",
        allowed_checkpoint_types: Iterable[str] = (),
    ) -> None:
        if encoding not in _ENCODINGS:
            raise ConfigError(f"encoding must be one of {_ENCODINGS}, got {encoding!r}")
        allowed = frozenset(allowed_checkpoint_types)
        if allowed and encoding != "maf":
            raise ConfigError(
                "allowed_checkpoint_types only applies to encoding='maf' (JSON checkpoints "
                "are never unpickled)"
            )
        if store is None or isinstance(store, str):
            from .._registry import open_store  # noqa: PLC0415

            self.store: Store = open_store(store)
            self._owns_store = True
        else:
            self.store = store
            self._owns_store = False
        self.encoding: Encoding = encoding
        self._allowed_types = allowed
        # checkpoint id -> record id, for ids this object saved or listed: load and
        # delete by id then skip the scan of the store's ids.
        self._known: dict[str, str] = {}
        #: The last error a ``save`` raised (MAF's runner only logs it as a warning).
        self.last_error: BaseException | None = None

    def __repr__(self) -> str:
        return f"StepstoneCheckpointStorage({self.store!r}, encoding={self.encoding!r})"

    # --- the CheckpointStorage protocol ----------------------------------------------

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store a copy of ``checkpoint`` once; return its id.

        Raises:
            ConflictError: this checkpoint id is already stored, for this workflow name,
                with other content; nothing was stored.
            InvalidState: a value is not JSON (the message names its path) and the
                storage was not opened with ``encoding="maf"``; or the timestamp is not
                ISO 8601.
            InvalidRunId: the checkpoint id is empty or has control characters.
            CheckpointTooLarge: the encoded checkpoint is over the backend's limit.
        """
        try:
            return await self._save(checkpoint)
        except Exception as exc:
            self.last_error = exc
            logger.error(
                "MAF checkpoint %r of workflow %r was not saved: %s",
                getattr(checkpoint, "checkpoint_id", None),
                getattr(checkpoint, "workflow_name", None),
                exc,
            )
            raise

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """Return a copy of the checkpoint with this id.

        Raises:
            CheckpointNotFound: no such checkpoint (a ``WorkflowCheckpointException``).
            AgentFrameworkCheckpointError: the id is stored under several workflow
                names, or the record needs ``encoding="maf"`` to be read.
            CorruptCheckpoint: the record is not one this adapter wrote.
        """
        rid = await self._resolve(checkpoint_id)
        found = await self._read(rid)
        if found is None:
            self._known.pop(checkpoint_id, None)
            raise CheckpointNotFound(checkpoint_id)
        return found

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """Return copies of the workflow's checkpoints, oldest first.

        A record that cannot be read is logged and skipped, as MAF's storages do.
        """
        found: list[WorkflowCheckpoint] = []
        for _, rid in await self._index(workflow_name):
            try:
                checkpoint = await self._read(rid)
            except (StepstoneError, WorkflowCheckpointException) as exc:
                logger.warning("skipping MAF checkpoint record %r: %s", rid, exc)
                continue
            if checkpoint is not None:
                found.append(checkpoint)
        found.sort(key=_timestamp)
        return found

    async def delete(self, checkpoint_id: str) -> bool:
        """Delete the checkpoint with this id; return whether there was one.

        Raises:
            AgentFrameworkCheckpointError: the id is stored under several workflow names.
        """
        try:
            rid = await self._resolve(checkpoint_id)
        except CheckpointNotFound:
            return False
        self._known.pop(checkpoint_id, None)
        return await self.store.adelete(rid)

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """Return a copy of the workflow's newest checkpoint by timestamp, or None.

        That is where a crashed run resumes (``workflow.run(checkpoint_id=...)``). Among
        checkpoints with the same timestamp, one that is another's parent is not the newest.
        """
        index = await self._index(workflow_name)
        while index:
            newest = index[-1][0]
            tied = [rid for at, rid in index if at == newest]
            del index[-len(tied) :]
            loaded = [cp for cp in [await self._read(rid) for rid in tied] if cp is not None]
            if loaded:
                parents = {cp.previous_checkpoint_id for cp in loaded}
                heads = [cp for cp in loaded if cp.checkpoint_id not in parents] or loaded
                return max(heads, key=_timestamp)
        return None

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """Return the ids of the workflow's checkpoints, oldest first, without loading them."""
        ids: list[str] = []
        for _, rid in await self._index(workflow_name):
            parsed = parse_record_id(rid)
            if parsed is not None:
                ids.append(parsed[1])
        return ids

    # --- lifetime --------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the store if this object opened it from a config string."""
        if self._owns_store:
            await self.store.aclose()

    def close(self) -> None:
        """Close the store if this object opened it from a config string."""
        if self._owns_store:
            self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- internals -------------------------------------------------------------------

    def _encode(self, checkpoint: WorkflowCheckpoint) -> dict[str, Any]:
        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise InvalidState(
                f"save takes a WorkflowCheckpoint, got {type(checkpoint).__name__}", "checkpoint"
            )
        if self.encoding == "json":
            fields = _encode_json(checkpoint)
        else:
            codec = _maf_codec()
            try:
                fields = codec.encode_checkpoint_value(checkpoint.to_dict())
                # Refuse at save what could not be loaded back (as MAF's own storages do).
                codec.decode_checkpoint_value(fields, allowed_types=self._allowed_types)
            except Exception as exc:
                raise InvalidState(
                    f"MAF checkpoint {checkpoint.checkpoint_id!r} cannot be encoded, or "
                    f"decoded under allowed_checkpoint_types: {exc}",
                    "checkpoint",
                ) from exc
        return {"format": FORMAT, "encoding": self.encoding, "checkpoint": fields}

    async def _save(self, checkpoint: WorkflowCheckpoint) -> str:
        document = self._encode(checkpoint)
        at = _timestamp(checkpoint)
        checkpoint_id = checkpoint.checkpoint_id
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise InvalidRunId(f"a checkpoint id must be a non-empty str, got {checkpoint_id!r}")
        rid = record_id(checkpoint.workflow_name, checkpoint_id)
        try:
            check_run_id(rid)
        except InvalidRunId as exc:
            raise InvalidRunId(f"MAF checkpoint {checkpoint_id!r}: record id {exc}") from None
        record = Checkpoint(
            run_id=rid,
            state=document,
            total_steps=0,  # status "done": workers never claim it
            workflow=WORKFLOW,
            created_at=at,
            updated_at=at,
        )
        # The stored times are the checkpoint's own (as for an imported run), so the
        # run index orders checkpoints by MAF's timestamp without loading them.
        token = _keep_times.set(True)
        try:
            await self.store.asave(record)
        except ConflictError:
            existing = await self.store.aload(rid)
            if existing is None or existing.state != document:
                raise ConflictError(
                    f"MAF checkpoint {checkpoint_id!r} of workflow {checkpoint.workflow_name!r} "
                    "is already stored with other content; checkpoint ids are write-once, so "
                    "nothing was stored (another process is writing this workflow's "
                    "checkpoints, or an id was reused)",
                    rid,
                ) from None
            # The same checkpoint again (a retry): already stored, nothing to do.
        finally:
            _keep_times.reset(token)
        self._known[checkpoint_id] = rid
        return checkpoint_id

    async def _read(self, rid: str) -> WorkflowCheckpoint | None:
        """Load and decode one record; None if it is gone."""
        record = await self.store.aload(rid)
        if record is None:
            return None
        state = record.state
        fields = state.get("checkpoint")
        encoding = state.get("encoding")
        if state.get("format") != FORMAT or not isinstance(fields, dict):
            raise CorruptCheckpoint(
                f"record {rid!r} is not a MAF checkpoint written by stepstone "
                f"(format {state.get('format')!r}, expected {FORMAT!r})"
            )
        if encoding == "json":
            try:
                checkpoint = _decode_json(fields)
            except (ImportError, AttributeError) as exc:
                # A request_info event names its types; MAF resolves them only among
                # the modules this process has imported.
                raise AgentFrameworkCheckpointError(
                    f"MAF checkpoint record {rid!r} has a pending request whose type is "
                    f"not loaded in this process ({exc}); import the module that defines "
                    "it before loading the checkpoint"
                ) from exc
            except (TypeError, ValueError, KeyError, WorkflowCheckpointException) as exc:
                raise CorruptCheckpoint(
                    f"record {rid!r}: not a readable checkpoint: {exc}"
                ) from exc
        elif encoding == "maf":
            if self.encoding != "maf":
                raise AgentFrameworkCheckpointError(
                    f"MAF checkpoint record {rid!r} was stored with Agent Framework's pickle "
                    "encoding; stepstone unpickles only when asked to: open the storage with "
                    "StepstoneCheckpointStorage(..., encoding='maf')"
                )
            decoded = _maf_codec().decode_checkpoint_value(
                fields, allowed_types=self._allowed_types
            )
            checkpoint = WorkflowCheckpoint.from_dict(decoded)
        else:
            raise CorruptCheckpoint(f"record {rid!r}: unknown encoding {encoding!r}")
        self._known[checkpoint.checkpoint_id] = rid
        return checkpoint

    async def _resolve(self, checkpoint_id: str) -> str:
        """Return the record id holding ``checkpoint_id``, from memory or the store's ids."""
        known = self._known.get(checkpoint_id)
        if known is not None:
            return known
        matches = [rid async for rid in _maf_ids(self.store) if _id_of(rid) == checkpoint_id]
        if not matches:
            raise CheckpointNotFound(checkpoint_id)
        if len(matches) > 1:
            names = sorted(name for name, _ in filter(None, map(parse_record_id, matches)))
            raise AgentFrameworkCheckpointError(
                f"checkpoint id {checkpoint_id!r} is stored for several workflows {names}; "
                "use list_checkpoints(workflow_name=...) to pick one"
            )
        self._known[checkpoint_id] = matches[0]
        return matches[0]

    async def _index(self, workflow_name: str) -> list[tuple[datetime, str]]:
        """Return ``(timestamp, record id)`` of the workflow's checkpoints, oldest first."""
        prefix = _workflow_prefix(workflow_name)
        found: list[tuple[datetime, str]] = []
        async for info in self.store.alist_info():
            if info.run_id.startswith(prefix) and _id_of(info.run_id) is not None:
                at = info.updated_at or datetime.min.replace(tzinfo=UTC)
                found.append((at if at.tzinfo else at.replace(tzinfo=UTC), info.run_id))
        found.sort()
        return found


def _id_of(rid: str) -> str | None:
    parsed = parse_record_id(rid)
    return None if parsed is None else parsed[1]


async def _maf_ids(store: Store) -> AsyncIterator[str]:
    async for rid in store.alist_runs():
        if rid.startswith(PREFIX):
            yield rid
