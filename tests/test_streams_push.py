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
