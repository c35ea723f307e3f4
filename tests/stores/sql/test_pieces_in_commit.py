"""A SQL store writes a save's pieces in the transaction of its compare-and-swap.

- while a save writes its pieces (at ``pieces.piece`` and ``pieces.written``), another
  connection sees none of them: they land with the document, in one commit (on SQLite
  one fsync per save, not one per piece);
- a save interrupted between two pieces leaves the old checkpoint and no piece behind
  (no orphan to collect);
- a lost swap leaves none of its pieces, without a statement to drop them, and takes
  back the sweep that rode it;
- in a SQLite batch (group commit), a lost swap or a failing piece takes back its own
  pieces only; the other saves of the batch commit.

On SQLite, PostgreSQL and MySQL, sync and async (the servers' tests are the rest tier's).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import fresh_config
from stepstone import ConflictError, Store, _hooks, open_store
from stepstone import _statelog as sl
from stepstone._checkpoint import Checkpoint, Stored
from stepstone.stores._group import Pending
from stepstone.stores._sql.transactions import run_batch

State = dict[str, Any]


@pytest.fixture(params=("sqlite", "postgresql", "mysql"))
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture(params=("sync", "async"))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Interrupted(Exception):
    """Raised by the test's hook inside a save."""


@contextmanager
def hook(action: Callable[[str], None]) -> Iterator[None]:
    before = _hooks.installed()
    _hooks.install(action)
    try:
        yield
    finally:
        _hooks.install(before)


def _save(store: Store, cp: Checkpoint, mode: str) -> Checkpoint:
    return asyncio.run(store.asave(cp)) if mode == "async" else store.save(cp)


def _long(n: int, tag: str = "t") -> State:
    # Incompressible enough to need several pieces at a small piece size.
    return {"items": [{"n": i, "text": f"{tag}{i:05d}" * 60} for i in range(n)]}


def _whole(cp: Checkpoint, state: State) -> Checkpoint:
    """``cp`` one step on with ``state``, saved whole (a new base: new pieces)."""
    handle = cp.stored_state
    assert isinstance(handle, Stored)
    return replace(
        cp,
        step=cp.step + 1,
        step_names=(*cp.step_names, f"s{cp.step + 1}"),
        state=state,
        stored_state=replace(handle, private=None),
    )


