"""A LangGraph checkpointer on any stepstone store (``pip install stepstone[langgraph]``).

::

    from stepstone.adapters.langgraph import StepstoneSaver

    with StepstoneSaver.from_config("postgresql://app@db/agents") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "chat-42"}})

What is stored, one stepstone record per item (so no record grows with a thread's
history, and Cosmos DB's 2 MB item limit applies to one checkpoint, not to a thread):

- ``{prefix}/{thread}/{ns}/{checkpoint_id}``: one LangGraph checkpoint: its parent id,
  its metadata (as JSON when it is JSON, else serialized), the checkpoint's fields, and
  each channel value serialized by the saver's ``serde`` (LangGraph's
  ``JsonPlusSerializer``: msgpack) as ``[type, encoding, text]``: the bytes as a string
  of one character per byte (``"text"``, for mostly-text msgpack) or base64 (``"b64"``),
  whichever is shorter.
- ``{prefix}/{thread}/{ns}/{checkpoint_id}/writes``: the pending writes of that
  checkpoint, one entry per ``(task_id, idx)``.
- ``{prefix}/{thread}/{ns}``: the head of the namespace: the latest checkpoint id, and
  the owner lease when the saver is given an ``owner``.

Thread ids, namespaces and checkpoint ids are percent-encoded in the keys. Each record
is a finished stepstone run (status ``done``, workflow ``langgraph``), so workers never
claim them and ``stepstone runs`` lists them under those names.

Write ownership, which LangGraph's own savers do not have: a checkpoint id is written
once (a second ``put`` of the same id with other content raises ``CheckpointConflict``),
and a checkpoint the Pregel loop writes (``source="loop"``) must extend the head of its
namespace: if another process advanced the thread meanwhile, the write is refused with
``CheckpointConflict`` instead of landing beside the other writer's as if alone. Time
travel stays open: ``update_state`` and replays from an older checkpoint write
``source="update"``/``"fork"``/``"input"`` checkpoints, which may branch from any
parent, and the loop then continues from that branch. With ``owner=`` (opt-in), each
thread namespace is leased to one owner: a write by anyone else while the lease is live
raises ``ThreadOwned``; after ``lease`` seconds without a write the next writer takes
over.

Pickle: the default serializer never pickles, and a stored value of type ``pickle`` is
refused on load with ``UnsafeCheckpoint`` unless the saver is built with
``allow_pickle=True``.
"""

from __future__ import annotations

import base64
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeAlias, cast
from urllib.parse import quote, unquote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, evolve, find_non_json
from .._errors import ConfigError, ConflictError, StoreError
from .._registry import open_store
from .._store import Store

__all__ = ["CheckpointConflict", "StepstoneSaver", "ThreadOwned", "UnsafeCheckpoint"]

#: The ``workflow`` name every record of this adapter carries (CLI and dashboard).
WORKFLOW = "langgraph"
# A compare-and-swap lost to a concurrent merge (parallel tasks' writes, a head being
# advanced) is retried; this many losses in a row means something is wrong.
_MAX_RETRIES = 100
# Sources of checkpoints a user asks for (time travel, manual updates, new input):
# they may branch from any stored parent. Everything else is the loop's own progress.
_BRANCH_SOURCES = frozenset({"input", "update", "fork"})
# The bytes that cost more than one byte in a JSON string of one character per byte.
_HIGH_BYTES = bytes(range(0x80, 0x100))
_CONTROL_BYTES = bytes(range(0x20))
_SAMPLE = 1024


