"""The rules of one limit record, as pure functions of its JSON state and the time.

No I/O here: ``_flow._ops`` loads a record, asks these functions, and saves the answer
by compare-and-swap, so every rule below is one small write on every backend.

The record (the ``state`` of checkpoint ``~limit/<key>``)::

    {"config": {...Limit.config()...},
     "holders": {run_id: [epoch, tokens]},   # concurrency slots, fenced by lease epoch
     "req_tat": t, "tok_tat": t,             # GCRA theoretical arrival times (seconds)
     "blocked_until": t,                     # a 429's retry-after, shared by all
     "waiters": [run_id, ...]}               # parked runs to wake on a release, in order

Rates use GCRA (the generic cell rate algorithm, as ``redis-cell`` does): one
theoretical arrival time per rate, no counters per window. A rate of ``n`` per ``P``
seconds is a bucket of ``n`` units refilled at ``n/P`` per second: a request of cost
``c`` conforms when ``max(tat, now) + c*P/n - now <= P``. So over any interval of
length ``t`` at most ``n + n*t/P`` units are granted (the provider-side bucket that
LLM APIs meter with), and a fleet sharing the record never exceeds it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .._errors import ConfigError
from ._limit import Limit

__all__ = ["Decision", "block", "decide", "release", "settle"]

# Float slack for "conforms": a TAT computed as a sum of intervals must not be refused
# for the last ulp.
_EPS = 1e-9
#: At most this many waiters are remembered per key (the rest find the key at their poll).
MAX_WAITERS = 256


class Decision(NamedTuple):
    """The answer to one acquisition: granted, or why not and until when."""

    granted: bool
    #: Why not: ``concurrency``, ``requests``, ``tokens`` or ``blocked``.
    why: str = ""
    #: When the caller may try again (POSIX seconds); None: when a holder releases.
    retry_at: float | None = None


def fresh(limit: Limit) -> dict[str, Any]:
    """Return the state of a new record for ``limit``."""
    return {
        "config": limit.config(),
        "holders": {},
        "req_tat": None,
        "tok_tat": None,
        "blocked_until": None,
        "waiters": [],
    }


def _gcra(tat: float | None, now: float, cost: float, rate: tuple[float, float]) -> float:
    """Return the new TAT if ``cost`` units conform now, else raise ``_Later`` with when."""
    n, per = rate
    if cost > n:
        raise ConfigError(
            f"an acquisition of {cost:g} units can never fit a rate of {n:g} per {per:g}s"
        )
    new = max(tat if tat is not None else now, now) + cost * per / n
    if new - now > per + _EPS:
        raise _Later(new - per)
    return new


class _Later(Exception):
    def __init__(self, at: float) -> None:
        self.at = at


def decide(
    state: dict[str, Any],
    limit: Limit,
    run_id: str,
    epoch: int,
    tokens: float,
    now: float,
    stale: set[str],
) -> tuple[dict[str, Any] | None, Decision]:
    """Decide one acquisition of ``limit`` by ``run_id`` at lease ``epoch``.

    ``stale`` are holders known dead (their run finished, was taken over, or its owner
    died): their slots are reclaimed. Returns the new state (None when nothing changed)
    and the decision. A refusal for concurrency records the run as a waiter, to be woken
    by the next release.
    """
    new = dict(state)
    holders: dict[str, list[Any]] = {
        h: v for h, v in state.get("holders", {}).items() if h not in stale
    }
    changed = len(holders) != len(state.get("holders", {}))
    mine = holders.get(run_id)
    if mine is not None:
        if mine[0] == epoch:
            return (_with(new, holders) if changed else None), Decision(True)
        del holders[run_id]  # an earlier epoch of ours: a dead execution's slot
        changed = True
    blocked = state.get("blocked_until")
    if blocked is not None and blocked > now:
        return (_with(new, holders) if changed else None), Decision(False, "blocked", blocked)
    if limit.concurrency is not None and len(holders) >= limit.concurrency:
        waiters = [w for w in state.get("waiters", []) if w != run_id][: MAX_WAITERS - 1]
        new["waiters"] = [*waiters, run_id]
        return _with(new, holders), Decision(False, "concurrency", None)
    try:
        req_rate = limit.request_rate()
        if req_rate is not None:
            new["req_tat"] = _gcra(state.get("req_tat"), now, 1.0, req_rate)
    except _Later as later:
        return (_with(new, holders) if changed else None), Decision(False, "requests", later.at)
    try:
        tok_rate = limit.token_rate()
        if tok_rate is not None and tokens > 0:
            new["tok_tat"] = _gcra(state.get("tok_tat"), now, tokens, tok_rate)
    except _Later as later:
        new["req_tat"] = state.get("req_tat")
        return (_with(new, holders) if changed else None), Decision(False, "tokens", later.at)
    if limit.concurrency is not None:
        holders[run_id] = [epoch, tokens]
    new["waiters"] = [w for w in state.get("waiters", []) if w != run_id]
    return _with(new, holders), Decision(True)


def _with(state: dict[str, Any], holders: dict[str, list[Any]]) -> dict[str, Any]:
    state["holders"] = holders
    return state


def release(
    state: dict[str, Any], run_id: str, epoch: int
) -> tuple[dict[str, Any] | None, str | None]:
    """Give back ``run_id``'s slot (only the one of ``epoch``); return the state and a waiter.

    The waiter (the first one recorded) is removed from the list: the caller wakes it,
    and it records itself again if it finds the key full.
    """
    holders = dict(state.get("holders", {}))
    held = holders.get(run_id)
    if held is None or held[0] != epoch:
        return None, None
    del holders[run_id]
    waiters = [w for w in state.get("waiters", []) if w not in holders]
    woken = waiters.pop(0) if waiters else None
    return {**state, "holders": holders, "waiters": waiters}, woken


def settle(
    state: dict[str, Any], limit: Limit, estimate: float, actual: float, now: float
) -> dict[str, Any] | None:
    """Correct the token TAT by ``actual - estimate`` tokens (a refund never banks time)."""
    rate = limit.token_rate()
    if rate is None or actual == estimate:
        return None
    n, per = rate
    base = max(state.get("tok_tat") or now, now)
    tat = max(base + (actual - estimate) * per / n, now)
    return {**state, "tok_tat": tat}


def block(state: dict[str, Any], until: float) -> dict[str, Any] | None:
    """Block the key for everyone until ``until`` (never shortening a longer block)."""
    current = state.get("blocked_until")
    if current is not None and current >= until:
        return None
    return {**state, "blocked_until": until}
