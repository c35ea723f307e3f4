"""The LangGraph saver's reads and upkeep: get, list, delete, copy and prune, as rules."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import get_checkpoint_id

from ..._checkpoint import evolve
from ..._errors import ConfigError, ConflictError
from .._drive import Delete, Emit, Load, Rule, Save, Scan
from ._codec import kind_of, q
from ._writes import MAX_RETRIES, Writes


class Rules(Writes):
    """Every rule of the saver, each a generator of effects (``.._drive``)."""

    def _get_rule(self, config: RunnableConfig) -> Rule[Any]:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        cp_id = get_checkpoint_id(config)
        latest = not cp_id
        if not cp_id:
            ns_key = self._ns_key(thread_id, ns)
            head_record = yield Load(ns_key)
            head = kind_of(head_record, "head")
            # The next put from this read compares-and-swaps against this head.
            self.remember_head(ns_key, head_record if head is not None else None)
            if head is None or head.get("head") is None:
                return None
            cp_id = head["head"]
        key = self._cp_key(thread_id, ns, cp_id)
        record = kind_of((yield Load(key)), "checkpoint")
        if record is None:
            if get_checkpoint_id(config):
                return None
            # The head's checkpoint was deleted (delete_for_runs, a crash inside a
            # prune): the latest is the newest one left; repair the head to it.
            cp_id = yield from self._repair_head(thread_id, ns)
            if cp_id is None:
                return None
            key = self._cp_key(thread_id, ns, cp_id)
            record = kind_of((yield Load(key)), "checkpoint")
            if record is None:
                return None
        writes = kind_of((yield Load(key + "/writes")), "writes")
        return self._tuple(record, writes, latest=latest)

    def _repair_head(self, thread_id: str, ns: str) -> Rule[str | None]:
        """Point the namespace's head at its newest stored checkpoint; return its id."""
        ns_key = self._ns_key(thread_id, ns)
        keys = yield Scan(ns_key + "/")
        ids = sorted(
            p[2]
            for p in map(self._parse, keys)
            if p is not None and p[2] is not None and not p[3] and p[1] == ns
        )
        newest = ids[-1] if ids else None
        for _ in range(MAX_RETRIES):
            stored = yield Load(ns_key)
            head = kind_of(stored, "head")
            if head is None:
                return newest
            if head.get("head") == newest:
                return newest
            assert stored is not None
            try:
                yield Save(evolve(stored, state={**head, "head": newest}))
            except ConflictError:
                continue
            return newest
        return newest

    def _scan_rule(
        self, thread_id: str | None
    ) -> Rule[list[tuple[str, str, str | None, bool, str]]]:
        prefix = f"{self.prefix}/" if thread_id is None else f"{self.prefix}/{q(thread_id)}/"
        keys = yield Scan(prefix)
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
    ) -> Rule[Any]:
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
            record = kind_of((yield Load(key)), "checkpoint")
            if record is None:
                continue  # deleted since the scan
            if filter:
                meta = self._unpack(record["metadata"], f"checkpoint {_cp_id!r}")
                if not all(meta.get(k) == v for k, v in filter.items()):
                    continue
            writes = None
            if key + "/writes" in with_writes:
                writes = kind_of((yield Load(key + "/writes")), "writes")
            if remaining is not None:
                remaining -= 1
            yield Emit(self._tuple(record, writes))
        return None

    def _delete_keys(self, keys: Sequence[str]) -> Rule[Any]:
        # Checkpoints and writes first, heads last: a crash in between leaves a head
        # whose checkpoint is gone, which get_tuple repairs; never the other way round.
        for key in sorted(keys, key=lambda k: k.count("/"), reverse=True):
            yield Delete(key)

    def _delete_thread_rule(self, thread_id: str) -> Rule[Any]:
        entries = yield from self._scan_rule(thread_id)
        yield from self._delete_keys([key for *_, key in entries])

    def _delete_for_runs_rule(self, run_ids: Sequence[str]) -> Rule[Any]:
        wanted = set(run_ids)
        if not wanted:
            return None
        entries = yield from self._scan_rule(None)
        touched: set[tuple[str, str]] = set()
        for tid, ns, cp_id, is_writes, key in entries:
            if cp_id is None or is_writes:
                continue
            record = kind_of((yield Load(key)), "checkpoint")
            if record is None:
                continue
            meta = self._unpack(record["metadata"], f"checkpoint {cp_id!r}")
            if meta.get("run_id") in wanted:
                yield Delete(key + "/writes")
                yield Delete(key)
                touched.add((tid, ns))
        for tid, ns in sorted(touched):
            yield from self._repair_head(tid, ns)
        return None

    def _copy_thread_rule(self, source: str, target: str) -> Rule[Any]:
        entries = yield from self._scan_rule(source)
        heads: dict[str, str] = {}
        for _tid, ns, cp_id, is_writes, key in sorted(entries, key=lambda e: e[2] or ""):
            record = yield Load(key)
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
                yield Save(self._record(new_key, state, None))
        for ns, head_id in heads.items():
            yield from self._set_head(target, ns, head_id)
        return None

    def _set_head(self, thread_id: str, ns: str, head_id: str | None) -> Rule[Any]:
        ns_key = self._ns_key(thread_id, ns)
        for _ in range(MAX_RETRIES):
            stored = yield Load(ns_key)
            state = {"kind": "head", "thread_id": thread_id, "checkpoint_ns": ns, "head": head_id}
            record = (
                self._record(ns_key, state, None)
                if stored is None
                else evolve(stored, state={**stored.state, **state})
            )
            try:
                yield Save(record)
            except ConflictError:
                continue
            return None
        raise ConflictError(f"thread {thread_id!r}: the head kept changing")

    def _prune_rule(self, thread_ids: Sequence[str], strategy: str) -> Rule[Any]:
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
                head = kind_of((yield Load(self._ns_key(thread_id, ns))), "head")
                latest = head["head"] if head and head.get("head") in ids else ids[-1]
                keep = yield from self._ancestry(thread_id, ns, latest)
                for cp_id in ids:
                    if cp_id not in keep:
                        key = self._cp_key(thread_id, ns, cp_id)
                        doomed += [key + "/writes", key]
                yield from self._set_head(thread_id, ns, latest)
            yield from self._delete_keys(doomed)
        return None

    def _ancestry(self, thread_id: str, ns: str, latest: str) -> Rule[set[str]]:
        """The checkpoints ``keep_latest`` keeps: the latest, and for threads using
        LangGraph's DeltaChannel, its ancestors (their writes rebuild delta channels)."""
        keep = {latest}
        record = kind_of((yield Load(self._cp_key(thread_id, ns, latest))), "checkpoint")
        if record is None:
            return keep
        meta = self._unpack(record["metadata"], f"checkpoint {latest!r}")
        if not (isinstance(meta, dict) and meta.get("counters_since_delta_snapshot")):
            return keep
        parent = record.get("parent")
        while parent and parent not in keep:
            keep.add(parent)
            found = kind_of((yield Load(self._cp_key(thread_id, ns, parent))), "checkpoint")
            parent = found.get("parent") if found else None
        return keep
