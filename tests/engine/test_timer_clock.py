"""Timers on the store's clock: a host whose clock is hours off never moves a wait.

``Sleep``, ``WaitFor``'s timeout, ``ctx.sleep`` and ``ctx.wait_for`` count from the
store's time (``_store_time``) and are judged due on it, by the run that waits and by
the workers' claims alike. Before, each host used its own clock: a timer begun on a
host three hours behind was due at once, and one judged on a host three hours ahead
ended three hours early. The store's clock is the host's real one on memory, file and
SQLite (it ignores ``ClockAhead``, which moves only the wall time); the server's on
PostgreSQL and MySQL (``tests/stores/test_store_clock.py``).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepstone
from code_support import store
from stepstone import Sleep, Step, Store, Suspended, WaitFor, Worker, Workflow
from stepstone._runinfo import ReadyAsk
from stepstone._status import RunStatus
from stepstone._store import RunInfo
from stepstone.stores.memory import MemoryStore
from stepstone.testing import use_clock
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.testing._runtime_kit import ClockAhead, time_ahead
from waiting import until

#: How far the hosts' clocks are off, either way.
SKEW = timedelta(hours=3)
#: A timer's length: far shorter than the skew, far longer than a loaded machine's save.
WAIT = timedelta(minutes=10)
#: How far the recorded wake time may be from the real time plus ``WAIT``.
NEAR = timedelta(seconds=30)
MODES = ("sync", "async")

State = dict[str, Any]


#: The fixture this module takes from code_support: a fresh memory, file or SQLite
#: store, whose clock is the host's real one.
__all__ = ["store"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``sync``: ``run``; ``async``: ``arun``."""
    return str(request.param)


def _run(run_id: str, flow: Any, store: Store, mode: str) -> State:
    if mode == "sync":
        return stepstone.run(run_id, flow, store)
    return asyncio.run(stepstone.arun(run_id, flow, store))


def _suspends(run_id: str, flow: Any, store: Store, mode: str) -> Suspended:
    with pytest.raises(Suspended) as info:
        _run(run_id, flow, store, mode)
    return info.value


def _near(at: datetime | None, expected: datetime) -> bool:
    return at is not None and abs(at - expected) < NEAR


def _after(state: State) -> State:
    return {"after": True}


SLEEPING = Workflow("nap", [Sleep("nap", duration=WAIT), Step("after", _after)])
WAITING = Workflow(
    "ask", [WaitFor("answer", "reply", timeout=WAIT, default="none"), Step("after", _after)]
)


@stepstone.workflow("code-nap")
def code_sleeping(ctx: Any, input: State) -> str:
    """``ctx.sleep`` then a return value."""
    ctx.sleep(WAIT)
    return "woke"


@stepstone.workflow("code-ask")
def code_waiting(ctx: Any, input: State) -> Any:
    """``ctx.wait_for`` with a timeout and a default."""
    return ctx.wait_for("reply", timeout=WAIT, default="none")


@pytest.mark.parametrize(
    ("flow", "done"),
    [
        (SLEEPING, lambda s: s["after"] and "nap" in s),
        (WAITING, lambda s: s["after"] and s["answer"] == "none"),
        (code_sleeping, lambda s: s["result"] == "woke"),
        (code_waiting, lambda s: s["result"] == "none"),
    ],
    ids=["Sleep", "WaitFor", "ctx.sleep", "ctx.wait_for"],
)
def test_a_timer_counts_and_ends_on_the_store_clock(
    store: Store, mode: str, flow: Any, done: Any
) -> None:
    """Begun on a host 3 h behind, the timer ends ten minutes from the store's now; a
    host 3 h ahead does not end it early; moving the store's time past it ends it."""
    real = datetime.now(UTC)
    with use_clock(ClockAhead(-SKEW)):
        began = _suspends("r", flow, store, mode)
    assert _near(began.wake_at, real + WAIT), (began.wake_at, real + WAIT)
    stored = store.load("r")
    assert stored is not None and stored.wake_at == began.wake_at
    with use_clock(ClockAhead(SKEW)):
        again = _suspends("r", flow, store, mode)  # three hours ahead: not due yet
    assert again.wake_at == began.wake_at
    with time_ahead(WAIT + timedelta(seconds=5)):
        assert done(_run("r", flow, store, mode))


