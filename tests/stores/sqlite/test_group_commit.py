"""Group commit on SQLiteStore: concurrent saves share a transaction, each with its own outcome.

A batch is made deterministic by holding its leader at the ``sqlite.in_transaction`` kill
point (statements executed, not committed) until the saves meant for the next batch have
queued; releasing it commits the first batch and hands the queue over as the second.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Checkpoint, CheckpointTooLarge, ConflictError, StoreError, _hooks
from stepstone.stores._group import Pending
from stepstone.stores._sql import ServerStore
from stepstone.stores.sqlite import SQLiteStore
from stepstone.testing import kill_point

REPO = Path(__file__).resolve().parents[3]
WAIT = 30.0  # seconds any wait below allows before failing, naming what hung


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "group.db")


@pytest.fixture
def store(db: str) -> Iterator[SQLiteStore]:
    with SQLiteStore(db) as s:
        yield s
    _hooks.install(None)


def _row(path: str, run_id: str) -> tuple[str, str] | None:
    """The committed (version, document) of a run, read on a fresh connection."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT version, document FROM stepstone_checkpoints WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else (row[0], row[1])


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT} s waiting for {what}")
        time.sleep(0.002)


def _join(threads: list[threading.Thread], what: str) -> None:
    for t in threads:
        t.join(WAIT)
        if t.is_alive():
            raise AssertionError(f"{what}: thread {t.name} did not finish within {WAIT} s")


class HeldBatch:
    """Holds the first batch's leader at the kill point so that a second batch can form."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.release = threading.Event()
        self.reached = threading.Event()
        self.leader: threading.Thread | None = None
        self.leader_error: BaseException | None = None

    def __enter__(self) -> HeldBatch:
        seen: list[int] = []

        def hook(point: str) -> None:
            if (
                point == "sqlite.in_transaction"
                and threading.get_ident() == seen[0]
                and not self.reached.is_set()
            ):
                self.reached.set()
                if not self.release.wait(WAIT):
                    raise AssertionError("the held leader was never released")

        base = self.store.save(Checkpoint("leader", state={"n": 0}))

        def lead() -> None:
            seen.append(threading.get_ident())
            try:
                self.store.save(Checkpoint("leader", state={"n": 1}, version=base.version))
            except BaseException as exc:  # noqa: BLE001 - kept for the test to assert on
                self.leader_error = exc

        _hooks.install(hook)
        self.leader = threading.Thread(target=lead, name="leader")
        self.leader.start()
        if not self.reached.wait(WAIT):
            raise AssertionError("the leader's save never reached sqlite.in_transaction")
        return self

    def queued(self, n: int) -> None:
        """Wait until ``n`` saves are queued behind the held leader."""
        group = self.store._group
        assert group is not None
        _wait_for(lambda: len(group._queue) >= n, f"{n} saves to queue behind the leader")

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        assert self.leader is not None
        _join([self.leader], "the held leader")
        # The hook stays: the next batch may not have reached it yet. Tests remove it
        # once their threads are joined (and the fixture does in any case).
        assert self.leader_error is None, self.leader_error


def _bump(store: SQLiteStore, cp: Checkpoint) -> Callable[[], Checkpoint]:
    """A save of ``cp``'s run with state n=1, on top of ``cp``."""
    return lambda: store.save(Checkpoint(cp.run_id, state={"n": 1}, version=cp.version))


def _in_threads(fns: list[Callable[[], Any]]) -> tuple[list[threading.Thread], list[Any]]:
    """Start each function in a thread; results land in the list (value or exception)."""
    results: list[Any] = [None] * len(fns)

    def call(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - each call's outcome, asserted after
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,), name=f"saver-{i}") for i in range(len(fns))]
    for t in threads:
        t.start()
    return threads, results


# --- all land, exactly -----------------------------------------------------------------


