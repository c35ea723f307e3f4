"""Python children that import this stepstone (and, when asked, the tests' helper modules).

``last_line`` runs one to its end and answers with what it printed last; ``spawn``
starts one in the background and ``reap`` waits for it, with its stderr. A child gets
no PYTHONPATH from CI: ``child_env`` puts this stepstone on its path, and a child that
imports a module of the tests puts ``TESTS`` (this folder) on its own.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import IO

from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.testing._base import child_env

__all__ = ["CHILD_TIMEOUT", "TESTS", "last_line", "reap", "spawn", "stderr_of"]

#: The tests' folder, where their helper modules are (fresh_stores, waiting, ...).
TESTS = str(Path(__file__).resolve().parent)
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


#: Each spawned process's stderr: a temporary file (``spawn``).
_STDERR: weakref.WeakKeyDictionary[subprocess.Popen[str], IO[str]] = weakref.WeakKeyDictionary()


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c script args`` with this stepstone importable.

    Its stderr goes to a temporary file, not a pipe: a child writing more than a pipe
    holds (a warning per request to the Cosmos emulator) blocked on the write until
    ``reap`` read it, and hung the test that waited on its work. Its stdout is dropped.
    """
    err = tempfile.TemporaryFile("w+")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
    )
    _STDERR[proc] = err
    return proc


def stderr_of(proc: subprocess.Popen[str]) -> str:
    """What a process ``spawn`` started wrote to stderr so far."""
    err = _STDERR[proc]
    err.flush()
    err.seek(0)
    return err.read()


def reap(proc: subprocess.Popen[str], what: str) -> tuple[int, str]:
    """Wait for ``proc`` (killing it if it hangs); return its exit status and stderr."""
    try:
        proc.wait(timeout=WAIT_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"{what} did not end within {WAIT_TIMEOUT:g}s: {stderr_of(proc)[-2000:]}"
        ) from exc
    return proc.returncode, stderr_of(proc)
