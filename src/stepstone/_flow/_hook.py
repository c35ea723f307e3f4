"""What the runner does around a step that names limits (called from ``_core._run_step``).

Before the call: take every key the step declares (``Step(limits=...)``) and any the
call asked for (``ctx.acquire``), in order. A key that is full or over its rate is not
waited for in a thread: whatever was taken is given back (its tokens refunded) and the
run is saved ``waiting`` on ``limit:<key>`` until the rate allows it, or until a release
wakes it (``LIMIT_POLL`` at the latest), with no attempt spent. After the call, every
key is given back and the tokens settled. A step raising ``RateLimited`` blocks its keys
for everyone and parks the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, NoReturn

from .. import _lease
from .._checkpoint import Checkpoint, evolve
from .._effects import Announce, Effect
from .._errors import StoreError, Suspended
from .._observe import logger
from .._store_time import Now, plain
from . import _ops
from ._call import FlowCall, NeedLimit, check_tokens
from ._limit import Limit, LimitReached, RateLimited

__all__ = [
    "LIMIT_POLL",
    "NeedLimit",
    "Park",
    "RateLimited",
    "after_error",
    "before",
    "give_back",
    "park",
    "rate_limited",
    "resumed",
    "step_keys",
    "take",
    "wanted",
]

#: A run parked on a full key looks again after this many seconds even if no release
#: woke it (a wake can be lost to a crash, or to a release racing the park).
LIMIT_POLL = 2.0

Gen = Generator[Effect, Any, Any]
Wanted = list[tuple[str, float, Limit | None]]


class Park(NamedTuple):
    """The run must wait for ``key`` until ``retry_at`` (None: until woken, or the poll)."""

    key: str
    retry_at: float | None


def wanted(step: Any, state: dict[str, Any], extra: tuple[str, float] | None) -> Wanted:
    """Return the keys a call of ``step`` takes: ``(key, tokens, declared Limit or None)``."""
    found: Wanted = []
    limits = getattr(step, "limits", ())
    if limits:
        tokens = step.tokens(state) if callable(step.tokens) else (step.tokens or 0)
        tokens = check_tokens(tokens, f"step {step.name!r}")
        for entry in limits:
            if isinstance(entry, Limit):
                found.append((entry.key, tokens, entry))
            else:
                found.append((entry, tokens, None))
    if extra is not None and all(key != extra[0] for key, _, _ in found):
        found.append((extra[0], extra[1], None))
    return found


def take(
    run_id: str, epoch: int, want: Wanted, call: FlowCall, priority: int = 0
) -> Generator[Effect, Any, Park | None]:
    """Acquire every key of ``want`` for ``call``; a ``Park`` if one must be waited for.

    Raises:
        LimitReached: a key with ``policy="reject"`` is full.
        ConfigError: a key with no record and no declared ``Limit``.
    """
    for key, tokens, declared in want:
        if key in call.held:
            continue
        limit, decision = yield from _ops.acquire(key, run_id, epoch, tokens, declared, priority)
        if decision.granted:
            call.held[key] = tokens
            continue
        yield from give_back(run_id, epoch, call, ran=False)
        if limit.policy == "reject":
            raise LimitReached(key, decision.why)
        logger.info("run %r: waiting for limit %r (%s)", run_id, key, decision.why)
        return Park(key, decision.retry_at)
    return None


def give_back(run_id: str, epoch: int, call: FlowCall, *, ran: bool) -> Gen:
    """Release every key ``call`` holds; settle its tokens (all refunded if it never ran)."""
    held, call.held = call.held, {}
    for key, estimate in held.items():
        actual = call.settled if ran and call.settled is not None else (estimate if ran else 0.0)
        if actual != estimate:
            yield from _ops.settle(key, estimate, actual)
        yield from _ops.release(key, run_id, epoch)


def step_keys(step: Any, call: FlowCall) -> list[str]:
    """Return the keys of ``step``'s declared limits and those ``call`` acquired."""
    keys = [e.key if isinstance(e, Limit) else e for e in getattr(step, "limits", ())]
    return keys + [key for key in call.held if key not in keys]


