"""Stream readers woken by the store's push (issue 34): PostgreSQL's stream channel.

A stream writer sends ``announce_stream`` after each block; PostgreSQL turns it into a
``NOTIFY`` on a channel of the table's own for streams, which ``listen_stream`` hears
and the workers' ``listen`` does not. Elsewhere ``announce_stream`` does nothing and
``listen_stream`` is the store's ``listen`` (it rings on every write).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import fresh_config
from stepstone import Step, Store, astream, open_store, run, stream
from stepstone._stream import _writer
from stepstone.stores._sql import stream_hub_pg
from waiting import WAIT_TIMEOUT, until


def _wait(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT_TIMEOUT), f"timed out after {WAIT_TIMEOUT:g}s waiting for {what}"


class _Ring:
    """A listener's ring that counts, and an event for the next ring."""

    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()


@pytest.mark.server
def test_a_flush_notifies_stream_readers_not_workers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = fresh_config("postgresql", request, tmp_path)
    with open_store(config) as reader, open_store(config) as writer:
        streams, workers = _Ring(), _Ring()
        heard_streams = reader.listen_stream(streams)
        heard_workers = reader.listen(workers)
        assert heard_streams is not None and heard_workers is not None
        try:
            # Each listener rings once after its LISTEN (it may have missed some).
            _wait(streams.event, "the stream listener's first ring")
            _wait(workers.event, "the workers' listener's first ring")
            streams.event.clear()
            before = workers.count
            writer.announce_stream("some-run")
            _wait(streams.event, "a ring on the stream channel after announce_stream")
            writer.announce()
            until("the workers' ring after announce", lambda: workers.count > before)
            assert workers.count == before + 1  # announce_stream did not ring the workers
        finally:
            heard_streams.close()
            heard_workers.close()


def test_the_writer_announces_each_block(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Each appended block is announced once, after it is stored (every backend calls it)."""
    announced: list[str] = []

    def emit_two_blocks(state: dict[str, Any], ctx: Any) -> None:
        ctx.emit("tick", 1)
        _writer.current.get().writer.flush()  # type: ignore[union-attr]
        ctx.emit("tick", 2)

    with open_store(fresh_config("sqlite", request, tmp_path)) as store:
        store.announce_stream = announced.append  # type: ignore[method-assign,assignment]
        run("push-blocks", [Step("emit", emit_two_blocks)], store)
        assert [e.data for e in stream(store, "push-blocks", follow=False)] == [1, 2]
    assert announced == ["push-blocks", "push-blocks"]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_async_reader_is_woken_by_the_push(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``astream`` follows a live run through the store's listener, then ends with it."""
    release = threading.Event()
    started = threading.Event()

    def talk(state: dict[str, Any], ctx: Any) -> None:
        ctx.emit("tokens", "first")
        _writer.current.get().writer.flush()  # type: ignore[union-attr]
        started.set()
        _wait(release, "the reader to see the first event")
        ctx.emit("tokens", "second")

    with open_store(fresh_config(kind, request, tmp_path)) as store:
        worker = threading.Thread(target=run, args=("push-live", [Step("talk", talk)], store))
        worker.start()
        try:
            _wait(started, "the step to flush its first event")

            async def follow(store: Store) -> list[Any]:
                seen = []
                async for event in astream(store, "push-live"):
                    seen.append(event.data)
                    release.set()
                return seen

            seen = asyncio.run(asyncio.wait_for(follow(store), WAIT_TIMEOUT))
        finally:
            release.set()
            worker.join(WAIT_TIMEOUT)
        assert seen == ["first", "second"]


def _listener_alive(store: Any, pid: int) -> bool:
    """Whether the server still has a backend ``pid`` (asked on a connection of our own)."""
    import psycopg  # here: the driver is needed by PostgreSQL's tests only

    with psycopg.connect(**store._connect_args) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchall()
    return bool(rows)


@pytest.mark.server
def test_readers_in_one_process_share_one_listen_connection(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """N readers of N live runs, on two store objects: one LISTEN, each woken, then closed."""
    n = 4
    release = threading.Event()
    flushed = [threading.Event() for _ in range(n)]
    seen: list[list[Any]] = [[] for _ in range(n)]
    first_seen = [threading.Event() for _ in range(n)]

    def talker(i: int) -> Any:
        def talk(state: dict[str, Any], ctx: Any) -> None:
            ctx.emit("tokens", f"first {i}")
            _writer.current.get().writer.flush()  # type: ignore[union-attr]
            flushed[i].set()
            _wait(release, "the test to release the writers")
            ctx.emit("tokens", f"second {i}")

        return talk

    def read(store: Store, i: int) -> None:
        for event in stream(store, f"share-{i}"):
            seen[i].append(event.data)
            first_seen[i].set()

    config = fresh_config("postgresql", request, tmp_path)
    with open_store(config) as a, open_store(config) as b, open_store(config) as writer:
        assert stream_hub_pg.open_hubs() == []
        writers = [
            threading.Thread(target=run, args=(f"share-{i}", [Step("talk", talker(i))], writer))
            for i in range(n)
        ]
        readers = [threading.Thread(target=read, args=(a if i % 2 else b, i)) for i in range(n)]
        try:
            for t in writers:
                t.start()
            for i in range(n):
                _wait(flushed[i], f"run {i}'s first flush")
            for t in readers:
                t.start()
            for i in range(n):
                _wait(first_seen[i], f"reader {i}'s first event")
            until(
                f"{n} readers on one shared listener",
                lambda: [h.readers for h in stream_hub_pg.open_hubs()] == [n],
            )
            (hub,) = stream_hub_pg.open_hubs()
            until("the shared listener's connection", lambda: hub.listener.backend_pid is not None)
            pid = hub.listener.backend_pid
            assert pid is not None and _listener_alive(a, pid)
            release.set()
            for i, t in enumerate(readers):
                t.join(WAIT_TIMEOUT)
                assert not t.is_alive(), f"reader {i} did not end with its run"
            assert seen == [[f"first {i}", f"second {i}"] for i in range(n)]
            assert stream_hub_pg.open_hubs() == []  # the last reader closed it
            until("the listener's connection to close", lambda: not _listener_alive(a, pid))
        finally:
            release.set()
            for t in writers:
                t.join(WAIT_TIMEOUT)


@pytest.mark.server
def test_the_shared_listener_rings_only_the_runs_notified(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A flush's NOTIFY carries its run id: readers of other runs are not woken."""
    config = fresh_config("postgresql", request, tmp_path)
    with open_store(config) as reader, open_store(config) as writer:
        rings = {run_id: _Ring() for run_id in ("r0", "r1", "r2")}
        subs = [reader.listen_stream(ring, run_id=run_id) for run_id, ring in rings.items()]
        try:
            for run_id, ring in rings.items():
                _wait(ring.event, f"{run_id}'s first ring (after LISTEN, or on joining)")
                ring.event.clear()
            before = {run_id: ring.count for run_id, ring in rings.items()}
            writer.announce_stream("r1")
            writer.announce_stream("r2")
            # One sender's notifications arrive in order: r2's ring means r1's came.
            _wait(rings["r2"].event, "r2's ring after its flush")
            _wait(rings["r1"].event, "r1's ring after its flush")
            assert rings["r0"].count == before["r0"]  # not woken by others' flushes
        finally:
            for sub in subs:
                assert sub is not None
                sub.close()
