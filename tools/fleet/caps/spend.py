"""The budget workload: reserving, charging runs and their ``Map`` children, killed between.

Each run is ``s0`` (reserve $1, charge ``PRICES["s0"]``), a ``Map`` over ``KIDS``
children whose one step ``k0`` does the same (charges pooled into the root's budget),
then ``s2``; the workflow has a budget far above what it spends, so it never pauses.
Every attempt draws a token ``x``: its charge's ref is ``run/step/x``, and the workers'
hook logs ``reserved`` at ``budget.reserved`` and ``pooled`` at ``budget.pooled`` with
the attempt's run, step and token before the kill plan may act. Workers drive one run
at a time, so a death at a point is the death of the attempt that logged there.

Checked afterwards, for every run and child: it is ``done``; its confirmed total is the
sum of its steps' prices, from exactly one ref per step, made by an attempt that
reserved; its unconfirmed reservations are, per step, the attempts that reserved and
did not commit (each $1, none counted twice); a root's ``children_usd`` is ``KID``
times the distinct child attempts that reached the pool.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

from stepstone import Budget, Map, Step, StepContext, Workflow, spend_of, start
from stepstone._budget import SPEND_KEY
from stepstone._store import Store

from .common import Ctx, Load, Verdict

__all__ = ["SpendLoad"]

PRICES = {"s0": 0.25, "s2": 0.5}
KID = 0.125
KIDS = 2
RESERVE = 1.0


class _Now:
    """The attempt in flight: one per process, since spend workers drive one run at a time.

    A global, not a thread-local: under ``aserve`` the step runs in a thread and the
    pool charge in the event loop's.
    """

    cur: ClassVar[dict[str, str]] = {}


def _charged(name: str, price: float) -> Callable[[dict[str, Any], StepContext], Any]:
    def step(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        _Now.cur = {"run": ctx.run_id, "step": name, "x": uuid.uuid4().hex}
        ctx.reserve(usd=RESERVE)  # the hook logs "reserved" once it is saved
        time.sleep(0.02)  # the (pretend) model call
        ctx.charge(usd=price, ref="/".join(_Now.cur[k] for k in ("run", "step", "x")))
        return {name: True}

    return step


KID_FLOW = Workflow("cap-spend-kid", [Step("k0", _charged("k0", KID))])
SPEND = Workflow(
    "cap-spend",
    [
        Step("s0", _charged("s0", PRICES["s0"])),
        Map("kids", KID_FLOW, lambda state: [{"kid": k} for k in range(KIDS)]),
        Step("s2", _charged("s2", PRICES["s2"])),
    ],
    budget=Budget(usd=10_000),
)


def _ledger_check(
    v: Verdict, run_id: str, cp: Any, prices: dict[str, float], reserved: dict[Any, set[str]]
) -> int:
    """Check one run's own ledger; return its unconfirmed reservations."""
    spend = spend_of(cp)
    want = round(sum(prices.values()), 6)
    v.expect(round(spend.usd, 6) == want, f"{run_id}: confirmed ${spend.usd}, not ${want}")
    refs = cp.state.get(SPEND_KEY, {}).get("refs", {})
    per_step = Counter(step for step in refs.values())
    v.expect(per_step == Counter(prices.keys()), f"{run_id}: refs {sorted(refs)} not one per step")
    for ref in refs:
        _, step, x = ref.rsplit("/", 2)
        v.expect(x in reserved[(run_id, step)], f"{run_id}: {ref} committed without reserving")
    unconfirmed = Counter(u["step"] for u in spend.unconfirmed)
    died = Counter({s: len(reserved[(run_id, s)]) - 1 for s in prices})
    v.expect(+unconfirmed == +died, f"{run_id}: unconfirmed {unconfirmed}, died {died}")
    ids = [u["id"] for u in spend.unconfirmed]
    v.expect(len(ids) == len(set(ids)), f"{run_id}: a reservation counted twice")
    total = round(RESERVE * len(ids), 6)
    v.expect(round(spend.unconfirmed_usd, 6) == total, f"{run_id}: unconfirmed usd off")
    return len(ids)


class SpendLoad(Load):
    """Budgeted runs and pooled children, killed between reserving, pooling and saving."""

    name = "spend"
    points = ("budget.reserved", "budget.pooled", "runner.after_step", "runner.after_save")
    concurrency = 1

    def workflows(self) -> list[Workflow]:
        return [SPEND]

    def setup(self, store: Store, size: int) -> dict[str, Any]:
        ids = [f"spend-{n}" for n in range(size)]
        for run_id in ids:
            start(store, SPEND, run_id, {})
        return {"runs": ids}

    def prepare(self, spec: dict[str, Any]) -> Callable[[str], None] | None:
        def hook(point: str) -> None:
            if point in ("budget.reserved", "budget.pooled"):
                Ctx.log({"k": point.split(".")[1], **_Now.cur})

        return hook

    def done(self, store: Store, meta: dict[str, Any]) -> bool:
        for run_id in meta["runs"]:
            cp = store.load(run_id)
            if cp is None or cp.status != "done":
                return False
        return True

    def check(
        self,
        store: Store,
        meta: dict[str, Any],
        records: list[dict[str, Any]],
        deaths: dict[int, float],
    ) -> Verdict:
        v = Verdict()
        reserved: dict[Any, set[str]] = {}
        pooled: dict[str, set[str]] = {}
        for r in records:
            if r["k"] == "reserved":
                reserved.setdefault((r["run"], r["step"]), set()).add(r["x"])
            elif r["k"] == "pooled":
                pooled.setdefault(r["run"], set()).add(r["x"])
        reserved_of: Any = _Default(reserved)
        unconfirmed = charged = 0
        for run_id in meta["runs"]:
            cp = store.load(run_id)
            if cp is None or cp.status != "done":
                v.expect(False, f"{run_id} unfinished")
                continue
            unconfirmed += _ledger_check(v, run_id, cp, PRICES, reserved_of)
            kids_pooled = 0
            children = [f"{run_id}/kids/{k}" for k in range(KIDS)]  # the Map's names
            v.expect(sorted(cp.children or children) == children, f"{run_id}: children?")
            for child in children:
                kid = store.load(child)
                v.expect(kid is not None and kid.status == "done", f"{child} unfinished")
                if kid is not None:
                    unconfirmed += _ledger_check(v, child, kid, {"k0": KID}, reserved_of)
                kids_pooled += len(pooled.get(child, ()))
            want = round(KID * kids_pooled, 6)
            got = round(spend_of(cp).children_usd, 6)
            v.expect(got == want, f"{run_id}: pool holds ${got}, children pooled ${want}")
            charged += 1
        v.figures.update(runs=charged, unconfirmed=unconfirmed)
        return v


class _Default(dict[Any, set[str]]):
    def __missing__(self, key: Any) -> set[str]:
        return set()
