"""Spend budgets: ``Budget``, the run's cost ledger, and the meter a step charges to.

The ledger is a JSON object in the run's state under ``SPEND_KEY`` (as a code
workflow's journal is under ``~journal``), so it is saved by the very compare-and-swap
that saves the step's result, on every backend, and a store written before budgets
existed reads as a run with no ledger::

    {"budget": {"usd": 5.0, "tokens": 2000000, "soft": 0.8},
     "usd": 1.25, "tokens": 41000,                  # confirmed: charged by committed steps
     "by_step": {"draft": {"usd": 1.25, "tokens": 41000}},
     "refs": {"resp_1": "draft"},                   # a repeated ref is a no-op
     "settled": ["9f..."],                          # reservations settled by a commit
     "unconfirmed": [{"id": "3a...", "step": "draft", "attempt": "4.1", "usd": 0.5,
                      "tokens": 0}],                # reserved by attempts that never committed
     "soft_warned": true}

Two kinds of record come from writers other than the step's own save, and both are
signals (``Checkpoint.signals``), because a signal is what every save of the owner
keeps when it is re-based (``_lease.rebase``), and what a lease renewal never undoes:

- a reservation (``ctx.reserve``), the signal ``RESERVE_SIGNAL``, written by the step
  itself before its expensive call: one compare-and-swap, refused if the run's lease
  has another owner or epoch (fenced). The step's commit settles it; if the attempt
  dies instead, the next commit moves it to ``unconfirmed`` ("spent, unconfirmed"), so
  the cap errs on the side of spending less;
- a raise (``stepstone runs budget RUN --raise-usd N``, or ``signal(store, run,
  "budget.raise", {"usd": N})``), the signal ``RAISE_SIGNAL``: the limits are the
  budget plus every raise received.

Before each attempt of a step the core asks ``gate``: at or over the hard limit
(confirmed + unconfirmed + open reservations), the run is saved ``waiting`` for the
signal ``budget.raise``, exactly as a ``WaitFor`` leaves it: no process is held, a raise
makes it due, ``cancel`` ends it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from . import _lease
from ._checkpoint import Checkpoint, Signal, evolve, utcnow
from ._codec import pristine
from ._effects import Announce, Effect, Load
from ._errors import InvalidCharge, InvalidWorkflow, Suspended
from ._observe import logger
from ._pool import POOL_POLL, pool_id, pooled, push

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = [
    "BUDGET_WAIT",
    "RAISE_SIGNAL",
    "RESERVE_SIGNAL",
    "SPEND_KEY",
    "Budget",
    "BudgetExhausted",
    "Meter",
    "Prices",
    "Spend",
    "charge_ledger",
    "check",
    "record",
    "check_fields",
    "check_tokens",
    "check_usd",
    "past",
    "gate",
    "ledger_of",
    "settle",
    "soft_warning",
    "spend_of",
    "usage_charge",
]

#: Where the ledger lives in a run's state.
SPEND_KEY = "~spend"
#: The signal that raises a run's budget (payload ``{"usd": N, "tokens": M}``).
RAISE_SIGNAL = "budget.raise"
#: The signal a reservation is recorded as.
RESERVE_SIGNAL = "~reserve"
#: What a run paused by its budget waits for (``Checkpoint.waiting_for``).
BUDGET_WAIT = f"signal {RAISE_SIGNAL}"
_DIGITS = 9  # dollars are summed rounded to a billionth: the same sum on every host


def check_usd(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidCharge(f"{what}: usd must be a number of dollars, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise InvalidCharge(f"{what}: usd must be a finite number >= 0, got {value!r}")
    return number


def check_tokens(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidCharge(f"{what}: tokens must be an int >= 0, got {value!r}")
    return value


def check_fields(fields: Mapping[str, Any], what: str) -> None:
    if fields:
        raise InvalidCharge(
            f"{what}: unknown field {sorted(fields)[0]!r}; a charge has usd= (dollars), "
            "tokens= and ref= only"
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """A run's spend limit: dollars, tokens, or both (``None``: no limit on that one).

    Past ``soft`` (a fraction of a limit) the run logs a warning and adds to the
    OpenTelemetry counter ``stepstone.budget.soft``; at the hard limit it is saved
    waiting for ``budget.raise`` before its next step (or its next ``ctx.reserve``).
    """

    usd: float | None = None
    tokens: int | None = None
    soft: float = 0.8

    def __post_init__(self) -> None:
        if self.usd is None and self.tokens is None:
            raise InvalidWorkflow("Budget needs usd=, tokens= or both")
        if self.usd is not None:
            try:
                check_usd(self.usd, "Budget")
            except InvalidCharge as exc:
                raise InvalidWorkflow(str(exc)) from None
        if self.tokens is not None:
            try:
                check_tokens(self.tokens, "Budget")
            except InvalidCharge as exc:
                raise InvalidWorkflow(str(exc)) from None
        soft = self.soft
        if isinstance(soft, bool) or not isinstance(soft, (int, float)) or not 0 < soft <= 1:
            raise InvalidWorkflow(f"Budget: soft must be a fraction in (0, 1], got {soft!r}")

    def to_json(self) -> dict[str, Any]:
        """Return the budget as stored in the ledger."""
        out: dict[str, Any] = {"soft": float(self.soft)}
        if self.usd is not None:
            out["usd"] = float(self.usd)
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out


@dataclass(frozen=True, slots=True)
class Prices:
    """What a model's tokens cost, for the adapters' automatic charges.

    Dollars per million input and output tokens, and the date those prices were read
    (``as_of``, shown beside every charge made with them): stepstone ships no price
    table of its own, so no charge is ever made at a stale price without saying so.
    """

    input_per_million: float
    output_per_million: float
    as_of: str

    def __post_init__(self) -> None:
        for name in ("input_per_million", "output_per_million"):
            try:
                check_usd(getattr(self, name), f"Prices.{name}")
            except InvalidCharge as exc:
                raise InvalidWorkflow(str(exc)) from None
        if not isinstance(self.as_of, str) or not self.as_of:
            raise InvalidWorkflow(
                "Prices.as_of must say when the prices were read, e.g. 2026-12-01"
            )

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """Return the dollars ``input_tokens`` and ``output_tokens`` cost."""
        usd = input_tokens * self.input_per_million + output_tokens * self.output_per_million
        return round(usd / 1_000_000, _DIGITS)


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


def check_budget(budget: object) -> Budget | None:
    """Return ``budget`` if it is a ``Budget`` or None, else raise ``InvalidWorkflow``."""
    if budget is not None and not isinstance(budget, Budget):
        raise InvalidWorkflow(f"budget must be a stepstone.Budget or None, got {budget!r}")
    return budget


class BudgetExhausted(Exception):
    """``ctx.reserve`` found the run at or over its hard limit; let it propagate.

    The core saves the run waiting for ``budget.raise``; the step runs again from its
    start once the budget is raised. Not a step failure, never retried.
    """


@dataclass(frozen=True, slots=True)
class Spend:
    """A run's spend as its ledger says (``stepstone.spend_of``).

    ``unconfirmed_*`` counts reservations of attempts that never committed (and, while
    a step runs, its own open ones): spent or not, the cap counts them.
    """

    usd: float
    tokens: int
    unconfirmed_usd: float
    unconfirmed_tokens: int
    limit_usd: float | None
    limit_tokens: int | None
    soft: float | None
    by_step: dict[str, dict[str, Any]]
    unconfirmed: list[dict[str, Any]]
    #: What the run's children charged to its pool (``_pool``): counted against its limits.
    children_usd: float = 0.0
    children_tokens: int = 0

    def text(self) -> str:
        """One line: ``$5.5 of $5, 2100 tokens, unconfirmed $1 (1), OVER BUDGET``."""
        used = round(self.usd + self.children_usd, _DIGITS)
        parts = [f"${used:g}" + ("" if self.limit_usd is None else f" of ${self.limit_usd:g}")]
        tokens = self.tokens + self.children_tokens
        parts.append(
            f"{tokens} tokens" + ("" if self.limit_tokens is None else f" of {self.limit_tokens}")
        )
        if self.children_usd or self.children_tokens:
            parts.append(f"children ${self.children_usd:g}")
        if self.unconfirmed:
            parts.append(f"unconfirmed ${self.unconfirmed_usd:g} ({len(self.unconfirmed)})")
        if self.over:
            parts.append("OVER BUDGET")
        return ", ".join(parts)

    @property
    def over(self) -> bool:
        """Whether confirmed plus unconfirmed spend is at or over a hard limit."""
        return _over(self) is not None

    def to_json(self) -> dict[str, Any]:
        """Return the figures as a JSON object (``runs show --json``)."""
        return {
            "usd": self.usd,
            "tokens": self.tokens,
            "unconfirmed_usd": self.unconfirmed_usd,
            "unconfirmed_tokens": self.unconfirmed_tokens,
            "limit_usd": self.limit_usd,
            "limit_tokens": self.limit_tokens,
            "soft": self.soft,
            "over": self.over,
            "by_step": self.by_step,
            "unconfirmed": self.unconfirmed,
            "children_usd": self.children_usd,
            "children_tokens": self.children_tokens,
        }


def past(spend: Spend, usd: float, tokens: int) -> str | None:
    """Why ``spend`` plus ``usd`` and ``tokens`` more would pass a hard limit, if it would.

    Reaching a limit exactly is allowed here (a reservation may use the last cent);
    ``_over`` pauses a run that has reached it.
    """
    used = round(spend.usd + spend.unconfirmed_usd + spend.children_usd + usd, _DIGITS)
    if spend.limit_usd is not None and used > spend.limit_usd:
        return f"${used:g} of ${spend.limit_usd:g}"
    count = spend.tokens + spend.unconfirmed_tokens + spend.children_tokens + tokens
    if spend.limit_tokens is not None and count > spend.limit_tokens:
        return f"{count} of {spend.limit_tokens} tokens"
    return None


def _over(spend: Spend) -> str | None:
    used = round(spend.usd + spend.unconfirmed_usd + spend.children_usd, _DIGITS)
    if spend.limit_usd is not None and used >= spend.limit_usd:
        return f"spent ${used:g} of ${spend.limit_usd:g}"
    tokens = spend.tokens + spend.unconfirmed_tokens + spend.children_tokens
    if spend.limit_tokens is not None and tokens >= spend.limit_tokens:
        return f"spent {tokens} of {spend.limit_tokens} tokens"
    return None


def ledger_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ledger held in ``state`` (empty for a run that never spent)."""
    ledger = state.get(SPEND_KEY)
    if ledger is None:
        return {}
    if not isinstance(ledger, dict):
        raise InvalidWorkflow(
            f"the state's {SPEND_KEY!r} is a {type(ledger).__name__}, not a spend ledger; "
            "that key is reserved for it"
        )
    return ledger


