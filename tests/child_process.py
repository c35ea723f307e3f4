"""Run a Python child that imports this stepstone and answer with what it printed last."""

from __future__ import annotations

import subprocess
import sys

from stepstone.testing._base import child_env

#: Seconds a child may take (a run of a few steps, a CLI call) before the test fails.
CHILD_TIMEOUT = 120


def last_line(*args: str) -> str:
    """Run ``python *args``; fail on a non-zero exit (with its stderr); its last stdout line."""
    done = subprocess.run(
        [sys.executable, *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]
