"""What the ``stepstone`` command prints: redacted, escaped, as text or as JSON.

Everything printed goes through ``out``/``err``/``warn``/``emit_json``, which mask the
secrets of every config string the command was given (``REDACT``) and escape control
characters from stored text, so a run id, a failure message or a state forged to hold
terminal escape sequences is shown as ``\\x1b[...`` instead of driving the terminal.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .._redact import Redactor

__all__ = [
    "PROG",
    "REDACT",
    "age",
    "emit_json",
    "json_line",
    "err",
    "iso",
    "out",
    "safe",
    "table",
    "warn",
    "when",
]

PROG = "stepstone"

#: The secrets of every config string this command was given, masked in all output.
REDACT = Redactor()

# C0 controls (tab and newline included: callers split lines first), DEL, C1 controls
# (U+009B is a one-character CSI on some terminals), and the bidirectional overrides
# and isolates that can make a line read differently from what it holds.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")

# What ``json.dumps`` leaves raw (it escapes C0 itself; the newlines of ``indent`` stay).
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """Return ``text`` as one printable line: control characters escaped."""
    return _UNSAFE.sub(_escape, str(text))


def safe_lines(text: str) -> list[str]:
    """Split ``text`` on newlines and escape each line (for multi-line messages)."""
    return [safe(line) for line in text.split("\n")] or [""]


def out(text: str = "") -> None:
    """Print ``text`` on stdout, secrets masked. Escaping is the caller's: it knows
    which parts are stored text."""
    print(REDACT(text), flush=False)


def err(message: str) -> None:
    """Print one error line on stderr."""
    line = " ".join(REDACT(safe(message)).split())
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """Print one warning line on stderr."""
    line = " ".join(REDACT(safe(message)).split())
    print(f"{PROG}: warning: {line}", file=sys.stderr, flush=True)


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout.

    ``json`` escapes C0 controls itself; DEL, C1 and the bidirectional controls are
    escaped here too (``\\u009b``), which is still valid JSON for the same string.
    """
    text = json.dumps(value, ensure_ascii=False, indent=2)
    out(_UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", text))


def json_line(value: dict[str, Any]) -> None:
    """Print ``value`` as one line of JSON (JSON Lines: one object per line), masked.

    ASCII only: every control, C1 and bidirectional character is a ``\\u`` escape.
    """
    out(json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str))
    sys.stdout.flush()


def utc(value: datetime) -> datetime:
    """Return ``value`` in UTC; a naive one is taken as UTC already."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def when(value: datetime | None) -> str:
    """Return ``value`` as ``2026-12-01T09:00:00Z``, or ``-``."""
    return "-" if value is None else utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso(value: datetime | None) -> str | None:
    """Return ``value`` in ISO 8601 (UTC, ``Z``) for JSON, or None."""
    return None if value is None else utc(value).isoformat().replace("+00:00", "Z")


def span(seconds: float) -> str:
    """Return a duration as ``45s``, ``12m``, ``3h`` or ``2d`` (rounded down)."""
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def age(value: datetime | None, now: datetime) -> str:
    """Return how long ago ``value`` was, e.g. ``12m``, or ``-``."""
    return "-" if value is None else span((now - utc(value)).total_seconds())


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Return the lines of a left-aligned text table."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
