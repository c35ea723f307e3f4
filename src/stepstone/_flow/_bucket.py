"""The rules of one limit record, as pure functions of its JSON state and the time.

No I/O here: ``_flow._ops`` loads a record, asks these functions, and saves the answer
by compare-and-swap, so every rule below is one small write on every backend.

The record (the ``state`` of checkpoint ``~limit/<key>``)::

    {"config": {...Limit.config()...},
     "holders": {run_id: [epoch, tokens]},   # concurrency slots, fenced by lease epoch
                                             # (["r", t]: kept at t for a woken waiter)
     "req_tat": t, "tok_tat": t,             # GCRA theoretical arrival times (seconds)
     "blocked_until": t,                     # a 429's retry-after, shared by all
     "waiters": [[run_id, priority, since]], # parked runs, to wake on a release
     "pending": [run_id]}                    # replace_pending: started, not yet holding

**Priority.** A release hands its slot to the waiter of highest *effective* priority,
``priority + seconds waited / AGING``, and keeps it for that run (``RESERVE`` seconds)
while it is woken: so a run of priority 0 that has waited ``AGING * n`` seconds goes
before a newly parked run of priority ``n``, and none waits forever behind a stream of
higher ones. Runs that find a free slot take it at once, whatever their priority.

Rates use GCRA (the generic cell rate algorithm, as ``redis-cell`` does): one
theoretical arrival time per rate, no counters per window. A rate of ``n`` per ``P``
seconds is a bucket of ``n`` units refilled at ``n/P`` per second: a request of cost
``c`` conforms when ``max(tat, now) + c*P/n - now <= P``. So over any interval of
length ``t`` at most ``n + n*t/P`` units are granted (the provider-side bucket that
LLM APIs meter with), and a fleet sharing the record never exceeds it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .._checkpoint import PRIORITY_AGING
from .._errors import ConfigError
from ._limit import Limit

__all__ = [
    "AGING",
    "RESERVE",
    "Decision",
    "block",
    "decide",
    "fresh",
    "is_reserved",
    "release",
    "settle",
]

# Float slack for "conforms": a TAT computed as a sum of intervals must not be refused
# for the last ulp.
_EPS = 1e-9
#: At most this many waiters are remembered per key (the rest find the key at their poll).
MAX_WAITERS = 256
#: Seconds of waiting worth one level of priority (anti-starvation), as for queued runs.
AGING = PRIORITY_AGING
#: Seconds a released slot stays kept for the waiter it was handed to.
RESERVE = 2.0
_RESERVED = "r"


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


def _gcra(
    tat: float | None, now: float, cost: float, rate: tuple[float, float], slack: float = 0.0
) -> float:
    """Return the new TAT if ``cost`` units conform now, else raise ``_Later`` with when.

    ``slack``: how far the store's time may be from ``now`` either way (a coarse server
    clock, ``_store_time``). The units conform if they would at the earliest the time can
    be (the exact GCRA's test, ``max(tat, t) + cost - t <= per``, only gets easier as
    ``t`` grows, so the earliest is the worst case), and are charged from the latest (a
    TAT at least as late as the true one), so every grant is one the exact GCRA would
    make at the true time and no window is over the rate. The cost is burst, never
    liveness: after an idle spell the TAT starts up to ``2 * slack`` late. (Testing the
    TAT charged from the latest against the earliest, as before, refused every unit
    while ``2 * slack`` plus one unit's interval exceeded the window: a Cosmos DB clock
    not yet read finely, 1 s wide, stalled a rate of 4 a second outright.)
    """
    n, per = rate
    if cost > n:
        raise ConfigError(
            f"an acquisition of {cost:g} units can never fit a rate of {n:g} per {per:g}s"
        )
    first = now - slack
    held = tat if tat is not None else first
    charge = cost * per / n
    if max(held, first) + charge - first > per + _EPS:
        # Conforms once the earliest time reaches held + charge - per.
        raise _Later(held + charge - per + slack)
    return max(held, now + slack) + charge


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
    stale: set[tuple[str, Any]],
    priority: int = 0,
    *,
    slack: float = 0.0,
) -> tuple[dict[str, Any] | None, Decision]:
    """Decide one acquisition of ``limit`` by ``run_id`` at lease ``epoch``.

    ``stale`` are slots ``(run_id, epoch)`` known dead (their run finished, was taken
    over, or its owner died): they are reclaimed, as are slots kept for a woken waiter longer than
    ``RESERVE``. ``slack``: how far the store's time may be from ``now`` (``_gcra``).
    Returns the new state (None when nothing changed) and the decision. A refusal for
    concurrency records the run as a waiter, to be woken by a release.
    """
    new = dict(state)
    before = state.get("holders", {})
    holders: dict[str, list[Any]] = {
        h: v for h, v in before.items() if (h, v[0]) not in stale and not _lapsed(h, v, run_id, now)
    }
    changed = len(holders) != len(before)
    mine = holders.get(run_id)
    if mine is not None:
        if mine[0] == epoch:
            return (_with(new, holders) if changed else None), Decision(True)
        del holders[run_id]  # an earlier epoch of ours (a dead execution), or kept for us
        changed = True
    blocked = state.get("blocked_until")
    if blocked is not None and blocked > now - slack:
        return (_with(new, holders) if changed else None), Decision(False, "blocked", blocked)
    if limit.concurrency is not None and len(holders) >= limit.concurrency:
        waiters = _waiting(state, run_id, priority, now)
        if not changed and waiters == state.get("waiters", []):
            # A parked run looking again (its poll) and still listed: nothing to write, so
            # the hot key's record is not rewritten by every waiter every poll.
            return None, Decision(False, "concurrency", None)
        new["waiters"] = waiters
        return _with(new, holders), Decision(False, "concurrency", None)
    refused = _rates(new, state, limit, tokens, now, slack)
    if refused is not None:
        if mine is not None and mine[0] == _RESERVED:
            holders[run_id] = mine  # keep the slot kept for us while the rate catches up
        return (_with(new, holders) if changed else None), refused
    if limit.concurrency is not None:
        holders[run_id] = [epoch, tokens]
    new["waiters"] = [w for w in state.get("waiters", []) if w[0] != run_id]
    if run_id in state.get("pending", ()):
        new["pending"] = [p for p in state["pending"] if p != run_id]
    return _with(new, holders), Decision(True)


def _rates(
    new: dict[str, Any],
    state: dict[str, Any],
    limit: Limit,
    tokens: float,
    now: float,
    slack: float,
) -> Decision | None:
    """Charge one request and ``tokens`` to ``new``; a refusal (``new`` untouched) if over."""
    req_rate, tok_rate = limit.request_rate(), limit.token_rate()
    try:
        req_tat = _gcra(state.get("req_tat"), now, 1.0, req_rate, slack) if req_rate else None
    except _Later as later:
        return Decision(False, "requests", later.at)
    try:
        tok_tat = (
            _gcra(state.get("tok_tat"), now, tokens, tok_rate, slack)
            if tok_rate and tokens
            else None
        )
    except _Later as later:
        return Decision(False, "tokens", later.at)
    if req_tat is not None:
        new["req_tat"] = req_tat
    if tok_tat is not None:
        new["tok_tat"] = tok_tat
    return None


def _lapsed(holder: str, held: list[Any], run_id: str, now: float) -> bool:
    """Return whether ``held`` is a slot kept for a woken waiter that never came."""
    return held[0] == _RESERVED and holder != run_id and now - float(held[1]) > RESERVE


def _waiting(state: dict[str, Any], run_id: str, priority: int, now: float) -> list[Any]:
    """Return the waiters with ``run_id`` among them (its first arrival time kept)."""
    waiters = [list(w) for w in state.get("waiters", [])]
    for waiter in waiters:
        if waiter[0] == run_id:
            waiter[1] = priority
            return waiters
    return [*waiters[: MAX_WAITERS - 1], [run_id, priority, now]]


def is_reserved(held: list[Any]) -> bool:
    """Return whether a holder entry is a slot kept for a woken waiter (no run holds it)."""
    return bool(held[0] == _RESERVED)


def _with(state: dict[str, Any], holders: dict[str, list[Any]]) -> dict[str, Any]:
    state["holders"] = holders
    return state


def release(
    state: dict[str, Any], run_id: str, epoch: int, now: float
) -> tuple[dict[str, Any] | None, str | None]:
    """Give back ``run_id``'s slot (only the one of ``epoch``); return the state and a waiter.

    The slot is handed to the waiter of highest effective priority (kept for it,
    ``RESERVE`` seconds), whom the caller wakes; it records itself again if it finds the
    key full.
    """
    holders = dict(state.get("holders", {}))
    held = holders.get(run_id)
    if held is None or held[0] != epoch:
        return None, None
    del holders[run_id]
    waiters = [w for w in state.get("waiters", []) if w[0] not in holders]
    if not waiters:
        return {**state, "holders": holders, "waiters": []}, None
    best = max(waiters, key=lambda w: (float(w[1]) + (now - float(w[2])) / AGING, -w[2]))
    waiters.remove(best)
    holders[best[0]] = [_RESERVED, now]
    return {**state, "holders": holders, "waiters": waiters}, str(best[0])


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
