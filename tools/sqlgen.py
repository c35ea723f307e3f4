"""The SQL stores' statements, compiled from SQLAlchemy: ``python tools/sqlgen.py --check``.

SQLAlchemy Core *describes* the tables and *builds* the statements, so the DDL in
``backends/*/schema.sql`` and the SQL the stores run come from one definition. It runs
here, in the repository, never in the wheel: its output is checked in as
``src/stepstone/stores/_sql_text.py``, which the stores read.

- ``--check`` (``scripts/test``): exit 1 when ``_sql_text.py`` differs from what the
  definitions compile to.
- ``--write``: regenerate ``_sql_text.py`` (then ``ruff format`` it) after changing a
  table or a statement.
"""

from __future__ import annotations

import argparse
import pprint
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    delete,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as postgresql_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.dialects.mysql import pymysql as pymysql_dialect
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.elements import quoted_name

from stepstone.stores._sql import PLACEHOLDER, TABLE_SCHEMA
from stepstone.stores._sql.schema import FIELDS
from stepstone.stores._sql_kinds import PerKind, expand
from stepstone.stores._sql_text import STATEMENTS

__all__ = ["generate", "main", "render"]

GENERATED = Path(__file__).resolve().parent.parent / "src" / "stepstone" / "stores" / "_sql_text.py"
#: The SQLite store's fixed table names.
SQLITE_TABLE = "stepstone_checkpoints"
SQLITE_META = "stepstone_meta"
#: The statements ``render`` writes as branches filled in at import.
PER_KIND = ("claim_ready", "claims")


