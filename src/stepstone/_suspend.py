"""Steps that suspend a run: ``WaitFor`` (a signal), ``Sleep`` (a durable timer), ``Map``.

A suspending step either completes (its result merged into the state under its name,
saved like any step) or saves the run as ``waiting`` with what it waits for and until
when (``waiting_for``, ``wake_at``), gives the lease back and raises ``Suspended``. A
waiting run costs no process: a worker finds it again through the store's (status,
due_at) index when its timer is due, a signal arrives (``signal`` sets ``wake_at`` to
now) or a child finishes (the child's last save does the same to its parent).

Everything a suspending step needs is in the checkpoint: the signals received (each
consumed once, in arrival order, counted in ``consumed``), the timer's due time
(``wake_at``, fixed when the wait began, so a restart never moves it) and the child
run_ids. Evaluating a step twice after a crash therefore gives the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from . import _hooks
from ._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, Signal, evolve, utcnow
from ._codec import encode_state, pristine
from ._deadline import inherited
from ._effects import Announce, Call, Effect, Load, Renewing, Save, Together
from ._errors import ConflictError, InvalidState, InvalidWorkflow, LeaseLost
from ._flow._runs import check_max_concurrency, with_flow
from ._mapseen import LISTED as _LISTED
from ._mapseen import SEEN as _SEEN
from ._mapseen import Key as _Key
from ._mapseen import nudged
from ._nudge import DUE_NOW_UNTIL, nudge
from ._observe import logger
from ._plan import Plan
from ._pool import inherit  # a budgeted run's children draw from its pool
from ._steps import (
    Complete,
    Outcome,
    RetryPolicy,
    Step,
    StepCodeError,
    SuspendingStep,
    Wait,
    Workflow,
    check_name,
)
from ._store_time import Now, earliest, plain

__all__ = [
    "DUE_NOW_UNTIL",
    "ChildFailed",
    "Complete",
    "Map",
    "Sleep",
    "StepCodeError",
    "SuspendingStep",
    "Wait",
    "WaitFor",
    "WaitTimeout",
    "child_run_id",
    "nudge",
    "pending_signals",
    "queued",
]

_MISSING: Any = object()
#: A Map reads and makes its children this many at a time (``Together``), and rings
#: this process's workers after each batch made, so they run children meanwhile.
TOGETHER_BATCH = 16
#: How often a parent waiting on children looks at them even if no child told it
#: (a child's nudge can be lost to a crash; this bounds the delay, never strands it).
CHILD_POLL = 10.0
#: How often a Map tries to create (or re-queue) one child that others keep changing.
_CHILD_TRIES = 5


class WaitTimeout(TimeoutError):
    """A ``WaitFor`` reached its timeout without a signal and has no default."""


class ChildFailed(Exception):
    """A ``Map`` child run failed or was cancelled; ``run_id`` names it."""

    def __init__(self, message: str, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


def _due(wake_at: datetime | None, now: datetime | None = None) -> bool:
    """Whether ``wake_at`` has come by ``now`` (the store's clock; the host's if None).

    A store's time is known within its ``slack`` (a millisecond or so on a server): the
    earliest it may be decides, so a timer never ends before its time.
    """
    return wake_at is not None and (utcnow() if now is None else earliest(now)) >= wake_at


def pending_signals(cp: Checkpoint, name: str) -> list[Signal]:
    """Return the signals named ``name`` received and not yet consumed, oldest first."""
    received = [s for s in cp.signals if s.name == name]
    return received[cp.consumed.get(name, 0) :]


def _seconds(value: object, what: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidWorkflow(f"{what} must be seconds (a number) or a timedelta")
    if not 0 <= seconds <= 366 * 86_400 * 100:  # NaN fails this too
        raise InvalidWorkflow(f"{what} must be between 0 and 100 years, got {value!r}")
    return seconds


class WaitFor(SuspendingStep):
    """Wait for the signal ``signal``; merge its payload into the state under ``name``.

    Signals of one name queue in arrival order, each consumed by the first ``WaitFor``
    that takes it. With ``timeout`` (seconds or ``timedelta``), ``default`` is merged when
    it passes; without a default the step fails (``WaitTimeout``, a saved failure to
    which ``retry`` applies).
    """

    __slots__ = ("default", "signal", "timeout")

    def __init__(
        self,
        name: str,
        signal: str,
        *,
        timeout: float | timedelta | None = None,
        default: Any = _MISSING,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.name = check_name(name)
        if not isinstance(signal, str) or not signal or len(signal) > 200:
            raise InvalidWorkflow(f"WaitFor {name!r}: signal must be a name of 1-200 characters")
        self.signal = signal
        self.timeout = None if timeout is None else _seconds(timeout, f"WaitFor {name!r} timeout")
        if default is not _MISSING:
            try:
                encode_state({"default": default})
            except InvalidState as exc:
                raise InvalidWorkflow(f"WaitFor {name!r}: default is not JSON: {exc}") from None
        self.default = default
        self.retry = retry

    def __repr__(self) -> str:
        return f"WaitFor({self.name!r}, {self.signal!r}, timeout={self.timeout!r})"

    def ready(self, cp: Checkpoint, now: datetime | None = None) -> bool:
        return bool(pending_signals(cp, self.signal)) or _due(cp.wake_at, now)

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Outcome]:
        pending = pending_signals(cp, self.signal)
        if pending:
            consumed = dict(cp.consumed)
            consumed[self.signal] = consumed.get(self.signal, 0) + 1
            logger.info("run %r: signal %r (id %r) consumed", cp.run_id, self.signal, pending[0].id)
            _hooks.fire("wait.consumed")  # chosen, not yet saved: a crash here must not lose it
            return Complete({self.name: pending[0].payload}, {"consumed": consumed})
        # The store's clock, not this host's: a timeout begun on a host whose clock is
        # off by an hour must neither end an hour early nor an hour late.
        now: datetime = yield Now()
        if first:
            deadline = (
                None if self.timeout is None else plain(now) + timedelta(seconds=self.timeout)
            )
        else:
            # Without a timeout, a wake time is the run's deadline (the core's to act on,
            # ``_core``): never a timeout of this wait's.
            deadline = cp.wake_at if self.timeout is not None else None
        if _due(deadline, now):
            if self.default is not _MISSING:
                return Complete({self.name: self.default})
            raise WaitTimeout(f"no signal {self.signal!r} within {self.timeout:g}s")
        return Wait(f"signal {self.signal}", deadline)


class Sleep(SuspendingStep):
    """Wait until a time; merge that time (ISO 8601, UTC) into the state under ``name``.

    Exactly one of ``duration`` (seconds or ``timedelta``, counted from when the run
    first reaches the step) and ``until`` (a timezone-aware ``datetime``). The due time is
    recorded in the checkpoint when the wait begins, so restarts never move it.
    """

    __slots__ = ("duration", "until")

    def __init__(
        self,
        name: str,
        *,
        duration: float | timedelta | None = None,
        until: datetime | None = None,
    ) -> None:
        self.name = check_name(name)
        if (duration is None) == (until is None):
            raise InvalidWorkflow(f"Sleep {name!r}: give exactly one of duration and until")
        if until is not None:
            if not isinstance(until, datetime):
                raise InvalidWorkflow(f"Sleep {name!r}: until must be a datetime")
            if until.tzinfo is None or until.utcoffset() is None:
                raise InvalidWorkflow(
                    f"Sleep {name!r}: until={until.isoformat()} is naive; give a timezone-"
                    "aware datetime (e.g. datetime(..., tzinfo=UTC))"
                )
            try:
                until = until.astimezone(UTC)
            except OverflowError:
                raise InvalidWorkflow(
                    f"Sleep {name!r}: until={until!r} is out of range in UTC"
                ) from None
        self.until = until
        self.duration = None if duration is None else _seconds(duration, f"Sleep {name!r} duration")
        self.retry = None

    def __repr__(self) -> str:
        return f"Sleep({self.name!r}, duration={self.duration!r}, until={self.until!r})"

    def ready(self, cp: Checkpoint, now: datetime | None = None) -> bool:
        return _due(cp.wake_at, now)

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Outcome]:
        # The store's clock (as for WaitFor): a duration counts from the store's now.
        now: datetime = yield Now()
        wake = cp.wake_at if (not first and cp.wake_at is not None) else self._wake_time(now)
        if _due(wake, now):
            return Complete({self.name: wake.astimezone(UTC).isoformat()})
        return Wait("timer", wake)

    def _wake_time(self, now: datetime) -> datetime:
        if self.until is not None:
            return self.until
        assert self.duration is not None
        return plain(now) + timedelta(seconds=self.duration)


def child_run_id(parent: str, name: str, index: int) -> str:
    """Return the run_id of child ``index`` of ``Map`` step ``name`` of run ``parent``.

    ``PARENT/NAME/INDEX``; where ``PARENT/NAME/`` and a ten-digit index could pass the
    1,024-character limit, every child of that step gets the hashed form
    ``map~<sha256 of PARENT NUL NAME, 64 hex>/INDEX`` instead: just as deterministic,
    and one form for all the children of a step.
    """
    prefix = f"{parent}/{name}/"
    if len(prefix) + 10 <= MAX_RUN_ID_LENGTH:
        return f"{prefix}{index}"
    import hashlib  # noqa: PLC0415 - deferred (~12 ms), only very long ids need it

    digest = hashlib.sha256(f"{parent}\x00{name}".encode()).hexdigest()
    return f"map~{digest}/{index}"


class Map(SuspendingStep):
    """Fan out: one child run of ``workflow`` per item of ``items(state)``; merge results.

    Children are ordinary queued runs (``PARENT/NAME/INDEX``, see ``child_run_id``), run
    by workers. The parent waits until all are done, then merges the list of their final
    states, in item order, under ``name``. A failed child fails the step (``ChildFailed``
    naming it); a retry (``retry``, or running the parent again) re-queues only the
    failed children. ``items`` is called like a step (in a thread under ``arun``), and
    the lease is renewed while it runs and while the child records are made; a store
    that fails there stops the run as a failed save does, it never fails the step.
    """

    __slots__ = ("items", "max_concurrency", "workflow")

    def __init__(
        self,
        name: str,
        workflow: Workflow,
        items: Callable[[dict[str, Any]], list[Any]],
        *,
        retry: RetryPolicy | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        self.name = check_name(name)
        if not isinstance(workflow, Workflow):
            raise InvalidWorkflow(f"Map {name!r}: workflow must be a Workflow")
        if not callable(items):
            raise InvalidWorkflow(f"Map {name!r}: items must be a function of the state")
        self.workflow = workflow
        self.items = items
        self.retry = retry
        #: Flow control (issue 37): at most this many children at once (``_flow._runs``).
        self.max_concurrency = check_max_concurrency(name, max_concurrency)

    def __repr__(self) -> str:
        return f"Map({self.name!r}, {self.workflow!r})"

    def ready(self, cp: Checkpoint, now: datetime | None = None) -> bool:
        return _due(cp.wake_at, now)

    def _inputs(self, items: object) -> list[dict[str, Any]]:
        if not isinstance(items, list):
            raise InvalidWorkflow(f"Map {self.name!r}: items() must return a list")
        for position, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidWorkflow(
                    f"Map {self.name!r}: item {position} is a {type(item).__name__}; each "
                    "item is a child run's input, a JSON dict"
                )
        return [encode_state(item)[1] for item in items]

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Outcome]:
        try:
            # Called like a step: the driver renews the lease however long it takes.
            listed = yield Call(Step(self.name, self.items), state, None, cp)
        except LeaseLost:
            raise
        except Exception as exc:
            raise StepCodeError(exc) from exc
        inputs = self._inputs(listed)
        ids = [child_run_id(cp.run_id, self.name, i) for i in range(len(inputs))]
        key = (cp.run_id, self.name, cp.created_at)
        _LISTED.remember(cp.run_id, tuple(ids))  # a child ending here looks at siblings first
        if not first and not nudged(cp.wake_at, DUE_NOW_UNTIL):
            # A poll: children seen done stay done, so read on from the first one not
            # seen done, up to one still going (``_look``).
            polled: Wait | None = yield Renewing(self._look(cp, key, ids))
            if polled is not None:
                return polled
        # No child of this look can exist yet unless an earlier look listed them (it
        # crashed, or this is a retry, whose children made before answer ``ConflictError``
        # and are loaded then): made without being loaded first.
        fresh = first and not cp.children
        if first and cp.children != tuple(ids):
            cp = yield from _list_children(plan, cp, ids)
        children: list[Checkpoint] = yield Renewing(self._children(cp, ids, inputs, first, fresh))
        done = [child for child in children if child.status == "done"]
        if len(done) == len(children):
            _SEEN.forget(key)
            _LISTED.forget(cp.run_id)
            return Complete({self.name: [pristine(child) for child in children]})
        first_going = next(n for n, child in enumerate(children) if child.status != "done")
        _SEEN.remember(key, len(ids), first_going)
        for child in children:
            if child.status in ("failed", "cancelled"):
                reason = (
                    "was cancelled"
                    if child.status == "cancelled"
                    else f"failed at step {child.failure.step_name!r}: {child.failure.message}"
                    if child.failure is not None
                    else "failed"
                )
                _SEEN.forget(key)
                _LISTED.forget(cp.run_id)
                raise ChildFailed(f"child run {child.run_id!r} {reason}", child.run_id)
        return _waiting(str(len(done)), ids, (yield Now()))

    def _look(
        self, cp: Checkpoint, key: _Key, ids: list[str]
    ) -> Generator[Effect, Any, Wait | None]:
        """Read the children from the first not seen done to the first still going.

        Return the wait if one is still going (queued, running or waiting); None if
        all are done now, or one failed, was cancelled or is missing: the full look
        (``_children``) then reads every child, merges, fails or re-creates, as it
        always did. A poll so reads each child about once in all, however many times
        the parent looks; a nudge (a child failed, or the last ones ended) or a new
        attempt looks at all, so a failure is still seen at once.
        """
        position = _SEEN.start(key, len(ids))
        while position < len(ids):
            child: Checkpoint | None = yield Load(ids[position])
            if child is None or child.status in ("failed", "cancelled"):
                return None
            self._check_child(cp, ids[position], child)
            if child.status != "done":
                _SEEN.remember(key, len(ids), position)
                return _waiting(f"{position}+", ids, (yield Now()))
            position += 1
        return None

    def _children(
        self,
        cp: Checkpoint,
        ids: list[str],
        inputs: list[dict[str, Any]],
        first: bool,
        fresh: bool = False,
    ) -> Generator[Effect, Any, list[Checkpoint]]:
        """Load (or create) every child; on a fresh attempt re-queue the failed ones.

        ``fresh``: none is expected to exist, so each is created without a load first
        (one that exists after all answers ``ConflictError`` and is loaded).

        Performed inside ``Renewing``: thousands of child records take as long as a long
        step, and the lease is renewed meanwhile in the same way.
        """
        children: list[Checkpoint] = []
        for start in range(0, len(ids), TOGETHER_BATCH):
            batch_ids = ids[start : start + TOGETHER_BATCH]
            batch = yield from self._batch(
                cp, batch_ids, inputs[start : start + TOGETHER_BATCH], fresh
            )
            for child_id, child in zip(batch_ids, batch, strict=True):
                self._check_child(cp, child_id, child)
            children.extend(batch)
        if first:
            # A fresh attempt re-queues the children that failed before: only those run again.
            for position, child in enumerate(children):
                children[position] = yield from _requeue(child)
        if any(child.status == "queued" and child.owner is None for child in children):
            yield Announce()  # workers claim the children now, not at their next poll
        return children

    def _check_child(self, cp: Checkpoint, child_id: str, child: Checkpoint) -> None:
        if child.parent != cp.run_id or (child.workflow, child.workflow_version) != (
            self.workflow.name,
            self.workflow.version,
        ):
            # Never adopt a run that happens to have a child's id: its state would be
            # merged as if this Map had produced it.
            raise ChildFailed(
                f"run {child_id!r} exists but is not a child of run {cp.run_id!r} "
                f"running workflow {self.workflow.name!r} (it has parent "
                f"{child.parent!r}, workflow {child.workflow!r}); rename the Map step "
                "or remove that run",
                child_id,
            )

    def _batch(
        self, cp: Checkpoint, ids: list[str], inputs: list[dict[str, Any]], fresh: bool
    ) -> Generator[Effect, Any, list[Checkpoint]]:
        """Load a batch of children at once, then create the missing ones at once.

        A child another writer created meanwhile (a conflict) is loaded by ``_child``,
        one at a time; a store error raises. This process's workers are rung after
        each batch made, so they run children while the next batch is made.
        """
        loaded: list[Any]
        if fresh:
            loaded = [None] * len(ids)
        else:
            loaded = yield Together([Load(child_id) for child_id in ids])
            _raise_first(loaded)
        missing = [n for n, child in enumerate(loaded) if child is None]
        if missing:
            saves: list[Load | Save] = [
                Save(
                    with_flow(
                        inherit(
                            cp,
                            queued(self.workflow, ids[n], inputs[n], cp.run_id, inherited(cp)),
                        ),
                        self,
                    ),
                    f"start child {ids[n]}",
                    owned=False,
                )
                for n in missing
            ]
            made: list[Any] = yield Together(saves)
            for n, result in zip(missing, made, strict=True):
                if isinstance(result, ConflictError):
                    loaded[n] = yield from self._child(cp, ids[n], inputs[n])
                elif not isinstance(result, Exception):
                    loaded[n] = result
                    _hooks.fire("map.child_created")
            _raise_first(made, ConflictError)
            yield Announce(local=True)
        return cast(list[Checkpoint], loaded)

    def _child(
        self, cp: Checkpoint, child_id: str, item: dict[str, Any]
    ) -> Generator[Effect, Any, Checkpoint]:
        """Return child ``child_id``'s record, creating it (queued) if it does not exist."""
        for _ in range(_CHILD_TRIES):
            child: Checkpoint | None = yield Load(child_id)
            if child is not None:
                return child
            fresh = with_flow(
                inherit(cp, queued(self.workflow, child_id, item, cp.run_id, inherited(cp))),
                self,
            )
            try:
                created: Checkpoint = yield Save(fresh, f"start child {child_id}", owned=False)
                _hooks.fire("map.child_created")
            except ConflictError:
                continue  # created meanwhile (by us, in an earlier attempt); load it
            return created
        # Not a store failing but someone deleting our children as we make them.
        raise ChildFailed(
            f"child run {child_id!r} was deleted {_CHILD_TRIES} times as it was created",
            child_id,
        )


