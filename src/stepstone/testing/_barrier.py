"""Waits that fail fast: every barrier, join, queue read and child process has a deadline.

A contract suite that hangs tells nobody anything, and a CI job killed after an hour
does not say which worker was stuck. Each helper here takes ``who`` (or a name) and,
when its deadline passes, fails the test with an ``AssertionError`` naming it.
"""

from __future__ import annotations

import asyncio
import queue
import subprocess
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

__all__ = [
    "PROCESS_TIMEOUT",
    "WAIT_TIMEOUT",
    "Worker",
    "collect",
    "describe",
    "get",
    "join_process",
    "join_threads",
    "run_child",
    "wait",
    "wait_event",
    "within",
]

T = TypeVar("T")

#: Seconds a barrier, event or queue read inside one test may take. Generous for a slow,
#: shared CI machine; a wait that takes this long is a hang, not slowness.
WAIT_TIMEOUT = 120.0
#: Seconds a child process may take: it starts an interpreter and opens the store.
PROCESS_TIMEOUT = 300.0


class _Barrier(Protocol):
    def wait(self, timeout: float | None = None) -> Any: ...


class _Process(Protocol):
    @property
    def exitcode(self) -> int | None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...


def wait(barrier: _Barrier, who: str, timeout: float = WAIT_TIMEOUT) -> None:
    """Wait at ``barrier``; fail naming ``who`` if the other parties do not come in time.

    Works with ``threading.Barrier`` and ``multiprocessing`` barriers. A broken barrier
    means another party hung or died: its own failure names it.
    """
    try:
        barrier.wait(timeout)
    except threading.BrokenBarrierError:
        raise AssertionError(
            f"{who}: barrier broken after up to {timeout:.0f}s: another party hung or died"
        ) from None


def wait_event(event: threading.Event, what: str, timeout: float = WAIT_TIMEOUT) -> None:
    """Wait for ``event``; fail saying ``what`` did not happen."""
    if not event.wait(timeout):
        raise AssertionError(f"{what} did not happen within {timeout:.0f}s")


def get(q: Any, who: str, timeout: float = WAIT_TIMEOUT) -> Any:
    """Read one item from a thread or process queue; fail naming ``who`` if none comes."""
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"{who}: no result within {timeout:.0f}s") from None


class Worker(threading.Thread):
    """A thread that keeps the exception its target raised, for ``join_threads``."""

    def __init__(self, name: str, target: Callable[..., object], *args: Any) -> None:
        super().__init__(name=name, daemon=True)
        self._body = target
        self._body_args = args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._body(*self._body_args)
        except BaseException as exc:  # noqa: BLE001 - kept for join_threads to raise in the test
            self.error = exc


def join_threads(threads: Sequence[Worker], timeout: float = WAIT_TIMEOUT) -> None:
    """Join every worker; fail naming the first that hung or raised."""
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise AssertionError(f"thread {thread.name} hung: still running after {timeout:.0f}s")
    for thread in threads:
        if thread.error is not None:
            raise AssertionError(
                f"thread {thread.name} raised {type(thread.error).__name__}: {thread.error}"
            ) from thread.error


def join_process(proc: _Process, name: str, timeout: float = PROCESS_TIMEOUT) -> None:
    """Join a ``multiprocessing`` process; kill it and fail if it hangs or exits non-zero."""
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(10)
        raise AssertionError(f"process {name} hung: still running after {timeout:.0f}s; killed")
    if proc.exitcode != 0:
        raise AssertionError(f"process {name} exited with code {proc.exitcode}")


def describe(procs: Mapping[str, _Process]) -> str:
    """Say which of ``procs`` are still running and how the others ended."""
    return ", ".join(
        f"{name}: {'running' if p.is_alive() else f'exit {p.exitcode}'}"
        for name, p in procs.items()
    )


def collect(
    q: Any, count: int, procs: Mapping[str, _Process], timeout: float = PROCESS_TIMEOUT
) -> list[Any]:
    """Read ``count`` results the processes put on ``q``; fail saying which hung or died."""
    items = []
    for _ in range(count):
        try:
            items.append(q.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(
                f"only {len(items)} of {count} results within {timeout:.0f}s; "
                f"processes: {describe(procs)}"
            ) from None
    return items


def run_child(
    args: Sequence[str], name: str, timeout: float = PROCESS_TIMEOUT, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run a child process to its end; fail naming it if it outlives ``timeout``."""
    try:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"child process {name} hung: killed after {timeout:.0f}s; stderr: {exc.stderr!r}"
        ) from None


async def within(
    awaitable: Awaitable[T],
    what: str,
    timeout: float = WAIT_TIMEOUT,  # noqa: ASYNC109 - the suite's one timeout helper itself
) -> T:
    """Await ``awaitable``; fail saying ``what`` did not finish in time."""
    try:
        async with asyncio.timeout(timeout):  # not wait_for: it can lose a cancel (3.11)
            return await awaitable
    except TimeoutError:
        raise AssertionError(f"{what} did not finish within {timeout:.0f}s") from None


async def set_first(event: asyncio.Event, task: asyncio.Task[Any], what: str) -> bool:
    """Wait for ``event`` to be set or ``task`` to end, whichever is first (``what``).

    Returns whether ``event`` was seen set: False when ``task`` ended without it.
    """
    waiting = asyncio.create_task(event.wait())
    try:
        await within(asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED), what)
        return waiting.done()
    finally:
        waiting.cancel()
