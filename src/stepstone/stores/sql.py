"""Deprecated: the SQL server stores moved to ``stepstone.stores.postgres`` and ``.mysql``.

``SQLServerStore`` served both servers and reported ``postgresql`` as its scheme for
MySQL too; ``PostgresStore`` (``postgresql://``) and ``MySQLStore`` (``mysql://``) replace
it. This module keeps old imports working: ``SQLServerStore(url)`` and
``SQLServerStore.from_config(config)`` open the store the URL's scheme names.
"""

from __future__ import annotations

from typing import Any, Literal

from .._errors import ConfigError
from ._sql import DEFAULT_TABLE, ServerStore
from .mysql import MySQLStore
from .postgres import PostgresStore

__all__ = ["DEFAULT_TABLE", "MySQLStore", "PostgresStore", "SQLServerStore", "schema_ddl"]


def _class_for(url: str) -> type[ServerStore]:
    scheme = url.partition(":")[0].lower().partition("+")[0]
    if scheme == "postgresql":
        return PostgresStore
    if scheme == "mysql":
        return MySQLStore
    raise ConfigError(f"not a SQL server URL: {scheme!r}; use postgresql:// or mysql://")


class SQLServerStore:
    """Deprecated factory: returns a ``PostgresStore`` or ``MySQLStore`` for the URL."""

    def __new__(cls, url: str, **kwargs: Any) -> Any:
        store_class: Any = _class_for(url)
        return store_class(url, **kwargs)

    @staticmethod
    def from_config(config: str) -> Any:
        """Open the store the config's scheme names."""
        return _class_for(config).from_config(config)


def schema_ddl(kind: Literal["postgresql", "mysql"], table: str = DEFAULT_TABLE) -> str:
    """Deprecated: ``stepstone.stores.postgres.schema_ddl`` / ``.mysql.schema_ddl``."""
    if kind == "postgresql":
        from .postgres import schema_ddl as ddl  # noqa: PLC0415
    elif kind == "mysql":
        from .mysql import schema_ddl as ddl  # noqa: PLC0415
    else:
        raise ConfigError(f"schema_ddl: kind must be 'postgresql' or 'mysql', got {kind!r}")
    return ddl(table)
