"""``StepstoneSession``: the SDK's conversation memory, every change a compare-and-swap."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from ..._checkpoint import Checkpoint, evolve
from ..._errors import ConflictError, InvalidWorkflow
from ..._store import Store
from .._drive import asave
from ._journal import (
    FORMAT,
    MAX_TRIES,
    MISSING,
    Journal,
    backoff,
    done_record,
    journal_var,
    record_id,
    scope_var,
    to_json,
)


def _session_head_id(session_id: str) -> str:
    return record_id(f"session:{session_id}")


def _session_page_id(session_id: str, key: str) -> str:
    return record_id(f"session-page:{key}:{session_id}")


def _size(items: list[Any]) -> int:
    return len(json.dumps(items, ensure_ascii=False, separators=(",", ":")))


def _settings(value: SessionSettings | dict[str, Any] | None) -> SessionSettings:
    if value is None:
        return SessionSettings()
    try:
        return coerce_session_settings(value)
    except (TypeError, ValueError) as exc:
        # InvalidWorkflow is a TypeError too, so code written for the SDK's sessions
        # (``except TypeError``) still catches it.
        raise InvalidWorkflow(
            f"session_settings: {exc}; allowed: a SessionSettings, a dict with the "
            f"keys {sorted(f.name for f in dataclasses.fields(SessionSettings))}, or None"
        ) from exc


class StepstoneSession:
    """The SDK's ``Session`` (conversation memory) in a stepstone store, on every backend.

    Every change is one compare-and-swap on the session's head record, retried on
    conflict, so concurrent turns (threads, tasks, processes) never interleave a batch
    or lose an item. When the head's items pass ``page_bytes`` of JSON, the older ones
    move to a write-once page record, so no record grows past a backend's limit (Cosmos
    DB: 2 MB). Inside a stepstone agent run, reads are journaled and writes applied once
    per run (a replay neither sees the history its crashed attempt added nor adds it
    again).

    Args:
        session_id: The conversation's id (a non-empty str).
        store: The stepstone store that keeps it.
        page_bytes: JSON size of the head's items past which older items move to a page.
        session_settings: As for the SDK's own sessions: a ``SessionSettings`` or a dict
            of its fields (``{"limit": 20}``), ``SessionSettings()`` when None; its
            ``limit`` applies to ``get_items()`` called without one.

    Raises:
        InvalidWorkflow: a bad argument, or a ``session_settings`` dict with an unknown
            key (also a ``TypeError``, as the SDK raises).

    Example:
        ``session = StepstoneSession("chat-42", store)``, then
        ``StepstoneRunner.run(store, run_id, agent, text, session=session)`` or the SDK's own
        ``Runner.run(agent, text, session=session)``.
    """

    #: Write ids (of writes made inside durable runs) the head remembers, newest last.
    APPLIED_KEPT = 64

    def __init__(
        self,
        session_id: str,
        store: Store,
        *,
        page_bytes: int = 256_000,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidWorkflow(f"session_id must be a non-empty str, got {session_id!r}")
        if not isinstance(store, Store):
            raise InvalidWorkflow(f"store must be a stepstone Store, got {type(store).__name__}")
        if isinstance(page_bytes, bool) or not isinstance(page_bytes, int) or page_bytes < 1:
            raise InvalidWorkflow(f"page_bytes must be a positive int, got {page_bytes!r}")
        self.session_id = session_id
        self.store = store
        self.page_bytes = page_bytes
        # As the SDK's own sessions do: a dict becomes ``SessionSettings`` (unknown keys
        # refused), and None the default ``SessionSettings()``, which the SDK's runner
        # reads (and ``resolve``s against ``RunConfig.session_settings``) on every turn.
        self.session_settings: SessionSettings | None = _settings(session_settings)
        self.head_id = _session_head_id(session_id)
        #: Compare-and-swap conflicts met (and retried) by this object's writes.
        self.conflicts = 0

    def _empty(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "session": self.session_id,
            "items": [],
            "pages": [],
            "next_page": 1,
            "applied": [],
        }

    async def _head(self) -> tuple[Checkpoint | None, dict[str, Any]]:
        cp = await self.store.aload(self.head_id)
        if cp is None:
            return None, self._empty()
        if cp.state.get("session") != self.session_id:
            raise ConflictError(
                f"record {self.head_id!r} exists but is not the head of session "
                f"{self.session_id!r}",
                self.head_id,
            )
        return cp, cp.state

    async def _heads(self) -> AsyncIterator[tuple[Checkpoint | None, dict[str, Any]]]:
        """Yield the head (``_head``) up to ``MAX_TRIES`` times: each change is a loop over
        it, and a try the caller does not end (a conflict, a page gone) backs off first."""
        for attempt in range(MAX_TRIES):
            yield await self._head()
            await backoff(attempt)

    def _contended(self, what: str = f"{MAX_TRIES} other writers got in first") -> ConflictError:
        """The error once every try of ``_heads`` lost to other writers."""
        return ConflictError(f"session {self.session_id!r}: {what}", self.head_id)

    async def _commit(self, cp: Checkpoint | None, state: dict[str, Any]) -> bool:
        """Save ``state`` as the head over ``cp``; return False on a conflict (retry)."""
        intended = done_record(self.head_id, state) if cp is None else evolve(cp, state=state)
        try:
            await asave(self.store, intended)  # a lost answer: the same object again
        except ConflictError:
            self.conflicts += 1
            return False
        return True

    async def _drop_pages(self, keys: list[str]) -> None:
        # Best effort: a page no head refers to is never read; a failed delete leaves
        # a dead record, not a wrong session.
        for key in keys:
            with contextlib.suppress(Exception):
                await self.store.adelete(_session_page_id(self.session_id, key))

    async def _write_page(self, seq: int, items: list[Any]) -> str:
        """Create a page of ``items``; return its key, ``SEQ-RANDOM``.

        The random part makes every writer's page its own: a writer that loses the head's
        compare-and-swap deletes only the page it made, never one another head refers to.
        """
        key = f"{seq}-{os.urandom(6).hex()}"
        state = {"format": FORMAT, "session": self.session_id, "items": items}
        await self.store.asave(done_record(_session_page_id(self.session_id, key), state))
        return key

    @staticmethod
    def _write_id() -> tuple[Journal, str] | None:
        journal = journal_var.get()
        if journal is None:
            return None
        return journal, journal.next_name(f"{scope_var.get()}session.write")

    @staticmethod
    def _applied(state: dict[str, Any], write: tuple[Journal, str] | None) -> Any:
        if write is None:
            return MISSING
        journal, key = write
        wid = f"{journal.run_id}/{journal.step_name}/{journal.run_created}/{key}"
        for applied, result in state.get("applied", []):
            if applied == wid:
                return result
        return MISSING

    def _remember(
        self, state: dict[str, Any], write: tuple[Journal, str] | None, result: Any
    ) -> None:
        if write is not None:
            journal, key = write
            wid = f"{journal.run_id}/{journal.step_name}/{journal.run_created}/{key}"
            state["applied"] = [*state.get("applied", []), [wid, result]][-self.APPLIED_KEPT :]

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """Return the history, oldest first; with ``limit``, only the newest ``limit`` items."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidWorkflow(f"limit must be an int or None, got {limit!r}")
        journal = journal_var.get()
        if journal is not None:
            scope = scope_var.get()
            key = journal.next_name(f"{scope}session.get_items")
            found = journal.get(key)
            if found is not MISSING:
                return list(found["items"])
            items = await self._read(limit)
            recorded = await journal.put(key, {"items": items})
            return list(recorded["items"])
        return await self._read(limit)

    async def _read(self, limit: int | None) -> list[Any]:
        if limit is not None and limit <= 0:
            return []
        async for _, state in self._heads():
            items = list(state["items"])
            complete = True
            for seq, _count in reversed(state["pages"]):
                if limit is not None and len(items) >= limit:
                    break
                page = await self.store.aload(_session_page_id(self.session_id, seq))
                if page is None:  # dropped by a pop or clear since we read the head
                    complete = False
                    break
                items = list(page.state["items"]) + items
            if complete:
                return items if limit is None else items[-limit:]
        raise self._contended("changed too often to be read")

    async def add_items(self, items: list[Any]) -> None:
        """Append ``items`` (one batch, kept together and in order) to the history."""
        if not isinstance(items, list):
            raise InvalidWorkflow(f"items must be a list, got {type(items).__name__}")
        batch = to_json(items, "the session items")
        if not batch:
            return
        write = self._write_id()
        async for cp, state in self._heads():
            if self._applied(state, write) is not MISSING:
                return
            new = dict(state)
            old = list(state["items"])
            new["items"] = old + batch
            moved: str | None = None
            if old and _size(new["items"]) > self.page_bytes:
                # The head's older items become a page; the head keeps this batch.
                moved = await self._write_page(state["next_page"], old)
                new["pages"] = [*state["pages"], [moved, len(old)]]
                new["next_page"] = state["next_page"] + 1
                new["items"] = batch
            self._remember(new, write, None)
            if await self._commit(cp, new):
                return
            if moved is not None:
                await self._drop_pages([moved])
        raise self._contended()

    async def pop_item(self) -> Any:
        """Remove and return the newest item, or None when the history is empty."""
        write = self._write_id()
        async for cp, state in self._heads():
            done = self._applied(state, write)
            if done is not MISSING:
                return done
            new = dict(state)
            items = list(state["items"])
            dropped: list[str] = []
            if not items and state["pages"]:
                seq = state["pages"][-1][0]
                page = await self.store.aload(_session_page_id(self.session_id, seq))
                if page is None:
                    continue
                items = list(page.state["items"])
                new["pages"] = state["pages"][:-1]
                dropped = [seq]
            if not items:
                return None
            popped = items.pop()
            new["items"] = items
            self._remember(new, write, popped)
            if await self._commit(cp, new):
                await self._drop_pages(dropped)
                return popped
        raise self._contended()

    async def clear_session(self) -> None:
        """Remove every item of the session."""
        write = self._write_id()
        async for cp, state in self._heads():
            if cp is None or self._applied(state, write) is not MISSING:
                return
            new = {**self._empty(), "next_page": state["next_page"], "applied": state["applied"]}
            self._remember(new, write, None)
            if await self._commit(cp, new):
                await self._drop_pages([seq for seq, _ in state["pages"]])
                return
        raise self._contended()
