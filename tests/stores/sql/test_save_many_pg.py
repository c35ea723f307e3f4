"""``save_many`` on PostgreSQL: the saves of one call in one transaction, one round trip.

The contract (each save's own outcome, a lost swap failing alone) is ``StoreContract``'s;
here, what PostgreSQL adds: ``BEGIN``, every swap with its pieces, ``COMMIT`` pipelined in
one round trip, a statement's error failing the whole call with nothing of it
committed, and a process killed as the call is sent leaving all or none of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fresh_stores import fresh_config
from stepstone import Checkpoint, StoreError, _hooks, open_store
from stepstone.stores.postgres import PostgresStore

REPO = Path(__file__).resolve().parents[3]
WAIT = 60.0


@pytest.fixture
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_config("postgresql", request, tmp_path)


@pytest.fixture
def store(config: str) -> Iterator[PostgresStore]:
    with open_store(config) as opened:
        assert isinstance(opened, PostgresStore)
        yield opened


def test_one_call_is_one_round_trip(store: PostgresStore) -> None:
    first = store.save(Checkpoint("old", state={"v": 1}))
    before = store.requests_sent
    outcomes = store.save_many(
        [
            *(Checkpoint(f"r{n}", state={"n": n}) for n in range(6)),
            Checkpoint("old", step=1, state={"v": 2}, version=first.version),
        ]
    )
    assert all(isinstance(o, Checkpoint) for o in outcomes), outcomes
    assert store.requests_sent - before == 1, "more than one round trip for one save_many"
    for n in range(6):
        loaded = store.load(f"r{n}")
        assert loaded is not None and loaded.state == {"n": n}


def test_a_statement_error_fails_the_call_and_commits_nothing(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One save's statement fails on the server: the transaction is aborted, every save
    of the call fails with the store's error, none lands, and the connection goes on."""
    real = store._run_many

    def broken(held: object, items: list[object]) -> None:
        items[1].sql = "INSERT INTO no_such_table_here VALUES (1)"  # type: ignore[attr-defined]
        real(held, items)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_run_many", broken)
    outcomes = store.save_many([Checkpoint(f"e{n}", state={"n": n}) for n in range(3)])
    assert all(isinstance(o, StoreError) for o in outcomes), outcomes
    assert [store.load(f"e{n}") for n in range(3)] == [None] * 3
    monkeypatch.undo()
    again = store.save_many([Checkpoint(f"e{n}", state={"n": n}) for n in range(3)])
    assert all(isinstance(o, Checkpoint) for o in again), again


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from stepstone import Checkpoint, _hooks, open_store

    store = open_store(sys.argv[1])
    kept = store.load("kept")

    def hook(point):
        if point == "sql.before_request":
            os.kill(os.getpid(), signal.SIGKILL)  # nothing sent yet

    _hooks.install(hook)
    store.save_many([
        Checkpoint("kept", step=1, state={"v": 2}, version=kept.version),
        *(Checkpoint(f"made{n}", state={"n": n}) for n in range(3)),
    ])
    print("not killed", flush=True)
    """
)


@pytest.mark.crash
def test_sigkill_before_the_call_is_sent_leaves_none_of_it(config: str) -> None:
    with open_store(config) as s:
        kept = s.save(Checkpoint("kept", state={"v": 1}))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, config], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        code = child.wait(WAIT)
    finally:
        child.kill()
    assert code == -signal.SIGKILL, f"the child was not killed ({code})"
    with open_store(config) as s:  # reopened from the config string, as a new process
        assert s.load("kept") == kept
        assert [s.load(f"made{n}") for n in range(3)] == [None] * 3


def test_async_save_many_is_one_round_trip(store: PostgresStore) -> None:
    import asyncio

    before = store.requests_sent
    outcomes = asyncio.run(store.asave_many([Checkpoint(f"a{n}", state={}) for n in range(4)]))
    assert all(isinstance(o, Checkpoint) for o in outcomes), outcomes
    assert store.requests_sent - before == 1
    _hooks.install(None)
