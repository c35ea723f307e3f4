"""The worker's hard cases: parked runs, the exit after the grace, an unreadable error.

- A run whose completed steps were renamed without a version bump is parked as
  ``failed`` by the first worker that claims it (one claim, one save), never spun on.
- ``stepstone worker`` exits after ``--grace`` with a step still running, gives that
  run's lease back, and a fresh worker finishes the run; ``Worker.stop`` takes no lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from cli_support import cli
from fresh_stores import BACKENDS, fresh_config
from stepstone import (
    Step,
    Store,
    Suspended,
    WaitFor,
    Worker,
    Workflow,
    open_store,
    run,
    start,
)
from stepstone._checkpoint import Checkpoint
from stepstone._runner import make_plan
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.worker import _claims
from waiting import until

SRC = str(Path(stepstone.__file__).resolve().parents[1])
DURABLE = BACKENDS[1:]
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


# --- 7: a run whose steps changed is parked, never spun on --------------------------------


class _CountingWorker:
    """A Worker on its own store in a thread, counting the store's saves and claim queries.

    The store is wrapped on the instance: ``save``/``claimable``/``claim_ready`` in the
    sync form, ``asave``/``aclaimable``/``aclaim_ready`` in the async one (the other
    pair may delegate to these).
    ``saved`` holds the records of the saves that landed. ``patch``, if given, is
    called on the worker's store before the worker is made (to wrap more of it).
    """

    def __init__(
        self,
        config: str,
        workflows: list[Workflow],
        mode: str,
        patch: Callable[[Store], None] | None = None,
        concurrency: int = 8,
    ) -> None:
        self.concurrency = concurrency
        self.config = config
        self.workflows = workflows
        self.mode = mode
        self.patch = patch
        self.counts: Counter[str] = Counter()
        self.saved: list[Checkpoint] = []
        self.lock = threading.Lock()
        self.worker: Worker | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"counting {mode} worker")

    def _count(self, store: Store) -> None:
        if self.patch is not None:
            self.patch(store)
        sync = self.mode == "sync"
        save_name, claim_name = ("save", "claimable") if sync else ("asave", "aclaimable")
        save, claimable = getattr(store, save_name), getattr(store, claim_name)

        def note(name: str, cp: Checkpoint | None = None) -> None:
            with self.lock:
                self.counts[name] += 1
                if cp is not None:
                    self.saved.append(cp)

        def counted_save(cp: Checkpoint) -> Checkpoint:
            result: Checkpoint = save(cp)
            note("save", result)  # saves that landed
            return result

        def counted_claimable(*args: Any, **kwargs: Any) -> Any:
            note("claimable")
            return claimable(*args, **kwargs)

        async def counted_asave(cp: Checkpoint) -> Checkpoint:
            result: Checkpoint = await save(cp)
            note("save", result)
            return result

        async def counted_aclaimable(*args: Any, **kwargs: Any) -> Any:
            note("claimable")
            return await claimable(*args, **kwargs)

        setattr(store, save_name, counted_save if sync else counted_asave)
        setattr(store, claim_name, counted_claimable if sync else counted_aclaimable)
        # A claim in one call (``Store.claim_ready``) is a write that landed per run.
        ready_name = "claim_ready" if sync else "aclaim_ready"
        ready = getattr(store, ready_name)

        def counted_ready(*args: Any, **kwargs: Any) -> Any:
            claims = ready(*args, **kwargs)
            for claim in claims:
                note("save", claim.claimed)
            return claims

        async def counted_aready(*args: Any, **kwargs: Any) -> Any:
            claims = await ready(*args, **kwargs)
            for claim in claims:
                note("save", claim.claimed)
            return claims

        setattr(store, ready_name, counted_ready if sync else counted_aready)

    def _main(self) -> None:
        try:
            if self.mode == "async":

                async def serve() -> None:
                    async with open_store(self.config) as store:
                        self._count(store)
                        self.worker = Worker(
                            store,
                            self.workflows,
                            poll=0.01,
                            lease=30,
                            concurrency=self.concurrency,
                        )
                        self.ready.set()
                        await self.worker.aserve()

                asyncio.run(serve())
            else:
                with open_store(self.config) as store:
                    self._count(store)
                    self.worker = Worker(
                        store,
                        self.workflows,
                        poll=0.01,
                        lease=30,
                        concurrency=self.concurrency,
                    )
                    self.ready.set()
                    self.worker.serve()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread by __exit__
            self.error = exc
            self.ready.set()

    def count(self, name: str) -> int:
        """How many calls of ``name`` (save, claimable) the worker made so far."""
        with self.lock:
            return self.counts[name]

    def __enter__(self) -> _CountingWorker:
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


def _noop(state: State) -> State:
    return {"n": state.get("n", 0) + 1}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_worker_parks_a_run_whose_steps_were_renamed(
    store: Store, store_config: str, mode: str
) -> None:
    """A renamed completed step (same version) costs one claim and one save, then never more."""
    waiting_v1 = Workflow("report", [Step("fetch", _noop), WaitFor("approve", "go")], version="1")
    handed_v2 = Workflow("report", [Step("fetch", _noop), Step("publish", _noop)], version="2")
    with pytest.raises(Suspended):
        run("r-wait", waiting_v1, store)
    assert stepstone.signal(store, "r-wait", "go", {"ok": True}, signal_id="s-1") is True
    # A run given back at a step boundary: one step done, nobody holds it.
    store.save(
        Checkpoint(
            "r-back",
            step=0,
            state={"n": 1},
            step_names=("fetch",),
            total_steps=2,
            workflow="report",
            workflow_version="2",
        )
    )
    renamed = [
        Workflow("report", [Step("fetch_all", _noop), WaitFor("approve", "go")], version="1"),
        Workflow("report", [Step("fetch_all", _noop), Step("publish", _noop)], version="2"),
    ]
    with _CountingWorker(store_config, renamed, mode) as serving:

        def parked() -> bool:
            return all(
                (cp := store.load(run_id)) is not None and cp.status == "failed"
                for run_id in ("r-wait", "r-back")
            )

        until("both renamed runs parked as failed", parked)
        # Twenty more looks at the claim index: a spinning worker would claim again.
        looked = serving.count("claimable")
        until("twenty more claim queries", lambda: serving.count("claimable") >= looked + 20)
        writes = list(serving.saved)
    assert len(writes) == 4, [(cp.run_id, cp.owner, cp.failure) for cp in writes]
    for run_id in ("r-wait", "r-back"):
        mine = [cp for cp in writes if cp.run_id == run_id]
        assert [cp.owner is not None for cp in mine] == [True, False], mine  # claim, park
        cp = store.load(run_id)
        assert cp is not None and cp.owner is None and cp.failure is not None
        assert cp.failure.error_type == "WorkflowChanged"
        assert (cp.failure.step_index, cp.failure.step_name) == (0, "fetch")
        assert "fetch_all" in cp.failure.message and "Parked by worker:" in cp.failure.message
        assert (cp.step, cp.step_names, cp.state) == (0, ("fetch",), {"n": 1})  # nothing lost
    wait = store.load("r-wait")
    assert wait is not None and [s.id for s in wait.signals] == ["s-1"]
    # Visible to operators, and resumable with the steps it was recorded with.
    code, out, err = cli("runs", "show", "r-wait", "--store", store_config, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["status"] == "failed" and shown["failure"]["error_type"] == "WorkflowChanged"
    code, out, err = cli("runs", "list", "--status", "failed", "--store", store_config)
    assert code == 0 and "r-wait" in out and "r-back" in out, (out, err)
    assert run("r-wait", waiting_v1, store) == {"n": 1, "approve": {"ok": True}}
    assert run("r-back", handed_v2, store) == {"n": 2}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_worker_leaves_a_run_that_ended_in_an_unexpected_error(
    store: Store, store_config: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run given back after an unexpected error (its step's save raising a type outside
    the tree) is not claimed at once."""
    monkeypatch.setattr(_claims, "_COOL_FIRST", 600.0)  # longer than the test
    monkeypatch.setattr(_claims, "_COOL_MAX", 600.0)
    calls: list[int] = []

    def step(state: State) -> State:
        calls.append(1)
        return {"n": 1}

    def patch(worker_store: Store) -> None:
        # The step's result never lands: its save raises an error no store raises. (A
        # non-JSON state is no longer such an error: it fails the run, recorded.)
        real, areal = worker_store.save, worker_store.asave

        def save(cp: Checkpoint) -> Checkpoint:
            if cp.step == 0:
                raise _Unprintable
            return real(cp)

        async def asave(cp: Checkpoint) -> Checkpoint:
            if cp.step == 0:
                raise _Unprintable
            return await areal(cp)

        worker_store.save = save  # type: ignore[method-assign,assignment]
        worker_store.asave = asave  # type: ignore[method-assign,assignment]

    flow = Workflow("odd", [Step("odd", step)])
    start(store, flow, "r-odd")
    with _CountingWorker(store_config, [flow], mode, patch=patch) as serving:
        until("the step to run once", lambda: bool(calls))
        until(
            "the run to be given back",
            lambda: (cp := store.load("r-odd")) is not None and cp.owner is None and cp.epoch == 1,
        )
        looked = serving.count("claimable")
        until("twenty more claim queries", lambda: serving.count("claimable") >= looked + 20)
        writes = list(serving.saved)
    assert len(calls) == 1, "the worker claimed the run again at once"
    assert [cp.owner is not None for cp in writes] == [True, False], writes  # claim, give back
    left = store.load("r-odd")
    assert left is not None and left.status == "running" and left.failure is None


