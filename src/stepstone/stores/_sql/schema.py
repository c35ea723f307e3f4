"""The tables' version and the statement text the SQL stores run, read from ``_sql_text``.

Opening a store must not import SQLAlchemy (about 300 ms, and an extra): the statements
are compiled by ``tools/sqlgen.py`` from the SQLAlchemy definitions kept there, checked
in as ``stores/_sql_text.py``, and ``tools/sqlgen.py --check`` (and a test) fails when
the two drift.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Mapping
from typing import Any, Final

from .._sql_text import STATEMENTS

__all__ = ["FIELDS", "MIGRATABLE", "PLACEHOLDER", "TABLE_SCHEMA", "SQLText", "statements_of"]

#: Version of the tables' layout (not of the documents in them). 2 added ``due_at`` and
#: ``owner`` beside ``status`` and the (status, due_at) index that ``claimable`` reads.
TABLE_SCHEMA: Final = 2
#: Schema versions a store migrates from when it opens them.
MIGRATABLE: Final = frozenset({1})
#: Stands for the table name in the generated text; table names are checked against
#: ``[a-z_][a-z0-9_]{0,47}``, so replacing it is exact.
PLACEHOLDER: Final = "stepstone__table__"
#: The statements of each dialect, by name.
FIELDS: Final = (
    "bump",
    "claim_ready",
    "claims",
    "create",
    "delete",
    "delete_cas",
    "info",
    "info_one",
    "insert",
    "keys",
    "list",
    "load",
    "migrate_v1",
    "schema_version",
    "seed",
    "update",
    "update_same",
    "version",
)


class SQLText:
    """The statements of one store as text, with its table's name filled in."""

    bump: str
    #: ``Store.claim_ready`` in one statement; "" where the dialect cannot.
    claim_ready: str
    claims: list[tuple[str, str]]
    create: list[str]
    delete: str
    delete_cas: str
    info: str
    info_one: str
    insert: str
    keys: str
    list: str
    load: str
    migrate_v1: builtins.list[str]
    schema_version: str
    seed: str
    update: str
    #: SQLite: ``update`` without setting status and owner, which it compares instead;
    #: "" elsewhere.
    update_same: str
    version: str

    def __init__(self, texts: Mapping[str, Any], table: str | None) -> None:
        def fill(value: Any) -> Any:
            if isinstance(value, str):
                return value if table is None else value.replace(PLACEHOLDER, table)
            if isinstance(value, tuple):
                return tuple(fill(v) for v in value)
            return [fill(v) for v in value]

        for name in FIELDS:
            setattr(self, name, fill(texts[name]))


@functools.cache
def statements_of(kind: str, table: str | None = None) -> SQLText:
    """Return the statement text of ``kind`` ("sqlite", "postgresql", "mysql") for a table."""
    return SQLText(STATEMENTS[kind], table)
