"""Reading a run's stream: ``stream`` and ``astream``, from any process.

A reader loads the blocks after its offset (one load each, until the first missing
one), then the run's checkpoint, and shows each event whose attempt is visible:

- of a committed step, only the attempt that committed it (the checkpoint's
  ``streams`` for a step list's step, the journal entry's ``stream`` for a code
  workflow's call); a step that committed without events shows none;
- of a step not committed yet, only its latest attempt (the live one);
- a block written under an older lease epoch than one before it (a frozen former
  owner's) never counts.

Hidden events are dropped, or shown with ``superseded=True`` on request. Reading the
checkpoint after the blocks means an attempt that committed before that read is judged
committed. Each look asks for the run's version and loads the run only when it changed.
The reader follows while the run is active, woken by the store's listener where it has
one (SQLite's ``data_version`` watch, the file store's inotify, PostgreSQL's ``LISTEN``
on the stream channel writers ``NOTIFY`` after each flush) and polling with
back-off otherwise, and ends after the run is at rest and its last blocks are read.
The rule is written once (``_Follow``); ``stream`` and ``astream`` only do the I/O.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .._checkpoint import Checkpoint
from .._errors import RunNotFound, StoreError
from .._journal import JOURNAL_KEY
from .._observe import logger
from .._store import Store
from ._events import StreamEvent, block_events, block_id, parse_id

__all__ = ["astream", "stream"]

#: Seconds between two looks: the first after activity, doubling to the last.
FIRST_POLL = 0.005
MAX_POLL = 0.05
_AT_REST = frozenset({"done", "failed", "cancelled"})


class _Follow:
    """What a reader has read and how it judges events: the rule, without I/O."""

    def __init__(self, run_id: str, topic: str | None, after: str | None, superseded: bool):
        self.run_id = run_id
        self.topic = topic
        self.superseded = superseded
        block, index = parse_id(after)
        # Re-read the block of ``after`` (write-once: the same events) and skip to it.
        self.next = max(block, 0)
        self.skip = (block, index)
        self.pending: list[tuple[int, list[list[Any]], int]] = []
        self.max_epoch = 0
        self.latest: dict[str, str] = {}
        self.cp: Checkpoint | None = None

    def current(self, version: str | None) -> Checkpoint | None:
        """Return the checkpoint read before if ``version`` is still its version, else None.

        A look costs a version query, not a load of the run's whole state, while the
        run does not change (a step streaming for minutes, say).
        """
        cp = self.cp
        return cp if cp is not None and version is not None and cp.version == version else None

    def remember(self, cp: Checkpoint | None) -> None:
        self.cp = cp

    def loaded(self, n: int, record: Checkpoint | None) -> bool:
        """Take block ``n`` as loaded; return whether to load the next one."""
        if record is None:
            return False
        self.pending.append((n, block_events(record.state), int(record.state.get("epoch", 0))))
        self.next = n + 1
        return True

    def judge(self, cp: Checkpoint | None) -> list[StreamEvent]:
        """Return the visible events of the blocks read since, judged by ``cp``."""
        blocks, self.pending = self.pending, []
        fenced: list[bool] = []
        for _, events, epoch in blocks:
            # A block older than one before it is a frozen former owner's: never counts.
            fenced.append(epoch < self.max_epoch)
            self.max_epoch = max(self.max_epoch, epoch)
            if not fenced[-1]:
                for ev in events:  # each step's latest attempt, in stream order
                    self.latest[ev[0]] = ev[2]
        journal = _journal(cp)
        out: list[StreamEvent] = []
        for (n, events, _), stale in zip(blocks, fenced, strict=True):
            for i, ev in enumerate(events):
                if (n, i) <= self.skip:
                    continue
                key, attempt, token, seq, topic, data = ev
                if self.topic is not None and topic != self.topic:
                    continue
                hidden = stale or not self._visible(cp, journal, key, token)
                if hidden and not self.superseded:
                    continue
                out.append(StreamEvent(f"{n}.{i}", topic, data, key, attempt, seq, hidden))
        return out

    def _visible(
        self, cp: Checkpoint | None, journal: dict[int, Any] | None, key: str, token: str
    ) -> bool:
        step, dot, call = key.partition(".")
        if cp is not None:
            if not dot:
                if cp.step >= int(step):
                    return cp.streams.get(key) == token
            elif journal is not None and int(call) in journal:
                return bool(journal[int(call)] == token)
            elif cp.step >= int(step):
                return False  # the code step ended: a call it never journaled
        return self.latest.get(key) == token


def _journal(cp: Checkpoint | None) -> dict[int, Any] | None:
    """Return a code workflow run's journaled calls: seq -> the committed attempt's token."""
    if cp is None:
        return None
    entries = cp.state.get(JOURNAL_KEY)
    if not isinstance(entries, list):
        return None
    return {
        e["seq"]: e.get("stream")
        for e in entries
        if isinstance(e, dict) and type(e.get("seq")) is int
    }


def _not_found(run_id: str) -> RunNotFound:
    return RunNotFound(f"no run {run_id!r} (and no stream of it) in this store", run_id)


def stream(
    store: Store,
    run_id: str,
    topic: str | None = None,
    after: str | None = None,
    *,
    superseded: bool = False,
    follow: bool = True,
) -> Iterator[StreamEvent]:
    """Yield the events of ``run_id``'s stream after the event id ``after``, then live.

    Shows exactly the events of the attempts that committed their steps, plus those of
    the step running now (see the module docstring); ``superseded=True`` shows the
    others too, marked. Ends once the run is done, failed or cancelled (or deleted)
    and every stored event is yielded; with ``follow=False``, once the stored events
    are. Resume after a disconnect with ``after=`` the last id seen: nothing is lost or
    repeated.

    Raises:
        RunNotFound: neither the run nor a stream of it exists.
        ConfigError: ``after`` is not an event id.
        StoreError: the store failed (a reader may resume from its last id).
    """
    reader = _Follow(run_id, topic, after, superseded)
    woken = threading.Event()
    listener: Any = None
    wait = FIRST_POLL
    first = True
    try:
        while True:
            while reader.loaded(reader.next, store.load(block_id(run_id, reader.next))):
                pass
            cp = reader.current(store.version_of(run_id)) or store.load(run_id)
            reader.remember(cp)
            if first and cp is None and not reader.pending and reader.next == 0:
                raise _not_found(run_id)
            first = False
            events = reader.judge(cp)
            yield from events
            if cp is None or cp.status in _AT_REST or not follow:
                # Blocks flushed before that save are all stored now: one last sweep.
                while reader.loaded(reader.next, store.load(block_id(run_id, reader.next))):
                    pass
                yield from reader.judge(cp)
                return
            if listener is None:
                listener = _listen(store, run_id, woken.set)
            wait = FIRST_POLL if events else min(wait * 2, MAX_POLL)
            # Real time, as the writer's flushes: a FakeClock a test installed would
            # otherwise park a reader until the test moves it.
            woken.wait(wait)
            woken.clear()
    finally:
        if listener is not None:
            listener.close()


class _Nothing:
    def close(self) -> None:
        pass


def _listen(store: Store, run_id: str, ring: Callable[[], None]) -> Any:
    # The store's cross-process listener for streams rings on every write (SQLite's
    # data_version, the file store's inotify) or on every flush (PostgreSQL's stream
    # channel, one connection a process shared by its readers, rung for this run's
    # flushes): a ring cuts the wait short; the poll runs either way.
    try:
        return store.listen_stream(ring, run_id=run_id) or _Nothing()
    except StoreError as exc:
        logger.debug("stream of a run: no listener (%s); polling", exc)
        return _Nothing()


def _ring_in(loop: Any, woken: Any) -> Callable[[], None]:
    """A ring for a listener's thread that sets ``woken`` on ``loop`` (once it is open)."""

    def ring() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(woken.set)

    return ring


