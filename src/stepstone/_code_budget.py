"""A code workflow's journal appends, and its spend-budget requests: a ctx.charge journaled
with the ledger by one write, and the check before a ctx.step of a budgeted run."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from . import _budget, _spending
from ._checkpoint import Checkpoint, evolve
from ._core import write
from ._effects import Effect
from ._journal import (
    ATTEMPTS_KEY,
    JOURNAL_KEY,
    entry_ok,
    journal_of,
)
from ._plan import Plan
from ._pool import push
from ._session import Session
from ._steps import (
    Wait,
)


def _append(
    plan: Plan,
    cp: Checkpoint,
    entries: list[dict[str, Any]],
    changes: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Generator[Effect, Any, Checkpoint]:
    """Save ``entries`` at the end of the journal (one compare-and-swap); return the record.

    The new state is built on the last saved one (never changed in place): its journal
    list's items are the very objects it holds, which is how a long state's save sees
    an append and stores only the new entries.
    """
    base = cp.state
    new = dict(base)
    new[JOURNAL_KEY] = [*journal_of(base), *entries]
    if extra:
        new.update(extra)  # other keys of the state saved with the entries (the ledger)
    attempts = base.get(ATTEMPTS_KEY)
    if isinstance(attempts, dict) and attempts:
        # A journaled call's attempts are in its entry now.
        done = {entry["call"] for entry in entries}
        if not done.isdisjoint(attempts):
            new[ATTEMPTS_KEY] = {k: v for k, v in attempts.items() if k not in done}
    what = (
        f"journal {entries[-1]['call']}" if len(entries) == 1 else f"journal {len(entries)} calls"
    )
    saved: Checkpoint = yield from write(plan, cp, evolve(cp, state=new, **changes), what)
    return saved


def _spend_request(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """A ``ctx.charge`` to journal, or the check before a ``ctx.step`` of a budgeted run."""
    if request[0] == "budget":
        return (yield from _gated(plan, cp, session, request))
    cp = yield from _charged(plan, cp, session, request)
    return cp, None


def _charged(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, Checkpoint]:
    """Journal a ``ctx.charge`` and add it to the ledger, by one write; answer if it counted."""
    _, seq, call, charge, reply = request
    # Charged to the call made just before it (``ctx.step("draft", ...)``: "draft").
    before = [e["call"] for e in journal_of(cp.state) if e.get("seq") == seq - 1]
    step = before[0].rsplit("#", 1)[0] if before else session.name
    ledger, counted = _spending.charge_ledger(plan, cp.state, charge, step)
    if counted:  # a budgeted tree's child: its root's pool first (``_pool``)
        yield from push(cp, seq, f"{cp.epoch}.code", charge["usd"], charge["tokens"])
    entry = entry_ok(seq, call, 1, counted)
    note = _spending.soft_warning(plan, cp, ledger)
    cp = yield from _append(plan, cp, [entry], {}, {_budget.SPEND_KEY: ledger})
    _spending.after_save(plan, (None, note))
    session.answered(reply)
    reply.ok(counted)
    return cp


def _gated(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """Before a ``ctx.step`` of a run with a budget: go on, or wait for ``budget.raise``."""
    _, reply = request
    cp, waiting = yield from _spending.check(plan, cp, write)
    if waiting is not None:
        session.stop("stopped")
        pause = {"state": waiting.state, "consumed": waiting.consumed}
        return cp, Wait(_budget.BUDGET_WAIT, None, pause)
    session.answered(reply)
    reply.ok(None)
    return cp, None
