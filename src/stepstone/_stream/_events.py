"""Stream events: what one is, how it is checked, and the records its blocks live in.

A run's events are stored in blocks: write-once records under reserved ids beside the
run (``stream:RUN_ID/N``, ``N`` = 0, 1, 2, ... with no gaps). A block's state holds the
epoch of the lease its writer held and its events, one JSON array a line
``[step_key, attempt, token, seq, topic, data]``:

- ``step_key`` names the step: ``"3"`` for step 3 of a step list, ``"0.7"`` for the
  call at position 7 of the code workflow at step 0;
- ``attempt`` is the attempt number the step saw; ``token`` is random per attempt, so
  two attempts are never confused (an attempt number restarts after a crash);
- ``seq`` counts the attempt's events from 0; ``data`` is the event's JSON value.

Consecutive short str events of one attempt and topic (a model's tokens) share a line
``[step_key, attempt, token, seq, topic, [data, data, ...], 1]``: the events ``seq``,
``seq + 1``, ... (``TOKEN_RUN`` at most): their head is written once, not per token.
An event's id is ``"N.I"``: block ``N``, position ``I`` among its events (a line of
tokens counts as its events); ids sort as stored.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from .._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint
from .._codec import encode_state
from .._errors import ConfigError, InvalidState, StepstoneError

__all__ = [
    "HEAD",
    "MAX_EVENT_BYTES",
    "MAX_TOPIC_LENGTH",
    "TOKEN_CHARS",
    "TOKEN_RUN",
    "StreamEvent",
    "EmitOutsideStep",
    "EventTooLarge",
    "block_events",
    "block_id",
    "block_of_lines",
    "block_record",
    "check_topic",
    "encode_data",
    "encode_topic",
    "line_head",
    "parse_id",
]

#: The head of every block's record id (``stepstone runs list`` shows them apart).
HEAD = "stream"
#: The most tokens a line of tokens holds, and the longest token it takes (longer ones
#: get a line each): a line stays under 64 * (6 * 64 + 3) bytes, escaped at worst.
TOKEN_RUN = 64
TOKEN_CHARS = 64
#: The largest event, as UTF-8 JSON text (data only): one event fits any backend's record.
MAX_EVENT_BYTES = 64 * 1024
MAX_TOPIC_LENGTH = 200
_BAD_TOPIC = re.compile("[\x00-\x1f\x7f-\x9f]")
# What ``json.dumps(s, ensure_ascii=False)`` returns for a str, without its set-up.
_encode_str = json.encoder.encode_basestring


class EmitOutsideStep(StepstoneError, RuntimeError):
    """``emit`` was called where no step attempt is running (its events could repeat)."""


class EventTooLarge(StepstoneError, ValueError):
    """An event's JSON text is over ``MAX_EVENT_BYTES``."""


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a run's stream, as a reader sees it.

    Attributes:
        id: ``"BLOCK.INDEX"``: pass it as ``after=`` (or SSE ``Last-Event-ID``) to resume.
        topic: The topic given to ``emit``.
        data: The JSON value given to ``emit``.
        step: The step that emitted it: ``"3"`` (a step list's index) or ``"0.7"`` (a
            code workflow's call at position 7).
        attempt: That step's attempt number.
        seq: Position of the event among its attempt's events.
        superseded: True for an event of an attempt that did not commit its step (only
            shown when asked for with ``superseded=True``).
    """

    id: str
    topic: str
    data: Any
    step: str
    attempt: int
    seq: int
    superseded: bool = False

    def to_json(self) -> dict[str, Any]:
        """Return the event as a JSON object (what ``runs tail --json`` prints)."""
        out = {
            "id": self.id,
            "topic": self.topic,
            "data": self.data,
            "step": self.step,
            "attempt": self.attempt,
            "seq": self.seq,
        }
        if self.superseded:
            out["superseded"] = True
        return out


def check_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic, else raise ``ConfigError`` saying why."""
    if not isinstance(topic, str) or not topic or len(topic) > MAX_TOPIC_LENGTH:
        raise ConfigError(
            f"an event topic must be a str of 1 to {MAX_TOPIC_LENGTH} characters, got {topic!r:.80}"
        )
    if _BAD_TOPIC.search(topic):
        raise ConfigError(f"an event topic may not hold control characters: {topic!r}")
    return topic


def encode_data(data: object) -> str:
    """Return ``data`` as compact JSON text, or refuse it naming the path or the limit.

    Raises:
        InvalidState: ``data`` is not JSON (the message names the path of the value).
        EventTooLarge: its text is over ``MAX_EVENT_BYTES``.
    """
    kind = type(data)
    if kind is str:
        # The common case, a token: the C string encoder json.dumps itself uses.
        text = _encode_str(data)  # type: ignore[arg-type]
    elif kind is int or kind is bool or data is None:
        text = json.dumps(data)
    else:
        try:
            text, _ = encode_state({"data": data})
        except InvalidState as exc:
            path = "data" + exc.path.removeprefix("state['data']")
            message = str(exc).split(": ", 1)[-1]
            raise InvalidState(f"event data is not JSON at {path}: {message}", path) from None
        # encode_state wraps it in {"data": ...}; keep the value's own text.
        text = json.dumps(json.loads(text)["data"], ensure_ascii=False, separators=(",", ":"))
    if text.isascii():  # the common case: one byte a character
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidState(
                "event data is not JSON at data: a lone surrogate cannot be stored", "data"
            ) from None
    if size > MAX_EVENT_BYTES:
        raise EventTooLarge(
            f"event is {size} bytes of JSON; the limit is {MAX_EVENT_BYTES} bytes "
            "(stepstone._stream.MAX_EVENT_BYTES): split it or store a reference"
        )
    return text


def encode_topic(topic: str) -> str:
    """Return a checked topic's JSON text."""
    return _encode_str(topic)


def block_id(run_id: str, n: int) -> str:
    """Return the record id of block ``n`` of ``run_id``'s stream."""
    plain = f"{HEAD}:{run_id}/{n}"
    if len(plain) <= MAX_RUN_ID_LENGTH:
        return plain
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{HEAD}:~{digest}/{n}"


def line_head(step_key: str, attempt: int, token: str) -> str:
    """Return the start of every line of one attempt's events (up to its ``seq``)."""
    return f"[{_encode_str(step_key)},{attempt},{_encode_str(token)},"


def block_record(run_id: str, n: int, epoch: int, events: list[list[Any]]) -> Checkpoint:
    """Return block ``n`` of ``events``: ``[step_key, attempt, token, seq, topic, data_json]``."""
    lines = [
        f"{line_head(k, a, t)}{q},{_encode_str(topic)},{text}]"
        for k, a, t, q, topic, text in events
    ]
    return block_of_lines(run_id, n, epoch, lines)


def block_of_lines(run_id: str, n: int, epoch: int, lines: list[str]) -> Checkpoint:
    """Return block ``n`` as a finished, write-once record (never claimed by a worker).

    The events are stored as one text, a JSON array per line (each line made when its
    event was emitted, its data spliced in as checked), so a store checks and copies
    one string, not thousands of small lists.
    """
    return Checkpoint(
        run_id=block_id(run_id, n),
        step=0,
        state={"run": run_id, "epoch": epoch, "lines": "\n".join(lines)},
        step_names=("stream",),
        total_steps=1,
    )


def block_events(state: dict[str, Any]) -> list[list[Any]]:
    """Return the events of a block's state: ``[step_key, attempt, token, seq, topic, data]``."""
    lines = state.get("lines")
    if not lines:
        return []
    # One parse for the whole block: the lines joined into one JSON array.
    parsed: list[list[Any]] = json.loads("[" + lines.replace("\n", ",") + "]")
    if all(len(line) == 6 for line in parsed):
        return parsed
    events: list[list[Any]] = []
    for line in parsed:
        if len(line) == 6:
            events.append(line)
        else:  # a line of tokens: one event each
            key, attempt, token, seq, topic, datas, _ = line
            events.extend([key, attempt, token, seq + i, topic, d] for i, d in enumerate(datas))
    return events


def parse_id(after: object) -> tuple[int, int]:
    """Return ``(block, index)`` of an event id (``"-1.-1"``: before everything)."""
    if after is None:
        return (-1, -1)
    if isinstance(after, str):
        block, dot, index = after.partition(".")
        try:
            if dot and int(block) >= 0 and int(index) >= 0:
                return int(block), int(index)
        except ValueError:
            pass
    raise ConfigError(
        f"after={after!r:.80} is not an event id; allowed: None or 'BLOCK.INDEX' ('3.17')"
    )