async def astream(
    store: Store,
    run_id: str,
    topic: str | None = None,
    after: str | None = None,
    *,
    superseded: bool = False,
    follow: bool = True,
) -> AsyncIterator[StreamEvent]:
    """``stream``, for ``async for``: the store's async methods, an async back-off.

    Raises:
        RunNotFound: neither the run nor a stream of it exists.
        ConfigError: ``after`` is not an event id.
        StoreError: the store failed (a reader may resume from its last id).
    """
    import asyncio  # noqa: PLC0415 - deferred (~40 ms) for sync users, as ``_store`` does

    reader = _Follow(run_id, topic, after, superseded)
    wait = FIRST_POLL
    first = True
    woken = asyncio.Event()
    listener: Any = None
    try:
        while True:
            while reader.loaded(reader.next, await store.aload(block_id(run_id, reader.next))):
                pass
            cp = reader.current(await asyncio.to_thread(store.version_of, run_id))
            if cp is None:
                cp = await store.aload(run_id)
            reader.remember(cp)
            if first and cp is None and not reader.pending and reader.next == 0:
                raise _not_found(run_id)
            first = False
            events = reader.judge(cp)
            for event in events:
                yield event
            if cp is None or cp.status in _AT_REST or not follow:
                while reader.loaded(reader.next, await store.aload(block_id(run_id, reader.next))):
                    pass
                for event in reader.judge(cp):
                    yield event
                return
            if listener is None:
                listener = _listen(store, run_id, _ring_in(asyncio.get_running_loop(), woken))
            wait = FIRST_POLL if events else min(wait * 2, MAX_POLL)
            # Real time, as in ``stream``; a ring cuts the wait short.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wait)
            woken.clear()
    finally:
        if listener is not None:
            listener.close()
