"""CosmosStore: one Azure Cosmos DB item per run, saved with ETag compare-and-swap.

Config string::

    cosmos://ACCOUNT-HOST[:PORT]/DATABASE/CONTAINER[?OPTIONS]

e.g. ``cosmos://myacct.documents.azure.com/stepstone/runs`` (Entra ID / managed identity)
or, against a local emulator with ``AZURE_COSMOS_KEY`` set,
``cosmos://127.0.0.1:8081/testdb/runs?verify=false&create=true``. The options are listed
in ``_OPTIONS`` below and in ``backends/cosmos/README.md``.

Guarantees, and why they hold:

- **One request per load and per save**, sync or async. ``load`` is one point read
  (``read_item`` with the partition key, the cheapest Cosmos operation: 1 RU per KB).
  The first save is one ``create_item`` (Cosmos refuses a second item with the same id:
  409 -> ``ConflictError``); later saves are one ``replace_item`` with
  ``If-Match: <etag>`` (412 -> ``ConflictError``); ``delete`` with an expected version
  is one ``delete_item`` with ``If-Match``. Nothing is read before a write, so there is
  no window between check and write, and no query ever runs on the step path. The
  server's ``_etag`` is the version: opaque, and new on every write, including a run
  deleted and created again. The only extra requests are made once per client: the
  SDK's account read and one container read (which also checks the container exists
  and is partitioned by ``/id``). Both transports count what they send
  (``requests_sent``), so this is measured, not promised.
- **A cancelled or interrupted save leaves the item whole.** A save is a single HTTP
  request that Cosmos applies atomically: cancelling the task that awaits ``asave``
  leaves either the old or the new checkpoint, never a mix, and the client stays usable.
- **Finding work never reads finished runs.** Each item carries ``status``, ``due_at``
  (UTC text of fixed width, so it sorts as time does) and ``owner`` as top-level
  properties beside the state text. ``claimable`` queries them through the composite
  index (status, due_at) declared in ``CONTAINER_DEFINITION`` (and in
  ``backends/cosmos/container.json`` and ``main.bicep``), one equality query per active
  status, and selects only the listing fields, never the state.
- **Nothing is sent that Cosmos would refuse.** The state is validated and the item's
  size (its JSON exactly as the SDK serialises it) is checked against the 2 MB item limit
  before any request; an oversized checkpoint raises ``CheckpointTooLarge`` and the stored
  item is untouched.
- **Any run_id works, no two share an item.** Cosmos ids may not contain ``/ \\ # ?``
  and are at most 255 characters; see ``item_id``. The item keeps the original run_id and
  a load checks it, so a hash collision or a hand-copied item could never hand one run
  another's checkpoint (that run's load raises ``CorruptCheckpoint``; listings skip it).
- **Writes are never retried blindly.** A write whose connection dropped after it was
  sent may or may not have been applied; the SDK does not retry non-idempotent writes
  unless ``retry_write`` is set, and this store pins it off. Throttling (429) is retried
  by the SDK (bounded by ``retries``) because the server applied nothing; a connection
  that was never established is retried because nothing was sent. What is left is raised
  as ``StoreUnavailable`` with the HTTP status. Even a duplicate write could not corrupt a
  run: the ETag condition makes a replayed replace fail with 412.
- **A hung server is an error, not a hang.** ``connect_timeout`` (default 5 s) bounds
  opening a connection, ``read_timeout`` (default 30 s) waiting for each answer, and
  ``timeout`` (default 60 s) a whole store call with its retries; then the call raises
  ``StoreUnavailable``.
- **Closing under load is an error, not a crash.** A call in flight when ``close`` or
  ``aclose`` runs finishes or raises the closed-store ``StoreError`` (a write's message
  says it may or may not have been applied), whatever the driver raised.
- **Never creates infrastructure by surprise.** The database and container are created
  only by ``init()`` (``stepstone init``) or with ``create=true``; otherwise a missing one
  is a ``StoreError`` naming it.
- **Secrets stay out of URLs, reprs, logs and exceptions.** Keys come from the
  environment (``AZURE_COSMOS_KEY`` or ``AZURE_COSMOS_CONNECTION_STRING``) or Entra ID;
  a ``key=`` option is refused, and every message built from an SDK error is redacted.

Sync and async share everything but the I/O: the item layout (``_item``,
``_checkpoint``), id encoding (``item_id``), the size check (``_plan``), the listing
rows (``_info``), the queries and the error translation (``_STATUS_RULES`` and
``_EXCEPTION_RULES``, applied by ``_translate``). Each ``a``-method is its sync twin with
the SDK's ``azure.cosmos.aio`` calls awaited; the aio client is built lazily, one per
event loop, on an aiohttp transport that counts requests like the sync one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple, Self, cast
from urllib.parse import unquote, urlsplit

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import AsyncHttpTransport, HttpTransport, RequestsTransport
from azure.cosmos import CosmosClient, PartitionKey, SSLConfiguration

# ``ConnectionPolicy.RetryOptions`` is documented as a ``RetryOptions``, which the module
# imports but does not re-export. The retry_total/retry_throttle_total client keywords
# cannot express 0 throttling retries (the SDK reads 0 as "unset"), so the policy is built.
from azure.cosmos.documents import ConnectionPolicy, RetryOptions  # type: ignore[attr-defined]
from azure.cosmos.exceptions import (
    CosmosClientTimeoutError,
    CosmosHttpResponseError,
    CosmosResourceNotFoundError,
)

from .. import _hooks
from .._checkpoint import (
    ACTIVE_STATUSES,
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    STATUSES,
    Checkpoint,
    RunStatus,
    check_run_id,
    run_status,
    utcnow,
)
from .._codec import check_document, checkpoint_from_doc, checkpoint_meta, encode_state
from .._errors import (
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidState,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
)
from .._observe import logger
from .._redact import redact
from .._store import Diagnosis, RunInfo, Store, check_page
from ._common import parse_options

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential
    from azure.cosmos import ContainerProxy, DatabaseProxy
    from azure.cosmos.aio import ContainerProxy as AsyncContainerProxy
    from azure.cosmos.aio import CosmosClient as AsyncCosmosClient
    from azure.cosmos.aio import DatabaseProxy as AsyncDatabaseProxy


__all__ = ["CONTAINER_DEFINITION", "MAX_ITEM_BYTES", "CosmosStore", "item_id"]

#: Cosmos DB's per-item limit. Checked client-side so an oversized checkpoint costs no
#: request and gets a clear error instead of a 413.
MAX_ITEM_BYTES: Final = 2 * 1024 * 1024

#: The container every CosmosStore expects; ``backends/cosmos/container.json`` and
#: ``main.bicep`` hold the same definition (tests keep both equal to this).
#:
#: - partition key ``/id``: one logical partition per run, so a load is a point read and
#:   a save touches one partition; runs spread evenly over physical partitions.
#: - indexing: ``/*`` and ``/state/*`` excluded: states are large and never queried, and
#:   every indexed path costs RUs on every write. Only the fields ``stepstone runs`` /
#:   ``prune`` / ``claimable`` filter on are indexed.
#: - composite index (status, due_at): serves ``claimable``'s queries (an equality on
#:   ``status``, a range and the order on ``due_at``), so finding work reads only the
#:   active runs' index entries, however many finished runs the container holds.
#: - composite indexes (status, updated_at desc, run_id desc) and (updated_at desc, run_id
#:   desc): serve ``list_page``'s ORDER BY, so a dashboard page reads one page of entries.
#: - ``defaultTtl: -1``: TTL enabled but items never expire unless they carry a ``ttl``
#:   (``expire()`` or the ``ttl=`` option), which is how Cosmos does retention natively.
CONTAINER_DEFINITION: Final[dict[str, Any]] = {
    "partitionKey": {"paths": ["/id"], "kind": "Hash", "version": 2},
    "indexingPolicy": {
        "indexingMode": "consistent",
        "automatic": True,
        "includedPaths": [
            {"path": "/run_id/?"},
            {"path": "/stepstone/?"},
            {"path": "/step/?"},
            {"path": "/total_steps/?"},
            {"path": "/failure/?"},
            {"path": "/created_at/?"},
            {"path": "/updated_at/?"},
            {"path": "/status/?"},
            {"path": "/due_at/?"},
            {"path": "/owner/?"},
        ],
        "excludedPaths": [{"path": "/state/*"}, {"path": "/*"}],
        "compositeIndexes": [
            [
                {"path": "/status", "order": "ascending"},
                {"path": "/due_at", "order": "ascending"},
            ],
            # The dashboard's listing (``list_page``): newest first, with and without a
            # status filter. Cosmos serves a multi-path ORDER BY only from a composite
            # index in exactly that order (or all reversed).
            [
                {"path": "/status", "order": "ascending"},
                {"path": "/updated_at", "order": "descending"},
                {"path": "/run_id", "order": "descending"},
            ],
            [
                {"path": "/updated_at", "order": "descending"},
                {"path": "/run_id", "order": "descending"},
            ],
        ],
    },
    "defaultTtl": -1,
}

_FORMS: Final = (
    "cosmos://ACCOUNT-HOST[:PORT]/DATABASE/CONTAINER[?auth=key|entra|connection-string"
    "&protocol=https|http&verify=true|false&create=true|false&consistency=LEVEL"
    "&retries=N&timeout=SECONDS&connect_timeout=SECONDS&read_timeout=SECONDS"
    "&ttl=SECONDS], e.g. cosmos://myaccount.documents.azure.com/stepstone/runs"
)
_CONSISTENCY: Final = ("Strong", "BoundedStaleness", "Session", "ConsistentPrefix", "Eventual")
_OPTIONS: Final[dict[str, tuple[str, ...] | None]] = {
    "auth": ("key", "entra", "connection-string"),
    "protocol": ("https", "http"),
    "verify": ("true", "false"),
    "create": ("true", "false"),
    "consistency": _CONSISTENCY,
    "retries": None,
    "timeout": None,
    "connect_timeout": None,
    "read_timeout": None,
    "ttl": None,
}
#: Option names that would put a secret in the URL; refused with a pointer to the env.
_SECRET_OPTIONS: Final = frozenset(
    {
        "key",
        "accountkey",
        "account_key",
        "masterkey",
        "master_key",
        "connectionstring",
        "connection_string",
        "connection-string",
        "password",
        "secret",
        "token",
    }
)
KEY_ENV: Final = "AZURE_COSMOS_KEY"
CONNECTION_STRING_ENV: Final = "AZURE_COSMOS_CONNECTION_STRING"
#: Where a CA bundle for a private or self-signed certificate is read from (requests'
#: variable; this store passes it to the async transport too, so one setting serves both).
CA_BUNDLE_ENV: Final = "REQUESTS_CA_BUNDLE"
_CREDENTIAL_HELP: Final = (
    "Give credentials one of three ways: (1) set AZURE_COSMOS_KEY to the account key "
    "(auth=key); (2) set AZURE_COSMOS_CONNECTION_STRING to "
    "'AccountEndpoint=https://ACCOUNT.documents.azure.com:443/;AccountKey=...;' "
    "(auth=connection-string); (3) use Entra ID (auth=entra, the default when neither "
    "variable is set): a managed identity in Azure, or `az login` / AZURE_CLIENT_ID + "
    "AZURE_TENANT_ID + AZURE_CLIENT_SECRET locally, holding the 'Cosmos DB Built-in Data "
    "Contributor' role on the container"
)

DEFAULT_RETRIES: Final = 9  # the SDK's own default for throttling retries
DEFAULT_TIMEOUT: Final = 60.0  # seconds, per store call, retries included
#: Seconds to open a TCP (and TLS) connection. Azure answers in milliseconds; a firewall
#: that drops packets would otherwise hold a call for the OS's minutes-long default.
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
#: Seconds to wait for each answer once a request is sent. The service bounds a query
#: page to 5 s and answers a point operation in milliseconds; 30 s leaves room for a slow
#: network without letting a server that accepted the connection and went silent hang us.
DEFAULT_READ_TIMEOUT: Final = 30.0
_MAX_THROTTLE_WAIT: Final = 30  # seconds of cumulative 429 back-off (the SDK default)

# Ids used verbatim: URL-safe, never percent-decoded or dot-segment-normalised by HTTP
# libraries, and without '~' or '!', which mark the encoded forms, so the three forms
# can never produce the same id for two run_ids.
_VERBATIM: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_MAX_B64_ID: Final = 250
# Cosmos resource names (database, container): no / \ # ?, at most 255 characters.
_BAD_NAME: Final = re.compile(r"[/\\#?\x00-\x1f\x7f]")
# Cosmos sub-status 1003: "owner resource does not exist" (the database or container).
_OWNER_MISSING: Final = 1003

#: Item fields holding arbitrary JSON besides the state. Stored as JSON *text*, like the
#: state, because Cosmos keeps numbers as IEEE doubles (see ``CosmosStore._item``).
_TEXT_FIELDS: Final = ("input", "signals")

#: What listings and claims read of an item: never the state.
_INFO_FIELDS: Final = (
    "c.id, c.run_id, c.stepstone, c.step, c.total_steps, c.failure, c.updated_at, "
    "c.status, c.owner, c.due_at, c._etag"
)
_LIST_QUERY: Final = f"SELECT {_INFO_FIELDS} FROM c"
#: One equality query per active status: the shape Cosmos documents a composite index
#: (status, due_at) serving for both the filter and the ORDER BY (an equality on the first
#: path, the ORDER BY naming both). One ``status IN (...)`` query ordered by due_at alone
#: would save a request but is not that shape.
_CLAIM_RUNNING: Final = (
    f"SELECT TOP @limit {_INFO_FIELDS} FROM c WHERE c.status = @status "
    "ORDER BY c.status ASC, c.due_at ASC"
)
_CLAIM_DUE: Final = (
    f"SELECT TOP @limit {_INFO_FIELDS} FROM c WHERE c.status = @status "
    "AND c.due_at <= @now ORDER BY c.status ASC, c.due_at ASC"
)

#: ``list_page``'s composite indexes (the last two of ``CONTAINER_DEFINITION``).
_LISTING_INDEXES: Final = CONTAINER_DEFINITION["indexingPolicy"]["compositeIndexes"][1:]
#: Newest first, in exactly the order of those indexes (the emulator, like the service,
#: serves a multi-path ORDER BY only from a composite index of that order).
_PAGE_ORDER: Final = "ORDER BY c.updated_at DESC, c.run_id DESC"
_PAGE_ORDER_STATUS: Final = "ORDER BY c.status ASC, c.updated_at DESC, c.run_id DESC"


def item_id(run_id: str) -> str:
    """Return the Cosmos item id for a (valid) run_id.

    - made only of ``[A-Za-z0-9_.:-]``, 1-200 characters, not only dots: used verbatim,
      so ids stay readable in the portal;
    - otherwise ``~`` + unpadded base64url of its UTF-8, if that fits in 250 characters
      (reversible, case-preserving: ``a/B`` and ``a/b`` stay apart);
    - otherwise ``!`` + the SHA-256 hex of its UTF-8 (65 characters). The item keeps the
      run_id and ``load`` compares it, so a collision could never return another run.
    """
    if _VERBATIM.fullmatch(run_id) and run_id.strip("."):
        return run_id
    raw = run_id.encode("utf-8")
    encoded = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(encoded) < _MAX_B64_ID:
        return "~" + encoded
    return "!" + hashlib.sha256(raw).hexdigest()


def sortable_time(value: datetime) -> str:
    """Return ``value`` as fixed-width UTC text (``2026-12-01T09:00:00.000000Z``).

    Every stored ``due_at`` and every ``@now`` has this one form, so comparing and
    ordering the strings in a Cosmos query is comparing and ordering the instants.

    Raises:
        ValueError: ``value`` is naive (no time zone): its instant is unknown.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{value!r} has no time zone; pass an aware datetime (UTC)")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: Any) -> datetime | None:
    """Parse a stored timestamp; None stays None, anything else malformed raises."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"timestamp {value!r} is not text")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {value!r} has no time zone")
    return parsed


def _short(exc: BaseException, secret: str | None) -> str:
    """A one-paragraph, secret-free description of an SDK exception."""
    if isinstance(exc, CosmosHttpResponseError):
        message = str(exc.http_error_message or exc.message or exc)
        # The service answers with JSON: keep its "message" field, which says why.
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(message).get("message", message))
    else:
        message = str(exc)
    message = " ".join(message.split())
    if len(message) > 400:
        message = message[:400] + "..."
    return redact(message, (secret,) if secret else ())


# -- counting requests at the transport -------------------------------------------------

# Which store call the current thread or task is inside: (meter, caller, kind). A
# context variable, not a thread-local, so that tasks sharing a thread keep theirs apart.
_CALL: Final[contextvars.ContextVar[tuple[object, object, str] | None]] = contextvars.ContextVar(
    "stepstone_cosmos_call", default=None
)


def _caller() -> object:
    """The current asyncio task, or the current thread when no loop runs here."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task if task is not None else threading.get_ident()


