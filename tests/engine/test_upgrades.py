"""Version upgrades: runs of an old workflow version moved onto a new one at a step boundary.

- A worker serves several versions of one workflow at once, each run by its own steps.
- ``Workflow(..., version="3", upgrades={"2": fn})``: a worker serving version 3 claims
  a run of version 2 with the upgraded record (version 3, state ``fn(state)``) as its
  claim, one compare-and-swap; ``stepstone.upgrade`` does it for one run explicitly.
- Refused, with nothing written, when the completed steps are not the new version's
  first steps (the error names the step) or when ``fn`` raises.
- Mixed fleets: a version-2 worker never takes a run upgraded to version 3.
- A worker SIGKILLed at the claim of an upgrade leaves the run whole.

Every behaviour runs on every backend, sync and async (the crash test on the durable
backends).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import stepstone
from child_process import TESTS
from cli_support import cli
from fresh_stores import BACKENDS, fresh_config
from stepstone import (
    InvalidState,
    InvalidWorkflow,
    Map,
    RunNotActive,
    RunOwned,
    Sleep,
    Step,
    StepContext,
    Store,
    Suspended,
    WaitFor,
    Worker,
    Workflow,
    WorkflowChanged,
    _upgrade,
    open_store,
)
from stepstone._checkpoint import Checkpoint, utcnow
from stepstone.testing import FakeClock
from stepstone.testing._barrier import WAIT_TIMEOUT
from waiting import until

SRC = str(Path(stepstone.__file__).resolve().parents[1])
#: A child imports this module, and through it the helper modules of the tests.
CHILD_PATH = os.pathsep.join([SRC, TESTS, str(Path(__file__).resolve().parent)])
DURABLE = BACKENDS[1:]
MODES = ("sync", "async")
State = dict[str, Any]

# --- the workflows: version 2, and version 3 that upgrades it -----------------------------

#: Steps executed in this process, per run: "VERSION:STEP" (the crash child has its own).
EXECUTED: dict[str, list[str]] = {}
_EXECUTED_LOCK = threading.Lock()
#: Calls of the upgrade functions, by name.
UPGRADE_CALLS: Counter[str] = Counter()


def _note(ctx: StepContext, what: str) -> None:
    with _EXECUTED_LOCK:
        EXECUTED.setdefault(ctx.run_id, []).append(what)


def _fetch_v2(state: State, ctx: StepContext) -> State:
    _note(ctx, "2:fetch")
    return {"rows": [1, 2, 3]}


def _publish_v2(state: State, ctx: StepContext) -> State:
    _note(ctx, "2:publish")
    return {"published": "v2", "count": len(state["rows"])}


def _fetch_v3(state: State, ctx: StepContext) -> State:
    # The same step name with a new function: a name is what a record says was done.
    _note(ctx, "3:fetch")
    return {"items": [1, 2, 3]}


def _review_v3(state: State, ctx: StepContext) -> State:
    _note(ctx, "3:review")
    return {"reviewed": len(state["items"])}


def _publish_v3(state: State, ctx: StepContext) -> State:
    _note(ctx, "3:publish")
    return {"published": "v3", "count": len(state["items"])}


def to_v3(state: State) -> State:
    """Version 3 calls the rows items and records its schema."""
    UPGRADE_CALLS["to_v3"] += 1
    new = dict(state)
    if "rows" in new:
        new["items"] = new.pop("rows")
    new["schema"] = 3
    return new


def broken(state: State) -> State:
    """An upgrade function with a bug."""
    UPGRADE_CALLS["broken"] += 1
    raise ValueError("no column 'rows' in this state")


V2 = Workflow(
    "report",
    [Step("fetch", _fetch_v2), WaitFor("approve", "go"), Step("publish", _publish_v2)],
    version="2",
)
V3_STEPS = [
    Step("fetch", _fetch_v3),
    WaitFor("approve", "go"),
    Step("review", _review_v3),
    Step("publish", _publish_v3),
]
V3 = Workflow("report", V3_STEPS, version="3", upgrades={"2": to_v3})
#: Version 3 with the completed step "fetch" renamed: runs of version 2 cannot move.
V3_RENAMED = Workflow(
    "report", [Step("download", _fetch_v3), *V3_STEPS[1:]], version="3", upgrades={"2": to_v3}
)
V3_BROKEN = Workflow("report", V3_STEPS, version="3", upgrades={"2": broken})
#: What ``stepstone runs upgrade`` and the crash test's child import.
WORKFLOWS = [V3]

APPROVAL = {"ok": True}
#: A version-2 run that completed "fetch", upgraded and finished by version 3.
UPGRADED_END = {
    "items": [1, 2, 3],
    "schema": 3,
    "approve": APPROVAL,
    "reviewed": 3,
    "published": "v3",
    "count": 3,
}
V2_END = {"rows": [1, 2, 3], "approve": APPROVAL, "published": "v2", "count": 3}


# --- stores, workers, waiting -------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture(params=DURABLE)
def durable_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend another process can open."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture
def store(store_config: str) -> Iterator[Store]:
    """The store under test, opened by the test itself."""
    with open_store(store_config) as opened:
        yield opened


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``sync``: ``serve``, ``run``, ``upgrade``; ``async``: ``aserve``, ``arun``, ``aupgrade``."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _fresh_counts_and_logs() -> Iterator[None]:
    """Count each test's steps and upgrades alone; let the stepstone logs reach caplog.

    The CLI, run in-process, points the stepstone logger at stderr only: undone after.
    """
    EXECUTED.clear()
    UPGRADE_CALLS.clear()
    logger = logging.getLogger("stepstone")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    logger.propagate = True
    yield
    logger.handlers[:], logger.propagate, logger.level = saved


class Serving:
    """A Worker of ``workflows`` in a thread, on its own store opened from ``config``.

    ``looks`` counts the worker's reads of the claim index (``claimable``/``aclaimable``).
    """

    def __init__(
        self, config: str, workflows: list[Workflow], mode: str, lease: float = 30.0
    ) -> None:
        self.config = config
        self.workflows = workflows
        self.mode = mode
        self.lease = lease
        self.looks = 0
        self.worker: Worker | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"{mode} worker {workflows}")

    def _count(self, store: Store) -> None:
        name = "claimable" if self.mode == "sync" else "aclaimable"
        real = getattr(store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.looks += 1
            return real(*args, **kwargs)

        async def acounted(*args: Any, **kwargs: Any) -> Any:
            self.looks += 1
            return await real(*args, **kwargs)

        setattr(store, name, counted if self.mode == "sync" else acounted)

    def _main(self) -> None:
        try:
            if self.mode == "async":

                async def serve() -> None:
                    async with open_store(self.config) as store:
                        self._count(store)
                        self.worker = Worker(store, self.workflows, poll=0.01, lease=self.lease)
                        self.ready.set()
                        await self.worker.aserve()

                asyncio.run(serve())
            else:
                with open_store(self.config) as store:
                    self._count(store)
                    self.worker = Worker(store, self.workflows, poll=0.01, lease=self.lease)
                    self.ready.set()
                    self.worker.serve()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread by __exit__
            self.error = exc
            self.ready.set()

    def __enter__(self) -> Serving:
        self.thread.start()
        assert self.ready.wait(WAIT_TIMEOUT), f"the {self.mode} worker did not start"
        assert self.worker is not None, f"the {self.mode} worker failed: {self.error!r}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.thread.join(WAIT_TIMEOUT)
        assert not self.thread.is_alive(), f"the {self.mode} worker did not stop"
        if self.error is not None:
            raise self.error


def _run(store: Store, run_id: str, workflow: Workflow, mode: str) -> State:
    if mode == "sync":
        return stepstone.run(run_id, workflow, store)
    return asyncio.run(stepstone.arun(run_id, workflow, store))


def _upgrade_one(store: Store, run_id: str, workflow: Workflow, mode: str) -> Checkpoint:
    if mode == "sync":
        return stepstone.upgrade(store, run_id, workflow)
    return asyncio.run(stepstone.aupgrade(store, run_id, workflow))


def _waiting_v2(store: Store, run_id: str, mode: str) -> Checkpoint:
    """Record a version-2 run that completed "fetch" and waits for the signal "go"."""
    with pytest.raises(Suspended):
        _run(store, run_id, V2, mode)
    cp = store.load(run_id)
    assert cp is not None and cp.status == "waiting" and cp.step_names == ("fetch",)
    return cp


def _done(store: Store, run_id: str) -> Callable[[], bool]:
    def check() -> bool:
        cp = store.load(run_id)
        return cp is not None and cp.status == "done"

    return check


def _claims_first(store: Store) -> bool:
    """Whether workers claim unowned runs in one call (``Store.claim_ready``) on ``store``.

    There a worker claims a run of an old version before it can judge its upgrade: a
    refused one is given back (claimed and released: two writes, the state, steps and
    version untouched), not left unread; one that moves is upgraded by a second,
    fenced write. Elsewhere the upgraded record is the claim, and a refusal writes
    nothing.
    """
    return bool(getattr(type(store), "claims_in_one_call", False))


def _same_run(after: Checkpoint, before: Checkpoint, store: Store) -> None:
    """Assert that a worker that refused to upgrade ``before`` left it as it was."""
    if not _claims_first(store):
        assert after == before and after.version == before.version
        return
    assert after.owner is None
    assert (after.workflow_version, after.state, after.step_names, after.signals) == (
        before.workflow_version,
        before.state,
        before.step_names,
        before.signals,
    )
    assert (after.waiting_for, after.consumed, after.attempt) == (
        before.waiting_for,
        before.consumed,
        before.attempt,
    )


def _loaded(store: Store, run_id: str) -> Checkpoint:
    cp = store.load(run_id)
    assert cp is not None, f"run {run_id!r} is missing"
    return cp


# --- serving several versions -------------------------------------------------------------


def test_a_worker_serves_several_versions_at_once(
    store: Store, store_config: str, mode: str
) -> None:
    """``Worker(store, [v2, v3])`` runs each version's runs with that version's own steps."""
    stepstone.start(store, V2, "old", {})
    stepstone.start(store, V3, "new", {})
    for run_id in ("old", "new"):
        stepstone.signal(store, run_id, "go", APPROVAL)
    with Serving(store_config, [V2, V3], mode):
        until("both runs to finish", lambda: _done(store, "old")() and _done(store, "new")())
    old, new = _loaded(store, "old"), _loaded(store, "new")
    assert (old.workflow_version, old.state) == ("2", V2_END)
    assert new.workflow_version == "3" and new.state["published"] == "v3"
    assert "schema" not in new.state  # a version served as itself is never upgraded
    assert EXECUTED["old"] == ["2:fetch", "2:publish"]


# --- a worker upgrades what it claims -----------------------------------------------------


def test_a_waiting_run_is_upgraded_by_a_worker_of_the_new_version(
    store: Store, store_config: str, mode: str
) -> None:
    """A v2 run waiting on a signal finishes with v3's remaining steps and fn's state."""
    _waiting_v2(store, "r", mode)
    EXECUTED.pop("r", None)
    with Serving(store_config, [V3], mode):
        stepstone.signal(store, "r", "go", APPROVAL)
        until("the upgraded run to finish", _done(store, "r"))
    cp = _loaded(store, "r")
    assert (cp.workflow, cp.workflow_version) == ("report", "3")
    assert cp.state == UPGRADED_END
    assert cp.step_names == ("fetch", "approve", "review", "publish")
    assert EXECUTED["r"] == ["3:review", "3:publish"]  # fetch is not run again


def test_a_queued_run_is_upgraded_before_its_first_step(
    store: Store, store_config: str, mode: str
) -> None:
    """A v2 run still queued runs every step of v3, from fn of its input."""
    stepstone.start(store, V2, "q", {"customer": 7})
    stepstone.signal(store, "q", "go", APPROVAL)
    with Serving(store_config, [V3], mode):
        until("the queued run to finish", _done(store, "q"))
    cp = _loaded(store, "q")
    assert cp.workflow_version == "3"
    assert cp.state == {**UPGRADED_END, "customer": 7}
    assert cp.input == {"customer": 7}  # the input is what it was started with


def test_upgrade_moves_one_run_explicitly(store: Store, store_config: str, mode: str) -> None:
    """``upgrade`` rewrites a waiting run (same wait kept); a second call writes nothing."""
    before = _waiting_v2(store, "r", mode)
    stepstone.signal(store, "r", "early", {"x": 1})  # another signal: kept as it is
    upgraded = _upgrade_one(store, "r", V3, mode)
    assert upgraded.workflow_version == "3" and upgraded.status == "waiting"
    assert upgraded.state == {"items": [1, 2, 3], "schema": 3}
    assert upgraded.waiting_for == before.waiting_for == "signal go"
    assert [s.name for s in upgraded.signals] == ["early"]
    assert upgraded.total_steps == 4 and upgraded.owner is None
    again = _upgrade_one(store, "r", V3, mode)
    assert again.version == upgraded.version  # upgraded already: nothing written
    stepstone.signal(store, "r", "go", APPROVAL)
    assert _run(store, "r", V3, mode) == UPGRADED_END
    with pytest.raises(RunNotActive, match="done"):
        _upgrade_one(
            store, "r", Workflow("report", V3_STEPS, version="4", upgrades={"3": to_v3}), mode
        )


def test_direct_run_with_the_new_version_is_refused_until_upgraded(store: Store, mode: str) -> None:
    """``run`` never upgrades by itself: a v2 run given v3 is refused, nothing written."""
    before = _waiting_v2(store, "r", mode)
    stepstone.signal(store, "r", "go", APPROVAL)
    signalled = _loaded(store, "r")
    with pytest.raises(WorkflowChanged, match="version '2'"):
        _run(store, "r", V3, mode)
    assert _loaded(store, "r").version == signalled.version != before.version


# --- a run whose owner died -----------------------------------------------------------


def _die(state: State, ctx: StepContext) -> State:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("SIGKILL did not end the process")


def _stall(state: State, ctx: StepContext) -> State:
    if not STALL_RELEASE.wait(WAIT_TIMEOUT):
        raise AssertionError("the test never released the owner's step")
    return state


#: Version 2 whose last step kills its process (the crash test's owner dies in it)...
V2_DYING = Workflow(
    "report",
    [Step("fetch", _fetch_v2), WaitFor("approve", "go"), Step("publish", _die)],
    version="2",
)
#: ... or waits for the test (a live owner, renewing its lease meanwhile).
V2_STALLING = Workflow(
    "report",
    [Step("fetch", _fetch_v2), WaitFor("approve", "go"), Step("publish", _stall)],
    version="2",
)
STALL_RELEASE = threading.Event()

_DYING_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import stepstone
    from stepstone import open_store
    from test_upgrades import V2_DYING

    config, mode = sys.argv[1:3]
    with open_store(config) as store:
        # A ten-minute lease: a takeover that waited it out would time the test out.
        if mode == "async":
            asyncio.run(stepstone.arun("r", V2_DYING, store, lease=600))
        else:
            stepstone.run("r", V2_DYING, store, lease=600)
    """
)