def claim_ready(dialect: str, table: str) -> PerKind:
    """Return the one statement of ``Store.claim_ready`` for ``dialect``, its three
    branches (one a kind) written once (``PerKind``).

    It claims what needs no judgement (unowned; queued and not cancel-requested,
    waiting and due, or running with its lease given back; of a served workflow) and
    returns the claimed rows. The document is left as the store wrote it and the claim's
    fields are appended to its first line (the metadata): a JSON object's last value of
    a key wins (``json.loads``), so it loads as ``_lease.claimed`` saved would, and the
    state's text is never re-encoded by the database. The next save of the owner writes
    the document afresh. Only the metadata line is parsed (for the filters and the
    epoch), never the state.

    Parameters: ``owner``; ``fields`` (the appended JSON text up to the epoch's value);
    ``token`` (the new versions' random part); ``now`` (what is due by then), ``stamp``
    (the claim's updated_at), ``due_running``, ``due_now`` (column times); ``limit``;
    ``served`` and ``exclude`` (see ``SQLStore``).
    PostgreSQL skips rows another claim has locked (``FOR UPDATE SKIP LOCKED``), so
    workers spread over the queue; SQLite has one writer, the statement is atomic.
    MySQL and MariaDB have no ``UPDATE ... RETURNING``: their text is a transaction's
    statements, separated by ``MY_SEPARATOR`` (see ``_mysql_claim``).
    """
    if dialect == "sqlite":
        meta = "(substr(document, 1, instr(document, char(10)) - 2) || '}')"
        # A metadata line holding an escaped NUL (a workflow name may) is skipped: SQLite's
        # text functions stop at NUL, so it could not be compared (such a worker claims
        # run by run).
        nul = "instr(substr(document, 1, instr(document, char(10))), char(92) || 'u0000')"
        key = (
            f"COALESCE(json_extract({meta}, '$.workflow'), '') || char(31) || "
            f"COALESCE(char(30) || json_extract({meta}, '$.workflow_version'), '')"
        )
        cancelled = (
            f"\n                AND COALESCE(json_extract({meta}, '$.cancel_requested'), 0) = 0"
        )
        head = (
            "CASE WHEN instr(version, '.') > 0 "
            "THEN substr(version, 1, instr(version, '.') - 1) ELSE version END"
        )
        return [
            f"UPDATE {table} SET\n"
            "    owner = :owner,\n"
            f"    version = CASE WHEN ({head}) <> '' AND ({head}) NOT GLOB '*[^0-9]*'\n"
            f"        THEN CAST(({head}) AS INTEGER) + 1 ELSE 1 END || '.' || :token,\n"
            "    status = CASE status WHEN 'waiting' THEN 'waiting' ELSE 'running' END,\n"
            "    due_at = CASE status WHEN 'waiting' THEN :due_now ELSE :due_running END,\n"
            "    updated_at = :stamp,\n"
            "    document = substr(document, 1, instr(document, char(10)) - 1) || :fields\n"
            f"        || (COALESCE(json_extract({meta}, '$.epoch'), 0) + 1) || ','\n"
            "        || substr(document, instr(document, char(10)))\n"
            "WHERE run_id IN (\n"
            "    SELECT run_id FROM (\n",
            f"        SELECT run_id, due_at FROM (SELECT run_id, due_at FROM {table}\n"
            "            WHERE status = '@status@' AND owner IS NULL@due@\n"
            "                AND document LIKE '{\"stepstone\":%'\n"
            "                AND instr(document, char(10)) > 2@cancel@\n"
            f"                AND {nul} = 0\n"
            f"                AND {key} IN (SELECT value FROM json_each(:served))\n"
            "                AND run_id NOT IN (SELECT value FROM json_each(:exclude))\n"
            "            ORDER BY due_at LIMIT :limit)",
            "\n        UNION ALL\n",
            "\n    )\n"
            "    ORDER BY due_at\n"
            "    LIMIT :limit\n"
            ")\n"
            "RETURNING run_id, version, document",
            " AND due_at <= :now",
            cancelled,
        ]
    if dialect == "postgresql":
        quoted = f'"{table}"'
        meta = "(left(c.document, strpos(c.document, chr(10)) - 2) || '}')::jsonb"
        pmeta = "(left(document, strpos(document, chr(10)) - 2) || '}')::jsonb"
        # jsonb refuses an escaped NUL (a workflow name may hold one): such a metadata line
        # is never cast (CASE keeps the order; a plain AND would not), so one odd run
        # cannot fail every worker's claim.
        nul = "strpos(left(document, strpos(document, chr(10))), chr(92) || 'u0000')"
        key = (
            f"COALESCE({pmeta} ->> 'workflow', '') || chr(31) || "
            f"COALESCE(chr(30) || ({pmeta} ->> 'workflow_version'), '')"
        )
        cancelled = (
            f"\n            AND NOT COALESCE((CASE WHEN {nul} = 0\n"
            f"                THEN {pmeta} ->> 'cancel_requested' END)::boolean, false)"
        )
        head = "split_part(c.version, '.', 1)"
        return [
            f"UPDATE {quoted} AS c SET\n"
            "    owner = %(owner)s,\n"
            f"    version = CASE WHEN {head} ~ '^[0-9]+$'\n"
            f"        THEN ({head}::numeric + 1)::text ELSE '1' END || '.' || %(token)s,\n"
            "    status = CASE WHEN c.status = 'waiting' THEN 'waiting' ELSE 'running' END,\n"
            "    due_at = CASE WHEN c.status = 'waiting'\n"
            "        THEN %(due_now)s ELSE %(due_running)s END,\n"
            "    updated_at = %(stamp)s,\n"
            "    document = left(c.document, strpos(c.document, chr(10)) - 1) || %(fields)s\n"
            f"        || (COALESCE(({meta} ->> 'epoch')::bigint, 0) + 1)::text || ','\n"
            "        || substr(c.document, strpos(c.document, chr(10)))\n"
            "FROM (\n",
            f"    SELECT * FROM (SELECT run_key, version AS was, due_at FROM {quoted}\n"
            "        WHERE status = '@status@' AND owner IS NULL@due@\n"
            "            AND document LIKE '{\"stepstone\":%%'\n"
            "            AND strpos(document, chr(10)) > 2@cancel@\n"
            f"            AND (CASE WHEN {nul} = 0 THEN {key} END) = ANY(%(served)s::text[])\n"
            "            AND run_id <> ALL(%(exclude)s::text[])\n"
            "        ORDER BY due_at LIMIT %(limit)s\n"
            "        FOR UPDATE SKIP LOCKED) AS @status@",
            "\n    UNION ALL\n",
            "\n    ORDER BY due_at\n"
            "    LIMIT %(limit)s\n"
            ") AS picked\n"
            "WHERE c.run_key = picked.run_key\n"
            "RETURNING c.run_id, c.version, c.document, picked.was",
            " AND due_at <= %(now)s",
            cancelled,
        ]
    if dialect == "mysql":
        return _mysql_claim(table)
    raise AssertionError(f"no claim_ready for {dialect}")  # pragma: no cover


