"""A worker takes over at once a run whose owner was a process on this host that is gone.

A real `stepstone worker` process claims a run with a 300 s lease and is SIGKILLed in
its step; a second worker (sync and async forms), also with a 300 s lease, must take
the run over and finish it well before that lease could expire: only the rule that
``run()`` already follows (same machine, PID gone: ``_lease.dead_here``) lets it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fresh_stores import MYSQL_URL, POSTGRES_URL, fresh_table
from stepstone import Step, Worker, Workflow, _lease, open_store
from stepstone._checkpoint import Checkpoint
from worker_support import FLOWS, WorkerProcess, event_line, queue_run

#: The lease both workers hold: far longer than any wait below, so a takeover inside
#: ``WAIT`` can only come from knowing the owner dead, never from the lease running out.
LEASE = 300
#: Seconds a wait may take: generous against a loaded machine, and far below ``LEASE``.
WAIT = 60.0


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store another process can open; the workflows module written beside it."""
    (tmp_path / "flows.py").write_text(FLOWS)
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    if request.param == "postgresql":
        return fresh_table(request, POSTGRES_URL)
    return fresh_table(request, MYSQL_URL)


@pytest.fixture
def killed(tmp_path: Path, url: str) -> Iterator[str]:
    """Queue h1, let a worker process claim it (300 s lease), SIGKILL it; yield its owner."""
    queue_run(tmp_path, url, "hold", "h1")
    first = WorkerProcess(tmp_path, url, "--lease", str(LEASE), hold=True)
    try:
        first.stderr.wait("h1 claimed by the first worker", event_line("h1", "claimed"))
    finally:
        first.kill()  # SIGKILL, and reaped: its PID no longer exists on this host
    store = open_store(url)
    try:
        cp = store.load("h1")
    finally:
        store.close()
    assert cp is not None and cp.status == "running" and cp.owner is not None
    assert cp.lease == LEASE
    yield cp.owner


def _wait_done(url: str, what: str) -> Checkpoint:
    """Poll the store until h1 is done; fail naming ``what`` after ``WAIT`` seconds."""
    store = open_store(url)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            cp = store.load("h1")
            if cp is not None and cp.status == "done":
                return cp
            assert time.monotonic() < deadline, (
                f"timed out after {WAIT:g}s waiting for {what} (the lease is {LEASE}s); "
                f"h1 is {cp and (cp.status, cp.owner)}"
            )
            time.sleep(0.05)
    finally:
        store.close()


def _hold() -> Workflow:
    # The workflow ``FLOWS`` names "hold", as a successor runs it: the step returns.
    return Workflow("hold", [Step("hold", lambda s: {"held": True})])


@pytest.mark.crash
@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_worker_takes_over_a_dead_local_owners_run_before_its_lease(
    url: str, killed: str, form: str
) -> None:
    """A worker takes over a run whose owner process on this host is gone, lease unexpired."""
    store = open_store(url)
    worker = Worker(store, [_hold()], lease=LEASE, poll=0.05)
    if form == "sync":
        thread = threading.Thread(target=worker.serve, daemon=True)
    else:
        thread = threading.Thread(target=asyncio.run, args=(worker.aserve(),), daemon=True)
    thread.start()
    try:
        cp = _wait_done(url, f"the {form} worker to take over h1 from its dead owner")
    finally:
        worker.stop()
        thread.join(WAIT)
        store.close()
    assert not thread.is_alive(), "the worker did not stop"
    assert cp.state == {"held": True}
    assert killed != worker.owner


@pytest.mark.crash
def test_a_worker_process_logs_the_takeover_of_a_dead_local_owner(
    tmp_path: Path, url: str, killed: str
) -> None:
    """A `stepstone worker` process logs taking over a dead local owner's run, lease unexpired."""
    second = WorkerProcess(tmp_path, url, "--lease", str(LEASE))
    try:
        taken = second.stderr.wait(
            "h1 taken over from its dead owner", event_line("h1", "taken over"), timeout=WAIT
        )
        assert f"previous_owner={killed!r}" in taken
        second.stderr.wait("h1 finished by the second worker", event_line("h1", "finished"))
        assert second.stop() == 0
    finally:
        second.kill()


def _owner_of(pid: int, start: str | None) -> str:
    """An owner name of this machine for ``pid``, with ``start`` as its START (None: none)."""
    parts = _lease.new_owner("worker").split(":")
    machine = parts[-2].partition(".")[0]
    parts[-3] = str(pid)
    parts[-2] = machine if start is None else f"{machine}.{start}"
    return ":".join(parts)


@pytest.mark.process
def test_a_reused_pid_is_not_taken_for_the_owner() -> None:
    """An owner whose PID a later process holds is dead; the PID's own START, or none, is alive."""
    assert _lease._started(os.getpid()) is not None, "this kernel shows no start times"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        started = _lease._started(child.pid)
        assert started is not None
        assert not _lease.dead_here(_owner_of(child.pid, str(started)))  # the owner itself
        assert _lease.dead_here(_owner_of(child.pid, str(started - 1)))  # its PID, reused
        assert not _lease.dead_here(_owner_of(child.pid, None))  # an older owner: cannot tell
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=WAIT)
    mine = _lease.new_owner("worker")
    assert not _lease.dead_here(mine)  # this very process
    own = int(mine.split(":")[-2].partition(".")[2])
    assert _lease.dead_here(_owner_of(os.getpid(), str(own + 1)))  # a gone owner had our PID
