"""Acting on runs from outside: ``start``, ``cancel``, ``retry`` and ``signal`` (and their
async twins).

None of these owns the run. Each is a compare-and-swap loop on the run's record, written
once as a generator of ``Load``/``Save`` effects (as the runner's core is) and driven
by ``_sync`` or ``_async``. A write by one of them that races the run's owner makes the
owner's next save conflict; the owner re-bases on it (``_lease.rebase``): ``signal``
and ``cancel`` only ever touch the fields an owner merges (``signals``,
``cancel_requested``), or act alone on runs nobody owns.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator, Mapping
from datetime import timedelta
from typing import Any

from . import _clock
from ._budget import SPEND_KEY, Budget, check_budget
from ._checkpoint import DUE_NOW, Checkpoint, Signal, check_run_id, evolve, utcnow
from ._checks import check_clock, check_input
from ._codec import encode_state
from ._deadline import check_deadline, check_on_deadline, start_timing
from ._effects import Announce, Effect, Load, Pause, Save, astep_through, step_through
from ._errors import (
    ConflictError,
    InputMismatch,
    InvalidWorkflow,
    RunNotActive,
    RunNotFound,
    WorkflowChanged,
)
from ._flow import _runs as _flow_runs
from ._observe import logger
from ._steps import Workflow, workflow_label
from ._store import RunInfo, Store
from ._store_time import Now, astore_now, store_now
from ._suspend import nudge, queued
from ._wake import aannounce, announce

# cancel_op / signal_op: the operations as effect generators, for callers that drive them
# with their own compare-and-swap (the dashboard pins the version its page showed).
__all__ = [
    "Op",
    "acancel",
    "aretry",
    "asignal",
    "astart",
    "cancel",
    "cancel_children",
    "cancel_op",
    "performer",
    "retry",
    "retry_op",
    "signal",
    "signal_op",
    "start",
]

# Each retry means another writer changed the record between our load and our save.
_MAX_TRIES = 100
_MAX_SIGNAL_ID = 200

Op = Generator[Effect, Any, Any]


def performer(store: Store) -> Callable[[Effect], Any]:
    """The sync ``perform`` of a control operation's effects on ``store``."""

    def perform(effect: Effect) -> Any:
        if isinstance(effect, Save):
            return store.save(effect.cp)
        if isinstance(effect, Announce):
            return announce(store)
        if isinstance(effect, Now):
            return store_now(store)
        if isinstance(effect, Pause):  # watching a lease (``watch_lease``): renews nothing
            _clock.sleep(effect.seconds)  # the clock the lease is counted on
            return None
        assert isinstance(effect, Load)
        return store.load(effect.run_id)

    return perform


def _sync(gen: Op, store: Store) -> Any:
    return step_through(gen, performer(store))


async def _async(gen: Op, store: Store) -> Any:
    async def perform(effect: Effect) -> Any:
        if isinstance(effect, Save):
            return await store.asave(effect.cp)
        if isinstance(effect, Announce):
            return await aannounce(store)
        if isinstance(effect, Now):
            return await astore_now(store)
        if isinstance(effect, Pause):
            await _clock.asleep(effect.seconds)
            return None
        assert isinstance(effect, Load)
        return await store.aload(effect.run_id)

    return await astep_through(gen, perform)


def _too_busy(run_id: str) -> ConflictError:
    return ConflictError(f"run {run_id!r}: {_MAX_TRIES} other writers got in first", run_id)


# --- start ----------------------------------------------------------------------------


