"""The agent adapters' spend-budget check between an agent run's own model requests.

An agent step charges its agent run's usage when the step completes (with its output,
by the same save). Between its model requests, the adapters ask ``over_budget`` before
each request that is not in their journal yet: the run's ledger (confirmed, unconfirmed,
what its tree's children charged) plus the usage of this agent run's journaled requests
so far, against the run's limits (budget plus raises). At or over a limit, the adapter
unwinds the agent run waiting for ``budget.raise`` (as a ``WaitFor``: no process held);
once raised, the agent run replays its journaled requests, and the next one is made.
"""

from __future__ import annotations

from dataclasses import replace

from .._budget import DIGITS, RAISE_SIGNAL, SPEND_KEY, Prices, over, raised, spend_now
from .._checkpoint import Checkpoint
from .._observe import logger

__all__ = ["budgeted", "over_budget", "unconsumed_raises"]


def budgeted(cp: Checkpoint) -> bool:
    """Whether the run has a budget on record (else no check is made, at no cost)."""
    ledger = cp.state.get(SPEND_KEY)
    return isinstance(ledger, dict) and isinstance(ledger.get("budget"), dict)


def over_budget(cp: Checkpoint, inputs: int, outputs: int, prices: Prices | None) -> str | None:
    """Why the run ``cp`` may not make another model request, having used ``inputs`` and
    ``outputs`` tokens in this agent run so far (not yet charged), if it may not."""
    if not budgeted(cp):
        return None
    spend = spend_now(cp, None)
    usd = 0.0 if prices is None else prices.cost(inputs, outputs)
    spent = replace(
        spend, usd=round(spend.usd + usd, DIGITS), tokens=spend.tokens + inputs + outputs
    )
    reason = over(spent)
    if reason is not None:
        logger.warning(
            "run %r: budget reached between model requests (%s); waiting for %r",
            cp.run_id,
            reason,
            RAISE_SIGNAL,
        )
    return reason


def unconsumed_raises(cp: Checkpoint) -> int:
    """The raises the run received that no pause has counted yet: a pause counts them
    consumed, so only a new raise makes the paused run due again."""
    return raised(cp.signals)[2] - cp.consumed.get(RAISE_SIGNAL, 0)
