"""Schedules survive real crashes: workers SIGKILLed while firing, every slot fired once.

Each round, two worker processes look at the schedules at the same (fake) minute, as
two workers of a fleet would, and each kills itself at a point drawn for it: after
advancing the schedule (slots pending, none started), after starting a slot's run (the
schedule not told), or not at all. A fresh process then reopens the store from its
config string and checks that every minute slot of the window has exactly one run,
and that nothing is left pending.
"""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import stepstone
from fresh_stores import fresh_table
from stepstone import Step, Workflow, open_store
from stepstone._schedule import schedules
from stepstone.testing import FakeClock

SRC = str(Path(stepstone.__file__).resolve().parents[1])
ROUNDS = 4

CHILD = r"""
import os, signal, sys
from datetime import datetime, timedelta, UTC

from stepstone import Step, Workflow, _hooks, open_store
from stepstone._control import _sync
from stepstone._schedule_fire import fire_due
from stepstone.testing import FakeClock

config, minute, kill = sys.argv[1], int(sys.argv[2]), sys.argv[3]
flow = Workflow("tick", [Step("s", lambda s: {})])


def hook(point):
    if point == kill:
        os.kill(os.getpid(), signal.SIGKILL)


_hooks.install(hook)
start = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=minute, seconds=30)
with open_store(config) as store, FakeClock(start):
    _sync(fire_due({flow.key: flow}), store)
"""

POINTS = ("schedule.advanced", "schedule.started", "none")


def _child(config: str, minute: int, kill: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, config, str(minute), kill],
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        stderr=subprocess.PIPE,
    )


@pytest.mark.crash
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_workers_killed_while_firing_fire_each_slot_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Kills after the advance or after a start lose no slot and start none twice."""
    if backend == "sqlite":
        config = f"sqlite:///{tmp_path}/runs.db"
    else:
        config = fresh_table(request, "postgresql://postgres@127.0.0.1:5432/test")
    flow = Workflow("tick", [Step("s", lambda s: {})])
    with open_store(config) as store, FakeClock(datetime(2030, 1, 1, tzinfo=UTC)):
        stepstone.schedule(store, "t", cron="* * * * *", workflow=flow, overlap="allow")
    draw = random.Random(33)
    killed = 0
    for minute in range(1, ROUNDS + 1):
        procs = [_child(config, minute, draw.choice(POINTS)) for _ in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode in (0, -9), err.decode()
            killed += proc.returncode == -9
    # A fresh process, no kill: repairs whatever the last round left pending.
    last = _child(config, ROUNDS, "none")
    _, err = last.communicate(timeout=120)
    assert last.returncode == 0, err.decode()
    assert killed > 0  # the draw killed some workers mid-fire
    with open_store(config) as store:
        runs = sorted(r for r in store.list_runs() if r.startswith("sched/t/"))
        assert runs == [f"sched/t/2030-01-01T00:0{m}:00Z" for m in range(1, ROUNDS + 1)]
        info = schedules(store)[0]
        assert info.pending == () and info.fired == ROUNDS