@pytest.mark.crash
def test_upgrade_takes_over_at_once_a_run_whose_owner_was_killed(
    request: pytest.FixtureRequest, tmp_path: Path, mode: str
) -> None:
    """An owner SIGKILLed mid-step on this machine no longer blocks ``upgrade``: the run
    moves to version 3 at once, unowned, and finishes there. (The rule is the backends'
    shared code: one durable backend shows it.)"""
    config = fresh_config("sqlite", request, tmp_path)
    with open_store(config) as store:
        _waiting_v2(store, "r", mode)
        stepstone.signal(store, "r", "go", APPROVAL)
    child = subprocess.run(
        [sys.executable, "-c", _DYING_CHILD, config, mode],
        env={**os.environ, "PYTHONPATH": CHILD_PATH},
        timeout=WAIT_TIMEOUT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    with open_store(config) as store:  # reopened from its config string
        held = _loaded(store, "r")
        assert held.owner is not None and held.status == "running", held
        assert held.workflow_version == "2" and held.step_names == ("fetch", "approve")
        upgraded = _upgrade_one(store, "r", V3, mode)
        assert upgraded.workflow_version == "3" and upgraded.owner is None
        assert upgraded.step_names == held.step_names and upgraded.version != held.version
        assert _run(store, "r", V3, mode) == UPGRADED_END


def _held_elsewhere(store: Store, mode: str, lease: float) -> Checkpoint:
    """A signalled version-2 run made to look held by a process of another machine (whose
    death this one cannot see) that stopped renewing its ``lease`` just now."""
    _waiting_v2(store, "r", mode)
    stepstone.signal(store, "r", "go", APPROVAL)
    signalled = _loaded(store, "r")
    stalled = replace(
        signalled,
        owner="worker:elsewhere:4242:-:0badc0de",
        epoch=signalled.epoch + 1,
        lease=lease,
        renewed_at=utcnow(),
    )
    return store.save(stalled)


def test_upgrade_takes_over_a_run_whose_lease_expired_unrenewed(store: Store, mode: str) -> None:
    """An owner of another machine (whose death this one cannot see) that wrote nothing
    for its whole lease no longer blocks ``upgrade``; the upgraded run finishes."""
    held = _held_elsewhere(store, mode, lease=0.3)
    assert held.owner is not None
    upgraded = _upgrade_one(store, "r", V3, mode)
    assert upgraded.workflow_version == "3" and upgraded.owner is None
    assert upgraded.epoch == held.epoch  # the epoch stays: the dead owner is fenced
    assert _run(store, "r", V3, mode) == UPGRADED_END


def test_upgrade_under_a_fake_clock_waits_out_a_lease_in_fake_time(store: Store, mode: str) -> None:
    """Under a ``FakeClock`` the watch of another host's lease pauses on that clock (as a
    run's pauses do), so a 30 s lease runs out in fake time instead of never."""
    outcome: dict[str, Checkpoint] = {}
    with FakeClock(datetime(2030, 1, 1, tzinfo=UTC)):
        _held_elsewhere(store, mode, lease=30.0)
        thread = threading.Thread(
            target=lambda: outcome.setdefault("cp", _upgrade_one(store, "r", V3, mode)),
            daemon=True,
        )
        thread.start()
        # Milliseconds of work in fake time; a quarter of the per-test timeout, so that
        # a hang fails here, naming what hung.
        thread.join(WAIT_TIMEOUT / 4)
        assert not thread.is_alive(), "upgrade hung watching a lease the fake clock never ran out"
    assert outcome["cp"].workflow_version == "3" and outcome["cp"].owner is None


def test_a_live_owner_still_blocks_upgrade(store: Store, mode: str) -> None:
    """An owner renewing its lease while ``upgrade`` watches refuses it, saying what to do;
    nothing is written, and the owner finishes its version-2 run."""
    _waiting_v2(store, "r", mode)
    stepstone.signal(store, "r", "go", APPROVAL)
    STALL_RELEASE.clear()
    outcome: dict[str, Any] = {}

    def owner() -> None:
        # A lease of 1.5 s: the owner renews every ~0.5 s while its step runs.
        outcome["result"] = stepstone.run("r", V2_STALLING, store, lease=1.5)

    thread = threading.Thread(target=owner)
    thread.start()
    try:
        until("the owner to claim the run", lambda: _loaded(store, "r").owner is not None)
        with pytest.raises(RunOwned, match="being executed by .*try again once it waits"):
            _upgrade_one(store, "r", V3, mode)
        assert _loaded(store, "r").workflow_version == "2"
    finally:
        STALL_RELEASE.set()
        thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "the owner did not finish"
    assert outcome["result"] == {"rows": [1, 2, 3], "approve": APPROVAL}


# --- refusals ----------------------------------------------------------------------------


def test_steps_that_do_not_line_up_are_refused_naming_the_step(
    store: Store, store_config: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A renamed completed step: refused by ``upgrade`` and left by a worker, unchanged."""
    _waiting_v2(store, "r", mode)
    stepstone.signal(store, "r", "go", APPROVAL)
    before = _loaded(store, "r")
    with pytest.raises(WorkflowChanged) as info:
        _upgrade_one(store, "r", V3_RENAMED, mode)
    message = str(info.value)
    assert "'fetch'" in message and "'download'" in message and "position 0" in message
    assert info.value.position == 0
    assert _loaded(store, "r") == before and _loaded(store, "r").version == before.version
    with (
        caplog.at_level(logging.WARNING, logger="stepstone"),
        Serving(store_config, [V3_RENAMED], mode),
    ):
        until(
            "the worker to refuse the upgrade and leave the run",
            lambda: "not upgraded" in caplog.text and _loaded(store, "r").owner is None,
        )
    assert "'download'" in caplog.text
    _same_run(_loaded(store, "r"), before, store)


def test_an_upgrade_function_that_raises_leaves_the_run_untouched(
    store: Store, store_config: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``fn`` raising writes nothing (same version token, every field equal), not in a loop."""
    _waiting_v2(store, "r", mode)
    stepstone.signal(store, "r", "go", APPROVAL)
    before = _loaded(store, "r")
    UPGRADE_CALLS.clear()
    with pytest.raises(WorkflowChanged, match="raised ValueError") as info:
        _upgrade_one(store, "r", V3_BROKEN, mode)
    assert isinstance(info.value.__cause__, ValueError)
    with (
        caplog.at_level(logging.WARNING, logger="stepstone"),
        Serving(store_config, [V3_BROKEN], mode) as serving,
    ):
        until(
            "the worker to leave the run",
            lambda: "not upgraded" in caplog.text and _loaded(store, "r").owner is None,
        )
        looked = serving.looks
        until("20 more looks at the claim index", lambda: serving.looks >= looked + 20)
    # Once by upgrade(), once by the worker: left for a while, not retried every poll.
    assert UPGRADE_CALLS["broken"] == 2
    _same_run(_loaded(store, "r"), before, store)


def test_an_upgrade_returning_a_non_json_state_is_refused(store: Store, mode: str) -> None:
    """A state that is not JSON is refused with its path; nothing is written."""
    before = _waiting_v2(store, "r", mode)
    bad = Workflow("report", V3_STEPS, version="3", upgrades={"2": lambda s: {**s, "x": {1}}})
    with pytest.raises(InvalidState, match="upgrade") as info:
        _upgrade_one(store, "r", bad, mode)
    assert info.value.path == "state['x']"
    assert _loaded(store, "r").version == before.version


# --- mixed fleets ------------------------------------------------------------------------


def test_a_v2_worker_never_takes_a_run_upgraded_to_v3(
    store: Store, store_config: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgraded run that is due is left by a v2-only worker (logged), finished by v3."""
    _waiting_v2(store, "r", mode)
    _upgrade_one(store, "r", V3, mode)
    stepstone.signal(store, "r", "go", APPROVAL)
    due = _loaded(store, "r")
    with (
        caplog.at_level(logging.WARNING, logger="stepstone"),
        Serving(store_config, [V2], mode) as serving,
    ):
        until("20 looks of the v2 worker at the claim index", lambda: serving.looks >= 20)
        if not _claims_first(store):  # claiming in one call, it never even loads the run
            until("the v2 worker to log it", lambda: "not served by this worker" in caplog.text)
            assert "version '3'" in caplog.text
    assert _loaded(store, "r").version == due.version
    with Serving(store_config, [V3], mode):
        until("the v3 worker to finish it", _done(store, "r"))
    assert _loaded(store, "r").state == UPGRADED_END


def test_v2_and_v3_workers_share_a_store_safely(store: Store, store_config: str, mode: str) -> None:
    """Both serving at once: each run ends wholly v2 or upgraded to v3, never a mix."""
    ids = [f"mixed-{i}" for i in range(8)]
    for run_id in ids:
        stepstone.start(store, V2, run_id, {})
        stepstone.signal(store, run_id, "go", APPROVAL)
        EXECUTED.pop(run_id, None)
    with Serving(store_config, [V2], mode), Serving(store_config, [V3], mode):
        until("every run to finish", lambda: all(_done(store, r)() for r in ids))
    for run_id in ids:
        cp = _loaded(store, run_id)
        steps = EXECUTED[run_id]
        if cp.workflow_version == "2":
            assert cp.state == V2_END and steps == ["2:fetch", "2:publish"], run_id
        else:
            assert cp.workflow_version == "3", run_id
            assert cp.state["published"] == "v3" and cp.state["schema"] == 3, run_id
            # Upgraded at the claim before its first step, or after v2's fetch: then
            # only v3's steps follow.
            assert steps in (
                ["3:fetch", "3:review", "3:publish"],
                ["2:fetch", "3:review", "3:publish"],
            ), (run_id, steps)


# --- the rules, without a store ----------------------------------------------------------


def test_workflow_checks_its_upgrades() -> None:
    """Bad ``upgrades`` are refused when the Workflow is made, saying what is allowed."""
    steps = [Step("a", lambda s: None)]
    with pytest.raises(InvalidWorkflow, match="no version"):
        Workflow("w", steps, upgrades={"1": to_v3})
    with pytest.raises(InvalidWorkflow, match="from itself"):
        Workflow("w", steps, version="2", upgrades={"2": to_v3})
    with pytest.raises(InvalidWorkflow, match="non-empty str"):
        Workflow("w", steps, version="2", upgrades={1: to_v3})  # type: ignore[dict-item]
    with pytest.raises(InvalidWorkflow, match="not async"):

        async def later(state: State) -> State:
            return state

        Workflow("w", steps, version="2", upgrades={"1": later})  # type: ignore[dict-item]
    with pytest.raises(InvalidWorkflow, match="dict of old version"):
        Workflow("w", steps, version="2", upgrades=[("1", to_v3)])  # type: ignore[arg-type]
    unversioned = Workflow("w", steps, version="2", upgrades={None: to_v3})
    assert None in unversioned.upgrades and "upgrades from None" in repr(unversioned)


def test_two_workflows_upgrading_one_version_are_refused(store: Store) -> None:
    """A worker given two versions that both upgrade version 2 refuses to start."""
    v4 = Workflow("report", V3_STEPS, version="4", upgrades={"2": to_v3})
    with pytest.raises(InvalidWorkflow, match="both upgrade runs of version '2'"):
        Worker(store, [V3, v4])
    Worker(store, [V2, V3, v4])  # version 2 served as itself: no upgrade to choose


def test_a_wait_for_something_else_starts_afresh() -> None:
    """The new version's step at the boundary keeps the wait only if it waits alike."""
    waiting = Checkpoint(
        "r",
        step=0,
        state={"rows": [1]},
        step_names=("fetch",),
        total_steps=3,
        workflow="report",
        workflow_version="2",
        waiting_for="signal go",
        wake_at=stepstone._checkpoint.utcnow() + timedelta(hours=1),
        attempt=1,
    )
    kept = _upgrade.upgraded(waiting, V3)
    assert (kept.waiting_for, kept.wake_at, kept.attempt) == ("signal go", waiting.wake_at, 1)
    other = Workflow(
        "report",
        [Step("fetch", _fetch_v3), WaitFor("approve", "ok"), Step("review", _review_v3)],
        version="3",
        upgrades={"2": to_v3},
    )
    fresh = _upgrade.upgraded(waiting, other)
    assert (fresh.waiting_for, fresh.wake_at, fresh.attempt) == (None, None, 0)
    assert fresh.status == "running" and fresh.owner is None  # a worker claims it at once
    sleeping = stepstone._checkpoint.evolve(waiting, waiting_for="timer")
    nap = Workflow(
        "report",
        [Step("fetch", _fetch_v3), Sleep("nap", duration=60)],
        version="3",
        upgrades={"2": to_v3},
    )
    assert _upgrade.upgraded(sleeping, nap).wake_at == waiting.wake_at  # the timer runs on


def test_children_in_flight_need_the_same_map() -> None:
    """A run at a Map with children moves only onto a version with that Map there."""
    child = Workflow("child", [Step("c", lambda s: None)])
    parent = Checkpoint(
        "p",
        step=0,
        step_names=("fetch",),
        total_steps=3,
        workflow="report",
        workflow_version="2",
        waiting_for="children 0 of 1",
        children=("p/fan/0",),
    )
    with pytest.raises(WorkflowChanged, match="1 child runs in flight"):
        _upgrade.upgraded(parent, V3)
    fan = Workflow(
        "report",
        [Step("fetch", _fetch_v3), Map("fan", child, lambda s: [{}])],
        version="3",
        upgrades={"2": to_v3},
    )
    assert _upgrade.upgraded(parent, fan).children == ("p/fan/0",)


# --- the command line --------------------------------------------------------------------


def test_cli_upgrades_one_run(store: Store, store_config: str) -> None:
    """``stepstone runs upgrade RUN_ID --workflows M:A`` moves it; refusals exit 1."""
    _waiting_v2(store, "r", "sync")
    _waiting_v2(store, "bad", "sync")
    spec = "test_upgrades:WORKFLOWS"
    code, out, err = cli("--store", store_config, "runs", "upgrade", "r", "--workflows", spec)
    assert code == 0, err
    assert "from version '2' to '3'" in out
    assert _loaded(store, "r").state == {"items": [1, 2, 3], "schema": 3}
    code, out, err = cli(
        "--store", store_config, "--json", "runs", "upgrade", "r", "--workflows", spec
    )
    assert code == 0, err
    assert json.loads(out)["upgraded"] is False
    code, out, err = cli(
        "--store", store_config, "runs", "upgrade", "bad", "--workflows", "test_upgrades:V4_ONLY"
    )
    assert code == 2 and "no workflow 'report' that upgrades version '2'" in err
    assert "'4' (from '3')" in err
    code, out, err = cli("--store", store_config, "runs", "upgrade", "nope", "--workflows", spec)
    assert code == 1 and "no run 'nope'" in err


#: A version that upgrades version 3 only: nothing in it moves a version-2 run.
V4_ONLY = [Workflow("report", V3_STEPS, version="4", upgrades={"3": to_v3})]


# --- crashes -----------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from stepstone import Worker, open_store
    from stepstone.testing import kill_point
    from test_upgrades import WORKFLOWS

    config, point, mode = sys.argv[1:4]
    armed = []

    def act(name):
        if name == "upgrade.transformed" and point != name:
            armed.append(name)  # the upgrade is built: die inside the claim's save
        elif name == point and (armed or name in ("upgrade.transformed", "worker.claimed")):
            os.kill(os.getpid(), signal.SIGKILL)

    async def aserve():
        async with open_store(config) as store:
            await Worker(store, WORKFLOWS, poll=0.01, lease=1).aserve()

    with kill_point({"upgrade.transformed", point}, act):
        if mode == "async":
            asyncio.run(aserve())
        else:
            with open_store(config) as store:
                Worker(store, WORKFLOWS, poll=0.01, lease=1).serve()
    """
)


def _points(config: str) -> list[tuple[str, bool]]:
    """(kill point, whether the upgraded record survives a kill there) for the backend."""
    with open_store(config) as opened:
        inside = sorted(type(opened).kill_points.items())
    return [("upgrade.transformed", False), *inside, ("worker.claimed", True)]


@pytest.mark.crash
def test_a_worker_killed_at_the_claim_of_an_upgrade_leaves_the_run_whole(
    durable_config: str, mode: str
) -> None:
    """SIGKILL before, inside or after the upgrade's claim: the run is old or upgraded, whole."""
    for point, survives in _points(durable_config):
        run_id = f"crash-{point}"
        with open_store(durable_config) as store:
            old = _waiting_v2(store, run_id, mode)
            stepstone.signal(store, run_id, "go", APPROVAL)
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, durable_config, point, mode],
            env={**os.environ, "PYTHONPATH": CHILD_PATH},
            timeout=WAIT_TIMEOUT,
            check=False,
            capture_output=True,
            text=True,
        )
        assert child.returncode == -signal.SIGKILL, (point, child.stderr[-2000:])
        with open_store(durable_config) as store:
            cp = _loaded(store, run_id)
            if survives:
                assert cp.workflow_version == "3", point
                assert cp.state == to_v3(old.state) and cp.owner is not None, point
            else:
                assert cp.workflow_version == "2", point
                assert cp.state == old.state, point
                # Claimed in one call before the upgrade was built, else never claimed.
                assert (cp.owner is not None) == _claims_first(store), point
            assert cp.step_names == old.step_names, point
        # A fresh worker, on the store reopened from its config string, finishes it
        # (taking over from the dead owner once its one-second lease has passed).
        with open_store(durable_config) as store, Serving(durable_config, [V3], mode):
            until(f"the run killed at {point} to finish", _done(store, run_id))
            assert _loaded(store, run_id).state == UPGRADED_END, point
