"""Streams survive real crashes: SIGKILL a writer mid-stream, resume writer and reader.

A child process runs two steps: the first emits 20 events and commits, the second emits
30, makes sure they are stored, and kills itself (SIGKILL) mid-step. The test process
reads the stream as a separate reader, then a fresh child reopens the store from its
config string, takes the run over (a one-second lease) and reruns the second step, which
emits 60 events and commits. The reader resuming from its last id loses nothing and sees
nothing twice, and once the retry committed, the killed attempt's events are hidden (or
shown marked ``superseded`` when asked). A second test freezes the writer (SIGSTOP)
instead, lets a fresh process take the run over and finish it, then thaws the writer:
it appends nothing more, and a reader from before the freeze and one from after agree.
"""

from __future__ import annotations

import os
import signal as signals
import subprocess
import sys
from pathlib import Path

import pytest

import stepstone
from fresh_stores import DURABLE_BACKENDS, fresh_config
from stepstone import open_store, stream

SRC = str(Path(stepstone.__file__).resolve().parents[1])

CHILD = r"""
import os, signal, sys

from stepstone import Step, open_store, run
from stepstone._stream._writer import current

config, kill = sys.argv[1], sys.argv[2] == "kill"


def first(state, ctx):
    for i in range(20):
        ctx.emit("tokens", f"a{i}")


def second(state, ctx):
    count = 30 if kill else 60
    for i in range(count):
        ctx.emit("tokens", f"b{i}")
    if kill:
        current.get().writer.flush()  # stored, like any flush 100 ms later
        os.kill(os.getpid(), signal.SIGKILL)


with open_store(config) as store:
    run("r", [Step("first", first), Step("second", second)], store, lease=1.0)
"""


def _child(config: str, kill: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, config, "kill" if kill else "finish"],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


#: The durable backends every crash test runs on (a server's skip if it is down).
DURABLE = tuple(kind for kind in DURABLE_BACKENDS if kind != "cosmos")


@pytest.mark.crash
@pytest.mark.parametrize("kind", (*DURABLE, "cosmos"))
def test_kill_mid_stream_reader_resumes_exactly(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """After a SIGKILL mid-step, a resumed reader misses nothing, repeats nothing, and
    the killed attempt's events are hidden once the retry commits."""
    config = fresh_config(kind, request, tmp_path)
    killed = _child(config, kill=True)
    assert killed.returncode == -signals.SIGKILL, killed.stderr[-2000:]
    with open_store(config) as store:
        before = list(stream(store, "r", follow=False))
    # The committed step and the live (killed) attempt, as a reader saw them then.
    assert [e.data for e in before] == [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(30)]
    done = _child(config, kill=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with open_store(config) as store:
        resumed = list(stream(store, "r", after=before[-1].id))
        fresh = list(stream(store, "r"))
        marked = list(stream(store, "r", superseded=True))
    ids = [e.id for e in before + resumed]
    assert len(ids) == len(set(ids)), "an event was seen twice"
    assert [e.data for e in resumed] == [f"b{i}" for i in range(60)]
    assert [e.data for e in fresh] == [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(60)]
    assert [e.data for e in marked if e.superseded] == [f"b{i}" for i in range(30)]
    assert {e.attempt for e in fresh if e.step == "1"} == {1}  # a new process's first


FREEZER = r"""
import os, signal, sys

from stepstone import Step, open_store, run
from stepstone._stream._writer import current

config = sys.argv[1]


def first(state, ctx):
    ctx.emit("tokens", "a0")


def second(state, ctx):
    for i in range(10):
        ctx.emit("tokens", f"early{i}")
    current.get().writer.flush()
    print("frozen", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen until the test thaws it
    for i in range(10):
        ctx.emit("tokens", f"late{i}")


with open_store(config) as store:
    run("r", [Step("first", first), Step("second", second)], store, lease=1.0)
"""


@pytest.mark.crash
@pytest.mark.parametrize("kind", DURABLE)
def test_a_frozen_writer_cannot_append_after_a_takeover(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A writer frozen mid-step and thawed after another process took the run over stores
    nothing more, and two readers (before and after) agree on what committed."""
    config = fresh_config(kind, request, tmp_path)
    frozen = subprocess.Popen(
        [sys.executable, "-c", FREEZER, config],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert frozen.stdout is not None
        assert frozen.stdout.readline().strip() == "frozen", frozen.stderr
        with open_store(config) as store:
            early = list(stream(store, "r", follow=False))
        assert [e.data for e in early] == ["a0"] + [f"early{i}" for i in range(10)]
        done = _child(config, kill=False)  # takes the run over, reruns step 1, commits
        assert done.returncode == 0, done.stderr[-2000:]
        frozen.send_signal(signals.SIGCONT)
        assert frozen.wait(60) != 0  # its commit is refused: the lease is gone
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(60)
    with open_store(config) as store:
        resumed = list(stream(store, "r", after=early[-1].id))
        marked = list(stream(store, "r", superseded=True))
    assert [e.data for e in resumed] == [f"b{i}" for i in range(60)]
    assert not [e for e in marked if str(e.data).startswith("late")], "the frozen writer appended"
    assert [e.data for e in marked if e.superseded] == [f"early{i}" for i in range(10)]
