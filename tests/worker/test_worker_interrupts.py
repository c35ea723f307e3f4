"""Ctrl-C and SIGTERM stop a worker in seconds, wherever they land.

A worker that ignores Ctrl-C is found by an operator, not a test: one did (a real
``stepstone worker`` ran on past 60 s after a SIGINT in a CI run). The cause was an
event that a signal handler set while the main thread was inside that event's own
``wait``, holding its lock (``stepstone._sigevent``). These tests interrupt real
processes at the points a signal can land once the program runs: right after the
serving line, during its first claims, while runs are in their steps; under
``stepstone worker`` (its handlers) and under a user's own ``serve`` and ``aserve``
(Python's KeyboardInterrupt, asyncio.run's cancel), at concurrency 1 and above. Each
must exit in bounded time, and
the runs it held must be handed over, not finished and not lost.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from child_process import TESTS
from stepstone import Step, Workflow, open_store, start
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.testing._base import child_env
from worker_support import Lines

pytestmark = pytest.mark.process

#: Steps of the long workflow: each sleeps 20 ms, so a run takes 20 s or more. A worker
#: that finished its runs instead of handing them over would hold its exit that long.
STEPS = 1000

FLOWS = f"""
import time
from stepstone import Step, Workflow

def _tick(state):
    time.sleep(0.02)
    return {{"n": state.get("n", 0) + 1}}

WORKFLOWS = [Workflow("long", [Step(f"s{{i}}", _tick) for i in range({STEPS})])]
"""

#: A user's program serving from Python: ``serve`` or ``aserve``, no handler of its own.
SERVE = """
import asyncio, sys
import stepstone
from flows import WORKFLOWS

store = stepstone.open_store(sys.argv[1])
worker = stepstone.Worker(store, WORKFLOWS, concurrency=int(sys.argv[3]))
print("serving", flush=True)
if sys.argv[2] == "serve":
    worker.serve()
else:
    asyncio.run(worker.aserve())
"""

#: Seconds a worker may take to exit after the signal: generous, as every wait here.
EXIT_WITHIN = 60.0


def _tick(state: dict[str, Any]) -> dict[str, Any]:  # never run here: names the steps
    return state


#: The workflow FLOWS defines, to queue its runs from the test (its name and steps).
LONG = Workflow("long", [Step(f"s{i}", _tick) for i in range(STEPS)])


def _queued(tmp_path: Path, count: int) -> str:
    """Write the workers' flows module and queue ``count`` runs r0... in a SQLite store."""
    (tmp_path / "flows.py").write_text(FLOWS)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = open_store(url)
    try:
        for index in range(count):
            start(store, LONG, f"r{index}")
    finally:
        store.close()
    return url


