"""Claims in one call (issue 20): ``Store.claim_ready`` and the worker that uses it.

- The record a one-call claim stores is the one the per-run path (load, then save
  ``_lease.claimed``) stores: same owner, lease, epoch + 1, renewed_at, version counter,
  the same fencing of the version it replaced, and a document that loads back equal.
- Only unowned runs that need no judgement are claimed: queued (not cancel-requested),
  waiting and due, or running with the lease given back; of a served workflow; at most
  ``limit``, earliest due first; never a run in ``exclude``.
- Workers claiming at once (threads; four processes on PostgreSQL and on MySQL/MariaDB)
  never claim one run twice, and load at most 1.2 runs per run they claim.
- Backends without the capability (file, Cosmos) refuse the call and
  keep the per-run path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS, fresh_config
from stepstone import (
    ConflictError,
    Step,
    Store,
    StoreError,
    Worker,
    Workflow,
    _lease,
    open_store,
    start,
)
from stepstone._checkpoint import Checkpoint, Signal, evolve, utcnow
from stepstone._store import Claim
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.testing._base import child_env

#: The backends that declare ``claims_in_one_call``.
ONE_CALL = frozenset({"memory", "sqlite", "postgresql", "mysql"})
MODES = ("sync", "async")
OWNER = "worker:test:1:-:00000000"
LEASE = 30.0
WF = ("wf", "1")
SERVED = frozenset({WF})
#: Checkpoint fields a claim sets to "now" (compared by rule, not by value).
STAMPED = ("version", "updated_at", "renewed_at")


@pytest.fixture(params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Each backend's name."""
    return str(request.param)


