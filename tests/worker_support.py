"""Workers for tests: one serving in a thread of this process, or a real `stepstone worker`.

``serving`` runs a ``Worker`` (``serve`` or ``aserve``) in a thread for the length of a
``with`` block; ``WorkerThread`` runs one until stopped. ``WorkerProcess`` is a real
``stepstone worker`` process on the ``FLOWS`` module, its output read line by line
(``Lines``) with a timeout that names what hung; ``queue_run`` and ``event_line`` feed
and follow it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NamedTuple

import pytest

import waiting
from stepstone import Worker, Workflow, open_store
from stepstone.testing._barrier import WAIT_TIMEOUT
from waiting import in_thread


@contextmanager
def serving(config: str, workflows: list[Workflow], mode: str, **options: Any) -> Iterator[Worker]:
    """Run a Worker on a store opened from ``config``, in a thread: ``serve`` or ``aserve``."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            if mode == "async":

                async def serve() -> None:
                    async with open_store(config) as opened:
                        box["worker"] = Worker(opened, workflows, **options)
                        ready.set()
                        await box["worker"].aserve()

                asyncio.run(serve())
            else:
                with open_store(config) as opened:
                    box["worker"] = Worker(opened, workflows, **options)
                    ready.set()
                    box["worker"].serve()
        except BaseException as exc:  # noqa: BLE001 - the thread's outcome, whatever it is, goes to the test
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=main, name=f"{mode} worker")
    thread.start()
    assert ready.wait(WAIT_TIMEOUT), f"the {mode} worker did not start"
    worker = box.get("worker")
    assert worker is not None, f"the {mode} worker failed to start: {box.get('error')!r}"
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
        assert not thread.is_alive(), f"the {mode} worker did not stop"
    if "error" in box:
        raise box["error"]


class WorkerThread:
    """A Worker serving in a thread (sync) or on its own loop in a thread (async)."""

    def __init__(self, worker: Worker, mode: str = "sync", timeout: float = WAIT_TIMEOUT) -> None:
        self.worker = worker
        self.mode = mode
        self.join = in_thread(f"{mode} worker", self._serve, timeout)

    def _serve(self) -> None:
        if self.mode == "sync":
            self.worker.serve()
        else:
            asyncio.run(self.worker.aserve())

    def stop(self) -> None:
        self.worker.stop()
        self.join()


#: Seconds any one wait may take: generous, so only a hang fails it, never a slow machine.
WAIT = 60.0

#: Seconds any wait of the odd-case files (tests/engine/test_odd_cases.py and
#: tests/worker/test_worker_odd_cases.py) may take before it fails naming what hung.
#: Generous for a loaded CI machine (a wait this long is a hang), and twice it still
#: fits in their per-test timeout (``ODD_TIMEOUT``).
ODD_WAIT = 45.0
ODD_TIMEOUT = 120
#: The lease of an owner a test needs seen alive (a second caller gets RunOwned): it
#: renews every third of it, so only a stall of over a second could look like its death.
LIVE_LEASE = 2.0


class Bounded(NamedTuple):
    """The shared waiting helpers and ``WorkerThread``, each bounded by one timeout."""

    until: Callable[..., Any]
    in_thread: Callable[..., Any]
    arun_in_time: Callable[..., Any]
    serving: Callable[..., WorkerThread]


def bounded(timeout: float) -> Bounded:
    """``waiting``'s helpers and ``WorkerThread`` with ``timeout`` as their bound."""
    return Bounded(
        functools.partial(waiting.until, timeout=timeout),
        functools.partial(waiting.in_thread, timeout=timeout),
        functools.partial(waiting.arun_in_time, timeout=timeout),
        functools.partial(WorkerThread, timeout=timeout),
    )


FLOWS = """
import os, time
import stepstone
from stepstone import Step, WaitFor, Workflow

def _hold(state):
    # The owner that is killed holds its step until it dies; its successor does not.
    while os.environ.get("HOLD_STEP") == "1":
        time.sleep(0.05)
    return {"held": True}

def _boom(state):
    raise ValueError("bad <input>\\nsecond line, never shown")

WORKFLOWS = [
    Workflow("approve", [Step("draft", lambda s: {"d": 1}), WaitFor("wait", "go"),
                         Step("send", lambda s: {"sent": True})]),
    Workflow("boom", [Step("explode", _boom)]),
    Workflow("hold", [Step("hold", _hold)]),
]
"""


class Lines:
    """A process's output stream read in a thread, waited on line by line."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def find(self, what: str, match: Callable[[str], bool]) -> str:
        """Return a line seen already that ``match``es, else wait for one."""
        for line in self.seen:
            if match(line):
                return line
        return self.wait(what, match)

    def wait(self, what: str, match: Callable[[str], bool], timeout: float = WAIT) -> str:
        """Return the first line from now on that ``match``es; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"timed out after {timeout}s waiting for {what}; saw {self.seen}")
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail(f"the worker exited while waiting for {what}; saw {self.seen}")
            self.seen.append(line)
            if match(line):
                return line

    def rest(self, timeout: float = 5.0) -> list[str]:
        """Every line seen, with those read since the last wait: for a failure's message.

        Waits up to ``timeout`` for the stream's end (a process killed just before).
        """
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
        return self.seen


class WorkerProcess:
    """A real `stepstone worker` process, stopped (or killed) at the end."""

    def __init__(self, tmp_path: Path, url: str, *options: str, hold: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if k != "STEPSTONE_STORE"}
        env["HOLD_STEP"] = "1" if hold else "0"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepstone",
                "worker",
                "--store",
                url,
                "--workflows",
                "flows:WORKFLOWS",
                "--lease",
                "1",
                *options,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.stdout = Lines(self.proc.stdout)
        self.stderr = Lines(self.proc.stderr)

    def stop(self) -> int:
        """SIGTERM the worker and return its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=WAIT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT)


def stepstone_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STEPSTONE_STORE"}
    return subprocess.run(
        [sys.executable, "-m", "stepstone", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def queue_run(tmp_path: Path, url: str, workflow: str, run_id: str) -> None:
    proc = stepstone_cli(
        tmp_path,
        "runs",
        "start",
        workflow,
        run_id,
        "--workflows",
        "flows:WORKFLOWS",
        "--store",
        url,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"queued run {run_id!r}" in proc.stdout


def event_line(run_id: str, say: str) -> Callable[[str], bool]:
    """Match a text event line about ``run_id`` that says ``say``."""
    return lambda line: f"run {run_id!r}: {say}" in line
