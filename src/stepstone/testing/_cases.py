"""The awkward inputs and full checkpoints the store tests feed every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from .._checkpoint import Checkpoint, Signal
from ._base import cp

__all__ = ["AWKWARD_RUN_IDS", "BAD_RUN_IDS", "BAD_STATES", "T0", "runtime_checkpoints"]

#: Run ids that break naive backends: path tricks, URL syntax, case, length, Unicode.
AWKWARD_RUN_IDS = (
    "plain",
    "Plain",
    "PLAIN",
    "a/b",
    "/",
    "..",
    "../x",
    "./x",
    "a\\b",
    "#",
    "?q=1",
    "%",
    "%2F",
    "a%2fb",
    "with space",
    " leading and trailing ",
    "ü",
    "u\u0308",
    "日本語の実行",
    "emoji-\U0001f680",
    "~tilde",
    "!bang",
    ".hidden",
    "x.json",
    "x.lock",
    ".tmp-x",
    "CON",
    "'; DROP TABLE x; --",
    "x" * 1024,
    "é" * 1024,
    "/" * 1024,
)

BAD_RUN_IDS: tuple[object, ...] = (
    "",
    "x" * 1025,
    "a\x00b",
    "line\nbreak",
    "tab\t",
    "\x7f",
    5,
    None,
)

BAD_STATES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("set", {"docs": [{"when": {1, 2}}]}, "state['docs'][0]['when']"),
    ("bytes", {"blob": b"x"}, "state['blob']"),
    ("nan", {"score": float("nan")}, "state['score']"),
    ("inf", {"nested": {"x": [1.0, float("inf")]}}, "state['nested']['x'][1]"),
    ("int key", {"map": {1: "one"}}, "state['map'][1]"),
    ("tuple", {"pair": (1, 2)}, "state['pair']"),
    ("object", {"obj": object()}, "state['obj']"),
    ("surrogate", {"s": ["ok", "bad\ud800"]}, "state['s'][1]"),
)

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def runtime_checkpoints(now: datetime) -> list[Checkpoint]:
    """Checkpoints using every schema-2 field, each kind of run once."""
    signals = (
        Signal("approval", "sig-1", {"ok": True, "by": "ü", "n": [1, 2.5, None]}, now),
        Signal("approval", "sig-2", None, now + timedelta(microseconds=1)),
        Signal("note", "sig-3", "text", now + timedelta(seconds=1)),
    )
    return [
        cp(
            "owned",
            1,
            {"a": 1, "b": 2},
            total_steps=5,
            input={"query": "héllo", "k": [1, {"x": None}]},
            workflow="agent",
            workflow_version="2026-01",
            cancel_requested=True,
            owner="worker-1/pid-42",
            epoch=7,
            lease=30.5,
            renewed_at=now,
            created_at=now - timedelta(hours=1),
            parent="parent-run",
        ),
        cp(
            "waiting",
            0,
            {"a": 1},
            total_steps=3,
            waiting_for="signal approval",
            wake_at=now + timedelta(days=1, microseconds=3),
            signals=signals,
            consumed={"approval": 1, "note": 0},
            epoch=2,
        ),
        Checkpoint(
            run_id="queued",
            total_steps=2,
            input={"x": 1},
            workflow="agent",
            queued=True,
            created_at=now - timedelta(minutes=5),
        ),
        cp("cancelled", 0, {"a": 1}, total_steps=3, cancelled=True, cancel_requested=True),
    ]