@pytest.fixture
def store_config(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend."""
    return fresh_config(kind, request, tmp_path)


@pytest.fixture
def store(store_config: str) -> Iterator[Store]:
    """The store under test."""
    with open_store(store_config) as opened:
        yield opened


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``sync``: ``claim_ready``, ``load``, ``save``; ``async``: their ``a`` twins."""
    return str(request.param)


def one_call(kind: str, store: Store) -> bool:
    """Pin whether ``kind`` claims in one call; the rest of a test is for those that do.

    The others keep the per-run path: ``test_without_the_capability`` pins the refusal
    and ``test_two_workers_never_claim_one_run_twice`` runs their workers.
    """
    assert store.claims_in_one_call is (kind in ONE_CALL)
    return kind in ONE_CALL


def claim(store: Store, mode: str, limit: int = 100, **kw: Any) -> list[Claim]:
    """Call ``claim_ready`` (or ``aclaim_ready``) as a worker serving ``served`` would."""
    served = kw.pop("served", SERVED)
    args = (OWNER, LEASE, limit, served, utcnow())
    if mode == "async":

        async def go() -> list[Claim]:
            return await store.aclaim_ready(*args, **kw)

        return asyncio.run(go())
    return store.claim_ready(*args, **kw)


def per_run(store: Store, mode: str, run_id: str) -> Checkpoint:
    """Claim ``run_id`` the old way: load it, save ``_lease.claimed`` of what was loaded."""
    if mode == "async":

        async def go() -> Checkpoint:
            loaded = await store.aload(run_id)
            assert loaded is not None
            return await store.asave(_lease.claimed(loaded, OWNER, LEASE))

        return asyncio.run(go())
    loaded = store.load(run_id)
    assert loaded is not None
    return store.save(_lease.claimed(loaded, OWNER, LEASE))


THEN = utcnow() - timedelta(minutes=5)


def kinds_of_ready(run_id: str, then: datetime = THEN) -> list[Checkpoint]:
    """One record of every kind ``claim_ready`` claims, with awkward values inside."""
    base = Checkpoint(
        run_id=run_id,
        total_steps=4,
        workflow=WF[0],
        workflow_version=WF[1],
        created_at=then,
        updated_at=then,
        state={"big": 1e100, "neg0": -0.0, "deep": {"s": '"owner":"x",\n'}, "n": 2**70},
        input={"x": 1.5, "u": "é\u2028"},
        epoch=3,
    )
    return [
        evolve(base, run_id=f"{run_id}-queued", queued=True, epoch=0),
        evolve(
            base,
            run_id=f"{run_id}-timer",
            step=0,
            step_names=("a",),
            waiting_for="timer",
            wake_at=then,
        ),
        evolve(
            base,
            run_id=f"{run_id}-signalled",
            step=0,
            step_names=("a",),
            waiting_for="signal go",
            signals=(Signal("go", "s1", {"p": [1, 2]}, then),),
        ),
        evolve(base, run_id=f"{run_id}-released", step=1, step_names=("a", "b"), attempt=2),
    ]


def put(store: Store, records: list[Checkpoint]) -> None:
    """Store ``records`` keeping their times (``import_checkpoint``), as a release would."""
    for record in records:
        store.import_checkpoint(record)


def counter(version: str | None) -> str:
    """The save counter of a version token."""
    assert version is not None
    return version.partition(".")[0]


def test_a_one_call_claim_stores_what_load_and_save_would(
    kind: str, store: Store, mode: str
) -> None:
    """Field by field, the one-call claim equals the per-run claim of an identical run."""
    if not one_call(kind, store):
        return
    put(store, kinds_of_ready("old") + kinds_of_ready("new"))
    before = {cp.run_id: store.load(cp.run_id) for cp in kinds_of_ready("new")}
    olds = frozenset(cp.run_id for cp in kinds_of_ready("old"))
    started = utcnow()
    claims = claim(store, mode, exclude=olds)
    ended = utcnow()
    assert sorted(c.claimed.run_id for c in claims) == sorted(before)
    for got in claims:
        new = got.claimed
        suffix = new.run_id.removeprefix("new-")
        old = per_run(store, mode, f"old-{suffix}")
        assert new.status == old.status
        for field in dataclasses.fields(Checkpoint):
            if field.name in (*STAMPED, "run_id"):
                continue
            assert getattr(new, field.name) == getattr(old, field.name), (suffix, field.name)
        loaded = before[new.run_id]
        assert loaded is not None
        assert counter(new.version) == counter(old.version) == str(int(counter(loaded.version)) + 1)
        assert new.version != loaded.version
        assert new.owner == OWNER and new.lease == LEASE and new.epoch == loaded.epoch + 1
        assert new.renewed_at is not None and new.updated_at is not None
        assert started <= new.renewed_at <= new.updated_at <= ended
        assert new.renewed_at.tzinfo is not None
        # The record as it was, for the claim's event: equal to what a load returned.
        assert got.before.version in (None, loaded.version)
        assert evolve(got.before, version=loaded.version) == loaded
        # The stored document loads back as the claim returned it.
        assert store.load(new.run_id) == new
        if new.state_json is not None:
            assert json.loads(new.state_json) == new.state
        # The index shows the claim as it shows the per-run one.
        infos = {i.run_id: i for i in store.list_info()}
        mine, theirs = infos[new.run_id], infos[old.run_id]
        assert (mine.status, mine.owner, mine.version) == (theirs.status, OWNER, new.version)
        assert mine.due_at is not None and theirs.due_at is not None
        if new.status == "running":
            assert mine.due_at == new.renewed_at + timedelta(seconds=LEASE)
        else:
            assert mine.due_at == theirs.due_at
        # Fencing: the version the claim replaced is refused; the claimed one is not.
        with pytest.raises(ConflictError):
            store.save(evolve(loaded, state={"stale": True}))
        renewed = store.save(_lease.renewal(new))
        assert renewed.owner == OWNER and renewed.epoch == new.epoch
    assert claim(store, mode) == [], "a claimed run was claimed again"


def test_only_what_needs_no_judgement_is_claimed(kind: str, store: Store, mode: str) -> None:
    """Owned, not yet due, finished, cancel-requested and unserved runs stay unclaimed."""
    if not one_call(kind, store):
        return
    later = utcnow() + timedelta(days=1)
    base = Checkpoint(run_id="x", total_steps=3, workflow=WF[0], workflow_version=WF[1])
    left = [
        evolve(base, run_id="cancel-requested", queued=True, cancel_requested=True),
        evolve(base, run_id="owned", owner="someone", lease=5.0, renewed_at=utcnow(), epoch=1),
        evolve(
            base, run_id="not-due", step=0, step_names=("a",), waiting_for="timer", wake_at=later
        ),
        evolve(base, run_id="done", step=2, step_names=("a", "b", "c")),
        evolve(base, run_id="cancelled", cancelled=True),
        evolve(base, run_id="other-workflow", queued=True, workflow="other"),
        evolve(base, run_id="other-version", queued=True, workflow_version="2"),
        evolve(base, run_id="no-version", queued=True, workflow_version=None),
        evolve(base, run_id="excluded", queued=True),
    ]
    for record in left:
        store.save(record)
    assert claim(store, mode, exclude=frozenset({"excluded"})) == []
    # The unversioned workflow is a workflow of its own: served, it is claimed.
    got = claim(store, mode, served=frozenset({("wf", None)}))
    assert [c.claimed.run_id for c in got] == ["no-version"]
    assert [c.claimed.run_id for c in claim(store, mode)] == ["excluded"]
    for record in left:
        stored = store.load(record.run_id)
        assert stored is not None
        if record.run_id not in ("no-version", "excluded"):
            assert stored.owner == record.owner, record.run_id


def test_the_limit_is_respected_earliest_due_first(kind: str, store: Store, mode: str) -> None:
    """``limit`` runs per call at most, in due order; the next call takes the next ones."""
    if not one_call(kind, store):
        return
    start = utcnow() - timedelta(hours=1)
    for index in range(5):
        store.save(
            Checkpoint(
                run_id=f"w{index}",
                step=0,
                step_names=("a",),
                total_steps=3,
                workflow=WF[0],
                workflow_version=WF[1],
                waiting_for="timer",
                wake_at=start + timedelta(minutes=5 - index),
            )
        )
    assert claim(store, mode, limit=0) == []
    taken = [[c.claimed.run_id for c in claim(store, mode, limit=2)] for _ in range(4)]
    assert taken == [["w4", "w3"], ["w2", "w1"], ["w0"], []]


def test_without_the_capability(kind: str, store: Store) -> None:
    """A store that does not claim in one call says so, and refuses the call."""
    if kind in ONE_CALL:
        assert store.claims_in_one_call
        return
    assert not store.claims_in_one_call
    with pytest.raises(StoreError, match="does not claim in one call|cannot claim in one"):
        store.claim_ready(OWNER, LEASE, 1, SERVED, utcnow())


# --- workers claiming at once ----------------------------------------------------------


def _counting(store: Store) -> list[int]:
    """Count the loads made through ``store`` (sync and async) in the returned cell."""
    cell = [0]
    load, aload = store.load, store.aload

    def counted(run_id: str) -> Checkpoint | None:
        cell[0] += 1
        return load(run_id)

    async def acounted(run_id: str) -> Checkpoint | None:
        cell[0] += 1
        return await aload(run_id)

    store.load = counted  # type: ignore[method-assign]
    store.aload = acounted  # type: ignore[method-assign]
    return cell


RUNS = 60


def _workflow(done: list[str], lock: threading.Lock) -> Workflow:
    def record(state: dict[str, Any]) -> dict[str, Any]:
        with lock:
            done.append(str(state["id"]))
        return {"ok": True}

    return Workflow("wf", [Step("record", record)], version="1")


def test_two_workers_never_claim_one_run_twice(
    kind: str, store_config: str, store: Store, mode: str
) -> None:
    """Two workers (threads, each with its own store) run each run once, loading little."""
    from stepstone import start

    done: list[str] = []
    lock = threading.Lock()
    workflow = _workflow(done, lock)
    for index in range(RUNS):
        start(store, workflow, f"r{index}", {"id": f"r{index}"})
    stores = [open_store(store_config) for _ in range(2)]
    loads = [_counting(s) for s in stores]
    workers = [Worker(s, [workflow], concurrency=4, poll=0.02) for s in stores]

    def serve(worker: Worker) -> None:
        if mode == "async":
            asyncio.run(worker.aserve())
        else:
            worker.serve()

    threads = [threading.Thread(target=serve, args=(w,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WAIT_TIMEOUT
    while sum(w.completed for w in workers) < RUNS:
        assert time.monotonic() < deadline, f"workers hung: {sum(w.completed for w in workers)}"
        time.sleep(0.02)
    for worker in workers:
        worker.stop()
    for thread in threads:
        thread.join(WAIT_TIMEOUT)
        assert not thread.is_alive(), "a worker did not stop"
    for opened in stores:
        opened.close()
    assert sorted(done) == sorted(f"r{i}" for i in range(RUNS)), "a run ran twice or never"
    total = sum(cell[0] for cell in loads)
    if kind in ONE_CALL:
        assert total <= 1.2 * RUNS, f"{total} loads for {RUNS} claims"


_CHILD = """
import json, os, sys, threading, time
from stepstone import Step, Worker, Workflow, open_store
config, runs, out, marks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
done = []
def record(state):
    # Each process marks that it ran a run, and holds its runs until a second process
    # has: one process whose slots are all held cannot drain the queue alone, however
    # soon it started, so the others must claim beside it (what the test is about).
    open(os.path.join(marks, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(marks)) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("no second process ran a run in 120 s")
        time.sleep(0.01)
    done.append(state["id"])
    return {"ok": True}
wf = Workflow("wf", [Step("record", record)], version="1")
store = open_store(config)
loads = [0]
load = store.load
def counted(run_id):
    loads[0] += 1
    return load(run_id)
store.load = counted
worker = Worker(store, [wf], concurrency=4, poll=0.02)
thread = threading.Thread(target=worker.serve, daemon=True)
thread.start()
with open_store(config) as probe:
    deadline = time.monotonic() + 120
    while probe.count_by_status()["done"] < runs and time.monotonic() < deadline:
        time.sleep(0.05)
worker.stop()
thread.join(60)
with open(out, "w") as f:
    json.dump({"done": done, "loads": loads[0], "claimed": worker.completed}, f)
"""


@pytest.mark.parametrize("server", ["postgresql", "mysql"])
def test_four_processes_spread_over_the_queue(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Four worker processes on one server table: no run twice, <= 1.5 loads per claim."""
    config = fresh_config(server, request, tmp_path)
    runs = 200
    from stepstone import start

    wf = Workflow("wf", [Step("record", lambda s: {"ok": True})], version="1")
    with open_store(config) as store:
        for index in range(runs):
            start(store, wf, f"p{index}", {"id": f"p{index}"})
    outs = [tmp_path / f"out{i}.json" for i in range(4)]
    marks = tmp_path / "marks"
    marks.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, config, str(runs), str(out), str(marks)],
            env=child_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    results = [json.loads(out.read_text()) for out in outs]
    done = [run_id for r in results for run_id in r["done"]]
    assert sorted(done) == sorted(f"p{i}" for i in range(runs)), "a run ran twice or never"
    loads = sum(r["loads"] for r in results)
    # A claim carries its checkpoint (no load); a load is the exception (a save that lost a
    # race re-reads). Four processes on a starved CPU lose more races than on a quiet one
    # (244 for 200 seen beside eight test runs), so the bound is 1.5x: the old two-call
    # claim (a load per claim, 2.0x and up) still fails it.
    assert loads <= 1.5 * runs, f"{loads} loads for {runs} claims"
    # Not left to timing: a process's runs wait for a second one's (``_CHILD``).
    assert sum(1 for r in results if r["done"]) >= 2, "one process took every run"


@pytest.mark.parametrize(
    ("version", "able"),
    [
        ("5.7.44-log", False),
        ("8.0.20", False),
        ("8.0.21", True),
        ("8.4.3", True),
        ("10.5.22-MariaDB", False),
        ("10.6.0-MariaDB-log", True),
        ("10.11.19-MariaDB-0+deb12u1", True),
        ("5.5.5-10.11.6-MariaDB", True),
        ("5.5.5-10.5.1-MariaDB", False),
        ("unknown", False),
    ],
)
def test_mysql_claims_in_one_call_from_8_0_21_and_mariadb_10_6(version: str, able: bool) -> None:
    """Only servers with SKIP LOCKED, JSON_TABLE and JSON_VALUE claim in one call."""
    from stepstone.stores._mysql_dialect import one_call_reason

    reason = one_call_reason(version)
    assert (reason is None) is able, reason


def test_an_old_mysql_server_keeps_the_per_run_path(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server too old to claim in one call is logged, refuses the call, and still serves."""
    from stepstone import start
    from stepstone.stores import mysql

    monkeypatch.setattr(mysql, "one_call_reason", lambda version: f"{version} is too old")
    config = fresh_config("mysql", request, tmp_path)
    done: list[str] = []
    workflow = _workflow(done, threading.Lock())
    with open_store(config) as store:
        assert not store.claims_in_one_call
        assert type(store).claims_in_one_call
        with pytest.raises(StoreError, match="cannot claim in one"):
            store.claim_ready(OWNER, LEASE, 1, SERVED, utcnow())
        for index in range(5):
            start(store, workflow, f"o{index}", {"id": f"o{index}"})
        worker = Worker(store, [workflow], concurrency=2, poll=0.02)
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        deadline = time.monotonic() + WAIT_TIMEOUT
        while worker.completed < 5:
            assert time.monotonic() < deadline, f"worker hung: {worker.completed} of 5"
            time.sleep(0.02)
        worker.stop()
        thread.join(WAIT_TIMEOUT)
        assert not thread.is_alive(), "the worker did not stop"
    assert sorted(done) == [f"o{i}" for i in range(5)]


def test_a_run_whose_workflow_name_holds_nul_fails_no_claim(
    kind: str, store: Store, mode: str
) -> None:
    """A stored name with NUL (SQL cannot compare it) neither breaks the claim nor is taken."""
    if not one_call(kind, store):
        return
    base = Checkpoint(run_id="x", total_steps=1, workflow=WF[0], workflow_version=WF[1])
    store.save(evolve(base, run_id="odd", queued=True, workflow="nul\x00name"))
    store.save(evolve(base, run_id="plain", queued=True))
    assert [c.claimed.run_id for c in claim(store, mode)] == ["plain"]
    odd = store.load("odd")
    assert odd is not None and odd.owner is None


def test_a_worker_serving_a_nul_name_claims_run_by_run(kind: str, store: Store) -> None:
    """A worker whose workflow name holds NUL drives its runs through the per-run path."""
    done: list[str] = []

    def a(state: dict[str, Any]) -> dict[str, Any]:
        done.append("a")
        return {"a": 1}

    wf = Workflow("nul\x00name", [Step("a", a)])
    start(store, wf, "r")
    worker = Worker(store, [wf], poll=0.05)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while (cp := store.load("r")) is None or cp.status != "done":
            assert time.monotonic() < deadline, "the NUL-named run never finished"
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(30)
    assert done == ["a"] and not thread.is_alive()