def _list_children(
    plan: Plan, cp: Checkpoint, ids: list[str]
) -> Generator[Effect, Any, Checkpoint]:
    """Write the child run_ids on the running parent before its children are made.

    A child that ends tells its parent only if the siblings it looks at are done
    (``_nudge``); a parent that does not list its children yet (still making them)
    would be told, and written, by every child that ends meanwhile, each write making
    it look at all of them once more. One write of ours instead: the parent's own look
    after making them sees each child as made, and the child that ends last tells it.
    Best effort: a write that conflicts (a signal, a cancel request, a nudge landed)
    leaves the record to the step's own save, which re-bases on it as before.
    """
    current = plan.current
    if current is None or current.owner != cp.owner or current.epoch != cp.epoch:
        current = cp  # as ``_core._latest``: a renewal during ``items`` replaced ``cp``
    try:
        listed: Checkpoint = yield Save(
            evolve(current, children=tuple(ids), renewed_at=utcnow()), "list children"
        )
    except ConflictError:
        return current
    return listed


def _waiting(done: str, ids: list[str], now: datetime) -> Wait:
    """Return the wait on the children ``ids``, ``done`` of them done (``3``, or ``3+``
    after a poll that stopped at the first still going); the parent looks again
    ``CHILD_POLL`` after ``now`` (the store's clock) unless a child nudges it sooner."""
    return Wait(
        f"children {done} of {len(ids)}",
        plain(now) + timedelta(seconds=CHILD_POLL),
        {"children": tuple(ids)},
        poll_only=True,
    )


