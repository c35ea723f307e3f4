"""Writing a run's stream: ``emit`` inside a step, batched into fenced, write-once blocks.

An ``Attempt`` is what the driver makes for each step call (and ``ctx.step`` for each
call of a code workflow) and installs in a context variable while the step runs; the
first ``emit`` gives it a ``Writer``. ``emit`` only checks the event and appends a line
to a buffer; a thread of the writer's own appends the buffer to the store as blocks of
up to 64 KB, 100 ms after the first unflushed event or as soon as 64 KB wait, and the
attempt's end flushes the rest (before its step's checkpoint is saved, so that every
event of a committed attempt is stored before the commit). Only when 1 MB waits does
``emit`` flush itself: the store is slower than the step, which then waits for it.

An append is one create-only save of the next block number: two writers racing for a
number both learn the winner by the conflict. That conflict is also the fence: a writer
that finds the block it lost to written under a newer lease epoch has been taken over
and appends nothing more (its attempt cannot commit either: its checkpoint save is
fenced by the same epoch). Readers also drop a block older than the newest epoch seen.
"""

from __future__ import annotations

import secrets
import threading
from contextvars import ContextVar
from typing import Any

from .._errors import ConflictError, StoreError
from .._observe import logger
from .._store import Store
from ._events import (
    EmitOutsideStep,
    block_id,
    block_of_lines,
    check_topic,
    encode_data,
    encode_topic,
    line_head,
)

__all__ = [
    "BACKLOG_BYTES",
    "FLUSH_BYTES",
    "FLUSH_SECONDS",
    "Attempt",
    "current",
    "emit",
    "find_end",
]

#: A writer appends a block at most this long after an event was emitted...
FLUSH_SECONDS = 0.1
#: ...or as soon as this many bytes of events wait; no block holds much more.
FLUSH_BYTES = 64 * 1024
#: Past this many bytes waiting, ``emit`` flushes itself: the store is slower than the step.
BACKLOG_BYTES = 16 * FLUSH_BYTES
# The next free block of each run this process wrote to: a hint that spares the next
# attempt the search (a wrong hint only costs a few loads).
_ends: dict[tuple[int, str], int] = {}


def find_end(store: Store, run_id: str, hint: int = 0) -> int:
    """Return the number of the first missing block of ``run_id``'s stream.

    Blocks are numbered without gaps, so a galloping search from ``hint`` then a
    binary search costs O(log blocks) loads.
    """

    def exists(n: int) -> bool:
        return store.version_of(block_id(run_id, n)) is not None

    if hint > 0 and not exists(hint - 1):
        low, high = -1, hint - 1  # low exists (or is -1), high is missing
    else:
        low, step = hint - 1, 1
        while exists(low + step):
            low += step
            step *= 2
        high = low + step
    while high - low > 1:
        mid = (low + high) // 2
        if exists(mid):
            low = mid
        else:
            high = mid
    return high


def _chunks(lines: list[str]) -> list[list[str]]:
    """Return ``lines`` cut into blocks of at most ``FLUSH_BYTES`` (or one line, if longer)."""
    chunks: list[list[str]] = [[]]
    size = 0
    for line in lines:
        if size + len(line) > FLUSH_BYTES and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(line)
        size += len(line)
    return chunks


class Fenced(StoreError):
    """A newer owner of the run appended to its stream: this writer may not."""