#: Between the statements of MySQL's ``claim_ready`` transaction.
MY_SEPARATOR = "\n;\n"


def _mysql_claim(table: str) -> PerKind:
    """Return MySQL's ``claim_ready``: the statements of one transaction (MySQL 8.0.21+,
    MariaDB 10.6+: ``SKIP LOCKED``, ``JSON_TABLE``, ``JSON_VALUE``).

    One ``SELECT ... FOR UPDATE SKIP LOCKED`` per kind (workers spread over the queue),
    then one ``UPDATE`` of the rows picked (``{picked}``: their keys, filled in by the
    store) that appends the claim's fields as the other dialects do, then a read of the
    rows as written (no ``RETURNING``). The lists are JSON text read with ``JSON_TABLE``
    (MariaDB's ``JSON_CONTAINS`` does not match ``\\u`` escapes).
    """
    quoted = f"`{table}`"
    newline = "CHAR(10 USING utf8mb4)"
    meta = f"CONCAT(LEFT(document, LOCATE({newline}, document) - 2), '}}')"
    key = (
        f"CONCAT(COALESCE(JSON_VALUE({meta}, '$.workflow'), ''), CHAR(31 USING utf8mb4), "
        f"COALESCE(CONCAT(CHAR(30 USING utf8mb4), JSON_VALUE({meta}, '$.workflow_version')), ''))"
    )
    # JSON_VALUE of a boolean: 'true'/'false' (MySQL), '1'/'0' (MariaDB).
    cancelled = (
        f"\n    AND COALESCE(JSON_VALUE({meta}, '$.cancel_requested'), 'false') IN ('false', '0')"
    )

    def listed(param: str, size: int) -> str:
        return (
            f"(SELECT v FROM JSON_TABLE(%({param})s, '$[*]' COLUMNS (v VARCHAR({size}) "
            "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS j)"
        )

    pick = (
        f"SELECT run_key, version, due_at FROM {quoted}\n"
        "WHERE status = '@status@' AND owner IS NULL@due@\n"
        "    AND document LIKE '{\"stepstone\":%%'\n"
        f"    AND LOCATE({newline}, document) > 2@cancel@\n"
        "    AND LOCATE(CONCAT(CHAR(92), 'u0000'),\n"
        f"        LEFT(document, LOCATE({newline}, document))) = 0\n"
        f"    AND {key} IN {listed('served', 4096)}\n"
        f"    AND run_id NOT IN {listed('exclude', 1024)}\n"
        "ORDER BY due_at LIMIT %(limit)s\n"
        "FOR UPDATE SKIP LOCKED"
    )
    head = "SUBSTRING_INDEX(version, '.', 1)"
    # MySQL assigns left to right, later ones seeing the earlier: due_at before status.
    update = (
        f"UPDATE {quoted} SET\n"
        "    owner = %(owner)s,\n"
        f"    version = CONCAT(CASE WHEN {head} REGEXP '^[0-9]+$'\n"
        f"        THEN CAST({head} AS UNSIGNED) + 1 ELSE 1 END, '.', %(token)s),\n"
        "    due_at = CASE WHEN status = 'waiting' THEN %(due_now)s ELSE %(due_running)s END,\n"
        "    status = CASE WHEN status = 'waiting' THEN 'waiting' ELSE 'running' END,\n"
        "    updated_at = %(stamp)s,\n"
        f"    document = CONCAT(LEFT(document, LOCATE({newline}, document) - 1), %(fields)s,\n"
        f"        CAST(COALESCE(JSON_VALUE({meta}, '$.epoch'), '0') AS SIGNED) + 1, ',',\n"
        f"        SUBSTRING(document, LOCATE({newline}, document)))\n"
        "WHERE run_key IN ({picked})"
    )
    read = f"SELECT run_key, run_id, version, document FROM {quoted} WHERE run_key IN ({{picked}})"
    tail = MY_SEPARATOR + update + MY_SEPARATOR + read
    return ["", pick, MY_SEPARATOR, tail, " AND due_at <= %(now)s", cancelled]


