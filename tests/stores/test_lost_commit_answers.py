"""A save whose write landed but whose answer was lost, retried (issue 29, item 3).

A hook raises ``StoreUnavailable`` right after each backend's commit point (the
statement answered, the rename done, the item written), as a read timeout or a
connection dropped after COMMIT would. The caller then retries the same save (the same
``Checkpoint`` object) and must get that write's success, not a conflict with itself;
a genuinely different writer must still get ``ConflictError``. On every backend, sync
and async, with a small state and a long one (in pieces).

Backends as in ``tests/engine/test_upgrades.py``: a missing server is a loud skip locally and
a failure under CI.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS, fresh_config
from stepstone import ConflictError, StoreUnavailable, open_store
from stepstone._checkpoint import Checkpoint
from stepstone._store import Store
from stepstone.testing import kill_point

MODES = ("sync", "async")
State = dict[str, Any]

#: Each backend's point right after its commit: the write is stored, the caller not told.
LANDED = {
    "memory": "memory.saved",
    "file": "file.after_rename",
    "sqlite": "sqlite.committed",
    "postgresql": "sql.request_sent",
    "mysql": "sql.request_sent",
    "cosmos": "cosmos.request_sent",
}
#: Each durable backend's point right before its commit: the write is not stored.
NOT_LANDED = {
    "file": "file.after_temp_write",
    "sqlite": "sqlite.in_transaction",
    "postgresql": "sql.before_request",
    "mysql": "sql.before_request",
    "cosmos": "cosmos.before_request",
}

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    """The backend under test."""
    return str(request.param)


@pytest.fixture
def store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of ``kind``, as ``fresh_stores`` makes one."""
    with open_store(fresh_config(kind, request, tmp_path)) as opened:
        yield opened


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``sync``: save/load; ``async``: asave/aload."""
    return str(request.param)


def _save(store: Store, cp: Checkpoint, mode: str) -> Checkpoint:
    if mode == "async":
        return asyncio.run(store.asave(cp))
    return store.save(cp)


def _load(store: Store, run_id: str, mode: str) -> Checkpoint:
    cp = asyncio.run(store.aload(run_id)) if mode == "async" else store.load(run_id)
    assert cp is not None, run_id
    return cp


def _lost(store: Store, cp: Checkpoint, mode: str, point: str) -> None:
    """Save ``cp`` with its answer lost at ``point``: the save raises StoreUnavailable."""
    fired: list[str] = []

    def lose(name: str) -> None:
        if not fired:
            fired.append(name)
            raise StoreUnavailable(f"test: the answer of the save was lost at {name}")

    with kill_point(point, lose), pytest.raises(StoreUnavailable, match="answer of the save"):
        _save(store, cp, mode)
    assert fired == [point], f"the save never reached {point}"


def _next(cp: Checkpoint, state: State) -> Checkpoint:
    """``cp`` one step on, as the runner saves it."""
    step = cp.step + 1
    return replace(cp, step=step, step_names=(*cp.step_names, f"s{step}"), state=state)


def _long(n: int, tag: str) -> State:
    """A state past the inline limit: the backends keep it in pieces."""
    return {"items": [{"n": i, "text": tag * 300} for i in range(n)]}


@pytest.mark.parametrize("size", ["small", "long"])
def test_a_retried_save_whose_answer_was_lost_succeeds(
    store: Store, kind: str, mode: str, size: str
) -> None:
    """A first save and a later one, each landed with its answer lost, succeed when retried."""
    run_id = f"lost-{mode}-{size}"
    first: State = {"a": 1} if size == "small" else _long(40, "a")
    cp0 = Checkpoint(run_id, state=first, total_steps=5)
    _lost(store, cp0, mode, LANDED[kind])
    saved0 = _save(store, cp0, mode)  # the retry: the same object
    assert saved0.version == _load(store, run_id, mode).version
    assert _load(store, run_id, mode).state == first

    second: State = {"a": 2} if size == "small" else {"items": [*first["items"], {"n": 99}]}
    cp1 = _next(saved0, second)
    _lost(store, cp1, mode, LANDED[kind])
    saved1 = _save(store, cp1, mode)
    loaded = _load(store, run_id, mode)
    assert saved1.version == loaded.version != saved0.version
    assert loaded.state == second and loaded.step == 0
    # What the retry returned is a checkpoint to go on from, as any save's is.
    third: State = {"a": 3} if size == "small" else {"items": [*second["items"], {"n": 100}]}
    saved2 = _save(store, _next(saved1, third), mode)
    assert _load(store, run_id, mode).state == third
    assert _load(store, run_id, mode).version == saved2.version


@pytest.mark.parametrize("size", ["small", "long"])
def test_another_writer_still_conflicts_after_a_lost_answer(
    store: Store, kind: str, mode: str, size: str
) -> None:
    """After a lost answer, an equal but rebuilt save and a stale retry both conflict.

    Long: the lost save's write landed with pieces, and the other writer's save is made
    from a load of it; the stale retry then drops its own pieces as a lost save's, and
    the stored run must stay whole (a save made from a load writes a new base, never
    a log against pieces another writer wrote).
    """
    run_id = f"other-{mode}-{size}"
    zero: State = {"a": 0} if size == "small" else _long(40, "z")
    base = _save(store, Checkpoint(run_id, state=zero, total_steps=5), mode)
    one: State = (
        {"a": 1} if size == "small" else {"items": [*zero["items"], *_long(20, "o")["items"]]}
    )
    cp1 = _next(base, one)
    _lost(store, cp1, mode, LANDED[kind])
    # Another writer's save from the same base (equal content, another object) conflicts:
    # only the save that wrote the token may claim its write.
    with pytest.raises(ConflictError):
        _save(store, replace(cp1), mode)
    # Someone moves the run on; the lost save's retry now meets their write, not its own.
    landed = _load(store, run_id, mode)
    assert landed.state == one
    two: State = {"a": 2} if size == "small" else {"items": [*one["items"], {"n": -1}]}
    moved = _save(store, _next(landed, two), mode)
    with pytest.raises(ConflictError):
        _save(store, cp1, mode)
    loaded = _load(store, run_id, mode)
    assert loaded.version == moved.version and loaded.state == two


@pytest.mark.parametrize("kind", list(NOT_LANDED), indirect=True)  # memory has no such point
@pytest.mark.parametrize("size", ["small", "long"])
def test_a_retry_of_a_save_that_did_not_land_writes_it(
    store: Store, kind: str, mode: str, size: str
) -> None:
    """A save failed before its commit point, retried, is stored whole (pieces included)."""
    run_id = f"unlanded-{mode}-{size}"
    state = {"a": 1} if size == "small" else _long(40, "b")
    cp0 = Checkpoint(run_id, state=state, total_steps=5)
    _lost(store, cp0, mode, NOT_LANDED[kind])
    assert (asyncio.run(store.aload(run_id)) if mode == "async" else store.load(run_id)) is None
    saved = _save(store, cp0, mode)
    loaded = _load(store, run_id, mode)
    assert loaded.version == saved.version and loaded.state == state


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize("nth", [1, 2])
def test_the_langgraph_saver_absorbs_a_lost_answer(
    store: Store, kind: str, mode: str, nth: int
) -> None:
    """A put whose one commit (its record and head together, ``save_many``) landed
    unanswered succeeds: the thread's first put (``nth`` 1) or the one extending it (2)."""
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from stepstone.adapters.langgraph import StepstoneSaver

    saver = StepstoneSaver(store, prefix=f"lost{nth}{mode}")
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    meta: Any = {"source": "input", "step": -1, "parents": {}}
    seen: list[str] = []

    def lose(name: str) -> None:
        seen.append(name)
        if len(seen) == nth:
            raise StoreUnavailable(f"test: the answer of write {nth} was lost at {name}")

    def put(config: Any, meta: Any) -> Any:
        if mode == "async":
            return asyncio.run(saver.aput(config, empty_checkpoint(), meta, {}))
        return saver.put(config, empty_checkpoint(), meta, {})

    with kill_point(LANDED[kind], lose):
        first = put(config, meta)  # the adapter saved the same objects again
        stored = saver.get_tuple(config)
        assert stored is not None and stored.config == first
        # The thread goes on from it: the head is the put's checkpoint.
        second = put(first, {"source": "loop", "step": 0, "parents": {}})
    assert len(seen) >= nth, f"the puts never reached commit {nth}"
    head = saver.get_tuple(config)
    assert head is not None and head.config == second
    again = saver.get_tuple(first)
    assert again is not None and again.config == first


