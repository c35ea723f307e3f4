"""SQLite's transactions: a batch of saves in one ``BEGIN IMMEDIATE``, and rollback.

The group commit (``_group.py``) hands ``run_batch`` the saves that were waiting; each
runs its own statement with its own rowcount, so a lost compare-and-swap or a failing
statement fails that save alone, and the batch commits once: one fsync for all.

A save with pieces (``Pending.first``) writes them in the same transaction, just before
its compare-and-swap: they land with it or not at all, with no commit (no fsync) of
their own. In a batch of several saves, each such save runs under a savepoint, so a
lost swap or a failing statement takes back its own pieces and nothing of the others.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from typing import Any

from ... import _hooks
from .._group import Pending

__all__ = ["rollback", "run_batch"]

#: The savepoint of one save with pieces inside a batch.
_SAVEPOINT = "stepstone_save"


def run_batch(
    conn: sqlite3.Connection,
    items: list[Pending],
    statement_error: Callable[[BaseException], BaseException],
) -> None:
    """Run several saves in ONE ``BEGIN IMMEDIATE`` ... ``COMMIT`` (group commit).

    Sets each item's ``stored`` (rows changed) or ``error`` (its own statement failed),
    and returns only after the COMMIT returned. Raises for a failure of the whole
    transaction (nothing of it was committed).
    """
    if len(items) == 1:  # a lone save, the common case: no bookkeeping
        item = items[0]
        conn.execute("BEGIN IMMEDIATE")
        try:
            try:
                if item.first:
                    write_pieces(conn, item.first)
                stored = item.stored = conn.execute(item.sql, item.params).rowcount
            except (sqlite3.Error, UnicodeEncodeError) as exc:
                item.error = statement_error(exc)
                rollback(conn)
                return
            if stored == 1:
                _hooks.fire("sqlite.in_transaction")
                conn.commit()
            else:
                conn.rollback()  # a lost swap: its pieces go with it
        except BaseException:
            rollback(conn)
            raise
        if stored == 1:
            _hooks.fire("sqlite.committed")  # tests: a save's answer lost after its COMMIT
        return
    todo = items
    committed = False
    while todo:
        conn.execute("BEGIN IMMEDIATE")
        try:
            todo = _statements(conn, todo, statement_error)
            if todo:
                continue  # SQLite rolled the transaction back: run the rest again
            if any(item.stored == 1 for item in items):
                _hooks.fire("sqlite.in_transaction")
                conn.commit()
                committed = True
            else:  # every swap lost or failed: nothing to make durable
                conn.rollback()
        except BaseException:
            rollback(conn)
            raise
    if committed:
        _hooks.fire("sqlite.committed")


def _statements(
    conn: sqlite3.Connection,
    todo: list[Pending],
    statement_error: Callable[[BaseException], BaseException],
) -> list[Pending]:
    """Run each save's statement; return the saves to run again, if any.

    A statement that fails is undone by SQLite alone (the statement journal) and
    fails its save alone. A few errors (disk full, I/O) roll back the whole
    transaction instead: then the saves without an error of their own are returned,
    to run again in a new transaction (each round removes the failed one, so this
    ends).
    """
    for item in todo:
        try:
            if item.first:
                item.stored = _with_pieces(conn, item)
            else:
                item.stored = conn.execute(item.sql, item.params).rowcount
        except (sqlite3.Error, UnicodeEncodeError) as exc:
            item.error = statement_error(exc)
            if not conn.in_transaction:
                again = [x for x in todo if x.error is None]
                for x in again:
                    x.stored = None
                return again
    return []


def write_pieces(conn: sqlite3.Connection, first: tuple[tuple[str, Any], ...]) -> None:
    """Run a save's piece statements in its open transaction (each within every limit)."""
    for sql, params in first:
        conn.execute(sql, params)
        _hooks.fire("pieces.piece")  # chaos: a kill between two pieces of a save
    _hooks.fire("pieces.written")  # chaos: pieces written, the swap not yet run


def _with_pieces(conn: sqlite3.Connection, item: Pending) -> int:
    """One save of a batch with its pieces, under a savepoint: return its rowcount.

    A lost swap rolls back to the savepoint (its pieces vanish, the batch's other saves
    stay); a failing statement does too, then raises as a failing statement does.
    """
    conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        write_pieces(conn, item.first)
        stored: int = conn.execute(item.sql, item.params).rowcount
    except (sqlite3.Error, UnicodeEncodeError):
        if conn.in_transaction:  # else SQLite rolled back the whole transaction itself
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
                conn.execute(f"RELEASE {_SAVEPOINT}")
        raise
    if stored != 1:
        conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
    conn.execute(f"RELEASE {_SAVEPOINT}")
    return stored


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back, keeping the original error: SQLite rolls back on close anyway."""
    with contextlib.suppress(sqlite3.Error):
        conn.rollback()
