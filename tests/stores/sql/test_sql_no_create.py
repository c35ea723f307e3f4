"""SQL server stores opened with ``create=false`` refuse missing tables; the CLI's
read-only commands open them so, and never create a store a typo named.

On PostgreSQL and MySQL/MariaDB, each test names a table that does not exist yet
(``fresh_table``, dropped after); "not created" is checked by opening it with
``create=false`` again, which refuses while the tables are missing.
"""

from __future__ import annotations

import pytest

from cli_support import cli
from fresh_stores import fresh_table
from stepstone import ConfigError, StoreError, open_store
from stepstone.stores.mysql import MySQLStore
from stepstone.stores.postgres import PostgresStore

SERVERS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


@pytest.fixture(params=sorted(SERVERS))
def config(request: pytest.FixtureRequest) -> str:
    """The config string of a table that does not exist, on each SQL server."""
    return fresh_table(request, SERVERS[str(request.param)])


def assert_missing(config: str) -> None:
    """Fail unless the tables of ``config`` are still missing."""
    with pytest.raises(StoreError, match="no store at"):
        open_store(f"{config}&create=false").close()


def test_create_false_refuses_missing_tables_and_creates_none(config: str) -> None:
    """``create=false`` in a config string refuses a missing table, naming it; creates none."""
    with pytest.raises(StoreError) as caught:
        open_store(f"{config}&create=false")
    table = config.rpartition("table=")[2]
    message = str(caught.value)
    assert message.startswith("no store at ") and table in message, message
    assert "does not exist" in message and "init" in message, message
    assert_missing(config)


def test_create_false_as_a_keyword_refuses_missing_tables(config: str) -> None:
    """The stores' ``create=False`` keyword refuses a missing table as the option does."""
    url, _, table = config.partition("?table=")
    kind = PostgresStore if url.startswith("postgresql") else MySQLStore
    with pytest.raises(StoreError, match="no store at"):
        kind(url, table=table, create=False)
    assert_missing(config)


def test_create_false_opens_tables_that_exist(config: str) -> None:
    """``create=false`` opens a store whose tables exist, and reads its runs; so does the CLI."""
    open_store(config).close()  # the default creates them
    store = open_store(f"{config}&create=false")
    try:
        assert list(store.list_runs()) == []
    finally:
        store.close()
    code, out, err = cli("runs", "list", "--store", f"{config}&create=true")
    assert code == 0, (out, err)


def test_create_takes_only_true_or_false(config: str) -> None:
    """A ``create`` value other than true or false is a config error saying what is allowed."""
    with pytest.raises(
        ConfigError, match="create='maybe' is not allowed: it must be true or false"
    ):
        open_store(f"{config}&create=maybe")


@pytest.mark.parametrize(
    "command",
    [
        ("runs", "list"),
        ("runs", "show", "r1"),
        ("runs", "history", "r1"),
        ("doctor",),
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_read_only_commands_do_not_create_missing_tables(
    config: str, command: tuple[str, ...]
) -> None:
    """A read-only command on a missing SQL table says "no store at", exits 1, creates nothing."""
    code, out, err = cli(*command, "--store", config)
    assert code == 1, (out, err)
    told = out + err  # doctor reports it as its failing check, on stdout
    assert "no store at " in told and "does not exist" in told, (out, err)
    assert_missing(config)


def test_ui_does_not_serve_or_create_missing_tables(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stepstone ui`` on a missing SQL table says "no store at" before serving; creates none."""
    uvicorn = pytest.importorskip("uvicorn")

    def serve(*args: object, **kwargs: object) -> None:
        pytest.fail("the dashboard started serving a store that does not exist")

    monkeypatch.setattr(uvicorn, "run", serve)
    code, out, err = cli("ui", "--store", config, "--port", "0")
    assert code == 1, (out, err)
    assert "no store at " in err and "does not exist" in err, err
    assert_missing(config)
