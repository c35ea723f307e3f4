"""A pytest plugin that runs the OpenAI Agents SDK's own session tests on ``StepstoneSession``.

Loaded (``-p oa_sdk_sessions_plugin``) by ``test_openai_agents_sdk_sessions.py`` into a
pytest child process whose root is the SDK's extracted sdist. On import it puts
``SdkSession`` (a ``StepstoneSession`` with ``SQLiteSession``'s constructor) in place of
``agents.SQLiteSession``, before the SDK's test modules import that name, so each test
exercises our session where it exercised the SDK's. The backend is named by the
environment variable ``STEPSTONE_SDK_SESSION_BACKEND``: ``memory``, ``file`` or ``sqlite``.

The SDK's tests use ``pytest-asyncio`` (``asyncio_mode = "auto"``), which this project
does not install: ``pytest_pyfunc_call`` below runs a coroutine test on a fresh event loop,
which is all those tests need (they have no async fixtures).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import uuid
from pathlib import Path
from typing import Any

import agents
import agents.memory
import pytest
from agents.memory import SessionSettings

from stepstone import Store, open_store
from stepstone.adapters.openai_agents import StepstoneSession

BACKEND_ENV = "STEPSTONE_SDK_SESSION_BACKEND"

# The SDK tests that test something other than the ``Session`` protocol, each expected to
# fail here (strict xfail: once one passes, the list is stale and the run fails). ``SQLITE``:
# tests of ``SQLiteSession``'s own internals (its connection pool, worker-thread connections,
# file lock, rollback of its SQL transaction, rows written into its tables with sqlite3).
_SQLITE = "tests SQLiteSession's internals (its sqlite3 connections, tables or locks)"
EXPECTED_TO_DIFFER: dict[str, str] = {
    "test_sqlite_session_close_closes_worker_thread_connections": _SQLITE,
    "test_sqlite_session_reaps_connections_from_exited_worker_threads": _SQLITE,
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation": _SQLITE,
    "test_sqlite_session_keeps_connections_of_live_worker_threads": _SQLITE,
    "test_sqlite_session_closed_rejects_empty_add_items": "SQLiteSession's closed state: close()"
    " is not in the Session protocol, and a closed store is not a closed session",
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": _SQLITE,
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _SQLITE,
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _SQLITE,
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _SQLITE,
    "test_sqlite_session_file_lock_is_shared_across_instances": _SQLITE,
    "test_sqlite_session_failed_add_items_releases_write_lock": _SQLITE,
    "test_sqlite_session_failed_clear_session_rolls_back": _SQLITE,
    "test_sqlite_session_failed_pop_item_releases_write_lock": _SQLITE,
    "test_sqlite_session_rollback_failure_evicts_connection": _SQLITE,
    "test_sqlite_session_close_retries_quarantined_connection": _SQLITE,
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": _SQLITE,
}


def _store(db_path: str | Path) -> Store:
    """Open the store that stands for ``SQLiteSession``'s database at ``db_path``.

    ``":memory:"`` is a private database per session, as in SQLite; a path is one
    database that every session opened on it shares.
    """
    backend = os.environ.get(BACKEND_ENV, "memory")
    if str(db_path) == ":memory:":
        return open_store(f"memory://sdk-{uuid.uuid4().hex}")
    path = Path(db_path).resolve()
    if backend == "memory":
        return open_store(f"memory://sdk-{hashlib.sha256(str(path).encode()).hexdigest()}")
    if backend == "file":
        return open_store(f"file://{path}.runs")
    if backend == "sqlite":
        return open_store(f"sqlite:///{path}")
    raise ValueError(f"{BACKEND_ENV} must be memory, file or sqlite, got {backend!r}")


class SdkSession(StepstoneSession):
    """``StepstoneSession`` behind ``SQLiteSession``'s constructor and ``close``."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(session_id, _store(db_path), session_settings=session_settings)
        self.db_path = db_path

    def close(self) -> None:
        """Close the store this session opened."""
        self.store.close()


# Before collection, so ``from agents import SQLiteSession`` in a test module finds ours.
setattr(agents, "SQLiteSession", SdkSession)  # noqa: B010 (mypy: another class)
setattr(agents.memory, "SQLiteSession", SdkSession)  # noqa: B010


def pytest_configure(config: pytest.Config) -> None:
    """Register the SDK's markers (its own ini is not read)."""
    for marker in ("asyncio", "allow_call_model_methods", "serial", "review_optional"):
        config.addinivalue_line("markers", f"{marker}: a marker of the SDK's test suite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of another session's internals as expected to fail, strictly."""
    for item in items:
        reason = EXPECTED_TO_DIFFER.get(getattr(item, "originalname", item.name))
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a coroutine test function to completion on a fresh event loop."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True
