"""The LangGraph saver's writes: checkpoints written once, the head, the owner lease.

What a ``put`` may do follows what its writer read (``AddressedId``): a writer that
loaded the namespace's latest checkpoint, or wrote the one before, must extend the head
(``_check_head``); a writer that asked for a checkpoint by id (time travel, a fork, a
subgraph's replay) may branch from it. The head is advanced last, by compare-and-swap,
and is the commit point of a ``put``.

A put with no parent starts a namespace. It creates the head by compare-and-swap (insert
if absent): of two first puts that both found no head, one creates it and the other is
refused (``CheckpointConflict``), never made the head over the winner. A put with no
parent that finds a head is a new root, as on LangGraph's own savers (the conformance
suite's puts; a subgraph replayed into a namespace it used after the replay point),
except an invoke's first checkpoint in the root namespace (``source="input"``, step
-1): LangGraph writes that only after loading nothing, so a head there was written by
another invoke since, which this one would silently replace.

Neither write loads first when the saver knows what is stored: the head it last wrote
or read (``get_tuple`` of the latest), the writes record it last wrote, or none for a
checkpoint it has not written writes for. Each is only a guess for a compare-and-swap:
a stale one fails it, and the rule loads and checks as it would have. A superstep is
then three records written in two calls and no load: the task's writes, then the
checkpoint and the head together (``Store.save_many``: one transaction and one commit on
SQLite, where LangGraph's own ``SqliteSaver`` also commits twice). The record is saved
before the head in that call; a record refused there (its id taken by other content)
puts back a head advanced with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    CheckpointMetadata,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.base import Checkpoint as LGCheckpoint

from ..._checkpoint import Checkpoint, evolve
from ..._errors import ConflictError, StoreError
from .._drive import Delete, Load, Rule, Save, SaveMany
from ._codec import AddressedId, Codec, kind_of, q
from ._errors import CheckpointConflict, ThreadOwned

# A compare-and-swap lost to a concurrent merge (parallel tasks' writes, a head being
# advanced) is retried; this many losses in a row means something is wrong.
MAX_RETRIES = 100
# Namespaces whose head (and latest writes record) a saver remembers; past this, it
# forgets them all. A forgotten one costs a load on its next write, nothing more.
_REMEMBERED = 1024


class _Unknown(Exception):
    """No head is remembered for the namespace: load it."""


class Writes(Codec):
    """The write rules; ``StepstoneSaver`` sets the owner attributes."""

    owner: str | None
    lease: float
    clock: Callable[[], datetime]
    # Per namespace key: the head record this saver last wrote or read, and the writes
    # record it last wrote. Guesses for compare-and-swap, which saves a load per write.
    _heads: dict[str, Checkpoint]
    _writes: dict[str, Checkpoint]

    def _put_rule(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Rule[Any]:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        read = conf.get("checkpoint_id") or None
        # A parent its writer asked for by id may have other children; any other parent
        # is the head the writer loaded or wrote, and the write is a compare-and-swap on it.
        branch = isinstance(read, AddressedId)
        parent = str(read) if read else None
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
        key = f"{ns_key}/{q(cp_id)}"  # _cp_key, without encoding the namespace twice
        # An invoke's first checkpoint of the thread: its writer loaded no checkpoint.
        fresh = ns == "" and metadata.get("source") == "input" and metadata.get("step") == -1
        # The head this saver last wrote or read stands in for a load: the head's save
        # below is a compare-and-swap on its version, so a stale guess costs a retry,
        # never a wrong write. A guess that fails the check is verified by a load.
        head_record = self._heads.get(ns_key)
        try:
            if head_record is None:
                raise _Unknown
            self._check_head(head_record, thread_id, ns, parent, cp_id, branch, fresh)
        except (_Unknown, CheckpointConflict):
            head_record = yield Load(ns_key)
            self._check_head(head_record, thread_id, ns, parent, cp_id, branch, fresh)
        # Insert-if-absent: a checkpoint id is written once. The same content again is
        # a retry of a put whose answer was lost, and succeeds. The head is advanced in
        # the same call (``SaveMany``: one transaction and one commit on SQLite), after
        # the record; should the record be refused, a head advanced with it is put back.
        record = self._record(key, state, None)
        head_new = self._advanced(head_record, ns_key, thread_id, ns, cp_id)
        lost: ConflictError | None = None
        if head_new is None:  # the head names this checkpoint already: a retried put
            try:
                yield Save(record)
            except ConflictError:
                yield from self._same_record(key, state, where, thread_id, ns, cp_id)
        else:
            record_out, head_out = yield SaveMany((record, head_new))
            if isinstance(record_out, Exception):
                try:
                    if not isinstance(record_out, ConflictError):
                        raise record_out
                    yield from self._same_record(key, state, where, thread_id, ns, cp_id)
                except Exception:
                    if isinstance(head_out, Checkpoint):
                        yield from self._put_back(ns_key, head_out, head_record)
                    raise
            if isinstance(head_out, Checkpoint):
                self.remember_head(ns_key, head_out)
                return self._config(thread_id, ns, cp_id)
            if not isinstance(head_out, ConflictError):
                raise head_out
            lost = head_out
        # The head's compare-and-swap lost (or was not tried): load it, check, retry.
        # A writer that loses the race here leaves its record behind unreferenced and
        # removes it.
        for _ in range(MAX_RETRIES):
            try:
                if lost is not None:
                    raise lost
                head_new = self._advanced(head_record, ns_key, thread_id, ns, cp_id)
                stored = head_record if head_new is None else (yield Save(head_new))
                self.remember_head(ns_key, stored)
                break
            except ConflictError:
                lost = None
                self._heads.pop(ns_key, None)
                # This put found no head, and another writer made one since: it started
                # the namespace afresh too, so this one must not replace its head.
                fresh = fresh or head_record is None
                head_record = yield Load(ns_key)
                try:
                    self._check_head(head_record, thread_id, ns, parent, cp_id, branch, fresh)
                except CheckpointConflict:
                    yield Delete(key)
                    raise
        else:  # pragma: no cover - only under a pathological stream of concurrent writes
            raise ConflictError(f"{where}: the head kept changing; {MAX_RETRIES} attempts")
        return self._config(thread_id, ns, cp_id)

    def _advanced(
        self, head_record: Checkpoint | None, ns_key: str, thread_id: str, ns: str, cp_id: str
    ) -> Checkpoint | None:
        """The head record naming ``cp_id`` to save over ``head_record``; None if it does."""
        if head_record is None:
            head_state = {
                "kind": "head",
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "head": cp_id,
            }
            return self._lease(self._record(ns_key, head_state, None))
        head = head_record.state
        if head.get("head") == cp_id:
            return None
        return self._lease(evolve(head_record, state={**head, "head": cp_id}))

    def _same_record(
        self, key: str, state: dict[str, Any], where: str, thread_id: str, ns: str, cp_id: str
    ) -> Rule[None]:
        """After a refused insert of checkpoint ``key``: succeed if the stored record has
        the same content (a retried put), else raise ``CheckpointConflict``."""
        existing = kind_of((yield Load(key)), "checkpoint")
        if existing is None or existing != state:
            raise CheckpointConflict(
                f"{where} (namespace {ns!r}) is already stored with other content; "
                "a checkpoint id is written once. Another writer is driving this thread",
                thread_id,
                ns,
                cp_id,
            )

    def _put_back(self, ns_key: str, landed: Checkpoint, before: Checkpoint | None) -> Rule[None]:
        """Undo a head advanced with a checkpoint record that was refused (best effort:
        a head another writer moved since is theirs, and is left alone). Only the head's
        pointer goes back: usage charged with it stays, as the calls it counts were made
        (and their refs keep a later put from charging them again)."""
        self._heads.pop(ns_key, None)
        try:
            if before is None:
                yield Delete(ns_key, landed.version)
            else:
                yield Save(evolve(landed, state={**landed.state, "head": before.state["head"]}))
        except StoreError:
            pass

    def remember_head(self, ns_key: str, record: Checkpoint | None) -> None:
        """Keep ``record`` as the namespace's head last seen (None: forget it)."""
        if record is None:
            self._heads.pop(ns_key, None)
            return
        if len(self._heads) >= _REMEMBERED and ns_key not in self._heads:
            self._heads.clear()  # many threads: start afresh rather than grow
        self._heads[ns_key] = record

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
        fresh: bool = False,
    ) -> None:
        """Refuse a write that does not extend what the namespace's head says.

        ``fresh``: the writer found the namespace empty, so with no parent it may only
        start it, not replace a head another writer made meanwhile.
        """
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
        if branch or latest in (cp_id, parent):
            return
        if parent is None:
            if not fresh or latest is None:
                return
            raise CheckpointConflict(
                f"thread {thread_id!r} (namespace {ns!r}) was started with checkpoint "
                f"{latest!r} by another writer while this one started it afresh (two first "
                "invokes of one new thread, say). Nothing of this one was kept; invoke "
                "again to continue from the thread's latest checkpoint",
                thread_id,
                ns,
                None,
            )
        raise CheckpointConflict(
            f"thread {thread_id!r} (namespace {ns!r}) advanced to checkpoint {latest!r} "
            f"while this writer continued from {parent!r}: another process is driving "
            "this thread. Nothing was written; reload the thread before continuing "
            "(a writer that loads a checkpoint by its id, as time travel does, may "
            "branch from it)",
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
    ) -> Rule[Any]:
        conf = config["configurable"]
        thread_id, ns, cp_id = (
            conf["thread_id"],
            conf.get("checkpoint_ns", ""),
            conf["checkpoint_id"],
        )
        ns_key = self._ns_key(thread_id, ns)
        key = f"{ns_key}/{q(cp_id)}/writes"  # _cp_key's, without encoding ns_key twice
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
        # First guess without a load: the writes record this saver last wrote, or, for
        # a checkpoint it has not written any for, none yet (an insert-if-absent).
        # A wrong guess fails the compare-and-swap and the loop loads.
        remembered = self._writes.get(ns_key)
        guess = remembered if remembered is not None and remembered.run_id == key else None
        guessing = True
        for _ in range(MAX_RETRIES):
            if guessing:
                stored = guess
            else:
                stored = yield Load(key)
            current = kind_of(stored, "writes")
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
                if guessing and guess is not None:
                    guessing = False  # the guess may be stale: confirm with a load
                    continue
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
                saved = yield Save(record)
            except ConflictError:
                guessing = False
                self._writes.pop(ns_key, None)
                continue  # a parallel task's writes landed first: merge again
            if len(self._writes) >= _REMEMBERED and ns_key not in self._writes:
                self._writes.clear()
            self._writes[ns_key] = saved
            return None
        raise ConflictError(f"{where}: writes kept conflicting; {MAX_RETRIES} attempts")
