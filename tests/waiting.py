"""Waiting in tests: poll a condition until it holds, failing with what hung.

One waiter for the test files that copied it (and ``status_of``, what it most often
waits on). Never a sleep-then-assert: the test goes on as soon as ``check`` holds, and
a generous ``timeout`` (``WAIT_TIMEOUT``) only bounds a hang, which the failure names.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stepstone import Store
from stepstone.testing._barrier import WAIT_TIMEOUT

__all__ = ["WAIT_TIMEOUT", "status_of", "until"]


def until(
    what: str, check: Callable[[], bool], timeout: float = WAIT_TIMEOUT, every: float = 0.01
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` if ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(every)


def status_of(store: Store, run_id: str) -> str | None:
    """The run's status now, or None if it does not exist."""
    cp = store.load(run_id)
    return None if cp is None else cp.status
