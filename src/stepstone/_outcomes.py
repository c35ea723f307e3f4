"""How a worker's execution of a run ends: parked, settled or not, and in words.

``park`` is the one write a worker makes of its own (a run whose completed steps are
not its workflow's); ``SETTLED`` says which ends leave a run settled and which give it
back to be cooled off; ``outcome`` is the line the worker logs.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from . import _lease
from ._checkpoint import Failure, evolve, utcnow
from ._checks import check_names
from ._core import Interrupted, write
from ._effects import Effect
from ._errors import (
    ConflictError,
    RunCancelled,
    StepFailed,
    Suspended,
    WorkflowChanged,
    safe_text,
)
from ._observe import logger
from ._plan import Plan
from ._suspend import nudge

__all__ = ["SETTLED", "changed", "outcome", "park"]

#: How an execution may end and leave its run settled: done, waiting, cancelled, handed
#: over, failed (saved), parked, or another owner's. Any other end (a store error, a step
#: raising SystemExit, a bug) gives the run back unchanged, so the worker cools it off.
SETTLED = (Suspended, RunCancelled, Interrupted, StepFailed, ConflictError, WorkflowChanged)


def changed(plan: Plan) -> WorkflowChanged | None:
    """Return why ``plan``'s steps cannot resume the record it claimed, or None."""
    cp = plan.preclaimed
    if cp is None:
        return None
    try:
        check_names(plan.run_id, plan.names, cp.step_names)
    except WorkflowChanged as exc:
        return exc
    return None


def park(plan: Plan, why: WorkflowChanged, owner: str) -> Generator[Effect, Any, None]:
    """Save the claimed run as ``failed`` with ``why`` as its failure, lease given back.

    Its steps were renamed without a version bump, so every worker serving its
    (name, version) would claim it, fail the same check and give it back, in a loop.
    As a failure it leaves the claim index for good, and ``runs list``/``runs show``
    say why. Nothing is lost: state, input, signals and completed steps stay, and
    ``run`` with the steps it was recorded with resumes it (or ``cancel`` ends it).
    """
    cp = plan.preclaimed
    assert cp is not None
    position = min(max(why.position, 0), max(len(cp.step_names) - 1, 0))
    recorded = cp.step_names[position] if cp.step_names else "?"
    failure = Failure(
        step_index=position,
        step_name=recorded,
        error_type=type(why).__name__,
        message=f"{why}. Parked by {owner}: no worker claims it again; resume it "
        "with the steps it was recorded with (stepstone.run), or cancel it",
        attempt=0,
        at=utcnow(),
    )
    # ``waiting_for`` cleared: a waiting run's status would hide the failure.
    parked = evolve(cp, failure=failure, attempt=0, waiting_for=None, wake_at=None)
    saved = yield from write(plan, cp, _lease.released(parked), "park")
    logger.error("run %r: parked as failed: %s", plan.run_id, why)
    if saved.parent is not None:
        yield from nudge(saved.parent)  # a waiting parent learns of it at once


#: What each settled end says in the worker's log, first match wins.
_SAID: tuple[tuple[type[BaseException], Callable[[Any], str]], ...] = (
    (Suspended, lambda exc: f"waiting for {exc.waiting_for}"),
    (RunCancelled, lambda _exc: "cancelled"),
    (Interrupted, lambda _exc: "handed over"),
    (StepFailed, lambda exc: f"failed at step {exc.step_index} ({exc.step_name!r})"),
    (WorkflowChanged, lambda _exc: "parked as failed: its completed steps are not this workflow's"),
    (ConflictError, lambda exc: f"given up: {exc}"),
)


def outcome(exc: BaseException | None) -> str:
    """Say how an execution that ended with ``exc`` (None: done) left its run."""
    if exc is None:
        return "done"
    for kind, say in _SAID:
        if isinstance(exc, kind):
            return say(exc)
    # Any exception at all, from a step or a foreign store: its __str__ may raise, and
    # this line is written in the driver's ``finally``, which must free the slot.
    return f"stopped: {type(exc).__name__}: {safe_text(exc)}"