def _start(
    workflow: Workflow,
    run_id: str,
    input: dict[str, Any] | None,
    timing: dict[str, Any] | None = None,
    budget: Budget | None = None,
    keys: Mapping[str, str] | None = None,
    priority: int = 0,
) -> Op:
    if not isinstance(workflow, Workflow):
        raise InvalidWorkflow(f"start needs a Workflow, got {type(workflow).__name__}")
    check_run_id(run_id)
    budget = check_budget(budget)
    given = None if input is None else encode_state(input)[1]
    flow = _flow_runs.run_flow(workflow.limits, keys, priority)  # flow control (issue 37)
    for _ in range(_MAX_TRIES):
        cp = yield Load(run_id)
        if cp is None:
            victims = yield from _flow_runs.check_start(flow, run_id)
            fresh = evolve(
                queued(workflow, run_id, given or {}, None, timing), input=given, flow=flow
            )
            if budget is not None:
                # The run's own budget, in its ledger from the start (``_budget``).
                state = {**fresh.state, SPEND_KEY: {"budget": budget.to_json()}}
                fresh = evolve(fresh, state=state)
            try:
                saved: Checkpoint = yield Save(fresh, "start")
            except ConflictError:
                continue
            for victim in victims:  # a key's replace_pending or cancel_running policy
                with contextlib.suppress(RunNotActive, RunNotFound):
                    yield from cancel_op(victim)
            yield Announce()  # a worker may claim it now
            logger.info("run %r: queued (workflow %r)", run_id, workflow.name)
            return RunInfo.of(saved)
        if (cp.workflow, cp.workflow_version) != workflow.key:
            raise WorkflowChanged(
                f"run {run_id!r} exists with workflow "
                f"{workflow_label(cp.workflow, cp.workflow_version)}; starting it as "
                f"{workflow_label(workflow.name, workflow.version)} was refused (use another "
                "run_id)",
                run_id,
                -1,
            )
        try:
            check_input(run_id, evolve(cp, input=cp.input or {}), given or {})
        except InputMismatch as exc:
            raise InputMismatch(
                str(exc).replace("nothing was run", "the run was left as it is"),
                run_id,
                exc.path,
            ) from None
        return RunInfo.of(cp)
    raise _too_busy(run_id)


def start(
    store: Store,
    workflow: Workflow,
    run_id: str,
    input: dict[str, Any] | None = None,
    *,
    clock: _clock.Clock | None = None,
    deadline: float | timedelta | None = None,
    on_deadline: str | None = None,
    budget: Budget | None = None,
    keys: Mapping[str, str] | None = None,
    priority: int = 0,
) -> RunInfo:
    """Record a new run of ``workflow`` as ``queued``, for a worker to run.

    Starting the same run_id again with the same workflow (name and version) and input
    is a no-op that returns the run's status now. ``clock``: the clock whose time the
    record is stamped with (``created_at``), in place of the installed one; a
    ``stepstone.testing.FakeClock`` in tests.

    ``deadline`` (issue 33): the run's time from its first claim to its end, instead
    of the workflow's; ``on_deadline``: ``fail`` (``DeadlineExceeded``) or ``wait`` (for
    the signal ``deadline``), instead of the workflow's.

    ``budget``: the run's spend limit (``stepstone.Budget``), instead of the workflow's.

    Flow control: the run holds its workflow's ``limits`` and its own ``keys``
    (``{"tenant": "acme"}`` is the key ``tenant:acme``, limited as ``tenant`` is) while
    it executes; ``priority`` orders it among the runs waiting for a key.

    Raises:
        WorkflowChanged: the run exists and was started from another workflow or version.
        InputMismatch: the run exists with another input.
        InvalidState: ``input`` is not a JSON dict.
        InvalidWorkflow: ``clock`` is not a clock; a bad ``deadline`` or ``on_deadline``.
        ConfigError: an unknown key, or a bad ``keys`` or ``priority``.
        LimitReached: a key whose policy is ``reject`` is full.
    """
    timing = _timing(workflow, deadline, on_deadline)
    with _clock.using(check_clock(clock)):
        result: RunInfo = _sync(
            _start(workflow, run_id, input, timing, budget, keys, priority), store
        )
    return result


async def astart(
    store: Store,
    workflow: Workflow,
    run_id: str,
    input: dict[str, Any] | None = None,
    *,
    clock: _clock.Clock | None = None,
    deadline: float | timedelta | None = None,
    on_deadline: str | None = None,
    budget: Budget | None = None,
    keys: Mapping[str, str] | None = None,
    priority: int = 0,
) -> RunInfo:
    """Async ``start``."""
    timing = _timing(workflow, deadline, on_deadline)
    with _clock.using(check_clock(clock)):
        result: RunInfo = await _async(
            _start(workflow, run_id, input, timing, budget, keys, priority), store
        )
    return result


def _timing(workflow: Any, deadline: object, on_deadline: object) -> dict[str, Any] | None:
    """Return the ``timing`` ``start`` records (issue 33, ``_deadline``), checked."""
    seconds = check_deadline("start", deadline)
    if on_deadline is None and seconds is None:
        return None
    name = getattr(workflow, "on_deadline", "fail") if on_deadline is None else on_deadline
    mode = check_on_deadline("start", name)
    if seconds is None:
        seconds = getattr(workflow, "deadline", None)
        if seconds is None:
            raise InvalidWorkflow("start: on_deadline needs a deadline (here or the workflow's)")
    return start_timing(seconds, mode)


