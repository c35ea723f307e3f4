"""How a run is taken before its steps run: load it, check it, claim its lease.

``acquire`` is the first thing ``_core.execute`` does. A run nobody holds is claimed by
compare-and-swap; one held by another owner is watched until that owner has written
nothing for a whole lease (by our own clock), then taken over, or refused with
``RunOwned`` if the owner shows signs of life. A fresh run is created claimed.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import Any

from . import _clock, _lease
from ._budget import BUDGET_WAIT
from ._checkpoint import Checkpoint, utcnow
from ._checks import check_input, check_names, check_workflow
from ._codec import encode_state
from ._deadline import deadline_of
from ._effects import Effect, Load, Pause, Save
from ._errors import ConflictError, RunCancelled, RunOwned, Suspended
from ._observe import logger
from ._plan import Plan
from ._steps import Step
from ._store_time import Now, earliest

__all__ = ["acquire", "ready", "watch_lease"]


def acquire(plan: Plan) -> Generator[Effect, Any, Checkpoint]:
    """Load the run, check it may run now, and take its lease (unless a worker did)."""
    run_id = plan.run_id
    if plan.preclaimed is not None:
        cp = plan.preclaimed
        _check_resumable(plan, cp)
        return cp
    found: Checkpoint | None = yield Load(run_id)
    while True:
        if found is None:
            created = yield from _create(plan)
            if created is not None:
                return created
            found = yield Load(run_id)
            continue
        cp = found
        _check_resumable(plan, cp)
        status = cp.status
        if status == "cancelled":
            raise RunCancelled(run_id)
        if cp.step + 1 >= plan.total:
            return cp  # done (steps appended since are run: it is claimed below)
        if status == "queued" and cp.cancel_requested:
            raise RunCancelled(run_id)
        if cp.owner is not None and cp.owner != plan.owner:
            found = yield from watch_lease(run_id, cp)
            continue
        if status == "waiting" and not ready(plan, cp, (yield Now())):
            raise Suspended(run_id, cp.waiting_for or "?", cp.wake_at)
        try:
            claimed: Checkpoint = yield Save(_lease.claimed(cp, plan.owner, plan.lease), "claim")
        except ConflictError:
            found = yield Load(run_id)
            continue
        _log_resume(plan, claimed)
        return claimed


def _check_resumable(plan: Plan, cp: Checkpoint) -> None:
    check_names(plan.run_id, plan.names, cp.step_names)
    check_workflow(plan.run_id, cp, plan.workflow)
    check_input(plan.run_id, cp, plan.input)


def _log_resume(plan: Plan, cp: Checkpoint) -> None:
    nxt = cp.step + 1
    if nxt >= plan.total:
        return
    if nxt == 0:
        logger.info("run %r: starting, %d steps", plan.run_id, plan.total)
    else:
        logger.info(
            "run %r: resuming at step %d (%r), skipping %d completed",
            plan.run_id,
            nxt,
            plan.names[nxt],
            nxt,
        )


def _create(plan: Plan) -> Generator[Effect, Any, Checkpoint | None]:
    """Record a new run, claimed by us, with its input; None if someone else created it."""
    state = plan.input if plan.input is not None else {}
    workflow, version = plan.workflow if plan.workflow is not None else (None, None)
    fresh = Checkpoint(
        run_id=plan.run_id,
        state=encode_state(state)[1],
        total_steps=plan.total,
        input=encode_state(state)[1] if plan.input is not None else None,
        workflow=workflow,
        workflow_version=version,
        history=plan.history,
        flow=plan.flow,  # flow control: the keys its workflow declares
    )
    try:
        cp: Checkpoint = yield Save(_lease.claimed(fresh, plan.owner, plan.lease), "start")
    except ConflictError:
        return None
    logger.info("run %r: starting, %d steps", plan.run_id, plan.total)
    return cp


#: What ``RunOwned`` tells a second ``run`` of a run whose owner is alive.
_RUN_ADVICE = (
    "a second execution was refused. Wait for it, cancel it with stepstone.cancel, or let "
    "a worker take it over if its owner dies"
)


def watch_lease(
    run_id: str, cp: Checkpoint, advice: str = _RUN_ADVICE
) -> Generator[Effect, Any, Checkpoint]:
    """Wait until ``cp``'s owner has not renewed for a whole lease, by our own clock.

    Returns the record to claim, its lease given back (an owner known dead on this
    machine at once). A record that changes while we watch means a live owner: refused
    with ``RunOwned``, whose message ends with ``advice`` (or, if the run finished
    meanwhile, returned as is). ``run`` and ``rerun`` both take over this way.
    """
    lease = cp.lease or _lease.DEFAULT_LEASE
    if _lease.dead_here(cp.owner):
        logger.warning(
            "run %r: its owner %r was a process on this machine that no longer exists; "
            "taking the run over",
            run_id,
            cp.owner,
        )
        return _lease.released(cp)
    logger.info(
        "run %r: held by %r; waiting up to %.1fs for its lease to expire unrenewed",
        run_id,
        cp.owner,
        lease,
    )
    started = _clock.monotonic()
    # The owner's own writes only: signals and cancel requests arriving for a dead
    # owner's run must not keep it alive.
    mark = _lease.owner_mark(cp)
    latest = cp
    while True:
        left = lease - (_clock.monotonic() - started)
        if left <= 0:
            logger.warning(
                "run %r: owner %r did not renew its %.1fs lease; taking the run over",
                run_id,
                cp.owner,
                lease,
            )
            return _lease.released(latest)
        yield Pause(min(left, max(0.01, lease / 10)), None)
        now: Checkpoint | None = yield Load(run_id)
        if now is None or _lease.owner_mark(now) != mark:
            if now is not None and now.status in ("done", "cancelled"):
                return now
            holder = cp.owner if now is None else now.owner
            raise RunOwned(
                f"run {run_id!r} is being executed by {holder!r} (its lease of {lease:g}s "
                f"is live: the record changed while we watched); {advice}",
                run_id,
                holder or "?",
            )
        latest = now  # signals may have come: claim on the newest version


def ready(plan: Plan, cp: Checkpoint, now: datetime | None = None) -> bool:
    """Return whether a waiting run has what it waits for (signal, due timer, children)
    by ``now``: the store's clock (``Now``), or this host's when None."""
    index = cp.step + 1
    if index >= plan.total or cp.waiting_for == BUDGET_WAIT:
        return True  # a budget pause: the core's budget check decides (``_spending.gate``)
    step = plan.steps[index]
    if isinstance(step, Step):
        return True
    if cp.timing and _deadline_fell(cp, now):
        return True  # issue 33: the core acts on the deadline (``_deadline_run``)
    return bool(step.ready(cp, now))


def _deadline_fell(cp: Checkpoint, now: datetime | None) -> bool:
    at = deadline_of(cp)
    return at is not None and at <= (utcnow() if now is None else earliest(now))