class Statements:
    """Every statement a store runs, compiled for one dialect (the table a placeholder)."""

    def __init__(
        self,
        dialect: Any,
        checkpoints: Any,
        meta: Any,
        key: str,
        insert: Any,
        seed: Any,
    ) -> None:

        c = checkpoints.c
        k = c[key]
        self.dialect = dialect
        run_key: Any = bindparam("run_key")
        expected: Any = bindparam("expected")
        self.insert = self.compile(insert)
        self.update = self.compile(
            update(checkpoints)
            .where(k == run_key, c.version == expected)
            .values(
                {
                    col.name: bindparam(col.name)
                    for col in c
                    if col.name not in ("run_key", "run_id")
                }
            )
        )
        # SQLite only: a save that leaves status and owner as the stored version has them
        # (``SQLStore._rows``) does not set them, so that SQLite, which rewrites an index
        # whenever a column it reads is assigned, leaves the partial indexes alone. The
        # two columns are compared, not assumed: a row that differs is a lost swap.
        # PostgreSQL and InnoDB compare values themselves ("": the plain ``update``).
        self.update_same = ""
        if dialect.name == "sqlite":
            self.update_same = self.compile(
                update(checkpoints)
                .where(
                    k == run_key,
                    c.version == expected,
                    c.status == bindparam("status"),
                    c.owner.is_(bindparam("owner")),
                )
                .values(
                    {
                        col.name: bindparam(col.name)
                        for col in c
                        if col.name not in ("run_key", "run_id", "status", "owner")
                    }
                )
            )
        self.load = self.compile(select(c.version, c.document).where(k == run_key))
        self.version = self.compile(select(c.version).where(k == run_key))
        self.delete = self.compile(delete(checkpoints).where(k == run_key))
        self.delete_cas = self.compile(
            delete(checkpoints).where(k == run_key, c.version == expected)
        )
        self.list = self.compile(select(c.run_id))
        columns = (
            c.run_id,
            c.version,
            c.status,
            c.step,
            c.total_steps,
            c.updated_at,
            c.due_at,
            c.owner,
        )
        self.info = self.compile(select(*columns))
        self.info_one = self.compile(select(*columns).where(k == run_key))
        self.keys = self.compile(select(k))
        now: Any = bindparam("now")

        # Three index range scans on (status, due_at), never a finished run: running runs
        # (the worker watches their leases), then queued and waiting runs that are due.
        def status(name: str) -> Any:
            return c.status == literal_column(f"'{name}'")

        running = status("running")
        queued = status("queued") & (c.due_at <= now)
        waiting = status("waiting") & (c.due_at <= now)
        # LIMIT and OFFSET take parameters; SQLAlchemy would rename them, so they are
        # appended here. OFFSET pages past runs a worker leaves (``claimable(skip=)``).
        limit = (
            " LIMIT :limit OFFSET :skip"
            if dialect.paramstyle == "named"
            else " LIMIT %(limit)s OFFSET %(skip)s"
        )
        # One text a kind, written once: its condition fills ``@where@``.
        where: Any = literal_column("@where@")
        claims = [
            [
                self.compile(select(*columns).where(where).order_by(c.due_at)) + limit,
                self.compile(select(k).where(where).order_by(c.due_at)) + limit,
            ],
            [self.compile(cond) for cond in (running, queued, waiting)],
        ]
        self.schema_version = self.compile(
            select(meta.c.value).where(meta.c.key == bindparam("key", "schema_version")),
            literal=True,
        )
        self.seed = self.compile(seed, literal=True)
        self.per_kind = {
            "claims": claims,
            "claim_ready": claim_ready(dialect.name, str(checkpoints.name)),
        }
        expanded = expand(self.per_kind)
        self.claims: list[tuple[str, ...]] = expanded["claims"]
        self.claim_ready: str = expanded["claim_ready"]
        self.bump = self.compile(
            update(meta)
            .where(meta.c.key == "schema_version", meta.c.value == "1")
            .values(value=str(TABLE_SCHEMA)),
            literal=True,
        )

    def compile(self, statement: Any, literal: bool = False) -> str:
        """Return ``statement`` as this dialect's SQL text, tidily indented."""
        kwargs = {"literal_binds": True} if literal else {}
        text = str(statement.compile(dialect=self.dialect, compile_kwargs=kwargs))
        return "\n".join(line.rstrip().replace("\t", "    ") for line in text.strip().splitlines())

    def ddl(self, statement: Any) -> str:
        """Return a DDL element (``CreateTable``, ``CreateIndex``) as SQL text."""
        return self.compile(statement)