class _Meter:
    """Counts the requests both transports send, and fires the save's kill hook.

    Sitting below every SDK retry loop, the transports see each attempt that actually
    goes out, so ``requests_sent`` is a measurement, not an estimate. A request sent by
    the thread or task that is inside a store call counts in ``requests_sent``; one the
    SDK sends from its own background threads or tasks (endpoint refresh, health checks)
    in ``background_requests``: a task the SDK spawns inherits the context variable but
    is another task, which is why the caller is recorded beside it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests_sent = 0
        self.background_requests = 0

    @contextlib.contextmanager
    def calling(self, saving: bool = False) -> Iterator[None]:
        """Mark the current thread or task as inside a store call (``saving``: a save)."""
        token = _CALL.set((self, _caller(), "save" if saving else "call"))
        try:
            yield
        finally:
            _CALL.reset(token)

    def kind(self) -> str | None:
        """``save``, ``call`` or None (a background request) for the current sender."""
        mark = _CALL.get()
        if mark is None or mark[0] is not self or mark[1] != _caller():
            return None
        return mark[2]

    def sent(self, kind: str | None, request: Any, answered: bool) -> None:
        """Count one request that went out; after a save's answered write, fire the hook."""
        with self._lock:
            if kind is None:
                self.background_requests += 1
            else:
                self.requests_sent += 1
        if answered and kind == "save" and request.method in ("POST", "PUT"):
            # The write reached the server and was answered; CosmosStore has not seen the
            # answer yet. A kill here must leave the NEW checkpoint visible.
            _hooks.fire("cosmos.request_sent")


class _Wire(HttpTransport[Any, Any]):
    """The sync HTTP transport under the SDK, metered (see ``_Meter``)."""

    def __init__(self, inner: HttpTransport[Any, Any], meter: _Meter) -> None:
        self._inner = inner
        self._meter = meter

    def send(self, request: Any, **kwargs: Any) -> Any:
        kind = self._meter.kind()
        try:
            response = self._inner.send(request, **kwargs)
        except ServiceRequestError:
            raise  # no connection was made: nothing was sent
        except BaseException:
            self._meter.sent(kind, request, answered=False)  # sent, no (whole) answer
            raise
        self._meter.sent(kind, request, answered=True)
        return response

    def open(self) -> None:
        self._inner.open()

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> Self:
        self._inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self._inner.__exit__(*args)