# --- cancel ---------------------------------------------------------------------------


def cancel_op(run_id: str, keep_failed: bool = False) -> Op:
    """``cancel``; ``keep_failed``: a failed run is left failed (``RunNotActive``)."""
    check_run_id(run_id)
    for _ in range(_MAX_TRIES):
        cp = yield Load(run_id)
        if cp is None:
            raise RunNotFound(f"run {run_id!r} does not exist; nothing to cancel", run_id)
        status = cp.status
        if status in ("done", "cancelled") or (keep_failed and status == "failed"):
            raise RunNotActive(
                f"run {run_id!r} is {status}; only queued, running, waiting or failed runs "
                "can be cancelled",
                run_id,
                status,
            )
        if cp.owner is None:
            # Nobody runs it: cancelled at once, and never claimed.
            new = evolve(cp, cancelled=True, queued=False, waiting_for=None, wake_at=None)
        elif cp.cancel_requested:
            new = cp
        else:
            # Its owner stops at the next step boundary, after saving a step in flight.
            new = evolve(cp, cancel_requested=True)
        try:
            saved: Checkpoint = new if new is cp else (yield Save(new, "cancel"))
        except ConflictError:
            continue
        yield from cancel_children(saved.children)
        if saved.cancelled and saved.parent is not None:
            yield from nudge(saved.parent)  # a waiting parent learns of it at once
        logger.info("run %r: %s", run_id, "cancelled" if saved.cancelled else "cancel requested")
        return RunInfo.of(saved)
    raise _too_busy(run_id)


def cancel_children(children: tuple[str, ...], keep_failed: bool = False) -> Op:
    """Cancel each of a parent's children that is still active (``keep_failed``: a
    failed child keeps its status; the status is read in the cancel's compare-and-swap)."""
    for child in children:
        with contextlib.suppress(RunNotActive, RunNotFound):
            yield from cancel_op(child, keep_failed)


def cancel(store: Store, run_id: str) -> RunInfo:
    """Cancel the run: it stops at its next step boundary, whoever owns it.

    A run nobody is executing (queued, waiting, failed, or whose owner gave it back) is
    cancelled at once. A running one gets a cancel request: its owner saves the step in
    flight when it completes, then marks the run ``cancelled`` and runs nothing more.
    Children of a ``Map`` step in progress are cancelled too.

    Returns:
        The run's ``RunInfo`` after the request (``cancelled``, or still ``running``
        until its owner reaches the boundary).

    Raises:
        RunNotFound: no such run.
        RunNotActive: the run is done or already cancelled.
    """
    result: RunInfo = _sync(cancel_op(run_id), store)
    return result


async def acancel(store: Store, run_id: str) -> RunInfo:
    """Async ``cancel``."""
    result: RunInfo = await _async(cancel_op(run_id), store)
    return result


# --- retry ----------------------------------------------------------------------------

#: The statuses ``retry`` queues again: a final failure (a parked ``WorkflowChanged``
#: included: it is saved as a failure) and a cancellation.
RETRYABLE = ("failed", "cancelled")


def retry_op(run_id: str, expected_version: str | None = None) -> Op:
    check_run_id(run_id)
    for _ in range(_MAX_TRIES):
        cp = yield Load(run_id)
        if cp is None:
            raise RunNotFound(f"run {run_id!r} does not exist; nothing to retry", run_id)
        if expected_version is not None and cp.version != expected_version:
            raise ConflictError(
                f"run {run_id!r} is at version {cp.version!r}, not {expected_version!r}: it "
                "changed since it was read; nothing was done (read it again and retry)",
                run_id,
            )
        status = cp.status
        if status not in RETRYABLE:
            raise RunNotActive(
                f"run {run_id!r} is {status}; only failed (or parked) and cancelled runs "
                "can be retried",
                run_id,
                status,
            )
        if cp.workflow is None:
            raise RunNotActive(
                f"run {run_id!r} was started by calling run() directly, not by start(), so "
                "no worker knows its workflow: call run() again to retry it",
                run_id,
                status,
            )
        # Queued again from its last checkpoint with a fresh attempt budget: a worker
        # claims it and runs the next step. A failure stays on record until that step
        # succeeds; the cancellation is lifted.
        new = evolve(
            cp, queued=True, attempt=0, cancelled=False, cancel_requested=False, owner=None
        )
        try:
            saved: Checkpoint = yield Save(new, "retry")
        except ConflictError:
            if expected_version is not None:
                raise  # the version shown is gone: the caller decides again
            continue
        yield Announce()  # a worker claims it now, not at its next poll
        logger.info("run %r: queued again (retry of a %s run)", run_id, status)
        return RunInfo.of(saved)
    raise _too_busy(run_id)


