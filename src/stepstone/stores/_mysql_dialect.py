"""What MySQL and MariaDB say and accept: the error table, the schema, one-call claims.

The data half of ``stepstone.stores.mysql`` (whose docstring tells the design): which
server errors become which stepstone error, the statements that create the tables,
and which server versions can claim in one call.
"""

from __future__ import annotations

import re
from typing import Final

from .._errors import StoreError, StorePermissionError, StoreUnavailable
from ._errortable import ErrorRule
from ._sql import DEFAULT_TABLE, PASSWORD_ENV
from ._sql.pieces import schema_script

_FORMS: Final = (
    "mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (also mysql+pymysql://; MySQL or "
    "MariaDB); options: ?table=NAME&connect_timeout=S&read_timeout=S&write_timeout=S"
    "&create=true|false; "
    f"give the password in {PASSWORD_ENV} rather than in the URL"
)
_OPTIONS: Final = ("table", "connect_timeout", "read_timeout", "write_timeout", "create")
_NO_SUCH_TABLE: Final = 1146
#: The oldest servers with SKIP LOCKED, JSON_TABLE and JSON_VALUE.
_ONE_CALL_MYSQL: Final = (8, 0, 21)
_ONE_CALL_MARIADB: Final = (10, 6, 0)


def one_call_reason(version: str) -> str | None:
    """Return why a server of ``version`` (``SELECT VERSION()``) cannot claim in one call.

    None when it can (MySQL 8.0.21+, MariaDB 10.6+).
    """
    # Through old clients' protocol, MariaDB calls itself "5.5.5-10.x.y-MariaDB".
    match = re.match(r"(?:5\.5\.5-(?=\d+\.\d+\.\d+-MariaDB))?(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return f"server version {version!r} is not understood"
    found = tuple(int(part) for part in match.groups())
    least = _ONE_CALL_MARIADB if "mariadb" in version.lower() else _ONE_CALL_MYSQL
    if found < least:
        name = "MariaDB" if least == _ONE_CALL_MARIADB else "MySQL"
        return (
            f"{name} {version} has no SKIP LOCKED / JSON_TABLE / JSON_VALUE "
            f"(needs {'.'.join(map(str, least))}+)"
        )
    return None


# --- schema -----------------------------------------------------------------------------


def schema_ddl(table: str = DEFAULT_TABLE) -> str:
    """Return the SQL the store runs to create its schema (``backends/mysql/schema.sql``).

    Args:
        table: The checkpoint table's name; the meta table is ``<table>_meta``.
    """
    how = (
        "-- When the table is missing, MySQLStore runs these statements one by one\n"
        "-- (MySQL commits each DDL statement by itself).\n"
    )
    return schema_script("mysql", table, how)


# --- errors -----------------------------------------------------------------------------

#: PyMySQL / aiomysql errors (the same classes) -> stepstone errors, first match wins.
ERRORS: Final = (
    ErrorRule(
        StoreError,
        "{where}: table {table} is missing ({text}); run `stepstone init` or "
        "backends/mysql/schema.sql",
        codes=frozenset({_NO_SUCH_TABLE}),
    ),
    ErrorRule(
        StorePermissionError,
        "{where}: permission denied ({text})",
        codes=frozenset({1044, 1045, 1142, 1143, 1227, 1370, 1698}),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: the statement was rolled back; nothing was stored ({text})",
        codes=frozenset({1205, 1213}),  # lock wait timeout, deadlock
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: cannot reach the server, it did not answer in time, or the connection "
        "broke ({text})",
        codes=frozenset(
            {
                1040,  # too many connections
                1053,  # server shutdown in progress
                1927,  # connection was killed (MariaDB)
                2002,  # can't connect through socket
                2003,  # can't connect to server (refused, timed out)
                2005,  # unknown host
                2006,  # server has gone away
                2013,  # lost connection during query (also: read/write timeout)
                2055,  # lost connection (system error)
                3024,  # max_execution_time exceeded
            }
        ),
        classes=("TimeoutError",),
    ),
    ErrorRule(StoreError, "{where}: the database does not exist ({text})", codes=frozenset({1049})),
    ErrorRule(
        StoreError,
        "{where}: statement over max_allowed_packet ({text})",
        codes=frozenset({1153, 1301}),
    ),
    ErrorRule(StoreUnavailable, "{where}: connection closed ({text})", classes=("InterfaceError",)),
)
