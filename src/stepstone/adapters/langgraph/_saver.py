"""``StepstoneSaver``: LangGraph's ``BaseCheckpointSaver`` API, each method one rule run
by the sync or the async driver (``.._drive``)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Self, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ..._budget import Budget, Prices
from ..._errors import ConfigError
from ..._registry import open_store
from ..._store import Store
from .._drive import adrive, aiterate, drive, iterate
from .._lifetime import StoreOwner
from ._rules import Rules
from ._usage import Usage

__all__ = ["StepstoneSaver"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class StepstoneSaver(StoreOwner, Usage, Rules, BaseCheckpointSaver[str]):
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
        budget: The thread's spend limit; its AI messages' usage is charged (``_usage``).
        prices: Dollars per token for those charges (tokens alone without it).
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
        budget: Budget | None = None,
        prices: Prices | None = None,
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
        self.owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.prefix = prefix
        self.allow_pickle = allow_pickle
        self.owner = owner
        self.lease = float(lease)
        #: Wall clock of the lease (renewal times and expiry); replaceable in tests.
        self.clock: Callable[[], datetime] = _utcnow
        self._heads = {}
        self._writes = {}
        self._usage_init(budget, prices)

    @classmethod
    def from_config(cls, config: str, **options: Any) -> Self:
        """Open the store ``config`` names and return a saver on it (closed with it)."""
        return cls(config, **options)

    # -- the BaseCheckpointSaver API ---------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Return the checkpoint ``config`` names, or the namespace's latest, or None."""
        return cast(CheckpointTuple | None, drive(self.store, self._get_rule(config)))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async ``get_tuple``."""
        return cast(CheckpointTuple | None, await adrive(self.store, self._get_rule(config)))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Yield matching checkpoints, newest first (reads the store's run listing)."""
        yield from iterate(self.store, self._list_rule(config, filter, before, limit))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async ``list``."""
        async for item in aiterate(self.store, self._list_rule(config, filter, before, limit)):
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
            RunnableConfig,
            drive(self.store, self._put_rule(config, checkpoint, metadata, new_versions)),
        )

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async ``put``."""
        rule = self._put_rule(config, checkpoint, metadata, new_versions)
        return cast(RunnableConfig, await adrive(self.store, rule))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes once per ``(task_id, idx)``; special channels overwrite."""
        drive(self.store, self._put_writes_rule(config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async ``put_writes``."""
        await adrive(self.store, self._put_writes_rule(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and head of the thread, in every namespace."""
        drive(self.store, self._delete_thread_rule(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async ``delete_thread``."""
        await adrive(self.store, self._delete_thread_rule(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is listed."""
        drive(self.store, self._delete_for_runs_rule(run_ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async ``delete_for_runs``."""
        await adrive(self.store, self._delete_for_runs_rule(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another, keeping ids."""
        drive(self.store, self._copy_thread_rule(source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async ``copy_thread``."""
        await adrive(self.store, self._copy_thread_rule(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's latest checkpoint (``keep_latest``) or none (``delete``).

        A thread using DeltaChannel keeps the latest checkpoint's ancestors too: their
        writes are what rebuilds its delta channels.

        Raises:
            ConfigError: ``strategy`` is neither ``keep_latest`` nor ``delete``.
        """
        drive(self.store, self._prune_rule(thread_ids, strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async ``prune``."""
        await adrive(self.store, self._prune_rule(thread_ids, strategy))

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