def _ref(cp: Checkpoint) -> dict[str, Any]:
    handle = cp.stored_state
    assert isinstance(handle, Stored) and handle.ref is not None, "the state is not in pieces"
    return handle.ref


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 4 KiB: a state of ~300 KB is many of them."""
    monkeypatch.setattr(sl, "PIECE_MAX", 4096)


@pytest.mark.usefixtures("small_pieces")
def test_no_piece_is_visible_before_the_swap_commits(config: str, mode: str) -> None:
    with open_store(config) as store, open_store(config) as other:
        first = _save(store, Checkpoint("tx", state=_long(200, "a")), mode)
        before = set(other.piece_keys("tx"))
        seen: list[tuple[str, set[str]]] = []

        def look(point: str) -> None:
            if point in ("pieces.piece", "pieces.written"):
                seen.append((point, set(other.piece_keys("tx"))))

        with hook(look):
            second = _save(store, _whole(first, _long(220, "b")), mode)
        assert sum(point == "pieces.piece" for point, _ in seen) > 2, seen
        assert seen[-1][0] == "pieces.written"
        for point, keys in seen:
            assert keys == before, f"{point}: pieces visible before the swap committed"
        assert set(other.piece_keys("tx")) >= set(sl.pieces_of(_ref(second)))
        loaded = other.load("tx")
        assert loaded is not None and loaded.state == _long(220, "b")


@pytest.mark.usefixtures("small_pieces")
def test_a_save_interrupted_between_two_pieces_leaves_no_piece(config: str, mode: str) -> None:
    with open_store(config) as store:
        first = _save(store, Checkpoint("cut", state=_long(200, "a")), mode)
        before = store.piece_keys("cut")
        fired = 0

        def cut(point: str) -> None:
            nonlocal fired
            if point == "pieces.piece":
                fired += 1
                if fired == 2:
                    raise Interrupted("between the second and the third piece")

        with hook(cut), pytest.raises(Interrupted):
            _save(store, _whole(first, _long(220, "b")), mode)
        assert fired == 2
        with open_store(config) as other:
            assert other.piece_keys("cut") == before, "the interrupted save left pieces"
            loaded = other.load("cut")
            assert loaded is not None and loaded.version == first.version
            assert loaded.state == _long(200, "a")
        # The run goes on from the stored checkpoint, on the same store (no transaction
        # of the interrupted save is left open on its connection).
        again = _save(store, _whole(first, _long(230, "c")), mode)
    with open_store(config) as reopened:
        assert reopened.piece_keys("cut") == sorted(sl.pieces_of(_ref(again)))
        loaded = reopened.load("cut")
        assert loaded is not None and loaded.state == _long(230, "c")


@pytest.mark.usefixtures("small_pieces")
def test_a_lost_swap_writes_no_piece_and_drops_none(config: str, mode: str) -> None:
    with open_store(config) as a, open_store(config) as b:
        first = _save(a, Checkpoint("lost", state=_long(200, "a")), mode)
        winner = _save(a, _whole(first, _long(210, "w")), mode)
        kept = a.piece_keys("lost")
        statements: list[str] = []

        def count(point: str) -> None:
            statements.append(point)

        with hook(count), pytest.raises(ConflictError):
            _save(b, _whole(first, _long(220, "l")), mode)
        assert "pieces.piece" in statements  # it did write pieces, in its transaction
        assert a.piece_keys("lost") == kept == sorted(sl.pieces_of(_ref(winner)))


@pytest.mark.usefixtures("small_pieces")
def test_a_lost_swap_takes_back_its_sweep_of_the_pieces_the_winner_names(
    config: str, mode: str
) -> None:
    """A whole save sweeps what its new base supersedes in its own transaction (SQLite:
    before its swap; PostgreSQL: after it, only if it landed). Here the loser's sweep
    covers the base and log the winner's document names: the lost swap must take it
    back, and the winner's checkpoint still loads."""
    with open_store(config) as a, open_store(config) as b:
        first = _save(a, Checkpoint("sweep", state=_long(200, "a")), mode)
        # As a step does: one item appended to the state it was handed (a log piece).
        handed = first.state
        handed["items"].append({"n": 200, "text": "one more"})
        grown = _long(200, "a")
        grown["items"].append({"n": 200, "text": "one more"})
        winner = _save(a, replace(first, step=1, step_names=("s0", "s1")), mode)
        assert _ref(winner)["log"], "the winner's save wrote a new base, not a log piece"
        named = sorted(sl.pieces_of(_ref(winner)))
        with pytest.raises(ConflictError):
            _save(b, _whole(first, _long(220, "l")), mode)
        assert a.piece_keys("sweep") == named, "the lost save's sweep took the winner's pieces"
    with open_store(config) as reopened:
        loaded = reopened.load("sweep")
        assert loaded is not None and loaded.version == winner.version
        assert loaded.state == grown


@pytest.mark.usefixtures("small_pieces")
def test_sqlite_sweeps_a_superseded_base_in_the_saves_own_commit(tmp_path: Path) -> None:
    """A whole save of a run in pieces deletes the base it supersedes inside its own
    transaction: one commit (one fsync) per new base, not a second for the sweep."""
    with open_store(f"sqlite:///{tmp_path}/sweep.db") as store:
        first = store.save(Checkpoint("one", state=_long(200, "a")))
        old = store.piece_keys("one")
        conn = store._conn()  # type: ignore[attr-defined]
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            second = store.save(_whole(first, _long(220, "b")))
        finally:
            conn.set_trace_callback(None)
        assert store.piece_keys("one") == sorted(sl.pieces_of(_ref(second)))
        assert not set(old) & set(store.piece_keys("one"))
        kinds = [s.split()[0].upper() for s in statements]
        begin, commit = kinds.index("BEGIN"), kinds.index("COMMIT")
        assert kinds.count("COMMIT") == 1, statements
        assert begin < kinds.index("DELETE") < commit, statements


def _toy() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE runs (k TEXT PRIMARY KEY, v INTEGER)")
    conn.execute("CREATE TABLE pieces (k TEXT PRIMARY KEY, run TEXT)")
    conn.executemany("INSERT INTO runs VALUES (?, 0)", [("a",), ("b",), ("c",)])
    conn.execute("INSERT INTO pieces VALUES ('taken', 'x')")
    return conn


def _item(run: str, expected: int, pieces: list[str]) -> Pending:
    first = tuple(("INSERT INTO pieces VALUES (?, ?)", (piece, run)) for piece in pieces)
    return Pending("UPDATE runs SET v = v + 1 WHERE k = ? AND v = ?", (run, expected), first)


