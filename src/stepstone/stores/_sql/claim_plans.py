"""The claims of a SQL store: ``claimable``'s indexed pages and ``claim_ready``'s one call.

A mixin of ``SQLStore`` (``store.py``), built on its pieces side (``piece_plans.py``:
a claimed document is read as a load reads it). Each method is a plan (``effects.py``)
run by both drivers; ``SQLStore`` supplies the rows' side: ``_db_time``, ``_listing``,
``_infos`` and the driver ``_perform``.
The async forms stay in ``SQLStore``: they fall back on ``Store``'s thread form.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ..._checkpoint import DUE_NOW, evolve, utcnow
from ..._codec import checkpoint_from_doc, decode_document
from ..._errors import CorruptCheckpoint, StoreError
from ..._observe import logger
from ..._runinfo import ReadyAsk
from ..._store import Claim, RunInfo, check_page
from .._common import version_token
from .effects import Exec, Plan, Result, drive
from .errors import Undecodable
from .piece_plans import SQLPieces

if TYPE_CHECKING:
    from ..._checkpoint import RunStatus

__all__ = ["SQLClaims"]

_CLAIM_KINDS: Final = ("running", "queued", "waiting")
_MIN: Final = datetime.min.replace(tzinfo=UTC)


def _served_key(name: str, version: str | None) -> str:
    """The text ``claim_ready``'s statement builds from a document's workflow fields."""
    return f"{name}\x1f" if version is None else f"{name}\x1f\x1e{version}"


class SQLClaims(SQLPieces):
    """The claims side of ``SQLStore``: the plans of ``claimable`` and ``claim_ready``."""

    #: ``claim_ready``'s lists (served workflows, excluded runs) are passed as arrays
    #: (PostgreSQL), not as JSON text (SQLite's ``json_each``).
    _LIST_PARAMS: ClassVar[bool] = False

    def _claimable(
        self, now: datetime, limit: int, status: RunStatus | None, skip: int
    ) -> Plan[list[RunInfo]]:
        check_page(status, skip)
        claims = self._sql.claims
        queries = claims if status is None else [claims[_CLAIM_KINDS.index(status)]]
        params = {"now": self._db_time(now), "limit": int(limit), "skip": skip}
        parts: list[list[RunInfo]] = []
        for sql, keys in queries:
            parts.append(self._infos((yield from self._listing(sql, params, keys))))
        if status is not None:
            return parts[0]
        running, queued, waiting = parts
        due = sorted(queued + waiting, key=lambda info: info.due_at or _MIN)
        return running[:limit] + due[:limit]

    def _claim_ready(self, ask: ReadyAsk) -> Plan[list[Claim]]:
        """Claim what needs no judgement in the one statement ``_sql.claim_ready``."""
        owner, lease, limit, served, now, exclude = ask
        sql = self._sql.claim_ready
        if not sql:
            raise StoreError(
                f"{self.where}: this database cannot claim in one statement; load and save "
                "each run instead"
            )
        if type(limit) is not int or limit <= 0 or not served:
            return []
        stamp = utcnow()  # renewed_at and updated_at, as the claim's save would set them
        stamp_text = stamp.isoformat()
        # The claim's fields (``_lease.claimed``, then ``save``), appended to the
        # metadata line; the statement adds the epoch's value and a comma.
        head = json.dumps(
            {
                "owner": owner,
                "lease": float(lease),
                "renewed_at": stamp_text,
                "updated_at": stamp_text,
                "queued": False,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        fields = head[1:-1] + ',"epoch":'
        keys = sorted(_served_key(name, version) for name, version in served)
        skipped = sorted(exclude)
        params = {
            "owner": owner,
            "fields": fields,
            "token": version_token(),
            "now": self._db_time(now),
            "stamp": self._db_time(stamp),
            "due_running": self._db_time(stamp + timedelta(seconds=float(lease))),
            "due_now": self._db_time(DUE_NOW),
            "limit": limit,
            "served": keys if self._LIST_PARAMS else json.dumps(keys),
            "exclude": skipped if self._LIST_PARAMS else json.dumps(skipped),
        }
        try:
            _, rows = yield Exec(sql, params)
        except Undecodable as exc:
            raise StoreError(f"{self.where}: a claimed row is not UTF-8 ({exc})") from exc
        claims: list[Claim] = []
        for row in rows:
            claim = yield from self._claimed(row, fields)
            if claim is not None:
                claims.append(claim)
        # In the order claimed (earliest due first): RETURNING's order is the table's.
        claims.sort(key=lambda claim: claim.before.due_at or _MIN)
        return claims

    def _claimed(self, row: Any, fields: str) -> Plan[Claim | None]:
        """Return the ``Claim`` of one row ``claim_ready`` returned; None (logged) if unreadable."""
        run_id, version, document = row[0], row[1], row[2]
        was = row[3] if len(row) > 3 else None
        source = self._source(run_id)
        try:
            claimed = yield from self._checkpoint(
                run_id, decode_document(document, source), version, source
            )
            cut = document.index("\n")
            appended = f"{fields}{claimed.epoch},"
            line = document[:cut]
            if not line.endswith(appended):
                raise CorruptCheckpoint(f"{source}: the claim's fields are not where written")
            # The record as it was: its metadata line without what the claim appended.
            old = decode_document(line[: -len(appended) - 1] + "}", source)
            old["state"] = claimed.state
            before = checkpoint_from_doc(old, was, source, run_id, state=claimed.state)
        except (CorruptCheckpoint, ValueError) as exc:
            # Owned by us now, and never driven: another worker takes it over after the
            # lease, and its load then reports the document as corrupt.
            logger.warning("run %r: claimed, but its document is unreadable: %s", run_id, exc)
            return None
        rest = document[cut + 1 :]
        if rest.startswith('"state":') and rest.endswith("}\n"):
            claimed = evolve(claimed, state_json=rest[8:-2])
        return Claim(before, claimed)

    def claimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """Return the running runs and the queued/waiting ones due by ``now`` (indexed).

        With ``status``, one page of that kind only (``Store.claimable``).

        Raises:
            ValueError: ``status`` is not an active status, or ``skip`` is negative.
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        return drive(self._claimable(now, limit, status, skip), self._perform)

    def _claim_asked(self, ask: ReadyAsk) -> list[Claim]:
        """Claim up to ``limit`` unowned, due runs of ``served`` workflows in one statement.

        See ``Store.claim_ready``. PostgreSQL: ``UPDATE ... FROM (SELECT ... FOR UPDATE
        SKIP LOCKED LIMIT n) RETURNING``; SQLite: one ``UPDATE ... RETURNING``; MySQL and
        MariaDB: one transaction (``SELECT ... FOR UPDATE SKIP LOCKED LIMIT n``, then an
        ``UPDATE`` of those rows and a read of them).

        Raises:
            StoreError: the server cannot claim in one call (MySQL before 8.0.21,
                MariaDB before 10.6).
            StoreUnavailable: the database cannot be reached, or timed out.
        """
        return drive(self._claim_ready(ask), self._perform)

    # --- what ``SQLStore`` supplies -----------------------------------------------------

    def _db_time(self, value: datetime | None) -> Any:
        raise NotImplementedError

    def _listing(self, sql: str, params: Any = None, keys: str | None = None) -> Plan[list[Any]]:
        raise NotImplementedError

    def _infos(self, rows: list[Any]) -> list[RunInfo]:
        raise NotImplementedError

    def _perform(self, effect: Exec) -> Result:
        raise NotImplementedError
