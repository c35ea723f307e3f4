"""The listener policy, one rule for ``serve`` and ``aserve`` (issue 30).

When a worker opens and closes its store's listener is the claim loop's rule
(``_claims.Claims._claiming``: ``Listen``, ``Unlisten``), which both drivers only
perform. The policy: not while a backlog found at start is drained; opened at the first
rest after a look that claimed nothing; a run found by an idle worker is driven with it
open; at concurrency 1 a backlog is driven with it closed; opened again once idle. These
tests pin it for both drivers on every store that pushes wake-ups, with the poll and the
back-off at 60 s, so that only a push can find a run in time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import fresh_config
from stepstone import Step, Workflow, open_store, start
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.worker import _claims
from waiting import status_of, until
from worker_support import serving

State = dict[str, Any]

#: The stores that push wake-ups across processes (``Store.pushes_wakeups``).
PUSHING = ("file", "sqlite", "postgresql")


@pytest.fixture(params=PUSHING)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store that pushes wake-ups, as a config string."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    """``serve`` (sync) or ``aserve`` (async)."""
    return str(request.param)


class _Claims:
    """The worker's claim loop, for a step to ask whether it listens, once the test has it.

    ``serving`` starts the worker before it hands it over, so a run queued earlier may
    be driven first: its step waits here for the handover (an empty box read there
    failed the step, and the run was left alone past the test's timeout).
    """

    def __init__(self) -> None:
        self._claims: _claims.Claims | None = None
        self._handed = threading.Event()

    def hand(self, claims: _claims.Claims) -> None:
        self._claims = claims
        self._handed.set()

    def pushed(self) -> bool:
        assert self._handed.wait(WAIT_TIMEOUT), "the test never handed over its worker"
        assert self._claims is not None
        return self._claims.pushed


def _marking(name: str, seen: list[bool], pushed: Callable[[], bool]) -> Workflow:
    """A one-step workflow whose step records whether the worker listens meanwhile."""

    def mark(state: State) -> State:
        seen.append(pushed())
        return {}

    return Workflow(name, [Step("mark", mark)], version="1")


def test_a_backlog_found_at_start_is_drained_before_the_worker_listens(
    config: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs queued before the worker starts are driven unheard; then it listens."""
    monkeypatch.setattr(_claims, "_QUICK", 60.0)
    listening: list[bool] = []
    box = _Claims()
    flow = _marking("policy-backlog", listening, box.pushed)
    with open_store(config) as store:
        for index in range(4):
            start(store, flow, f"early-{index}")
    with serving(config, [flow], mode, concurrency=1, poll=60.0) as worker:
        box.hand(worker._claims)
        until("the backlog to be drained", lambda: len(listening) >= 4)
        until("the worker to listen once idle", lambda: worker._claims.pushed)
        with open_store(config) as other:  # as another process would: no doorbell
            start(other, flow, "later")
            until("a run started later to be heard", lambda: status_of(other, "later") == "done")
    assert listening[:4] == [False] * 4
    assert listening[4] is True  # found by an idle worker: driven with the listener open


def test_an_idle_worker_listens_and_a_later_backlog_is_driven_unheard(
    config: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle, it listens; at concurrency 1 a backlog is driven closed; idle again, it hears."""
    monkeypatch.setattr(_claims, "_QUICK", 60.0)
    entered, release = threading.Event(), threading.Event()
    listening: list[bool] = []
    box = _Claims()

    def hold(state: State) -> State:
        entered.set()
        release.wait(WAIT_TIMEOUT)
        return {"held": True}

    gate = Workflow("policy-gate", [Step("hold", hold)], version="1")
    flow = _marking("policy-later", listening, box.pushed)
    try:
        with serving(config, [flow, gate], mode, concurrency=1, poll=60.0) as worker:
            box.hand(worker._claims)
            until("the worker to listen", lambda: worker._claims.pushed)
            with open_store(config) as other:
                start(other, gate, "gate")
                assert entered.wait(WAIT_TIMEOUT), "the worker never heard the gate's run"
                assert worker._claims.pushed  # a run found by an idle worker: kept open
                for index in range(3):
                    start(other, flow, f"backlog-{index}")
                release.set()
                until("the backlog to be drained", lambda: len(listening) >= 3)
                until("the worker to listen again", lambda: worker._claims.pushed)
                start(other, flow, "later")
                until(
                    "the run started later to finish", lambda: status_of(other, "later") == "done"
                )
    finally:
        release.set()
    assert listening[:3] == [False, False, False]


def test_a_pooled_worker_keeps_listening_through_a_backlog(
    config: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above concurrency 1 the loop may claim while runs are driven: it never closes."""
    monkeypatch.setattr(_claims, "_QUICK", 60.0)
    listening: list[bool] = []
    box = _Claims()
    flow = _marking("policy-pooled", listening, box.pushed)
    with serving(config, [flow], mode, concurrency=3, poll=60.0) as worker:
        box.hand(worker._claims)
        until("the worker to listen", lambda: worker._claims.pushed)
        with open_store(config) as other:
            for index in range(6):
                start(other, flow, f"pooled-{index}")
            until("the runs to be heard and driven", lambda: len(listening) >= 6)
    assert listening == [True] * 6
