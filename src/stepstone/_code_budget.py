"""A code workflow's journal appends, and its spend-budget requests: a ctx.charge journaled
with the ledger by one write, a ctx.reserve journaled with its reservation by one fenced
write, and the check before a ctx.step of a budgeted run."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

from . import _budget, _hooks, _spending, _tenant
from ._checkpoint import Checkpoint, Signal, evolve, utcnow
from ._core import write
from ._effects import Effect, Load
from ._journal import (
    ATTEMPTS_KEY,
    JOURNAL_KEY,
    entry_ok,
    journal_of,
)
from ._plan import Plan
from ._pool import pool_id, push
from ._session import Session
from ._steps import (
    Wait,
)
from ._tenant import tenant_of


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
    """A ``ctx.charge`` or ``ctx.reserve`` to journal, or the check before a ``ctx.step``
    of a budgeted run."""
    if request[0] == "budget":
        return (yield from _gated(plan, cp, session, request))
    if request[0] == "reserve":
        return (yield from _reserved(plan, cp, session, request))
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
    _spending.settle_reservations(cp, ledger)  # the reservations it settles, by this write
    if counted:  # a budgeted tree's child: its root's pool first (``_pool``)
        label = _spending.push_label(f"{cp.epoch}.code", [charge])  # by its ref, if any
        yield from push(cp, seq, label, charge["usd"], charge["tokens"])
        tenant = tenant_of(cp)
        if tenant is not None:  # and its tenant's window (``_tenant``), once per call
            push_id = f"{cp.run_id}#{seq}#{label}"
            yield from _tenant.push(tenant, push_id, charge["usd"], charge["tokens"])
    entry = entry_ok(seq, call, 1, counted)
    note = _spending.soft_warning(plan, cp, ledger)
    cp = yield from _append(plan, cp, [entry], {}, {_budget.SPEND_KEY: ledger})
    _spending.after_save(plan, (None, note))
    session.answer(reply, counted)
    return cp


def _gated(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """Before a ``ctx.step`` of a run with a budget: go on, or wait for ``budget.raise``."""
    _, reply = request
    # The reservation made just before this call was checked when made: it is this
    # call's, so it does not count against the call (it does against every later one).
    skip, session.reserved = session.reserved, None
    cp, waiting = yield from _spending.check(plan, cp, write, skip=skip)
    if waiting is not None:
        return cp, _paused(session, waiting)
    session.answer(reply, None)
    return cp, None


def _paused(session: Session, waiting: Checkpoint) -> Wait:
    """The code workflow's function stops; the run is saved waiting for ``budget.raise``."""
    session.stop("stopped")
    pause = {"state": waiting.state, "consumed": waiting.consumed}
    return Wait(_budget.BUDGET_WAIT, waiting.wake_at, pause)


def _reserved(
    plan: Plan, cp: Checkpoint, session: Session, request: tuple[Any, ...]
) -> Generator[Effect, Any, tuple[Checkpoint, Wait | None]]:
    """Journal a ``ctx.reserve`` with its reservation (one write, fenced by the lease), or
    pause the run if the estimate would pass its limit or its tree's pool's."""
    _, seq, call, estimate, reply = request
    usd, tokens = estimate["usd"], estimate["tokens"]
    reason = _budget.past(_budget.spend_now(cp, plan.budget), usd, tokens)
    root_id = pool_id(cp)
    if reason is None and root_id is not None:
        root: Checkpoint | None = yield Load(root_id)
        reason = _spending.pool_refusal(root_id, root, usd, tokens)
    if reason is None:
        reason = yield from _spending.tenant_refusal(cp, usd, tokens)
    refused = None if reason is None else f"reserving would pass the budget: {reason}"
    cp, waiting = yield from _spending.check(plan, cp, write, refused)
    if waiting is not None:
        return cp, _paused(session, waiting)
    # Named by the lease's epoch: a charge of a later epoch (the process that reserved
    # died) leaves it unconfirmed (``_spending.settle_reservations``).
    payload = {"step": session.name, "attempt": f"{cp.epoch}.code", "usd": usd, "tokens": tokens}
    reservation = Signal(_budget.RESERVE_SIGNAL, os.urandom(12).hex(), payload, utcnow())
    entry = entry_ok(seq, call, 1, reservation.id)
    cp = yield from _append(plan, cp, [entry], {"signals": (*cp.signals, reservation)})
    session.reserved = reservation.id
    # Saved, the call not yet made: the crash tests kill the process here.
    _hooks.fire("budget.reserved")
    session.answer(reply, reservation.id)
    return cp, None
