"""The core's side of spend budgets: the check before a step, the ledger's updates.

``_budget`` holds what a budget and a ledger are; this module what the run's core
(``_core``, ``_code``) and the adapters do with them: ``gate``/``check`` before a step
(pause at the hard limit, or leave a pause), ``record`` (the declared budget on record
when the run is taken), ``settle``/``commit`` (an attempt's charges into the ledger in
the state the step's save writes, and a child's into its tree's pool), ``charge_ledger``
(a code workflow's journaled charge), ``usage_charge`` (an agent step's usage), and the
soft-limit warning and OpenTelemetry counters once a save has landed.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Generator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from . import _lease, _tenant
from ._budget import (
    BUDGET_WAIT,
    DIGITS,
    RAISE_SIGNAL,
    SPEND_KEY,
    Prices,
    ledger_of,
    over,
    past,
    raised,
    reservations,
    spend_now,
)
from ._checkpoint import Checkpoint, evolve
from ._codec import pristine
from ._effects import Announce, Effect, Load
from ._errors import Suspended
from ._observe import logger
from ._pool import POOL_POLL, pool_id, push
from ._store_time import Now, plain
from ._tenant import tenant_of

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = [
    "Meter",
    "after_save",
    "charge_ledger",
    "check",
    "commit",
    "pool_refusal",
    "push_usage",
    "settle_reservations",
    "tenant_refusal",
    "gate",
    "record",
    "settle",
    "soft_warning",
    "usage_charge",
]


def usage_charge(
    plan: Plan,
    state: dict[str, Any],
    step: str,
    usage: dict[str, int],
    prices: Prices | None,
) -> dict[str, Any] | None:
    """An adapter step's ledger after charging its agent run's usage, or None to leave it.

    Charged when the run has a budget or a ledger, or ``prices`` are given; tokens
    always, dollars with ``prices``. The ref is the step's own: it completes once, so
    its usage is charged once, with its output, by the same save.
    """
    if plan.budget is None and SPEND_KEY not in state and prices is None:
        return None
    inputs, outputs = int(usage.get("input", 0)), int(usage.get("output", 0))
    usd = 0.0 if prices is None else prices.cost(inputs, outputs)
    charge = {"usd": usd, "tokens": inputs + outputs, "ref": f"{plan.run_id}#{step}"}
    ledger, _ = charge_ledger(plan, state, charge, step)
    if prices is not None:
        ledger["prices_as_of"] = prices.as_of
    return ledger


class Meter(Protocol):
    """What ``settle`` needs of a step's meter (``_meter.Meter``, which imports this)."""

    step: str
    attempt: str
    charges: list[dict[str, Any]]
    reserved: list[dict[str, Any]]
    closed: bool
    settled_usd: float


# --- the core's hooks ----------------------------------------------------------------------

Write = Callable[[Any, Checkpoint, Checkpoint, str], Generator[Effect, Any, Checkpoint]]


def gate(
    plan: Plan, cp: Checkpoint, write: Write, exhausted: str | None = None
) -> Generator[Effect, Any, Checkpoint]:
    """Before an attempt: pause the run at its hard limit, or take it out of that pause.

    Over the limit (or ``exhausted``: a reservation was refused), the run is saved
    waiting for ``budget.raise`` (lease given back) and ``Suspended`` raised. Resumed
    from such a wait with room again, the wait is cleared (one save) and the attempt
    goes on.
    """
    cp, waiting = yield from check(plan, cp, write, exhausted)
    if waiting is None:
        return cp
    saved = yield from write(plan, cp, _lease.released(waiting), f"budget pause at {cp.step + 1}")
    if raised(saved.signals)[2] > waiting.consumed.get(RAISE_SIGNAL, 0):
        yield Announce()  # a raise landed while we paused: a worker takes it now
    raise Suspended(plan.run_id, BUDGET_WAIT, waiting.wake_at)


def record(plan: Plan, cp: Checkpoint, write: Write) -> Generator[Effect, Any, Checkpoint]:
    """Write the run's declared budget into its ledger, if it is not there yet (one save).

    Then whoever resumes the run (a worker too) keeps to it, and a ``Map``'s children
    (``_pool.inherit``) draw from it from the first step on.
    """
    if plan.budget is None or "budget" in ledger_of(cp.state):
        return cp
    state = pristine(cp)
    state[SPEND_KEY] = {**ledger_of(state), "budget": plan.budget.to_json()}
    saved: Checkpoint = yield from write(plan, cp, evolve(cp, state=state), "budget")
    return saved


