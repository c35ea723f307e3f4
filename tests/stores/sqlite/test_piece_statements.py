"""SQLite's piece statements: which keys they take, and no LIKE on a bound pattern.

SQLite re-prepares a statement whose LIKE (or GLOB) pattern is a bound parameter each
time the binding changes: its LIKE optimization reads the value. The sweep after every
new base cost 117,000 instructions that way, 21,000 with the ``instr``/``substr`` tests
(issue 36). Those tests must take exactly the keys LIKE took: of the incarnation named,
of any incarnation, or legacy ones (no ``:``).
"""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from stepstone.stores._sql.pieces import PieceSQL, piece_sql

INC = "0000ab12cd34ef56"
OTHER = "0000ab12cd34ef57"
KEYS = [
    ("7.b0", 1),  # legacy: no incarnation
    (f"{INC}:1.t.b0", 1),
    (f"{INC}:2.t.b0", 2),
    (f"{INC}:3.t.b0", 3),
    (f"{INC}0:1.t.b0", 1),  # an incarnation that merely starts with INC
    (f"{INC[:-1]}:1.t.b0", 1),  # one INC starts with
    (f"{OTHER}:1.t.b0", 1),  # another incarnation, as old as INC
    (f"{INC.upper()}:1.t.b0", 1),  # not INC (incarnations are lowercase hex)
    ("00000001aaaaaaaa:1.t.b0", 1),  # an old incarnation
]


def _inc(key: str) -> str | None:
    inc, colon, _ = key.partition(":")
    return inc if colon else None


@pytest.fixture
def sql() -> PieceSQL:
    return piece_sql("sqlite", None)


def _table(sql: PieceSQL) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute(sql.create)
    for run in ("r", "s"):
        for key, gen in KEYS:
            conn.execute(sql.insert, {"run_key": run, "piece_key": key, "gen": gen, "data": b"x"})
    return conn


def _left(conn: sqlite3.Connection, run: str = "r") -> set[str]:
    rows = conn.execute("SELECT piece_key FROM stepstone_pieces WHERE run_id = ?", (run,))
    return {key for (key,) in rows}


def test_no_piece_statement_matches_a_bound_pattern_with_like(sql: PieceSQL) -> None:
    texts = {
        field.name: getattr(sql, field.name)
        for field in dataclasses.fields(sql)
        if isinstance(getattr(sql, field.name), str)
    }
    assert "delete_below" in texts and "orphans" in texts
    for name, text in texts.items():
        assert " LIKE " not in text.upper() and " GLOB " not in text.upper(), name


@pytest.mark.parametrize("below", [1, 2, 3, 4])
def test_the_sweep_takes_the_incarnations_older_generations_and_old_orphans(
    sql: PieceSQL, below: int
) -> None:
    conn = _table(sql)
    cutoff = "0000ab12"  # incarnations made before this second are old
    conn.execute(
        sql.delete_below,
        {"run_key": "r", "gen": below, "inc_like": f"{INC}:%", "any_inc": "%:%", "cutoff": cutoff},
    )
    expected = {
        key
        for key, gen in KEYS
        if not (
            _inc(key) is not None
            and ((_inc(key) == INC and gen < below) or (_inc(key) != INC and key < cutoff))
        )
    }
    assert _left(conn) == expected
    assert _left(conn, "s") == {key for key, _ in KEYS}, "another run's pieces were taken"
    assert "7.b0" in expected
    assert "00000001aaaaaaaa:1.t.b0" not in expected


def test_an_incarnations_delete_takes_its_keys_only(sql: PieceSQL) -> None:
    conn = _table(sql)
    conn.execute(sql.delete_inc, {"run_key": "r", "inc_like": f"{INC}:%"})
    assert _left(conn) == {key for key, _ in KEYS if _inc(key) != INC}


def test_the_legacy_delete_takes_keys_without_an_incarnation_only(sql: PieceSQL) -> None:
    conn = _table(sql)
    conn.execute(sql.delete_legacy, {"run_key": "r", "any_inc": "%:%"})
    assert _left(conn) == {key for key, _ in KEYS if _inc(key) is not None}
    conn.execute(sql.delete_below_legacy, {"run_key": "s", "gen": 2, "any_inc": "%:%"})
    assert _left(conn, "s") == {key for key, _ in KEYS if key != "7.b0"}


def test_orphans_are_old_incarnations_without_a_document(sql: PieceSQL) -> None:
    conn = _table(sql)
    conn.execute("CREATE TABLE stepstone_checkpoints (run_id TEXT PRIMARY KEY, document TEXT)")
    conn.execute("INSERT INTO stepstone_checkpoints VALUES ('s', '{}')")
    rows = conn.execute(sql.orphans, {"any_inc": "%:%", "cutoff": "0000ab13"}).fetchall()
    found = {(run, key) for run, key, _size in rows}
    assert found == {("r", key) for key, _ in KEYS if _inc(key) is not None and key < "0000ab13"}
