"""Spend budgets: ``Budget``, ``Prices``, the run's cost ledger and ``Spend`` read from it.

(What the core does with them is in ``_spending``; a step's charges in ``_meter``; a
run tree's pool in ``_pool``.)

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

Before each step the core asks ``_spending.gate``: at or over the hard limit (confirmed
+ unconfirmed + open reservations + what the run's children charged), the run is saved
``waiting`` for the signal ``budget.raise``, exactly as a ``WaitFor`` leaves it: no
process is held, a raise makes it due, ``cancel`` ends it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._checkpoint import Checkpoint, Signal
from ._errors import ConfigError, InvalidCharge, InvalidWorkflow
from ._pool import pooled
from ._tenant import check_tenant

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = [
    "BUDGET_WAIT",
    "DIGITS",
    "RAISE_SIGNAL",
    "RESERVE_SIGNAL",
    "SPEND_KEY",
    "Budget",
    "BudgetExhausted",
    "Prices",
    "Spend",
    "active",
    "check_budget",
    "check_fields",
    "check_tokens",
    "check_usd",
    "ledger_of",
    "over",
    "past",
    "raised",
    "reservations",
    "spend_now",
    "spend_of",
]

#: Where the ledger lives in a run's state.
SPEND_KEY = "~spend"
#: The signal that raises a run's budget (payload ``{"usd": N, "tokens": M}``).
RAISE_SIGNAL = "budget.raise"
#: The signal a reservation is recorded as.
RESERVE_SIGNAL = "~reserve"
#: What a run paused by its budget waits for (``Checkpoint.waiting_for``).
BUDGET_WAIT = f"signal {RAISE_SIGNAL}"
DIGITS = 9  # dollars are summed rounded to a billionth: the same sum on every host


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
    ``tenant``: the run also counts against that tenant's cap (``TenantCap``).
    """

    usd: float | None = None
    tokens: int | None = None
    soft: float = 0.8
    #: The tenant whose daily or monthly cap (``TenantCap``) the run also counts against.
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.usd is None and self.tokens is None and self.tenant is None:
            raise InvalidWorkflow(
                "Budget needs usd=, tokens= or both (or tenant=: its tenant's cap alone)"
            )
        if self.tenant is not None:
            try:
                check_tenant(self.tenant, "Budget")
            except ConfigError as exc:
                raise InvalidWorkflow(str(exc)) from None
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
        if self.tenant is not None:
            out["tenant"] = self.tenant
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
        return round(usd / 1_000_000, DIGITS)


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
    #: The run is saved waiting for ``budget.raise``. An agent paused between its model
    #: requests has not charged that agent run's usage yet, so its ledger alone may be
    #: under the limit; a run waiting on its budget is over it by definition.
    paused: bool = False

    def text(self) -> str:
        """One line: ``$5.5 of $5, 2100 tokens, unconfirmed $1 (1), OVER BUDGET``."""
        used = round(self.usd + self.children_usd, DIGITS)
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
        """Whether confirmed plus unconfirmed spend is at or over a hard limit, or the run
        waits for ``budget.raise`` (``runs list --over-budget``, the dashboard's badge)."""
        return self.paused or over(self) is not None

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
            "paused": self.paused,
        }


def past(spend: Spend, usd: float, tokens: int) -> str | None:
    """Why ``spend`` plus ``usd`` and ``tokens`` more would pass a hard limit, if it would.

    Reaching a limit exactly is allowed here (a reservation may use the last cent);
    ``_over`` pauses a run that has reached it.
    """
    used = round(spend.usd + spend.unconfirmed_usd + spend.children_usd + usd, DIGITS)
    if spend.limit_usd is not None and used > spend.limit_usd:
        return f"${used:g} of ${spend.limit_usd:g}"
    count = spend.tokens + spend.unconfirmed_tokens + spend.children_tokens + tokens
    if spend.limit_tokens is not None and count > spend.limit_tokens:
        return f"{count} of {spend.limit_tokens} tokens"
    return None


def over(spend: Spend) -> str | None:
    used = round(spend.usd + spend.unconfirmed_usd + spend.children_usd, DIGITS)
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


def reservations(signals: tuple[Signal, ...]) -> list[Signal]:
    return [s for s in signals if s.name == RESERVE_SIGNAL and isinstance(s.payload, dict)]


def raised(signals: tuple[Signal, ...]) -> tuple[float, int, int]:
    """Return the dollars and tokens every ``budget.raise`` added, and how many came."""
    usd, tokens, count = 0.0, 0, 0
    for s in signals:
        if s.name != RAISE_SIGNAL:
            continue
        count += 1
        payload = s.payload if isinstance(s.payload, dict) else {}
        value = payload.get("usd")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            usd = round(usd + float(value), DIGITS)
        value = payload.get("tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            tokens += value
    return usd, tokens, count


def spend_of(cp: Checkpoint, budget: Budget | None = None) -> Spend:
    """Return the spend of the run ``cp`` holds: confirmed, unconfirmed, limits.

    ``budget`` is the one declared (``Workflow(budget=)``, ``run(budget=)``), used when
    the run's ledger has none yet.
    """
    return spend_now(cp, budget, detail=True)


def spend_now(
    cp: Checkpoint, budget: Budget | None, detail: bool = False, skip: str | None = None
) -> Spend:
    """``spend_of``; without ``detail``, no copy of the per-step sums (the checks').

    ``skip``: an open reservation left out (a code workflow's, checked already when it
    was made, for the call the check is about to let through).
    """
    ledger = ledger_of(cp.state)
    declared = ledger.get("budget")
    if declared is None and budget is not None:
        declared = budget.to_json()
    done = set(ledger.get("settled", ()))
    if skip is not None:
        done.add(skip)
    unconfirmed = [dict(item) for item in ledger.get("unconfirmed", ())]
    done.update(item.get("id") for item in unconfirmed)
    for s in reservations(cp.signals):
        if s.id not in done:
            unconfirmed.append({"id": s.id, **s.payload, "open": True})
    limit_usd = limit_tokens = soft = None
    children = pooled(cp.signals)
    if isinstance(declared, dict):
        up_usd, up_tokens, _ = raised(cp.signals)
        soft = declared.get("soft")
        if declared.get("usd") is not None:
            limit_usd = round(float(declared["usd"]) + up_usd, DIGITS)
        if declared.get("tokens") is not None:
            limit_tokens = int(declared["tokens"]) + up_tokens
    return Spend(
        usd=float(ledger.get("usd", 0.0)),
        tokens=int(ledger.get("tokens", 0)),
        unconfirmed_usd=round(sum((float(u.get("usd", 0.0)) for u in unconfirmed), 0.0), DIGITS),
        unconfirmed_tokens=sum(int(u.get("tokens", 0)) for u in unconfirmed),
        limit_usd=limit_usd,
        limit_tokens=limit_tokens,
        soft=soft,
        by_step={k: dict(v) for k, v in ledger.get("by_step", {}).items()} if detail else {},
        unconfirmed=unconfirmed,
        children_usd=children[0],
        children_tokens=children[1],
        paused=cp.waiting_for == BUDGET_WAIT and cp.status == "waiting",
    )


def active(plan: Plan, cp: Checkpoint) -> bool:
    """Return whether the run has a budget or a ledger (else the hooks cost nothing)."""
    return plan.budget is not None or SPEND_KEY in cp.state
