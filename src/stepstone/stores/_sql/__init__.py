"""The SQL base shared by SQLiteStore, PostgresStore and MySQLStore.

One concept per module:

- ``schema``: the tables' version and the checked-in statement text (``_sql_text``).
- ``config``: server URLs, typed options, table names, drivers.
- ``errors``: driver errors through the one error table (``_errortable``).
- ``effects``: the ``Exec`` effect and the sync / async drivers.
- ``connections``: per-thread and per-loop connections, close, fork safety.
- ``store``: the store logic, each method once as a plan of effects.
- ``pages``: the dashboard's paged listing queries.
- ``server``: what the two server stores share.

The dialect modules (``sqlite``, ``postgres``, ``mysql``) import this package; it never
imports them. The SQLAlchemy definitions that produce ``_sql_text`` live in
``tools/sqlgen.py``, outside the wheel.
"""

# What the dialect modules take from here; the rest of ``config`` they import from it.
from .config import DEFAULT_TABLE, PASSWORD_ENV, detach_socket
from .connections import Held, Pieces
from .schema import PLACEHOLDER, TABLE_SCHEMA, SQLText, statements_of
from .server import ServerStore
from .store import SQLStore

__all__ = [
    "DEFAULT_TABLE",
    "PASSWORD_ENV",
    "PLACEHOLDER",
    "TABLE_SCHEMA",
    "Held",
    "Pieces",
    "SQLStore",
    "SQLText",
    "ServerStore",
    "detach_socket",
    "statements_of",
]
