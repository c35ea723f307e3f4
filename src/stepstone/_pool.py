"""A run tree's one spend pool: the children of a budgeted run charge its root.

A ``Map`` child (or ``ctx.map`` child) of a run that has a budget or draws from a pool
is created with ``{"pool": ROOT}`` in its ledger (``inherit``). Before a child's step
saves its charges, they are added to the root's record as a signal ``POOL_SIGNAL``
(one compare-and-swap, kept by the root owner's re-based saves like any signal), with
an id per child, step and attempt, so a repeated push is a no-op. Pushed before the
child's save, a charge is never missing from the pool: an attempt that dies between
the push and its save leaves its charge counted, as an unconfirmed reservation is (the
cap errs on the side of spending less); the child's own ledger stays exact.

Before each step of a child, the root's record is read: at or over the root's hard
limit (its own spend plus every pushed charge), the child is saved waiting for
``budget.raise`` and looks again every ``POOL_POLL`` seconds, so raising the root's
budget resumes the children too.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from . import _hooks
from ._checkpoint import Checkpoint, Signal, evolve, utcnow
from ._effects import Effect, Load, Save
from ._errors import ConflictError
from ._tenant import tenant_of

__all__ = ["POOL_POLL", "POOL_SIGNAL", "inherit", "pooled", "push"]

#: The signal a child's charges are added to its root's record as.
POOL_SIGNAL = "~pool"
#: How often a child paused by its tree's pool looks at the root again (seconds).
POOL_POLL = 60.0
_SPEND_KEY = "~spend"  # ``_budget.SPEND_KEY``; not imported: ``_budget`` imports this
_MAX_TRIES = 20


def pool_id(cp: Checkpoint) -> str | None:
    """The root whose pool the run draws from; None if it is no budgeted tree's child."""
    ledger = cp.state.get(_SPEND_KEY)
    if isinstance(ledger, dict) and isinstance(ledger.get("pool"), str):
        return str(ledger["pool"])
    return None


def inherit(parent: Checkpoint, child: Checkpoint) -> Checkpoint:
    """Return ``child``'s new record drawing from ``parent``'s pool, if it has one."""
    ledger = parent.state.get(_SPEND_KEY)
    if not isinstance(ledger, dict) or ("budget" not in ledger and "pool" not in ledger):
        return child
    root = pool_id(parent) or parent.run_id
    ledger_of_child: dict[str, Any] = {"pool": root}
    tenant = tenant_of(parent)
    if tenant is not None:
        ledger_of_child["tenant"] = tenant  # the tree's tenant cap (``_tenant``)
    return evolve(child, state={**child.state, _SPEND_KEY: ledger_of_child})


def pooled(signals: tuple[Signal, ...]) -> tuple[float, int]:
    """Return the dollars and tokens the children pushed to this root."""
    usd, tokens = 0.0, 0
    for s in signals:
        if s.name == POOL_SIGNAL and isinstance(s.payload, dict):
            usd += float(s.payload.get("usd", 0.0))
            tokens += int(s.payload.get("tokens", 0))
    return round(usd, 9), tokens


def push(
    cp: Checkpoint, index: int, attempt: str, usd: float, tokens: int
) -> Generator[Effect, Any, None]:
    """Add a child's step charges to its root's pool, once per child, step and attempt."""
    root_id = pool_id(cp)
    if root_id is None or (not usd and not tokens):
        return
    signal_id = f"{cp.run_id}#{index}#{attempt}"
    payload = {"run": cp.run_id, "step": index, "attempt": attempt, "usd": usd, "tokens": tokens}
    for _ in range(_MAX_TRIES):
        root: Checkpoint | None = yield Load(root_id)
        if root is None or any(s.id == signal_id for s in root.signals):
            return  # the root is gone (its children's own ledgers remain), or pushed
        pushed = evolve(
            root, signals=(*root.signals, Signal(POOL_SIGNAL, signal_id, payload, utcnow()))
        )
        try:
            yield Save(pushed, f"pool charge of {cp.run_id}", owned=False)
        except ConflictError:
            continue
        _hooks.fire("budget.pooled")  # in the pool, the child's save not made: a kill point
        return
    raise ConflictError(f"run {root_id!r}: too many writers while its pool was charged", root_id)
