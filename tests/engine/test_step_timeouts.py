"""Step timeouts (issue 33): a hung step fails with StepTimeout, is retried, and is fenced."""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS
from fresh_stores import fresh_config as _config
from stepstone import (
    InvalidWorkflow,
    RetryPolicy,
    Step,
    StepContext,
    StepFailed,
    arun,
    open_store,
    run,
    workflow,
)
from stepstone._store import Store
from stepstone._timeouts import StepTimeout
from stepstone.testing import FakeClock

State = dict[str, Any]
#: Real seconds a test waits for something that happens at once; never reached when green.
HANG = 30.0
#: The timeout of the blocked steps below (real seconds: a socket read cannot be faked).
TIMEOUT = 0.2
NO_DELAY = RetryPolicy(max_attempts=3, initial_delay=0, jitter=0)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend."""
    with open_store(_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected socket pair: reads on the first block until the second sends."""
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _blocked_reader(reader: socket.socket, late: queue.Queue[str], hang_until: int) -> Any:
    def read(state: State, ctx: StepContext) -> State:
        if ctx.attempt < hang_until:
            reader.recv(1)  # blocks past the timeout; the test sends a byte later
            try:
                ctx.heartbeat()  # the late attempt's write, fenced
                late.put("written")
            except StepTimeout:
                late.put("fenced")
            return {"late": ctx.attempt}
        return {"ok": ctx.attempt}

    return read


def _released(writer: socket.socket, late: queue.Queue[str], count: int) -> list[str]:
    writer.sendall(b"x" * count)
    return [late.get(timeout=HANG) for _ in range(count)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_step_blocked_in_a_socket_read_is_failed_and_retried(
    store: Store, pair: tuple[socket.socket, socket.socket], mode: str
) -> None:
    """Two attempts hang in recv past their timeout; the third runs; the late ones are fenced."""
    late: queue.Queue[str] = queue.Queue()
    step = Step("read", _blocked_reader(pair[0], late, 3), retry=NO_DELAY, timeout=TIMEOUT)
    run_id = f"t-{uuid.uuid4().hex}"
    if mode == "sync":
        result = run(run_id, [step], store)
    else:
        result = asyncio.run(arun(run_id, [step], store))
    assert result == {"ok": 3}
    assert _released(pair[1], late, 2) == ["fenced", "fenced"]
    cp = store.load(run_id)
    assert cp is not None and cp.status == "done" and "late" not in cp.state


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_last_timeout_fails_the_run_with_its_attempt_count(
    store: Store, pair: tuple[socket.socket, socket.socket], mode: str
) -> None:
    """Timeouts on every attempt fail the run: StepTimeout recorded with the attempt number."""
    late: queue.Queue[str] = queue.Queue()
    policy = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    step = Step("read", _blocked_reader(pair[0], late, 99), retry=policy, timeout=TIMEOUT)
    run_id = f"t-{uuid.uuid4().hex}"
    with pytest.raises(StepFailed) as caught:
        if mode == "sync":
            run(run_id, [step], store)
        else:
            asyncio.run(arun(run_id, [step], store))
    assert isinstance(caught.value.__cause__, StepTimeout)
    cp = store.load(run_id)
    assert cp is not None and cp.status == "failed" and cp.failure is not None
    assert (cp.failure.error_type, cp.failure.attempt) == ("StepTimeout", 2)
    assert "timeout" in cp.failure.message
    assert _released(pair[1], late, 2) == ["fenced", "fenced"]


def test_an_async_step_is_cancelled_at_its_timeout(store: Store) -> None:
    """Under arun an async def step past its timeout is cancelled, not left running."""
    seen: list[str] = []

    async def slow(state: State, ctx: StepContext) -> State:
        if ctx.attempt == 1:
            try:
                await asyncio.Event().wait()  # forever
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
        return {"ok": ctx.attempt}

    step = Step("slow", slow, retry=NO_DELAY, timeout=TIMEOUT)
    assert asyncio.run(arun(f"t-{uuid.uuid4().hex}", [step], store)) == {"ok": 2}
    assert seen == ["cancelled"]


def test_idle_timeout_counts_from_the_last_heartbeat() -> None:
    """Fake clock: heartbeats keep a step alive past 3x its idle timeout; silence ends it."""
    with open_store(f"memory://idle-{uuid.uuid4().hex}") as store, FakeClock() as clock:
        ticks: queue.Queue[bool] = queue.Queue()
        beaten = threading.Semaphore(0)

        def beating(state: State, ctx: StepContext) -> State:
            while ticks.get(timeout=HANG):
                ctx.heartbeat()
                beaten.release()
            ticks.get(timeout=HANG)  # silent from here
            return {"done": True}

        step = Step("beating", beating, idle_timeout=10)
        errors: list[BaseException] = []

        def target() -> None:
            try:
                run("idle", [step], store)
            except BaseException as exc:  # noqa: BLE001 - checked below
                errors.append(exc)

        thread = threading.Thread(target=target)
        thread.start()
        for _ in range(4):
            clock.advance(8)  # less than the idle timeout since the last heartbeat
            ticks.put(True)
            assert beaten.acquire(timeout=HANG), "the step's heartbeat hung"
        assert thread.is_alive()
        ticks.put(False)
        clock.advance(11)  # silent for longer than the idle timeout
        thread.join(HANG)
        assert not thread.is_alive(), "the idle timeout did not end the step"
        ticks.put(False)  # let the late thread end
        assert len(errors) == 1 and isinstance(errors[0], StepFailed)
        assert isinstance(errors[0].__cause__, StepTimeout)
        assert "idle_timeout" in str(errors[0].__cause__)


def test_code_workflow_ctx_step_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    """ctx.step(timeout=) fails a hung call with StepTimeout; retry applies; late result dropped."""
    reader, writer = pair
    calls: list[int] = []

    def fetch() -> str:
        calls.append(1)
        if len(calls) == 1:
            reader.recv(1)
            return "late"
        return "fresh"

    @workflow("fetcher")
    def flow(ctx: Any, data: State) -> str:
        value: str = ctx.step("fetch", fetch, retry=NO_DELAY, timeout=TIMEOUT)
        return value

    with open_store(f"memory://code-{uuid.uuid4().hex}") as store:
        run("code", flow, store)
        cp = store.load("code")
        assert cp is not None and cp.status == "done"
        assert "fresh" in str(cp.state) and "late" not in str(cp.state)
    writer.sendall(b"x")
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "more than 0"),
        ({"timeout": -1}, "more than 0"),
        ({"idle_timeout": float("nan")}, "more than 0"),
        ({"timeout": "60"}, "must be seconds"),
        ({"timeout": timedelta(days=8)}, "a week"),
    ],
)
def test_bad_timeouts_are_refused(kwargs: dict[str, Any], message: str) -> None:
    """A timeout that is not a positive number of seconds up to a week is refused."""
    with pytest.raises(InvalidWorkflow, match=message):
        Step("s", lambda state: None, **kwargs)


def test_timedelta_timeouts_are_seconds() -> None:
    """timedelta timeouts are stored as seconds."""
    step = Step("s", lambda state: None, timeout=timedelta(minutes=1), idle_timeout=5)
    assert (step.timeout, step.idle_timeout, step.timed) == (60.0, 5.0, True)
    assert not Step("t", lambda state: None).timed
