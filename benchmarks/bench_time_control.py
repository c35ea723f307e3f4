"""What time control costs (issue 33): a timed step, a run with a deadline, firing a slot.

    .venv/bin/python benchmarks/bench_time_control.py [--quick]

Prints, per backend (memory, SQLite):

- a 10-step run: plain steps; the same with ``timeout=`` on every step (each attempt
  in a thread of its own); the same under ``Workflow(deadline=)`` (one extra write at
  the first claim, and every step given the time left);
- a code workflow of 10 ``ctx.step`` calls: plain, and under a deadline (each call
  then runs in a thread of its own, given at most the time left, and the deadline is
  checked before each);
- firing schedules: microseconds per slot fired, for a minute schedule looked at once
  per fake minute (advance the record, start the slot's run, record it: two saves of
  the schedules' record and one start), with the fake clock.

Median of the repeats; nothing asserted. Stores under ``benchmarks/.tmp/``.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import stepstone
from stepstone import Step, Workflow, open_store, run
from stepstone._control import _sync
from stepstone._schedule_fire import fire_due
from stepstone.testing import FakeClock

TMP = Path(__file__).resolve().parent / ".tmp" / f"time-{uuid.uuid4().hex[:8]}"


def _steps(**options: Any) -> list[Step]:
    return [Step(f"s{i}", lambda s, i=i: {f"k{i}": i}, **options) for i in range(10)]


def _per_step(config: str, flow: Any, runs: int) -> float:
    """Return the median microseconds per step of ``runs`` 10-step runs."""
    samples = []
    with open_store(config) as store:
        for n in range(runs):
            began = time.perf_counter()
            run(f"b-{n}-{uuid.uuid4().hex[:6]}", flow, store)
            samples.append((time.perf_counter() - began) / 10 * 1e6)
    return statistics.median(samples)


@stepstone.workflow("calls")
def _calls(ctx: Any, data: dict[str, Any]) -> int:
    return sum(int(ctx.step("c", int, i)) for i in range(10))


def _per_call(config: str, deadline: float | None, runs: int) -> float:
    """Return the median microseconds per ``ctx.step`` of ``runs`` 10-call code workflows."""
    samples = []
    with open_store(config) as store:
        for n in range(runs):
            run_id = f"c-{n}-{uuid.uuid4().hex[:6]}"
            began = time.perf_counter()
            stepstone.start(store, _calls, run_id, deadline=deadline)
            run(run_id, _calls, store)
            samples.append((time.perf_counter() - began) / 10 * 1e6)
    return statistics.median(samples)


def _per_slot(config: str, slots: int) -> float:
    """Return the microseconds per slot fired by looks once per fake minute."""
    flow = Workflow("tick", [Step("s", lambda s: {})])
    served = {flow.key: flow}
    with open_store(config) as store, FakeClock(datetime(2030, 1, 1, tzinfo=UTC)) as clock:
        stepstone.schedule(store, "t", cron="* * * * *", workflow=flow, overlap="allow")
        began = time.perf_counter()
        for _ in range(slots):
            clock.advance(60)
            _sync(fire_due(served), store)
        return (time.perf_counter() - began) / slots * 1e6


def main() -> None:
    quick = "--quick" in sys.argv
    runs, slots = (20, 200) if quick else (100, 1000)
    TMP.mkdir(parents=True, exist_ok=True)
    try:
        print(f"{'backend':8} {'plain':>10} {'timeout=':>10} {'deadline':>10} {'slot':>10}")
        for backend in ("memory", "sqlite"):

            def config(name: str, backend: str = backend) -> str:
                if backend == "memory":
                    return f"memory://{name}-{uuid.uuid4().hex}"
                return f"sqlite:///{TMP}/{name}.db"

            plain = _per_step(config("plain"), _steps(), runs)
            timed = _per_step(config("timed"), _steps(timeout=60), runs)
            bounded = _per_step(config("deadline"), Workflow("w", _steps(), deadline=3600), runs)
            slot = _per_slot(config("slots"), slots)
            print(f"{backend:8} {plain:>8.0f}us {timed:>8.0f}us {bounded:>8.0f}us {slot:>8.0f}us")
        print("per step of a 10-step run (median); per slot fired (mean)")
        print(f"{'backend':8} {'ctx.step':>10} {'deadline':>10}")
        for backend in ("memory", "sqlite"):
            where = "memory://calls-" if backend == "memory" else f"sqlite:///{TMP}/calls-"
            suffix = "" if backend == "memory" else ".db"
            plain = _per_call(f"{where}plain{suffix}", None, runs)
            bounded = _per_call(f"{where}bounded{suffix}", 3600, runs)
            print(f"{backend:8} {plain:>8.0f}us {bounded:>8.0f}us")
        print("per ctx.step call of a 10-call code workflow (median)")
    finally:
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