class _AsyncWire(AsyncHttpTransport[Any, Any]):
    """The async (aiohttp) transport under the aio SDK, metered like ``_Wire``."""

    def __init__(self, inner: AsyncHttpTransport[Any, Any], meter: _Meter) -> None:
        self._inner = inner
        self._meter = meter

    async def send(self, request: Any, **kwargs: Any) -> Any:
        # azure-cosmos 4.x's aio request passes connection_cert=(None, None) whenever an
        # SSLConfiguration is set, which aiohttp's transport reads as a client
        # certificate to load, and fails; no client certificate is what it means.
        if kwargs.get("connection_cert") == (None, None):
            kwargs["connection_cert"] = None
        kind = self._meter.kind()
        try:
            response = await self._inner.send(request, **kwargs)
        except ServiceRequestError:
            raise
        except BaseException:
            self._meter.sent(kind, request, answered=False)
            raise
        self._meter.sent(kind, request, answered=True)
        return response

    async def open(self) -> None:
        await self._inner.open()

    async def close(self) -> None:
        await self._inner.close()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self._inner.__aexit__(*args)


# -- error translation: the table ----------------------------------------------------

_PERMISSION: Final = (
    "Cosmos DB account {host!r} refused the {auth} credentials (HTTP {status}) for {what}: "
    "{detail}. With Entra ID the identity needs the 'Cosmos DB Built-in Data Contributor' "
    "role on the container; with a key, check it belongs to this account"
)
_UNAVAILABLE: Final = "{where}: {what}: service unavailable (HTTP {status}): {detail}"

#: HTTP status and sub-status -> the stepstone error and its message. A None sub-status
#: matches any; the specific row wins. Statuses not listed: 5xx -> ``StoreUnavailable``,
#: anything else -> ``StoreError``. Placeholders are filled by ``CosmosStore._error``.
_STATUS_RULES: Final[Mapping[tuple[int, int | None], tuple[type[StoreError], str]]] = (
    MappingProxyType(
        {
            (401, None): (StorePermissionError, _PERMISSION),
            (403, None): (StorePermissionError, _PERMISSION),
            (404, _OWNER_MISSING): (
                StoreError,
                "{where}: {what}: the database or container no longer exists ({detail}); "
                "create it with `stepstone init` or create=true",
            ),
            (404, None): (StoreError, "{where}: {what}: not found (HTTP 404): {detail}"),
            (408, None): (StoreUnavailable, "{where}: {what}: request timed out (HTTP 408)"),
            (409, None): (
                ConflictError,
                "run {run!r}: a checkpoint already exists but the save expected none (HTTP "
                "409); nothing was stored. Another worker started the run; reload it",
            ),
            (412, None): (
                ConflictError,
                "run {run!r}: the stored checkpoint changed since it was read (HTTP 412, ETag "
                "mismatch); nothing was {undone}. Another worker owns the run; reload it",
            ),
            (413, None): (
                CheckpointTooLarge,
                "run {run!r}: {where} refused the item as too large: {detail}",
            ),
            (429, None): (
                StoreUnavailable,
                "{where}: {what}: throttled (HTTP 429) after {retries} retries; raise the "
                "throughput or the retries= option: {detail}",
            ),
            (449, None): (StoreUnavailable, _UNAVAILABLE),
            (500, None): (StoreUnavailable, _UNAVAILABLE),
            (502, None): (StoreUnavailable, _UNAVAILABLE),
            (503, None): (StoreUnavailable, _UNAVAILABLE),
            (504, None): (StoreUnavailable, _UNAVAILABLE),
        }
    )
)

_MAYBE_APPLIED: Final = (
    ", so it may or may not have been applied (writes are not retried blindly); load "
    "the run again before continuing"
)
_TLS_HINT: Final = (
    ". The server's TLS certificate is not trusted: set REQUESTS_CA_BUNDLE to the CA "
    "file that signed it, or, for a local emulator only, add verify=false to the config"
)

#: Exceptions other than HTTP answers -> the stepstone error and its message, first
#: match wins (subclasses before their bases). Anything not listed propagates as is:
#: programming errors are not store errors.
_EXCEPTION_RULES: Final[tuple[tuple[type[BaseException], type[StoreError], str], ...]] = (
    (
        CosmosClientTimeoutError,
        StoreUnavailable,
        "{where}: {what} timed out after {timeout:g}s (timeout=, retries included)",
    ),
    (
        # azure-identity found no usable identity, or the token request failed. Short on
        # purpose: the credential chain's ~1000-character report stays on __cause__.
        ClientAuthenticationError,
        StorePermissionError,
        "no Entra ID token for Cosmos DB {host!r}: set AZURE_COSMOS_KEY (account key) or "
        "AZURE_COSMOS_CONNECTION_STRING, or sign in: `az login`, a managed identity, or "
        "AZURE_CLIENT_ID + AZURE_TENANT_ID + AZURE_CLIENT_SECRET",
    ),
    (
        ServiceRequestTimeoutError,
        StoreUnavailable,
        "{where}: {what}: could not connect within {connect_timeout:g}s "
        "(connect_timeout=); nothing was sent",
    ),
    (
        ServiceRequestError,
        StoreUnavailable,
        "{where}: {what}: cannot connect (unknown host, connection refused or TLS failure; "
        "nothing was sent): {detail}{tls_hint}",
    ),
    (
        ServiceResponseTimeoutError,
        StoreUnavailable,
        "{where}: {what}: no answer within {read_timeout:g}s (read_timeout=){maybe}",
    ),
    (
        ServiceResponseError,
        StoreUnavailable,
        "{where}: {what}: the connection failed after the request was sent{maybe}: {detail}",
    ),
    (TimeoutError, StoreUnavailable, "{where}: {what} timed out{maybe}"),
    (AzureError, StoreUnavailable, "{where}: {what} failed: {kind}: {detail}"),
)

_WRITES: Final = frozenset({"save", "delete", "expire"})


class _Call(NamedTuple):
    """What a store call was doing, for its error message."""

    action: str
    run_id: str | None = None
    size: int | None = None


class _Plan(NamedTuple):
    """A save, prepared and checked before any request: what to send, what to return."""

    run_id: str
    doc_id: str
    item: dict[str, Any]
    size: int
    text: str
    copy: dict[str, Any]
    now: datetime


@dataclass
class _Aio:
    """The aio client of one event loop (aiohttp sessions belong to the loop)."""

    loop: asyncio.AbstractEventLoop
    client: AsyncCosmosClient
    container: AsyncContainerProxy
    credential: AsyncTokenCredential | None


def _flag(value: str | None, default: bool) -> bool:
    return default if value is None else value == "true"


def _int_option(name: str, value: str | None, default: int | None, low: int) -> int | None:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"option {name}={value!r} must be an integer") from None
    if number < low and not (name == "ttl" and number == -1):
        raise ConfigError(f"option {name}={value!r} must be at least {low}")
    return number


def _seconds_option(name: str, value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"option {name}={value!r} must be a number of seconds") from None
    if not 0 < number <= 86400:
        raise ConfigError(f"option {name}={value!r} must be positive and at most 86400")
    return number