def server_tables(name: str) -> tuple[Any, Any, Any]:
    """Return the checkpoint and meta ``Table`` objects and the due index, for servers."""

    def time() -> Any:
        # MySQL's DATETIME has no zone: UTC wall time is stored and read back as UTC.
        return DateTime(timezone=True).with_variant(
            mysql_dialect.DATETIME(fsp=6), "mysql", "mariadb"
        )

    my = ("mysql", "mariadb")
    metadata = MetaData()
    # Every name is quoted ("select", "user", "order" are valid table names): the
    # generated text then holds the table name only inside quotes, for any name.
    checkpoints = Table(
        name,
        metadata,
        # SHA-256 of the UTF-8 run_id: a 1024-character run_id is up to 4096 bytes, over
        # InnoDB's 3072-byte key limit and PostgreSQL's ~2700-byte btree tuple limit;
        # hashing also makes keys byte-exact on MySQL whatever the collation.
        Column(
            "run_key", LargeBinary().with_variant(mysql_dialect.BINARY(32), *my), primary_key=True
        ),
        Column("run_id", Text().with_variant(mysql_dialect.VARCHAR(1024), *my), nullable=False),
        Column("version", String(64), nullable=False),
        Column("status", String(16), nullable=False),
        Column("step", Integer, nullable=False),
        Column("total_steps", Integer),
        Column("created_at", time()),
        Column("updated_at", time(), nullable=False),
        Column("due_at", time()),
        Column("owner", Text().with_variant(mysql_dialect.VARCHAR(1024), *my)),
        # Last, so listing (which reads the columns before it) rarely touches it; large
        # documents live out of line (TOAST / InnoDB overflow pages) anyway.
        Column("document", Text().with_variant(mysql_dialect.LONGTEXT(), *my), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        quote=True,
    )
    Index(quoted_name(f"ix_{name}_updated_at", True), checkpoints.c.updated_at)
    Index(quoted_name(f"ix_{name}_status", True), checkpoints.c.status, checkpoints.c.updated_at)
    due = Index(quoted_name(f"ix_{name}_due", True), checkpoints.c.status, checkpoints.c.due_at)
    meta = Table(
        f"{name}_meta",
        metadata,
        Column("key", String(64), primary_key=True),
        Column("value", Text, nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        quote=True,
    )
    return checkpoints, meta, due


class _SQLiteStatements(Statements):
    def __init__(self) -> None:

        metadata = MetaData()
        checkpoints = Table(
            SQLITE_TABLE,
            metadata,
            # A rowid table, not WITHOUT ROWID: documents are often larger than the ~1/20
            # of a page where SQLite recommends WITHOUT ROWID.
            Column("run_id", Text, primary_key=True),
            Column("version", Text, nullable=False),
            Column("status", Text, nullable=False),
            Column("step", Integer, nullable=False),
            Column("total_steps", Integer),
            Column("created_at", Text),
            Column("updated_at", Text, nullable=False),
            Column("due_at", Text),
            Column("owner", Text),
            # Last, so listing (which reads the columns before it) never touches
            # overflow pages.
            Column("document", Text, nullable=False),
        )
        # Every index is partial, so that the save of a running run, which changes its
        # updated_at (and its due_at, unleased) and nothing else indexed, enters none of
        # them: each index a save changes is another 4 KiB page in the WAL and again in
        # the database (issue 36). Claims search queued and waiting runs by due_at and
        # running runs by owner; the listing reads the others by (status, updated_at)
        # and the running ones through their index (``_sql/pages.py``). Queries name
        # each index's condition verbatim: SQLite uses a partial index only then.
        status = checkpoints.c.status
        for kind in ("queued", "waiting"):
            Index(
                f"ix_{SQLITE_TABLE}_{kind}",
                checkpoints.c.due_at,
                sqlite_where=status == literal_column(f"'{kind}'"),
            )
        Index(
            f"ix_{SQLITE_TABLE}_running",
            checkpoints.c.owner,
            sqlite_where=status == literal_column("'running'"),
        )
        Index(
            f"ix_{SQLITE_TABLE}_at_rest",
            status,
            checkpoints.c.updated_at,
            sqlite_where=status != literal_column("'running'"),
        )
        # Schema 1's databases are migrated to schema 2's first layout (three indexes
        # on the whole table), which every statement reads as well; new ones get the above.
        due = Index(f"ix_{SQLITE_TABLE}_due", checkpoints.c.status, checkpoints.c.due_at)
        checkpoints.indexes.discard(due)
        meta = Table(
            SQLITE_META,
            metadata,
            Column("key", Text, primary_key=True),
            Column("value", Text, nullable=False),
        )
        # A first save inserts or, if the run exists, changes nothing: rowcount 0.
        insert = (
            sqlite_dialect.insert(checkpoints)
            .values({c.name: bindparam(c.name) for c in checkpoints.c})
            .on_conflict_do_nothing(index_elements=[checkpoints.c.run_id])
        )
        seed = (
            sqlite_dialect.insert(meta)
            .values(key="schema_version", value=str(TABLE_SCHEMA))
            .on_conflict_do_nothing()
        )
        super().__init__(
            sqlite_dialect.dialect(paramstyle="named"), checkpoints, meta, "run_id", insert, seed
        )
        self.create: list[str] = []
        for table in metadata.sorted_tables:
            self.create.append(self.ddl(CreateTable(table, if_not_exists=True)))
            for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
                self.create.append(self.ddl(CreateIndex(index, if_not_exists=True)))
        self.create.append(self.seed)
        # Schema 1 -> 2: the two columns and the index; run in one BEGIN IMMEDIATE.
        self.migrate_v1 = [
            f"ALTER TABLE {SQLITE_TABLE} ADD COLUMN due_at TEXT",
            f"ALTER TABLE {SQLITE_TABLE} ADD COLUMN owner TEXT",
            self.ddl(CreateIndex(due, if_not_exists=True)),
            self.bump,
        ]


class _PgStatements(Statements):
    def __init__(self, table: str) -> None:

        checkpoints, meta, due = server_tables(table)
        c = checkpoints.c
        insert = (
            postgresql_dialect.insert(checkpoints)
            .values({col.name: bindparam(col.name) for col in c})
            .on_conflict_do_nothing(index_elements=[c.run_key])
        )
        seed = (
            postgresql_dialect.insert(meta)
            .values(key="schema_version", value=str(TABLE_SCHEMA))
            .on_conflict_do_nothing()
        )
        dialect = psycopg_dialect.dialect(paramstyle="pyformat")  # type: ignore[no-untyped-call]
        super().__init__(dialect, checkpoints, meta, "run_key", insert, seed)
        self.create: list[str] = []
        for item in (checkpoints, meta):
            self.create.append(self.ddl(CreateTable(item, if_not_exists=True)))
            for index in sorted(item.indexes, key=lambda ix: str(ix.name)):
                self.create.append(self.ddl(CreateIndex(index, if_not_exists=True)))
        self.create.append(self.seed)
        self.migrate_v1 = [
            f'ALTER TABLE "{table}" ADD COLUMN IF NOT EXISTS due_at TIMESTAMP WITH TIME ZONE',
            f'ALTER TABLE "{table}" ADD COLUMN IF NOT EXISTS owner TEXT',
            self.ddl(CreateIndex(due, if_not_exists=True)),
            self.bump,
        ]


class _MyStatements(Statements):
    def __init__(self, table: str) -> None:

        checkpoints, meta, due = server_tables(table)
        c = checkpoints.c
        # A no-op assignment: an existing row is left alone and reports 0 rows affected
        # (without CLIENT.FOUND_ROWS), a new row 1.
        insert = (
            mysql_dialect.insert(checkpoints)
            .values({col.name: bindparam(col.name) for col in c})
            .on_duplicate_key_update(run_key=c.run_key)
        )
        seed = (
            mysql_dialect.insert(meta)
            .values(key="schema_version", value=str(TABLE_SCHEMA))
            .on_duplicate_key_update(key=meta.c.key)
        )
        super().__init__(
            pymysql_dialect.dialect(paramstyle="pyformat"),
            checkpoints,
            meta,
            "run_key",
            insert,
            seed,
        )

        def inline(index: Any) -> str:
            created = self.ddl(CreateIndex(index))
            match = re.fullmatch(r"CREATE INDEX (\S+) ON \S+ (\(.*\))", created)
            if match is None:  # pragma: no cover - a SQLAlchemy rendering change
                raise AssertionError(f"unexpected index DDL: {created}")
            return f"INDEX {match.group(1)} {match.group(2)}"

        self.create: list[str] = []
        for item in (checkpoints, meta):
            create = self.ddl(CreateTable(item, if_not_exists=True))
            indexes = sorted(item.indexes, key=lambda ix: str(ix.name))
            if indexes:
                # MySQL has no CREATE INDEX IF NOT EXISTS (MariaDB does): declare the
                # indexes inside CREATE TABLE IF NOT EXISTS, one statement.
                head, _, tail = create.rpartition("\n)")
                lines = "".join(f",\n    {inline(ix)}" for ix in indexes)
                create = head + lines + "\n)" + tail
            self.create.append(create)
        self.create.append(self.seed)
        # Schema 1 -> 2, each statement committing by itself (MySQL DDL does); run under
        # GET_LOCK, and each one tolerates having been done already (1060, 1061).
        self.migrate_v1 = [
            f"ALTER TABLE `{table}` ADD COLUMN due_at DATETIME(6) NULL AFTER updated_at",
            f"ALTER TABLE `{table}` ADD COLUMN owner VARCHAR(1024) NULL AFTER due_at",
            f"ALTER TABLE `{table}` ADD {inline(due)}",
            self.bump,
        ]


def _built() -> dict[str, Statements]:
    return {
        "sqlite": _SQLiteStatements(),
        "postgresql": _PgStatements(PLACEHOLDER),
        "mysql": _MyStatements(PLACEHOLDER),
    }


def generate() -> dict[str, dict[str, Any]]:
    """Compile every statement from the definitions above (what ``_sql_text`` holds)."""
    return {
        kind: {name: getattr(statements, name) for name in FIELDS}
        for kind, statements in _built().items()
    }


def render() -> str:
    """Return the source of the ``_sql_text`` module (before ``ruff format``).

    The statements that repeat a branch once per kind (``claim_ready``, ``claims``) are
    written as their branches once (``per_kind``) and filled in at import by
    ``_sql_kinds.expand``, as here: what ``--check`` compares is the filled-in text.
    """
    built = _built()
    once = {
        kind: {name: getattr(statements, name) for name in FIELDS if name not in PER_KIND}
        for kind, statements in built.items()
    }
    per_kind = {kind: statements.per_kind for kind, statements in built.items()}
    return (
        '"""Generated by ``python tools/sqlgen.py --write``; do not edit by hand.\n\n'
        "Every SQL statement the SQL stores run, compiled from the SQLAlchemy definitions in\n"
        "``tools/sqlgen.py``; ``tools/sqlgen.py --check`` fails when it drifts.\n"
        '"""\n\n'
        "from typing import Any, Final\n\n"
        "from ._sql_kinds import PerKind, expand\n\n"
        "STATEMENTS: Final[dict[str, dict[str, Any]]] = "
        + pprint.pformat(once, width=100, sort_dicts=True)
        + "\n\n#: ``claim_ready`` and ``claims``, each branch written once (``_sql_kinds``).\n"
        "_PER_KIND: Final[dict[str, dict[str, PerKind]]] = "
        + pprint.pformat(per_kind, width=100, sort_dicts=True)
        + "\n\nfor _kind, _parts in _PER_KIND.items():\n"
        "    STATEMENTS[_kind].update(expand(_parts))\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Check or write ``_sql_text.py``; return the exit status."""
    parser = argparse.ArgumentParser(prog="tools/sqlgen.py", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail when _sql_text.py drifts")
    mode.add_argument("--write", action="store_true", help="regenerate _sql_text.py")
    args = parser.parse_args(argv)
    if args.write:
        GENERATED.write_text(render(), encoding="utf-8")
        ruff = Path(sys.executable).with_name("ruff")
        subprocess.run([str(ruff), "format", "-q", str(GENERATED)], check=True)
        print(f"wrote {GENERATED}")
        return 0
    if generate() != STATEMENTS:
        print(
            f"{GENERATED} differs from the SQLAlchemy definitions in tools/sqlgen.py; "
            "run: python tools/sqlgen.py --write",
            file=sys.stderr,
        )
        return 1
    print("tools/sqlgen.py: _sql_text.py matches the definitions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