def check(
    plan: Plan,
    cp: Checkpoint,
    write: Write,
    exhausted: str | None = None,
    skip: str | None = None,
) -> Generator[Effect, Any, tuple[Checkpoint, Checkpoint | None]]:
    """Return ``(cp, None)`` if the run may spend (saving what changed), else the pause.

    The pause is the record to save the run waiting with (``waiting_for`` set, the
    reason in the ledger, the raises seen counted as consumed), not yet saved: a step
    list saves it (``gate``), a code workflow hands it to the core as a ``Wait``.
    ``skip``: an open reservation ``spend_now`` leaves out.
    """
    spend = spend_now(cp, plan.budget, skip=skip)
    _, _, raises = raised(cp.signals)
    consumed = dict(cp.consumed)
    seen = consumed.get(RAISE_SIGNAL, 0)
    consumed[RAISE_SIGNAL] = raises
    reason = exhausted or over(spend)
    wake_at = None
    root_id = pool_id(cp)
    if exhausted is not None and root_id is not None:
        # A tree's child refused a reservation (by the pool, most likely): a raise of the
        # root's budget wakes no child, so it looks again (on the store's clock, as
        # every wake time: the claims judge it there).
        wake_at = plain((yield Now())) + timedelta(seconds=POOL_POLL)
    if reason is None and root_id is not None:
        # A child of a budgeted run: the tree's one pool is its root's record.
        root: Checkpoint | None = yield Load(root_id)
        pool = None if root is None else over(spend_now(root, None))
        if pool is not None:
            reason = f"the pool of run {root_id!r}: {pool}"
            # A raise there wakes no child: it looks again.
            wake_at = plain((yield Now())) + timedelta(seconds=POOL_POLL)
    tenant = tenant_of(cp)
    if reason is None and tenant is not None:
        # The tenant's cap (``_tenant``): a new window or a higher cap wakes no run.
        record: Checkpoint | None = yield Load(_tenant.PREFIX + tenant)
        reason = _tenant.refusal(tenant, record)
        if reason is not None:
            wake_at = plain((yield Now())) + timedelta(seconds=POOL_POLL)
    state = None
    if reason is None:
        # Saved only when something changed: the run leaves a budget pause, a raise
        # came while it ran, or its declared budget is not in its ledger yet (so that
        # whoever resumes it, a worker too, keeps to the budget it was run with).
        unrecorded = plan.budget is not None and "budget" not in ledger_of(cp.state)
        if cp.waiting_for == BUDGET_WAIT or seen != raises or unrecorded:
            state = pristine(cp)
            ledger = dict(ledger_of(state))
            ledger.pop("paused", None)
            if unrecorded and plan.budget is not None:
                ledger["budget"] = plan.budget.to_json()
            state[SPEND_KEY] = ledger
            cp = yield from write(
                plan,
                cp,
                evolve(cp, state=state, waiting_for=None, wake_at=None, consumed=consumed),
                "budget",
            )
            if seen != raises:
                logger.info("run %r: budget raised; resuming", plan.run_id)
        return cp, None
    state = pristine(cp)
    ledger = dict(ledger_of(state))
    if "budget" not in ledger and plan.budget is not None:
        ledger["budget"] = plan.budget.to_json()
    ledger["paused"] = reason
    state[SPEND_KEY] = ledger
    logger.warning("run %r: budget reached (%s); waiting for %r", plan.run_id, reason, RAISE_SIGNAL)
    _count("stepstone.budget.paused", 1, plan.run_id)
    waiting = evolve(cp, state=state, waiting_for=BUDGET_WAIT, wake_at=wake_at, consumed=consumed)
    return cp, waiting


def tenant_refusal(cp: Checkpoint, usd: float, tokens: int) -> Generator[Effect, Any, str | None]:
    """Why a reservation of ``usd`` and ``tokens`` would pass the run's tenant's cap."""
    tenant = tenant_of(cp)
    if tenant is None:
        return None
    record: Checkpoint | None = yield Load(_tenant.PREFIX + tenant)
    return _tenant.refusal(tenant, record, usd, tokens)


def pool_refusal(root_id: str, root: Checkpoint | None, usd: float, tokens: int) -> str | None:
    """Why a reservation of ``usd`` and ``tokens`` would pass the limit of the pool of
    ``root`` (a budgeted tree's root: its own spend and its children's), if it would."""
    if root is None:
        return None  # the root is gone: its children's own ledgers remain
    reason = past(spend_now(root, None), usd, tokens)
    return None if reason is None else f"the pool of run {root_id!r}: {reason}"


def settle_reservations(cp: Checkpoint, ledger: dict[str, Any]) -> None:
    """A code workflow's ``ctx.charge``: settle the open reservations its attempt made.

    An open reservation of an earlier lease epoch is of an attempt that died after it
    (the process that made it is gone): it moves to ``unconfirmed``, as a step's does.
    """
    _sort_reservations(cp, ledger, list(ledger.get("settled", ())), f"{cp.epoch}.code")


