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
from dataclasses import dataclass, field
from typing import Any, cast

from .._errors import ConflictError, StoreError
from .._observe import logger
from .._store import Store
from ._events import (
    TOKEN_CHARS,
    TOKEN_RUN,
    EmitOutsideStep,
    _encode_str,
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


def _chunks(text: str) -> list[str]:
    """Return ``text`` (lines, each ended by a newline) cut at line ends into blocks of at
    most ``FLUSH_BYTES`` characters (or one line, if longer), without their last newline."""
    chunks: list[str] = []
    start, end = 0, len(text)
    while start < end:
        cut = text.rfind("\n", start, start + FLUSH_BYTES + 1)
        if cut < start:
            cut = text.index("\n", start)  # one line longer than a block
        chunks.append(text[start:cut])
        start = cut + 1
    return chunks


def _token_lines(head: str, first: int, topic_json: str, tokens: list[str]) -> str:
    """Return the lines of ``tokens`` (seq ``first`` on, all of one topic), each ended by a
    newline: ``TOKEN_RUN`` tokens a line, their JSON made by C loops."""
    out = []
    for i in range(0, len(tokens), TOKEN_RUN):
        data = ",".join(map(_encode_str, tokens[i : i + TOKEN_RUN]))
        out.append(f"{head}{first + i},{topic_json},[{data}],1]\n")
    return "".join(out)


class Fenced(StoreError):
    """A newer owner of the run appended to its stream: this writer may not."""


# What the step's thread adds to its estimate of the bytes waiting, per event, on top of
# the data's length: about what a line's head costs (``[key,attempt,token,seq,topic,``),
# and what a token costs in a line of tokens (its quotes and comma).
_LINE = 32
_TOKEN = 3
# A writer's ``topic`` once its attempt ended: no topic is this object, so every later
# ``emit`` takes the checked path, which refuses it.
_ENDED = object()


class Writer:
    """The buffered events of one attempt, and the thread that flushes them.

    The step's thread pays as little as it can per event: a short ASCII str under the
    topic of the event before (a model's tokens) is appended to ``buffer`` as it is,
    with no lock, no clock read and no line made; any other event is checked and
    encoded at once (refused at ``emit``, naming the path) and appended as a
    placeholder whose ``(topic, text)`` waits in ``specials`` under its seq. The lines
    are made at the flush, a batch at a time (``_lines``). ``buffer`` is only appended
    to by the step's thread and only cut from the front by a flush (both single list
    operations), so neither needs a lock for it; ``lock`` guards the rest shared with
    the flusher: ``taken``, ``specials``, ``mark`` and ``idle``.
    """

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.buffer: list[str | None] = []
        self.head = line_head(attempt.key, attempt.number, attempt.token)
        self.specials: dict[int, tuple[str, str]] = {}  # seq -> (topic JSON, data JSON)
        self.taken = 0  # events the flushes took from the buffer (the next one's seq)
        self.size = 0  # estimated bytes emitted (the step's thread alone writes it)...
        self.flushed = 0  # ...and taken by flushes (written under ``flushing`` alone)
        self.mark = -1  # ``size`` at which ``emit`` next calls ``kick``
        self.idle = False  # the flusher waits for ``wake`` (nothing was buffered)
        self.unsent = ""  # lines of a failed append, sent first next time
        self.line_topic = ""  # the topic JSON of the last line made
        self.wrote = False
        self.fenced = False
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.wake = threading.Event()  # events wait, or the writer is closing
        self.now = threading.Event()  # flush without waiting out the interval
        self.flushing = threading.Lock()  # one append at a time, in order
        self.closed = False
        self.next: int | None = None  # the block after our last one
        self.topic: object = None  # the topic of the last event...
        self.topic_json = ""  # ...and its JSON text
        self.thread = threading.Thread(
            target=self._run, name=f"stepstone-stream-{attempt.run_id}", daemon=True
        )
        self.wake.set()
        self.thread.start()

    def special(self, topic_json: str, text: str) -> None:
        """Buffer a checked event that is not a plain token (the step's thread)."""
        with self.lock:
            self.specials[self.taken + len(self.buffer)] = (topic_json, text)
            self.buffer.append(None)
        self.size += len(text) + _LINE
        if self.size >= self.mark:
            self.kick()

    def kick(self) -> None:
        """Wake the flusher if idle, hurry it past a full block, or flush past the backlog.

        Called by the step's thread once ``size`` passes ``mark``: after each flush (the
        flusher sets ``mark`` to -1) and every ``FLUSH_BYTES`` emitted meanwhile.
        """
        with self.lock:
            if self.idle:
                self.idle = False
                self.wake.set()
            waiting = self.size - self.flushed
            if waiting >= FLUSH_BYTES:
                self.now.set()  # a full block: no need to wait out the interval
            self.mark = self.size + FLUSH_BYTES
        if waiting >= BACKLOG_BYTES:
            # The flusher cannot keep up with the step: the step waits for a flush here
            # (back-pressure), rather than the buffer growing without bound.
            self.flush()

    def _run(self) -> None:
        # Waits for events, waits out the flush interval (or less, when a block is full
        # or the writer closes), flushes; idles when nothing more waits; until closed.
        # The step's thread only appends to the buffer, so a slow store does not slow it.
        while True:
            self.wake.wait()
            self.wake.clear()
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
            with self.lock:
                # ``mark`` first, the buffer second; ``emit`` appends first and reads
                # ``mark`` second: either this sees its event or it calls ``kick``.
                self.mark = -1
                if self.buffer:
                    self.wake.set()
                else:
                    self.idle = True

    def flush(self) -> None:
        """Append what is buffered, in blocks of up to ``FLUSH_BYTES`` (none if fenced)."""
        with self.flushing:
            with self.lock:
                count = len(self.buffer)
                items = self.buffer[:count]
                del self.buffer[:count]
                base, self.taken = self.taken, self.taken + count
                specials, self.specials = self.specials, {}
            self.flushed += sum(map(len, filter(None, items))) + _TOKEN * count
            self.flushed += sum(len(text) + _LINE - _TOKEN for _, text in specials.values())
            text = self.unsent + self._lines(items, base, specials)
            self.unsent = ""
            if not text or self.fenced:
                return
            chunks = _chunks(text)
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
                    # Kept, in order, for the next flush: a later one may succeed.
                    self.unsent = "".join(chunk + "\n" for chunk in chunks[i:])
                    raise

    def _lines(
        self, items: list[str | None], base: int, specials: dict[int, tuple[str, str]]
    ) -> str:
        """Return the lines of ``items`` (seq ``base`` on), each ended by a newline."""
        # Between two placeholders (None) every item is a token's str, of the topic of
        # the line before.
        out: list[str] = []
        start = 0
        head = self.head
        for seq, (topic_json, text) in specials.items():  # in seq order, as buffered
            i = seq - base
            if i > start:
                tokens = cast("list[str]", items[start:i])
                out.append(_token_lines(head, base + start, self.line_topic, tokens))
            self.line_topic = topic_json
            out.append(f"{head}{seq},{topic_json},{text}]\n")
            start = i + 1
        if start < len(items):
            tokens = cast("list[str]", items[start:])
            out.append(_token_lines(head, base + start, self.line_topic, tokens))
        return "".join(out)

    def _append(self, events: str) -> None:
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
                store.save(block_of_lines(run_id, n, a.epoch, [events]))
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
        self.topic = _ENDED
        self.closed = True
        self.now.set()
        self.wake.set()
        if self.thread is not threading.current_thread():
            self.thread.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        self.flush()


@dataclass(slots=True, eq=False, repr=False)
class Attempt:
    """One attempt of one step, while it runs: where its events go, made on first emit.

    Compared and hashed by identity (``eq=False``), as a plain object is.
    """

    store: Store
    run_id: str
    key: str
    epoch: int
    number: int
    can_emit: bool
    token: str = field(default="", init=False)
    writer: Writer | None = field(default=None, init=False)

    def call(self, seq: int, number: int) -> Attempt:
        """Return the attempt of the call at ``seq`` of the code workflow this step runs."""
        return Attempt(self.store, self.run_id, f"{self.key}.{seq}", self.epoch, number, True)

    def emit(self, topic: object, data: object) -> None:
        """Check and buffer one event: the path of every event ``emit`` cannot take fast."""
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
        writer.special(writer.topic_json, text)

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
    writer = attempt.writer
    # The fast path: a short ASCII str under the last event's topic, i.e. a token. Its
    # JSON is surely valid and small (no lone surrogate is ASCII), so it is buffered as
    # it is and escaped with its batch at the flush, in a line of tokens (``_events``).
    # Everything else is checked now, and gets a line of its own.
    if writer is not None and topic is writer.topic and type(data) is str and data.isascii():
        size = len(data)
        if size <= TOKEN_CHARS:
            writer.buffer.append(data)
            writer.size += size + _TOKEN
            if writer.size >= writer.mark:
                writer.kick()
            return
    attempt.emit(topic, data)