def _error(exc: BaseException) -> BaseException:
    return RuntimeError(str(exc))


def test_a_batch_takes_back_only_the_pieces_of_its_lost_or_failing_saves() -> None:
    conn = _toy()
    lost = _item("a", 7, ["a1", "a2"])  # its swap misses
    failing = _item("b", 0, ["b1", "taken"])  # its second piece violates the key
    landing = _item("c", 0, ["c1", "c2"])
    run_batch(conn, [lost, failing, landing], _error)
    assert (lost.stored, lost.error) == (0, None)
    assert failing.stored is None and isinstance(failing.error, RuntimeError)
    assert (landing.stored, landing.error) == (1, None)
    assert not conn.in_transaction
    assert conn.execute("SELECT k FROM pieces ORDER BY k").fetchall() == [
        ("c1",),
        ("c2",),
        ("taken",),
    ]
    assert conn.execute("SELECT k, v FROM runs ORDER BY k").fetchall() == [
        ("a", 0),
        ("b", 0),
        ("c", 1),
    ]


def test_a_lone_save_commits_its_pieces_with_its_swap_or_not_at_all() -> None:
    conn = _toy()
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    run_batch(conn, [_item("a", 0, ["a1", "a2"])], _error)
    assert traced[0] == "BEGIN IMMEDIATE" and traced[-1] == "COMMIT", traced
    assert sum(sql.startswith("INSERT") for sql in traced) == 2
    traced.clear()
    lost = _item("b", 5, ["b1"])
    run_batch(conn, [lost], _error)
    assert lost.stored == 0 and "COMMIT" not in traced, traced
    assert conn.execute("SELECT k FROM pieces WHERE run = 'b'").fetchall() == []


@pytest.mark.usefixtures("small_pieces")
@pytest.mark.parametrize("pipelined", [True, False], ids=["pipeline", "no-pipeline"])
def test_postgresql_sends_a_save_with_pieces_in_one_round_trip(
    pipelined: bool,
    mode: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One round trip with libpq's pipeline mode, the superseded pieces' collection
    included; without it (libpq < 14) one a statement, the same transaction."""
    from stepstone.stores._sql import save_pg
    from stepstone.stores.postgres import PostgresStore

    monkeypatch.setattr(save_pg, "_pipelines", lambda is_async: pipelined)
    with open_store(fresh_config("postgresql", request, tmp_path)) as store:
        assert isinstance(store, PostgresStore)
        first = _save(store, Checkpoint("rt", state=_long(200, "a")), mode)
        sent = store.requests_sent
        second = _save(store, _whole(first, _long(220, "b")), mode)
        pieces = len(sl.pieces_of(_ref(second)))
        assert pieces > 2
        # BEGIN, the swap, the pieces, the new base's collection (only if the swap
        # landed), COMMIT: all in the one transaction.
        assert store.requests_sent - sent == (1 if pipelined else pieces + 4)
        loaded = store.load("rt")
        assert loaded is not None and loaded.state == _long(220, "b")
        assert store.piece_keys("rt") == sorted(sl.pieces_of(_ref(second)))


def test_postgresql_sweeps_superseded_pieces_only_if_its_swap_landed(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The collection that rides a PostgreSQL save deletes nothing unless the run's row
    holds that save's version: a lost swap must never take the pieces the winner's
    document names."""
    from stepstone.stores.postgres import PostgresStore

    with open_store(fresh_config("postgresql", request, tmp_path)) as store:
        assert isinstance(store, PostgresStore)
        first = store.save(Checkpoint("sw", state=_long(200, "a")))
        second = store.save(_whole(first, _long(220, "b")))
        named = sorted(sl.pieces_of(_ref(second)))
        assert store.piece_keys("sw") == named  # the first base's pieces were swept
        ref = _ref(second)
        sweep = {
            "run_key": store._key("sw"),
            "gen": ref["gen"] + 5,  # everything this incarnation holds
            "inc_like": f"{ref['inc']}:%",
            "any_inc": "%:%",
            "cutoff": sl.inc_cutoff(sl.ORPHAN_AGE),
        }
        sql = store._pieces_sql.delete_below_landed
        deleted, _ = store._exec(sql, {**sweep, "version": "not-the-stored-version"})
        assert deleted == 0 and store.piece_keys("sw") == named
        loaded = store.load("sw")
        assert loaded is not None and loaded.state == _long(220, "b")
        deleted, _ = store._exec(sql, {**sweep, "version": second.version})
        assert deleted == len(named) and store.piece_keys("sw") == []