def rate_limited(error: RateLimited, keys: list[str]) -> Generator[Effect, Any, float]:
    """Block the keys ``error`` names (or all the step's) for everyone; return until when."""
    at = yield Now()  # the store's clock, as the block's (``_ops.block``)
    until = float(at.timestamp()) + error.retry_after
    keys = [error.key] if error.key is not None else keys
    for key in keys:
        blocked = yield from _ops.block(key, error.retry_after)
        if blocked is not None:
            until = max(until, blocked)
    return until


#: ``_core.write``: save a record of the run as its owner (passed in: no import cycle).
Write = Callable[[Any, Checkpoint, Checkpoint, str], Generator[Effect, Any, Checkpoint]]


def before(
    plan: Any,
    index: int,
    cp: Checkpoint,
    state: dict[str, Any],
    call: FlowCall,
    extra: tuple[str, float] | None,
    write: Write,
    fail: Callable[..., Generator[Effect, Any, None]],
) -> Generator[Effect, Any, Checkpoint]:
    """Take the keys of a call of step ``index`` (or park the run); return the latest record.

    A key whose policy is ``reject`` and is full (``LimitReached``), an unknown key or a
    bad ``tokens`` estimate (``ConfigError``) fail the step through ``fail``
    (``_write._fail``), recorded.

    Raises:
        Suspended: the run was parked on a key (saved waiting, its lease given back).
    """
    step = plan.steps[index]
    if resumed(cp):
        ended = evolve(cp, waiting_for=None, wake_at=None)
        cp = yield from write(plan, cp, ended, "limit taken up")
    try:
        want = wanted(step, state, extra)
        priority = int(cp.flow.get("priority", 0)) if cp.flow else 0
        wait = (yield from take(cp.run_id, cp.epoch, want, call, priority)) if want else None
    except StoreError:
        raise
    except Exception as error:
        yield from fail(plan, cp, index, step.name, cp.attempt + 1, error)
        raise  # pragma: no cover - fail raises
    if wait is not None:
        yield from park(plan, cp, wait, cp.attempt, write)
    return cp


def after_error(
    plan: Any,
    cp: Checkpoint,
    step: Any,
    call: FlowCall,
    error: Exception,
    attempt: int,
    write: Write,
) -> Generator[Effect, Any, tuple[str, float] | None]:
    """Handle a call that raised: give its keys back; park on ``RateLimited``.

    Returns the key to take before calling the step again when ``ctx.acquire`` asked
    for one (``NeedLimit``; the keys held are kept), else None: the error is then the
    step's failure, handled as any other.

    Raises:
        Suspended: ``RateLimited``: the run was parked until its retry time, the step's
            keys blocked for everyone, ``attempt`` left as it was before this call.
    """
    if isinstance(error, NeedLimit):
        return (error.key, error.tokens)
    if not call.held and not isinstance(error, RateLimited):
        return None
    keys = step_keys(step, call)
    yield from give_back(cp.run_id, cp.epoch, call, ran=True)
    if isinstance(error, RateLimited):
        until = yield from rate_limited(error, keys)
        key = error.key or (keys[0] if keys else "rate")
        yield from park(plan, cp, Park(key, until), attempt - 1, write)
    return None


def resumed(cp: Checkpoint) -> bool:
    """Return whether ``cp`` is a run resumed after waiting for a limit."""
    return cp.waiting_for is not None and cp.waiting_for.startswith("limit:")


def park(
    plan: Any, cp: Checkpoint, wait: Park, attempt: int, write: Write
) -> Generator[Effect, Any, NoReturn]:
    """Save the run waiting on ``limit:<key>`` (``attempt`` as it was), give its lease back."""
    # ``retry_at`` is on the store's clock, and so is every wake time: the workers'
    # claims judge what is due on it too (``worker._claims``), never on a host's clock.
    store_at = yield Now()
    if wait.retry_at is not None:
        wake = datetime.fromtimestamp(wait.retry_at, UTC)
    else:
        wake = plain(store_at) + timedelta(seconds=LIMIT_POLL)
    waiting_for = f"limit:{wait.key}"
    parked = _lease.released(evolve(cp, attempt=attempt, waiting_for=waiting_for, wake_at=wake))
    saved = yield from write(plan, cp, parked, f"wait for limit {wait.key}")
    if saved.wake_at is not None and saved.wake_at <= store_at:
        # A release woke us while we parked: nobody else will announce it.
        yield Announce()
    raise Suspended(cp.run_id, waiting_for, saved.wake_at)
