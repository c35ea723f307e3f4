"""MySQL's async path warns of nothing the sync path keeps quiet about.

The pieces table is made with ``CREATE TABLE IF NOT EXISTS`` when a store first keeps a
long state; on a table that exists the server answers with a note ("already exists").
PyMySQL (the sync path) never turns notes into Python warnings; aiomysql did, so every
async store's first long state warned. Both paths now stay quiet.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Iterator

import pytest

from fresh_stores import MYSQL_URL, fresh_table
from stepstone import Checkpoint, Store, _statelog, open_store

#: Past ``_statelog.INLINE_MAX``: the state is kept in pieces.
_LONG = {"text": "x" * (4 * _statelog.INLINE_MAX)}


@pytest.fixture
def config(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh MySQL/MariaDB table whose schema, pieces table included, exists already."""
    config = fresh_table(request, MYSQL_URL)
    with open_store(config) as store:
        store.init()
    yield config


def _quiet(
    call: object, caplog: pytest.LogCaptureFixture
) -> tuple[list[str], list[logging.LogRecord]]:
    """Run ``call`` recording every Python warning and every logged warning."""
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        assert callable(call)
        call()
    return [str(w.message) for w in caught], [
        r for r in caplog.records if r.levelno >= logging.WARNING
    ]


def test_the_async_path_keeps_the_pieces_table_note_quiet(
    config: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An async save of a long state into an existing pieces table warns of nothing."""

    async def save() -> None:
        store: Store = open_store(config)
        try:
            saved = await store.asave(Checkpoint("long", state=_LONG))
            loaded = await store.aload("long")
            assert loaded is not None and loaded.state == _LONG and saved.version
        finally:
            await store.aclose()

    found, logged = _quiet(lambda: asyncio.run(save()), caplog)
    assert found == [], f"the async path warned: {found}"
    assert logged == [], f"the async path logged: {[r.getMessage() for r in logged]}"


def test_the_sync_path_keeps_the_pieces_table_note_quiet(
    config: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync save of a long state into an existing pieces table warns of nothing."""

    def save() -> None:
        with open_store(config) as store:
            store.save(Checkpoint("long", state=_LONG))
            loaded = store.load("long")
            assert loaded is not None and loaded.state == _LONG

    found, logged = _quiet(save, caplog)
    assert found == [], f"the sync path warned: {found}"
    assert logged == [], f"the sync path logged: {[r.getMessage() for r in logged]}"
