"""Tenant-wide spend caps: a daily or monthly cap shared by every run of one tenant.

A run whose budget names a tenant (``Budget(usd=5, tenant="acme")``; the children of a
budgeted tree inherit it) adds every charge it commits to the tenant's record, the
checkpoint ``~tenant-budget/<tenant>``, and before each of its steps (and each
reservation) reads it: at or over the tenant's cap for the current window (a UTC day
or month), the run is saved waiting for ``budget.raise`` and looks again every
``POOL_POLL`` seconds, so a new day, a higher cap (``set_tenant_cap``) or a raise of its
own resumes it. The record is a finished run (``total_steps=0``) that no worker claims::

    {"cap": {"usd": 100.0, "tokens": null, "period": "day"},
     "window": "2026-12-06", "usd": 12.5, "tokens": 40000,
     "ids": ["run-7#2#3.1", ...]}               # the latest pushes counted (MAX_IDS)

A push is one compare-and-swap with an id per run, step and attempt (a repeated one is a
no-op), made before the run's own save, as a tree's pool is charged (``_pool``): the
tenant's total never misses a committed charge; an attempt that dies between its push
and its save stays counted (the cap errs on the side of spending less). A new window
starts from zero. The cap is the record's, so it changes at run time for every run.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import _clock, _hooks
from ._checkpoint import Checkpoint, evolve
from ._effects import Effect, Load, Save
from ._errors import ConfigError, ConflictError

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "MAX_IDS",
    "PERIODS",
    "PREFIX",
    "TenantCap",
    "TenantSpend",
    "aset_tenant_cap",
    "atenant_spend",
    "check_tenant",
    "push",
    "refusal",
    "set_tenant_cap",
    "tenant_of",
    "tenant_spend",
]

#: Where a tenant's record lives: ``~tenant-budget/<tenant>``.
PREFIX = "~tenant-budget/"
#: The windows a cap may count over (UTC).
PERIODS = ("day", "month")
_SPEND_KEY = "~spend"  # ``_budget.SPEND_KEY``; not imported: ``_budget`` imports this
_MAX_TRIES = 20
#: The most recent push ids a record keeps: a push is repeated only right after itself
#: (a save whose answer was lost, retried), so the record stays small however many
#: charges a window counts.
MAX_IDS = 1000
_DIGITS = 9


def check_tenant(tenant: object, what: str) -> str:
    """Return ``tenant`` if it is a name of 1-200 characters, else raise ``ConfigError``."""
    if not isinstance(tenant, str) or not tenant or len(tenant) > 200 or "/" in tenant:
        raise ConfigError(
            f"{what}: tenant must be a name of 1-200 characters without '/', got {tenant!r}"
        )
    return tenant


@dataclass(frozen=True, slots=True)
class TenantCap:
    """A tenant's cap on what all its runs spend per UTC ``period`` ("day" or "month").

    Dollars, tokens or both (``None``: no cap on that one). Stored with
    ``set_tenant_cap``; runs name their tenant with ``Budget(..., tenant=...)``.
    """

    tenant: str
    usd: float | None = None
    tokens: int | None = None
    period: str = "day"

    def __post_init__(self) -> None:
        check_tenant(self.tenant, "TenantCap")
        if self.usd is None and self.tokens is None:
            raise ConfigError("TenantCap needs usd=, tokens= or both")
        usd = self.usd
        if usd is not None and (
            isinstance(usd, bool)
            or not isinstance(usd, (int, float))
            or not math.isfinite(usd)
            or usd < 0
        ):
            raise ConfigError(f"TenantCap: usd must be a finite number >= 0, got {usd!r}")
        tokens = self.tokens
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0
        ):
            raise ConfigError(f"TenantCap: tokens must be an int >= 0, got {tokens!r}")
        if self.period not in PERIODS:
            raise ConfigError(f"TenantCap: period must be 'day' or 'month', got {self.period!r}")

    def to_json(self) -> dict[str, Any]:
        usd = None if self.usd is None else float(self.usd)
        return {"usd": usd, "tokens": self.tokens, "period": self.period}


@dataclass(frozen=True, slots=True)
class TenantSpend:
    """What a tenant's runs spent in the current window, and its cap (None: none set)."""

    tenant: str
    window: str
    usd: float
    tokens: int
    cap: TenantCap | None

    @property
    def over(self) -> bool:
        """Whether the window's spend is at or over the cap."""
        return self.cap is not None and _over(self.cap, self.usd, self.tokens, 0.0, 0) is not None


def _window(period: str, now: datetime) -> str:
    return now.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")


def _cap(tenant: str, state: Mapping[str, Any]) -> TenantCap | None:
    cap = state.get("cap")
    if not isinstance(cap, dict):
        return None
    return TenantCap(tenant, cap.get("usd"), cap.get("tokens"), str(cap.get("period", "day")))


def _spent(state: Mapping[str, Any], now: datetime) -> tuple[str, float, int, list[str]]:
    """The current window, and what was counted in it (nothing if the record's is older)."""
    cap = state.get("cap")
    period = cap.get("period", "day") if isinstance(cap, dict) else "day"
    window = _window(str(period), now)
    if state.get("window") != window:
        return window, 0.0, 0, []
    return window, float(state.get("usd", 0.0)), int(state.get("tokens", 0)), list(state["ids"])


