"""Hardening III, the claim index and lease expiry (issue 23, items 1, 3, 4 and 6).

- A waiting run holding an unconsumed signal it waits for is always due: an owner
  killed after its wait was re-based on a signal (or after re-claiming to consume it)
  leaves a run that a worker in another process finishes.
- Claims page past runs the worker does not serve (another workflow, a retired
  version, other workflows' signalled waiting runs), also on a third-party store
  written to the old ``claimable(now, limit)``.
- An owner whose wall clock is a day ahead, SIGKILLed with more runs in flight than a
  page of the claim index, is taken over: every running run reaches the watch.
- Signals arriving every 0.3 s for a dead owner's run (lease 1 s) do not keep it
  alive: expiry counts only the owner's own writes.
"""

from __future__ import annotations

import asyncio
import signal as signals
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from child_process import reap, spawn, stderr_of
from fresh_stores import BACKENDS, DURABLE_BACKENDS, fresh_config
from stepstone import (
    RunOwned,
    Step,
    Store,
    WaitFor,
    Worker,
    Workflow,
    _lease,
    arun,
    open_store,
    run,
    signal,
    start,
)
from stepstone._checkpoint import DUE_NOW, Checkpoint, Signal, evolve, utcnow
from stepstone._store import RunInfo
from stepstone.stores.memory import MemoryStore
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.worker import _claims
from stepstone.worker._watch import Watch
from waiting import status_of, until
from worker_support import serving

DURABLE = DURABLE_BACKENDS
MODES = ("sync", "async")
POINTS = ("wait-saved", "reclaimed")
State = dict[str, Any]


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


def bulk(config: str) -> str:
    """``config`` without a sync to disk per save, for tests that write hundreds of runs.

    Durability is not what they pin; the crash tests keep each backend's default.
    """
    if config.startswith("file://"):
        return f"{config}?durability=none"
    if config.startswith("sqlite://"):
        return f"{config}?synchronous=normal"
    return config


# --- 1: a WaitFor run stranded by a crash --------------------------------------------------


def _first(state: State) -> State:
    return {"a": 1}


def _last(state: State) -> State:
    return {"b": state["w"]}


APPROVAL = Workflow(
    "approval", [Step("first", _first), WaitFor("w", "go"), Step("last", _last)], version="1"
)

# The owner: runs the workflow directly (lease 1 s) on a store whose save, when the wait
# is about to be saved, first lets a signal in through another store object (so the wait
# save conflicts and is re-based on it), then dies by SIGKILL at POINT: right after the
# re-based wait landed ("wait-saved") or right after the re-claim to consume it landed
# ("reclaimed").
_STRAND = r"""
import asyncio, os, signal, sys
from stepstone import Step, WaitFor, Workflow, arun, asignal, open_store, run
from stepstone import signal as send

config, run_id, point, mode = sys.argv[1:5]
workflow = Workflow(
    "approval",
    [Step("first", lambda s: {"a": 1}), WaitFor("w", "go"), Step("last", lambda s: {"b": s["w"]})],
    version="1",
)
store, other = open_store(config), open_store(config)
sent = []

def die(saved):
    waiting = saved.waiting_for == "signal go" and bool(saved.signals)
    if waiting and (saved.owner is None) == (point == "wait-saved"):
        os.kill(os.getpid(), signal.SIGKILL)

def about_to_wait(cp):
    return cp.waiting_for == "signal go" and cp.owner is None and not sent

if mode == "sync":
    save = store.save
    def hooked(cp):
        if about_to_wait(cp):
            sent.append(send(other, run_id, "go", 42, signal_id="go-1"))
        saved = save(cp)
        die(saved)
        return saved
    store.save = hooked
    run(run_id, workflow, store, lease=1)
else:
    asave = store.asave
    async def ahooked(cp):
        if about_to_wait(cp):
            sent.append(await asignal(other, run_id, "go", 42, signal_id="go-1"))
        saved = await asave(cp)
        die(saved)
        return saved
    store.asave = ahooked
    asyncio.run(arun(run_id, workflow, store, lease=1))
sys.exit("the owner was never killed: the signal did not land during the wait save")
"""


# Both kill points in both forms on the local stores; one of each on the servers (the
# rule under test is the same code; their time is better spent elsewhere).
STRANDS = [
    *((kind, mode, point) for kind in ("file", "sqlite") for mode in MODES for point in POINTS),
    *(
        (kind, mode, point)
        for kind in DURABLE[2:]
        for mode, point in zip(MODES, POINTS, strict=True)
    ),
]


