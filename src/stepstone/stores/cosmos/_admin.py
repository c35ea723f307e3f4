"""What a Cosmos store does besides the step path: init, doctor, TTL and the dashboard.

A base of ``CosmosStore``: the rules it reuses (``_run``, ``_query``, ``_translate``
and the rest) are ``CosmosStore``'s, declared here for the type checker.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from azure.cosmos.exceptions import CosmosHttpResponseError, CosmosResourceNotFoundError

from ..._checkpoint import (
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    STATUSES,
    Checkpoint,
    check_run_id,
)
from ..._codec import PiecesNeeded
from ..._errors import ConflictError, StoreError, StorePermissionError
from ..._observe import logger
from ..._runinfo import PageAsk
from ..._store import Diagnosis, RunInfo, Store
from ._config import Settings
from ._effects import OPEN, Query, Send, Steps
from ._errors import Call
from ._setup import (
    create_resources,
    index_diagnosis,
    listing_indexed,
    pieces_indexed,
    upgrade_indexing,
)
from ._wire import NOT_PIECE, infos, item_id, page_query, piece_ttl, time_text

if TYPE_CHECKING:
    from azure.cosmos import ContainerProxy, CosmosClient

__all__ = ["Admin"]

T = TypeVar("T")

_ENTRA_CANNOT_CREATE = (
    " -- creating databases and containers is a control-plane operation that Entra ID "
    "data-plane roles do not allow; provision them with backends/cosmos/main.bicep (or "
    "az cosmosdb sql container create), or run `stepstone init` with the account key"
)


class Admin(Store):
    """``init``, ``doctor``, ``expire``, ``list_page`` and ``count_by_status``."""

    if TYPE_CHECKING:
        settings: Settings
        _open_lock: threading.Lock
        _container: ContainerProxy | None

        def _run(self, steps: Steps[T]) -> T: ...
        def _query(
            self, query: str, parameters: list[dict[str, Any]] | None = None
        ) -> Steps[Any]: ...
        def _translate(self, call: Call) -> contextlib.AbstractContextManager[None]: ...
        def _sync_client(self, call: Call) -> CosmosClient: ...
        def _ensure_open(self) -> ContainerProxy: ...
        def _checkpoint(self, doc: Any, run_id: str) -> Checkpoint: ...
        def _cas(self, version: str | None) -> dict[str, Any]: ...
        def _where(self) -> str: ...
        def _source(self, doc_id: object) -> str: ...
        @staticmethod
        def _item_missing(exc: CosmosResourceNotFoundError) -> None: ...

    # -- TTL ---------------------------------------------------------------------------

    def expire(self, run_id: str, ttl_seconds: int | None) -> bool:
        """Let Cosmos delete the run ``ttl_seconds`` after its last write (native TTL).

        ``-1`` keeps it forever, None falls back to the store's ``ttl`` / the container's
        default. Read plus conditional replace, retried if a save lands in between; the
        run's version changes, so meant for finished runs. Returns False if no such run.
        The pieces of a long state (and its history) get twice that ttl, after the item,
        so none expires before the item that names it.

        Raises:
            ValueError: ``ttl_seconds`` is not >= 1, -1 or None.
            ConflictError: the run kept changing for five attempts.
            CorruptCheckpoint: the item is not this run's checkpoint; left untouched.
        """
        if ttl_seconds is not None and ttl_seconds != -1 and ttl_seconds < 1:
            raise ValueError(f"ttl_seconds must be >= 1, -1 or None, got {ttl_seconds}")
        return self._run(self._expire(item_id(check_run_id(run_id)), run_id, ttl_seconds))

    def _expire(self, doc_id: str, run_id: str, ttl_seconds: int | None) -> Steps[bool]:
        container = yield OPEN
        for _ in range(5):
            with self._translate(Call("expire", run_id)):
                try:
                    doc = yield Send(container, "read_item", (doc_id,), {"partition_key": doc_id})
                except CosmosResourceNotFoundError as exc:
                    self._item_missing(exc)
                    return False
                # Refuse to touch what is not ours (a state in pieces is ours too).
                with contextlib.suppress(PiecesNeeded):
                    self._checkpoint(doc, run_id)
                body = {k: v for k, v in doc.items() if not k.startswith("_")}
                if ttl_seconds is None:
                    body.pop("ttl", None)
                else:
                    body["ttl"] = ttl_seconds
                try:
                    yield Send(container, "replace_item", (doc_id, body), self._cas(doc["_etag"]))
                except CosmosHttpResponseError as exc:
                    if exc.status_code in (404, 412):
                        continue  # a save or delete landed in between: look again
                    raise
                # Then its pieces (a long state, history), after the item, with twice its
                # ttl (``piece_ttl``): none expires before the item that names it.
                ttl = piece_ttl(self.settings.ttl if ttl_seconds is None else ttl_seconds)
                rows = yield Query(
                    container,
                    "SELECT * FROM c WHERE c.piece_of = @of",
                    [{"name": "@of", "value": doc_id}],
                    self.settings.timeout,
                )
                for row in rows:
                    piece = {k: v for k, v in row.items() if not k.startswith("_")}
                    if ttl is None:
                        piece.pop("ttl", None)
                    else:
                        piece["ttl"] = ttl
                    yield Send(container, "upsert_item", (piece,))
                return True
        raise ConflictError(f"run {run_id!r}: kept changing while setting its ttl", run_id)

    # -- set-up and health ---------------------------------------------------------------

    def init(self) -> list[str]:
        """Create the database and the container (``backends/cosmos/container.json``).

        Raises:
            StorePermissionError: the credentials may not create them; Entra ID data-plane
                roles never can (provision with ``backends/cosmos/main.bicep``).
        """
        with self._open_lock:
            try:
                lines = self._run(self._init(self._sync_client(Call("init"))))
            except StorePermissionError as exc:
                raise StorePermissionError(f"{exc}{_ENTRA_CANNOT_CREATE}") from exc
            self._container = None  # re-check the partition key on next use
        self._ensure_open()
        return lines

    def _init(self, client: Any) -> Steps[list[str]]:
        with self._translate(Call("init")):
            lines = yield from create_resources(self.settings, client)
            lines.extend((yield from upgrade_indexing(self.settings, client)))
        return lines

    def _properties(self) -> Steps[Any]:
        container = yield OPEN
        with self._translate(Call("doctor")):
            return (yield Send(container, "read"))

    def doctor(self) -> list[Diagnosis]:
        """The base probe checks, plus partition key, claim index, TTL and schemas."""
        try:
            properties = self._run(self._properties())
        except Exception as exc:  # noqa: BLE001 - doctor reports every failure as a finding
            return [Diagnosis("open the container", False, f"{type(exc).__name__}: {exc}")]
        results = [Diagnosis("open the container", True, "ok"), *_container_findings(properties)]
        results.extend(super().doctor())
        results.append(self._schema_finding())
        return results

    def _schema_finding(self) -> Diagnosis:
        readable = ", ".join(str(v) for v in sorted(READABLE_SCHEMAS))
        try:
            foreign = self._run(
                self._query(
                    "SELECT TOP 5 c.id, c.stepstone FROM c WHERE "
                    f"{NOT_PIECE} AND (NOT IS_DEFINED(c.stepstone) OR NOT (c.stepstone IN "
                    f"({readable})))"
                )
            )
        except Exception as exc:  # noqa: BLE001 - doctor reports every failure as a finding
            return Diagnosis("checkpoint schema", False, f"{type(exc).__name__}: {exc}")
        return Diagnosis(
            f"checkpoint schema {SCHEMA_VERSION}",
            not foreign,
            "ok"
            if not foreign
            else "items with another or no schema: "
            + ", ".join(f"{r.get('id')!r}={r.get('stepstone')!r}" for r in foreign),
        )

    # -- the dashboard's listing (Store.list_page, count_by_status) ---------------------

    def _list_page(self, ask: PageAsk) -> list[RunInfo]:
        """One page of the listing, newest first: a ``TOP`` query on a composite index.

        (status, updated_at desc, run_id desc) serves a status filter, (updated_at desc,
        run_id desc) the unfiltered list; the cursor continues from the last row read
        (keyset paging), so a page reads about ``limit`` index entries at any depth. Every
        save writes ``updated_at`` as UTC ``isoformat`` text, whose order is the instants'.
        A container without those indexes (made by an older stepstone; ``stepstone init``
        adds them) is listed by the default scan, with a warning.

        Raises:
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        if ask.limit <= 0:
            return []
        try:
            return list(self._pages(*ask))[: ask.limit]
        except StoreError as exc:
            if not _lacks_index(exc):
                raise
        logger.warning(
            "%s lacks the listing indexes (run `stepstone init`); listing by a scan",
            self._source(None),
        )
        return super()._list_page(ask)

    def _pages(
        self, status: str | None, prefix: str, after: tuple[datetime, str] | None, limit: int
    ) -> Iterator[RunInfo]:
        """Yield at least ``limit`` rows (or all there are), page by page."""
        cursor = None if after is None else (time_text(after[0]), after[1])
        found = 0
        while True:
            rows = self._run(self._query(*page_query(status, prefix, cursor, limit)))
            page = infos(rows, self._where())
            yield from page
            found += len(page)
            if len(rows) < limit or found >= limit:
                return
            # A malformed item was skipped: read on after the last row, as a scan would.
            last = rows[-1]
            at, run_id = last.get("updated_at"), last.get("run_id")
            if not isinstance(at, str) or not isinstance(run_id, str):  # pragma: no cover
                return
            cursor = (at, run_id)

    def count_by_status(self, prefix: str = "") -> dict[str, int]:
        """Count the runs per status: one ``COUNT`` per status, on the status index.

        (The emulator parses no ``GROUP BY``; six equality counts read only index entries.)

        Raises:
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        where = "c.status = @status" + (" AND STARTSWITH(c.run_id, @prefix)" if prefix else "")
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for status in STATUSES:
            params: list[dict[str, Any]] = [{"name": "@status", "value": status}]
            if prefix:
                params.append({"name": "@prefix", "value": prefix})
            rows = self._run(self._query(f"SELECT VALUE COUNT(1) FROM c WHERE {where}", params))
            # The SDK may hand back one partial count per partition: their sum is the count.
            counts[status] = sum(int(n) for n in rows if isinstance(n, int | float))
        return counts


def _container_findings(properties: Any) -> list[Diagnosis]:
    """What ``doctor`` says of a container's properties."""
    paths = properties.get("partitionKey", {}).get("paths")
    policy = properties.get("indexingPolicy") or {}
    listed = listing_indexed(policy)
    pieces = pieces_indexed(policy)
    default_ttl = properties.get("defaultTtl")
    return [
        Diagnosis(
            "partition key is /id",
            paths == ["/id"],
            "ok" if paths == ["/id"] else f"partition key paths are {paths!r}",
        ),
        index_diagnosis(policy),
        Diagnosis(
            "listing indexes (status, updated_at, run_id)",
            listed,
            "ok"
            if listed
            else "the container lacks the composite indexes the dashboard's listing "
            "orders by (it scans instead); run `stepstone init` or update its indexing "
            "policy to backends/cosmos/container.json",
        ),
        Diagnosis(
            "piece paths indexed (/piece_of, /gen)",
            pieces,
            "ok"
            if pieces
            else "the container does not index the paths a long state's pieces are found "
            "by (loads and collection scan instead); run `stepstone init` or update its "
            "indexing policy to backends/cosmos/container.json",
        ),
        Diagnosis(
            "TTL enabled (defaultTtl set)",
            default_ttl is not None,
            f"defaultTtl={default_ttl}"
            if default_ttl is not None
            else "defaultTtl is off: expire() and ttl= have no effect; set it to -1",
        ),
    ]


def _lacks_index(exc: StoreError) -> bool:
    """Whether a query failed for want of the composite index its ORDER BY needs."""
    cause = exc.__cause__
    return (
        isinstance(cause, CosmosHttpResponseError)
        and cause.status_code == 400
        and "composite index" in str(cause)
    )
