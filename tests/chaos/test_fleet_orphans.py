"""A fleet worker dies with the harness that started it (tools/fleet/worker.py).

A harness killed outright runs no cleanup: its workers once polled a deleted store for
95 minutes. Here a real harness process starts a real fleet worker and is SIGKILLed;
the worker must be gone soon after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.testing._base import child_env

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
#: Seconds the orphaned worker may take to notice (it looks once a second): generous.
EXIT_WITHIN = 30.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: its parent (the killed harness) is gone, init reaps it.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_fleet_worker_exits_when_its_harness_is_killed(tmp_path: Path) -> None:
    """SIGKILL the harness: its worker, left with no parent, ends within seconds."""
    spec = {
        "config": f"sqlite:///{tmp_path / 'fleet.db'}",
        "logdir": str(tmp_path),
        "lease": 2,
        "poll": 0.5,
        "concurrency": 2,
        "step_min": 0.0,
        "step_max": 0.01,
        "mode": "threads",
        "skew": 0,
        "drop_rings": 0,
        "seed": 1,
    }
    harness = textwrap.dedent(
        f"""
        import json, subprocess, sys, time
        worker = subprocess.Popen(
            [sys.executable, "-m", "fleet", "worker", {json.dumps(json.dumps(spec))}],
            cwd={str(REPO)!r}, stdout=subprocess.PIPE,
        )
        hello = worker.stdout.readline().decode()  # the worker is up
        print(json.loads(hello)["pid"], flush=True)
        time.sleep(600)
        """
    )
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tools"), env.get("PYTHONPATH", "")])
    parent = subprocess.Popen(
        [sys.executable, "-c", harness], env=env, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the harness did not report its worker: {line!r}"
        worker = int(line)
        assert _alive(worker)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(WAIT_TIMEOUT)
    deadline = time.monotonic() + EXIT_WITHIN
    while _alive(worker):
        if time.monotonic() > deadline:
            os.kill(worker, signal.SIGKILL)
            pytest.fail(f"the fleet worker {worker} outlived its killed harness by {EXIT_WITHIN}s")
        time.sleep(0.1)
