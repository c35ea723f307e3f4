"""The rules of a run, written once, for ``run`` and ``arun`` alike (a sans-I/O core).

``execute`` is a generator. It never touches the store, the clock's sleep or a step's
function itself: it *yields* what it needs done (an ``Effect``: load, save, call a step,
pause) and is sent the result, or has the error thrown in. ``run`` drives it with plain
calls, ``arun`` with awaits; each driver is a loop of a few lines. So resume, skip,
retries, failure records, the workflow and input checks, leases, cancellation,
suspension, hooks, spans and logs exist exactly once, and the sync and async runners
cannot drift apart.

Why a generator rather than async code turned into sync code by a generator script
(httpcore's ``unasync``): the runner calls user steps, which may be sync or async in
either runner, and renews a lease *concurrently* with a running step; both are a
driver's business. The core stays pure logic and is tested through both drivers.

Around it, each in its own module and imported here (never importing the core back):
the effects and the two loops that perform them (``_effects``), the checks made before
anything runs (``_checks``), taking the run's lease (``_acquire``), the suspending steps
(``_suspend``) and the operations on children (``_control``).
"""

from __future__ import annotations

import inspect
from collections.abc import Generator, Mapping
from typing import Any

from . import _budget, _hooks, _lease, _spending
from ._acquire import acquire, ready
from ._append_only import trusting
from ._checkpoint import Checkpoint, evolve
from ._checks import check_input, check_names, check_workflow, first_difference
from ._codec import pristine
from ._deadline_run import DeadlineExceeded, deadline_armed, deadline_reached
from ._effects import Announce, Call, Effect, Load, Pause, Save, step_through
from ._errors import (
    ConflictError,
    InvalidState,
    LeaseLost,
    RunCancelled,
    StepstoneError,
    StepTimeout,
    StoreError,
    StoreUnavailable,
    Suspended,
    WorkflowChanged,
)
from ._meter import Meter
from ._observe import logger, span
from ._plan import Plan
from ._steps import (
    AttemptsExhausted,
    Complete,
    Step,
    StepCodeError,
    StepContext,
    Wait,
    idempotency_key,
    retries,
)
from ._store_time import Now
from ._suspend import nudge

# Flow control (issue 37): what a step that names limits does around its call.
from ._flow import _hook as _flow  # isort: skip
from ._flow import _runs as _flow_runs  # isort: skip
from ._flow._call import FlowCall  # isort: skip
from ._write import _MAX_REBASES, _fail, _finish_cancelled, _latest, _record_failure, write

__all__ = [
    # The run's rules, defined here.
    "Interrupted",
    "execute",
    "renew",
    # Re-exported from ``_write``, where the saves live.
    "write",
    # Re-exported from the modules they moved to, for the modules importing them here.
    "Call",
    "Effect",
    "Load",
    "Pause",
    "Plan",
    "Save",
    "check_input",
    "check_names",
    "check_workflow",
    "first_difference",
    "pristine",
    "ready",
    "step_through",
]

State = dict[str, Any]

# How often a suspending step looks again because something arrived while it saved
# itself as waiting, before it leaves the rest to a worker.
_MAX_LOOKS = 5