class Writer:
    """The buffered events of one attempt, and the thread that flushes them."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.buffer: list[str] = []
        self.head = line_head(attempt.key, attempt.number, attempt.token)
        self.size = 0
        self.seq = 0
        self.wrote = False
        self.fenced = False
        self.error: BaseException | None = None
        self.lock = threading.Lock()  # guards buffer, size and seq
        self.wake = threading.Event()  # a batch began, or the writer is closing
        self.now = threading.Event()  # flush without waiting out the interval
        self.flushing = threading.Lock()  # one append at a time, in order
        self.closed = False
        self.thread: threading.Thread | None = None
        self.next: int | None = None  # the block after our last one
        self.topic: object = None  # the last topic checked (most events repeat it)...
        self.topic_json = ""  # ...and its JSON text

    def add(self, topic_json: str, text: str) -> None:
        with self.lock:
            # The event's line of its block, made now: a flush then only joins lines.
            line = f"{self.head}{self.seq},{topic_json},{text}]"
            self.buffer.append(line)
            self.seq += 1
            self.size += len(line)
            size = self.size
            begun = len(self.buffer) == 1
        if size >= BACKLOG_BYTES:
            # The flusher cannot keep up with the step: the step waits for a flush here
            # (back-pressure), rather than the buffer growing without bound.
            self.flush()
        elif begun or size >= FLUSH_BYTES:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name=f"stepstone-stream-{self.attempt.run_id}", daemon=True
                )
                self.thread.start()
            if size >= FLUSH_BYTES:
                self.now.set()  # a full block: no need to wait out the interval
            self.wake.set()

    def _run(self) -> None:
        # Wakes when a batch begins, waits out the flush interval (or less, when a block
        # is full or the writer closes), flushes; until closed. The step's thread only
        # appends to the buffer, so a slow store does not slow the step.
        while True:
            self.wake.wait()
            self.wake.clear()  # before the pause: what sets it meanwhile is seen next turn
            if self.closed:
                return
            # Real time, not the clock seam: a batching delay, not the program's time
            # (a background flush must not move a test's FakeClock, nor wait for it).
            self.now.wait(FLUSH_SECONDS)
            self.now.clear()
            if self.closed:
                return  # close() flushes the rest itself
            try:
                self.flush()
            except BaseException as exc:  # noqa: BLE001 - kept, raised by close()
                self.error = exc
                return

    def flush(self) -> None:
        """Append what is buffered, in blocks of up to ``FLUSH_BYTES`` (none if fenced)."""
        with self.flushing:
            with self.lock:
                events, self.buffer, self.size = self.buffer, [], 0
            if not events or self.fenced:
                return
            chunks = _chunks(events)
            for i, chunk in enumerate(chunks):
                try:
                    self._append(chunk)
                except Fenced:
                    self.fenced = True
                    logger.warning(
                        "run %r: stream events of step %s dropped: the run has a newer owner",
                        self.attempt.run_id,
                        self.attempt.key,
                    )
                    return
                except BaseException:
                    rest = [line for left in chunks[i:] for line in left]
                    with self.lock:  # put them back in front: a later flush may succeed
                        self.buffer[:0] = rest
                        self.size += sum(map(len, rest))
                    raise

    def _append(self, events: list[str]) -> None:
        a = self.attempt
        store, run_id = a.store, a.run_id
        where = (id(store), run_id)
        n = self.next
        if n is None:
            n = _ends.get(where)
            n = find_end(store, run_id, n or 0)
        while True:
            # The block before ours must not be a newer owner's: checked unless it is
            # our own (then it was checked before). A newer owner writing the same
            # number at once makes our create-only save conflict, checked below.
            if n > 0 and n != self.next:
                self._check(block_id(run_id, n - 1))
            try:
                store.save(block_of_lines(run_id, n, a.epoch, events))
            except ConflictError:
                self._check(block_id(run_id, n))
                n = find_end(store, run_id, n + 1)
                continue
            break
        self.next = n + 1
        self.wrote = True
        try:
            # Push to readers where the store has it (PostgreSQL: a NOTIFY on the
            # stream channel); a lost one only makes readers wait for their next poll.
            store.announce_stream(run_id)
        except StoreError as exc:
            logger.debug("run %r: stream readers not notified (%s)", run_id, exc)
        if len(_ends) > 4096:
            _ends.clear()
        _ends[where] = n + 1

    def _check(self, record_id: str) -> None:
        other = self.attempt.store.load(record_id)
        if other is not None and int(other.state.get("epoch", 0)) > self.attempt.epoch:
            raise Fenced(f"{record_id!r} was written by a newer owner of the run")

    def close(self) -> None:
        """Flush the rest and stop the thread; raise what a flush failed with."""
        self.closed = True
        self.now.set()
        self.wake.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        self.flush()


class Attempt:
    """One attempt of one step, while it runs: where its events go, made on first emit."""

    __slots__ = ("can_emit", "epoch", "key", "number", "run_id", "store", "token", "writer")

    def __init__(
        self, store: Store, run_id: str, key: str, epoch: int, number: int, can_emit: bool
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.key = key
        self.epoch = epoch
        self.number = number
        self.can_emit = can_emit
        self.token = ""
        self.writer: Writer | None = None

    def call(self, seq: int, number: int) -> Attempt:
        """Return the attempt of the call at ``seq`` of the code workflow this step runs."""
        return Attempt(self.store, self.run_id, f"{self.key}.{seq}", self.epoch, number, True)

    def emit(self, topic: object, data: object) -> None:
        if not self.can_emit:
            raise EmitOutsideStep(
                "emit() outside a step: in a code workflow, emit inside the function of a "
                "ctx.step call (code between calls re-runs on resume, and would emit again)"
            )
        text = encode_data(data)
        writer = self.writer
        if writer is None:
            self.token = secrets.token_hex(6)
            writer = self.writer = Writer(self)
        if topic is not writer.topic:
            writer.topic_json = encode_topic(check_topic(topic))
            writer.topic = topic
        writer.add(writer.topic_json, text)

    def close(self) -> str | None:
        """End the attempt: store its events; return its token if it stored any.

        Raises:
            StoreError: its events could not all be stored (the step must not commit).
        """
        self.can_emit = False
        writer = self.writer
        if writer is None:
            return None
        writer.close()
        return self.token if writer.wrote and not writer.fenced else None

    def abandon(self) -> None:
        """End a failed attempt: store what it can of its events, raise nothing."""
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - the step's own failure is what matters
            logger.warning("run %r: stream events of a failed attempt lost: %s", self.run_id, exc)


#: The attempt running in this context (set by the drivers and ``ctx.step``).
current: ContextVar[Attempt | None] = ContextVar("stepstone_stream_attempt", default=None)


def emit(topic: str, data: Any) -> None:
    """Append an event to the stream of the run whose step is running here.

    ``data`` is any JSON value up to ``MAX_EVENT_BYTES``. Events are stored in batches
    (every 100 ms or 64 KB, and when the step ends, before its checkpoint).

    Raises:
        EmitOutsideStep: no step is running in this context.
        InvalidState: ``data`` is not JSON (the message names the path).
        EventTooLarge: ``data`` is over the size limit.
        ConfigError: ``topic`` is not a non-empty str without control characters.
    """
    attempt = current.get()
    if attempt is None:
        raise EmitOutsideStep(
            "emit() outside a step: events are emitted by a running step (ctx.emit in a "
            "step list's step, or inside a code workflow's ctx.step function)"
        )
    attempt.emit(topic, data)