def test_64_threads_saving_concurrently_all_land_with_exact_states(store: SQLiteStore) -> None:
    """64 threads each chaining 20 saves of their own run all land, each with its last state."""
    committed: set[tuple[str, str]] = set()
    lock = threading.Lock()
    group = store._group
    assert group is not None

    def record(batch: list[Pending]) -> None:
        with lock:
            committed.update(
                (item.params["run_id"], item.params["version"])
                for item in batch
                if item.stored == 1 and item.error is None
            )

    group.after_commit = record
    late: list[tuple[str, str | None]] = []

    def chain(i: int) -> Checkpoint:
        cp = store.save(Checkpoint(f"r{i}", state={"n": 0, "who": i}))
        for n in range(1, 20):
            cp = store.save(Checkpoint(f"r{i}", state={"n": n, "who": i}, version=cp.version))
            with lock:
                if (cp.run_id, cp.version) not in committed:
                    late.append((cp.run_id, cp.version))
        return cp

    threads, results = _in_threads([functools.partial(chain, i) for i in range(64)])
    _join(threads, "64 saving threads")
    _hooks.install(None)
    assert late == [], "a save returned before its commit completed"
    for i, last in enumerate(results):
        assert isinstance(last, Checkpoint), last
        assert store.load(f"r{i}") == last
        assert last.state == {"n": 19, "who": i}
    assert sum(size * n for size, n in group.batch_sizes.items()) == 64 * 20


def test_500_tasks_saving_concurrently_all_land_with_exact_states(store: SQLiteStore) -> None:
    """500 asyncio tasks each chaining 4 asaves of their own run all land exactly."""

    async def chain(i: int) -> Checkpoint:
        cp = await store.asave(Checkpoint(f"t{i}", state={"n": 0}))
        for n in range(1, 4):
            cp = await store.asave(Checkpoint(f"t{i}", state={"n": n, "i": i}, version=cp.version))
        return cp

    async def main() -> list[Checkpoint]:
        return await asyncio.wait_for(asyncio.gather(*(chain(i) for i in range(500))), timeout=120)

    finals = asyncio.run(main())
    for i, last in enumerate(finals):
        assert store.load(f"t{i}") == last
        assert last.state == {"n": 3, "i": i}
    group = store._group
    assert group is not None
    assert max(group.batch_sizes) > 1, "concurrent tasks never shared a commit"


# --- each save keeps its own outcome ----------------------------------------------------


def test_a_stale_save_in_a_batch_fails_alone_and_the_others_commit(store: SQLiteStore) -> None:
    """In one batch, the save with a stale version raises ConflictError; the others commit."""
    firsts = [store.save(Checkpoint(f"r{i}", state={"n": 0})) for i in range(5)]
    stale = store.save(Checkpoint("stale", state={"n": 0}))
    moved = store.save(Checkpoint("stale", state={"n": 1}, version=stale.version))
    before = _row(store.path, "stale")
    group = store._group
    assert group is not None
    with HeldBatch(store) as held:
        fns: list[Callable[[], Any]] = [_bump(store, cp) for cp in firsts]
        fns.insert(
            2, lambda: store.save(Checkpoint("stale", state={"n": 9}, version=stale.version))
        )
        threads, results = _in_threads(fns)
        held.queued(6)
    _join(threads, "the batch's saves")
    _hooks.install(None)
    assert group.batch_sizes[6] == 1, dict(group.batch_sizes)
    assert isinstance(results[2], ConflictError), results[2]
    assert str(moved.version) in str(results[2])
    assert _row(store.path, "stale") == before
    for i, saved in enumerate(results[:2] + results[3:]):
        assert isinstance(saved, Checkpoint), saved
        assert store.load(f"r{i}") == saved


