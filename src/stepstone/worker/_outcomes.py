"""How a worker's execution of a run begins and ends: claimed or taken over, parked,
settled or not, and the event each is told by.

``park`` is the one write a worker makes of its own (a run whose completed steps are
not its workflow's); ``SETTLED`` says which ends leave a run settled and which give it
back to be cooled off; ``claim_event`` and ``ending`` are the events the worker emits
(``_observe.EVENTS``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import datetime
from typing import Any

from .. import _lease
from .._checkpoint import Checkpoint, parked, utcnow
from .._checks import check_names
from .._core import Interrupted, write
from .._effects import Effect
from .._errors import (
    ConflictError,
    RunCancelled,
    StepFailed,
    Suspended,
    WorkflowChanged,
)
from .._observe import RunEvent, first_line
from .._plan import Plan
from .._suspend import DUE_NOW_UNTIL, nudge

__all__ = ["SETTLED", "changed", "claim_event", "ending", "park"]

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
    advice = (
        f"Parked by {owner}: no worker claims it again; resume it with the steps it was "
        "recorded with (stepstone.run), or cancel it"
    )
    record = parked(cp, position, recorded, why, advice)
    saved = yield from write(plan, cp, _lease.released(record), "park")
    if saved.parent is not None:
        yield from nudge(saved.parent)  # a waiting parent learns of it at once


Detail = dict[str, str | int | float | None]


def _until(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


def _suspended(exc: Suspended) -> Detail:
    kind, _sep, rest = exc.waiting_for.partition(" ")
    detail: Detail = {"waiting_for": exc.waiting_for, "until": _until(exc.wake_at)}
    if kind == "signal":
        detail["signal"] = rest
    elif kind == "children":
        detail["children"] = rest
    return detail


def _error(exc: BaseException) -> Detail:
    # A step's failure is its cause's: StepFailed's own text only repeats where it was.
    cause = exc.__cause__ if isinstance(exc, StepFailed) and exc.__cause__ else exc
    return {"error_type": type(cause).__name__, "error": first_line(cause)}


#: How each end of an execution is told, first match wins: its event and its details.
#: LeaseLost (a ConflictError) and any other lost compare-and-swap mean the same to an
#: operator: another worker holds the run now.
_ENDS: tuple[tuple[type[BaseException], str, Callable[[Any], Detail]], ...] = (
    (Suspended, "suspended", _suspended),
    (RunCancelled, "cancelled", lambda _exc: {}),
    (Interrupted, "handed_over", lambda _exc: {}),
    (StepFailed, "failed", _error),
    (WorkflowChanged, "parked", lambda exc: {"error": first_line(exc)}),
    (ConflictError, "lease_lost", lambda exc: {"error": first_line(exc)}),
)


def _steps_done(plan: Plan, exc: BaseException | None) -> int | None:
    """Return how many steps this execution completed, when its end says (done, failed).

    A run that suspends, is cancelled or handed over holds no record of this worker's
    by then (``plan.current`` is cleared by the release), so its count is not known
    without another read: None, and the steps counter leaves them out.
    """
    began = plan.preclaimed.step if plan.preclaimed is not None else -1
    if exc is None:
        return max(plan.total - 1 - began, 0)
    if isinstance(exc, StepFailed):
        return max(exc.step_index - 1 - began, 0)
    return None


def _step_at(exc: BaseException | None) -> str | None:
    """Return the name of the step the execution ended at, when its end says which."""
    return exc.step_name if isinstance(exc, StepFailed) else None


def ending(plan: Plan, exc: BaseException | None) -> RunEvent:
    """Return the event telling how an execution of ``plan`` that ended with ``exc``
    (None: the run is done) left its run."""
    workflow, version = plan.workflow or (None, None)
    event, detail = "given_back", _error(exc) if exc is not None else {}
    if exc is None:
        event = "finished"
    else:
        for kind, name, describe in _ENDS:
            if isinstance(exc, kind):
                event, detail = name, describe(exc)
                break
    return RunEvent(
        event,
        plan.run_id,
        workflow,
        version,
        _step_at(exc),
        {**detail, "steps": steps} if (steps := _steps_done(plan, exc)) is not None else detail,
    )


def _next_step(plan: Plan, cp: Checkpoint) -> str | None:
    index = cp.step + 1
    return plan.names[index] if 0 <= index < len(plan.names) else None


def claim_event(plan: Plan, loaded: Checkpoint, claimed: Checkpoint) -> RunEvent:
    """Return the event of a claim of ``loaded`` that landed as ``claimed``.

    A claim of an owned run is a takeover (its owner's lease expired). Otherwise the
    claim's latency is the seconds since the run was due: a timer's wake-up once past,
    else its last write (queued, or a signal delivered). The two stamps are other hosts'
    wall clocks: a skewed clock skews the histogram, never a decision.
    """
    workflow, version = plan.workflow or (None, None)
    if loaded.owner is not None:
        detail: Detail = {
            "previous_owner": loaded.owner,
            "lease": loaded.lease or _lease.DEFAULT_LEASE,
            "epoch": claimed.epoch,
        }
        return RunEvent(
            "taken_over", plan.run_id, workflow, version, _next_step(plan, loaded), detail
        )
    now = utcnow()
    # A "due now" mark (a signal, a nudge: near 1970 on purpose) is no time it was due
    # at: the last write, which set it, is.
    due = (
        loaded.wake_at
        if loaded.wake_at is not None and DUE_NOW_UNTIL <= loaded.wake_at <= now
        else loaded.updated_at
    )
    latency = None if due is None else round(max((now - due).total_seconds(), 0.0), 6)
    detail = {"status": loaded.status, "epoch": claimed.epoch, "latency": latency}
    return RunEvent("claimed", plan.run_id, workflow, version, _next_step(plan, loaded), detail)