def _raise_first(results: list[Any], *allowed: type[Exception]) -> None:
    """Raise the first exception among ``results`` that is not one of ``allowed``."""
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, allowed):
            raise result


def _requeue(child: Checkpoint) -> Generator[Effect, Any, Checkpoint]:
    """Re-queue ``child`` if it failed and nobody holds it; return its record."""
    for _ in range(_CHILD_TRIES):
        if child.status != "failed" or child.owner is not None:
            return child
        try:
            requeued: Checkpoint = yield Save(
                evolve(child, queued=True, attempt=0), "requeue child", owned=False
            )
        except ConflictError:
            # Someone wrote the child meanwhile (a cancel, a run of it): look again.
            reloaded: Checkpoint | None = yield Load(child.run_id)
            if reloaded is None:
                raise ChildFailed(
                    f"child run {child.run_id!r} was deleted as it was re-queued", child.run_id
                ) from None
            child = reloaded
            continue
        return requeued
    raise ChildFailed(
        f"child run {child.run_id!r} changed {_CHILD_TRIES} times as it was re-queued",
        child.run_id,
    )


def queued(
    workflow: Workflow,
    run_id: str,
    input: dict[str, Any],
    parent: str | None = None,
    timing: dict[str, Any] | None = None,
) -> Checkpoint:
    """Return the record of a new run of ``workflow``, queued (``timing``: issue 33)."""
    return Checkpoint(
        run_id=run_id,
        state=encode_state(input)[1],
        total_steps=len(workflow.steps),
        input=input,
        workflow=workflow.name,
        workflow_version=workflow.version,
        queued=True,
        parent=parent,
        history=workflow.history,
        timing=timing,
    )
