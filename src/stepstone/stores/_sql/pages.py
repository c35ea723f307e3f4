"""The dashboard's queries (``Store.list_page``, ``Store.count_by_status``) as SQL text.

Built per call from the listing statement of the dialect: a status filter, a run-id
prefix and a keyset cursor over (updated_at, run_id), newest first, on the indexes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..._status import STATUSES

__all__ = ["count_query", "listed_fields", "page_query", "prefix_clause"]

#: What a page row shows besides the listing's columns, read from the run's metadata.
LISTED: tuple[str, ...] = ("workflow", "workflow_version", "waiting_for")


def _param(scheme: str) -> Callable[[str], str]:
    # The drivers' paramstyles: named (sqlite3), else pyformat.
    if scheme == "sqlite":
        return lambda name: f":{name}"
    return lambda name: f"%({name})s"


def prefix_clause(scheme: str, prefix: str) -> tuple[str, dict[str, Any]]:
    """Return the condition "run_id starts with ``prefix``", case-sensitive."""
    if scheme == "sqlite":
        # SQLite's LIKE ignores ASCII case; a substring comparison does not. The range
        # before it lets the primary key's index find the ids with the prefix instead of
        # a pass over every run (text compares as UTF-8 bytes: in code point order).
        params: dict[str, Any] = {"prefix": prefix, "prefix_len": len(prefix)}
        clause = "substr(run_id, 1, :prefix_len) = :prefix"
        above = _above(prefix)
        if above is None:
            return f"run_id >= :prefix AND {clause}", params
        params["prefix_above"] = above
        return f"run_id >= :prefix AND run_id < :prefix_above AND {clause}", params
    escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return "run_id LIKE %(prefix)s ESCAPE '!'", {"prefix": escaped + "%"}


def _above(prefix: str) -> str | None:
    """The least text greater than every text starting with ``prefix`` (None: none is)."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not text: the next one is U+E000
            code = 0xE000
        if code <= 0x10FFFF:
            return "".join(chars) + chr(code)
    return None


def _status_arms(status: str | None) -> list[str]:
    """SQLite: the listing's conditions on the status, one per arm of the query.

    A new SQLite database's indexes are partial (``tools/sqlgen.py``), and SQLite uses a
    partial index only for a query that names its condition verbatim, with literals: a
    page of one status is one arm, a page of every status is one arm per status, merged
    in order by ``UNION ALL``. Each arm of a status at rest is a range scan of its index
    that stops at the limit; the running runs' arm reads them all and sorts them (no
    index holds their ``updated_at``: that is what keeps their saves out of the indexes).
    A database of an earlier layout reads the same arms through its whole-table indexes.
    """
    wanted = STATUSES if status is None else (status,)
    arms = []
    for name in wanted:
        if name not in STATUSES:  # no run has it (as on every backend); never spliced
            arms.append("0")
            continue
        rest = "" if name == "running" else " AND status != 'running'"
        arms.append(f"status = '{name}'{rest}")
    return arms


def page_query(
    info_sql: str,
    scheme: str,
    db_time: Callable[[datetime], Any],
    status: str | None,
    prefix: str,
    after: tuple[datetime, str] | None,
    limit: int,
) -> tuple[str, dict[str, Any]]:
    """Return one page's statement and parameters."""
    p = _param(scheme)
    # Run ids compare as code points on every dialect (PostgreSQL's "C" collation,
    # MySQL's utf8mb4_bin column, SQLite's BINARY), as the cursor does.
    rid = 'run_id COLLATE "C"' if scheme == "postgresql" else "run_id"
    where: list[str] = []
    params: dict[str, Any] = {"limit": int(limit)}
    # SQLite with a prefix: one query on the primary key's range (few rows, sorted);
    # without one, an arm per status on the partial indexes (``_status_arms``).
    arms = scheme == "sqlite" and not prefix
    if status is not None and not arms:
        where.append(f"status = {p('status')}")
        params["status"] = status
    if prefix:
        clause, values = prefix_clause(scheme, prefix)
        where.append(clause)
        params.update(values)
    if after is not None:
        # The first term bounds the index range: with the OR alone, the planners walked
        # the index from the newest row, so page n read n pages of rows.
        where.append(
            f"updated_at <= {p('after_at0')} AND (updated_at < {p('after_at')} OR "
            f"(updated_at = {p('after_at2')} AND {rid} < {p('after_id')}))"
        )
        stamp = db_time(after[0])
        params.update(after_at0=stamp, after_at=stamp, after_at2=stamp, after_id=after[1])
    # The document too: its first line is the run's metadata, and a large state is not in
    # it (it is kept in pieces), so a page reads what its rows show and never a state.
    found = re.search(r"\nFROM\s+(\S+)\s*\Z", info_sql)
    if found is not None:
        info_sql = f"{info_sql[: found.start()]}, {found[1]}.document{info_sql[found.start() :]}"
    order = f" ORDER BY updated_at DESC, {rid} DESC LIMIT {p('limit')}"
    if not arms:
        return info_sql + (" WHERE " + " AND ".join(where) if where else "") + order, params
    each = [info_sql + " WHERE " + " AND ".join([a, *where]) + order for a in _status_arms(status)]
    if len(each) == 1:
        return each[0], params
    return " UNION ALL ".join(f"SELECT * FROM ({arm})" for arm in each) + order, params


def count_query(info_sql: str, scheme: str, prefix: str) -> tuple[str, dict[str, Any]] | None:
    """Return the per-status count statement, or None if the listing's shape is unknown."""
    found = re.search(r"\sFROM\s+(\S+)\s*\Z", info_sql)  # the listing's own table
    if found is None:  # pragma: no cover - the generated statement has this shape
        return None
    table = found[1]
    if prefix:
        # SQLite's prefix is a range of the primary key (``prefix_clause``): few rows.
        clause, params = prefix_clause(scheme, prefix)
        return f"SELECT status, COUNT(*) FROM {table} WHERE {clause} GROUP BY status", params
    if scheme != "sqlite":
        return f"SELECT status, COUNT(*) FROM {table} GROUP BY status", {}
    # The runs at rest counted on their (partial, covering) index, the running ones on
    # theirs (naming no column, so that the index alone answers): a GROUP BY over the
    # whole table would read every row of it.
    return (
        f"SELECT status, COUNT(*) FROM {table} WHERE status != 'running' GROUP BY status "
        f"UNION ALL SELECT 'running', COUNT(*) FROM {table} WHERE status = 'running'"
    ), {}


def listed_fields(document: Any) -> dict[str, str | None]:
    """Return the ``LISTED`` fields of a stored document, each None if absent or not text.

    Only the metadata line is parsed (``encode_document`` writes it first), not the
    state line after it; a document of another shape is parsed whole.
    """
    try:
        text = document.decode("utf-8") if isinstance(document, bytes | bytearray) else document
        head, sep, _ = text.partition("\n")
        try:
            meta = json.loads(head[:-1] + "}") if sep and head.endswith(",") else None
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            meta = json.loads(text)
    except (AttributeError, TypeError, ValueError):
        meta = None
    if not isinstance(meta, dict):
        return dict.fromkeys(LISTED)
    return {name: meta[name] if isinstance(meta.get(name), str) else None for name in LISTED}