def _sort_reservations(
    cp: Checkpoint, ledger: dict[str, Any], settled: list[str], mine: str | None
) -> None:
    """Put each open reservation of ``cp`` in ``ledger``: settled (in ``settled``, or of
    the attempt ``mine``) or unconfirmed (an attempt that never committed)."""
    unconfirmed = list(ledger.get("unconfirmed", ()))
    done = set(settled) | {u.get("id") for u in unconfirmed}
    for s in reservations(cp.signals):
        if s.id in done:
            continue
        if mine is not None and s.payload.get("attempt") == mine:
            settled.append(s.id)
        else:
            unconfirmed.append({"id": s.id, **s.payload})
        done.add(s.id)
    if settled:
        ledger["settled"] = settled
    if unconfirmed:
        ledger["unconfirmed"] = unconfirmed


def charge_ledger(
    plan: Plan, state: Mapping[str, Any], charge: dict[str, Any], step: str
) -> tuple[dict[str, Any], bool]:
    """Return the ledger of ``state`` with ``charge`` added, and whether it counted.

    For a code workflow's ``ctx.charge``: journaled, so it is saved with its journal
    entry by one write; a ref the ledger holds counts nothing.
    """
    ledger = {k: v for k, v in ledger_of(state).items() if k != "paused"}
    if "budget" not in ledger and plan.budget is not None:
        ledger["budget"] = plan.budget.to_json()
    ref = charge["ref"]
    refs = dict(ledger.get("refs", {}))
    if ref is not None and ref in refs:
        return ledger, False
    # Shallow copies, the charged step's entry new: the stored ledger is never changed
    # in place (a long state's save compares the old with the new).
    by_step = dict(ledger.get("by_step", {}))
    mine = by_step[step] = dict(by_step.get(step, {"usd": 0.0, "tokens": 0}))
    mine["usd"] = round(float(mine["usd"]) + charge["usd"], DIGITS)
    mine["tokens"] = int(mine["tokens"]) + charge["tokens"]
    if ref is not None:
        refs[ref] = step
    ledger.update(
        usd=round(float(ledger.get("usd", 0.0)) + charge["usd"], DIGITS),
        tokens=int(ledger.get("tokens", 0)) + charge["tokens"],
        by_step=by_step,
        refs=refs,
    )
    return ledger, True


def settle(plan: Plan, cp: Checkpoint, working: dict[str, Any], meter: Meter | None) -> str | None:
    """Put the attempt's charges into the ledger in ``working`` (saved with the step).

    The attempt's reservations are settled; any other open reservation in ``cp`` is an
    attempt that never committed: moved to ``unconfirmed``. Returns the soft-limit
    warning to log once the save has landed, if this save crosses it.
    """
    ledger = {k: v for k, v in ledger_of(cp.state).items() if k != "paused"}
    if "budget" not in ledger and plan.budget is not None:
        ledger["budget"] = plan.budget.to_json()
    charges, reserved = ([], []) if meter is None else (meter.charges, meter.reserved)
    if meter is not None:
        meter.closed = True
    if meter is not None and charges:
        usd = float(ledger.get("usd", 0.0))
        tokens = int(ledger.get("tokens", 0))
        by_step = dict(ledger.get("by_step", {}))  # shallow: only this step's entry is new
        refs = dict(ledger.get("refs", {}))
        mine = by_step[meter.step] = dict(by_step.get(meter.step, {"usd": 0.0, "tokens": 0}))
        for c in charges:
            usd = round(usd + c["usd"], DIGITS)
            tokens += c["tokens"]
            mine["usd"] = round(float(mine["usd"]) + c["usd"], DIGITS)
            mine["tokens"] = int(mine["tokens"]) + c["tokens"]
            if c["ref"] is not None:
                refs[c["ref"]] = meter.step
        ledger.update(usd=usd, tokens=tokens, by_step=by_step, refs=refs)
        meter.settled_usd = round(sum(c["usd"] for c in charges), DIGITS)
    settled = list(ledger.get("settled", ()))
    settled.extend(r["id"] for r in reserved)
    _sort_reservations(cp, ledger, settled, None)
    working[SPEND_KEY] = ledger
    return soft_warning(plan, cp, ledger)


