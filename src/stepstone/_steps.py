"""What a run is made of: ``Step``, ``SuspendingStep``, ``RetryPolicy``, ``Workflow``.

A ``Step`` is a function the driver calls. A ``SuspendingStep`` (``WaitFor``, ``Sleep``,
``Map`` in ``_suspend``, and the adapters' steps) is evaluated by the core instead: it
completes (``Complete``) or has the run wait (``Wait``).
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, TypeGuard

from ._append_only import check_append_only
from ._budget import Budget, check_budget
from ._checkpoint import Checkpoint
from ._deadline import check_deadline, check_on_deadline
from ._effects import Effect
from ._errors import InvalidCharge, InvalidWorkflow, safe_text
from ._flow._call import FlowCall, check_tokens
from ._flow._limit import Limit, check_limits
from ._meter import Meter
from ._observe import logger
from ._plan import Plan
from ._stream._writer import emit as _emit
from ._timeouts import check_timeout

__all__ = [
    "AttemptsExhausted",
    "Complete",
    "Outcome",
    "RetryPolicy",
    "Step",
    "StepCodeError",
    "StepContext",
    "SuspendingStep",
    "Wait",
    "Workflow",
    "check_name",
    "check_steps",
    "retries",
    "idempotency_key",
    "safe_text",
    "workflow_label",
]

#: The longest single delay a RetryPolicy may ask for: a day. Longer waits are a
#: ``Sleep`` step's job (durable, costing no process), not a blocked worker's.
MAX_RETRY_DELAY = 86_400.0
MAX_MULTIPLIER = 1_000.0
MAX_ATTEMPTS = 1_000_000


class AttemptsExhausted(Exception):
    """The step's retry policy allows no more attempts (earlier ones died with the process)."""


