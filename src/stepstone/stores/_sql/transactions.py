"""SQLite's transactions: a batch of saves in one ``BEGIN IMMEDIATE``, and rollback.

The group commit (``_group.py``) hands ``run_batch`` the saves that were waiting; each
runs its own statement with its own rowcount, so a lost compare-and-swap or a failing
statement fails that save alone, and the batch commits once: one fsync for all.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable

from ... import _hooks
from .._group import Pending

__all__ = ["rollback", "run_batch"]


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
                stored = item.stored = conn.execute(item.sql, item.params).rowcount
            except (sqlite3.Error, UnicodeEncodeError) as exc:
                item.error = statement_error(exc)
                rollback(conn)
                return
            if stored == 1:
                _hooks.fire("sqlite.in_transaction")
                conn.commit()
            else:
                conn.rollback()
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
            item.stored = conn.execute(item.sql, item.params).rowcount
        except (sqlite3.Error, UnicodeEncodeError) as exc:
            item.error = statement_error(exc)
            if not conn.in_transaction:
                again = [x for x in todo if x.error is None]
                for x in again:
                    x.stored = None
                return again
    return []


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back, keeping the original error: SQLite rolls back on close anyway."""
    with contextlib.suppress(sqlite3.Error):
        conn.rollback()
