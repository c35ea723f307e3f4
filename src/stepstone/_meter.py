"""The meter behind ``ctx.charge`` and ``ctx.reserve``: one attempt of one step.

Charges wait here until the step returns; the core then adds them to the ledger in the
save of the step's result (``_spending.settle``), so they commit with it or not at all.
A reservation is written at once, as a signal of the run (``_budget``'s docstring says
why a signal), fenced by the run's lease: refused if another owner or epoch holds it,
or if it would pass the run's limit, its tree's pool's (``_pool``) or its tenant's cap
(``_tenant``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from . import _hooks, _tenant
from ._budget import (
    RESERVE_SIGNAL,
    BudgetExhausted,
    check_fields,
    check_tokens,
    check_usd,
    ledger_of,
    past,
    spend_of,
)
from ._checkpoint import Checkpoint, Signal, evolve, utcnow
from ._errors import ConflictError, InvalidCharge, LeaseLost
from ._observe import logger
from ._pool import pool_id
from ._spending import pool_refusal
from ._tenant import tenant_of

if TYPE_CHECKING:
    from ._plan import Plan
    from ._store import Store

__all__ = ["Meter", "current_store"]

#: The store the run being driven lives in: set by the drivers, read by ``reserve``.
current_store: ContextVar[Store | None] = ContextVar("stepstone_budget_store", default=None)
_MAX_TRIES = 50
_NO_LOCK = contextlib.nullcontext()


class Meter:
    """The charges and reservations of one attempt of one step (behind ``ctx.charge``).

    Charges are held here until the step returns; the core then adds them to the ledger
    in the save of the step's result (``settle``). Reservations are written at once.
    """

    __slots__ = (
        "attempt",
        "base",
        "budget",
        "charges",
        "closed",
        "plan",
        "refs",
        "reserved",
        "run_id",
        "settled_usd",
        "step",
    )

    def __init__(self, plan: Plan, cp: Checkpoint, step: str, attempt: int) -> None:
        self.run_id = plan.run_id
        self.plan = plan
        self.step = step
        #: The attempt as the ledger names it: the lease's epoch, then the attempt in it.
        self.attempt = f"{cp.epoch}.{attempt}"
        self.base = cp
        self.budget = plan.budget
        self.charges: list[dict[str, Any]] = []
        self.refs: set[str] = set()
        self.reserved: list[dict[str, Any]] = []
        self.closed = False
        self.settled_usd = 0.0

    def charge(self, usd: object, tokens: object, ref: object, unknown: Mapping[str, Any]) -> bool:
        what = f"ctx.charge() in step {self.step!r}"
        check_fields(unknown, what)
        amount = check_usd(usd, what)
        count = check_tokens(tokens, what)
        if ref is not None and (not isinstance(ref, str) or not ref or len(ref) > 500):
            raise InvalidCharge(f"{what}: ref must be a str of 1-500 characters, got {ref!r}")
        if self.closed:
            raise InvalidCharge(
                f"{what}: the step has returned; charge inside the step, before it returns"
            )
        if ref is not None:
            if ref in self.refs or ref in ledger_of(self.base.state).get("refs", {}):
                logger.info("run %r: charge %r already recorded, not counted", self.run_id, ref)
                return False
            self.refs.add(ref)
        self.charges.append({"usd": amount, "tokens": count, "ref": ref})
        return True

    def _reservation(self, usd: object, tokens: object, unknown: Mapping[str, Any]) -> Signal:
        what = f"ctx.reserve() in step {self.step!r}"
        check_fields(unknown, what)
        payload = {
            "step": self.step,
            "attempt": self.attempt,
            "usd": check_usd(usd, what),
            "tokens": check_tokens(tokens, what),
        }
        if self.closed:
            raise InvalidCharge(f"{what}: the step has returned; reserve inside the step")
        # What this attempt would have spent with the estimate: the ledger's spend,
        # plus its own reservations and charges (not saved yet), plus the estimate.
        mine = [*self.reserved, *self.charges, payload]
        reason = past(
            spend_of(self.base, self.budget),
            sum(float(item["usd"]) for item in mine),
            sum(int(item["tokens"]) for item in mine),
        )
        if reason is not None:
            raise BudgetExhausted(f"reserving would pass the budget: {reason}")
        return Signal(RESERVE_SIGNAL, os.urandom(12).hex(), payload, utcnow())

    def _fenced(self, cp: Checkpoint | None, reservation: Signal) -> Checkpoint:
        if cp is None:
            raise LeaseLost(f"run {self.run_id!r} was deleted in step {self.step!r}", self.run_id)
        if cp.owner != self.base.owner or cp.epoch != self.base.epoch:
            raise LeaseLost(
                f"run {self.run_id!r}: lease lost before ctx.reserve() in step {self.step!r} "
                f"(now held by {cp.owner!r} at epoch {cp.epoch}); nothing was reserved",
                self.run_id,
            )
        return evolve(cp, signals=(*cp.signals, reservation))

    def _pooled(
        self, root: tuple[str, Checkpoint | None] | None, tenant: Checkpoint | None, ask: Signal
    ) -> None:
        """Refuse the reservation ``ask`` if it would pass the limit of the run's tree's
        pool (``root``: its id and record) or its tenant's cap (``tenant``: the record)."""
        # Not in the pool nor the tenant's window yet: this attempt's reservations and
        # charges (pushed with its save), and the estimate.
        mine = [*self.reserved, *self.charges, ask.payload]
        usd = sum(float(item["usd"]) for item in mine)
        tokens = sum(int(item["tokens"]) for item in mine)
        reason = None if root is None else pool_refusal(root[0], root[1], usd, tokens)
        name = tenant_of(self.base)
        if reason is None and name is not None:
            reason = _tenant.refusal(name, tenant, usd, tokens)
        if reason is not None:
            raise BudgetExhausted(f"reserving would pass the budget: {reason}")

    def reserve(self, usd: object, tokens: object, unknown: Mapping[str, Any]) -> str:
        reservation = self._reservation(usd, tokens, unknown)
        store = _store(self.run_id)
        root_id, name = pool_id(self.base), tenant_of(self.base)
        self._pooled(
            None if root_id is None else (root_id, store.load(root_id)),
            None if name is None else store.load(_tenant.PREFIX + name),
            reservation,
        )
        ticket = getattr(self.plan.renewal, "lock", None)
        for _ in range(_MAX_TRIES):
            # Under the sync driver's renewal lock: no renewal lands between our load
            # and our save, so what the run holds (``Plan.current``) can be ours after.
            with ticket if ticket is not None else _NO_LOCK:
                loaded = store.load(self.run_id)
                try:
                    saved = store.save(self._fenced(loaded, reservation))
                except LeaseLost:
                    raise
                except ConflictError:
                    continue  # a renewal or a signal landed meanwhile: on the newest version
                self._adopt(loaded, saved)
            return self._reserved(reservation)
        raise ConflictError(f"run {self.run_id!r}: ctx.reserve() lost {_MAX_TRIES} races")

    async def areserve(self, usd: object, tokens: object, unknown: Mapping[str, Any]) -> str:
        reservation = self._reservation(usd, tokens, unknown)
        store = _store(self.run_id)
        root_id, name = pool_id(self.base), tenant_of(self.base)
        self._pooled(
            None if root_id is None else (root_id, await store.aload(root_id)),
            None if name is None else await store.aload(_tenant.PREFIX + name),
            reservation,
        )
        for _ in range(_MAX_TRIES):
            loaded = await store.aload(self.run_id)
            try:
                saved = await store.asave(self._fenced(loaded, reservation))
            except LeaseLost:
                raise
            except ConflictError:
                continue
            self._adopt(loaded, saved)
            return self._reserved(reservation)
        raise ConflictError(f"run {self.run_id!r}: ctx.reserve() lost {_MAX_TRIES} races")

    def _adopt(self, loaded: Checkpoint | None, saved: Checkpoint) -> None:
        """Make our save what the run holds, if nothing of the owner's came between.

        Then the step's own save builds on it at once, and an interrupted run gives
        its lease back from it; otherwise they re-base on it, as on any signal.
        """
        current = self.plan.current
        if current is not None and loaded is not None and current.version == loaded.version:
            self.plan.current = saved

    def _reserved(self, reservation: Signal) -> str:
        self.reserved.append({"id": reservation.id, **reservation.payload})
        logger.debug("run %r: reserved %s", self.run_id, reservation.payload)
        # Saved, the call not yet made: the crash tests kill the process here.
        _hooks.fire("budget.reserved")
        return reservation.id


def _store(run_id: str) -> Store:
    store = current_store.get()
    if store is None:
        raise InvalidCharge(
            f"run {run_id!r}: ctx.reserve() is only possible inside a step that "
            "stepstone.run, arun or a worker is running"
        )
    return store
