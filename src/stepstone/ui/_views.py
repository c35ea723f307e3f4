"""What the dashboard shows, computed from a checkpoint: no I/O, no HTML.

Every stored text passes through ``visible`` (control and bidirectional characters
escaped, very long texts cut) before a template sees it; the templates escape HTML on
top (Jinja2 autoescape), so a stored value is shown as text and never acts as markup.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from .._checkpoint import Checkpoint
from .._code_history import entries_of
from .._errors import StepstoneError
from .._journal import JOURNAL_KEY
from .._store import RunInfo
from ..cli._output import span, utc

__all__ = [
    "ADAPTER_KINDS",
    "MAX_JSON_SHOWN",
    "MAX_TEXT_SHOWN",
    "SignalRow",
    "StepRow",
    "display_name",
    "lease_text",
    "pretty_json",
    "signal_rows",
    "timeline",
    "visible",
    "when",
]

#: Record-id heads the framework adapters write (``langgraph/<thread>/<ns>/<checkpoint>``,
#: ``maf/<workflow>/<checkpoint>``, ``openai-agents:<rest>``; ``head:rest`` is read for
#: each), and the suffix of the pydantic-ai adapter's journals.
ADAPTER_KINDS = {
    "langgraph": "LangGraph",
    "maf": "Agent Framework",
    "openai-agents": "OpenAI Agents",
}
_JOURNAL_SUFFIX = "/pydantic-ai-journal"

#: Longest stored text shown in full; past it the page says how much was cut.
MAX_TEXT_SHOWN = 20_000
#: Longest pretty-printed JSON (state, input, payload) shown in full.
MAX_JSON_SHOWN = 200_000

# C0 controls except tab and newline, DEL, C1 controls and the bidirectional overrides,
# isolates and separators that make text read differently from what it holds.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
# What json.dumps leaves raw (it escapes C0 itself).
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, limit: int = MAX_TEXT_SHOWN) -> str:
    """Return stored text as it may be shown: controls escaped, cut at ``limit`` chars."""
    value = "" if text is None else str(text)
    cut = ""
    if len(value) > limit:
        cut = f" ... ({len(value) - limit:,} more characters not shown)"
        value = value[:limit]
    return _UNSAFE.sub(_escape, value) + cut


def pretty_json(value: Any, fallback: str | None = None, limit: int = MAX_JSON_SHOWN) -> str:
    """Return ``value`` as indented JSON for display, escaped and cut like ``visible``.

    ``fallback`` (the stored JSON text) is shown when the value is nested too deeply for
    ``json.dumps``.

    The indented text is produced lazily and only up to ``limit``: a long run's state
    (tens of MB) costs what is shown, not the whole state in the pure-Python indenting
    encoder. What is left is counted in C, from the compact encoding.
    """
    try:
        chunks = _indenting.iterencode(value)
        parts: list[str] = []
        size = 0
        for chunk in chunks:
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                break
        text = "".join(parts)
        more = 0
        if size > limit:
            # How much is not shown, in characters of the indented form, estimated from
            # the compact form's length (C speed) and the share of the indentation seen.
            compact = len(_compact(value))
            shown_compact = len(_compact_prefix(text))
            more = max(int((compact - shown_compact) * len(text) / max(shown_compact, 1)), 1)
    except (RecursionError, TypeError, ValueError):
        text = fallback if fallback is not None else "(cannot be shown: nested too deeply)"
        more = 0
    cut = ""
    about = "about " if more else ""
    if len(text) > limit:
        more += len(text) - limit
        text = text[:limit]
    if more:
        cut = f"\n... ({about}{more:,} more characters not shown)"
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", _UNSAFE.sub(_escape, text)) + cut


_indenting = json.JSONEncoder(ensure_ascii=False, indent=2)
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_INDENT = re.compile(r"\n *")


def _compact_prefix(text: str) -> str:
    """The indented prefix ``text`` with its line breaks and indentation taken out."""
    return _INDENT.sub("", text).replace('": ', '":')


def display_name(run_id: str) -> tuple[str | None, str]:
    """Return (kind, name) of a record: an adapter's kind and a readable name (its id's
    percent-encoded parts decoded), or (None, run_id) for a stepstone run."""
    if run_id.endswith(_JOURNAL_SUFFIX) and len(run_id) > len(_JOURNAL_SUFFIX):
        return "pydantic-ai journal", run_id.removesuffix(_JOURNAL_SUFFIX)
    if run_id.startswith("stream:") and len(run_id) > 7:  # streams (issue 34): RUN_ID/N
        return "stream block", run_id[7:]
    for head, label in ADAPTER_KINDS.items():
        rest = run_id[len(head) + 1 :]
        if not (run_id.startswith(head) and len(run_id) > len(head) + 1):
            continue
        if run_id[len(head)] == ":":
            if head == "openai-agents":
                what = (
                    rest.split(":", 1)[0] if rest.startswith(("session:", "session-page:")) else ""
                )
                return f"{label} {what.replace('-', ' ') or 'journal'}", rest
            return label, rest
        if run_id[len(head)] != "/":
            continue
        parts = [unquote(part) for part in rest.split("/")]
        if head == "langgraph":
            what = {2: "thread", 3: "checkpoint"}.get(len(parts), "record")
            if len(parts) == 4 and parts[3] == "writes":
                what, parts = "pending writes", parts[:3]
            if len(parts) >= 2:
                parts[1] = parts[1] or "(root namespace)"
            return f"{label} {what}", " / ".join(parts)
        return f"{label} checkpoint", " / ".join(parts)
    return None, run_id


def when(value: datetime | None) -> str:
    """Return ``value`` as ``2026-12-01 09:00:00Z``, or ``-``."""
    return "-" if value is None else utc(value).strftime("%Y-%m-%d %H:%M:%SZ")


def lease_text(cp: Checkpoint | RunInfo, now: datetime) -> str:
    """Return a sentence about who holds the run and whether the lease looks live.

    Judged by this machine's clock against the owner's last renewal: a hint only, as
    workers decide a takeover by seeing no renewal for a whole lease, not by clocks.
    """
    if cp.owner is None:
        return "none: no process owns the run"
    if not isinstance(cp, Checkpoint) or cp.lease is None or cp.renewed_at is None:
        return f"held by {cp.owner}"
    left = (utc(cp.renewed_at) - now).total_seconds() + cp.lease
    renewed = span((now - utc(cp.renewed_at)).total_seconds())
    if left > 0:
        return (
            f"live: held by {cp.owner}, renewed {renewed} ago, lease {cp.lease:g}s "
            f"(expires in {span(left)} unless renewed)"
        )
    return (
        f"expired {span(-left)} ago: {cp.owner} last renewed it {renewed} ago "
        f"(lease {cp.lease:g}s); the next worker that looks takes the run over"
    )


@dataclass(frozen=True, slots=True)
class StepRow:
    """One line of a run's step timeline."""

    index: int
    name: str
    #: ``done``, ``running``, ``retrying``, ``waiting``, ``failed``, ``queued``,
    #: ``cancelled`` or ``not reached``.
    kind: str
    detail: str