class _DroppingProxy:
    """A TCP proxy to PostgreSQL that can lose one answer, as a dropped network would.

    Armed, it forwards the client's next ``UPDATE``, waits for the server's answer (the
    statement has then committed: PostgreSQL commits before it answers), discards it
    and closes the client's connection.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        dropping = False
        try:
            while True:
                ready, _, _ = select.select([client, server], [], [])
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        return
                    # The save's compare-and-swap (its pieces, if any, went before).
                    if self.armed.is_set() and b"UPDATE " in data:
                        self.armed.clear()
                        dropping = True
                    server.sendall(data)
                if server in ready:
                    data = server.recv(65536)
                    if not data:
                        return
                    if dropping:
                        self.dropped.set()
                        return  # the answer is lost with the connection
                    client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()

    def close(self) -> None:
        self.closing = True
        self.listener.close()


@pytest.mark.parametrize("size", ["small", "long"])
def test_a_postgresql_answer_lost_on_the_network_is_retried(
    request: pytest.FixtureRequest, mode: str, size: str
) -> None:
    """A save whose answer a proxy drops after COMMIT fails unavailable; its retry succeeds."""
    from fresh_stores import fresh_table

    proxy = _DroppingProxy(("127.0.0.1", 5432))
    request.addfinalizer(proxy.close)
    config = fresh_table(request, f"postgresql://postgres@127.0.0.1:{proxy.port}/test")
    run_id = f"net-{mode}-{size}"
    state: State = {"a": 1} if size == "small" else _long(40, "n")
    first = Checkpoint(run_id, state={"a": 0}, total_steps=5)

    def sync(store: Store) -> tuple[Checkpoint, Checkpoint]:
        cp = _next(store.save(first), state)
        proxy.armed.set()  # on the connection the next save uses (it is pooled)
        with pytest.raises(StoreUnavailable):
            store.save(cp)
        saved = store.save(cp)
        loaded = store.load(run_id)
        assert loaded is not None
        return saved, loaded

    async def in_one_loop(store: Store) -> tuple[Checkpoint, Checkpoint]:
        # One loop throughout: its connections are opened by the first save.
        cp = _next(await store.asave(first), state)
        proxy.armed.set()
        with pytest.raises(StoreUnavailable):
            await store.asave(cp)
        saved = await store.asave(cp)
        loaded = await store.aload(run_id)
        assert loaded is not None
        return saved, loaded

    with open_store(config) as store:
        saved, loaded = asyncio.run(in_one_loop(store)) if mode == "async" else sync(store)
    assert proxy.dropped.is_set(), "the proxy dropped no answer"
    assert loaded.version == saved.version and loaded.state == state


def test_unanswered_saves_are_matched_by_identity_and_bounded() -> None:
    """Only the very object kept gets its plan back, once; past LIMIT runs the oldest goes."""
    from stepstone.stores._common import Unanswered

    kept = Unanswered()
    cp = Checkpoint("r0")
    kept.keep(cp, "r0", "plan-0")
    assert kept.take(replace(cp), "r0") is None  # equal, but another save
    assert kept.take(cp, "r0") == "plan-0"
    assert kept.take(cp, "r0") is None  # taken: a later failure keeps it again
    objects = [Checkpoint(f"r{i}") for i in range(Unanswered.LIMIT + 1)]
    for i, obj in enumerate(objects):
        kept.keep(obj, obj.run_id, f"plan-{i}")
    assert kept.take(objects[0], "r0") is None
    assert kept.take(objects[-1], objects[-1].run_id) == f"plan-{Unanswered.LIMIT}"
