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
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

from . import _hooks, _lease
from ._checkpoint import Checkpoint, Failure, evolve, utcnow
from ._codec import encode_state
from ._errors import (
    ConflictError,
    InputMismatch,
    LeaseLost,
    RunCancelled,
    RunOwned,
    StepFailed,
    StepstoneError,
    StoreError,
    StoreUnavailable,
    Suspended,
    WorkflowChanged,
)
from ._observe import logger, span
from ._steps import AttemptsExhausted, Step, StepContext, idempotency_key, safe_text

__all__ = [
    "Call",
    "Effect",
    "Interrupted",
    "Load",
    "Pause",
    "Plan",
    "Renewing",
    "Save",
    "astep_through",
    "execute",
    "renew",
    "step_through",
]

State = dict[str, Any]

# How often a save may be re-based on concurrent signals or cancel requests before the
# run gives up with ConflictError: each retry means another writer changed the record.
_MAX_REBASES = 50
# How often a suspending step looks again because something arrived while it saved
# itself as waiting, before it leaves the rest to a worker.
_MAX_LOOKS = 5


class Interrupted(StepstoneError):
    """The run was given back at a step boundary because its worker is stopping."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} handed over: its worker is stopping")
        self.run_id = run_id


class Effect:
    """Something the core asks its driver to do."""

    __slots__ = ()


class Load(Effect):
    """Load ``run_id``'s checkpoint; the result is a ``Checkpoint`` or None."""

    __slots__ = ("run_id",)

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


class Save(Effect):
    """Save ``cp`` (compare-and-swap); the result is the stored ``Checkpoint``.

    ``owned`` saves are the run's own; the driver records the result as the latest
    record the run holds (the one to release if the run is interrupted).
    """

    __slots__ = ("cp", "owned", "what")

    def __init__(self, cp: Checkpoint, what: str, owned: bool = True) -> None:
        self.cp = cp
        self.what = what
        self.owned = owned


class Call(Effect):
    """Call ``step.fn`` on ``state``; the result is what the step returned.

    While the step runs the driver renews the lease on ``base`` when it has to, and
    keeps ``Plan.current`` at the latest record; a lost lease is thrown back in as
    ``LeaseLost`` once the step has returned.
    """

    __slots__ = ("base", "ctx", "state", "step")

    def __init__(self, step: Step, state: State, ctx: StepContext | None, base: Checkpoint) -> None:
        self.step = step
        self.state = state
        self.ctx = ctx
        self.base = base


class Renewing(Effect):
    """Perform the effects of ``gen`` while renewing the lease as during a step.

    For a suspending step's own bookkeeping (a ``Map`` loading or creating thousands of
    child records), which may take longer than the lease. The result is what ``gen``
    returns; its errors are thrown back in as they are, and a lost lease as
    ``LeaseLost`` once ``gen`` has ended. ``gen`` itself makes no owned save.
    """

    __slots__ = ("gen",)

    def __init__(self, gen: Generator[Effect, Any, Any]) -> None:
        self.gen = gen


class Pause(Effect):
    """Wait ``seconds`` (a retry's backoff, or watching a lease), renewing ``base``'s lease."""

    __slots__ = ("base", "seconds")

    def __init__(self, seconds: float, base: Checkpoint | None) -> None:
        self.seconds = seconds
        self.base = base


class Plan:
    """One execution of a run: what to run, as whom, and what the driver must track."""

    __slots__ = (
        "current",
        "input",
        "lease",
        "names",
        "on",
        "owner",
        "preclaimed",
        "renewal",
        "run_id",
        "steps",
        "stop_requested",
        "total",
        "workflow",
        "written_at",
    )

    def __init__(
        self,
        run_id: str,
        steps: list[Any],
        *,
        input: State | None,
        workflow: tuple[str, str | None] | None,
        owner: str,
        lease: float,
        on: bool,
        preclaimed: Checkpoint | None = None,
    ) -> None:
        self.run_id = run_id
        self.steps = steps
        self.names = tuple(step.name for step in steps)
        self.total = len(steps)
        self.input = input
        self.workflow = workflow
        self.owner = owner
        self.lease = lease
        self.on = on
        self.preclaimed = preclaimed
        #: The latest record this execution owns (None when it owns nothing): what a
        #: driver releases if the run is interrupted, and what renewals start from.
        self.current: Checkpoint | None = preclaimed
        #: Monotonic time of this execution's last write (any write renews the lease).
        self.written_at = time.monotonic()
        #: The driver's renewal bookkeeping for this execution.
        self.renewal: Any = None
        #: Set by a stopping worker: give the run back at the next step boundary.
        self.stop_requested = False


Run = Generator[Effect, Any, State]