def _finite_number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidWorkflow(f"RetryPolicy.{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        raise InvalidWorkflow(f"RetryPolicy.{name} must be between {low} and {high}, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and when a failing step is tried again.

    The attempt count is saved before each attempt, so a process that dies mid-step does
    not get a fresh budget on resume: a step that crashes its process every time stops
    after ``max_attempts`` instead of looping forever.

    Attributes:
        max_attempts: Attempts in all, the first included (1 means no retry), up to 10**6.
        initial_delay: Seconds before the second attempt (0 to 86,400).
        multiplier: Factor applied to the delay after each attempt (0 to 1,000).
        max_delay: Upper bound on one delay, in seconds (0 to 86,400).
        jitter: Fraction of the delay added or removed at random (0 to 1; 0.1 is +-10%).
        retry_on: Exception types to retry, or a predicate taking the exception.
    """

    max_attempts: int = 3
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool] = (Exception,)

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or not 1 <= self.max_attempts <= MAX_ATTEMPTS
        ):
            raise InvalidWorkflow(
                f"max_attempts must be an int from 1 to {MAX_ATTEMPTS}, got {self.max_attempts!r}"
            )
        _finite_number("initial_delay", self.initial_delay, 0.0, MAX_RETRY_DELAY)
        _finite_number("max_delay", self.max_delay, 0.0, MAX_RETRY_DELAY)
        _finite_number("multiplier", self.multiplier, 0.0, MAX_MULTIPLIER)
        _finite_number("jitter", self.jitter, 0.0, 1.0)
        if isinstance(self.retry_on, tuple):
            if not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.retry_on):
                raise InvalidWorkflow("retry_on must hold exception types only")
        elif not callable(self.retry_on):
            raise InvalidWorkflow("retry_on must be a tuple of exception types or a predicate")

    def should_retry(self, exc: BaseException) -> bool:
        """Return whether ``exc`` is one this policy retries."""
        if isinstance(self.retry_on, tuple):
            return isinstance(exc, self.retry_on)
        return bool(self.retry_on(exc))

    def delay(self, attempt: int) -> float:
        """Return the seconds to wait after failed attempt number ``attempt``."""
        base, factor, cap = float(self.initial_delay), float(self.multiplier), float(self.max_delay)
        if base <= 0 or cap <= 0 or attempt <= 1:
            value = 0.0 if base <= 0 or cap <= 0 else base
        elif factor <= 1:
            value = base * factor ** (attempt - 1)  # shrinks or stays: no overflow
        else:
            # In logarithms: factor ** attempt overflows a float long before the cap
            # stops mattering, whatever the base (even 5e-324).
            exponent = math.log(base) + (attempt - 1) * math.log(factor)
            if exponent >= math.log(cap):
                value = cap
            else:
                try:
                    value = base * factor ** (attempt - 1)  # exact where it fits
                except OverflowError:  # a base near the smallest float
                    value = math.exp(exponent)
        jittered = min(value, cap) * (1 + random.uniform(-self.jitter, self.jitter))
        return min(cap, max(0.0, jittered))


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
    # Issue 33: the attempt's heartbeat (``_timeouts.Beat``), set by a driver running a
    # step with a timeout; None otherwise.
    _beat: Any = field(default=None, repr=False, compare=False)

    def heartbeat(self) -> None:
        """Tell the runner this step is alive (``Step(idle_timeout=...)`` counts from here).

        Raises:
            StepTimeout: this attempt timed out; whatever it does now is fenced off, so
                stop: another attempt runs (or ran) in its place.
        """
        if self._beat is not None:
            self._beat.beat()

    #: ``emit(topic, data)``: append an event to the run's stream (``stepstone.stream``
    #: reads it), only while this step runs (``EmitOutsideStep`` after). Events of an
    #: attempt that does not commit the step are hidden once another attempt commits
    #: it. The writer's function itself, not a method calling it: a model's tokens are
    #: emitted by the thousand, and the call spared is ~7% of an event's instructions.
    emit = staticmethod(_emit)

    #: What this attempt charged and reserved (``_meter``), made on first use.
    meter: Meter | None = field(default=None, repr=False, compare=False)
    #: What the meter is made from (plan, checkpoint): None outside a run.
    seed: Any = field(default=None, repr=False, compare=False)

    def charge(
        self, *, usd: float = 0.0, tokens: int = 0, ref: str | None = None, **unknown: Any
    ) -> bool:
        """Record what this step spent; saved with the step's result, by the same write.

        ``ref`` (a provider's response id, say) makes the charge idempotent: a charge
        whose ref the run's ledger already holds is a no-op (returns False), so a step
        that runs again after a crash never counts twice.

        Raises:
            InvalidCharge: a negative or non-numeric amount, an unknown field, or a
                charge after the step returned; nothing was recorded.
        """
        return self._meter().charge(usd, tokens, ref, unknown)

    def reserve(self, *, usd: float = 0.0, tokens: int = 0, **unknown: Any) -> str:
        """Reserve an estimate before an expensive call; return the reservation's id.

        Saved at once (one compare-and-swap, refused if the run's lease moved on). The
        step's commit settles it; if the attempt dies, it stays on the books as spent,
        unconfirmed. Past the hard limit the run pauses (``BudgetExhausted``: let it
        propagate) and this step runs again once the budget is raised.
        """
        return self._meter().reserve(usd, tokens, unknown)

    async def areserve(self, *, usd: float = 0.0, tokens: int = 0, **unknown: Any) -> str:
        """``reserve`` for an ``async def`` step: the save is awaited."""
        return await self._meter().areserve(usd, tokens, unknown)

    def _meter(self) -> Meter:
        meter = self.meter
        if meter is not None:
            return meter
        if self.seed is _RETURNED:
            raise InvalidCharge(
                f"step {self.step_name!r}: the step has returned; charge inside the step, "
                "before it returns"
            )
        if self.seed is None:
            raise InvalidCharge(
                f"step {self.step_name!r}: this context was not made by a run; "
                "ctx.charge() and ctx.reserve() work inside a step that a run is running"
            )
        plan, cp = self.seed
        meter = Meter(plan, cp, self.step_name, self.attempt)
        object.__setattr__(self, "meter", meter)  # made on first use: most steps never charge
        return meter

    def returned(self) -> Meter | None:
        """The step returned: refuse later charges; return its meter, if it charged."""
        meter = self.meter
        if meter is None:
            object.__setattr__(self, "seed", _RETURNED)
        else:
            meter.closed = True
        return meter

    # --- flow control (issue 37): the keys this call holds, ``_flow._call`` ----------
    flow: FlowCall | None = field(default=None, repr=False, compare=False)

    def acquire(self, key: str, tokens: float = 0) -> None:
        """Hold limit ``key`` (one request, ``tokens`` estimated) until the step returns.

        If the key is not held yet the call stops here and the runner takes it (or
        parks the run until it can) and calls the step again: code before ``acquire``
        may run twice, so acquire first, outside any ``except Exception``.
        """
        if self.flow is None:
            raise InvalidWorkflow("ctx.acquire: this context does not come from a step run")
        self.flow.acquire(key, tokens)

    def settle(self, tokens: float) -> None:
        """Record the tokens this call really used; the estimate is corrected after it."""
        if self.flow is None:
            raise InvalidWorkflow("ctx.settle: this context does not come from a step run")
        self.flow.settle(tokens)


_RETURNED: Any = object()


def retries(
    policy: RetryPolicy | None, attempt: int, error: BaseException
) -> TypeGuard[RetryPolicy]:
    """Return whether failed attempt number ``attempt`` is tried again under ``policy``.

    The one rule for a step's retries and a workflow context's calls: attempts left,
    and the policy retries ``error``. A ``retry_on`` predicate that raises means no
    retry, logged. True narrows ``policy`` to a ``RetryPolicy`` for the caller.
    """
    if policy is None or attempt >= policy.max_attempts:
        return False
    try:
        return bool(policy.should_retry(error))
    except Exception:  # noqa: BLE001 - user code: a broken predicate means no retry
        logger.exception("the retry_on predicate raised; not retrying")
        return False


def idempotency_key(run_id: str, step_index: int, step_name: str) -> str:
    """Return the deterministic idempotency key of one step of one run."""
    import hashlib  # noqa: PLC0415 - not needed by `import stepstone` itself

    raw = f"stepstone\x00{run_id}\x00{step_index}\x00{step_name}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


def workflow_label(name: object, version: object) -> str:
    """Return ``'name' version 'v2'``, or ``'name' (unversioned)``: never ``version None``."""
    return f"{name!r} (unversioned)" if version is None else f"{name!r} version {version!r}"


def check_name(name: object) -> str:
    """Return ``name`` if it can name a step (a non-empty str that is valid UTF-8)."""
    if not isinstance(name, str) or not name:
        raise InvalidWorkflow(f"a step name must be a non-empty str, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidWorkflow(f"step name {name!r} holds a lone surrogate") from None
    return name


@dataclass(frozen=True, slots=True)
class Step:
    """A named step: ``fn(state)`` or ``fn(state, ctx)`` returns updates (a dict) or None.

    ``fn`` may be ``async def``: such a step runs only under ``arun``. Under ``arun`` a
    plain function runs in a worker thread, so a blocking call cannot stall the loop.
    """

    name: str
    fn: Callable[..., Any]
    retry: RetryPolicy | None = None
    #: Issue 33 (``_timeouts``): seconds an attempt may run, and may run without a
    #: ``ctx.heartbeat()``, before it fails with ``StepTimeout``. None: no limit.
    timeout: float | timedelta | None = None
    idle_timeout: float | timedelta | None = None
    #: Flow control (issue 37): the limits (``Limit`` or a stored key) every call takes,
    #: and the tokens it is estimated to use (a number, or ``fn(state)``).
    limits: Sequence[Limit | str] = ()
    tokens: float | Callable[[dict[str, Any]], float] | None = None
    takes_context: bool = field(init=False, repr=False, compare=False)
    is_async: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name(self.name)
        if not callable(self.fn):
            raise InvalidWorkflow(f"step {self.name!r}: fn must be callable, got {self.fn!r}")
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InvalidWorkflow(f"step {self.name!r}: retry must be a RetryPolicy or None")
        if self.limits or self.tokens is not None:
            object.__setattr__(self, "limits", check_limits(self.limits, f"step {self.name!r}"))
            if self.tokens is not None and not callable(self.tokens):
                check_tokens(self.tokens, f"step {self.name!r}")
        object.__setattr__(self, "takes_context", _takes_context(self.fn))
        object.__setattr__(self, "is_async", _is_async(self.fn))
        what = f"step {self.name!r}"
        object.__setattr__(self, "timeout", check_timeout(what, "timeout", self.timeout))
        idle = check_timeout(what, "idle_timeout", self.idle_timeout)
        object.__setattr__(self, "idle_timeout", idle)

    @property
    def timed(self) -> bool:
        """Whether the step has a timeout or an idle timeout (``_timeouts``)."""
        return self.timeout is not None or self.idle_timeout is not None


def _is_async(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


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


# --- suspending steps and their outcomes ----------------------------------------------


class StepCodeError(Exception):
    """An error raised by a suspending step's user code (``Map.items``), wrapped.

    The runner unwraps it and treats it as the step's failure whatever its type, even
    a store's error: only a store failing in the step's own bookkeeping pauses the run.
    """

    def __init__(self, error: Exception) -> None:
        # Not str(error): a user's exception may fail to print; the runner unwraps it.
        super().__init__(type(error).__qualname__)
        self.error = error


class Complete:
    """The step is done: merge ``update``; apply ``changes`` to the checkpoint."""

    __slots__ = ("changes", "update")

    def __init__(self, update: dict[str, Any], changes: dict[str, Any] | None = None) -> None:
        self.update = update
        self.changes = changes or {}


class Wait:
    """The run must wait for ``waiting_for`` until ``wake_at`` (None: only a signal)."""

    __slots__ = ("changes", "poll_only", "waiting_for", "wake_at")

    def __init__(
        self,
        waiting_for: str,
        wake_at: datetime | None,
        changes: dict[str, Any] | None = None,
        poll_only: bool = False,
    ) -> None:
        self.waiting_for = waiting_for
        self.wake_at = wake_at
        self.changes = changes or {}
        self.poll_only = poll_only


Outcome = Complete | Wait


class SuspendingStep:
    """Base of the steps that may suspend a run. Not for subclassing by users."""

    __slots__ = ("name", "retry")

    name: str
    retry: RetryPolicy | None

    def ready(self, cp: Checkpoint, now: datetime | None = None) -> bool:
        """Return whether a run waiting at this step has what it waits for by ``now``
        (the store's clock; this host's when None)."""
        raise NotImplementedError

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Outcome]:
        """Decide: complete now, or wait. ``first`` is True on a fresh attempt."""
        raise NotImplementedError


class Workflow:
    """A named, optionally versioned list of steps: what workers serve and ``start`` queues.

    A run started from a workflow records its name and version; a worker runs it only
    with a workflow of that very name and version, never with other steps, or with one
    that declares an upgrade from that version: ``upgrades={"2": fn}`` moves a run of
    version "2" onto this one at a step boundary, its state replaced by ``fn(state)``
    (``stepstone.upgrade``; the rules are in ``_upgrade``).

    ``limits=[Limit(...) or key]``: every run started from it holds these keys while it
    executes (``start(keys=...)`` adds the run's own; ``_flow._runs``).

    ``history=True``: each run keeps every save, not only its latest, so that
    ``stepstone.history`` lists them and ``fork``/``rerun`` start again from any step
    (on a backend that holds pieces: memory, file, SQLite, PostgreSQL, MySQL).

    ``append_only=["messages"]``: a save compares only these lists' last 16 stored items;
    an older one changed in place is not stored (a trade: ``_append_only``).
    """

    __slots__ = (
        "append_only",
        "budget",
        "deadline",
        "history",
        "limits",
        "name",
        "on_deadline",
        "steps",
        "upgrades",
        "version",
    )

    def __init__(
        self,
        name: str,
        steps: Sequence[Any],
        *,
        version: str | None = None,
        upgrades: Mapping[str | None, Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
        history: bool = False,
        deadline: float | timedelta | None = None,
        on_deadline: str = "fail",
        budget: Budget | None = None,
        limits: Sequence[Limit | str] = (),
        append_only: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(history, bool):
            raise InvalidWorkflow(f"workflow {name!r}: history must be True or False")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidWorkflow(
                f"a workflow name must be a str of 1-200 characters, got {name!r}"
            )
        check_name(name)
        if version is not None and (not isinstance(version, str) or not version):
            raise InvalidWorkflow(f"workflow {name!r}: version must be a non-empty str or None")
        self.name = name
        self.version = version
        #: Every save of its runs is kept (``stepstone.history``, ``fork``, ``rerun``).
        self.history = history
        self.append_only = check_append_only(name, append_only)  # see the docstring
        #: Issue 33 (``_deadline``): seconds from a run's first claim to its end, and
        #: what happens then (``fail``, or ``wait`` for the signal ``deadline``).
        self.deadline = check_deadline(f"workflow {name!r}", deadline)
        self.on_deadline = check_on_deadline(f"workflow {name!r}", on_deadline)
        #: Each run's spend budget (``stepstone.Budget``), unless ``start``/``run`` gives one.
        self.budget = check_budget(budget)
        #: Flow control (issue 37): keys every run holds from its claim to its end.
        self.limits = check_limits(limits, f"workflow {name!r}")
        self.steps: tuple[Any, ...] = tuple(check_steps(steps))
        seen: set[str] = set()
        for step in self.steps:
            # A run's record names its completed steps: two of one name would make a
            # resume, a history or a rerun ambiguous about which one ran.
            if step.name in seen:
                raise InvalidWorkflow(
                    f"workflow {name!r}: two steps are named {step.name!r}; step names must "
                    "be unique within a workflow"
                )
            seen.add(step.name)
        self.upgrades: Mapping[str | None, Callable[[dict[str, Any]], dict[str, Any]]] = (
            _check_upgrades(name, version, upgrades)
        )

    @property
    def key(self) -> tuple[str, str | None]:
        """``(name, version)``: what identifies the workflow to workers."""
        return (self.name, self.version)

    def __repr__(self) -> str:
        shown = "" if self.version is None else f", version={self.version!r}"
        if self.upgrades:
            shown += f", upgrades from {', '.join(repr(v) for v in self.upgrades)}"
        if self.history:
            shown += ", history kept"
        if self.deadline is not None:
            shown += f", deadline {self.deadline:g}s"
        return f"Workflow({self.name!r}, {len(self.steps)} steps{shown})"


def _check_upgrades(
    name: str, version: str | None, upgrades: object
) -> Mapping[str | None, Callable[[dict[str, Any]], dict[str, Any]]]:
    """Return ``upgrades`` as a read-only mapping, or raise ``InvalidWorkflow`` saying why."""
    if upgrades is None:
        return MappingProxyType({})
    if not isinstance(upgrades, Mapping):
        raise InvalidWorkflow(
            f"workflow {name!r}: upgrades must be a dict of old version -> function of the "
            f"state, got {type(upgrades).__name__}"
        )
    if upgrades and version is None:
        raise InvalidWorkflow(
            f"workflow {name!r} declares upgrades but has no version: give it one "
            "(version=...), the version the upgraded runs are moved to"
        )
    table: dict[str | None, Callable[[dict[str, Any]], dict[str, Any]]] = {}
    for old, fn in upgrades.items():
        if old is not None and (not isinstance(old, str) or not old):
            raise InvalidWorkflow(
                f"workflow {name!r}: an upgrade's key is the old version, a non-empty str "
                f"(or None for runs started unversioned), got {old!r}"
            )
        if old == version:
            raise InvalidWorkflow(
                f"workflow {name!r}: version {version!r} cannot upgrade from itself; "
                "upgrades name older versions"
            )
        # A coroutine function would return a coroutine, not a state: the upgrade runs
        # inside the claim, where nothing is awaited.
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise InvalidWorkflow(
                f"workflow {name!r}: the upgrade from version {old!r} must be a plain "
                "function of the state returning the new state (not async)"
            )
        table[old] = fn
    return MappingProxyType(table)


def check_steps(steps: object) -> list[Any]:
    """Return ``steps`` as a list of steps, or raise ``InvalidWorkflow`` saying why not."""
    if isinstance(steps, Workflow):
        return list(steps.steps)
    if isinstance(steps, (str, bytes, Mapping)) or not isinstance(steps, Iterable):
        raise InvalidWorkflow(f"steps must be a list of Step objects, got {type(steps).__name__}")
    items = list(steps)
    maps: set[str] = set()
    for item in items:
        if not isinstance(item, (Step, SuspendingStep)):
            raise InvalidWorkflow(
                f"steps must be Step objects (or WaitFor, Sleep, Map), got {type(item).__name__}"
            )
        if type(item).__name__ == "Map":
            # A Map's children are named after it: two of one name would share them.
            if item.name in maps:
                raise InvalidWorkflow(f"two Map steps are named {item.name!r}; name them apart")
            maps.add(item.name)
    return items
