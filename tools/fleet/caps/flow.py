"""The flow-control workload: runs through a concurrency-2 key and a rate-limited key.

Each run holds ``fleet-slots`` (at most ``SLOTS`` holders) for its step ``hold``, then
``fleet-rate`` (``RATE`` requests per ``PER`` seconds) for its step ``call``. ``hold``
logs its start and end; ``call`` logs when its key was taken (the wall time at
``flow.acquired``, which fires right after the acquisition's write landed). Workers run
several runs each, so more steps want the slot than it allows, and runs park waiting.

Checked afterwards: at no instant were more than ``SLOTS`` ``hold`` bodies running
(a killed process's bodies end at its death); over any interval of the ``call``
acquisitions, no more than the GCRA bound ``RATE + RATE * length / PER`` (the
acquisition's decision is at most ``SLACK`` seconds before its logged time); no live
holder and no waiter is left on either key once every run is done; every run ended
``done`` with both steps' results.

Frozen workers (SIGSTOP past their lease, then SIGCONT: ``meta["freezes"]``): a hold
whose run another worker took over while it was frozen counts until the freeze began,
since after its lease lapsed its slot was reclaimed and what its body does on thawing is
fenced off (a lease cannot stop a paused process's own side effects, only their writes);
a hold not taken over counts to its end. An acquisition logged by a frozen worker from
the freeze to ``SLACK`` after the thaw may have been decided before the freeze: it is
left out of the rate check (counted in ``thawed``).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from stepstone import Limit, Step, Workflow, limit_usage, start
from stepstone._store import Store

from .common import Ctx, Load, Verdict

__all__ = ["FlowLoad"]

SLOTS = 2
RATE = 4
PER = 1.0
#: Seconds between an acquisition's decision and its ``flow.acquired`` (a write's round
#: trip on a loaded machine): the rate check allows for it.
SLACK = 0.5
SLOT_KEY = Limit("fleet-slots", concurrency=SLOTS)
RATE_KEY = Limit("fleet-rate", requests=RATE, per=PER)
#: When this run's last key was taken: set at ``flow.acquired`` in the run's context (a
#: thread under ``serve``, a task under ``aserve``, whose steps' threads copy it).
_acquired: ContextVar[float | None] = ContextVar("acquired", default=None)


def _hold(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
    mark = {"run": ctx.run_id, "x": uuid.uuid4().hex, "pid": _pid()}
    Ctx.log({"k": "hold+", "t": time.time(), **mark})
    time.sleep(random.uniform(0.05, 0.15))
    Ctx.log({"k": "hold-", "t": time.time(), **mark})
    return {"hold": True}


def _call(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
    taken = _acquired.get()
    Ctx.log({"k": "rate", "t": taken, "run": ctx.run_id, "pid": _pid()})
    return {"call": True}


def _pid() -> int:
    return os.getpid()


FLOW = Workflow(
    "cap-flow",
    [Step("hold", _hold, limits=[SLOT_KEY]), Step("call", _call, limits=[RATE_KEY])],
)


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = now = 0
    for _, delta in events:  # at equal times an end (-1) sorts before a start
        now += delta
        most = max(most, now)
    return most


def _rate_excess(times: list[float]) -> tuple[int, float]:
    """Return the most acquisitions in one interval beyond the bound, and the interval."""
    times = sorted(times)
    worst, span = 0, 0.0
    for i in range(len(times)):
        for j in range(i, len(times)):
            length = times[j] - times[i]
            allowed = RATE + RATE * (length + SLACK) / PER
            if j - i + 1 - allowed > worst:
                worst, span = int(j - i + 1 - allowed + 0.999), length
    return worst, span


class FlowLoad(Load):
    """Runs through a keyed-concurrency limit and a rate limit, killed at both flow points."""

    name = "flow"
    points = ("flow.acquired", "flow.released")
    concurrency = 3

    def workflows(self) -> list[Workflow]:
        return [FLOW]

    def setup(self, store: Store, size: int) -> dict[str, Any]:
        ids = [f"flow-{n}" for n in range(size)]
        for n, run_id in enumerate(ids):
            start(store, FLOW, run_id, {"n": n})
        return {"runs": ids}

    def prepare(self, spec: dict[str, Any]) -> Callable[[str], None] | None:
        def hook(point: str) -> None:
            if point == "flow.acquired":
                _acquired.set(time.time())

        return hook

    def done(self, store: Store, meta: dict[str, Any]) -> bool:
        return all(_status(store, r) == "done" for r in meta["runs"])

    def check(
        self,
        store: Store,
        meta: dict[str, Any],
        records: list[dict[str, Any]],
        deaths: dict[int, float],
    ) -> Verdict:
        v = Verdict()
        for run_id in meta["runs"]:
            cp = store.load(run_id)
            state = cp.state if cp is not None and cp.status == "done" else {}
            v.expect(bool(state.get("hold") and state.get("call")), f"{run_id} unfinished")
        starts = {r["x"]: r for r in records if r["k"] == "hold+"}
        ends = {r["x"]: r["t"] for r in records if r["k"] == "hold-"}
        freezes = meta.get("freezes", [])
        intervals = []
        for x, r in starts.items():
            end = ends.get(x, deaths.get(r["pid"]))
            v.expect(end is not None, f"a hold of {r['run']} neither ended nor died")
            end = _fenced(r, end if end is not None else float("inf"), freezes, starts)
            intervals.append((r["t"], end))
        most = _max_overlap(intervals)
        v.expect(most <= SLOTS, f"{most} holds ran at once on a key of {SLOTS}")
        rates = [r for r in records if r["k"] == "rate"]
        unseen = sum(r["t"] is None for r in rates)
        v.expect(unseen == 0, f"{unseen} rate steps ran without a flow.acquired seen")
        thawed = [r for r in rates if r["t"] is not None and _thawing(r, freezes)]
        times = [r["t"] for r in rates if r["t"] is not None and r not in thawed]
        excess, span = _rate_excess(times)
        v.expect(excess <= 0, f"{excess} acquisitions over the rate in {span:.2f}s")
        leaked = lapsed = 0
        for key in (SLOT_KEY.key, RATE_KEY.key):
            usage = limit_usage(store, key)
            v.expect(usage is not None, f"{key}: no limit record")
            if usage is not None:
                leaked += len(usage.holders)
                lapsed += len(usage.lapsed)  # dead holders' entries, ignored by every decision
                v.expect(not usage.holders, f"{key}: slots leaked: {usage.holders}")
                v.expect(not usage.waiters, f"{key}: waiters left: {usage.waiters}")
        v.figures.update(
            holds=len(starts),
            most_holders=most,
            acquisitions=len(times),
            leaked=leaked,
            lapsed=lapsed,
            thawed=len(thawed),
        )
        return v


def _fenced(
    hold: dict[str, Any], end: float, freezes: list[dict[str, Any]], starts: dict[str, Any]
) -> float:
    """When ``hold`` stopped counting: at a freeze of its worker if its run was taken over."""
    for freeze in freezes:
        if freeze["pid"] != hold["pid"] or not hold["t"] <= freeze["t0"] <= end:
            continue
        taken = any(
            other["run"] == hold["run"]
            and other["pid"] != hold["pid"]
            and other["t"] > freeze["t0"]
            for other in starts.values()
        )
        if taken:
            return float(freeze["t0"])
    return end


def _thawing(record: dict[str, Any], freezes: list[dict[str, Any]]) -> bool:
    """Whether ``record`` was logged by a frozen worker between its freeze and thaw + SLACK."""
    return any(
        f["pid"] == record["pid"] and f["t0"] <= record["t"] <= f["t1"] + SLACK for f in freezes
    )


def _status(store: Store, run_id: str) -> str | None:
    cp = store.load(run_id)
    return None if cp is None else cp.status