class _SeenClaims(MemoryStore):
    """A memory store that records the time each claim query judged due runs by."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[datetime] = []
        self.lock = threading.Lock()

    def _claim_asked(self, ask: ReadyAsk) -> Any:
        with self.lock:
            self.times.append(ask.now)
        return super()._claim_asked(ask)

    def claimable(
        self,
        now: datetime,
        limit: int = 100,
        *,
        status: RunStatus | None = None,
        skip: int = 0,
    ) -> list[RunInfo]:
        with self.lock:
            self.times.append(now)
        return super().claimable(now, limit, status=status, skip=skip)


@pytest.mark.parametrize("offset", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_worker_judges_what_is_due_on_the_store_clock(offset: timedelta) -> None:
    """A worker on a host hours off asks for the runs due by the store's time, so it
    neither takes a sleeping run early nor leaves a due one for hours; the sleeping
    run it was given stays asleep."""
    store = _SeenClaims()
    with pytest.raises(Suspended):
        stepstone.run("nap", SLEEPING, store)
    asleep = store.load("nap")
    assert asleep is not None and asleep.status == "waiting"
    with use_clock(ClockAhead(offset)):
        worker = Worker(store, [SLEEPING], poll=0.02)
        thread = threading.Thread(target=worker.serve)
        thread.start()
        try:
            until("three claim queries", lambda: len(store.times) >= 3)
        finally:
            worker.stop()
            thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "the worker did not stop"
    real = datetime.now(UTC)
    with store.lock:
        seen = list(store.times)
    assert seen and all(abs(at - real) < NEAR for at in seen), (seen, real)
    after = store.load("nap")
    assert after is not None and after.status == "waiting" and after.version == asleep.version


DEADLINED = Workflow("dl", [WaitFor("go", "go"), Step("after", _after)], deadline=WAIT)


@stepstone.workflow("code-dl")
def code_deadlined(ctx: Any, input: State) -> Any:
    """A signal to wait for, under the run's deadline (``start(deadline=)``)."""
    return ctx.wait_for("go")


@pytest.mark.parametrize("kind", ["steps", "code"])
def test_a_deadline_counts_on_the_store_clock(store: Store, mode: str, kind: str) -> None:
    """A deadline fixed by a host 3 h behind falls ten minutes from the store's now, and a
    host 3 h ahead resuming the run before then does not fail it."""
    flow: Any = DEADLINED if kind == "steps" else code_deadlined
    if kind == "code":
        stepstone.start(store, code_deadlined, "r", deadline=WAIT)
    real = datetime.now(UTC)
    with use_clock(ClockAhead(-SKEW)):
        _suspends("r", flow, store, mode)
    waiting = store.load("r")
    assert waiting is not None and waiting.timing is not None
    fixed = datetime.fromisoformat(waiting.timing["deadline_at"])
    assert _near(fixed, real + WAIT), (fixed, real + WAIT)
    stepstone.signal(store, "r", "go", {"ok": True})
    with use_clock(ClockAhead(SKEW)):
        state = _run("r", flow, store, mode)
    if kind == "steps":
        assert state == {"go": {"ok": True}, "after": True}
    else:
        assert state["result"] == {"ok": True}


UNTIMED = Workflow("untimed", [WaitFor("go", "go"), Step("after", _after)])


@stepstone.workflow("code-untimed")
def code_untimed(ctx: Any, input: State) -> Any:
    """A signal to wait for, with no timeout."""
    return ctx.wait_for("go")


@pytest.mark.parametrize("flow", [UNTIMED, code_untimed], ids=["WaitFor", "ctx.wait_for"])
def test_a_wait_without_a_timeout_never_times_out(store: Store, mode: str, flow: Any) -> None:
    """A past wake time on a wait with no timeout (a run deadline's, which the core acts
    on) leaves the run waiting for its signal; it never failed with a ``TypeError``
    formatting the missing timeout."""
    _suspends("r", flow, store, mode)
    waiting = store.load("r")
    assert waiting is not None and waiting.status == "waiting"
    store.save(replace(waiting, wake_at=datetime.now(UTC) - timedelta(hours=1)))
    again = _suspends("r", flow, store, mode)
    assert again.waiting_for == "signal go"
    stepstone.signal(store, "r", "go", {"ok": True})
    state = _run("r", flow, store, mode)
    assert (state["go"] if flow is UNTIMED else state["result"]) == {"ok": True}