class _Unprintable(RuntimeError):
    """An exception type no store in the tree raises, whose text cannot even be read."""

    def __str__(self) -> str:
        raise ValueError("no text for you")


class _UnprintableStop(BaseException):
    """Not an ``Exception`` (so no step failure is recorded), and its text cannot be read."""

    def __str__(self) -> str:
        raise ValueError("no text for you")


@pytest.mark.parametrize("where", ["load", "claimable"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_worker_survives_an_unexpected_error_from_the_store(
    store: Store, store_config: str, mode: str, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A store call raising a type outside the tree (once) is logged with its traceback at
    ERROR; the worker lives on, backs off and finishes the run, which runs once."""
    raised = threading.Event()
    calls: list[int] = []

    def patch(worker_store: Store) -> None:
        names = [where, f"a{where}"]
        if where == "load" and worker_store.claims_in_one_call:
            # Such a store's worker claims without loading: its claim call raises instead.
            names += ["claim_ready", "aclaim_ready"]
        for name in names:
            real = getattr(worker_store, name)
            if name.startswith("a"):

                async def once_async(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                    if not raised.is_set():
                        raised.set()
                        raise _Unprintable
                    return await _real(*args, **kwargs)

                setattr(worker_store, name, once_async)
            else:

                def once(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                    if not raised.is_set():
                        raised.set()
                        raise _Unprintable
                    return _real(*args, **kwargs)

                setattr(worker_store, name, once)

    def count(state: State) -> State:
        calls.append(1)
        return {"n": len(calls)}

    flow = Workflow("odd-store", [Step("count", count)])
    start(store, flow, "r-store")
    caplog.set_level("ERROR", logger="stepstone")
    with _CountingWorker(store_config, [flow], mode, patch=patch):
        assert raised.wait(WAIT_TIMEOUT), f"the worker never called {where}"
        until(
            f"the run to finish after {where} raised",
            lambda: (cp := store.load("r-store")) is not None and cp.status == "done",
        )
    assert calls == [1], "the run's step ran more than once"
    failed = [r for r in caplog.records if r.exc_info and r.exc_info[0] is _Unprintable]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    record = failed[0]
    assert record.levelname == "ERROR" and "trying again" in record.getMessage()
    assert record.exc_info is not None
    assert "_Unprintable" in logging.Formatter().formatException(record.exc_info)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_step_error_whose_text_cannot_be_read_frees_the_slot(
    store: Store, store_config: str, mode: str
) -> None:
    """A step raising a BaseException whose ``__str__`` raises ends that execution like any
    other: the worker's only slot is free again and the next run is driven."""
    raised = threading.Event()

    def hostile(state: State) -> State:
        raised.set()
        raise _UnprintableStop

    bad = Workflow("hostile", [Step("hostile", hostile)])
    good = Workflow("fine", [Step("count", _noop)])
    start(store, bad, "r-hostile")
    with _CountingWorker(store_config, [bad, good], mode, concurrency=1):
        assert raised.wait(WAIT_TIMEOUT), "the worker never ran the hostile step"
        start(store, good, "r-fine")
        until(
            "the run after the hostile one to finish (the only slot was never freed)",
            lambda: (cp := store.load("r-fine")) is not None and cp.status == "done",
        )


# --- 8: stop() takes no lock; the command exits after the grace ----------------------------


def test_stop_takes_no_lock_the_loop_holds(tmp_path: Path) -> None:
    """``stop`` completes and flags every plan while the serve loop's lock is held."""
    flow = Workflow("w", [Step("a", _noop)])
    with open_store(f"sqlite:///{tmp_path}/runs.db") as opened:
        worker = Worker(opened, [flow])
        plan = make_plan("r", flow, opened, input=None, lease=30, asynchronous=False)
        worker._claims.plans["r"] = plan
        stopped = threading.Event()

        def stop() -> None:
            worker.stop()
            stopped.set()

        # A signal handler runs on the thread that holds the lock, where a lock taken by
        # stop() would never be given; another thread blocks on it all the same.
        with worker._claims.lock:
            thread = threading.Thread(target=stop, name="stopper")
            thread.start()
            finished = stopped.wait(WAIT_TIMEOUT)
        thread.join(WAIT_TIMEOUT)
    assert finished, "Worker.stop() waited for the lock its serve loop held"
    assert worker.stopping and plan.stop_requested


_SLEEPY = """
import os, pathlib, time
from stepstone import Step, Workflow

MARKS = pathlib.Path(MARKS_DIR)

def slow(state):
    (MARKS / f"started-{os.getpid()}").touch()
    # The first worker's step outlives any test timeout; the fresh one's returns.
    while not (MARKS / "fast").exists():
        time.sleep(0.05)
    return {"slow": "done"}

WORKFLOWS = [Workflow("sleepy", [Step("first", lambda s: {"first": 1}), Step("slow", slow)])]
"""


@pytest.mark.crash
def test_worker_command_exits_after_the_grace(durable_config: str, tmp_path: Path) -> None:
    """SIGTERM with a step running: exit 0 after --grace, lease given back, run finished later."""
    marks = tmp_path / "marks"
    marks.mkdir()
    module = f"sleepy_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(_SLEEPY.replace("MARKS_DIR", repr(str(marks))))
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{tmp_path}"}
    env.pop("STEPSTONE_STORE", None)
    sys.path.insert(0, str(tmp_path))
    try:
        flows = __import__(module).WORKFLOWS
        with open_store(durable_config) as opened:
            start(opened, flows[0], "sleepy-1")
            argv = [sys.executable, "-m", "stepstone", "worker", "--store", durable_config]
            argv += ["--workflows", f"{module}:WORKFLOWS", "--grace", "1", "--lease", "60"]
            proc = subprocess.Popen(
                argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            try:

                def entered() -> bool:
                    assert proc.poll() is None, "the worker process exited before the step"
                    return any(marks.iterdir())

                until("the worker process to enter the slow step", entered)
                held = opened.load("sleepy-1")
                assert held is not None and held.owner is not None and held.step == 0
                proc.send_signal(signal.SIGTERM)
                try:
                    code = proc.wait(timeout=WAIT_TIMEOUT)
                except subprocess.TimeoutExpired:
                    raise AssertionError(
                        "stepstone worker still alive 120 s after SIGTERM with --grace 1"
                    ) from None
            finally:
                if proc.poll() is None:
                    proc.kill()
                out, err = proc.communicate(timeout=WAIT_TIMEOUT)
            assert code == 0, err.decode()
            assert b"abandoning the steps in flight of 1 runs ('sleepy-1')" in out, out
            # The lease was given back: no takeover wait, and the old owner is fenced.
            left = opened.load("sleepy-1")
            assert left is not None and left.owner is None and left.epoch == held.epoch
            assert (left.step, left.status) == (0, "running")
            (marks / "fast").touch()
            worker = Worker(opened, flows, poll=0.01)
            thread = threading.Thread(target=worker.serve, name="fresh worker")
            thread.start()
            try:
                until(
                    "a fresh worker to finish the abandoned run",
                    lambda: (cp := opened.load("sleepy-1")) is not None and cp.status == "done",
                )
            finally:
                worker.stop()
                thread.join(WAIT_TIMEOUT)
            done = opened.load("sleepy-1")
            assert done is not None and done.state == {"first": 1, "slow": "done"}
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module, None)