@pytest.mark.crash
@pytest.mark.parametrize(("kind", "mode", "point"), STRANDS)
def test_a_wait_stranded_by_a_killed_owner_is_finished_by_a_worker(
    kind: str, mode: str, point: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """An owner SIGKILLed after its wait was re-based on a signal leaves a due run.

    Whether it died before re-claiming to consume the signal (waiting, no owner,
    ``wake_at`` None) or after (waiting, owned by the dead process), a worker in
    another process opening the store from its config string finishes the run with the
    signal's payload.
    """
    durable_config = fresh_config(kind, request, tmp_path)
    run_id = f"strand-{point}-{mode}"
    code, err = reap(spawn(_STRAND, durable_config, run_id, point, mode), "the owner")
    assert code == -signals.SIGKILL, f"the owner was not killed at {point}: {code} {err[-2000:]}"
    with open_store(durable_config) as store:
        stranded = store.load(run_id)
        assert stranded is not None
        assert stranded.status == "waiting"
        assert [s.id for s in stranded.signals] == ["go-1"]
        assert stranded.consumed == {}
        assert (stranded.owner is None) == (point == "wait-saved")
        assert stranded.wake_at is None or point == "reclaimed"
        assert stranded.due_at == DUE_NOW, "a run with a pending signal it waits for is due"
        due = {info.run_id for info in store.claimable(utcnow())}
        assert run_id in due, "the stranded run is not in the claim index"
    with (
        serving(durable_config, [APPROVAL], mode, poll=0.05, lease=1) as worker,
        open_store(durable_config) as store,
    ):
        until(f"a worker to finish {run_id}", lambda: status_of(store, run_id) == "done")
        done = store.load(run_id)
        until("the worker to count the run done", lambda: worker.completed >= 1)
    assert done is not None
    assert done.state == {"a": 1, "w": 42, "b": 42}
    assert done.consumed == {"go": 1}


def test_a_waiting_run_with_a_pending_signal_is_always_due(store: Store) -> None:
    """A waiting run's due_at is now once it holds an unconsumed signal it waits for.

    The record a crash leaves (waiting, no owner, ``wake_at`` None, a signal received)
    is in the claim index on every backend; a signal of another name, or one already
    consumed, does not make it due.
    """
    now = utcnow()
    go = Signal("go", "id-1", 1, now)
    base = Checkpoint(
        run_id="x",
        step=0,
        step_names=("first",),
        total_steps=3,
        workflow="approval",
        workflow_version="1",
        waiting_for="signal go",
    )
    cases = [
        evolve(base, run_id="pending", signals=(go,)),
        evolve(base, run_id="other-name", signals=(Signal("no", "id-2", 1, now),)),
        evolve(base, run_id="consumed", signals=(go,), consumed={"go": 1}),
        evolve(base, run_id="timer", wake_at=now + timedelta(days=1)),
    ]
    for cp in cases:
        store.save(cp)
    due = {info.run_id for info in store.claimable(now + timedelta(seconds=1))}
    assert due == {"pending"}
    assert [i.run_id for i in store.claimable(now, status="waiting")] == ["pending"]


# --- 3: starvation behind runs a worker cannot serve ----------------------------------------


def _report(state: State) -> State:
    return {"done": True}


REPORT_V1 = Workflow("report", [Step("make", _report)], version="1")
REPORT_V2 = Workflow("report", [Step("make", _report)], version="2")


def _fill(store: Store, queued_v1: int, waiting_other: int) -> None:
    """Queue ``queued_v1`` runs of report v1 and leave ``waiting_other`` runs of another
    workflow waiting with their signal received (due now, for someone else)."""
    for i in range(queued_v1):
        start(store, REPORT_V1, f"v1-{i:04d}")
    now = utcnow()
    for i in range(waiting_other):
        store.save(
            Checkpoint(
                run_id=f"other-{i:04d}",
                total_steps=1,
                workflow="other",
                waiting_for="signal go",
                wake_at=DUE_NOW,
                signals=(Signal("go", f"s{i}", i, now),),
            )
        )


def page_size(config: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """Return the claim page size a test's in-process worker reads with.

    The real one (100) on SQLite, where hundreds of runs are cheap; 20 elsewhere, so
    the same shapes (a page and more of runs to page past) cost a fifth of the writes.
    """
    if config.startswith("sqlite"):
        return _claims._CLAIM_BATCH
    monkeypatch.setattr(_claims, "_CLAIM_BATCH", 20)
    return 20


def test_a_worker_pages_past_runs_it_does_not_serve(
    store_config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three pages of queued report v1 runs and more than a page of signalled waiting
    runs of another workflow come first in the claim index (300 and 120 at the real
    page size): a worker serving only report v2 still runs all its runs, in both
    forms, and leaves every other run as it was."""
    batch = page_size(store_config, monkeypatch)
    store_config = bulk(store_config)
    with open_store(store_config) as store:
        _pages_past(store, store_config, 3 * batch, batch + batch // 5)


def _pages_past(store: Store, store_config: str, v1: int, others: int) -> None:
    _fill(store, v1, others)
    for mode in MODES:
        ids = [f"v2-{mode}-{i}" for i in range(5)]
        for run_id in ids:
            start(store, REPORT_V2, run_id)
        with serving(store_config, [REPORT_V2], mode, poll=0.05):
            for run_id in ids:
                until(
                    f"the {mode} worker to run {run_id} past {v1 + others} runs it does not serve",
                    lambda run_id=run_id: status_of(store, run_id) == "done",  # type: ignore[misc]
                )
    infos = {info.run_id: info for info in store.list_info()}
    assert sum(1 for k, i in infos.items() if k.startswith("v1-") and i.status == "queued") == v1
    assert sum(1 for k, i in infos.items() if k.startswith("other-") and i.owner is None) == others


class _OldStore(Store):
    """A third-party store written to the previous contract: ``claimable(now, limit)``."""

    scheme = "oldclaims"

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.pages: list[int] = []

    @classmethod
    def from_config(cls, config: str) -> _OldStore:
        return cls()

    def load(self, run_id: str) -> Checkpoint | None:
        return self.inner.load(run_id)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        return self.inner.save(checkpoint)

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        return self.inner.delete(run_id, expected_version=expected_version)

    def list_runs(self) -> Iterator[str]:
        return self.inner.list_runs()

    def close(self) -> None:
        self.inner.close()

    def claimable(self, now: datetime, limit: int = 100) -> list[RunInfo]:  # type: ignore[override]
        self.pages.append(limit)
        return self.inner.claimable(now, limit)


@pytest.mark.parametrize("mode", MODES)
def test_a_store_with_the_old_claimable_signature_still_pages(mode: str) -> None:
    """A store whose ``claimable`` takes only (now, limit) is asked for longer pages
    instead of failing: a worker serving v2 runs its 5 runs behind 300 v1 runs."""
    old = _OldStore()
    _fill(old, 300, 0)
    ids = [f"v2-{i}" for i in range(5)]
    for run_id in ids:
        start(old, REPORT_V2, run_id)
    done = threading.Event()
    worker = Worker(old, [REPORT_V2], poll=0.05)

    def main() -> None:
        if mode == "async":
            asyncio.run(worker.aserve())
        else:
            worker.serve()
        done.set()

    thread = threading.Thread(target=main)
    thread.start()
    try:
        until(
            "the worker to run the v2 runs", lambda: all(status_of(old, i) == "done" for i in ids)
        )
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert done.is_set(), "the worker did not stop"
    assert max(old.pages) > 300, "the old claimable was never asked past the v1 runs"


# --- 4: an owner whose clock is a day ahead, SIGKILLed among many runs in flight ----------

# An owner: a Worker serving WORKFLOW (one step that does not return by itself) with
# LEASE, every stepstone clock SKEW days ahead; it serves until it is killed.
_OWNER = r"""
import asyncio, sys, time
from datetime import timedelta
from stepstone import Step, Worker, Workflow, open_store
from stepstone import _clock

config, mode, name, count, lease, skew = sys.argv[1:7]

def hang(state):
    time.sleep(600)

async def ahang(state):
    await asyncio.sleep(600)

workflow = Workflow(name, [Step("work", ahang if mode == "async" else hang)], version="1")
store = open_store(config)
worker = Worker(store, [workflow], concurrency=int(count), lease=float(lease), poll=0.05)


class Skewed(_clock.SystemClock):
    def now(self):
        return super().now() + timedelta(days=float(skew))

# Through the clock seam: every stepstone reader of the wall clock is skewed.
with _clock.use_clock(Skewed()):
    if mode == "async":
        asyncio.run(worker.aserve())
    else:
        worker.serve()
"""


def _work(state: State) -> State:
    return {"worked": True}


BUSY = Workflow("busy", [Step("work", _work)], version="1")


@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_a_skewed_owner_killed_among_many_runs_in_flight_is_taken_over(
    durable_config: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of an owner whose clock is a day ahead (lease 1 s), SIGKILLed while a live
    owner with a true clock holds a whole page of others (10 and 100 at the real page
    size): a true-clock worker takes every one over and finishes it, although their
    due_at (renewed_at + lease by the skewed clock) sorts them after all the live runs."""
    batch = page_size(durable_config, monkeypatch)
    durable_config = bulk(durable_config)
    held = Workflow("held", [Step("work", _work)], version="1")
    live_ids = [f"held-{i:03d}" for i in range(batch)]
    ids = [f"busy-{i:03d}" for i in range(max(5, batch // 10))]
    with open_store(durable_config) as store:
        for run_id in live_ids:
            start(store, held, run_id)
        live = spawn(_OWNER, durable_config, mode, "held", str(batch), "30", "0")
        owner: subprocess.Popen[str] | None = None
        try:
            _all_held(store, live_ids, live, "the live owner")
            for run_id in ids:
                start(store, BUSY, run_id)
            owner = spawn(_OWNER, durable_config, mode, "busy", str(len(ids)), "1", "1")
            _all_held(store, ids, owner, "the skewed owner")
            skewed = store.load(ids[-1])
            assert skewed is not None and skewed.renewed_at is not None
            assert skewed.renewed_at > utcnow() + timedelta(hours=12), "the owner's clock is true"
            owner.send_signal(signals.SIGKILL)
            reap(owner, "the killed skewed owner")
            with serving(durable_config, [BUSY], mode, concurrency=20, lease=1, poll=0.05):
                until(
                    "a true-clock worker to take over and finish the skewed owner's runs",
                    lambda: all(status_of(store, run_id) == "done" for run_id in ids),
                )
            assert all(status_of(store, run_id) == "running" for run_id in live_ids)
        finally:
            for proc in (owner, live):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signals.SIGKILL)
                    reap(proc, "an owner")
        done = store.load(ids[-1])
        assert done is not None and done.state == {"worked": True}


def _all_held(store: Store, ids: list[str], owner: subprocess.Popen[str], who: str) -> None:
    """Wait until ``owner`` holds every run of ``ids`` (running, with an owner)."""
    wanted = set(ids)

    def held() -> bool:
        assert owner.poll() is None, f"{who} died: {stderr_of(owner)[-2000:]}"
        infos = [i for i in store.list_info() if i.run_id in wanted]
        return len(infos) == len(wanted) and all(
            i.status == "running" and i.owner is not None for i in infos
        )

    until(f"{who} to claim its {len(ids)} runs", held)


# --- 6: signals do not keep a dead owner's run alive ----------------------------------------

GHOST = "worker:ghost-host:1:-:deadbeef"  # an owner that never writes again


def _held_by_a_ghost(store: Store, workflow: Workflow, run_id: str) -> None:
    """Start ``run_id`` and claim it for an owner that will never renew (lease 1 s)."""
    start(store, workflow, run_id)
    cp = store.load(run_id)
    assert cp is not None
    store.save(_lease.claimed(cp, GHOST, 1.0))


@contextmanager
def signalling(config: str, run_id: str, every: float = 0.3) -> Iterator[list[int]]:
    """Send the run a signal every ``every`` seconds from another store, until the end."""
    stop = threading.Event()
    sent: list[int] = []

    def main() -> None:
        with open_store(config) as other:
            while not stop.wait(every):
                try:
                    if signal(other, run_id, "ping", len(sent)):
                        sent.append(len(sent))
                except Exception:  # noqa: BLE001 - done: signals are refused, which ends nothing here
                    return

    thread = threading.Thread(target=main, name="signaller")
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(WAIT_TIMEOUT)


WORK = Workflow("pinged", [Step("work", _work)], version="1")


@pytest.mark.parametrize("mode", MODES)
def test_signals_do_not_keep_a_dead_owners_run_alive_for_a_worker(
    store: Store, store_config: str, mode: str
) -> None:
    """A worker takes over a run whose owner never writes again although a signal lands
    on it every 0.3 s (lease 1 s): only the owner's own writes renew a lease."""
    run_id = f"pinged-{mode}"
    _held_by_a_ghost(store, WORK, run_id)
    with signalling(store_config, run_id) as sent:
        # Two before the worker starts, not "while it watched": on a loaded machine the
        # ghost's lease may be over by then, and the worker take the run at its first look.
        until("two signals to land on the dead owner's run", lambda: len(sent) >= 2)
        with serving(store_config, [WORK], mode, lease=1, poll=0.05):
            until(
                "a worker to take over the dead owner's run while signals keep arriving",
                lambda: status_of(store, run_id) == "done",
            )
    done = store.load(run_id)
    assert done is not None and done.owner is None
    assert len(done.signals) >= 2, "the takeover lost signals the run had received"


@pytest.mark.parametrize("mode", MODES)
def test_signals_do_not_keep_a_dead_owners_run_alive_for_run(
    store: Store, store_config: str, mode: str
) -> None:
    """``run``/``arun`` on a run held by an owner that never writes again takes it over
    after one lease, rather than refusing with ``RunOwned``, while signals keep landing."""
    run_id = f"pinged-direct-{mode}"
    _held_by_a_ghost(store, WORK, run_id)
    with signalling(store_config, run_id) as sent:
        until("signals to land on the dead owner's run", lambda: len(sent) >= 1)
        try:
            if mode == "async":
                result = asyncio.run(arun(run_id, WORK, store, lease=1))
            else:
                result = run(run_id, WORK, store, lease=1)
        except RunOwned as exc:
            raise AssertionError(f"signals kept the dead owner's lease alive: {exc}") from exc
    assert result == {"worked": True}


def test_a_live_owners_own_writes_keep_its_lease(store: Store) -> None:
    """The owner's mark moves with each of its writes (claim, renewal, step save) and not
    with a signal or a cancel request, so a live owner is never taken over."""
    start(store, WORK, "live")
    cp = store.load("live")
    assert cp is not None
    claimed = store.save(_lease.claimed(cp, GHOST, 1.0))
    mark = _lease.owner_mark(claimed)
    signal(store, "live", "ping", 1)
    cp = store.load("live")
    assert cp is not None and cp.version != claimed.version
    assert _lease.owner_mark(cp) == mark, "a signal moved the owner's mark"
    renewed = store.save(_lease.renewal(cp))
    assert _lease.owner_mark(renewed) != mark, "a renewal did not move the owner's mark"


def test_the_watch_counts_only_the_owners_writes() -> None:
    """``_Watch`` (no I/O): a new version from a signal leaves the owner's age running and
    expires it after one lease; a renewal (a new renewed_at, so a new due_at) restarts it."""
    cp = _lease.claimed(Checkpoint(run_id="r", total_steps=2, version="v1"), GHOST, 1.0)
    watch = Watch()
    info = RunInfo.of(cp)
    assert watch.pick([info], set(), 0.0) == [info]  # first sight: load, to learn the lease
    assert not watch.expired(cp, 0.0)
    signalled = evolve(cp, version="v2", signals=(Signal("ping", "1", None, utcnow()),))
    assert watch.pick([RunInfo.of(signalled)], set(), 0.5) == []  # lease not over yet
    assert watch.pick([RunInfo.of(signalled)], set(), 1.0) != []
    assert watch.expired(signalled, 1.0), "a signal kept the dead owner's lease alive"
    renewed = _lease.renewal(signalled)
    assert watch.pick([RunInfo.of(renewed)], set(), 1.1) == []  # its owner wrote: watch anew
    assert watch.pick([RunInfo.of(renewed)], set(), 1.5) == []
    assert not watch.expired(renewed, 1.5)
    assert watch.expired(renewed, 2.6)


def test_the_watch_pages_on_and_starts_over() -> None:
    """``_Watch.turn``: a full page moves the place on (less what was claimed), a short one
    or full slots send the next look back to the earliest due, the page cap keeps it."""
    watch = Watch()
    full = _claims._CLAIM_BATCH
    assert watch.turn("queued", full, 3, more=True, filled=False, capped=False)
    assert watch.skip["queued"] == full - 3
    assert not watch.turn("queued", full, 0, more=True, filled=False, capped=True)
    assert watch.skip["queued"] == 2 * full - 3 and not watch.at_start()
    assert not watch.turn("queued", 7, 0, more=False, filled=False, capped=False)
    assert watch.skip["queued"] == 0
    assert watch.turn("running", full, 5, more=True, filled=False, capped=False)
    assert watch.skip["running"] == full  # a taken-over run stays running: no shift
    assert not watch.turn("waiting", full, 2, more=True, filled=True, capped=False)
    assert watch.skip["waiting"] == 0
