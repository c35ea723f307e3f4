"""The core's writes: a run's save by compare-and-swap (re-based on concurrent signals
and cancel requests, fenced by its lease), and the saves that end a step or a run: a
cancel honoured, a failure recorded, a run failed. ``_core`` drives steps with them; code
workflows write with them too."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from . import _lease
from ._checkpoint import Checkpoint, Failure, evolve, utcnow
from ._codec import pristine
from ._control import cancel_children
from ._effects import (
    Effect,
    Load,
    Save,
)
from ._errors import (
    ConflictError,
    LeaseLost,
    RunCancelled,
    StepFailed,
    StoreError,
)
from ._observe import logger, span
from ._plan import Plan
from ._steps import (
    safe_text,
)
from ._suspend import nudge

# Flow control (issue 37): what a step that names limits does around its call.
from ._flow import _runs as _flow_runs  # isort: skip


# How often a save may be re-based on concurrent signals or cancel requests before the
# run gives up with ConflictError: each retry means another writer changed the record.
_MAX_REBASES = 50


def write(
    plan: Plan, base: Checkpoint, intended: Checkpoint, what: str
) -> Generator[Effect, Any, Checkpoint]:
    """Save ``intended`` (built on ``base``), re-basing it on signals or cancel requests.

    Raises:
        LeaseLost: another owner took the run over; nothing was written.
        ConflictError: another writer advanced the run.
    """
    if intended.owner is not None and intended.owner == plan.owner:
        # Every write of ours moves renewed_at (and with it due_at): a claimant watching
        # the claim index sees each of our saves as a sign of life, not only renewals.
        intended = evolve(intended, renewed_at=utcnow())
    for _ in range(_MAX_REBASES):
        try:
            with span(plan.on, "stepstone.save", run_id=plan.run_id, step=intended.step, what=what):
                saved: Checkpoint = yield Save(intended, what)
        except LeaseLost:
            raise
        except ConflictError:
            stored = yield Load(plan.run_id)
            intended = _lease.rebase(base, intended, stored)
            base = stored
            continue
        logger.debug("run %r: saved %s, version %s", plan.run_id, what, saved.version)
        return saved
    raise ConflictError(
        f"run {plan.run_id!r}: {_MAX_REBASES} writers changed the record during one save",
        plan.run_id,
    )


def _finish_cancelled(plan: Plan, cp: Checkpoint) -> Generator[Effect, Any, None]:
    final = _lease.released(evolve(cp, cancelled=True, waiting_for=None, wake_at=None))
    yield from write(plan, cp, final, "cancellation")
    yield from _flow_runs.end(cp)
    if cp.children:
        yield from cancel_children(cp.children)
    if cp.parent is not None:
        yield from nudge(cp.parent)
    logger.info("run %r: cancelled at step %d", plan.run_id, cp.step + 1)
    raise RunCancelled(plan.run_id)


def _latest(plan: Plan, cp: Checkpoint) -> Checkpoint:
    """Return the newest record of ours: a renewal during a step or pause replaced ``cp``."""
    current = plan.current
    if current is not None and current.owner == cp.owner and current.epoch == cp.epoch:
        return current
    return cp


def _failure(index: int, name: str, attempt: int, error: BaseException) -> Failure:
    return Failure(
        step_index=index,
        step_name=name,
        error_type=type(error).__qualname__,
        # Exception text may hold anything, and __str__ may even raise.
        message=safe_text(error),
        attempt=attempt,
        at=utcnow(),
    )


def _record_failure(
    plan: Plan,
    cp: Checkpoint,
    index: int,
    name: str,
    attempt: int,
    error: BaseException,
    final: bool = False,
    fence: bool = False,
) -> Generator[Effect, Any, Checkpoint]:
    """Save the failure of step ``index`` without advancing the run.

    A retried failure keeps ``attempt`` so a crash during the backoff does not reset the
    count. A final one stores ``attempt`` 0 (the number stays in ``failure.attempt``) and
    gives the lease back: the run is marked failed, and whoever runs it again, after
    fixing the cause, gets the policy's full budget back. Only crashes, which record no
    failure, eat into a budget.

    ``fence``: the attempt timed out and its thread may still run (issue 33). The same
    write moves the lease to a new epoch, still ours: the late thread's writes through
    its ``ctx`` (``reserve``, ``emit``, flow slots) name the old epoch and are refused
    or dropped exactly as a frozen owner's are after a takeover.
    """
    failed = evolve(
        cp,
        state=pristine(cp),
        attempt=0 if final else attempt,
        failure=_failure(index, name, attempt, error),
        waiting_for=None,
    )
    if final:
        failed = _lease.released(evolve(failed, wake_at=None))
    elif fence:
        failed = evolve(failed, epoch=cp.epoch + 1)
    saved: Checkpoint = yield from write(plan, cp, failed, f"failure of step {index}")
    return saved


def _fail(
    plan: Plan,
    cp: Checkpoint,
    index: int,
    name: str,
    attempt: int,
    error: Exception,
) -> Generator[Effect, Any, None]:
    """Save the failure on the run, then raise ``StepFailed`` from ``error``."""
    try:
        cp = yield from _record_failure(plan, cp, index, name, attempt, error, final=True)
    except ConflictError:
        raise
    except StoreError as save_error:
        # The run fails either way; the step's error is the one the caller needs.
        logger.error("run %r: could not save the failure record: %s", cp.run_id, save_error)
    yield from _flow_runs.end(cp)
    if cp.parent is not None:
        yield from nudge(cp.parent)
    logger.error(
        "run %r: step %d (%r) failed on attempt %d: %s",
        cp.run_id,
        index,
        name,
        attempt,
        type(error).__name__,
    )
    raise StepFailed(cp.run_id, index, name, pristine(cp), attempt) from error


# --- suspending steps -----------------------------------------------------------------
