"""The durable runner: one ``run`` call both starts and resumes a run.

Execution is at-least-once. The checkpoint is written after a step returns, so a crash
between a step finishing and its checkpoint landing re-runs that step on resume: steps
must be idempotent (``StepContext.idempotency_key`` helps). Writing the checkpoint
before the step instead would make a crash silently skip work.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from . import _hooks
from ._checkpoint import Checkpoint, Failure, check_run_id, utcnow
from ._codec import encode_state
from ._errors import ConflictError, InvalidWorkflow, StepFailed, StoreError, WorkflowChanged
from ._observe import logger, span, tracing
from ._store import Store

__all__ = ["AttemptsExhausted", "RetryPolicy", "Step", "StepContext", "run"]

State = dict[str, Any]
_MAX_MESSAGE = 2000


class AttemptsExhausted(Exception):
    """The step's retry policy allows no more attempts (earlier ones died with the process)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and when a failing step is tried again.

    The attempt count is saved before each attempt, so a process that dies mid-step does
    not get a fresh budget on resume: a step that crashes its process every time stops
    after ``max_attempts`` instead of looping forever.

    Attributes:
        max_attempts: Attempts in all, the first included (1 means no retry).
        initial_delay: Seconds before the second attempt.
        multiplier: Factor applied to the delay after each attempt.
        max_delay: Upper bound on one delay, in seconds.
        jitter: Fraction of the delay added or removed at random (0.1 is +-10%).
        retry_on: Exception types to retry, or a predicate taking the exception.
    """

    max_attempts: int = 3
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool] = (Exception,)

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidWorkflow(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        numbers = (self.initial_delay, self.max_delay, self.multiplier, self.jitter)
        if not all(isinstance(n, (int, float)) and n >= 0 for n in numbers):
            raise InvalidWorkflow(
                "initial_delay, max_delay, multiplier and jitter must be numbers >= 0"
            )
        if not (isinstance(self.retry_on, tuple) or callable(self.retry_on)):
            raise InvalidWorkflow("retry_on must be a tuple of exception types or a predicate")

    def should_retry(self, exc: BaseException) -> bool:
        """Return whether ``exc`` is one this policy retries."""
        if isinstance(self.retry_on, tuple):
            return isinstance(exc, self.retry_on)
        return bool(self.retry_on(exc))

    def delay(self, attempt: int) -> float:
        """Return the seconds to wait after failed attempt number ``attempt``."""
        base = min(self.initial_delay * self.multiplier ** (attempt - 1), self.max_delay)
        return max(0.0, base * (1 + random.uniform(-self.jitter, self.jitter)))


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step may learn about its own execution (passed as a second argument).

    ``idempotency_key`` is the same for every attempt and resume of this step of this
    run, and differs for every other step and run: pass it to a payment or model API so
    a repeated call is a no-op. A run deleted and started again under the same run_id
    gets the same keys.
    """

    run_id: str
    step_index: int
    step_name: str
    attempt: int
    idempotency_key: str


def idempotency_key(run_id: str, step_index: int, step_name: str) -> str:
    """Return the deterministic idempotency key of one step of one run."""
    raw = f"stepstone\x00{run_id}\x00{step_index}\x00{step_name}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Step:
    """A named step: ``fn(state)`` or ``fn(state, ctx)`` returns updates (a dict) or None."""

    name: str
    fn: Callable[..., Mapping[str, Any] | None]
    retry: RetryPolicy | None = None
    takes_context: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidWorkflow(f"a step name must be a non-empty str, got {self.name!r}")
        try:
            self.name.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidWorkflow(f"step name {self.name!r} holds a lone surrogate") from None
        if not callable(self.fn):
            raise InvalidWorkflow(f"step {self.name!r}: fn must be callable, got {self.fn!r}")
        object.__setattr__(self, "takes_context", _takes_context(self.fn))


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    return len(positional) >= 2 or (len(positional) == 1 and varargs)


def _check_names(run_id: str, names: tuple[str, ...], done: tuple[str, ...]) -> None:
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