#: Runs the rest of its arguments as a Python program with SIGINT at its default, as a
#: program started from a terminal has it. A process started in the background by a
#: non-interactive shell (a CI script's job) inherits SIGINT *ignored*, and so do its
#: children, pytest's workers and these processes among them: Python then installs no
#: KeyboardInterrupt handler, and a SIGINT before ``stepstone worker`` installs its own
#: would be dropped, not delivered. (Seen: this file's serve tests hung under such a job.)
#: It says so on stderr once SIGINT is back at its default, before it becomes the program:
#: ``_start`` waits for that, so a signal is never sent into the window where it is
#: still ignored.
AS_FROM_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "sys.stderr.write('SIGINT at its default\\n'); sys.stderr.flush(); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _start(tmp_path: Path, argv: list[str]) -> tuple[subprocess.Popen[str], Lines, Lines]:
    """Start ``python *argv`` in ``tmp_path`` as from a terminal; its output read by lines."""
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", ""), TESTS])
    env.pop("STEPSTONE_STORE", None)
    env["PYTHONFAULTHANDLER"] = "1"  # a hung process's stacks, on the SIGABRT of _exits
    proc = subprocess.Popen(
        [sys.executable, "-c", AS_FROM_A_TERMINAL, *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    err.wait("the launcher to give SIGINT its default", lambda line: "SIGINT at its" in line)
    return proc, out, err


def _serving_cli(tmp_path: Path, url: str, concurrency: int) -> tuple[subprocess.Popen[str], Lines]:
    """Start `stepstone worker` on ``url``; return once it printed its serving line."""
    argv = ["-m", "stepstone", "worker", "--workflows", "flows:WORKFLOWS", "--store", url]
    proc, out, err = _start(tmp_path, [*argv, "--concurrency", str(concurrency)])
    out.wait("the serving line", lambda line: "serving long" in line)
    return proc, err


def _exits(proc: subprocess.Popen[str], what: str, err: Lines) -> int:
    try:
        return proc.wait(timeout=EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
        try:
            proc.wait(timeout=WAIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=WAIT_TIMEOUT)
        stacks = "\n".join(err.rest())
        pytest.fail(f"{what}: still running {EXIT_WITHIN:.0f}s after the signal; stderr:\n{stacks}")


def _handed_over(url: str, count: int) -> None:
    """Every run the worker held is unfinished and has no owner: handed over, not lost."""
    store = open_store(url)
    try:
        for index in range(count):
            record = store.load(f"r{index}")
            assert record is not None, f"r{index} vanished"
            assert record.status in ("queued", "running"), (f"r{index}", record.status)
            assert record.owner is None, (f"r{index} still owned by", record.owner)
    finally:
        store.close()


def _running(url: str, count: int) -> bool:
    """Whether every run has passed its first step (so each is in flight)."""
    store = open_store(url)
    try:
        records = [store.load(f"r{i}") for i in range(count)]
        return all(r is not None and r.step > 0 for r in records)
    finally:
        store.close()


def _until_running(url: str, count: int, proc: subprocess.Popen[str], err: Lines) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not _running(url, count):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the worker never had {count} runs in flight; stderr {err.seen}")
        time.sleep(0.05)


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_cli_worker_stops_on_a_signal_with_runs_in_flight(
    tmp_path: Path, concurrency: int, signum: int
) -> None:
    """`stepstone worker` exits 0 after one signal, its runs handed over at a step boundary."""
    url = _queued(tmp_path, concurrency)
    proc, err = _serving_cli(tmp_path, url, concurrency)
    _until_running(url, concurrency, proc, err)
    proc.send_signal(signum)
    assert _exits(proc, "stepstone worker", err) == 0, err.seen
    _handed_over(url, concurrency)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_cli_worker_stops_on_a_signal_at_any_moment(tmp_path: Path, concurrency: int) -> None:
    """SIGINTs landing at random moments of a busy worker's life: each exits 0 in time.

    From its serving line on (its handlers are in place by then) through its first
    claims and its runs' steps. Not before: a signal during the interpreter's start-up
    is Python's own business, and under coverage in CI it can land in the ``.pth`` hook's
    ``try: import coverage`` with a bare ``except``, which swallows the KeyboardInterrupt
    and lets the program run on (seen in two loaded runs).
    """
    url = _queued(tmp_path, concurrency)
    chooser = random.Random(concurrency)
    for attempt in range(12):
        proc, err = _serving_cli(tmp_path, url, concurrency)
        time.sleep(chooser.uniform(0, 0.5))
        proc.send_signal(signal.SIGINT)
        code = _exits(proc, f"attempt {attempt}", err)
        assert code == 0, (attempt, code, err.seen)
    _handed_over(url, concurrency)


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("mode", ["serve", "aserve"])
def test_ctrl_c_stops_serve_and_aserve_with_runs_in_flight(
    tmp_path: Path, mode: str, concurrency: int
) -> None:
    """A user's `serve` or `aserve` with no handler: Ctrl-C ends it, its runs handed over."""
    url = _queued(tmp_path, concurrency)
    (tmp_path / "serve_it.py").write_text(SERVE)
    proc, out, err = _start(tmp_path, ["serve_it.py", url, mode, str(concurrency)])
    out.wait("the serving line", lambda line: line == "serving")
    _until_running(url, concurrency, proc, err)
    proc.send_signal(signal.SIGINT)
    code = _exits(proc, mode, err)
    # Python's KeyboardInterrupt ends the program with a traceback: 1, or -SIGINT when
    # the interpreter re-raises the signal at exit (asyncio.run does, from 3.11).
    assert code in (1, -signal.SIGINT, 130), (code, err.seen)
    err.find("the KeyboardInterrupt's traceback", lambda line: "KeyboardInterrupt" in line)
    _handed_over(url, concurrency)


def _script(script: str, what: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script``; fail naming ``what`` if it is still running after EXIT_WITHIN."""
    try:
        return subprocess.run(
            [sys.executable, "-c", script],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=EXIT_WITHIN,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: still running {EXIT_WITHIN:.0f}s after it began")


def test_an_event_a_signal_handler_sets_never_hangs_its_waiter(tmp_path: Path) -> None:
    """The worker's events survive a handler that sets one inside the main thread's wait.

    A thread signals the main thread every 0.1 ms while it waits on the event; the
    handler sets it. With ``threading.Event`` in its place (run by hand) the handler
    lands while the waiter holds the event's lock and blocks on it; the next signals
    nest inside that blocked handler until a RecursionError, within a second. Alone,
    a blocked handler is a hang: the defect this pins.
    """
    script = textwrap.dedent(
        """
        import os, signal, sys, threading, time
        from stepstone._sigevent import SignalSafeEvent

        sys.setrecursionlimit(200)  # a handler blocked in set: nested ones fail fast
        event = SignalSafeEvent()
        signal.signal(signal.SIGUSR1, lambda signum, frame: event.set())

        def pound():
            while True:
                os.kill(os.getpid(), signal.SIGUSR1)
                time.sleep(0.0001)

        threading.Thread(target=pound, daemon=True).start()
        rounds = 0
        end = time.monotonic() + 2
        while time.monotonic() < end:
            event.clear()
            event.wait(0)
            event.wait(0.0002)
            rounds += 1
        print(rounds)
        """
    )
    done = _script(script, "the waiter")
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) > 0


def test_a_signal_landing_on_another_thread_still_ends_the_main_threads_wait() -> None:
    """A handler that is due while the main thread is parked runs within a slice.

    Python runs handlers in the main thread only. A signal that the kernel delivers to
    another thread (here sent to one on purpose, ``pthread_kill``) marks its handler as
    due but does not wake the main thread parked in C; nor does one landing just before
    the park. A wait with no timeout then never runs it: ``stepstone worker`` ignored a
    Ctrl-C so, in CI. The main thread's wait here has no timeout; its handler sets the
    event it waits on.
    """
    script = textwrap.dedent(
        """
        import signal, threading, time
        from stepstone._sigevent import SignalSafeEvent

        event = SignalSafeEvent()
        signal.signal(signal.SIGUSR1, lambda signum, frame: event.set())
        parked = threading.Event()

        def other():
            parked.wait()
            time.sleep(0.2)  # the main thread is in its wait by now, parked in C
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

        threading.Thread(target=other, daemon=True).start()
        parked.set()
        print("woken" if event.wait() else "not set", flush=True)
        """
    )
    done = _script(script, "the main thread's wait (the handler due never ran)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "woken"