def step_through(gen: Generator[Effect, Any, Any], perform: Callable[[Effect], Any]) -> Any:
    """Drive ``gen`` to its end, performing each effect it yields with ``perform``.

    The result of an effect is sent back in; an error it raises is thrown back in, so
    the core decides what an error means. Returns what ``gen`` returns.
    """
    send: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                effect = gen.send(send) if error is None else gen.throw(error)
            except StopIteration as stop:
                return stop.value
            send = error = None
            try:
                send = perform(effect)
            except Exception as exc:
                error = exc
    finally:
        gen.close()


async def astep_through(
    gen: Generator[Effect, Any, Any], perform: Callable[[Effect], Awaitable[Any]]
) -> Any:
    """``step_through`` for an async ``perform``; the same loop, each effect awaited."""
    send: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                effect = gen.send(send) if error is None else gen.throw(error)
            except StopIteration as stop:
                return stop.value
            send = error = None
            try:
                send = await perform(effect)
            except Exception as exc:
                error = exc
    finally:
        gen.close()


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


def pristine(cp: Checkpoint) -> State:
    """Return a fresh copy of the checkpoint's state that no step has touched."""
    if cp.state_json is not None:
        loaded: State = json.loads(cp.state_json)
        return loaded
    return encode_state(cp.state)[1]


# --- checks before anything runs -----------------------------------------------------


def check_names(run_id: str, names: tuple[str, ...], done: tuple[str, ...]) -> None:
    """Refuse to resume when the completed steps are not the first steps passed now."""
    if names[: len(done)] == done:
        return
    for position, recorded in enumerate(done):
        now = names[position] if position < len(names) else None
        if now != recorded:
            shown = "no step" if now is None else f"step {now!r}"
            raise WorkflowChanged(
                f"run {run_id!r}: workflow changed at position {position}: the checkpoint "
                f"completed step {recorded!r} there, the steps passed now have {shown}. "
                "Only appending steps at the end is allowed; use a new run_id for a "
                "different workflow",
                run_id,
                position,
            )


def check_workflow(run_id: str, cp: Checkpoint, workflow: tuple[str, str | None] | None) -> None:
    """Refuse to run a run recorded under one workflow with another workflow's steps."""
    if cp.workflow is None:
        return
    if workflow is None:
        raise WorkflowChanged(
            f"run {run_id!r} was started from workflow {cp.workflow!r} version "
            f"{cp.workflow_version!r}; run it with that Workflow, not a bare list of steps",
            run_id,
            -1,
        )
    if (cp.workflow, cp.workflow_version) != workflow:
        raise WorkflowChanged(
            f"run {run_id!r} was started from workflow {cp.workflow!r} version "
            f"{cp.workflow_version!r}, not {workflow[0]!r} version {workflow[1]!r}; a run "
            "only ever runs with the workflow it was started from",
            run_id,
            -1,
        )


def first_difference(recorded: object, given: object, path: str = "input") -> str | None:
    """Return the path of the first difference between two JSON values, or None."""
    if isinstance(recorded, dict) and isinstance(given, dict):
        for key in sorted(set(recorded) | set(given)):
            where = f"{path}[{key!r}]"
            if key not in recorded:
                return f"{where} (not in the recorded input)"
            if key not in given:
                return f"{where} (missing from the input given)"
            found = first_difference(recorded[key], given[key], where)
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(given, list):
        if len(recorded) != len(given):
            return f"{path} (length {len(recorded)} recorded, {len(given)} given)"
        for index, (a, b) in enumerate(zip(recorded, given, strict=True)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if type(recorded) is not type(given) or recorded != given:
        return f"{path} (recorded {_short(recorded)}, given {_short(given)})"
    return None


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def check_input(run_id: str, cp: Checkpoint, given: State | None) -> None:
    """Refuse to resume with an input other than the recorded one (None uses the record)."""
    if given is None:
        return
    recorded = cp.input if cp.input is not None else {}
    difference = first_difference(recorded, given)
    if difference is not None:
        raise InputMismatch(
            f"run {run_id!r} was started with another input: first difference at "
            f"{difference}; nothing was run. Resume with input=None (or the same input), "
            "or use a new run_id",
            run_id,
            difference.partition(" ")[0],
        )


# --- the run --------------------------------------------------------------------------


def execute(plan: Plan) -> Run:
    """Start or resume the run; return its final state (see ``stepstone.run``)."""
    run_id = plan.run_id
    with span(plan.on, "stepstone.run", run_id=run_id, steps=plan.total) as run_span:
        cp = yield from _acquire(plan)
        if cp.step + 1 >= plan.total:
            if cp.owner == plan.owner:
                # Claimed with nothing left to run (no steps at all): give it back.
                done = evolve(cp, total_steps=plan.total, queued=False)
                cp = yield from write(plan, cp, _lease.released(done), "finish")
            logger.info("run %r: already done, nothing to run", run_id)
            run_span.set_attribute("outcome", "already_done")
            return pristine(cp)
        working = pristine(cp)
        index = cp.step + 1
        while index < plan.total:
            if cp.cancel_requested:
                yield from _finish_cancelled(plan, cp)
            if plan.stop_requested:
                yield from write(plan, cp, _lease.released(cp), "hand-over")
                logger.info("run %r: handed over at step %d (worker stopping)", run_id, index)
                raise Interrupted(run_id)
            step = plan.steps[index]
            if isinstance(step, Step):
                cp, working = yield from _run_step(plan, index, cp, working)
            else:
                cp, working = yield from _run_suspending(plan, index, cp, working)
            index = cp.step + 1
        if cp.parent is not None:
            yield from _nudge(cp.parent)
        logger.info("run %r: done after %d steps", run_id, plan.total)
        run_span.set_attribute("outcome", "done")
        return working


def _acquire(plan: Plan) -> Generator[Effect, Any, Checkpoint]:
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
            found = yield from _watch_lease(plan, cp)
            continue
        if status == "waiting" and not _ready(plan, cp):
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
    )
    try:
        cp: Checkpoint = yield Save(_lease.claimed(fresh, plan.owner, plan.lease), "start")
    except ConflictError:
        return None
    logger.info("run %r: starting, %d steps", plan.run_id, plan.total)
    return cp


