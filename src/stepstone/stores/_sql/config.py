"""Configuration of the SQL server stores: their URL, options, table name and driver.

A URL is ``scheme[+driver]://user[:password]@host[:port]/database[?options]``; each
backend names its options (``_options.Option`` rows, typed) and refuses any other part
it does not understand, listing the valid forms. A URL that cannot be parsed is shown
only through ``_redact.redact_url``: never with its password.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from ..._errors import ConfigError
from ..._redact import redact_url
from .._options import Option, flag, number, parse, text

__all__ = [
    "DEFAULT_TABLE",
    "PASSWORD_ENV",
    "ServerURL",
    "check_table",
    "detach_socket",
    "import_driver",
    "parse_server_url",
    "positive_seconds",
    "run_key",
    "server_options",
]

PASSWORD_ENV: Final = "STEPSTONE_SQL_PASSWORD"
DEFAULT_TABLE: Final = "stepstone_checkpoints"
SUPPORTED: Final = "postgresql+psycopg, mysql+pymysql"
# Lower case only: PostgreSQL folds unquoted names and MySQL on Linux does not, so mixed
# case would name different tables in hand-written SQL. 48 leaves room for the index and
# meta table names under PostgreSQL's 63-byte identifier limit.
_TABLE_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,47}")
# PostgreSQL's catalogs (searched before the user's schemas) and SQLite's internal tables.
_SYSTEM_PREFIXES: Final = ("pg_", "sqlite_")
# System schemas of PostgreSQL and MySQL / MariaDB.
_SYSTEM_NAMES: Final = frozenset({"information_schema", "mysql", "performance_schema", "sys"})


@dataclass(frozen=True, slots=True)
class ServerURL:
    """The parts of a ``scheme[+driver]://user[:password]@host[:port]/database`` URL."""

    user: str | None
    password: str | None
    host: str
    port: int
    database: str


def positive_seconds(name: str, value: object) -> float:
    """Return ``value`` as positive finite seconds, or raise ``ConfigError``."""
    if isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
    return seconds


def server_options(names: tuple[str, ...]) -> tuple[Option[Any], ...]:
    """The typed options of a server URL: ``table`` (text), ``create`` (true or false),
    the others seconds (> 0)."""
    return tuple(
        text(name) if name == "table" else flag(name) if name == "create" else number(name)
        for name in names
    )


def parse_server_url(
    config: str, backend: str, driver: str, port: int, forms: str, options: tuple[str, ...]
) -> tuple[ServerURL, dict[str, Any]]:
    """Parse a server URL and its options, refusing what this backend does not know.

    Raises:
        ConfigError: malformed, another driver, no database, unknown options.
    """
    parts = urlsplit(config)
    scheme, _, named = parts.scheme.lower().partition("+")
    if scheme != backend:
        raise ConfigError(f"not a {backend} store config: {redact_url(config)!r}; forms: {forms}")
    if named not in ("", driver):
        raise ConfigError(
            f"driver {scheme}+{named} is not supported; supported: {SUPPORTED} "
            f"(or plain postgresql / mysql). Forms: {forms}"
        )
    if parts.fragment:
        raise ConfigError(f"SQL store config has a #fragment; forms: {forms}")
    try:
        host = parts.hostname or "localhost"
        number_ = parts.port or port
    except ValueError:
        # ``from None``: the original's text may quote the URL, password included.
        raise ConfigError(
            f"malformed SQL store URL {redact_url(config)!r} (bad port); forms: {forms}"
        ) from None
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigError(f"SQL store URL names no database; forms: {forms}")
    values = parse(parts.query, server_options(options), forms)
    if "table" in values:
        check_table(values["table"])
    url = ServerURL(
        None if parts.username is None else unquote(parts.username),
        None if parts.password is None else unquote(parts.password),
        host,
        number_,
        database,
    )
    return url, values


def check_table(table: object) -> str:
    """Return ``table`` if it is a safe table name, else raise ``ConfigError``.

    Names are quoted in every statement, so SQL keywords (``select``, ``user``) are
    fine; names the servers keep for themselves are refused on every backend (one rule,
    so a table name that works on one server works on the other): on PostgreSQL a
    ``pg_*`` name resolves to the system catalog first, and a table named after a
    server's system schema is a trap for anyone writing SQL by hand.
    """
    allowed = (
        "use 1-48 lower-case letters, digits and underscores, not starting with a digit, "
        f"not starting with {' or '.join(_SYSTEM_PREFIXES)} and not one of "
        f"{', '.join(sorted(_SYSTEM_NAMES))}"
    )
    if not isinstance(table, str) or _TABLE_NAME.fullmatch(table) is None:
        raise ConfigError(f"table={table!r} is not allowed: {allowed}")
    if table.startswith(_SYSTEM_PREFIXES) or table in _SYSTEM_NAMES:
        raise ConfigError(
            f"table={table!r} is not allowed: the name is reserved for the database's "
            f"own catalogs; {allowed}"
        )
    return table


def run_key(run_id: str) -> bytes:
    """SHA-256 of the UTF-8 run_id: fixed length, so any run_id fits every index limit."""
    return hashlib.sha256(run_id.encode("utf-8")).digest()


def import_driver(module: str, scheme: str, extra: str) -> Any:
    """Import a driver module, or raise ``ConfigError`` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"the {scheme}:// store needs the {module} driver, which is not installed "
            f"({exc}): pip install 'stepstone[{extra}]'"
        ) from exc


def detach_socket(fileno: int) -> None:
    """Point an inherited socket at /dev/null: the child can never speak on it."""
    if fileno >= 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(devnull, fileno)
        finally:
            os.close(devnull)