def soft_warning(plan: Plan, cp: Checkpoint, ledger: dict[str, Any]) -> str | None:
    """If ``ledger`` (about to be saved for ``cp``) first passes the soft threshold, mark
    it so (``soft_warned``: once per run) and return the warning to log after the save."""
    if ledger.get("soft_warned") or "budget" not in ledger:
        return None  # warned once already, or nothing to warn of
    spend = spend_now(evolve(cp, state={SPEND_KEY: ledger}), None)
    if spend.soft is None:
        return None
    used = round(spend.usd + spend.unconfirmed_usd + spend.children_usd, DIGITS)
    tokens_used = spend.tokens + spend.unconfirmed_tokens + spend.children_tokens
    if not (
        (spend.limit_usd is not None and used >= spend.soft * spend.limit_usd)
        or (spend.limit_tokens is not None and tokens_used >= spend.soft * spend.limit_tokens)
    ):
        return None
    ledger["soft_warned"] = True
    shown = []
    if spend.limit_usd is not None:
        shown.append(f"${used:g} of ${spend.limit_usd:g}")
    if spend.limit_tokens is not None:
        shown.append(f"{tokens_used} of {spend.limit_tokens} tokens")
    return f"run {plan.run_id!r} passed {spend.soft:.0%} of its budget: {', '.join(shown)}"


def commit(
    plan: Plan, cp: Checkpoint, working: dict[str, Any], meter: Meter | None, spending: bool
) -> Generator[Effect, Any, tuple[Meter | None, str | None] | None]:
    """Before a step's save: its charges into the ledger in ``working`` (``settle``) and,
    for a budgeted tree's child, into the root's pool (``_pool``). None: nothing to do."""
    spent = meter is not None and (meter.charges or meter.reserved)
    if not spending and not spent:
        return None
    note = settle(plan, cp, working, meter)
    tenant = tenant_of(cp)
    if meter is not None and meter.charges and (pool_id(cp) is not None or tenant is not None):
        usd = round(sum(float(c["usd"]) for c in meter.charges), DIGITS)
        tokens = sum(int(c["tokens"]) for c in meter.charges)
        label = push_label(meter.attempt, meter.charges)
        yield from push(cp, cp.step + 1, label, usd, tokens)
        if tenant is not None:
            yield from _tenant.push(tenant, f"{cp.run_id}#{cp.step + 1}#{label}", usd, tokens)
    return meter, note


def push_label(attempt: str, charges: list[dict[str, Any]]) -> str:
    """What names an attempt's charges in its tree's pool and its tenant's window.

    Charges that all have refs are named by them: an attempt killed between that count
    and its own save, rerun with the same refs (the same provider responses, by the
    call's idempotency key), finds its count there and adds nothing, so the count is
    exact. Without refs a rerun cannot be told from new spend: named by the attempt,
    it is counted again (the cap errs on the side of spending less).
    """
    refs = [c.get("ref") for c in charges]
    named = [r for r in refs if isinstance(r, str)]
    if not named or len(named) != len(refs):
        return attempt
    digest = hashlib.sha256("\0".join(sorted(named)).encode()).hexdigest()[:24]
    return f"refs-{digest}"


def push_usage(
    cp: Checkpoint, update: Mapping[str, Any], attempt: int
) -> Generator[Effect, Any, None]:
    """Before a suspending step's save: what an agent's usage charge (the ledger in
    ``update``, about to be saved) adds goes to its tree's pool and its tenant's window
    first, as a step's charges do."""
    ledger = update.get(SPEND_KEY)
    if not isinstance(ledger, dict) or (pool_id(cp) is None and tenant_of(cp) is None):
        return
    before = ledger_of(cp.state)
    usd = round(float(ledger.get("usd", 0.0)) - float(before.get("usd", 0.0)), DIGITS)
    tokens = int(ledger.get("tokens", 0)) - int(before.get("tokens", 0))
    if usd <= 0 and tokens <= 0:
        return
    usd, tokens = max(usd, 0.0), max(tokens, 0)
    label = f"{cp.epoch}.{attempt}"
    yield from push(cp, cp.step + 1, label, usd, tokens)
    tenant = tenant_of(cp)
    if tenant is not None:
        yield from _tenant.push(tenant, f"{cp.run_id}#{cp.step + 1}#{label}", usd, tokens)


def after_save(plan: Plan, settled: tuple[Meter | None, str | None] | None) -> None:
    """The step's save landed: count what it charged (OpenTelemetry), warn once if soft."""
    if settled is None:
        return
    meter, note = settled
    if meter is not None and meter.settled_usd:
        _count("stepstone.spend", meter.settled_usd, plan.run_id, unit="USD")
    if note is not None:
        logger.warning("%s", note)
        _count("stepstone.budget.soft", 1, plan.run_id)


_instruments: dict[str, Any] = {}


def _count(name: str, value: float, run_id: str, unit: str = "1") -> None:
    """Add to the OpenTelemetry counter ``name`` (nothing without opentelemetry)."""
    if name not in _instruments:
        try:
            metrics = importlib.import_module("opentelemetry.metrics")
        except ImportError:
            _instruments[name] = None
        else:
            meter = metrics.get_meter("stepstone")
            _instruments[name] = meter.create_counter(name, unit=unit)
    counter = _instruments[name]
    if counter is not None:
        counter.add(value, {"run_id": run_id})