def _over(cap: TenantCap, usd: float, tokens: int, more_usd: float, more: int) -> str | None:
    """Why ``usd`` and ``tokens`` spent plus ``more`` reach (or, with more, pass) the cap."""
    strict = bool(more_usd or more)  # a reservation may use the last cent
    used = round(usd + more_usd, _DIGITS)
    if cap.usd is not None and (used > cap.usd if strict else used >= cap.usd):
        return f"tenant {cap.tenant!r} spent ${used:g} of its {_per(cap)} ${cap.usd:g}"
    count = tokens + more
    if cap.tokens is not None and (count > cap.tokens if strict else count >= cap.tokens):
        return f"tenant {cap.tenant!r} spent {count} of its {_per(cap)} {cap.tokens} tokens"
    return None


def _per(cap: TenantCap) -> str:
    return "daily" if cap.period == "day" else "monthly"


def tenant_of(cp: Checkpoint) -> str | None:
    """The tenant whose cap the run counts against (its budget's, or its tree's)."""
    ledger = cp.state.get(_SPEND_KEY)
    if not isinstance(ledger, dict):
        return None
    budget = ledger.get("budget")
    tenant = budget.get("tenant") if isinstance(budget, dict) else None
    tenant = tenant or ledger.get("tenant")
    return tenant if isinstance(tenant, str) else None


def refusal(
    tenant: str, record: Checkpoint | None, usd: float = 0.0, tokens: int = 0
) -> str | None:
    """Why the tenant's cap refuses: at or over it, or (``usd``/``tokens`` more) past it."""
    if record is None:
        return None
    cap = _cap(tenant, record.state)
    if cap is None:
        return None
    _, spent_usd, spent_tokens, _ = _spent(record.state, _clock.now())
    return _over(cap, spent_usd, spent_tokens, usd, tokens)


def _record(tenant: str, state: dict[str, Any]) -> Checkpoint:
    # total_steps=0: the record reads as a finished run, so no worker ever claims it.
    return Checkpoint(run_id=PREFIX + tenant, step=-1, total_steps=0, state=state)


def push(tenant: str, push_id: str, usd: float, tokens: int) -> Generator[Effect, Any, None]:
    """Add a run's committed charges to its tenant's window, once per ``push_id``."""
    if not usd and not tokens:
        return
    for _ in range(_MAX_TRIES):
        cp: Checkpoint | None = yield Load(PREFIX + tenant)
        state = {} if cp is None else dict(cp.state)
        window, spent_usd, spent_tokens, ids = _spent(state, _clock.now())
        if push_id in ids:
            return  # counted already
        state.update(
            window=window,
            usd=round(spent_usd + usd, _DIGITS),
            tokens=spent_tokens + tokens,
            ids=[*ids, push_id][-MAX_IDS:],
        )
        new = _record(tenant, state) if cp is None else evolve(cp, state=state)
        try:
            yield Save(new, f"tenant {tenant} charge", owned=False)
        except ConflictError:
            continue
        _hooks.fire("budget.tenant")  # counted, the run's save not made: a kill point
        return
    raise ConflictError(f"tenant {tenant!r}: too many writers while its spend was counted")


def _write_cap(cap: TenantCap) -> Generator[Effect, Any, TenantCap]:
    for _ in range(_MAX_TRIES):
        cp: Checkpoint | None = yield Load(PREFIX + cap.tenant)
        state = {} if cp is None else dict(cp.state)
        state["cap"] = cap.to_json()
        new = _record(cap.tenant, state) if cp is None else evolve(cp, state=state)
        try:
            yield Save(new, f"tenant {cap.tenant} cap", owned=False)
        except ConflictError:
            continue
        return cap
    raise ConflictError(f"tenant {cap.tenant!r}: too many writers while its cap was set")


def _checked(cap: object) -> TenantCap:
    if not isinstance(cap, TenantCap):
        raise ConfigError(f"set_tenant_cap: cap must be a stepstone.TenantCap, got {cap!r}")
    return cap


def _spend(tenant: str, cp: Checkpoint | None) -> TenantSpend:
    state = {} if cp is None else cp.state
    window, usd, tokens, _ = _spent(state, _clock.now())
    return TenantSpend(tenant, window, usd, tokens, _cap(tenant, state))


def set_tenant_cap(store: Store, cap: TenantCap) -> TenantCap:
    """Store ``cap`` (what the tenant's runs spent in the window is kept).

    Runs paused by the old cap look again within a minute.

    Raises:
        ConfigError: ``cap`` is not a ``TenantCap``.
    """
    from ._flow._api import drive  # noqa: PLC0415 - the one driver of effect generators

    saved: TenantCap = drive(store, _write_cap(_checked(cap)))
    return saved


async def aset_tenant_cap(store: Store, cap: TenantCap) -> TenantCap:
    """``set_tenant_cap`` for async callers."""
    from ._flow._api import adrive  # noqa: PLC0415 - the one driver of effect generators

    saved: TenantCap = await adrive(store, _write_cap(_checked(cap)))
    return saved


def tenant_spend(store: Store, tenant: str) -> TenantSpend:
    """Return what ``tenant``'s runs spent in the current window, and its cap."""
    tenant = check_tenant(tenant, "tenant_spend")
    return _spend(tenant, store.load(PREFIX + tenant))


async def atenant_spend(store: Store, tenant: str) -> TenantSpend:
    """``tenant_spend`` for async callers."""
    tenant = check_tenant(tenant, "tenant_spend")
    return _spend(tenant, await store.aload(PREFIX + tenant))