class Interrupted(StepstoneError):
    """The run was given back at a step boundary because its worker is stopping."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} handed over: its worker is stopping")
        self.run_id = run_id


Run = Generator[Effect, Any, State]


# --- the run --------------------------------------------------------------------------


def execute(plan: Plan) -> Run:
    """Start or resume the run; return its final state (see ``stepstone.run``)."""
    run_id = plan.run_id
    with span(plan.on, "stepstone.run", run_id=run_id, steps=plan.total) as run_span:
        cp = yield from acquire(plan)
        if cp.owner == plan.owner and (plan.deadline is not None or cp.timing):
            cp = yield from deadline_armed(plan, cp, write)  # issue 33
        if cp.step + 1 >= plan.total:
            if cp.owner == plan.owner:
                # Claimed with nothing left to run (no steps at all): give it back.
                done = evolve(cp, total_steps=plan.total, queued=False)
                cp = yield from write(plan, cp, _lease.released(done), "finish")
            logger.info("run %r: already done, nothing to run", run_id)
            run_span.set_attribute("outcome", "already_done")
            return pristine(cp)
        if plan.budget is not None:
            cp = yield from _spending.record(plan, cp, write)  # on record before any step
        cp = yield from _flow_runs.take(plan, cp, write)  # flow control: the run's own keys
        working = pristine(cp)
        index = cp.step + 1
        while index < plan.total:
            if cp.cancel_requested:
                yield from _finish_cancelled(plan, cp)
            if plan.deadline_passed():
                cp = yield from deadline_reached(plan, cp, index, write)  # issue 33
                working = pristine(cp)
            if plan.stop_requested:
                yield from write(plan, cp, _lease.released(cp), "hand-over")
                yield Announce()  # another worker may take it now
                logger.info("run %r: handed over at step %d (worker stopping)", run_id, index)
                raise Interrupted(run_id)
            step = plan.steps[index]
            if isinstance(step, Step):
                cp, working = yield from _run_step(plan, index, cp, working)
            else:
                cp, working = yield from _run_suspending(plan, index, cp, working)
            index = cp.step + 1
        yield from _flow_runs.end(cp)
        if cp.parent is not None:
            yield from nudge(cp.parent, done=cp.run_id)
        logger.info("run %r: done after %d steps", run_id, plan.total)
        run_span.set_attribute("outcome", "done")
        return working


def renew(plan: Plan) -> Generator[Effect, Any, BaseException | None]:
    """Renew the lease on ``plan.current``; return the ``LeaseLost`` if it is gone.

    A renewal that conflicts with a signal or a cancel request is re-based like any
    save. A store that cannot be reached is logged and left for the next renewal: the
    lease is still ours until it expires.
    """
    cp = plan.current
    if cp is None:
        return None
    intended = _lease.renewal(cp)
    for _ in range(_MAX_REBASES):
        try:
            yield Save(intended, "lease renewal")
            logger.debug("run %r: lease renewed", plan.run_id)
            _hooks.fire("lease.renewed")
            return None
        except LeaseLost as exc:
            return exc
        except ConflictError:
            try:
                stored = yield Load(plan.run_id)
                intended = _lease.rebase(cp, _lease.renewal(cp), stored)
            except ConflictError as exc:
                return exc
            if stored is not None:
                # A renewal changes nothing but the lease: a due time set by another
                # writer (a child's nudge, a signal) stays, or the wake-up is lost.
                intended = evolve(intended, wake_at=stored.wake_at)
                cp = stored
        except StoreError as exc:
            logger.warning("run %r: lease renewal failed: %s", plan.run_id, exc)
            return None
    return None


# --- saving ---------------------------------------------------------------------------


def _completed(
    plan: Plan, cp: Checkpoint, index: int, working: State, **changes: Any
) -> Checkpoint:
    """Return the record of step ``index`` completed with ``working`` as the state."""
    done = evolve(
        cp,
        step=index,
        state=working,
        step_names=plan.names[: index + 1],
        total_steps=plan.total,
        attempt=0,
        failure=None,
        waiting_for=None,
        wake_at=None,
        children=(),
        **changes,
    )
    if plan.append_only:  # the workflow's declared trade (``_append_only``)
        done = trusting(done, plan.append_only)
    # The last step's save gives the lease back: a finished run has no owner.
    return _lease.released(done) if index + 1 >= plan.total else done


def _exhausted(
    plan: Plan, cp: Checkpoint, index: int, attempt: int, step_span: Any
) -> Generator[Effect, Any, None]:
    """Fail the run if earlier processes already began every attempt the policy allows."""
    step = plan.steps[index]
    policy = step.retry
    if policy is not None and attempt > policy.max_attempts:
        exc: Exception = AttemptsExhausted(
            f"step {step.name!r} already began {attempt - 1} of "
            f"{policy.max_attempts} allowed attempts in earlier processes"
        )
        step_span.set_attribute("outcome", "exhausted")
        yield from _fail(plan, cp, index, step.name, attempt - 1, exc)


def _context(
    plan: Plan, step: Step, index: int, attempt: int, cp: Checkpoint, call: FlowCall
) -> StepContext | None:
    """The ``ctx`` a step that takes one gets for this attempt (None for one that does not)."""
    if not step.takes_context:
        return None
    return StepContext(
        plan.run_id,
        index,
        step.name,
        attempt,
        idempotency_key(plan.run_id, index, step.name),
        flow=call,  # the keys this call holds (``ctx.acquire``, ``_flow._call``)
        seed=(plan, cp),  # its meter's seed, for ctx.charge/reserve (``_meter``)
    )


def _before_attempt(
    plan: Plan,
    index: int,
    cp: Checkpoint,
    working: State,
    call: FlowCall,
    extra: Any,
    attempt: int,
    step_span: Any,
) -> Generator[Effect, Any, tuple[Checkpoint, bool]]:
    """What must hold before an attempt of step ``index`` runs; return the run and whether
    it spends under a budget. Fails the run whose attempts are used up, takes the step's
    flow-control keys (or parks the run), pauses it at its budget's hard limit, and
    counts a durable attempt before it is made (a crash inside must not reset it)."""
    step = plan.steps[index]
    yield from _exhausted(plan, cp, index, attempt, step_span)
    if step.limits or extra is not None or cp.waiting_for is not None:
        cp = yield from _flow.before(plan, index, cp, working, call, extra, write, _fail)
    # Spend budgets (``_budget``): at the hard limit the run pauses here, saved.
    spending = _budget.active(plan, cp)
    if spending:
        cp = yield from _spending.gate(plan, cp, write)
    policy = step.retry
    if policy is not None and policy.max_attempts > 1:
        cp = yield from write(
            plan, cp, evolve(cp, attempt=attempt), f"attempt {attempt} of step {index}"
        )
        if cp.cancel_requested:
            yield from _finish_cancelled(plan, cp)
    return cp, bool(spending)


def _commit(
    plan: Plan,
    index: int,
    cp: Checkpoint,
    working: State,
    changes: dict[str, Any] | None,
    call: FlowCall,
    meter: Meter | None,
    spending: bool,
    attempt: int,
    step_span: Any,
) -> Generator[Effect, Any, tuple[Checkpoint, State]]:
    """Save step ``index``'s result (its keys given back, its stream's attempt and its
    charges recorded by the same write); return the saved run and the next working state."""
    step = plan.steps[index]
    if call.held:
        yield from _flow.give_back(plan.run_id, cp.epoch, call, ran=True)
    _hooks.fire("runner.after_step")
    if changes:
        working.update(changes)
    # Streams (issue 34): the attempt that emitted and commits is recorded (once: a
    # later step that makes no call of its own must not record it again).
    streamed, plan.streamed = plan.streamed, None
    fields = {} if streamed is None else {"streams": {**cp.streams, str(index): streamed}}
    # The attempt's charges join the ledger in the state: saved by this very write.
    settled = (
        (yield from _spending.commit(plan, cp, working, meter, spending))
        if spending or meter is not None
        else None
    )
    try:
        saved = yield from write(
            plan, cp, _completed(plan, cp, index, working, **fields), f"step {index}"
        )
    except InvalidState as error:
        # The step's state can never be stored: a retry, here or by a worker that
        # claims the run again, would only repeat it. The run fails, recorded,
        # its message naming the path of the value that is not JSON.
        step_span.record_exception(error)
        step_span.set_attribute("outcome", "failed")
        yield from _fail(plan, cp, index, step.name, attempt, error)
    _hooks.fire("runner.after_save")
    _spending.after_save(plan, settled)
    step_span.set_attribute("outcome", "ok")
    # The stored copy is ours alone; hand it on rather than copying again.
    # (A long state's store hands back a state of its own too: ``stored_state``.)
    next_working = (
        saved.state
        if saved.state_json is not None or saved.stored_state is not None
        else pristine(saved)
    )
    return saved, next_working


def _run_step(
    plan: Plan, index: int, cp: Checkpoint, working: State
) -> Generator[Effect, Any, tuple[Checkpoint, State]]:
    """Run one step (with its retries) and save its checkpoint; return both."""
    run_id = plan.run_id
    step: Step = plan.steps[index]
    policy = step.retry
    attempt = cp.attempt  # attempts already begun on this step, by earlier processes too
    # Flow control (issue 37, ``_flow._hook``): the keys this call holds, and one that
    # ``ctx.acquire`` asked for.
    call, extra = FlowCall(), None
    while True:
        attempt += 1
        with span(
            plan.on, "stepstone.step", run_id=run_id, step=step.name, index=index, attempt=attempt
        ) as step_span:
            cp, spending = yield from _before_attempt(
                plan, index, cp, working, call, extra, attempt, step_span
            )
            logger.debug("run %r: step %d (%r) attempt %d", run_id, index, step.name, attempt)
            _hooks.fire("runner.before_step")
            ctx = _context(plan, step, index, attempt, cp, call)
            meter: Meter | None = None
            try:
                update = yield Call(step, working, ctx, cp)
                meter = ctx.returned() if ctx is not None else None
                if update is not None and not isinstance(update, Mapping):
                    if inspect.iscoroutine(update):
                        # Nothing will await it (a sync driver): close it, so the error
                        # below is the only report, not also a "never awaited" warning.
                        update.close()
                    raise TypeError(
                        f"step {step.name!r} returned a {type(update).__name__}; "
                        "a step returns a dict of updates or None"
                    )
                # Read the update inside the step's try: a Mapping's own methods are
                # user code too, and may raise.
                changes = dict(update) if update else None
            except LeaseLost:
                raise
            except _budget.BudgetExhausted as paused:  # ctx.reserve() met the hard limit
                step_span.set_attribute("outcome", "budget")
                yield from _spending.gate(plan, _latest(plan, cp), write, str(paused))
                raise  # pragma: no cover - the gate raised Suspended
            except Exception as error:  # noqa: BLE001 - a step may raise anything: its failure
                cp = _latest(plan, cp)
                extra = yield from _flow.after_error(plan, cp, step, call, error, attempt, write)
                if extra is not None:  # ``ctx.acquire`` of a key not held: take it first
                    attempt, working = attempt - 1, pristine(cp)
                    continue
                step_span.record_exception(error)
                if isinstance(error, DeadlineExceeded):  # issue 33: never retried
                    cp = yield from deadline_reached(plan, cp, index, write)
                    working = pristine(cp)
                    attempt = cp.attempt
                    continue
                if retries(policy, attempt, error):
                    step_span.set_attribute("outcome", "retry")
                    # Issue 33: a timed-out thread may still run: fence it off by epoch.
                    fence = isinstance(error, StepTimeout)
                    cp = yield from _record_failure(
                        plan, cp, index, step.name, attempt, error, fence=fence
                    )
                    if fence:  # the run's own keys were held at the old epoch: again
                        cp = yield from _flow_runs.take(plan, cp, write)
                    delay = policy.delay(attempt)
                    logger.warning(
                        "run %r: step %d (%r) attempt %d failed (%s), retrying in %.2fs",
                        run_id,
                        index,
                        step.name,
                        attempt,
                        type(error).__name__,
                        delay,
                    )
                    _hooks.fire("runner.backoff")
                    yield Pause(delay, cp)
                    cp = _latest(plan, cp)
                    if cp.cancel_requested:
                        yield from _finish_cancelled(plan, cp)
                    working = pristine(cp)
                    continue
                step_span.set_attribute("outcome", "failed")
                yield from _fail(plan, cp, index, step.name, attempt, error)
            return (
                yield from _commit(
                    plan,
                    index,
                    _latest(plan, cp),
                    working,
                    changes,
                    call,
                    meter,
                    spending,
                    attempt,
                    step_span,
                )
            )


def _with_stream(plan: Plan, cp: Checkpoint, index: int, changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` and, if the step's call emitted (an adapter's agent step), the
    committing attempt of its stream (issue 34), as ``_commit`` records a ``Step``'s."""
    streamed, plan.streamed = plan.streamed, None
    if streamed is None:
        return changes
    return {**changes, "streams": {**cp.streams, str(index): streamed}}


