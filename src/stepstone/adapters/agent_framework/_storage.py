"""``StepstoneCheckpointStorage``: MAF's ``CheckpointStorage`` protocol on a stepstone store."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from agent_framework import WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from ..._checkpoint import Checkpoint, check_run_id, keep_times
from ..._errors import (
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidRunId,
    InvalidState,
    StepstoneError,
)
from ..._observe import logger
from ..._registry import open_store
from ..._store import Store
from .._drive import asave
from .._lifetime import StoreOwner
from ._encoding import Types, decode_json, encode_json, maf_codec
from ._records import (
    ENCODINGS,
    FORMAT,
    WORKFLOW,
    AgentFrameworkCheckpointError,
    CheckpointNotFound,
    Encoding,
    id_of,
    maf_ids,
    parse_record_id,
    record_id,
    timestamp_of,
    workflow_prefix,
)


class StepstoneCheckpointStorage(StoreOwner):
    """An Agent Framework ``CheckpointStorage`` that keeps each checkpoint in a stepstone store.

    Args:
        store: An open ``Store`` (left open by ``close``), or a config string such as
            ``"sqlite:///agents.db"`` (opened here and closed by ``close``); None reads
            ``STEPSTONE_STORE``, as ``stepstone.open_store`` does.
        encoding: ``"json"`` (default): store JSON, with the standard value types,
            Agent Framework's own types and the declared types tagged so that they load
            back as themselves, and refuse anything else at ``save`` (see the module
            docstring). ``"maf"``: Agent Framework's own encoding, which pickles
            non-JSON values; only a storage opened with it unpickles on ``load``.
        allowed_checkpoint_types: The application's own types a checkpoint may hold
            (classes, or ``"module:qualname"`` strings, as for MAF's own storages). With
            ``"json"``: dataclasses, enums, NamedTuples and pydantic models, stored field
            by field and rebuilt on load; no other type is ever built from stored data.
            With ``"maf"``: the extra types MAF's restricted unpickler may build. Types
            registered with MAF's ``register_checkpoint_type`` count as declared too.

    Raises:
        ConfigError: a bad config string, an unknown ``encoding``, or an entry of
            ``allowed_checkpoint_types`` that is neither a class nor ``"module:qualname"``.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        encoding: Encoding = "json",
        allowed_checkpoint_types: Iterable[str | type] = (),
    ) -> None:
        if encoding not in ENCODINGS:
            raise ConfigError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
        if isinstance(allowed_checkpoint_types, (str, type)):
            allowed_checkpoint_types = [allowed_checkpoint_types]
        self._types = Types(allowed_checkpoint_types)
        if store is None or isinstance(store, str):
            self.store: Store = open_store(store)
            self.owns_store = True
        else:
            self.store = store
            self.owns_store = False
        self.encoding: Encoding = encoding
        self._allowed_types = frozenset(self._types.keys)
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
        found.sort(key=timestamp_of)
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
                return max(heads, key=timestamp_of)
        return None

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """Return the ids of the workflow's checkpoints, oldest first, without loading them."""
        ids: list[str] = []
        for _, rid in await self._index(workflow_name):
            parsed = parse_record_id(rid)
            if parsed is not None:
                ids.append(parsed[1])
        return ids

    # --- internals -------------------------------------------------------------------

    def _encode(self, checkpoint: WorkflowCheckpoint) -> dict[str, Any]:
        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise InvalidState(
                f"save takes a WorkflowCheckpoint, got {type(checkpoint).__name__}", "checkpoint"
            )
        if self.encoding == "json":
            fields = encode_json(checkpoint, self._types)
            # Refuse at save what could not be loaded back (as MAF's own storages do), so
            # that no checkpoint is accepted that every load would then refuse.
            try:
                decode_json(fields, self._types)
            except Exception as exc:
                raise InvalidState(
                    f"MAF checkpoint {checkpoint.checkpoint_id!r} would not load back: "
                    f"{type(exc).__name__}: {exc}",
                    "checkpoint",
                ) from exc
        else:
            codec = maf_codec()
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
        at = timestamp_of(checkpoint)
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
        token = keep_times.set(True)
        try:
            await asave(self.store, record)  # a lost answer: the same object again
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
            keep_times.reset(token)
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
                checkpoint = decode_json(fields, self._types)
            except (ImportError, AttributeError) as exc:
                # A request_info event names its types; MAF resolves them only among
                # the modules this process has imported.
                raise AgentFrameworkCheckpointError(
                    f"MAF checkpoint record {rid!r} has a pending request whose type is "
                    f"not loaded in this process ({exc}); declare it in "
                    "allowed_checkpoint_types, or import the module that defines it before "
                    "loading the checkpoint"
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
            decoded = maf_codec().decode_checkpoint_value(fields, allowed_types=self._allowed_types)
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
        matches = [rid async for rid in maf_ids(self.store) if id_of(rid) == checkpoint_id]
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
        prefix = workflow_prefix(workflow_name)
        found: list[tuple[datetime, str]] = []
        async for info in self.store.alist_info():
            if info.run_id.startswith(prefix) and id_of(info.run_id) is not None:
                at = info.updated_at or datetime.min.replace(tzinfo=UTC)
                found.append((at if at.tzinfo else at.replace(tzinfo=UTC), info.run_id))
        found.sort()
        return found