def _watch_lease(plan: Plan, cp: Checkpoint) -> Generator[Effect, Any, Checkpoint]:
    """Wait until ``cp``'s owner has not renewed for a whole lease, by our own clock.

    Returns the record to claim. A record that changes while we watch means a live
    owner: refused with ``RunOwned`` (or, if it finished meanwhile, returned as is).
    """
    run_id = plan.run_id
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
    started = time.monotonic()
    # The owner's own writes only: signals and cancel requests arriving for a dead
    # owner's run must not keep it alive.
    mark = _lease.owner_mark(cp)
    latest = cp
    while True:
        left = lease - (time.monotonic() - started)
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
                "is live: the record changed while we watched); a second execution was "
                "refused. Wait for it, cancel it with stepstone.cancel, or let a worker "
                "take it over if its owner dies",
                run_id,
                holder or "?",
            )
        latest = now  # signals may have come: claim on the newest version


def _ready(plan: Plan, cp: Checkpoint) -> bool:
    """Return whether a waiting run has what it waits for (signal, due timer, children)."""
    index = cp.step + 1
    if index >= plan.total:
        return True
    step = plan.steps[index]
    if isinstance(step, Step):
        return True
    return bool(step.ready(cp))


# --- saving ---------------------------------------------------------------------------


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
    if cp.children:
        from ._control import cancel_children  # noqa: PLC0415 - the modules refer to each other

        yield from cancel_children(cp.children)
    if cp.parent is not None:
        yield from _nudge(cp.parent)
    logger.info("run %r: cancelled at step %d", plan.run_id, cp.step + 1)
    raise RunCancelled(plan.run_id)


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
    # The last step's save gives the lease back: a finished run has no owner.
    return _lease.released(done) if index + 1 >= plan.total else done


def _latest(plan: Plan, cp: Checkpoint) -> Checkpoint:
    """Return the newest record of ours: a renewal during a step or pause replaced ``cp``."""
    current = plan.current
    if current is not None and current.owner == cp.owner and current.epoch == cp.epoch:
        return current
    return cp