class CosmosStore(Store):
    """Checkpoints as items of an Azure Cosmos DB (NoSQL API) container partitioned by /id.

    Open it with ``open_store("cosmos://...")`` or build it directly; the clients connect
    lazily, on the first call that needs the server. Thread-safe: one sync client is
    shared; the async methods use one aio client per event loop.

    Counters for tests and benchmarks: ``requests_sent`` (HTTP requests made by store
    calls, sync and async, SDK retries included) and ``background_requests`` (the SDK's
    own).
    """

    scheme: ClassVar[str] = "cosmos"
    durability_levels: ClassVar[tuple[str, ...]] = ()
    kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"cosmos.before_request": False, "cosmos.request_sent": True}
    )
    supports_ttl: ClassVar[bool] = True
    counts_requests: ClassVar[bool] = True
    native_async: ClassVar[bool] = True

    def __init__(
        self,
        endpoint: str,
        database: str,
        container: str,
        *,
        credential: str | TokenCredential | None = None,
        async_credential: AsyncTokenCredential | None = None,
        auth: str = "key",
        verify: bool = True,
        create: bool = False,
        consistency: str | None = None,
        retries: int = DEFAULT_RETRIES,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        ttl: int | None = None,
        transport: HttpTransport[Any, Any] | None = None,
        async_transport: AsyncHttpTransport[Any, Any] | None = None,
    ) -> None:
        """Describe the store; nothing is sent until the first call.

        Args:
            endpoint: ``https://ACCOUNT.documents.azure.com:443/``.
            credential: the account key, or an azure-identity ``TokenCredential``.
            async_credential: the ``AsyncTokenCredential`` the async methods use when
                ``credential`` is a (sync) ``TokenCredential``; with ``auth="entra"``
                and none given, azure-identity's async ``DefaultAzureCredential``.
            auth: what ``credential`` is, for messages (``key``, ``entra``,
                ``connection-string``).
            timeout: seconds for a whole store call, retries included.
            connect_timeout: seconds to open a connection.
            read_timeout: seconds to wait for each answer.
            transport: an azure-core transport to send through (tests stub it).
            async_transport: the same for the async methods (default: aiohttp).

        Raises:
            ConfigError: a bad name, consistency level, timeout or ttl.
        """
        for kind, name in (("database", database), ("container", container)):
            if not name or len(name) > 255 or _BAD_NAME.search(name) or name != name.strip():
                raise ConfigError(
                    f"invalid Cosmos {kind} name {name!r}: 1-255 characters, no / \\ # ? "
                    "or control characters, no leading or trailing spaces"
                )
        if consistency is not None and consistency not in _CONSISTENCY:
            raise ConfigError(
                f"consistency {consistency!r} is not one of: {', '.join(_CONSISTENCY)}"
            )
        if ttl is not None and ttl != -1 and ttl < 1:
            raise ConfigError(f"ttl must be a positive number of seconds or -1, got {ttl}")
        for label, seconds in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout),
        ):
            if not seconds > 0:
                raise ConfigError(f"{label} must be a positive number of seconds, got {seconds}")
        self.endpoint = endpoint if endpoint.endswith("/") else endpoint + "/"
        self.database_name = database
        self.container_name = container
        self.auth = auth
        self._credential = credential
        self._async_credential = async_credential
        self._secret = credential if isinstance(credential, str) else None
        self._verify = verify
        self._create = create
        self._consistency = consistency
        self._retries = retries
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._ttl = ttl
        self._meter = _Meter()
        self._wire = _Wire(
            transport if transport is not None else RequestsTransport(**self._transport_config()),
            self._meter,
        )
        self._async_transport = async_transport
        self._client: CosmosClient | None = None
        self._database: DatabaseProxy | None = None
        self._container: ContainerProxy | None = None
        self._open_lock = threading.Lock()
        self._aio: _Aio | None = None
        self._aio_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._closed = False

    # -- configuration -----------------------------------------------------------------

    @classmethod
    def from_config(cls, config: str) -> Self:
        """Open ``cosmos://HOST[:PORT]/DATABASE/CONTAINER[?OPTIONS]``; see the module doc.

        Credentials never come from the string: ``AZURE_COSMOS_KEY``,
        ``AZURE_COSMOS_CONNECTION_STRING`` or Entra ID (DefaultAzureCredential).

        Raises:
            ConfigError: the string is malformed, has an unknown option or a secret.
            StorePermissionError: ``auth=key`` or ``auth=connection-string`` without
                the environment variable it needs.
        """
        # Never echo ``config`` in an error: someone may have pasted a key into it.
        parts = urlsplit(config)
        if parts.scheme.lower() != "cosmos":
            raise ConfigError(f"not a cosmos:// config string; form: {_FORMS}")
        if "@" in parts.netloc:
            raise ConfigError(
                "credentials do not belong in a cosmos:// config string (found 'user@' "
                f"before the host). {_CREDENTIAL_HELP}"
            )
        if parts.fragment:
            raise ConfigError(f"unexpected '#...' in a cosmos:// config string; form: {_FORMS}")
        for name in re.findall(r"(?:^|&)([^=&]*)", parts.query):
            if name.lower() in _SECRET_OPTIONS:
                raise ConfigError(
                    f"option {name!r} would put a secret in the config string, which ends up "
                    "in logs and process listings; set the key in the AZURE_COSMOS_KEY "
                    "environment variable instead (or AZURE_COSMOS_CONNECTION_STRING, or "
                    "use Entra ID)"
                )
        options = parse_options(parts.query, _OPTIONS, _FORMS)
        host = parts.netloc
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"invalid port in the cosmos:// host; form: {_FORMS}") from None
        if not parts.hostname or (port is not None and not 0 < port < 65536):
            raise ConfigError(f"missing account host in cosmos:// config string; form: {_FORMS}")
        segments = parts.path.split("/")
        if len(segments) != 3 or segments[0] != "" or not segments[1] or not segments[2]:
            raise ConfigError(
                "a cosmos:// config string names the database and the container as its "
                f"path, /DATABASE/CONTAINER; form: {_FORMS}"
            )
        database, container = unquote(segments[1]), unquote(segments[2])
        protocol = options.get("protocol", "https")
        endpoint = f"{protocol}://{host}/"

        timeout = _seconds_option("timeout", options.get("timeout"), DEFAULT_TIMEOUT)
        connect_timeout = _seconds_option(
            "connect_timeout", options.get("connect_timeout"), DEFAULT_CONNECT_TIMEOUT
        )
        read_timeout = _seconds_option(
            "read_timeout", options.get("read_timeout"), DEFAULT_READ_TIMEOUT
        )
        retries = _int_option("retries", options.get("retries"), DEFAULT_RETRIES, 0)
        ttl = _int_option("ttl", options.get("ttl"), None, 1)

        auth = options.get("auth")
        if auth is None:
            if os.environ.get(KEY_ENV):
                auth = "key"
            elif os.environ.get(CONNECTION_STRING_ENV):
                auth = "connection-string"
            else:
                auth = "entra"
        credential: str | TokenCredential
        if auth == "key":
            key = os.environ.get(KEY_ENV, "").strip()
            if not key:
                raise StorePermissionError(
                    f"auth=key but AZURE_COSMOS_KEY is empty: set it to the account key of "
                    f"{parts.hostname}, or set AZURE_COSMOS_CONNECTION_STRING, or use Entra "
                    "ID (auth=entra)"
                )
            credential = key
        elif auth == "connection-string":
            credential = _key_from_connection_string(
                os.environ.get(CONNECTION_STRING_ENV, ""), endpoint
            )
        else:
            try:
                # Imported only when used: it is slow to import and keys do not need it.
                from azure.identity import DefaultAzureCredential  # noqa: PLC0415
            except ImportError as exc:  # pragma: no cover - azure-identity is in the extra
                raise ConfigError(
                    "auth=entra needs azure-identity: pip install 'stepstone[cosmos]'"
                ) from exc
            # azure-identity logs its whole credential chain (~1000 characters) as a
            # warning when no identity works; with no logging configured Python prints it
            # to stderr. The store's own error already says what to set, and the chain
            # stays on its __cause__; a NullHandler keeps that text out of stderr while
            # an application's own logging still receives it.
            identity_log = logging.getLogger("azure.identity")
            if not any(isinstance(h, logging.NullHandler) for h in identity_log.handlers):
                identity_log.addHandler(logging.NullHandler())
            credential = DefaultAzureCredential()
        return cls(
            endpoint,
            database,
            container,
            credential=credential,
            auth=auth,
            verify=_flag(options.get("verify"), True),
            create=_flag(options.get("create"), False),
            consistency=options.get("consistency"),
            retries=cast(int, retries),
            timeout=timeout,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            ttl=ttl,
        )

    def __repr__(self) -> str:
        # Endpoint, names and auth kind only: never the credential.
        return (
            f"CosmosStore(endpoint={self.endpoint!r}, database={self.database_name!r}, "
            f"container={self.container_name!r}, auth={self.auth!r})"
        )

    @property
    def requests_sent(self) -> int:
        """HTTP requests store calls have sent so far, sync and async (retries count)."""
        return self._meter.requests_sent

    @property
    def background_requests(self) -> int:
        """HTTP requests the SDK sent on its own threads or tasks (endpoint refresh)."""
        return self._meter.background_requests

    # -- connection (shared settings) --------------------------------------------------

    def _verify_setting(self) -> bool | str:
        """What the transports verify TLS against: False, a CA file, or the system CAs."""
        if not self._verify:
            return False
        return os.environ.get(CA_BUNDLE_ENV, "").strip() or True

    def _transport_config(self) -> dict[str, Any]:
        return {
            "connection_timeout": self._connect_timeout,
            "read_timeout": self._read_timeout,
            "connection_verify": self._verify_setting(),
        }

    def _client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the sync and the aio ``CosmosClient`` alike."""
        policy: Any = ConnectionPolicy()
        # Throttling (429) retries: the server applied nothing, so they are safe for writes.
        policy.RetryOptions = RetryOptions(
            max_retry_attempt_count=self._retries, max_wait_time_in_seconds=_MAX_THROTTLE_WAIT
        )
        # The SDK picks its per-request timeouts from the policy (its account reads use
        # shorter ones of their own, which ours may only shorten further).
        policy.RequestTimeout = self._connect_timeout
        policy.ReadTimeout = self._read_timeout
        policy.DBAConnectionTimeout = min(policy.DBAConnectionTimeout, self._connect_timeout)
        policy.DBAReadTimeout = min(policy.DBAReadTimeout, self._read_timeout)
        policy.RecoveryReadTimeout = min(policy.RecoveryReadTimeout, self._read_timeout)
        verify = self._verify_setting()
        kwargs: dict[str, Any] = {
            "connection_policy": policy,
            # Connection-level retries (azure-core policy): a connection that failed to
            # open is retried (nothing was sent); a dropped response only for reads.
            "retry_total": self._retries,
            # Never replay a write whose outcome is unknown (the SDK default; pinned).
            "retry_write": 0,
            "timeout": self._timeout,
            "connection_timeout": self._connect_timeout,
            "read_timeout": self._read_timeout,
            "connection_verify": verify,
        }
        if verify is not False:
            # The SDK skips TLS verification for localhost/127.0.0.1 unless an
            # SSLConfiguration is given; give one so verify=true really verifies
            # (against the system CAs, or REQUESTS_CA_BUNDLE).
            ssl = SSLConfiguration()
            if isinstance(verify, str):
                ssl.SSLCaCerts = verify
            kwargs["ssl_config"] = ssl
        if self._consistency is not None:
            kwargs["consistency_level"] = self._consistency
        return kwargs

    def _closed_error(self, call: _Call | None = None) -> StoreError:
        if call is None:
            return StoreError(f"{self!r} is closed")
        what = call.action if call.run_id is None else f"{call.action} run {call.run_id!r}"
        note = _MAYBE_APPLIED if call.action in _WRITES else ""
        return StoreError(f"{self!r} is closed: it was closed during {what}{note}")

    def _missing_container(self, exc: BaseException) -> StoreError:
        return StoreError(
            f"Cosmos DB container {self.container_name!r} does not exist in database "
            f"{self.database_name!r} at {self.endpoint}; create it with `stepstone init` "
            "or by adding create=true to the config string (dev/emulators), or provision "
            "backends/cosmos/main.bicep"
        )

    def _missing_database(self) -> StoreError:
        return StoreError(
            f"Cosmos DB database {self.database_name!r} does not exist in "
            f"{self.endpoint}; create it (and the container) with `stepstone init` "
            "or by adding create=true to the config string (dev/emulators), or provision "
            "backends/cosmos/main.bicep"
        )

    def _check_partition_key(self, properties: Any) -> None:
        paths = (properties or {}).get("partitionKey", {}).get("paths")
        if paths != ["/id"]:
            raise StoreError(
                f"Cosmos DB container {self.container_name!r} is partitioned by {paths!r}, "
                "but stepstone needs ['/id'] (one logical partition per run); create a new "
                "container with backends/cosmos/container.json"
            )

    @staticmethod
    def _container_args() -> dict[str, Any]:
        definition = CONTAINER_DEFINITION
        return {
            "partition_key": PartitionKey(
                path=definition["partitionKey"]["paths"][0],
                kind=definition["partitionKey"]["kind"],
                version=definition["partitionKey"]["version"],
            ),
            "indexing_policy": definition["indexingPolicy"],
            "default_ttl": definition["defaultTtl"],
        }

    def _created(self, what: str, created: bool) -> str:
        name = self.database_name if what == "database" else self.container_name
        if not created:
            return f"{what} {name!r}: already exists"
        if what == "database":
            return f"database {name!r}: created"
        return (
            f"container {name!r}: created (partition key /id, state not indexed, "
            "claim index on (status, due_at), TTL enabled)"
        )

    # -- connection (sync) -------------------------------------------------------------

    def _new_client(self) -> CosmosClient:
        return CosmosClient(
            self.endpoint,
            cast(Any, self._credential),
            transport=self._wire,
            **self._client_kwargs(),
        )

    def _ensure_open(self) -> ContainerProxy:
        """Build the client once, and check (or create) the database and container."""
        container = self._container
        if container is not None:
            return container
        with self._open_lock:
            if self._container is not None:
                return self._container
            if self._closed:
                raise self._closed_error()
            with self._meter.calling(), self._translate(_Call("connect")):
                client = self._client or self._new_client()
                self._client = client
                database = client.get_database_client(self.database_name)
                container = database.get_container_client(self.container_name)
                self._database = database
                if self._create:
                    self._create_resources(client)
                # Reads the container's properties, which the SDK caches for every later
                # item call, so this is the request the SDK would make anyway.
                properties = self._read_container(container, database)
            self._check_partition_key(properties)
            self._container = container
            return container

    def _read_container(self, container: ContainerProxy, database: DatabaseProxy) -> Any:
        try:
            return container.read()
        except CosmosResourceNotFoundError as exc:
            try:
                database.read()
            except CosmosResourceNotFoundError:
                raise self._missing_database() from exc
            raise self._missing_container(exc) from exc

    def _create_resources(self, client: CosmosClient) -> list[str]:
        try:
            database = client.create_database(self.database_name)
            lines = [self._created("database", True)]
        except CosmosHttpResponseError as exc:
            if exc.status_code != 409:
                raise
            database = client.get_database_client(self.database_name)
            lines = [self._created("database", False)]
        try:
            database.create_container(self.container_name, **self._container_args())
            lines.append(self._created("container", True))
        except CosmosHttpResponseError as exc:
            if exc.status_code != 409:
                raise
            lines.append(self._created("container", False))
        self._database = database
        return lines

    # -- connection (async) ------------------------------------------------------------

    def _loop_lock(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        with self._open_lock:
            if self._aio_lock is None or self._aio_lock[0] is not loop:
                self._aio_lock = (loop, asyncio.Lock())
            return self._aio_lock[1]

    def _async_credential_for_client(self) -> tuple[Any, AsyncTokenCredential | None]:
        """The credential for an aio client, and the one this store must close after."""
        if isinstance(self._credential, str) or self._credential is None:
            return self._credential, None
        if self._async_credential is not None:
            return self._async_credential, None
        if self.auth != "entra":
            raise ConfigError(
                "the async methods need an AsyncTokenCredential: pass async_credential="
            )
        try:
            from azure.identity.aio import (  # noqa: PLC0415
                DefaultAzureCredential as AsyncDefaultAzureCredential,
            )
        except ImportError as exc:  # pragma: no cover - azure-identity is in the extra
            raise ConfigError(
                "auth=entra needs azure-identity: pip install 'stepstone[cosmos]'"
            ) from exc
        owned = AsyncDefaultAzureCredential()
        return owned, owned

    def _new_async_client(self) -> tuple[AsyncCosmosClient, AsyncTokenCredential | None]:
        try:
            # Imported on first async use: sync users need neither aiohttp nor aio.
            from azure.core.pipeline.transport import AioHttpTransport  # noqa: PLC0415
            from azure.cosmos.aio import CosmosClient as AioClient  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigError(
                "CosmosStore's async methods need aiohttp: pip install 'stepstone[cosmos]'"
            ) from exc
        inner = self._async_transport or AioHttpTransport(**self._transport_config())
        credential, owned = self._async_credential_for_client()
        client = AioClient(
            self.endpoint,
            credential,
            transport=_AsyncWire(inner, self._meter),
            **self._client_kwargs(),
        )
        return client, owned

    async def _aensure_open(self) -> AsyncContainerProxy:
        """The sync ``_ensure_open``, awaited, for the running event loop's aio client."""
        loop = asyncio.get_running_loop()
        aio = self._aio
        if aio is not None and aio.loop is loop:
            return aio.container
        async with self._loop_lock(loop):
            aio = self._aio
            if aio is not None and aio.loop is loop:
                return aio.container
            if self._closed:
                raise self._closed_error()
            # A client left by another (finished) loop cannot be awaited from this one;
            # it is dropped, and this loop gets its own.
            client, owned = self._new_async_client()
            try:
                with self._meter.calling(), self._translate(_Call("connect")):
                    await client.__aenter__()  # the account read
                    database = client.get_database_client(self.database_name)
                    container = database.get_container_client(self.container_name)
                    if self._create:
                        await self._acreate_resources(client)
                    properties = await self._aread_container(container, database)
                self._check_partition_key(properties)
            except BaseException:
                await _aclose_quietly(client, owned)
                raise
            self._aio = _Aio(loop, client, container, owned)
            return container

    async def _aread_container(
        self, container: AsyncContainerProxy, database: AsyncDatabaseProxy
    ) -> Any:
        try:
            return await container.read()
        except CosmosResourceNotFoundError as exc:
            try:
                await database.read()
            except CosmosResourceNotFoundError:
                raise self._missing_database() from exc
            raise self._missing_container(exc) from exc

    async def _acreate_resources(self, client: AsyncCosmosClient) -> list[str]:
        try:
            database = await client.create_database(self.database_name)
            lines = [self._created("database", True)]
        except CosmosHttpResponseError as exc:
            if exc.status_code != 409:
                raise
            database = client.get_database_client(self.database_name)
            lines = [self._created("database", False)]
        try:
            await database.create_container(self.container_name, **self._container_args())
            lines.append(self._created("container", True))
        except CosmosHttpResponseError as exc:
            if exc.status_code != 409:
                raise
            lines.append(self._created("container", False))
        return lines

    # -- error translation (shared) ------------------------------------------------------

    def _fields(self, exc: BaseException, call: _Call) -> dict[str, Any]:
        """The placeholders of the rule tables, for ``exc`` raised during ``call``."""
        status = getattr(exc, "status_code", None)
        detail = _short(exc, self._secret)
        tls = "certificate verify failed" in str(exc).lower() or (
            "CERTIFICATE_VERIFY_FAILED" in str(exc)
        )
        return {
            "where": f"Cosmos DB {self.endpoint} {self.database_name}/{self.container_name}",
            "what": call.action if call.run_id is None else f"{call.action} run {call.run_id!r}",
            "host": urlsplit(self.endpoint).hostname,
            "auth": self.auth,
            "run": call.run_id,
            "status": status,
            "detail": detail,
            "kind": type(exc).__name__,
            "retries": self._retries,
            "timeout": self._timeout,
            "connect_timeout": self._connect_timeout,
            "read_timeout": self._read_timeout,
            "undone": "deleted" if call.action == "delete" else "stored",
            "maybe": _MAYBE_APPLIED if call.action in _WRITES else "",
            "tls_hint": _TLS_HINT if tls else "",
        }

    def _error(self, exc: BaseException, call: _Call) -> StoreError | None:
        """Translate ``exc`` by the rule tables; None if no rule covers it."""
        status: int | None = None
        if isinstance(exc, CosmosHttpResponseError) and not isinstance(
            exc, CosmosClientTimeoutError
        ):
            status = int(exc.status_code or 0)
            sub_status = getattr(exc, "sub_status", None)
            rule = _STATUS_RULES.get((status, sub_status)) or _STATUS_RULES.get((status, None))
            if rule is None:
                rule = (
                    (StoreUnavailable, _UNAVAILABLE)
                    if status >= 500
                    else (StoreError, "{where}: {what} failed (HTTP {status}): {detail}")
                )
        else:
            found = [(cls, text) for kind, cls, text in _EXCEPTION_RULES if isinstance(exc, kind)]
            if not found:
                return None
            rule = found[0]
        cls, template = rule
        message = template.format(**self._fields(exc, call))
        if issubclass(cls, ConflictError):
            return cls(message, call.run_id)
        if issubclass(cls, CheckpointTooLarge):
            return cls(message, call.size or 0, MAX_ITEM_BYTES)
        if issubclass(cls, StoreUnavailable):
            return cls(message, status if status is not None else _timeout_status(exc))
        return cls(message)

    @contextlib.contextmanager
    def _translate(self, call: _Call) -> Iterator[None]:
        """Map SDK and azure-core exceptions to stepstone's, in this one place.

        A plain context manager, so the sync methods and the awaiting async ones share it.
        """
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            if self._closed:
                # close() or aclose() ran while this call was in flight and pulled the
                # transport from under it (the SDK raises ValueError, aiohttp assertions):
                # that is the closed-store error, whatever the driver calls it.
                raise self._closed_error(call) from exc
            error = self._error(exc, call)
            if error is None:
                raise
            raise error from exc

    def _item_missing(self, exc: CosmosResourceNotFoundError) -> None:
        """Re-raise a 404 that means the container is gone; return for a missing item."""
        if getattr(exc, "sub_status", None) == _OWNER_MISSING:
            raise exc

    # -- items (shared) ------------------------------------------------------------------

    def _doc_id(self, run_id: str) -> str:
        return item_id(check_run_id(run_id))

    def _source(self, doc_id: object) -> str:
        return f"cosmos item {doc_id!r} in {self.database_name}/{self.container_name}"

    def _checkpoint(self, doc: dict[str, Any], run_id: str) -> Checkpoint:
        """Return the checkpoint an item holds, refusing one that is not ``run_id``'s."""
        source = self._source(doc.get("id"))
        check_document(doc, source)
        if doc.get("run_id") != run_id or doc.get("id") != item_id(run_id):
            raise CorruptCheckpoint(
                f"{source}: holds run {doc.get('run_id')!r} under id {doc.get('id')!r}, not "
                f"run {run_id!r}; left untouched"
            )
        etag = doc.get("_etag")
        if not isinstance(etag, str):
            raise CorruptCheckpoint(f"{source}: the service returned no _etag")
        for name in ("state", *_TEXT_FIELDS):
            text = doc.get(name)
            if isinstance(text, str):  # see _item: stored as JSON text
                try:
                    doc[name] = json.loads(text)
                except ValueError as exc:
                    raise CorruptCheckpoint(
                        f"{source}: the {name} is not valid JSON text ({exc}); left untouched"
                    ) from exc
        return checkpoint_from_doc(doc, etag, source)

    def _item(self, cp: Checkpoint, doc_id: str, state_text: str) -> tuple[dict[str, Any], int]:
        """Return the item for ``cp`` and its size in bytes as the SDK will send it."""
        meta: dict[str, Any] = {"id": doc_id, **checkpoint_meta(cp)}
        # The state, the input and signal payloads go in as JSON *text*, not nested.
        # Cosmos DB keeps numbers as IEEE doubles: an int above 2**53 would lose digits,
        # 1.0 would come back as 1 and -0.0 as 0. As strings they round-trip exactly, as
        # on every other backend; they are never queried, so nothing is lost.
        for name in _TEXT_FIELDS:
            if name in meta:
                try:
                    meta[name] = json.dumps(
                        meta[name], ensure_ascii=False, allow_nan=False, separators=(",", ":")
                    )
                except (TypeError, ValueError) as exc:
                    raise InvalidState(
                        f"run {cp.run_id!r}: the {name} does not encode as JSON: {exc}", name
                    ) from exc
        # The listing fields, beside the document so queries never parse it.
        meta["status"] = cp.status
        due = cp.due_at
        if due is not None:
            meta["due_at"] = sortable_time(due)
        if self._ttl is not None:
            meta["ttl"] = self._ttl
        item = {**meta, "state": state_text}
        # The SDK sends json.dumps(item, separators=(",", ":")) (ASCII, so characters
        # are bytes): measure exactly that.
        size = len(json.dumps(item, separators=(",", ":")))
        return item, size

    def _plan(self, checkpoint: Checkpoint) -> _Plan:
        """Encode and check a save before any request (InvalidState, CheckpointTooLarge)."""
        run_id = check_run_id(checkpoint.run_id)
        text, copy = encode_state(checkpoint.state)
        now = utcnow()
        stored = checkpoint.stored(copy, text, "", now)
        doc_id = item_id(run_id)
        item, size = self._item(stored, doc_id, text)
        if size > MAX_ITEM_BYTES:
            raise CheckpointTooLarge(
                f"run {run_id!r}: the checkpoint is {size:,} bytes as a Cosmos DB item, over "
                f"the {MAX_ITEM_BYTES:,}-byte limit; nothing was sent. Keep large data "
                "elsewhere (e.g. Blob Storage) and put its reference in the state",
                size,
                MAX_ITEM_BYTES,
            )
        return _Plan(run_id, doc_id, item, size, text, copy, now)

    def _saved(self, plan: _Plan, checkpoint: Checkpoint, result: Any) -> Checkpoint:
        etag = (result or {}).get("_etag")
        if not isinstance(etag, str):
            raise StoreError(f"run {plan.run_id!r}: Cosmos DB answered the save without an _etag")
        return checkpoint.stored(plan.copy, plan.text, etag, plan.now)

    def _deleted_meanwhile(self, exc: CosmosResourceNotFoundError, run_id: str) -> ConflictError:
        self._item_missing(exc)
        return ConflictError(
            f"run {run_id!r}: the checkpoint was deleted since it was loaded; nothing was stored",
            run_id,
        )

    def _cas(self, version: str | None) -> dict[str, Any]:
        """Keyword arguments of a write that must find ``version`` (If-Match)."""
        if version is None:
            return {"timeout": self._timeout}
        return {
            "etag": version,
            "match_condition": MatchConditions.IfNotModified,
            "timeout": self._timeout,
        }

    def _info(self, row: Any) -> RunInfo | None:
        """Return a listing row as a ``RunInfo``; log and skip a malformed one."""
        try:
            return _run_info(row)
        except (KeyError, TypeError, ValueError) as exc:
            ident = row.get("id") if isinstance(row, dict) else None
            logger.warning("skipping %s in listing: %s", self._source(ident), exc)
            return None

    def _run_ids(self, rows: list[Any]) -> Iterator[str]:
        for row in rows:
            info = self._info(row)
            if info is not None:
                yield info.run_id

    def _claimed(
        self, running: list[Any], queued: list[Any], waiting: list[Any], limit: int
    ) -> list[RunInfo]:
        def infos(rows: list[Any]) -> list[RunInfo]:
            return [info for info in map(self._info, rows) if info is not None]

        # Each list came back in due_at order; merge the two due kinds by it.
        due = sorted(infos(queued) + infos(waiting), key=_due_key)
        return infos(running)[:limit] + due[:limit]

    # -- the Store methods (sync) ----------------------------------------------------------

    def load(self, run_id: str) -> Checkpoint | None:
        """Return the run's checkpoint (one point read), or None.

        Raises:
            InvalidRunId: not a valid run id.
            CorruptCheckpoint: the item is not a stepstone checkpoint, or another run's.
            StoreUnavailable: the service cannot be reached, throttles or times out.
            StorePermissionError: the credentials were refused or are missing.
        """
        doc_id = self._doc_id(run_id)
        container = self._ensure_open()
        with self._meter.calling(), self._translate(_Call("load", run_id)):
            try:
                doc = container.read_item(doc_id, partition_key=doc_id, timeout=self._timeout)
            except CosmosResourceNotFoundError as exc:
                self._item_missing(exc)
                return None
        return self._checkpoint(dict(doc), run_id)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Store ``checkpoint`` with one create (no version) or If-Match replace.

        Raises:
            ConflictError: the stored version differs (409/412) or the run was deleted.
            InvalidState: the state does not round-trip through JSON; nothing was sent.
            CheckpointTooLarge: over 2 MB as an item; nothing was sent.
            StoreUnavailable: unreachable, throttled, timed out; a write whose answer was
                lost says it may or may not have been applied.
            StorePermissionError: the credentials were refused or are missing.
        """
        plan = self._plan(checkpoint)
        container = self._ensure_open()
        _hooks.fire("cosmos.before_request")
        with (
            self._meter.calling(saving=True),
            self._translate(_Call("save", plan.run_id, plan.size)),
        ):
            try:
                if checkpoint.version is None:
                    result = container.create_item(plan.item, **self._cas(None))
                else:
                    result = container.replace_item(
                        plan.doc_id, plan.item, **self._cas(checkpoint.version)
                    )
            except CosmosResourceNotFoundError as exc:
                raise self._deleted_meanwhile(exc, plan.run_id) from exc
        return self._saved(plan, checkpoint, result)

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Delete the run's item (one request, If-Match with ``expected_version``).

        Raises:
            InvalidRunId: not a valid run id.
            ConflictError: ``expected_version`` is no longer the stored one (412);
                nothing was deleted.
            StoreUnavailable: the service cannot be reached, throttles or times out.
            StorePermissionError: the credentials were refused or are missing.
        """
        doc_id = self._doc_id(run_id)
        container = self._ensure_open()
        with self._meter.calling(), self._translate(_Call("delete", run_id)):
            try:
                container.delete_item(doc_id, partition_key=doc_id, **self._cas(expected_version))
            except CosmosResourceNotFoundError as exc:
                self._item_missing(exc)
                return False
        return True

    def _query(self, query: str, parameters: list[dict[str, Any]] | None = None) -> list[Any]:
        container = self._ensure_open()
        with self._meter.calling(), self._translate(_Call("query")):
            return list(
                container.query_items(
                    query,
                    parameters=parameters,
                    enable_cross_partition_query=True,
                    timeout=self._timeout,
                )
            )

    def list_runs(self) -> Iterator[str]:
        """Yield every run_id (a query, one request per page; malformed items skipped).

        Raises:
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        return self._run_ids(self._query(_LIST_QUERY))

    def list_info(self) -> Iterator[RunInfo]:
        """One query for every run's listing fields, without reading the states.

        A hand-edited or foreign item is logged and skipped; the others are listed.

        Raises:
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        return iter([info for info in map(self._info, self._query(_LIST_QUERY)) if info])

    def claimable(
        self,
        now: datetime,
        limit: int = 100,
        *,
        status: RunStatus | None = None,
        skip: int = 0,
    ) -> list[RunInfo]:
        """Return running runs and due queued/waiting ones, from the (status, due_at) index.

        Three queries, one per active status, each an equality on ``status`` with
        ``due_at`` ordered (and bounded by ``now`` for the due kinds): served by the
        composite index, they read no finished run and no state. With ``status``, one
        page of that kind (``Store.claimable``).

        Raises:
            ValueError: ``now`` is naive, ``limit`` is not positive, ``status`` is not
                active or ``skip`` is negative.
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        queries = _claim_queries(now, limit, status, skip)
        if status is not None:
            rows = self._query(*queries[0])[skip:]
            return [info for info in map(self._info, rows) if info]
        running, queued, waiting = (self._query(q, p) for q, p in queries)
        return self._claimed(running, queued, waiting, limit)

    def close(self) -> None:
        """Close the sync client, and the aio one where its loop allows; idempotent."""
        with self._open_lock:
            self._closed = True
            client, self._client = self._client, None
            self._container = self._database = None
            aio, self._aio = self._aio, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        if aio is not None:
            _close_elsewhere(aio)

    # -- the Store methods (async): the sync ones, with the I/O awaited ------------------

    async def aload(self, run_id: str) -> Checkpoint | None:
        """Async ``load``: one point read through the aio client; same errors."""
        doc_id = self._doc_id(run_id)
        container = await self._aensure_open()
        with self._meter.calling(), self._translate(_Call("load", run_id)):
            try:
                doc = await container.read_item(doc_id, partition_key=doc_id, timeout=self._timeout)
            except CosmosResourceNotFoundError as exc:
                self._item_missing(exc)
                return None
        return self._checkpoint(dict(doc), run_id)

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        """Async ``save``: one request; cancelling it leaves the old or the new item."""
        plan = self._plan(checkpoint)
        container = await self._aensure_open()
        _hooks.fire("cosmos.before_request")
        with (
            self._meter.calling(saving=True),
            self._translate(_Call("save", plan.run_id, plan.size)),
        ):
            try:
                if checkpoint.version is None:
                    result = await container.create_item(plan.item, **self._cas(None))
                else:
                    result = await container.replace_item(
                        plan.doc_id, plan.item, **self._cas(checkpoint.version)
                    )
            except CosmosResourceNotFoundError as exc:
                raise self._deleted_meanwhile(exc, plan.run_id) from exc
        return self._saved(plan, checkpoint, result)

    async def adelete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Async ``delete``; same contract, same errors."""
        doc_id = self._doc_id(run_id)
        container = await self._aensure_open()
        with self._meter.calling(), self._translate(_Call("delete", run_id)):
            try:
                await container.delete_item(
                    doc_id, partition_key=doc_id, **self._cas(expected_version)
                )
            except CosmosResourceNotFoundError as exc:
                self._item_missing(exc)
                return False
        return True

    async def _aquery(
        self, query: str, parameters: list[dict[str, Any]] | None = None
    ) -> list[Any]:
        container = await self._aensure_open()
        with self._meter.calling(), self._translate(_Call("query")):
            pages = container.query_items(query, parameters=parameters, timeout=self._timeout)
            return [row async for row in pages]

    async def alist_runs(self) -> AsyncIterator[str]:
        """Async ``list_runs``."""
        for run_id in self._run_ids(await self._aquery(_LIST_QUERY)):
            yield run_id

    async def alist_info(self) -> AsyncIterator[RunInfo]:
        """Async ``list_info``."""
        for row in await self._aquery(_LIST_QUERY):
            info = self._info(row)
            if info is not None:
                yield info

    async def aclaimable(
        self,
        now: datetime,
        limit: int = 100,
        *,
        status: RunStatus | None = None,
        skip: int = 0,
    ) -> list[RunInfo]:
        """Async ``claimable``: the same three indexed queries, run concurrently."""
        queries = _claim_queries(now, limit, status, skip)
        if status is not None:
            rows = (await self._aquery(*queries[0]))[skip:]
            return [info for info in map(self._info, rows) if info]
        running, queued, waiting = await asyncio.gather(*(self._aquery(q, p) for q, p in queries))
        return self._claimed(running, queued, waiting, limit)

    async def aclose(self) -> None:
        """Close the aio client of this loop (and any other, where possible), then sync."""
        with self._open_lock:
            aio = self._aio
            if aio is not None and aio.loop is asyncio.get_running_loop():
                self._aio = None
            else:
                aio = None
        if aio is not None:
            await _aclose_quietly(aio.client, aio.credential)
        self.close()

    # -- Cosmos-specific ---------------------------------------------------------------

    def expire(self, run_id: str, ttl_seconds: int | None) -> bool:
        """Let Cosmos delete the run ``ttl_seconds`` after its last write (native TTL).

        ``-1`` keeps it forever, None falls back to the store's ``ttl`` / the container's
        default. Read plus conditional replace, retried if a save lands in between; the
        run's version changes, so meant for finished runs. Returns False if no such run.

        Raises:
            ValueError: ``ttl_seconds`` is not >= 1, -1 or None.
            ConflictError: the run kept changing for five attempts.
            CorruptCheckpoint: the item is not this run's checkpoint; left untouched.
        """
        if ttl_seconds is not None and ttl_seconds != -1 and ttl_seconds < 1:
            raise ValueError(f"ttl_seconds must be >= 1, -1 or None, got {ttl_seconds}")
        doc_id = self._doc_id(run_id)
        container = self._ensure_open()
        for _ in range(5):
            with self._meter.calling(), self._translate(_Call("expire", run_id)):
                try:
                    doc = dict(container.read_item(doc_id, partition_key=doc_id))
                except CosmosResourceNotFoundError as exc:
                    self._item_missing(exc)
                    return False
                self._checkpoint(dict(doc), run_id)  # refuse to touch what is not ours
                etag = doc["_etag"]
                body = {k: v for k, v in doc.items() if not k.startswith("_")}
                if ttl_seconds is None:
                    body.pop("ttl", None)
                else:
                    body["ttl"] = ttl_seconds
                try:
                    container.replace_item(doc_id, body, **self._cas(etag))
                except CosmosHttpResponseError as exc:
                    if exc.status_code in (404, 412):
                        continue  # a save or delete landed in between: look again
                    raise
                return True
        raise ConflictError(f"run {run_id!r}: kept changing while setting its ttl", run_id)

    def init(self) -> list[str]:
        """Create the database and the container (``backends/cosmos/container.json``).

        Raises:
            StorePermissionError: the credentials may not create them; Entra ID data-plane
                roles never can (provision with ``backends/cosmos/main.bicep``).
        """
        with self._open_lock:
            try:
                with self._meter.calling(), self._translate(_Call("init")):
                    client = self._client or self._new_client()
                    self._client = client
                    lines = self._create_resources(client)
                    lines.extend(self._upgrade_indexing(client))
            except StorePermissionError as exc:
                raise StorePermissionError(
                    f"{exc} -- creating databases and containers is a control-plane "
                    "operation that Entra ID data-plane roles do not allow; provision them "
                    "with backends/cosmos/main.bicep (or az cosmosdb sql container create), "
                    "or run `stepstone init` with the account key"
                ) from exc
            self._container = None  # re-check the partition key on next use
        self._ensure_open()
        return lines

    def _upgrade_indexing(self, client: CosmosClient) -> list[str]:
        """Give a container made by an older stepstone the claim and listing indexes.

        Its TTL is kept.

        Adding index paths is an online operation in Cosmos DB (the index is rebuilt in
        the background; queries keep working meanwhile), so ``init`` does it in place.
        """
        database = client.get_database_client(self.database_name)
        properties = database.get_container_client(self.container_name).read()
        policy = properties.get("indexingPolicy") or {}
        missing = [
            what
            for what, ok in (
                ("claim index on (status, due_at)", _index_diagnosis(policy).ok),
                ("listing indexes on (status, updated_at, run_id)", _listing_indexed(policy)),
            )
            if not ok
        ]
        if not missing:
            return []
        args = self._container_args()
        database.replace_container(
            self.container_name,
            partition_key=args["partition_key"],
            indexing_policy=args["indexing_policy"],
            default_ttl=properties.get("defaultTtl"),
        )
        return [
            f"container {self.container_name!r}: indexing policy updated "
            f"({' and '.join(missing)} added)"
        ]

    def doctor(self) -> list[Diagnosis]:
        """The base probe checks, plus partition key, claim index, TTL and schemas."""
        results: list[Diagnosis] = []
        try:
            container = self._ensure_open()
            with self._meter.calling(), self._translate(_Call("doctor")):
                properties = container.read()
        except Exception as exc:
            return [Diagnosis("open the container", False, f"{type(exc).__name__}: {exc}")]
        results.append(Diagnosis("open the container", True, "ok"))
        paths = properties.get("partitionKey", {}).get("paths")
        results.append(
            Diagnosis(
                "partition key is /id",
                paths == ["/id"],
                "ok" if paths == ["/id"] else f"partition key paths are {paths!r}",
            )
        )
        results.append(_index_diagnosis(properties.get("indexingPolicy") or {}))
        listed = _listing_indexed(properties.get("indexingPolicy") or {})
        results.append(
            Diagnosis(
                "listing indexes (status, updated_at, run_id)",
                listed,
                "ok"
                if listed
                else "the container lacks the composite indexes the dashboard's listing "
                "orders by (it scans instead); run `stepstone init` or update its indexing "
                "policy to backends/cosmos/container.json",
            )
        )
        default_ttl = properties.get("defaultTtl")
        results.append(
            Diagnosis(
                "TTL enabled (defaultTtl set)",
                default_ttl is not None,
                f"defaultTtl={default_ttl}"
                if default_ttl is not None
                else "defaultTtl is off: expire() and ttl= have no effect; set it to -1",
            )
        )
        results.extend(super().doctor())
        readable = ", ".join(str(v) for v in sorted(READABLE_SCHEMAS))
        try:
            foreign = self._query(
                "SELECT TOP 5 c.id, c.stepstone FROM c "
                f"WHERE NOT IS_DEFINED(c.stepstone) OR NOT (c.stepstone IN ({readable}))"
            )
        except Exception as exc:
            results.append(Diagnosis("checkpoint schema", False, f"{type(exc).__name__}: {exc}"))
        else:
            results.append(
                Diagnosis(
                    f"checkpoint schema {SCHEMA_VERSION}",
                    not foreign,
                    "ok"
                    if not foreign
                    else "items with another or no schema: "
                    + ", ".join(f"{r.get('id')!r}={r.get('stepstone')!r}" for r in foreign),
                )
            )
        return results

    # -- the dashboard's listing (Store.list_page, count_by_status) ---------------------

    def _page_query(
        self, status: str | None, prefix: str, after: tuple[str, str] | None, limit: int
    ) -> tuple[str, list[dict[str, Any]]]:
        """Return the query of one listing page and its parameters.

        ``after`` is the stored (updated_at, run_id) text of the last row already read.
        """
        where: list[str] = []
        params: list[dict[str, Any]] = [{"name": "@limit", "value": limit}]
        if status is not None:
            where.append("c.status = @status")
            params.append({"name": "@status", "value": status})
        if prefix:
            where.append("STARTSWITH(c.run_id, @prefix)")
            params.append({"name": "@prefix", "value": prefix})
        if after is not None:
            where.append("(c.updated_at < @at OR (c.updated_at = @at AND c.run_id < @after))")
            params += [{"name": "@at", "value": after[0]}, {"name": "@after", "value": after[1]}]
        query = f"SELECT TOP @limit {_INFO_FIELDS} FROM c"
        if where:
            query += " WHERE " + " AND ".join(where)
        order = _PAGE_ORDER if status is None else _PAGE_ORDER_STATUS
        return f"{query} {order}", params

    def list_page(
        self,
        status: RunStatus | None = None,
        *,
        prefix: str = "",
        after: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[RunInfo]:
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
        if limit <= 0:
            return []
        found: list[RunInfo] = []
        cursor = None if after is None else (_time_text(after[0]), after[1])
        while True:
            query, params = self._page_query(status, prefix, cursor, limit)
            try:
                rows = self._query(query, params)
            except StoreError as exc:
                if not _lacks_index(exc):
                    raise
                logger.warning(
                    "%s lacks the listing indexes (run `stepstone init`); listing by a scan",
                    self._source(None),
                )
                return super().list_page(status, prefix=prefix, after=after, limit=limit)
            found.extend(info for info in map(self._info, rows) if info is not None)
            if len(rows) < limit or len(found) >= limit:
                return found[:limit]
            # A malformed item was skipped: read on after the last row, as a scan would.
            last = rows[-1]
            at, run_id = last.get("updated_at"), last.get("run_id")
            if not isinstance(at, str) or not isinstance(run_id, str):  # pragma: no cover
                return found
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
            rows = self._query(f"SELECT VALUE COUNT(1) FROM c WHERE {where}", params)
            # The SDK may hand back one partial count per partition: their sum is the count.
            counts[status] = sum(int(n) for n in rows if isinstance(n, int | float))
        return counts


# -- module helpers ----------------------------------------------------------------------


def _run_info(row: Any) -> RunInfo:
    """Build a ``RunInfo`` from a listing row, raising on anything malformed."""
    if not isinstance(row, dict):
        raise TypeError("the row is not an object")
    run_id, doc_id, step = row.get("run_id"), row.get("id"), row.get("step")
    if not isinstance(run_id, str) or not isinstance(doc_id, str):
        raise TypeError("no run_id or id")
    if doc_id != item_id(run_id):
        # A copy of another run's item: listing it would show that run twice.
        raise ValueError(f"holds run {run_id!r}, whose item id is {item_id(run_id)!r}")
    schema = row.get("stepstone")
    if type(schema) is not int or schema not in READABLE_SCHEMAS:
        raise ValueError(f"checkpoint schema {schema!r} is not readable")
    if type(step) is not int or step < -1:
        raise TypeError(f"step {step!r} is not an integer")
    total = row.get("total_steps")
    if total is not None and type(total) is not int:
        raise TypeError(f"total_steps {total!r} is not an integer")
    status = row.get("status")
    if status is None:
        # Written before schema 2 stored the status: derive it as a load would.
        status = run_status(step, total, row.get("failure") is not None)
    elif status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    owner = row.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise TypeError(f"owner {owner!r} is not text")
    etag = row.get("_etag")
    if not isinstance(etag, str):
        raise TypeError("no _etag")
    return RunInfo(
        run_id,
        cast(RunStatus, status),
        step,
        total,
        _parse_time(row.get("updated_at")),
        version=etag,
        owner=owner,
        due_at=_parse_time(row.get("due_at")),
    )


_FAR_PAST: Final = datetime(1, 1, 1, tzinfo=UTC)


def _due_key(info: RunInfo) -> datetime:
    return info.due_at or _FAR_PAST


def _claim_queries(
    now: datetime, limit: int, status: RunStatus | None = None, skip: int = 0
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The three ``claimable`` queries with their parameters, running first.

    With ``status``, the one query of that kind, for the first ``skip + limit`` runs: the
    caller drops ``skip`` of them. (``OFFSET ... LIMIT`` would cost the same request
    units, the skipped items being read either way, and not every emulator parses it.)
    """
    if type(limit) is not int or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    check_page(status, skip)
    at = sortable_time(now)
    if status is not None:
        page: list[dict[str, Any]] = [
            {"name": "@limit", "value": skip + limit},
            {"name": "@status", "value": status},
        ]
        if status == "running":
            return [(_CLAIM_RUNNING, page)]
        return [(_CLAIM_DUE, [*page, {"name": "@now", "value": at}])]
    queries: list[tuple[str, list[dict[str, Any]]]] = [
        (
            _CLAIM_RUNNING,
            [{"name": "@limit", "value": limit}, {"name": "@status", "value": "running"}],
        )
    ]
    for kind in ACTIVE_STATUSES:
        if kind != "running":
            params: list[dict[str, Any]] = [
                {"name": "@limit", "value": limit},
                {"name": "@status", "value": kind},
                {"name": "@now", "value": at},
            ]
            queries.append((_CLAIM_DUE, params))
    return queries


def _timeout_status(exc: BaseException) -> int | None:
    """HTTP 408 for a timeout, so callers can tell it from an unreachable host."""
    if isinstance(exc, CosmosClientTimeoutError | ServiceResponseTimeoutError | TimeoutError):
        return 408
    return None


def _index_diagnosis(policy: Mapping[str, Any]) -> Diagnosis:
    """Whether the container has the (status, due_at) index ``claimable`` relies on."""
    want = CONTAINER_DEFINITION["indexingPolicy"]["compositeIndexes"][0]

    def norm(index: Any) -> list[tuple[Any, Any]]:
        return [(p.get("path"), (p.get("order") or "ascending").lower()) for p in index]

    have = [norm(index) for index in policy.get("compositeIndexes") or []]
    ok = norm(want) in have
    return Diagnosis(
        "claim index (status, due_at)",
        ok,
        "ok"
        if ok
        else "the container lacks the composite index on (status, due_at) and the "
        "/status/? and /due_at/? paths that finding work needs; update its indexing "
        "policy to backends/cosmos/container.json (az cosmosdb sql container update)",
    )


def _time_text(value: datetime) -> str:
    """Return ``value`` as a save stores ``updated_at``: UTC ``isoformat`` text."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # as ``page_key`` reads a naive time
    return value.astimezone(UTC).isoformat()


def _lacks_index(exc: StoreError) -> bool:
    """Whether a query failed for want of the composite index its ORDER BY needs."""
    cause = exc.__cause__
    return (
        isinstance(cause, CosmosHttpResponseError)
        and cause.status_code == 400
        and "composite index" in str(cause)
    )


def _listing_indexed(policy: Mapping[str, Any]) -> bool:
    """Whether the container has the composite indexes ``list_page`` orders by."""

    def norm(index: Any) -> list[tuple[Any, Any]]:
        return [(p.get("path"), (p.get("order") or "ascending").lower()) for p in index]

    have = [norm(index) for index in policy.get("compositeIndexes") or []]
    return all(norm(want) in have for want in _LISTING_INDEXES)


async def _aclose_quietly(client: Any, credential: Any) -> None:
    with contextlib.suppress(Exception):
        await client.close()
    if credential is not None:
        with contextlib.suppress(Exception):
            await credential.close()


def _close_elsewhere(aio: _Aio) -> None:
    """Close an aio client from sync code: on its loop if that loop still runs."""
    loop = aio.loop
    if loop.is_closed():
        return  # its sessions died with the loop
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    closing = _aclose_quietly(aio.client, aio.credential)
    if running is loop:
        # close() called from a coroutine on that loop: it cannot wait for itself.
        loop.create_task(closing)
    elif loop.is_running():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(closing, loop).result(timeout=5)
    else:
        with contextlib.suppress(Exception):
            loop.run_until_complete(closing)


def _key_from_connection_string(conn_str: str, endpoint: str) -> str:
    """Return the AccountKey of a connection string whose endpoint matches ``endpoint``."""
    if not conn_str.strip():
        raise StorePermissionError(
            "auth=connection-string but AZURE_COSMOS_CONNECTION_STRING is empty: set it to "
            "'AccountEndpoint=https://ACCOUNT.documents.azure.com:443/;AccountKey=...;', or "
            "set AZURE_COSMOS_KEY, or use Entra ID (auth=entra)"
        )
    settings: dict[str, str] = {}
    for part in conn_str.strip().strip(";").split(";"):
        name, sep, value = part.partition("=")
        if sep:
            settings[name.strip().lower()] = value.strip()
    account_endpoint = settings.get("accountendpoint")
    key = settings.get("accountkey")
    if not account_endpoint or not key:
        raise ConfigError(
            "AZURE_COSMOS_CONNECTION_STRING must look like "
            "'AccountEndpoint=https://ACCOUNT.documents.azure.com:443/;AccountKey=...;' "
            "(AccountEndpoint or AccountKey is missing)"
        )
    want, have = urlsplit(endpoint), urlsplit(account_endpoint)
    default = {"https": 443, "http": 80}
    if (want.hostname or "").lower() != (have.hostname or "").lower() or (
        want.port or default.get(want.scheme)
    ) != (have.port or default.get(have.scheme)):
        raise ConfigError(
            f"AZURE_COSMOS_CONNECTION_STRING is for {have.scheme}://{have.netloc}/ but the "
            f"config string names {endpoint}; use the connection string of that account"
        )
    return key