def test_a_statement_that_raises_in_a_batch_fails_alone(store: SQLiteStore) -> None:
    """A save whose statement raises (an injected trigger error) fails; the batch commits."""
    firsts = [store.save(Checkpoint(f"r{i}", state={"n": 0})) for i in range(4)]
    bad = store.save(Checkpoint("bad", state={"n": 0}))
    before = _row(store.path, "bad")
    store._conn().execute(
        "CREATE TRIGGER refuse_bad BEFORE UPDATE ON stepstone_checkpoints "
        "WHEN NEW.run_id = 'bad' BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )
    group = store._group
    assert group is not None
    with HeldBatch(store) as held:
        fns: list[Callable[[], Any]] = [_bump(store, cp) for cp in firsts]
        fns.insert(1, lambda: store.save(Checkpoint("bad", state={"n": 1}, version=bad.version)))
        threads, results = _in_threads(fns)
        held.queued(5)
    _join(threads, "the batch's saves")
    _hooks.install(None)
    assert group.batch_sizes[5] == 1, dict(group.batch_sizes)
    assert isinstance(results[1], StoreError), results[1]
    assert "injected failure" in str(results[1])
    assert _row(store.path, "bad") == before
    for i, saved in enumerate(results[:1] + results[2:]):
        assert isinstance(saved, Checkpoint), saved
        assert store.load(f"r{i}") == saved


def test_a_statement_that_rolls_the_transaction_back_fails_alone(store: SQLiteStore) -> None:
    """If one save's error rolls back the whole transaction, the others run again and commit."""
    firsts = [store.save(Checkpoint(f"r{i}", state={"n": 0})) for i in range(4)]
    bad = store.save(Checkpoint("bad", state={"n": 0}))
    store._conn().execute(
        "CREATE TRIGGER rollback_bad BEFORE UPDATE ON stepstone_checkpoints "
        "WHEN NEW.run_id = 'bad' BEGIN SELECT RAISE(ROLLBACK, 'injected rollback'); END"
    )
    with HeldBatch(store) as held:
        fns: list[Callable[[], Any]] = [_bump(store, cp) for cp in firsts]
        fns.insert(2, lambda: store.save(Checkpoint("bad", state={"n": 1}, version=bad.version)))
        threads, results = _in_threads(fns)
        held.queued(5)
    _join(threads, "the batch's saves")
    _hooks.install(None)
    assert isinstance(results[2], StoreError), results[2]
    assert "injected rollback" in str(results[2])
    assert store.load("bad") == bad
    for i, saved in enumerate(results[:2] + results[3:]):
        assert isinstance(saved, Checkpoint), saved
        assert store.load(f"r{i}") == saved


def test_a_too_large_checkpoint_fails_alone_among_concurrent_saves(store: SQLiteStore) -> None:
    """CheckpointTooLarge fails that save only; the saves beside it commit."""
    firsts = [store.save(Checkpoint(f"r{i}", state={"n": 0})) for i in range(4)]
    store._max_length = 20_000
    with HeldBatch(store) as held:
        fns: list[Callable[[], Any]] = [_bump(store, cp) for cp in firsts]
        # A long state would go to pieces: the input stays in the document.
        fns.append(lambda: store.save(Checkpoint("big", state={}, input={"x": "y" * 30_000})))
        threads, results = _in_threads(fns)
        held.queued(4)
        _join(threads[-1:], "the too-large save")
    _join(threads, "the batch's saves")
    _hooks.install(None)
    assert isinstance(results[-1], CheckpointTooLarge), results[-1]
    assert store.load("big") is None
    for i, saved in enumerate(results[:-1]):
        assert isinstance(saved, Checkpoint), saved
        assert store.load(f"r{i}") == saved


def test_a_failed_commit_fails_every_save_of_its_batch(store: SQLiteStore) -> None:
    """An error of the whole transaction (at the kill point) fails each save it held; none lands."""
    firsts = [store.save(Checkpoint(f"r{i}", state={"n": 0})) for i in range(3)]
    rows = [_row(store.path, f"r{i}") for i in range(3)]
    with HeldBatch(store) as held:
        fns: list[Callable[[], Any]] = [_bump(store, cp) for cp in firsts]
        threads, results = _in_threads(fns)
        held.queued(3)

        def boom(point: str) -> None:
            if threading.current_thread().name != "leader":
                raise RuntimeError("commit refused")

        kill_point("sqlite.in_transaction", boom)  # after HeldBatch's hook; removed below
    _join(threads, "the failing batch's saves")
    _hooks.install(None)
    for result in results:
        # The batch's leader raises the error itself; the others a copy of it.
        assert isinstance(result, RuntimeError) and "commit refused" in str(result), result
    assert [_row(store.path, f"r{i}") for i in range(3)] == rows
    # The store works afterwards: a fresh save of each run lands.
    for cp in firsts:
        store.save(Checkpoint(cp.run_id, state={"n": 2}, version=cp.version))


# --- timing of returns ------------------------------------------------------------------


def test_a_lone_save_commits_at_once_in_a_batch_of_one(store: SQLiteStore) -> None:
    """Saves one after another never wait for company: each commits in a batch of 1."""
    group = store._group
    assert group is not None
    cp = store.save(Checkpoint("solo", state={"n": 0}))
    for n in range(1, 10):
        cp = store.save(Checkpoint("solo", state={"n": n}, version=cp.version))
    assert dict(group.batch_sizes) == {1: 10}


def test_the_kill_point_sees_every_statement_executed_and_none_committed(
    store: SQLiteStore,
) -> None:
    """At sqlite.in_transaction of a batch, each save's row is written but not yet committed."""
    firsts = [store.save(Checkpoint(f"r{i}", state={"n": 0})) for i in range(4)]
    committed_rows = [_row(store.path, f"r{i}") for i in range(4)]
    seen: list[tuple[list[Any], list[Any]]] = []
    with HeldBatch(store) as held:
        fns: list[Callable[[], Any]] = [_bump(store, cp) for cp in firsts]
        threads, results = _in_threads(fns)
        held.queued(4)

        def look(point: str) -> None:
            if threading.current_thread().name != "leader":
                own = [
                    store._conn()
                    .execute(
                        "SELECT version FROM stepstone_checkpoints WHERE run_id = ?", (f"r{i}",)
                    )
                    .fetchone()[0]
                    for i in range(4)
                ]
                seen.append((own, [_row(store.path, f"r{i}") for i in range(4)]))

        kill_point("sqlite.in_transaction", look)  # after HeldBatch's hook; removed below
    _join(threads, "the batch's saves")
    _hooks.install(None)
    assert len(seen) == 1
    own, outside = seen[0]
    assert own == [r.version for r in results]  # executed, on the leader's connection
    assert outside == committed_rows  # not committed: other connections see the old rows


# --- crashes, cancellation, close, fork -------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from stepstone import Checkpoint, _hooks
    from stepstone.stores.sqlite import SQLiteStore

    path, mode = sys.argv[1], sys.argv[2]
    store = SQLiteStore(path)
    group = store._group
    cps = {f"r{i}": store.load(f"r{i}") for i in range(16)}
    gate, held, printed = threading.Event(), threading.Event(), []

    def hook(point):
        if point != "sqlite.in_transaction":
            return
        if threading.current_thread().name == "r0":  # the lone first save: hold it
            held.set()
            gate.wait(30)
        else:  # the batch of 15 queued behind it: executed, not committed
            os.kill(os.getpid(), signal.SIGKILL)

    def work(run_id):
        cp = cps[run_id]
        n = 0
        while True:
            n += 1
            cp = store.save(Checkpoint(run_id, state={"n": n, "pad": "p" * n},
                                       version=cp.version))
            if mode == "in_transaction":
                return
            if n == 3 and not printed:
                printed.append(run_id)
                print("saving", flush=True)

    threads = [threading.Thread(target=work, args=(f"r{i}",), name=f"r{i}") for i in range(16)]
    if mode == "in_transaction":
        _hooks.install(hook)
        threads[0].start()
        held.wait(30)
        for t in threads[1:]:
            t.start()
        deadline = time.monotonic() + 30
        while len(group._queue) < 15 and time.monotonic() < deadline:
            time.sleep(0.001)
        gate.set()
    else:
        for t in threads:
            t.start()
    for t in threads:
        t.join()
    """
)


def _seed_runs(path: str) -> dict[str, Checkpoint]:
    with SQLiteStore(path) as s:
        return {f"r{i}": s.save(Checkpoint(f"r{i}", state={"n": 0, "pad": ""})) for i in range(16)}


def _child(path: str, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, path, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.crash
def test_sigkill_at_a_batchs_kill_point_leaves_every_run_at_its_old_checkpoint(db: str) -> None:
    """A process killed (SIGKILL) inside a batch's transaction leaves each run's old checkpoint."""
    before = _seed_runs(db)
    child = _child(db, "in_transaction")
    try:
        assert child.wait(WAIT) == -signal.SIGKILL, "the child was not killed mid-batch"
    finally:
        child.kill()
    with SQLiteStore(db) as s:
        for run_id, cp in before.items():
            loaded = s.load(run_id)
            assert loaded is not None
            # r0 was the held lone save (committed); the batch of 15 was killed.
            if run_id == "r0":
                assert loaded.state == {"n": 1, "pad": "p"}
            else:
                assert loaded == cp


@pytest.mark.crash
def test_sigkill_while_batches_commit_leaves_every_checkpoint_whole(db: str) -> None:
    """A process SIGKILLed while 16 threads group-commit leaves each run old or new, whole."""
    _seed_runs(db)
    child = _child(db, "loop")
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # a thread has saved 3 times: batches are committing
        assert line.strip() == "saving", f"child never started saving: {line!r}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(WAIT) == -signal.SIGKILL
    finally:
        child.kill()
    with SQLiteStore(db) as s:
        for i in range(16):
            loaded = s.load(f"r{i}")
            assert loaded is not None
            n = loaded.state["n"]
            assert loaded.state == {"n": n, "pad": "p" * n}


def test_a_cancelled_asave_lands_whole_or_not_at_all(store: SQLiteStore) -> None:
    """Cancelling an asave queued in a batch leaves its run old or new, and the batch lands."""
    first = store.save(Checkpoint("c", state={"n": 0}))
    other = store.save(Checkpoint("o", state={"n": 0}))

    async def main() -> Any:
        task = asyncio.ensure_future(
            store.asave(Checkpoint("c", state={"n": 1, "pad": "z" * 5000}, version=first.version))
        )
        peer = asyncio.ensure_future(
            store.asave(Checkpoint("o", state={"n": 1}, version=other.version))
        )
        group = store._group
        assert group is not None
        deadline = time.monotonic() + WAIT
        while len(group._queue) < 2:
            assert time.monotonic() < deadline, "the asaves never queued behind the leader"
            await asyncio.sleep(0.002)
        task.cancel()
        held.release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)
        return await asyncio.wait_for(peer, WAIT)

    with HeldBatch(store) as held:
        peer_saved = asyncio.run(main())
    assert store.load("o") == peer_saved
    loaded = store.load("c")
    assert loaded is not None
    assert loaded == first or loaded.state == {"n": 1, "pad": "z" * 5000}


def test_close_during_saves_finishes_them_or_raises_the_closed_error(db: str) -> None:
    """Closing the store under 16 saving threads: every save lands or says the store is closed."""
    store = SQLiteStore(db)
    started = threading.Barrier(17, timeout=WAIT)
    outcomes: list[BaseException | None] = [None] * 16

    def work(i: int) -> None:
        cp = store.save(Checkpoint(f"r{i}", state={"n": 0}))
        started.wait()
        try:
            while True:
                cp = store.save(Checkpoint(f"r{i}", state={"n": 1}, version=cp.version))
        except BaseException as exc:  # noqa: BLE001 - the loop's end, asserted after
            outcomes[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    started.wait()
    store.close()
    _join(threads, "savers after close")
    _hooks.install(None)
    for exc in outcomes:
        assert isinstance(exc, StoreError) and "closed" in str(exc), repr(exc)


@pytest.mark.process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_wait_for_the_parents_committer(store: SQLiteStore) -> None:
    """A child forked while the parent leads a batch commits its own save in a batch of 1."""
    group = store._group
    assert group is not None
    real = group._execute
    parent = os.getpid()
    gate, holding = threading.Event(), threading.Event()

    def held_execute(batch: list[Pending]) -> None:
        # Hold the parent's leadership *before* BEGIN: a transaction open across fork
        # would leave SQLite's own in-process lock state held in the child.
        if os.getpid() == parent and not holding.is_set():
            holding.set()
            if not gate.wait(WAIT):
                raise AssertionError("the parent's leader was never released")
        real(batch)

    group._execute = held_execute
    threads, results = _in_threads(
        [
            lambda: store.save(Checkpoint("leader", state={"n": 1})),
            lambda: (holding.wait(WAIT), store.save(Checkpoint("queued", state={"n": 1})))[1],
        ]
    )
    try:
        assert holding.wait(WAIT), "the parent's first save never started its commit"
        _wait_for(lambda: len(group._queue) == 1, "a save to queue behind the parent's leader")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 1
            try:
                saved = store.save(Checkpoint("child", state={"n": 1}))
                forked = store._group
                sizes = None if forked is None else dict(forked.batch_sizes)
                code = 0 if sizes == {1: 1} and store.load("child") == saved else 2
            finally:
                os._exit(code)
        # The parent's leader is still held: the child must finish without it.
        deadline = time.monotonic() + WAIT
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError("the forked child's save hung waiting for the parent's leader")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        gate.set()
        _join(threads, "the parent's saves")
    assert all(isinstance(r, Checkpoint) for r in results), results
    assert store.load("child") is not None
    assert group.batch_sizes[1] == 2, dict(group.batch_sizes)


# --- the SQL servers: no client-side batching, one request per save -----------------------

SERVERS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


@pytest.fixture(params=sorted(SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[ServerStore]:
    from stepstone import open_store
    from stepstone.testing import backend_unavailable

    table = f"t_group_{os.getpid()}_{threading.get_ident() % 10_000}"
    try:
        store = open_store(f"{SERVERS[request.param]}?table={table}")
    except Exception as exc:  # noqa: BLE001 - a server that fails in any way is unavailable
        backend_unavailable(f"{request.param}: {type(exc).__name__}: {exc}")
    assert isinstance(store, ServerStore)
    try:
        yield store
    finally:
        store._exec(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")
        store.close()


def test_servers_32_threads_saving_concurrently_all_land_exactly(server: ServerStore) -> None:
    """32 threads chaining saves on PostgreSQL/MySQL all land (32: the server's connection cap)."""

    def chain(i: int) -> Checkpoint:
        cp = server.save(Checkpoint(f"r{i}", state={"n": 0}))
        for n in range(1, 10):
            cp = server.save(Checkpoint(f"r{i}", state={"n": n, "who": i}, version=cp.version))
        return cp

    threads, results = _in_threads([functools.partial(chain, i) for i in range(32)])
    _join(threads, "32 threads saving to the server")
    for i, last in enumerate(results):
        assert isinstance(last, Checkpoint), last
        assert server.load(f"r{i}") == last


def test_servers_500_tasks_saving_concurrently_all_land_exactly(server: ServerStore) -> None:
    """500 asyncio tasks chaining asaves on PostgreSQL/MySQL all land exactly."""

    async def chain(i: int) -> Checkpoint:
        cp = await server.asave(Checkpoint(f"t{i}", state={"n": 0}))
        for n in range(1, 3):
            cp = await server.asave(Checkpoint(f"t{i}", state={"n": n, "i": i}, version=cp.version))
        return cp

    async def main() -> list[Checkpoint]:
        return await asyncio.wait_for(asyncio.gather(*(chain(i) for i in range(500))), 120)

    for i, last in enumerate(asyncio.run(main())):
        assert server.load(f"t{i}") == last


def test_servers_a_lone_save_is_one_request(server: ServerStore) -> None:
    """On PostgreSQL/MySQL a save alone is still exactly one request to the server."""
    cp = server.save(Checkpoint("solo", state={"n": 0}))
    before = server.requests_sent
    server.save(Checkpoint("solo", state={"n": 1}, version=cp.version))
    assert server.requests_sent - before == 1
