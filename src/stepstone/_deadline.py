"""Run deadlines: ``Workflow(deadline=)``, ``start(..., deadline=)``, ``DeadlineExceeded``.

A deadline is a length of time from the run's first claim to its end. It is stored in
the run's ``timing`` field (one namespaced field for time control):

- ``deadline``: its length in seconds, recorded by ``start(deadline=)`` (or taken from
  the ``Workflow`` at the first claim);
- ``deadline_at``: when it falls, fixed at the first claim and never moved by a resume
  (a ``Map``'s children get their parent's, ``inherited``, unless their own workflow
  sets one);
- ``on_deadline``: ``fail`` (the run fails with ``DeadlineExceeded``, recorded, and its
  active children are cancelled; a child that failed or finished keeps its status) or
  ``wait`` (the run waits for the signal ``deadline``, whose
  payload ``{"extend": seconds}`` moves the deadline on: a person decides).

The core checks it at every step boundary; a running step is given at most the time
left (``_timeouts``, with the deadline as its limit); a waiting run is due at its
deadline at the latest, so a worker wakes it then. It counts on the store's clock
(``_store_time``), as timers do: fixed from the store's time, and turned into this
process's monotonic time for the checks (``Plan.set_deadline``), so no host's clock
moves it.

The rules are pure functions here; the core (``_core``) performs the writes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ._checkpoint import Checkpoint, evolve, utcnow
from ._errors import DeadlineExceeded, InvalidWorkflow
from ._timeouts import seconds_of

__all__ = [
    "MAX_DEADLINE",
    "ON_DEADLINE",
    "DEADLINE_SIGNAL",
    "DeadlineExceeded",
    "armed",
    "check_deadline",
    "check_on_deadline",
    "deadline_of",
    "describe",
    "extended",
    "inherited",
    "left",
    "start_timing",
]

#: The longest deadline: a year. A run meant to outlive it has no deadline.
MAX_DEADLINE = 366 * 86_400.0
ON_DEADLINE = ("fail", "wait")
#: The signal that extends a deadline a run waits at (``on_deadline="wait"``).
DEADLINE_SIGNAL = "deadline"


def check_deadline(what: str, value: object) -> float | None:
    """Return ``value`` (seconds or a ``timedelta``) as seconds, or raise ``InvalidWorkflow``."""
    seconds = seconds_of(what, "deadline", value)
    if seconds is None:
        return None
    if not (0 < seconds <= MAX_DEADLINE):  # NaN fails both comparisons
        raise InvalidWorkflow(
            f"{what}: deadline must be more than 0 and at most {MAX_DEADLINE:g} seconds "
            f"(366 days), got {value!r}"
        )
    return seconds


def check_on_deadline(what: str, value: object) -> str:
    """Return ``value`` if it is ``fail`` or ``wait``, else raise ``InvalidWorkflow``."""
    if value not in ON_DEADLINE:
        raise InvalidWorkflow(f"{what}: on_deadline must be 'fail' or 'wait', got {value!r}")
    return str(value)


def start_timing(seconds: float | None, on_deadline: str | None) -> dict[str, Any] | None:
    """Return the ``timing`` of a run ``start`` records (None: no deadline given)."""
    if seconds is None:
        return None
    return {"deadline": seconds, "on_deadline": on_deadline or "fail"}


def deadline_of(cp: Checkpoint) -> datetime | None:
    """Return when ``cp``'s run reaches its deadline, or None."""
    timing = cp.timing
    if not timing:
        return None
    at = timing.get("deadline_at")
    return None if at is None else datetime.fromisoformat(at)


def armed(cp: Checkpoint, own: float | None, on_deadline: str, now: datetime) -> Checkpoint | None:
    """Return ``cp`` with its deadline fixed, if its first claim must fix it; else None.

    ``own`` is the deadline of the workflow being run (``Workflow.deadline``). The
    run's own length (``start(deadline=)``) wins over it; an inherited deadline gives
    way to it. ``now``: the store's time (``_store_time``), which the deadline counts
    from, so that no host's clock moves it.
    """
    timing = dict(cp.timing or {})
    if "deadline_at" in timing and not (timing.get("inherited") and own is not None):
        return None
    seconds = timing.get("deadline") if "deadline" in timing else own
    if seconds is None:
        return None
    timing["deadline"] = float(seconds)
    timing["deadline_at"] = (now + timedelta(seconds=float(seconds))).isoformat()
    timing.setdefault("on_deadline", on_deadline)
    timing.pop("inherited", None)
    timing.pop("expired_at", None)
    return evolve(cp, timing=timing)


def inherited(parent: Checkpoint) -> dict[str, Any] | None:
    """Return the ``timing`` a ``Map`` child gets from ``parent`` (None: no deadline)."""
    timing = parent.timing
    if not timing or "deadline_at" not in timing:
        return None
    return {
        "deadline_at": timing["deadline_at"],
        "on_deadline": "fail",  # a person extends the parent's deadline, not each child's
        "inherited": True,
    }


def left(at: datetime | None) -> float | None:
    """Return seconds until ``at`` (negative once passed), or None without a deadline."""
    return None if at is None else (at - utcnow()).total_seconds()


def extended(cp: Checkpoint, seconds: float, now: datetime) -> Checkpoint:
    """Return ``cp`` with its deadline moved ``seconds`` past ``now`` (the store's time)."""
    timing = dict(cp.timing or {})
    timing["deadline_at"] = (now + timedelta(seconds=seconds)).isoformat()
    return evolve(cp, timing=timing)


def describe(timing: dict[str, Any], now: datetime) -> str:
    """Return a line about a run's deadline for ``runs show`` and the dashboard."""
    at = timing.get("deadline_at")
    then = "fail" if timing.get("on_deadline", "fail") == "fail" else "wait for the signal deadline"
    if at is None and timing.get("expired_at"):
        return f"reached at {timing['expired_at']} (a retry gets a fresh one)"
    if at is None:
        seconds = timing.get("deadline")
        return f"{seconds:g}s from the first claim, then {then}" if seconds else "-"
    when = datetime.fromisoformat(at)
    left = (when - now).total_seconds()
    where = f"{left:.0f}s left" if left > 0 else f"passed {-left:.0f}s ago"
    inherited = ", inherited from the parent" if timing.get("inherited") else ""
    return f"{at} ({where}{inherited}), then {then}"
