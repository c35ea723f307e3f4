"""The conftest that LangGraph's own graph tests run with, in place of theirs.

``test_langgraph_own_suite.py`` copies this file to ``tests/conftest.py`` of the unpacked
``langgraph`` sdist. Theirs needs Docker services (Postgres, Redis) and three more saver
packages; this one gives the fixtures the chosen test files use, with the checkpointers
compared: LangGraph's ``InMemorySaver`` (their ``memory``) and ``StepstoneSaver`` on a
memory store and on a SQLite file. Each test's outcome and checkpointer go to the JSON
lines file ``$STEPSTONE_LG_REPORT``.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any
from unittest import mock

import pytest
from langgraph.cache.base import BaseCache
from langgraph.cache.memory import InMemoryCache
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.types import Durability

from stepstone.adapters.langgraph import StepstoneSaver

pytest.register_assert_rewrite("tests.memory_assert")

from tests.memory_assert import MemorySaverAssertImmutable  # type: ignore[import-not-found]  # noqa: E402

CHECKPOINTERS = ["memory", "stepstone_memory", "stepstone_sqlite"]


def _saver(name: str) -> Iterator[BaseCheckpointSaver[Any]]:
    if name == "memory":
        yield MemorySaverAssertImmutable()
        return
    if name == "stepstone_memory":
        # Not uuid4: a test may have patched it to a fixed sequence it counts on.
        with StepstoneSaver.from_config(f"memory://lg-{os.urandom(8).hex()}") as saver:
            yield saver
        return
    with (
        tempfile.TemporaryDirectory() as tmp,
        StepstoneSaver.from_config(f"sqlite:///{tmp}/lg.db") as saver,
    ):
        yield saver


@pytest.fixture
def anyio_backend() -> str:
    """LangGraph's async tests run on asyncio."""
    return "asyncio"


@pytest.fixture
def deterministic_uuids() -> Iterator[mock.MagicMock]:
    """uuid4 answers a fixed sequence, as their conftest's fixture does."""
    side_effect = (uuid.UUID(f"00000000-0000-4000-8000-{i:012}", version=4) for i in range(10000))
    with mock.patch("uuid.uuid4", side_effect=side_effect) as patched:
        yield patched


@pytest.fixture(params=["sync", "async", "exit"])
def durability(request: pytest.FixtureRequest) -> Durability:
    """Each durability mode, as theirs."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=["memory"])
def cache(request: pytest.FixtureRequest) -> BaseCache[Any]:
    """The in-memory node cache (theirs adds SQLite and Redis caches)."""
    return InMemoryCache()


@pytest.fixture(params=["in_memory"])
def sync_store(request: pytest.FixtureRequest) -> BaseStore:
    """The in-memory long-term store."""
    return InMemoryStore()


@pytest.fixture(params=["in_memory"])
async def async_store(request: pytest.FixtureRequest) -> AsyncIterator[BaseStore]:
    """The in-memory long-term store, for async tests."""
    yield InMemoryStore()


@pytest.fixture(params=CHECKPOINTERS)
def sync_checkpointer(request: pytest.FixtureRequest) -> Iterator[BaseCheckpointSaver[Any]]:
    """The reference saver and ours."""
    yield from _saver(request.param)


@pytest.fixture(params=CHECKPOINTERS)
async def async_checkpointer(
    request: pytest.FixtureRequest,
) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """The reference saver and ours, for async tests."""
    for saver in _saver(request.param):
        yield saver


def _checkpointer(item: pytest.Item) -> str | None:
    """The checkpointer a collected test runs on, or None where it takes none."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    saver = params.get("sync_checkpointer", params.get("async_checkpointer"))
    return saver if isinstance(saver, str) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the tests that take a saver (``$STEPSTONE_LG_SAVER_TESTS_ONLY``), and of
    those only the ones on the checkpointers named in ``$STEPSTONE_LG_CHECKPOINTERS``
    (comma-separated; all of them when unset)."""
    if not os.environ.get("STEPSTONE_LG_SAVER_TESTS_ONLY"):
        return
    chosen = set(filter(None, os.environ.get("STEPSTONE_LG_CHECKPOINTERS", "").split(",")))
    keep = [
        i
        for i in items
        if (saver := _checkpointer(i)) is not None and (not chosen or saver in chosen)
    ]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Record each test's outcome with the checkpointer it ran on."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    path = os.environ.get("STEPSTONE_LG_REPORT")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    saver = _checkpointer(item)
    with open(path, "a") as f:
        entry = {"nodeid": item.nodeid, "when": report.when, "outcome": report.outcome}
        f.write(json.dumps({**entry, "checkpointer": saver}) + "\n")