def retry(store: Store, run_id: str, *, expected_version: str | None = None) -> RunInfo:
    """Queue a failed, parked or cancelled run again, from its last checkpoint.

    A worker serving its workflow claims it and runs its next step (the failed one)
    with a fresh attempt budget; its completed steps, state and signals are kept.

    Args:
        store: The store holding the run.
        run_id: The run to queue again.
        expected_version: Act only if the run is still at this version (the one an
            operator was shown); None retries whatever the version.

    Returns:
        The run's ``RunInfo`` after the write (``queued``).

    Raises:
        RunNotFound: no such run.
        RunNotActive: the run is not failed or cancelled, or was started by ``run()``
            (no worker knows its workflow).
        ConflictError: the run is not at ``expected_version``; nothing was written.
    """
    result: RunInfo = _sync(retry_op(run_id, expected_version), store)
    return result


async def aretry(store: Store, run_id: str, *, expected_version: str | None = None) -> RunInfo:
    """Async ``retry``."""
    result: RunInfo = await _async(retry_op(run_id, expected_version), store)
    return result


# --- signal ---------------------------------------------------------------------------


def signal_op(run_id: str, name: str, payload: Any, signal_id: str | None) -> Op:
    check_run_id(run_id)
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidWorkflow(f"a signal name must be a str of 1-200 characters, got {name!r}")
    if signal_id is None:
        signal_id = os.urandom(16).hex()
    elif not isinstance(signal_id, str) or not 1 <= len(signal_id) <= _MAX_SIGNAL_ID:
        raise InvalidWorkflow(
            f"signal_id must be a str of 1-{_MAX_SIGNAL_ID} characters, got {signal_id!r}"
        )
    payload = encode_state({"payload": payload})[1]["payload"]
    for _ in range(_MAX_TRIES):
        cp = yield Load(run_id)
        if cp is None:
            raise RunNotFound(f"run {run_id!r} does not exist; the signal was not kept", run_id)
        # A repeated id is a no-op whatever the run's state: a webhook retries exactly
        # when the first delivery finished the run, and must not be told it failed.
        if any(s.id == signal_id for s in cp.signals):
            logger.info("run %r: signal id %r already received; nothing to do", run_id, signal_id)
            return False
        status = cp.status
        if status in ("done", "cancelled"):
            raise RunNotActive(
                f"run {run_id!r} is {status}: it takes no more signals (signals are kept "
                "for queued, running, waiting and failed runs)",
                run_id,
                status,
            )
        new = evolve(cp, signals=(*cp.signals, Signal(name, signal_id, payload, utcnow())))
        wakes = status == "waiting" and cp.owner is None and cp.waiting_for == f"signal {name}"
        if wakes:
            new = evolve(new, wake_at=DUE_NOW)  # due now, by any clock: a worker resumes it
        try:
            yield Save(new, f"signal {name}")
        except ConflictError:
            continue
        if wakes:
            # Only then is there work: a run someone holds reads the signal at its next
            # save, and one waiting for something else, or queued, is not due sooner.
            yield Announce()
        logger.info("run %r: signal %r received (id %r)", run_id, name, signal_id)
        return True
    raise _too_busy(run_id)


def signal(
    store: Store, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
) -> bool:
    """Deliver the signal ``name`` with a JSON ``payload`` to a run.

    The signal is stored in the run's record by compare-and-swap, so it is applied
    exactly once: kept until a ``WaitFor`` on ``name`` consumes it (also if it arrives
    before the run reaches that step). A repeated ``signal_id`` is a no-op.

    Returns:
        True if the signal was recorded, False if its id had been received before.

    Raises:
        RunNotFound: no such run.
        RunNotActive: the run is done or cancelled.
        InvalidState: ``payload`` is not JSON.
    """
    result: bool = _sync(signal_op(run_id, name, payload, signal_id), store)
    return result


async def asignal(
    store: Store, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
) -> bool:
    """Async ``signal``."""
    result: bool = await _async(signal_op(run_id, name, payload, signal_id), store)
    return result