def _run_step(
    plan: Plan, index: int, cp: Checkpoint, working: State
) -> Generator[Effect, Any, tuple[Checkpoint, State]]:
    """Run one step (with its retries) and save its checkpoint; return both."""
    run_id = plan.run_id
    step: Step = plan.steps[index]
    policy = step.retry
    durable_attempts = policy is not None and policy.max_attempts > 1
    attempt = cp.attempt  # attempts already begun on this step, by earlier processes too
    while True:
        attempt += 1
        with span(
            plan.on, "stepstone.step", run_id=run_id, step=step.name, index=index, attempt=attempt
        ) as step_span:
            if policy is not None and attempt > policy.max_attempts:
                exc: Exception = AttemptsExhausted(
                    f"step {step.name!r} already began {attempt - 1} of "
                    f"{policy.max_attempts} allowed attempts in earlier processes"
                )
                step_span.set_attribute("outcome", "exhausted")
                yield from _fail(plan, cp, index, step.name, attempt - 1, exc)
            if durable_attempts:
                # Count the attempt before making it: a crash inside must not reset it.
                cp = yield from write(
                    plan, cp, evolve(cp, attempt=attempt), f"attempt {attempt} of step {index}"
                )
                if cp.cancel_requested:
                    yield from _finish_cancelled(plan, cp)
            logger.debug("run %r: step %d (%r) attempt %d", run_id, index, step.name, attempt)
            _hooks.fire("runner.before_step")
            ctx = (
                StepContext(
                    run_id, index, step.name, attempt, idempotency_key(run_id, index, step.name)
                )
                if step.takes_context
                else None
            )
            try:
                update = yield Call(step, working, ctx, cp)
                if update is not None and not isinstance(update, Mapping):
                    raise TypeError(
                        f"step {step.name!r} returned a {type(update).__name__}; "
                        "a step returns a dict of updates or None"
                    )
                # Read the update inside the step's try: a Mapping's own methods are
                # user code too, and may raise.
                changes = dict(update) if update else None
            except LeaseLost:
                raise
            except Exception as error:
                cp = _latest(plan, cp)
                step_span.record_exception(error)
                if (
                    policy is not None
                    and attempt < policy.max_attempts
                    and _should_retry(policy, error)
                ):
                    step_span.set_attribute("outcome", "retry")
                    cp = yield from _record_failure(plan, cp, index, step.name, attempt, error)
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
            cp = _latest(plan, cp)
            _hooks.fire("runner.after_step")
            if changes:
                working.update(changes)
            saved = yield from write(
                plan, cp, _completed(plan, cp, index, working), f"step {index}"
            )
            _hooks.fire("runner.after_save")
            step_span.set_attribute("outcome", "ok")
            # The stored copy is ours alone; hand it on rather than copying again.
            next_working = saved.state if saved.state_json is not None else pristine(saved)
            return saved, next_working


def _should_retry(policy: Any, error: BaseException) -> bool:
    """Ask the policy; a ``retry_on`` predicate that raises means no retry, logged."""
    try:
        return bool(policy.should_retry(error))
    except Exception:
        logger.exception("the retry_on predicate raised; not retrying")
        return False


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
) -> Generator[Effect, Any, Checkpoint]:
    """Save the failure of step ``index`` without advancing the run.

    A retried failure keeps ``attempt`` so a crash during the backoff does not reset the
    count. A final one stores ``attempt`` 0 (the number stays in ``failure.attempt``) and
    gives the lease back: the run is marked failed, and whoever runs it again, after
    fixing the cause, gets the policy's full budget back. Only crashes, which record no
    failure, eat into a budget.
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
    if cp.parent is not None:
        yield from _nudge(cp.parent)
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


def _nudge(parent: str) -> Generator[Effect, Any, None]:
    from ._suspend import nudge  # noqa: PLC0415

    yield from nudge(parent)


def _run_suspending(
    plan: Plan, index: int, cp: Checkpoint, working: State
) -> Generator[Effect, Any, tuple[Checkpoint, State]]:
    """Run a ``WaitFor``, ``Sleep`` or ``Map``: complete it, or save the run as waiting."""
    from ._suspend import (  # noqa: PLC0415 - the modules refer to each other
        Complete,
        StepCodeError,
        Wait,
    )

    step = plan.steps[index]
    policy = step.retry
    attempt = cp.attempt
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
            except (ConflictError, StoreUnavailable):
                # The step's own bookkeeping (a Map's child records, the lease) met a store
                # that failed or a lost lease: the run stops as after a failed save, and
                # whoever resumes it evaluates the step again. Never the step's failure.
                raise
            except Exception as caught:
                cp = _latest(plan, cp)
                error = caught.error if isinstance(caught, StepCodeError) else caught
                if (
                    policy is not None
                    and attempt < policy.max_attempts
                    and _should_retry(policy, error)
                ):
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
                    working.update(outcome.update)
                saved = yield from write(
                    plan,
                    cp,
                    _completed(plan, cp, index, working, **outcome.changes),
                    f"step {index}",
                )
                _hooks.fire("runner.after_save")
                return saved, pristine(saved)
            assert isinstance(outcome, Wait)
            wake_at = outcome.wake_at
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
            # A cancel or a signal may have arrived while we looked (our save was re-based
            # on it): take the run back and act on it now rather than sleep on it.
            if saved.cancel_requested or (
                step.ready(saved) and not outcome.poll_only and looks < _MAX_LOOKS
            ):
                cp = yield from write(
                    plan, saved, _lease.claimed(saved, plan.owner, plan.lease), "claim"
                )
                if cp.cancel_requested:
                    yield from _finish_cancelled(plan, cp)
                resumed = True
                continue
            logger.info("run %r: waiting for %s", plan.run_id, outcome.waiting_for)
            raise Suspended(plan.run_id, outcome.waiting_for, outcome.wake_at)