def _reservations(signals: tuple[Signal, ...]) -> list[Signal]:
    return [s for s in signals if s.name == RESERVE_SIGNAL and isinstance(s.payload, dict)]


def _raised(signals: tuple[Signal, ...]) -> tuple[float, int, int]:
    """Return the dollars and tokens every ``budget.raise`` added, and how many came."""
    usd, tokens, count = 0.0, 0, 0
    for s in signals:
        if s.name != RAISE_SIGNAL:
            continue
        count += 1
        payload = s.payload if isinstance(s.payload, dict) else {}
        value = payload.get("usd")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            usd = round(usd + float(value), _DIGITS)
        value = payload.get("tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            tokens += value
    return usd, tokens, count


def spend_of(cp: Checkpoint, budget: Budget | None = None) -> Spend:
    """Return the spend of the run ``cp`` holds: confirmed, unconfirmed, limits.

    ``budget`` is the one declared (``Workflow(budget=)``, ``run(budget=)``), used when
    the run's ledger has none yet.
    """
    return _spend(cp, budget, detail=True)


def _spend(cp: Checkpoint, budget: Budget | None, detail: bool = False) -> Spend:
    """``spend_of``; without ``detail``, no copy of the per-step sums (the checks')."""
    ledger = ledger_of(cp.state)
    declared = ledger.get("budget")
    if declared is None and budget is not None:
        declared = budget.to_json()
    done = set(ledger.get("settled", ()))
    unconfirmed = [dict(item) for item in ledger.get("unconfirmed", ())]
    done.update(item.get("id") for item in unconfirmed)
    for s in _reservations(cp.signals):
        if s.id not in done:
            unconfirmed.append({"id": s.id, **s.payload, "open": True})
    limit_usd = limit_tokens = soft = None
    children = pooled(cp.signals)
    if isinstance(declared, dict):
        up_usd, up_tokens, _ = _raised(cp.signals)
        soft = declared.get("soft")
        if declared.get("usd") is not None:
            limit_usd = round(float(declared["usd"]) + up_usd, _DIGITS)
        if declared.get("tokens") is not None:
            limit_tokens = int(declared["tokens"]) + up_tokens
    return Spend(
        usd=float(ledger.get("usd", 0.0)),
        tokens=int(ledger.get("tokens", 0)),
        unconfirmed_usd=round(sum((float(u.get("usd", 0.0)) for u in unconfirmed), 0.0), _DIGITS),
        unconfirmed_tokens=sum(int(u.get("tokens", 0)) for u in unconfirmed),
        limit_usd=limit_usd,
        limit_tokens=limit_tokens,
        soft=soft,
        by_step={k: dict(v) for k, v in ledger.get("by_step", {}).items()} if detail else {},
        unconfirmed=unconfirmed,
        children_usd=children[0],
        children_tokens=children[1],
    )


def active(plan: Plan, cp: Checkpoint) -> bool:
    """Return whether the run has a budget or a ledger (else the hooks cost nothing)."""
    return plan.budget is not None or SPEND_KEY in cp.state


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
    if _raised(saved.signals)[2] > waiting.consumed.get(RAISE_SIGNAL, 0):
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
    plan: Plan, cp: Checkpoint, write: Write, exhausted: str | None = None
) -> Generator[Effect, Any, tuple[Checkpoint, Checkpoint | None]]:
    """Return ``(cp, None)`` if the run may spend (saving what changed), else the pause.

    The pause is the record to save the run waiting with (``waiting_for`` set, the
    reason in the ledger, the raises seen counted as consumed), not yet saved: a step
    list saves it (``gate``), a code workflow hands it to the core as a ``Wait``.
    """
    spend = _spend(cp, plan.budget)
    _, _, raises = _raised(cp.signals)
    consumed = dict(cp.consumed)
    seen = consumed.get(RAISE_SIGNAL, 0)
    consumed[RAISE_SIGNAL] = raises
    reason = exhausted or _over(spend)
    wake_at = None
    root_id = pool_id(cp)
    if reason is None and root_id is not None:
        # A child of a budgeted run: the tree's one pool is its root's record.
        root: Checkpoint | None = yield Load(root_id)
        pool = None if root is None else _over(_spend(root, None))
        if pool is not None:
            reason = f"the pool of run {root_id!r}: {pool}"
            wake_at = utcnow() + timedelta(seconds=POOL_POLL)  # a raise there wakes no child
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
    mine["usd"] = round(float(mine["usd"]) + charge["usd"], _DIGITS)
    mine["tokens"] = int(mine["tokens"]) + charge["tokens"]
    if ref is not None:
        refs[ref] = step
    ledger.update(
        usd=round(float(ledger.get("usd", 0.0)) + charge["usd"], _DIGITS),
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
            usd = round(usd + c["usd"], _DIGITS)
            tokens += c["tokens"]
            mine["usd"] = round(float(mine["usd"]) + c["usd"], _DIGITS)
            mine["tokens"] = int(mine["tokens"]) + c["tokens"]
            if c["ref"] is not None:
                refs[c["ref"]] = meter.step
        ledger.update(usd=usd, tokens=tokens, by_step=by_step, refs=refs)
        meter.settled_usd = round(sum(c["usd"] for c in charges), _DIGITS)
    settled = list(ledger.get("settled", ()))
    settled.extend(r["id"] for r in reserved)
    done = set(settled)
    unconfirmed = list(ledger.get("unconfirmed", ()))
    done.update(u.get("id") for u in unconfirmed)
    for s in _reservations(cp.signals):
        if s.id not in done:
            unconfirmed.append({"id": s.id, **s.payload})
            done.add(s.id)
    if settled:
        ledger["settled"] = settled
    if unconfirmed:
        ledger["unconfirmed"] = unconfirmed
    working[SPEND_KEY] = ledger
    return soft_warning(plan, cp, ledger)


def soft_warning(plan: Plan, cp: Checkpoint, ledger: dict[str, Any]) -> str | None:
    """If ``ledger`` (about to be saved for ``cp``) first passes the soft threshold, mark
    it so (``soft_warned``: once per run) and return the warning to log after the save."""
    if ledger.get("soft_warned") or "budget" not in ledger:
        return None  # warned once already, or nothing to warn of
    spend = _spend(evolve(cp, state={SPEND_KEY: ledger}), None)
    if spend.soft is None:
        return None
    used = round(spend.usd + spend.unconfirmed_usd + spend.children_usd, _DIGITS)
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
    if meter is not None and meter.charges and pool_id(cp) is not None:
        usd = round(sum(float(c["usd"]) for c in meter.charges), _DIGITS)
        tokens = sum(int(c["tokens"]) for c in meter.charges)
        yield from push(cp, cp.step + 1, meter.attempt, usd, tokens)
    return meter, note


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