def _pristine(cp: Checkpoint) -> State:
    """Return a fresh copy of the checkpoint's state that no step has touched."""
    if cp.state_json is not None:
        loaded: State = json.loads(cp.state_json)
        return loaded
    return encode_state(cp.state)[1]


def run(run_id: str, steps: Sequence[Step], store: Store) -> State:
    """Run ``steps`` durably under ``run_id``, resuming from its last checkpoint.

    Loads the checkpoint, skips the completed steps, runs the rest in order and saves a
    checkpoint after each step returns, before the next starts. A finished run returns
    its final state and runs nothing.

    Returns:
        The final state, a dict the caller owns.

    Raises:
        StepFailed: a step raised (retries exhausted); the failure is saved on the run.
        WorkflowChanged: the completed steps' names differ from the first steps passed.
        ConflictError: another worker saved the run meanwhile; it owns the run now.
        InvalidState: a step produced a state that is not JSON; nothing was saved.
        StoreError: the store failed; the run stops at its last checkpoint.
    """
    check_run_id(run_id)
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        raise InvalidWorkflow(f"steps must be a list of Step objects, got {type(steps).__name__}")
    steps = list(steps)
    for item in steps:
        if not isinstance(item, Step):
            raise InvalidWorkflow(f"steps must be Step objects, got {type(item).__name__}")
    names = tuple(step.name for step in steps)
    total = len(steps)

    on = tracing()
    with span(on, "stepstone.run", run_id=run_id, steps=total) as run_span:
        cp = store.load(run_id)
        if cp is None:
            cp = Checkpoint(run_id=run_id, total_steps=total)
            logger.info("run %r: starting, %d steps", run_id, total)
        else:
            _check_names(run_id, names, cp.step_names)
            if cp.step + 1 >= total:
                logger.info("run %r: already done, nothing to run", run_id)
                run_span.set_attribute("outcome", "already_done")
                return cp.state
            logger.info(
                "run %r: resuming at step %d (%r), skipping %d completed",
                run_id,
                cp.step + 1,
                names[cp.step + 1],
                cp.step + 1,
            )
        working = _pristine(cp)
        for index in range(cp.step + 1, total):
            cp, working = _run_step(run_id, steps, index, names, cp, working, store, on)
        logger.info("run %r: done after %d steps", run_id, total)
        run_span.set_attribute("outcome", "done")
        return working


def _save(store: Store, checkpoint: Checkpoint, what: str, on: bool) -> Checkpoint:
    with span(on, "stepstone.save", run_id=checkpoint.run_id, step=checkpoint.step, what=what):
        saved = store.save(checkpoint)
    logger.debug("run %r: saved %s, version %s", saved.run_id, what, saved.version)
    return saved


