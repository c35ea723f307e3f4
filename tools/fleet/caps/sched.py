"""The schedule workload: a minute schedule under a fast clock, its workers killed firing.

Cron has minute slots, so the workers' schedule clock runs ``SPEED`` times faster than
the host's: each worker replaces the wall clock of the two schedule modules only
(``_schedule``, ``_schedule_fire``) with ``T0 + (now - t0) * SPEED``, where ``t0`` is the
host time the parent stored the schedule at, shared through the spec. Leases, rates and
everything else keep the host's time, so a fast schedule clock does not expire leases.
The schedule (``* * * * *``, ``overlap="allow"``, ``catchup="all"``) fires a slot per
``60 / SPEED`` real seconds while workers are killed at ``schedule.advanced`` (slots
pending, none started) and ``schedule.started`` (a slot's run started, the schedule not
told). After ``duration`` seconds they are stopped, the schedule time ``end`` is taken,
and fault-free workers whose schedule clock stands at ``end`` repair what is pending.

Checked afterwards: the runs of the schedule are exactly one per minute slot in
``(T0, end]`` (none missing, none extra), every one ``done`` with its slot's input; the
schedule counts each slot fired once (``fired`` equals the slots) and none skipped, with
nothing pending; a slot's step ran again only in a worker that died or was frozen.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from stepstone import Step, StepContext, Workflow
from stepstone._cron import parse_slot, slot_id
from stepstone._schedule import schedule, schedules
from stepstone._store import Store
from stepstone._store_time import use_store_clock
from stepstone.testing import FakeClock

from .common import Ctx, Load, Verdict

__all__ = ["SchedLoad", "unexplained_reruns"]

#: Schedule seconds per host second: a minute slot each second.
SPEED = 60.0
T0 = datetime(2030, 1, 1, tzinfo=UTC)
NAME = "tick"
PREFIX = f"sched/{NAME}/"


def _tick(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    Ctx.log({"k": "tick", "run": ctx.run_id, "slot": state.get("slot"), "pid": os.getpid()})
    return {"ticked": True}


TICK = Workflow("cap-tick", [Step("tick", _tick)])


def fake_now(t0: float) -> datetime:
    """Return the schedule time of the host time now, for a campaign begun at ``t0``."""
    return T0 + timedelta(seconds=(time.time() - t0) * SPEED)


def slots_until(end: datetime) -> list[str]:
    """Return the run ids of every minute slot in ``(T0, end]``."""
    count = int((end - T0).total_seconds() // 60)
    return [PREFIX + slot_id(T0 + timedelta(minutes=m)) for m in range(1, count + 1)]


def unexplained_reruns(
    records: list[dict[str, Any]], deaths: dict[int, float], freezes: list[dict[str, Any]]
) -> list[str]:
    """Return the slot runs whose step ran again with no death or freeze to explain it.

    A step runs again only if an attempt's save was lost: its worker died, or was frozen
    past its lease (its run taken over). Every other worker's tick is saved, so a run has
    at most one tick from workers that neither died nor froze.
    """
    faulted = set(deaths) | {int(f["pid"]) for f in freezes}
    healthy = Counter(
        r["run"] for r in records if r["k"] == "tick" and int(r["pid"]) not in faulted
    )
    return sorted(run for run, n in healthy.items() if n > 1)


class SchedLoad(Load):
    """A minute schedule fired by workers killed between its writes."""

    name = "sched"
    points = ("schedule.advanced", "schedule.started")
    concurrency = 2

    def workflows(self) -> list[Workflow]:
        return [TICK]

    def setup(self, store: Store, size: int) -> dict[str, Any]:
        with FakeClock(T0):
            schedule(store, NAME, cron="* * * * *", workflow=TICK, overlap="allow", catchup="all")
        self.duration = size * 60 / SPEED
        return {"t0": time.time()}

    def prepare(self, spec: dict[str, Any]) -> Callable[[str], None] | None:
        frozen = spec.get("frozen")
        t0 = float(spec["meta"]["t0"])
        if frozen is not None:
            at = parse_slot(frozen)

            def clock() -> datetime:
                return at
        else:

            def clock() -> datetime:
                return fake_now(t0)

        # Schedules fire on the store's clock (``_store_time``: one clock per store): here
        # it is the workload's fast clock, while leases keep the real one.
        use_store_clock(clock)
        return None

    def drain(self, meta: dict[str, Any]) -> dict[str, Any]:
        meta["end"] = slot_id(fake_now(float(meta["t0"])))
        return {"frozen": meta["end"]}

    def done(self, store: Store, meta: dict[str, Any]) -> bool:
        if "end" not in meta:
            return False
        info = schedules(store)[0]
        if info.pending:
            return False
        for run_id in slots_until(parse_slot(meta["end"])):
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
        want = slots_until(parse_slot(meta["end"]))
        have = sorted(r for r in store.list_runs() if r.startswith(PREFIX))
        v.expect(have == want, f"slot runs {have} are not the slots {want}")
        for run_id in want:
            cp = store.load(run_id)
            slot = run_id[len(PREFIX) :]
            state = cp.state if cp is not None and cp.status == "done" else {}
            ok = state.get("ticked") is True and state.get("slot") == slot
            v.expect(ok, f"{run_id} did not run its slot")
        info = schedules(store)[0]
        v.expect(info.fired == len(want), f"fired {info.fired} for {len(want)} slots")
        v.expect(info.skipped == 0, f"{info.skipped} slots skipped under catchup='all'")
        v.expect(info.pending == (), f"left pending: {info.pending}")
        ticks = Counter(r["run"] for r in records if r["k"] == "tick")
        again = sum(n - 1 for n in ticks.values())
        twice = unexplained_reruns(records, deaths, meta.get("freezes", []))
        v.expect(not twice, f"slot steps ran again with no death or freeze: {twice}")
        v.figures.update(slots=len(want), reruns=again)
        return v
