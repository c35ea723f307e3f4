"""Waiting in tests: poll a condition until it holds, failing with what hung.

One waiter for the test files that copied it (and ``status_of``, what it most often
waits on). Never a sleep-then-assert: the test goes on as soon as ``check`` holds, and
a generous ``timeout`` (``WAIT_TIMEOUT``) only bounds a hang, which the failure names.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from stepstone import Store
from stepstone._checkpoint import Checkpoint
from stepstone.testing._barrier import WAIT_TIMEOUT

__all__ = ["WAIT_TIMEOUT", "arun_in_time", "in_thread", "loaded", "status_of", "until"]


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


def loaded(store: Store, run_id: str) -> Checkpoint:
    """The run's checkpoint, which must be stored."""
    cp = store.load(run_id)
    assert cp is not None, f"run {run_id!r} is not stored"
    return cp


def in_thread(
    what: str, fn: Callable[[], Any], timeout: float = WAIT_TIMEOUT
) -> Callable[..., Any]:
    """Run ``fn`` in a thread; return a join that fails naming ``what`` if it hangs."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the thread's outcome, whatever it is, goes to the test
            box["error"] = exc

    thread = threading.Thread(target=target, name=what, daemon=True)
    thread.start()

    def join(within: float = timeout) -> Any:
        thread.join(within)
        if thread.is_alive():
            raise AssertionError(f"{what} did not finish within {within:g}s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    return join


def arun_in_time(what: str, coro: Any, timeout: float = WAIT_TIMEOUT) -> Any:
    """Run ``coro`` on a fresh loop; fail naming ``what`` if it takes over ``timeout``."""

    async def main() -> Any:
        try:
            return await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            # pytrace=False: a short report (formatting this traceback trips a CPython
            # 3.11 ast bug inside pytest after the asyncio hang).
            pytest.fail(f"{what} hung for {timeout:g}s", pytrace=False)

    return asyncio.run(main())
