"""What the run's core does about deadlines: fix one at the first claim, act when it falls.

Generators of effects, like the core (``_core``), which calls them at its hooks and
passes its own ``write`` (the re-basing save), so this module does not import it. The
rules themselves (what a deadline is, how children inherit it) are in ``_deadline``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from . import _lease
from ._checkpoint import Checkpoint, Failure, evolve, utcnow
from ._codec import pristine
from ._control import cancel_children
from ._deadline import DEADLINE_SIGNAL, DeadlineExceeded, armed, deadline_of, extended
from ._effects import Effect
from ._errors import Suspended
from ._observe import logger
from ._plan import Plan
from ._store_time import Now, plain
from ._suspend import nudge

__all__ = ["DeadlineExceeded", "deadline_armed", "deadline_asked", "deadline_reached"]

Write = Callable[[Plan, Checkpoint, Checkpoint, str], Generator[Effect, Any, Checkpoint]]


def deadline_armed(plan: Plan, cp: Checkpoint, write: Write) -> Generator[Effect, Any, Checkpoint]:
    """Fix the run's deadline at its first claim (if it has one); note it on ``plan``."""
    if not (cp.timing or plan.deadline):
        return cp  # no deadline: not even the store's time is read
    now = plain((yield Now()))  # the store's clock: a deadline counts on it (``_deadline``)
    fixed = armed(cp, plan.deadline, plan.on_deadline, now)
    if fixed is not None:
        cp = yield from write(plan, cp, fixed, "deadline")
        logger.info("run %r: deadline at %s", plan.run_id, (cp.timing or {}).get("deadline_at"))
    plan.set_deadline(deadline_of(cp), now)
    return cp


def _extension(cp: Checkpoint) -> tuple[float, dict[str, int]] | None:
    """Return the seconds an unconsumed ``deadline`` signal extends by, and the new counts."""
    used = cp.consumed.get(DEADLINE_SIGNAL, 0)
    received = [s for s in cp.signals if s.name == DEADLINE_SIGNAL]
    if len(received) <= used:
        return None
    payload = received[used].payload
    seconds = payload.get("extend") if isinstance(payload, dict) else payload
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        # A payload without a usable length: the run's own deadline again.
        seconds = float((cp.timing or {}).get("deadline") or 3600.0)
    return float(seconds), {**cp.consumed, DEADLINE_SIGNAL: used + 1}


def deadline_reached(
    plan: Plan, cp: Checkpoint, index: int, write: Write
) -> Generator[Effect, Any, Checkpoint]:
    """Act on a deadline that has fallen, at step ``index``.

    Returns the record to go on from when a ``deadline`` signal extended it; otherwise
    saves the run failed (``on_deadline="fail"``, raising ``DeadlineExceeded``, its
    children cancelled) or waiting for that signal (``"wait"``, raising ``Suspended``).
    """
    at = plan.deadline_at
    assert at is not None
    timing = cp.timing or {}
    if timing.get("on_deadline") == "wait":
        extension = _extension(cp)
        if extension is not None:
            seconds, consumed = extension
            now = plain((yield Now()))
            moved = evolve(extended(cp, seconds, now), consumed=consumed, waiting_for=None)
            cp = yield from write(plan, cp, moved, "deadline extended")
            plan.set_deadline(deadline_of(cp), now)
            logger.info("run %r: deadline extended by %gs", plan.run_id, seconds)
            return cp
        waiting = _lease.released(
            evolve(cp, waiting_for=f"signal {DEADLINE_SIGNAL}", wake_at=None, attempt=0)
        )
        yield from write(plan, cp, waiting, "wait at deadline")
        logger.warning("run %r: reached its deadline; waiting for an extension", plan.run_id)
        raise Suspended(plan.run_id, f"signal {DEADLINE_SIGNAL}", None)
    error = DeadlineExceeded(plan.run_id, at)
    failure = Failure(
        step_index=index,
        step_name=plan.names[index] if index < plan.total else "",
        error_type="DeadlineExceeded",
        message=str(error),
        attempt=cp.attempt,
        at=utcnow(),
    )
    # The deadline is spent: its time is dropped and its length kept, so that a retry
    # (``stepstone.retry``, ``runs retry``) gets a fresh deadline from its next claim,
    # as it gets a fresh attempt budget. ``expired_at`` says when this one fell.
    spent = {k: v for k, v in timing.items() if k != "deadline_at"}
    spent["expired_at"] = at.isoformat()
    final = _lease.released(
        evolve(
            cp,
            state=pristine(cp),
            attempt=0,
            failure=failure,
            waiting_for=None,
            wake_at=None,
            timing=spent,
        )
    )
    cp = yield from write(plan, cp, final, "deadline")
    if cp.children:
        # Only the active ones: a child that failed (or finished) keeps its status, so
        # its own cause (its own DeadlineExceeded, say) stays what it shows.
        yield from cancel_children(cp.children, keep_failed=True)
    if cp.parent is not None:
        yield from nudge(cp.parent)
    logger.error("run %r: reached its deadline at step %d; failed", plan.run_id, index)
    raise error


def deadline_asked(
    plan: Plan, cp: Checkpoint, index: int, session: Any, reply: Any, write: Write
) -> Generator[Effect, Any, Checkpoint]:
    """A code workflow's call met the run's deadline (``_code_calls``): act on it.

    The run fails or waits (raising, as at a step boundary: the core stops the session,
    so the function unwinds), or a ``deadline`` signal extended it: then the call goes
    on under the new deadline.
    """
    if plan.deadline_passed():
        cp = yield from deadline_reached(plan, cp, index, write)
    session.deadline_at, session.deadline_mono = plan.deadline_at, plan.deadline_mono
    session.answer(reply, None)
    return cp