def timeline(cp: Checkpoint, now: datetime, names: Sequence[str] = ()) -> list[StepRow]:
    """Return the run's steps as the checkpoint records them.

    A checkpoint keeps the names of the completed steps, the attempts begun on the next
    one, its last failure and what the run waits for; it keeps no per-step times (those
    need the run's history), so completed steps carry no duration. ``names`` are step
    names known from elsewhere (a kept save from before a rerun): steps not reached are
    listed by name where it is known; a waiting step is named by what it waits for.
    """
    rows = [StepRow(i, name, "done", "completed") for i, name in enumerate(cp.step_names)]
    total = cp.total_steps
    nxt = cp.step + 1
    if total is not None and nxt >= total:
        return rows
    failure = cp.failure
    name = failure.step_name if failure is not None and failure.step_index == nxt else ""
    name = name or (names[nxt] if nxt < len(names) else "")
    status = cp.status
    attempts = f"{cp.attempt} attempt(s) begun" if cp.attempt else "no attempt begun yet"
    if status == "waiting":
        until = f" until {when(cp.wake_at)}" if cp.wake_at is not None else ""
        # A ``WaitFor`` step is named by its signal, e.g. ``approval``.
        name = name or (cp.waiting_for or "").removeprefix("signal ")
        rows.append(StepRow(nxt, name, "waiting", f"waiting for {cp.waiting_for}{until}"))
    elif status == "failed" and failure is not None:
        rows.append(
            StepRow(
                nxt,
                name,
                "failed",
                f"failed on attempt {failure.attempt} at {when(failure.at)}: {failure.error_type}",
            )
        )
    elif status == "running":
        kind = "retrying" if failure is not None else "running"
        extra = f"; last failure: {failure.error_type}" if failure is not None else ""
        rows.append(StepRow(nxt, name, kind, f"{attempts}{extra}"))
    elif status == "queued":
        retried = f" (retry after {failure.error_type})" if failure is not None else ""
        rows.append(StepRow(nxt, name, "queued", f"queued for a worker{retried}"))
    elif status == "cancelled":
        rows.append(StepRow(nxt, name, "cancelled", "not run: the run was cancelled"))
    if total is not None and total > nxt + 1:
        if len(names) >= total:
            rows.extend(StepRow(i, names[i], "not reached", "") for i in range(nxt + 1, total))
            return rows
        more = total - nxt - 1
        rows.append(StepRow(nxt + 1, "", "not reached", f"{more} more step(s) not reached yet"))
    return rows


@dataclass(frozen=True, slots=True)
class SignalRow:
    """A signal the run received, and whether a ``WaitFor`` has consumed it."""

    name: str
    id: str
    at: datetime
    payload: str
    consumed: bool


def signal_rows(cp: Checkpoint) -> list[SignalRow]:
    """Return the run's signals in arrival order; the first ``consumed[name]`` of each
    name are the consumed ones (``WaitFor`` takes them oldest first)."""
    seen: Counter[str] = Counter()
    rows = []
    for sig in cp.signals:
        seen[sig.name] += 1
        rows.append(
            SignalRow(
                sig.name,
                sig.id,
                sig.at,
                pretty_json(sig.payload, limit=MAX_TEXT_SHOWN),
                seen[sig.name] <= cp.consumed.get(sig.name, 0),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class CallRow:
    """One journaled call of a code workflow's run, as the run page lists it."""

    seq: int
    call: str
    attempt: int
    at: str
    size: int
    outcome: str


def journal_rows(cp: Checkpoint) -> list[CallRow] | None:
    """The run's journaled calls in call order (None: not a code workflow's run)."""
    if JOURNAL_KEY not in cp.state:
        return None
    try:
        entries = entries_of(cp.run_id, cp.state)
    except StepstoneError:
        return None  # malformed: the state section shows it as it is
    return [
        CallRow(
            e.seq,
            e.call,
            e.attempt,
            when(e.at) if e.at is not None else "-",
            e.size,
            "ok" if e.error_type is None else f"failed: {e.error_type}",
        )
        for e in entries
    ]
