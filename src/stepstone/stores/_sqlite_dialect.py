"""What SQLite says and runs: the error table and the schema of ``SQLiteStore``.

The data half of ``stepstone.stores.sqlite`` (whose docstring tells the design): which
result codes become which stepstone error, and the statements that create the tables.
"""

from __future__ import annotations

from typing import Final

from .._errors import CorruptCheckpoint, StoreError, StorePermissionError, StoreUnavailable
from ._errortable import ErrorRule
from ._sql import SQLText, statements_of
from ._sql.pieces import schema_script

__all__ = ["ERRORS", "schema_ddl"]


def _statements() -> SQLText:
    return statements_of("sqlite")


def schema_ddl() -> str:
    """Return the SQL the store runs to create its schema, as in ``backends/sqlite/schema.sql``."""
    how = "-- SQLiteStore runs these statements in one BEGIN IMMEDIATE transaction on open.\n"
    return schema_script("sqlite", None, how)


# --- errors -----------------------------------------------------------------------------

# Primary result codes (extended codes carry them in the low byte).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN = 11, 13, 14
_SQLITE_AUTH, _SQLITE_NOTADB = 23, 26

#: sqlite3 errors -> stepstone errors; the first matching rule wins.
ERRORS: Final = (
    ErrorRule(
        StoreUnavailable,
        "{where}: database is locked by another connection and stayed locked for the "
        "whole busy_timeout ({text}); raise busy_timeout or shorten other writers",
        codes=frozenset({_SQLITE_BUSY, _SQLITE_LOCKED}),
        text=("database is locked", "database table is locked"),
    ),
    ErrorRule(
        CorruptCheckpoint,
        "{where}: not a SQLite database or corrupted ({text}); left untouched",
        codes=frozenset({_SQLITE_NOTADB, _SQLITE_CORRUPT}),
        text=("not a database", "malformed"),
    ),
    ErrorRule(
        StorePermissionError,
        "{where}: permission denied ({text})",
        codes=frozenset({_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_AUTH}),
        text=("readonly",),
    ),
    ErrorRule(
        StoreError,
        "{where}: cannot open the database file ({text})",
        codes=frozenset({_SQLITE_CANTOPEN}),
        text=("unable to open",),
    ),
    ErrorRule(
        StoreError, "{where}: disk or database full ({text})", codes=frozenset({_SQLITE_FULL})
    ),
    ErrorRule(StoreError, "{where}: the store is closed", text=("closed database",)),
)
