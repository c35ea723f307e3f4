"""A stream followed live from another process (issue 34): ``runs tail`` beside a worker.

A ``Worker`` in this process drives a run whose step emits a token, waits for the test,
and emits another. ``stepstone runs tail --json`` in a child process must print the
first token while the step still waits, the second once it comes, and exit 0 when the
run ends.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import stepstone
from fresh_stores import fresh_config
from stepstone import Step, StepContext, Worker, Workflow, open_store, start

SRC = str(Path(stepstone.__file__).resolve().parents[1])
WAIT = 60.0


@pytest.fixture(params=["sqlite", "postgresql", "cosmos"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh durable store's config string (a server's backend skips if it is down)."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.mark.process
def test_runs_tail_follows_a_worker_run_from_another_process(config: str) -> None:
    """The child prints the first event before the step ends, then the rest, then exits."""
    release = threading.Event()

    def speak(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.emit("tokens", "first")
        assert release.wait(WAIT), "the tail never printed the first token"
        ctx.emit("tokens", "second")

    flow = Workflow("streams-tail", [Step("speak", speak)])
    with open_store(config) as store:
        start(store, flow, "chat")
        worker = Worker(store, [flow], poll=0.05)
        serving = threading.Thread(target=worker.serve, daemon=True)
        serving.start()
        tail = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepstone",
                "runs",
                "tail",
                "chat",
                "--json",
                "--store",
                config,
            ],
            env={**os.environ, "PYTHONPATH": SRC},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert tail.stdout is not None
        stdout = tail.stdout

        def pump() -> None:
            for line in stdout:
                lines.put(line)

        reader = threading.Thread(target=pump)
        reader.start()
        try:
            first = json.loads(lines.get(timeout=WAIT))
            assert first["data"] == "first" and first["topic"] == "tokens"
            release.set()
            second = json.loads(lines.get(timeout=WAIT))
            assert second["data"] == "second"
            assert tail.wait(WAIT) == 0, tail.stderr.read() if tail.stderr else ""
        finally:
            release.set()
            if tail.poll() is None:
                tail.kill()
            tail.wait(WAIT)
            worker.stop()
            serving.join(WAIT)
            reader.join(WAIT)
