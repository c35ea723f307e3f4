"""Waiting in tests: poll a condition until it holds, failing with what hung.

One waiter for the test files that copied it. Never a sleep-then-assert: the test goes
on as soon as ``check`` holds, and a generous ``timeout`` (``WAIT_TIMEOUT``) only bounds
a hang, which the failure names.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stepstone.testing._barrier import WAIT_TIMEOUT

__all__ = ["WAIT_TIMEOUT", "until"]


def until(
    what: str, check: Callable[[], bool], timeout: float = WAIT_TIMEOUT, every: float = 0.01
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` if ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(every)