def _run_step(
    run_id: str,
    steps: list[Step],
    index: int,
    names: tuple[str, ...],
    cp: Checkpoint,
    working: State,
    store: Store,
    on: bool,
) -> tuple[Checkpoint, State]:
    """Run one step (with its retries) and save its checkpoint; return both."""
    step = steps[index]
    policy = step.retry
    durable_attempts = policy is not None and policy.max_attempts > 1
    total = len(steps)
    attempt = cp.attempt  # attempts already begun on this step, by earlier processes too
    while True:
        attempt += 1
        with span(
            on, "stepstone.step", run_id=run_id, step=step.name, index=index, attempt=attempt
        ) as step_span:
            if policy is not None and attempt > policy.max_attempts:
                exc: Exception = AttemptsExhausted(
                    f"step {step.name!r} already began {attempt - 1} of "
                    f"{policy.max_attempts} allowed attempts in earlier processes"
                )
                step_span.set_attribute("outcome", "exhausted")
                _fail(store, cp, index, step.name, attempt - 1, exc, on)
            if durable_attempts:
                # Count the attempt before making it: a crash inside must not reset it.
                cp = _save(
                    store,
                    Checkpoint(
                        run_id=run_id,
                        step=cp.step,
                        state=_pristine(cp),
                        version=cp.version,
                        step_names=cp.step_names,
                        total_steps=total,
                        attempt=attempt,
                        failure=cp.failure,
                        created_at=cp.created_at,
                    ),
                    f"attempt {attempt} of step {index}",
                    on,
                )
            logger.debug("run %r: step %d (%r) attempt %d", run_id, index, step.name, attempt)
            _hooks.fire("runner.before_step")
            try:
                if step.takes_context:
                    ctx = StepContext(
                        run_id, index, step.name, attempt, idempotency_key(run_id, index, step.name)
                    )
                    update = step.fn(working, ctx)
                else:
                    update = step.fn(working)
                if update is not None and not isinstance(update, Mapping):
                    raise TypeError(
                        f"step {step.name!r} returned a {type(update).__name__}; "
                        "a step returns a dict of updates or None"
                    )
            except Exception as error:
                step_span.record_exception(error)
                if (
                    policy is not None
                    and attempt < policy.max_attempts
                    and policy.should_retry(error)
                ):
                    step_span.set_attribute("outcome", "retry")
                    cp = _record_failure(store, cp, index, step.name, attempt, error, on)
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
                    time.sleep(delay)
                    working = _pristine(cp)
                    continue
                step_span.set_attribute("outcome", "failed")
                _fail(store, cp, index, step.name, attempt, error, on)
            _hooks.fire("runner.after_step")
            if update:
                working.update(update)
            saved = _save(
                store,
                Checkpoint(
                    run_id=run_id,
                    step=index,
                    state=working,
                    version=cp.version,
                    step_names=names[: index + 1],
                    total_steps=total,
                    attempt=0,
                    failure=None,
                    created_at=cp.created_at,
                ),
                f"step {index}",
                on,
            )
            _hooks.fire("runner.after_save")
            step_span.set_attribute("outcome", "ok")
            # The stored copy is ours alone; hand it on rather than copying again.
            next_working = saved.state if saved.state_json is not None else _pristine(saved)
            return saved, next_working


def _record_failure(
    store: Store,
    cp: Checkpoint,
    index: int,
    name: str,
    attempt: int,
    error: BaseException,
    on: bool,
    final: bool = False,
) -> Checkpoint:
    """Save the failure of step ``index`` without advancing the run.

    A retried failure keeps ``attempt`` so a crash during the backoff does not reset the
    count. A final one stores ``attempt`` 0 (the number stays in ``failure.attempt``): the
    run is marked failed, and whoever runs it again, after fixing the cause, gets the
    policy's full budget back. Only crashes, which record no failure, eat into a budget.
    """
    failure = Failure(
        step_index=index,
        step_name=name,
        error_type=type(error).__qualname__,
        # Exception text may hold anything; keep the stored record valid UTF-8.
        message=str(error)[:_MAX_MESSAGE].encode("utf-8", "backslashreplace").decode("utf-8"),
        attempt=attempt,
        at=utcnow(),
    )
    return _save(
        store,
        Checkpoint(
            run_id=cp.run_id,
            step=cp.step,
            state=_pristine(cp),
            version=cp.version,
            step_names=cp.step_names,
            total_steps=cp.total_steps,
            attempt=0 if final else attempt,
            failure=failure,
            created_at=cp.created_at,
        ),
        f"failure of step {index}",
        on,
    )


def _fail(
    store: Store,
    cp: Checkpoint,
    index: int,
    name: str,
    attempt: int,
    error: Exception,
    on: bool,
) -> NoReturn:
    """Save the failure on the run, then raise ``StepFailed`` from ``error``."""
    try:
        cp = _record_failure(store, cp, index, name, attempt, error, on, final=True)
    except ConflictError:
        raise
    except StoreError as save_error:
        # The run fails either way; the step's error is the one the caller needs.
        logger.error("run %r: could not save the failure record: %s", cp.run_id, save_error)
    logger.error(
        "run %r: step %d (%r) failed on attempt %d: %s",
        cp.run_id,
        index,
        name,
        attempt,
        type(error).__name__,
    )
    raise StepFailed(cp.run_id, index, name, _pristine(cp), attempt) from error