class CheckpointConflict(ConflictError):
    """Another writer got there first: the thread advanced, or the checkpoint id is taken.

    Nothing was written by the refused call. Reload the thread (``get_state``) before
    continuing; two processes must not drive one thread at once.
    """

    def __init__(
        self, message: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.checkpoint_id = checkpoint_id


class ThreadOwned(CheckpointConflict):
    """Another owner holds a live lease on the thread (``StepstoneSaver(owner=...)``)."""

    def __init__(self, message: str, thread_id: str, checkpoint_ns: str, owner: str) -> None:
        super().__init__(message, thread_id, checkpoint_ns, None)
        self.owner = owner


class UnsafeCheckpoint(StoreError):
    """A stored value would be unpickled, and the saver was not built with ``allow_pickle``."""


# Effects: the rules below are generators that yield these and receive the result (or
# have the store's exception thrown in); one thin sync and one thin async driver run them.


@dataclass(frozen=True, slots=True)
class _Load:
    key: str


@dataclass(frozen=True, slots=True)
class _Save:
    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class _Delete:
    key: str
    version: str | None = None


@dataclass(frozen=True, slots=True)
class _Scan:
    prefix: str


@dataclass(frozen=True, slots=True)
class _Emit:
    item: CheckpointTuple


_Effect: TypeAlias = _Load | _Save | _Delete | _Scan | _Emit
_Rule: TypeAlias = Generator[_Effect, Any, Any]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _q(part: str) -> str:
    return quote(part, safe="")


def _kind(record: Checkpoint | None, kind: str) -> dict[str, Any] | None:
    """The record's state if it is one of ours of ``kind``, else None."""
    if record is None or record.state.get("kind") != kind:
        return None
    return record.state


class StepstoneSaver(BaseCheckpointSaver[str]):
    """LangGraph's ``BaseCheckpointSaver`` on a stepstone ``Store``, sync and async.

    Args:
        store: An open ``Store``, or a config string (``"sqlite:///agents.db"``); a
            store opened from a string is closed by ``close``.
        prefix: First segment of every key, so several applications can share a store.
        serde: LangGraph serializer for channel values and writes; default
            ``JsonPlusSerializer()`` (msgpack, no pickle).
        allow_pickle: Let values be stored and loaded as pickle (a stored pickle runs
            code when loaded: only for stores nobody else can write).
        owner: Opt-in owner lease: this saver's name; another owner's writes to a thread
            it leases are refused until ``lease`` seconds pass without a write by it.
        lease: Seconds an owner's lease lasts after its last write.
    """

    def __init__(
        self,
        store: Store | str,
        *,
        prefix: str = "langgraph",
        serde: SerializerProtocol | None = None,
        allow_pickle: bool = False,
        owner: str | None = None,
        lease: float = 60.0,
    ) -> None:
        if serde is None:
            serde = JsonPlusSerializer(pickle_fallback=allow_pickle)
        super().__init__(serde=serde)
        if not isinstance(prefix, str) or not prefix or "/" in prefix:
            raise ConfigError(f"prefix must be a non-empty str without '/', got {prefix!r}")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ConfigError(f"owner must be a non-empty str or None, got {owner!r}")
        if not lease > 0:
            raise ConfigError(f"lease must be a positive number of seconds, got {lease!r}")
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.prefix = prefix
        self.allow_pickle = allow_pickle
        self.owner = owner
        self.lease = float(lease)
        #: Wall clock of the lease (renewal times and expiry); replaceable in tests.
        self.clock: Callable[[], datetime] = _utcnow

    @classmethod
    def from_config(cls, config: str, **options: Any) -> Self:
        """Open the store ``config`` names and return a saver on it (closed with it)."""
        return cls(config, **options)

    def close(self) -> None:
        """Close the store if this saver opened it from a config string."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owns_store:
            await self.store.aclose()

    # -- drivers ---------------------------------------------------------------------

    def _do(self, effect: _Effect) -> Any:
        if isinstance(effect, _Load):
            return self.store.load(effect.key)
        if isinstance(effect, _Save):
            return self.store.save(effect.checkpoint)
        if isinstance(effect, _Delete):
            return self.store.delete(effect.key, expected_version=effect.version)
        if isinstance(effect, _Scan):
            return [r for r in self.store.list_runs() if r.startswith(effect.prefix)]
        raise AssertionError(effect)  # pragma: no cover - _Emit is handled by _iterate

    async def _ado(self, effect: _Effect) -> Any:
        if isinstance(effect, _Load):
            return await self.store.aload(effect.key)
        if isinstance(effect, _Save):
            return await self.store.asave(effect.checkpoint)
        if isinstance(effect, _Delete):
            return await self.store.adelete(effect.key, expected_version=effect.version)
        if isinstance(effect, _Scan):
            return [r async for r in self.store.alist_runs() if r.startswith(effect.prefix)]
        raise AssertionError(effect)  # pragma: no cover - _Emit is handled by _aiterate

    def _iterate(self, rule: _Rule) -> Iterator[Any]:
        """Run ``rule`` on the sync store methods, yielding what it emits."""
        try:
            effect = next(rule)
            while True:
                if isinstance(effect, _Emit):
                    yield effect.item
                    effect = next(rule)
                    continue
                try:
                    result = self._do(effect)
                except Exception as exc:
                    effect = rule.throw(exc)
                else:
                    effect = rule.send(result)
        except StopIteration:
            pass
        finally:
            rule.close()

    async def _aiterate(self, rule: _Rule) -> AsyncIterator[Any]:
        """Run ``rule`` on the store's async methods, yielding what it emits."""
        try:
            effect = next(rule)
            while True:
                if isinstance(effect, _Emit):
                    yield effect.item
                    effect = next(rule)
                    continue
                try:
                    result = await self._ado(effect)
                except Exception as exc:
                    effect = rule.throw(exc)
                else:
                    effect = rule.send(result)
        except StopIteration:
            pass
        finally:
            rule.close()

    def _run(self, rule: _Rule) -> Any:
        try:
            effect = next(rule)
            while True:
                try:
                    result = self._do(effect)
                except Exception as exc:
                    effect = rule.throw(exc)
                else:
                    effect = rule.send(result)
        except StopIteration as stop:
            return stop.value

    async def _arun(self, rule: _Rule) -> Any:
        try:
            effect = next(rule)
            while True:
                try:
                    result = await self._ado(effect)
                except Exception as exc:
                    effect = rule.throw(exc)
                else:
                    effect = rule.send(result)
        except StopIteration as stop:
            return stop.value

    # -- keys and encoding -----------------------------------------------------------

    def _ns_key(self, thread_id: str, ns: str) -> str:
        if not isinstance(thread_id, str) or not thread_id:
            raise ConfigError(f"configurable.thread_id must be a non-empty str, got {thread_id!r}")
        key = f"{self.prefix}/{_q(thread_id)}/{_q(ns)}"
        # Room for "/{checkpoint_id}/writes" (a uuid is 36 characters).
        if len(key) > MAX_RUN_ID_LENGTH - 60:
            raise ConfigError(
                f"thread_id and checkpoint_ns are too long to store ({len(key)} characters "
                f"once encoded; at most {MAX_RUN_ID_LENGTH - 60} with the prefix)"
            )
        return key

    def _cp_key(self, thread_id: str, ns: str, checkpoint_id: str) -> str:
        return f"{self._ns_key(thread_id, ns)}/{_q(checkpoint_id)}"

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
        # Bytes into a JSON string, whichever way is shorter: one character per byte
        # (U+0000-U+00FF: one UTF-8 byte for ASCII, two above, six for a control
        # character JSON escapes) for msgpack that is mostly text, as a chat's is; else
        # base64's fixed 4/3. The choice only affects size, so a large value is judged
        # on three samples rather than scanned whole.
        if len(data) > 3 * _SAMPLE:
            middle = len(data) // 2
            sample = data[:_SAMPLE] + data[middle : middle + _SAMPLE] + data[-_SAMPLE:]
        else:
            sample = data
        size = len(sample)
        text_cost = (
            size
            + (size - len(sample.translate(None, _HIGH_BYTES)))
            + 5 * (size - len(sample.translate(None, _CONTROL_BYTES)))
        )
        if text_cost <= 4 * ((size + 2) // 3):
            return [type_, "text", data.decode("latin-1")]
        return [type_, "b64", base64.b64encode(data).decode("ascii")]

    def _undump(self, packed: list[str], where: str) -> Any:
        type_, encoding, data = packed
        if type_ == "pickle" and not self.allow_pickle:
            raise UnsafeCheckpoint(
                f"{where} is stored as pickle, which runs code when loaded; refused. "
                "Pass allow_pickle=True to StepstoneSaver only if nobody else can write "
                "to the store"
            )
        raw = data.encode("latin-1") if encoding == "text" else base64.b64decode(data)
        return self.serde.loads_typed((type_, raw))

    def _pack(self, value: Any, where: str) -> dict[str, Any]:
        # Plain JSON stays readable in the store (operators filter and read metadata);
        # anything else goes through the serializer, so nothing is lost.
        if isinstance(value, dict) and find_non_json(value) is None:
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
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def _tuple(self, record: dict[str, Any], writes: dict[str, Any] | None) -> CheckpointTuple:
        thread_id, ns, cp_id = record["thread_id"], record["checkpoint_ns"], record["id"]
        where = f"checkpoint {cp_id!r} of thread {thread_id!r}"
        checkpoint = cast(dict[str, Any], self._unpack(record["checkpoint"], where))
        checkpoint["channel_values"] = {
            channel: self._undump(packed, f"{where}, channel {channel!r}")
            for channel, packed in record["values"].items()
        }
        parent = record.get("parent")
        return CheckpointTuple(
            config=self._config(thread_id, ns, cp_id),
            checkpoint=cast(LGCheckpoint, checkpoint),
            metadata=cast(CheckpointMetadata, self._unpack(record["metadata"], where)),
            parent_config=self._config(thread_id, ns, parent) if parent else None,
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

    # -- rules -----------------------------------------------------------------------

    def _get_rule(self, config: RunnableConfig) -> _Rule:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        cp_id = get_checkpoint_id(config)
        if not cp_id:
            head = _kind((yield _Load(self._ns_key(thread_id, ns))), "head")
            if head is None or head.get("head") is None:
                return None
            cp_id = head["head"]
        key = self._cp_key(thread_id, ns, cp_id)
        record = _kind((yield _Load(key)), "checkpoint")
        if record is None:
            if get_checkpoint_id(config):
                return None
            # The head's checkpoint was deleted (delete_for_runs, a crash inside a
            # prune): the latest is the newest one left; repair the head to it.
            cp_id = yield from self._repair_head(thread_id, ns)
            if cp_id is None:
                return None
            key = self._cp_key(thread_id, ns, cp_id)
            record = _kind((yield _Load(key)), "checkpoint")
            if record is None:
                return None
        writes = _kind((yield _Load(key + "/writes")), "writes")
        return self._tuple(record, writes)

    def _repair_head(self, thread_id: str, ns: str) -> Generator[_Effect, Any, str | None]:
        """Point the namespace's head at its newest stored checkpoint; return its id."""
        ns_key = self._ns_key(thread_id, ns)
        keys = yield _Scan(ns_key + "/")
        ids = sorted(
            p[2]
            for p in map(self._parse, keys)
            if p is not None and p[2] is not None and not p[3] and p[1] == ns
        )
        newest = ids[-1] if ids else None
        for _ in range(_MAX_RETRIES):
            stored = yield _Load(ns_key)
            head = _kind(stored, "head")
            if head is None:
                return newest
            if head.get("head") == newest:
                return newest
            assert stored is not None
            try:
                yield _Save(evolve(stored, state={**head, "head": newest}))
            except ConflictError:
                continue
            return newest
        return newest

    def _put_rule(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> _Rule:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        parent = conf.get("checkpoint_id") or None
        cp_id = checkpoint["id"]
        where = f"checkpoint {cp_id!r} of thread {thread_id!r}"
        meta = get_checkpoint_metadata(config, metadata)
        skeleton = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        state = {
            "kind": "checkpoint",
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "id": cp_id,
            "parent": parent,
            "metadata": self._pack(dict(meta), where),
            "checkpoint": self._pack(skeleton, where),
            "values": {
                channel: self._dump(value, f"{where}, channel {channel!r}")
                for channel, value in checkpoint["channel_values"].items()
            },
        }
        ns_key = self._ns_key(thread_id, ns)
        key = self._cp_key(thread_id, ns, cp_id)
        branch = meta.get("source") in _BRANCH_SOURCES
        head_record = yield _Load(ns_key)
        self._check_head(head_record, thread_id, ns, parent, cp_id, branch)
        # Insert-if-absent: a checkpoint id is written once. The same content again is
        # a retry of a put whose answer was lost, and succeeds.
        try:
            yield _Save(self._record(key, state, None))
        except ConflictError:
            existing = _kind((yield _Load(key)), "checkpoint")
            if existing is None or existing != state:
                raise CheckpointConflict(
                    f"{where} (namespace {ns!r}) is already stored with other content; "
                    "a checkpoint id is written once. Another writer is driving this thread",
                    thread_id,
                    ns,
                    cp_id,
                ) from None
        # Advance the head last: it is the commit point. A writer that loses the race
        # here leaves its record behind unreferenced and removes it.
        for _ in range(_MAX_RETRIES):
            try:
                if head_record is None:
                    head_state = {
                        "kind": "head",
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "head": cp_id,
                    }
                    yield _Save(self._lease(self._record(ns_key, head_state, None)))
                else:
                    head = head_record.state
                    if head.get("head") != cp_id:
                        yield _Save(self._lease(evolve(head_record, state={**head, "head": cp_id})))
                break
            except ConflictError:
                head_record = yield _Load(ns_key)
                try:
                    self._check_head(head_record, thread_id, ns, parent, cp_id, branch)
                except CheckpointConflict:
                    yield _Delete(key)
                    raise
        else:  # pragma: no cover - only under a pathological stream of concurrent writes
            raise ConflictError(f"{where}: the head kept changing; {_MAX_RETRIES} attempts")
        return self._config(thread_id, ns, cp_id)

    def _lease(self, head: Checkpoint) -> Checkpoint:
        if self.owner is None:
            return head
        # The stepstone fields a run's lease uses; status stays "done" (total_steps=0),
        # so no stepstone worker ever claims a thread.
        return evolve(head, owner=self.owner, lease=self.lease, renewed_at=self.clock())

    def _check_head(
        self,
        head_record: Checkpoint | None,
        thread_id: str,
        ns: str,
        parent: str | None,
        cp_id: str,
        branch: bool,
    ) -> None:
        """Refuse a write that does not extend what the namespace's head says."""
        if head_record is None:
            return
        head = head_record.state
        # A live lease binds every saver, leased or not: an owner's thread is its own.
        if (
            head_record.owner not in (None, self.owner)
            and head_record.renewed_at is not None
            and head_record.lease is not None
            and self.clock() < head_record.renewed_at + timedelta(seconds=head_record.lease)
        ):
            raise ThreadOwned(
                f"thread {thread_id!r} (namespace {ns!r}) is leased to {head_record.owner!r} "
                f"until {head_record.renewed_at + timedelta(seconds=head_record.lease):%H:%M:%S} "
                "UTC; this saver's owner may write after the lease expires",
                thread_id,
                ns,
                head_record.owner or "",
            )
        latest = head.get("head")
        if branch or latest == cp_id or parent is None or parent == latest:
            return
        raise CheckpointConflict(
            f"thread {thread_id!r} (namespace {ns!r}) advanced to checkpoint {latest!r} "
            f"while this writer continued from {parent!r}: another process is driving "
            "this thread. Nothing was written; reload the thread before continuing "
            "(time travel is unaffected: update_state and forks may branch anywhere)",
            thread_id,
            ns,
            parent,
        )

    def _put_writes_rule(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> _Rule:
        conf = config["configurable"]
        thread_id, ns, cp_id = (
            conf["thread_id"],
            conf.get("checkpoint_ns", ""),
            conf["checkpoint_id"],
        )
        key = self._cp_key(thread_id, ns, cp_id) + "/writes"
        where = f"checkpoint {cp_id!r} of thread {thread_id!r}"
        new: dict[str, dict[str, Any]] = {}
        for idx, (channel, value) in enumerate(writes):
            index = WRITES_IDX_MAP.get(channel, idx)
            new[f"{task_id}|{index}"] = {
                "task_id": task_id,
                "idx": index,
                "channel": channel,
                "task_path": task_path,
                "value": self._dump(value, f"{where}, write to {channel!r}"),
            }
        for _ in range(_MAX_RETRIES):
            stored = yield _Load(key)
            current = _kind(stored, "writes")
            entries = dict(current["writes"]) if current else {}
            changed = False
            for name, entry in new.items():
                # A regular write is stored once per (task_id, idx); the special channels
                # (errors, interrupts, resumes: negative idx) overwrite, as in LangGraph.
                if entry["idx"] >= 0 and name in entries:
                    continue
                if entries.get(name) != entry:
                    entries[name] = entry
                    changed = True
            if not changed:
                return None
            state = {
                "kind": "writes",
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "id": cp_id,
                "writes": entries,
            }
            record = (
                self._record(key, state, None) if stored is None else evolve(stored, state=state)
            )
            try:
                yield _Save(record)
            except ConflictError:
                continue  # a parallel task's writes landed first: merge again
            return None
        raise ConflictError(f"{where}: writes kept conflicting; {_MAX_RETRIES} attempts")

    def _scan_rule(
        self, thread_id: str | None
    ) -> Generator[_Effect, Any, list[tuple[str, str, str | None, bool, str]]]:
        prefix = f"{self.prefix}/" if thread_id is None else f"{self.prefix}/{_q(thread_id)}/"
        keys = yield _Scan(prefix)
        found = []
        for key in keys:
            parsed = self._parse(key)
            if parsed is not None and (thread_id is None or parsed[0] == thread_id):
                found.append((*parsed, key))
        return found

    def _list_rule(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> _Rule:
        conf = config["configurable"] if config else {}
        thread_id = conf.get("thread_id") if config else None
        want_ns = conf.get("checkpoint_ns")
        want_id = conf.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        entries = yield from self._scan_rule(thread_id)
        with_writes = {key for *_, is_writes, key in entries if is_writes}
        candidates = sorted(
            (
                (cp_id, tid, ns, key)
                for tid, ns, cp_id, is_writes, key in entries
                if cp_id is not None
                and not is_writes
                and (want_ns is None or ns == want_ns)
                and (not want_id or cp_id == want_id)
                and (not before_id or cp_id < before_id)
            ),
            reverse=True,
        )
        remaining = limit
        for _cp_id, _tid, _ns, key in candidates:
            if remaining is not None and remaining <= 0:
                return None
            record = _kind((yield _Load(key)), "checkpoint")
            if record is None:
                continue  # deleted since the scan
            if filter:
                meta = self._unpack(record["metadata"], f"checkpoint {_cp_id!r}")
                if not all(meta.get(k) == v for k, v in filter.items()):
                    continue
            writes = None
            if key + "/writes" in with_writes:
                writes = _kind((yield _Load(key + "/writes")), "writes")
            if remaining is not None:
                remaining -= 1
            yield _Emit(self._tuple(record, writes))
        return None

    def _delete_keys(self, keys: Sequence[str]) -> _Rule:
        # Checkpoints and writes first, heads last: a crash in between leaves a head
        # whose checkpoint is gone, which get_tuple repairs; never the other way round.
        for key in sorted(keys, key=lambda k: k.count("/"), reverse=True):
            yield _Delete(key)

    def _delete_thread_rule(self, thread_id: str) -> _Rule:
        entries = yield from self._scan_rule(thread_id)
        yield from self._delete_keys([key for *_, key in entries])

    def _delete_for_runs_rule(self, run_ids: Sequence[str]) -> _Rule:
        wanted = set(run_ids)
        if not wanted:
            return None
        entries = yield from self._scan_rule(None)
        touched: set[tuple[str, str]] = set()
        for tid, ns, cp_id, is_writes, key in entries:
            if cp_id is None or is_writes:
                continue
            record = _kind((yield _Load(key)), "checkpoint")
            if record is None:
                continue
            meta = self._unpack(record["metadata"], f"checkpoint {cp_id!r}")
            if meta.get("run_id") in wanted:
                yield _Delete(key + "/writes")
                yield _Delete(key)
                touched.add((tid, ns))
        for tid, ns in sorted(touched):
            yield from self._repair_head(tid, ns)
        return None

    def _copy_thread_rule(self, source: str, target: str) -> _Rule:
        entries = yield from self._scan_rule(source)
        heads: dict[str, str] = {}
        for _tid, ns, cp_id, is_writes, key in sorted(entries, key=lambda e: e[2] or ""):
            record = yield _Load(key)
            if record is None:
                continue
            state = {**record.state, "thread_id": target}
            if cp_id is None:
                if state.get("head"):
                    heads[ns] = state["head"]
                continue
            new_key = self._cp_key(target, ns, cp_id) + ("/writes" if is_writes else "")
            # A checkpoint the target already has stays the target's own.
            with contextlib.suppress(ConflictError):
                yield _Save(self._record(new_key, state, None))
        for ns, head_id in heads.items():
            yield from self._set_head(target, ns, head_id)
        return None

    def _set_head(self, thread_id: str, ns: str, head_id: str | None) -> _Rule:
        ns_key = self._ns_key(thread_id, ns)
        for _ in range(_MAX_RETRIES):
            stored = yield _Load(ns_key)
            state = {"kind": "head", "thread_id": thread_id, "checkpoint_ns": ns, "head": head_id}
            record = (
                self._record(ns_key, state, None)
                if stored is None
                else evolve(stored, state={**stored.state, **state})
            )
            try:
                yield _Save(record)
            except ConflictError:
                continue
            return None
        raise ConflictError(f"thread {thread_id!r}: the head kept changing")

    def _prune_rule(self, thread_ids: Sequence[str], strategy: str) -> _Rule:
        if strategy not in ("keep_latest", "delete"):
            raise ConfigError(
                f"unknown prune strategy {strategy!r}; allowed: 'keep_latest', 'delete'"
            )
        for thread_id in thread_ids:
            if strategy == "delete":
                yield from self._delete_thread_rule(thread_id)
                continue
            entries = yield from self._scan_rule(thread_id)
            namespaces = sorted({ns for _t, ns, *_ in entries})
            doomed: list[str] = []
            for ns in namespaces:
                ids = sorted(
                    cp_id for _t, n, cp_id, w, _k in entries if n == ns and cp_id and not w
                )
                if not ids:
                    continue
                head = _kind((yield _Load(self._ns_key(thread_id, ns))), "head")
                latest = head["head"] if head and head.get("head") in ids else ids[-1]
                keep = yield from self._ancestry(thread_id, ns, latest)
                for cp_id in ids:
                    if cp_id not in keep:
                        key = self._cp_key(thread_id, ns, cp_id)
                        doomed += [key + "/writes", key]
                yield from self._set_head(thread_id, ns, latest)
            yield from self._delete_keys(doomed)
        return None

    def _ancestry(self, thread_id: str, ns: str, latest: str) -> Generator[_Effect, Any, set[str]]:
        """The checkpoints ``keep_latest`` keeps: the latest, and for threads using
        LangGraph's DeltaChannel, its ancestors (their writes rebuild delta channels)."""
        keep = {latest}
        record = _kind((yield _Load(self._cp_key(thread_id, ns, latest))), "checkpoint")
        if record is None:
            return keep
        meta = self._unpack(record["metadata"], f"checkpoint {latest!r}")
        if not (isinstance(meta, dict) and meta.get("counters_since_delta_snapshot")):
            return keep
        parent = record.get("parent")
        while parent and parent not in keep:
            keep.add(parent)
            found = _kind((yield _Load(self._cp_key(thread_id, ns, parent))), "checkpoint")
            parent = found.get("parent") if found else None
        return keep

    # -- the BaseCheckpointSaver API ---------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Return the checkpoint ``config`` names, or the namespace's latest, or None."""
        return cast(CheckpointTuple | None, self._run(self._get_rule(config)))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async ``get_tuple``."""
        return cast(CheckpointTuple | None, await self._arun(self._get_rule(config)))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Yield matching checkpoints, newest first (reads the store's run listing)."""
        yield from self._iterate(self._list_rule(config, filter, before, limit))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async ``list``."""
        async for item in self._aiterate(self._list_rule(config, filter, before, limit)):
            yield item

    def put(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint once; refuse it if another writer advanced the thread.

        Raises:
            CheckpointConflict: the id is stored with other content, or the loop
                continued from a checkpoint that is no longer the namespace's head.
            ThreadOwned: another owner's lease on the thread is live (``owner=``).
        """
        return cast(
            RunnableConfig, self._run(self._put_rule(config, checkpoint, metadata, new_versions))
        )

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async ``put``."""
        return cast(
            RunnableConfig,
            await self._arun(self._put_rule(config, checkpoint, metadata, new_versions)),
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes once per ``(task_id, idx)``; special channels overwrite."""
        self._run(self._put_writes_rule(config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async ``put_writes``."""
        await self._arun(self._put_writes_rule(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and head of the thread, in every namespace."""
        self._run(self._delete_thread_rule(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async ``delete_thread``."""
        await self._arun(self._delete_thread_rule(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is listed."""
        self._run(self._delete_for_runs_rule(run_ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async ``delete_for_runs``."""
        await self._arun(self._delete_for_runs_rule(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another, keeping ids."""
        self._run(self._copy_thread_rule(source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async ``copy_thread``."""
        await self._arun(self._copy_thread_rule(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's latest checkpoint (``keep_latest``) or none (``delete``).

        A thread using DeltaChannel keeps the latest checkpoint's ancestors too: their
        writes are what rebuilds its delta channels.

        Raises:
            ConfigError: ``strategy`` is neither ``keep_latest`` nor ``delete``.
        """
        self._run(self._prune_rule(thread_ids, strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async ``prune``."""
        await self._arun(self._prune_rule(thread_ids, strategy))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Return a version greater than ``current``: a counter, then a random tiebreak.

        The form LangGraph's own savers use (``"00..07.0.123"``), so threads copied
        between savers keep comparing correctly.
        """
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"