def _run_suspending(
    plan: Plan, index: int, cp: Checkpoint, working: State
) -> Generator[Effect, Any, tuple[Checkpoint, State]]:
    """Run a ``WaitFor``, ``Sleep`` or ``Map``: complete it, or save the run as waiting."""
    step = plan.steps[index]
    policy = step.retry
    attempt = cp.attempt
    resumed = cp.waiting_for is not None or cp.wake_at is not None
    if _budget.active(plan, cp) and (not resumed or cp.waiting_for == _budget.BUDGET_WAIT):
        # Spend budgets: before a step that may spend (an agent, children), as before a Step.
        cp = yield from _spending.gate(plan, cp, write)
        resumed = cp.waiting_for is not None or cp.wake_at is not None
    looks = 0
    while True:
        looks += 1
        first = not resumed
        if first:
            attempt += 1
        with span(plan.on, "stepstone.step", run_id=plan.run_id, step=step.name, index=index):
            if policy is not None and attempt > policy.max_attempts:
                yield from _fail(
                    plan,
                    cp,
                    index,
                    step.name,
                    attempt - 1,
                    AttemptsExhausted(f"step {step.name!r}: {policy.max_attempts} attempts"),
                )
            seen_wake_at = cp.wake_at
            try:
                outcome = yield from step.evaluate(plan, cp, index, working, first)
            except (
                ConflictError,
                StoreUnavailable,
                WorkflowChanged,
                RunCancelled,
                Interrupted,
                DeadlineExceeded,  # issue 33: a code workflow's call met the deadline
                Suspended,  # ... and the run waits for a person to extend it
            ):
                # The step's own bookkeeping (a Map's child records, the lease) met a store
                # that failed or a lost lease: the run stops as after a failed save, and
                # whoever resumes it evaluates the step again. Never the step's failure.
                # (A code workflow parks, cancels or hands over its run itself, ``_code``.)
                raise
            except Exception as caught:  # noqa: BLE001 - a step may raise anything: its failure
                cp = _latest(plan, cp)
                error = caught.error if isinstance(caught, StepCodeError) else caught
                if retries(policy, attempt, error):
                    cp = yield from _record_failure(plan, cp, index, step.name, attempt, error)
                    cp = yield from write(plan, cp, evolve(cp, wake_at=None, children=()), "retry")
                    yield Pause(policy.delay(attempt), cp)
                    cp = _latest(plan, cp)
                    resumed = False
                    continue
                yield from _fail(plan, cp, index, step.name, attempt, error)
            # Renewals during the step replaced ``cp``.
            cp = _latest(plan, cp)
            if isinstance(outcome, Complete):
                if outcome.update:
                    # An agent's usage charge: into its tree's pool and tenant first.
                    yield from _spending.push_usage(cp, outcome.update, attempt)
                    working.update(outcome.update)
                changes = _with_stream(plan, cp, index, outcome.changes)
                saved = yield from write(
                    plan, cp, _completed(plan, cp, index, working, **changes), f"step {index}"
                )
                _hooks.fire("runner.after_save")
                return saved, pristine(saved)
            assert isinstance(outcome, Wait)
            wake_at = outcome.wake_at
            if plan.deadline_at is not None and (wake_at is None or wake_at > plan.deadline_at):
                wake_at = plan.deadline_at  # issue 33: due at its deadline at the latest
            if cp.wake_at != seen_wake_at and cp.wake_at is not None:
                # Someone made the run due while we looked (a child finished and nudged
                # us); a renewal kept that on the record: keep the earlier time.
                wake_at = cp.wake_at if wake_at is None else min(wake_at, cp.wake_at)
            waiting = _lease.released(
                evolve(
                    cp,
                    attempt=attempt,
                    waiting_for=outcome.waiting_for,
                    wake_at=wake_at,
                    **outcome.changes,
                )
            )
            saved = yield from write(plan, cp, waiting, f"wait at step {index}")
            now = yield Now()  # the store's clock, as the step's own (``_suspend``)
            # A cancel or a signal may have arrived while we looked (our save was re-based
            # on it): take the run back and act on it now rather than sleep on it.
            if saved.cancel_requested or (
                step.ready(saved, now) and not outcome.poll_only and looks < _MAX_LOOKS
            ):
                cp = yield from write(
                    plan, saved, _lease.claimed(saved, plan.owner, plan.lease), "claim"
                )
                if cp.cancel_requested:
                    yield from _finish_cancelled(plan, cp)
                resumed = True
                continue
            if saved.wake_at is not None and saved.wake_at <= now:
                # Given back already due (a child finished while we looked, and we left
                # the rest to a worker): nobody else will announce it.
                yield Announce()
            logger.info("run %r: waiting for %s", plan.run_id, outcome.waiting_for)
            raise Suspended(plan.run_id, outcome.waiting_for, outcome.wake_at)
