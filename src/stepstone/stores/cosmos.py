"""CosmosStore: one Azure Cosmos DB item per run, saved with ETag compare-and-swap.

Config string::

    cosmos://ACCOUNT-HOST[:PORT]/DATABASE/CONTAINER[?OPTIONS]

e.g. ``cosmos://myacct.documents.azure.com/stepstone/runs`` (Entra ID / managed identity)
or, against a local emulator with ``AZURE_COSMOS_KEY`` set,
``cosmos://127.0.0.1:8081/testdb/runs?verify=false&create=true``. The options are listed
in ``_OPTIONS`` below and in ``backends/cosmos/README.md``.

Guarantees, and why they hold:

- **One request per load and per save.** ``load`` is one point read (``read_item`` with
  the partition key, the cheapest Cosmos operation: 1 RU per KB). The first save is one
  ``create_item`` (Cosmos refuses a second item with the same id: 409 -> ``ConflictError``);
  later saves are one ``replace_item`` with ``If-Match: <etag>`` (412 ->
  ``ConflictError``). Nothing is read before a write, so there is no window between check
  and write, and no query ever runs on the step path. The server's ``_etag`` is the
  version: opaque, and new on every write, including a run deleted and created again.
  The only extra requests are made once per store: the SDK's account read when the client
  is built and one container read (which also checks the container exists and is
  partitioned by ``/id``).
- **Nothing is sent that Cosmos would refuse.** The state is validated and the item's
  size (its JSON exactly as the SDK serialises it) is checked against the 2 MB item limit
  before any request; an oversized checkpoint raises ``CheckpointTooLarge`` and the stored
  item is untouched.
- **Any run_id works, no two share an item.** Cosmos ids may not contain ``/ \\ # ?``
  and are at most 255 characters; see ``item_id``. The item keeps the original run_id and
  a load checks it, so a hash collision could never hand one run another's checkpoint.
- **Writes are never retried blindly.** A write whose connection dropped after it was
  sent may or may not have been applied; the SDK does not retry non-idempotent writes
  unless ``retry_write`` is set, and this store pins it off. Throttling (429) is retried
  by the SDK (bounded by ``retries``) because the server applied nothing; a connection
  that was never established is retried because nothing was sent. What is left is raised
  as ``StoreUnavailable`` with the HTTP status. Even a duplicate write could not corrupt a
  run: the ETag condition makes a replayed replace fail with 412.
- **Never creates infrastructure by surprise.** The database and container are created
  only by ``init()`` (``stepstone init``) or with ``create=true``; otherwise a missing one
  is a ``StoreError`` naming it.
- **Secrets stay out of URLs, reprs, logs and exceptions.** Keys come from the
  environment (``AZURE_COSMOS_KEY`` or ``AZURE_COSMOS_CONNECTION_STRING``) or Entra ID;
  a ``key=`` option is refused, and every message built from an SDK error is scrubbed.

Driver errors are translated in one place, ``_translate``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final, NoReturn, Self, cast
from urllib.parse import unquote, urlsplit

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import HttpTransport, RequestsTransport
from azure.cosmos import CosmosClient, PartitionKey, SSLConfiguration

# ``ConnectionPolicy.RetryOptions`` is documented as a ``RetryOptions``, which the module
# imports but does not re-export. The retry_total/retry_throttle_total client keywords
# cannot express 0 throttling retries (the SDK reads 0 as "unset"), so the policy is built.
from azure.cosmos.documents import ConnectionPolicy, RetryOptions  # type: ignore[attr-defined]
from azure.cosmos.exceptions import CosmosClientTimeoutError, CosmosHttpResponseError

from .. import _hooks
from .._checkpoint import SCHEMA_VERSION, Checkpoint, check_run_id, run_status, utcnow
from .._codec import check_document, checkpoint_from_doc, checkpoint_meta, encode_state
from .._errors import (
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
)
from .._store import Diagnosis, RunInfo, Store
from ._common import parse_options

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.cosmos import ContainerProxy, DatabaseProxy


__all__ = ["CONTAINER_DEFINITION", "MAX_ITEM_BYTES", "CosmosStore", "item_id"]

#: Cosmos DB's per-item limit. Checked client-side so an oversized checkpoint costs no
#: request and gets a clear error instead of a 413.
MAX_ITEM_BYTES: Final = 2 * 1024 * 1024

#: The container every CosmosStore expects; ``backends/cosmos/container.json`` and
#: ``main.bicep`` hold the same definition (a test keeps the JSON file equal to this).
#:
#: - partition key ``/id``: one logical partition per run, so a load is a point read and
#:   a save touches one partition; runs spread evenly over physical partitions.
#: - indexing: ``/*`` and ``/state/*`` excluded: states are large and never queried, and
#:   every indexed path costs RUs on every write. Only the fields ``stepstone runs`` /
#:   ``prune`` filter on are indexed.
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
        ],
        "excludedPaths": [{"path": "/state/*"}, {"path": "/*"}],
    },
    "defaultTtl": -1,
}

_FORMS: Final = (
    "cosmos://ACCOUNT-HOST[:PORT]/DATABASE/CONTAINER[?auth=key|entra|connection-string"
    "&protocol=https|http&verify=true|false&create=true|false&consistency=LEVEL"
    "&retries=N&timeout=SECONDS&ttl=SECONDS], e.g. "
    "cosmos://myaccount.documents.azure.com/stepstone/runs"
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
_MAX_THROTTLE_WAIT: Final = 30  # seconds of cumulative 429 back-off (the SDK default)

# Ids used verbatim: URL-safe, never percent-decoded or dot-segment-normalised by HTTP
# libraries, and without '~' or '!', which mark the encoded forms, so the three forms
# can never produce the same id for two run_ids.
_VERBATIM: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_MAX_B64_ID: Final = 250
# Cosmos resource names (database, container): no / \ # ?, at most 255 characters.
_BAD_NAME: Final = re.compile(r"[/\\#?\x00-\x1f\x7f]")
_SCRUB: Final = (
    re.compile(r"(AccountKey=)[^;\s'\"]+", re.IGNORECASE),
    re.compile(r"(sig(?:=|%3d))[^&\s'\"]+", re.IGNORECASE),
    re.compile(r"(authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\s,}]+", re.IGNORECASE),
)
_TOO_MANY_REQUESTS: Final = 429
# Cosmos sub-status 1003: "owner resource does not exist" (the database or container).
_OWNER_MISSING: Final = 1003


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


def _scrub(text: str, secret: str | None) -> str:
    """Remove anything that looks like a key or a signature from ``text``."""
    if secret:
        text = text.replace(secret, "<redacted>")
    for pattern in _SCRUB:
        text = pattern.sub(r"\1<redacted>", text)
    return text


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
    return _scrub(message, secret)


class _Wire(HttpTransport[Any, Any]):
    """The HTTP transport under the SDK: counts requests and fires the crash-test hook.

    Sitting below every SDK retry loop, it sees each attempt that actually goes out, so
    ``requests_sent`` is a measurement, not an estimate. Requests made from a thread that
    is inside a store call are counted in ``requests_sent``; those the SDK makes on its
    own background threads (endpoint refresh, health checks) in ``background_requests``.
    """

    def __init__(self, inner: HttpTransport[Any, Any]) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._local = threading.local()
        self.requests_sent = 0
        self.background_requests = 0

    @contextlib.contextmanager
    def calling(self, saving: bool = False) -> Iterator[None]:
        """Mark the current thread as inside a store call (``saving``: a save's write)."""
        previous = getattr(self._local, "state", None)
        self._local.state = "save" if saving else "call"
        try:
            yield
        finally:
            self._local.state = previous

    def send(self, request: Any, **kwargs: Any) -> Any:
        state = getattr(self._local, "state", None)
        try:
            response = self._inner.send(request, **kwargs)
        except ServiceRequestError:
            raise  # no connection was made: nothing was sent
        except BaseException:
            self._count(state)  # sent, but no (complete) response came back
            raise
        self._count(state)
        if state == "save" and request.method in ("POST", "PUT"):
            # The write reached the server and was answered; CosmosStore has not seen the
            # answer yet. A kill here must leave the NEW checkpoint visible.
            _hooks.fire("cosmos.request_sent")
        return response

    def _count(self, state: str | None) -> None:
        with self._lock:
            if state is None:
                self.background_requests += 1
            else:
                self.requests_sent += 1

    def open(self) -> None:
        self._inner.open()

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> Self:
        self._inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self._inner.__exit__(*args)


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


class CosmosStore(Store):
    """Checkpoints as items of an Azure Cosmos DB (NoSQL API) container partitioned by /id.

    Open it with ``open_store("cosmos://...")`` or build it directly; the client connects
    lazily, on the first call that needs the server. Thread-safe: one client is shared.

    Counters for tests and benchmarks: ``requests_sent`` (HTTP requests made by store
    calls, SDK retries included) and ``background_requests`` (the SDK's own).
    """

    scheme: ClassVar[str] = "cosmos"

    def __init__(
        self,
        endpoint: str,
        database: str,
        container: str,
        *,
        credential: str | TokenCredential | None = None,
        auth: str = "key",
        verify: bool = True,
        create: bool = False,
        consistency: str | None = None,
        retries: int = DEFAULT_RETRIES,
        timeout: float = DEFAULT_TIMEOUT,
        ttl: int | None = None,
        transport: HttpTransport[Any, Any] | None = None,
    ) -> None:
        """Describe the store; nothing is sent until the first call.

        Args:
            endpoint: ``https://ACCOUNT.documents.azure.com:443/``.
            credential: the account key, or an azure-identity ``TokenCredential``.
            auth: what ``credential`` is, for messages (``key``, ``entra``,
                ``connection-string``).
            transport: an azure-core transport to send through (tests stub it).
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
        self.endpoint = endpoint if endpoint.endswith("/") else endpoint + "/"
        self.database_name = database
        self.container_name = container
        self.auth = auth
        self._credential = credential
        self._secret = credential if isinstance(credential, str) else None
        self._verify = verify
        self._create = create
        self._consistency = consistency
        self._retries = retries
        self._timeout = timeout
        self._ttl = ttl
        self._wire = _Wire(transport if transport is not None else RequestsTransport())
        self._client: CosmosClient | None = None
        self._database: DatabaseProxy | None = None
        self._container: ContainerProxy | None = None
        self._open_lock = threading.Lock()
        self._closed = False

    # -- configuration -----------------------------------------------------------------

    @classmethod
    def from_config(cls, config: str) -> Self:
        """Open ``cosmos://HOST[:PORT]/DATABASE/CONTAINER[?OPTIONS]``; see the module doc.

        Credentials never come from the string: ``AZURE_COSMOS_KEY``,
        ``AZURE_COSMOS_CONNECTION_STRING`` or Entra ID (DefaultAzureCredential).
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

        timeout_text = options.get("timeout")
        timeout = DEFAULT_TIMEOUT
        if timeout_text is not None:
            try:
                timeout = float(timeout_text)
            except ValueError:
                raise ConfigError(
                    f"option timeout={timeout_text!r} must be a number of seconds"
                ) from None
            if not timeout > 0:
                raise ConfigError(f"option timeout={timeout_text!r} must be positive")
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
                    f"auth=key but AZURE_COSMOS_KEY is not set for {endpoint}. " + _CREDENTIAL_HELP
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
        """HTTP requests store calls have sent so far (each SDK retry counts)."""
        return self._wire.requests_sent

    @property
    def background_requests(self) -> int:
        """HTTP requests the SDK sent on its own threads (endpoint refresh, health)."""
        return self._wire.background_requests

    # -- connection --------------------------------------------------------------------

    def _new_client(self) -> CosmosClient:
        policy = ConnectionPolicy()
        # Throttling (429) retries: the server applied nothing, so they are safe for writes.
        policy.RetryOptions = RetryOptions(
            max_retry_attempt_count=self._retries, max_wait_time_in_seconds=_MAX_THROTTLE_WAIT
        )
        kwargs: dict[str, Any] = {
            "connection_policy": policy,
            "transport": self._wire,
            # Connection-level retries (azure-core policy): a connection that failed to
            # open is retried (nothing was sent); a dropped response only for reads.
            "retry_total": self._retries,
            # Never replay a write whose outcome is unknown (the SDK default; pinned).
            "retry_write": 0,
            "timeout": self._timeout,
            "connection_timeout": min(self._timeout, 10.0),
        }
        if self._verify:
            # The SDK skips TLS verification for localhost/127.0.0.1 unless an
            # SSLConfiguration is given; give one so verify=true really verifies
            # (against the system CAs, or REQUESTS_CA_BUNDLE).
            kwargs["ssl_config"] = SSLConfiguration()
            kwargs["connection_verify"] = True
        else:
            kwargs["connection_verify"] = False
        if self._consistency is not None:
            kwargs["consistency_level"] = self._consistency
        return CosmosClient(self.endpoint, cast(Any, self._credential), **kwargs)

    def _ensure_open(self) -> ContainerProxy:
        """Build the client once, and check (or create) the database and container."""
        container = self._container
        if container is not None:
            return container
        with self._open_lock:
            if self._container is not None:
                return self._container
            if self._closed:
                raise StoreError(f"{self!r} is closed")
            with self._wire.calling(), self._translate("connect"):
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
        except CosmosHttpResponseError as exc:
            if exc.status_code != 404:
                raise
            try:
                database.read()
            except CosmosHttpResponseError as db_exc:
                if db_exc.status_code == 404:
                    raise StoreError(
                        f"Cosmos DB database {self.database_name!r} does not exist in "
                        f"{self.endpoint}; create it (and the container) with `stepstone init` "
                        "or by adding create=true to the config string (dev/emulators), or "
                        "provision backends/cosmos/main.bicep"
                    ) from exc
                raise
            raise StoreError(
                f"Cosmos DB container {self.container_name!r} does not exist in database "
                f"{self.database_name!r} at {self.endpoint}; create it with `stepstone init` "
                "or by adding create=true to the config string (dev/emulators), or provision "
                "backends/cosmos/main.bicep"
            ) from exc

    def _check_partition_key(self, properties: Any) -> None:
        paths = (properties or {}).get("partitionKey", {}).get("paths")
        if paths != ["/id"]:
            raise StoreError(
                f"Cosmos DB container {self.container_name!r} is partitioned by {paths!r}, "
                "but stepstone needs ['/id'] (one logical partition per run); create a new "
                "container with backends/cosmos/container.json"
            )

    def _create_resources(self, client: CosmosClient) -> list[str]:
        lines: list[str] = []
        try:
            database = client.create_database(self.database_name)
            lines.append(f"database {self.database_name!r}: created")
        except CosmosHttpResponseError as exc:
            if exc.status_code != 409:
                raise
            database = client.get_database_client(self.database_name)
            lines.append(f"database {self.database_name!r}: already exists")
        definition = CONTAINER_DEFINITION
        try:
            database.create_container(
                self.container_name,
                partition_key=PartitionKey(
                    path=definition["partitionKey"]["paths"][0],
                    kind=definition["partitionKey"]["kind"],
                    version=definition["partitionKey"]["version"],
                ),
                indexing_policy=definition["indexingPolicy"],
                default_ttl=definition["defaultTtl"],
            )
            lines.append(
                f"container {self.container_name!r}: created (partition key /id, state "
                "not indexed, TTL enabled)"
            )
        except CosmosHttpResponseError as exc:
            if exc.status_code != 409:
                raise
            lines.append(f"container {self.container_name!r}: already exists")
        self._database = database
        return lines

    # -- error translation ---------------------------------------------------------------

    @contextlib.contextmanager
    def _translate(
        self, action: str, run_id: str | None = None, size: int | None = None
    ) -> Iterator[None]:
        """Map SDK and azure-core exceptions to stepstone's, in this one place."""
        where = f"Cosmos DB {self.endpoint} {self.database_name}/{self.container_name}"
        what = f"{action}" if run_id is None else f"{action} run {run_id!r}"
        try:
            yield
        except StoreError:
            raise
        except CosmosClientTimeoutError as exc:
            raise StoreUnavailable(
                f"{where}: {what} timed out after {self._timeout:g}s (retries included); "
                f"{_short(exc, self._secret)}",
                408,
            ) from exc
        except CosmosHttpResponseError as exc:
            self._raise_for_status(exc, where, what, run_id, size)
        except ClientAuthenticationError as exc:
            # azure-identity found no usable identity, or the token request failed.
            raise StorePermissionError(
                f"{where}: {what}: could not authenticate with {self.auth}: "
                f"{_short(exc, self._secret)}. {_CREDENTIAL_HELP}"
            ) from exc
        except ServiceRequestError as exc:
            raise StoreUnavailable(
                f"{where}: {what}: cannot connect (unknown host, connection refused or TLS "
                f"failure; nothing was sent): {_short(exc, self._secret)}"
            ) from exc
        except ServiceResponseError as exc:
            note = (
                ", so it may or may not have been applied (writes are not retried blindly); "
                "load the run again before continuing"
                if action in ("save", "delete", "expire")
                else ""
            )
            raise StoreUnavailable(
                f"{where}: {what}: the connection failed after the request was sent{note}: "
                f"{_short(exc, self._secret)}"
            ) from exc
        except AzureError as exc:
            raise StoreUnavailable(
                f"{where}: {what} failed: {type(exc).__name__}: {_short(exc, self._secret)}"
            ) from exc

    def _raise_for_status(
        self,
        exc: CosmosHttpResponseError,
        where: str,
        what: str,
        run_id: str | None,
        size: int | None,
    ) -> NoReturn:
        status = int(exc.status_code or 0)
        detail = _short(exc, self._secret)
        if status in (401, 403):
            host = urlsplit(self.endpoint).hostname
            raise StorePermissionError(
                f"Cosmos DB account {host!r} refused the {self.auth} credentials "
                f"(HTTP {status}) for {what}: {detail}. With Entra ID the identity needs the "
                "'Cosmos DB Built-in Data Contributor' role on the container; with a key, "
                f"check it belongs to this account. {_CREDENTIAL_HELP}"
            ) from exc
        if status == 409:
            raise ConflictError(
                f"run {run_id!r}: a checkpoint already exists but the save expected none "
                "(HTTP 409); nothing was stored. Another worker started the run; reload it",
                run_id,
            ) from exc
        if status == 412:
            raise ConflictError(
                f"run {run_id!r}: the stored checkpoint changed since it was loaded (HTTP "
                "412, ETag mismatch); nothing was stored. Another worker owns the run; "
                "reload it",
                run_id,
            ) from exc
        if status == 413:
            raise CheckpointTooLarge(
                f"run {run_id!r}: {where} refused the item as too large: {detail}",
                size or 0,
                MAX_ITEM_BYTES,
            ) from exc
        if status == 404:
            raise StoreError(
                f"{where}: {what}: not found ({detail}); if the database or container was "
                "deleted, create it with `stepstone init` or create=true"
            ) from exc
        if status == _TOO_MANY_REQUESTS:
            raise StoreUnavailable(
                f"{where}: {what}: throttled (HTTP 429) after {self._retries} retries; raise "
                "the throughput or the retries= option: " + detail,
                status,
            ) from exc
        if status == 408 or status >= 500:
            raise StoreUnavailable(
                f"{where}: {what}: service unavailable (HTTP {status}): {detail}", status
            ) from exc
        raise StoreError(f"{where}: {what} failed (HTTP {status}): {detail}") from exc

    # -- the Store methods ---------------------------------------------------------------

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        container = self._ensure_open()
        doc_id = item_id(run_id)
        with self._wire.calling(), self._translate("load", run_id):
            try:
                doc = container.read_item(doc_id, partition_key=doc_id, timeout=self._timeout)
            except CosmosHttpResponseError as exc:
                if exc.status_code != 404:
                    raise
                if exc.sub_status == _OWNER_MISSING:
                    raise StoreError(
                        f"Cosmos DB container {self.container_name!r} (database "
                        f"{self.database_name!r}) no longer exists at {self.endpoint}"
                    ) from exc
                return None
        return self._checkpoint(dict(doc), run_id)

    def _checkpoint(self, doc: dict[str, Any], run_id: str) -> Checkpoint:
        source = f"cosmos item {doc.get('id')!r} in {self.database_name}/{self.container_name}"
        check_document(doc, source)
        if doc.get("run_id") != run_id:
            raise CorruptCheckpoint(
                f"{source}: holds run {doc.get('run_id')!r}, not {run_id!r}; left untouched"
            )
        etag = doc.get("_etag")
        if not isinstance(etag, str):
            raise CorruptCheckpoint(f"{source}: the service returned no _etag")
        text = doc.get("state")
        if isinstance(text, str):  # see _item: the state is stored as JSON text
            try:
                doc["state"] = json.loads(text)
            except ValueError as exc:
                raise CorruptCheckpoint(
                    f"{source}: the state is not valid JSON text ({exc}); left untouched"
                ) from exc
        return checkpoint_from_doc(doc, etag, source)

    def _item(self, cp: Checkpoint, doc_id: str, state_text: str) -> tuple[dict[str, Any], int]:
        """Return the item for ``cp`` and its size in bytes as the SDK will send it."""
        meta: dict[str, Any] = {"id": doc_id, **checkpoint_meta(cp)}
        if self._ttl is not None:
            meta["ttl"] = self._ttl
        # The state goes in as its JSON *text*, not as a nested object. Cosmos DB keeps
        # numbers as IEEE doubles: an int above 2**53 would lose digits, 1.0 would come
        # back as 1 and -0.0 as 0. As a string the state round-trips exactly, as on every
        # other backend; it is never queried, so nothing is lost by not nesting it.
        item = {**meta, "state": state_text}
        # The SDK sends json.dumps(item, separators=(",", ":")): measure exactly that.
        size = len(json.dumps(item, separators=(",", ":")))
        return item, size

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        run_id = check_run_id(checkpoint.run_id)
        text, copy = encode_state(checkpoint.state)  # InvalidState before any request
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
        container = self._ensure_open()
        _hooks.fire("cosmos.before_request")
        with self._wire.calling(saving=True), self._translate("save", run_id, size):
            if checkpoint.version is None:
                result = container.create_item(item, timeout=self._timeout)
            else:
                try:
                    result = container.replace_item(
                        doc_id,
                        item,
                        etag=checkpoint.version,
                        match_condition=MatchConditions.IfNotModified,
                        timeout=self._timeout,
                    )
                except CosmosHttpResponseError as exc:
                    if exc.status_code == 404 and exc.sub_status != _OWNER_MISSING:
                        raise ConflictError(
                            f"run {run_id!r}: the checkpoint was deleted since it was loaded; "
                            "nothing was stored",
                            run_id,
                        ) from exc
                    raise
        etag = result.get("_etag")
        if not isinstance(etag, str):
            raise StoreError(f"run {run_id!r}: Cosmos DB answered the save without an _etag")
        return checkpoint.stored(copy, text, etag, now)

    def delete(self, run_id: str) -> bool:
        check_run_id(run_id)
        container = self._ensure_open()
        doc_id = item_id(run_id)
        with self._wire.calling(), self._translate("delete", run_id):
            try:
                container.delete_item(doc_id, partition_key=doc_id, timeout=self._timeout)
            except CosmosHttpResponseError as exc:
                if exc.status_code == 404 and exc.sub_status != _OWNER_MISSING:
                    return False
                raise
        return True

    def _query(self, query: str, parameters: list[dict[str, Any]] | None = None) -> list[Any]:
        container = self._ensure_open()
        with self._wire.calling(), self._translate("query"):
            return list(
                container.query_items(
                    query,
                    parameters=parameters,
                    enable_cross_partition_query=True,
                    timeout=self._timeout,
                )
            )

    def list_runs(self) -> Iterator[str]:
        # A query, not on the step path: one request per page of results.
        rows = self._query("SELECT c.run_id FROM c")
        return iter([row["run_id"] for row in rows if isinstance(row.get("run_id"), str)])

    def list_info(self) -> Iterator[RunInfo]:
        """One query for every run's status, without reading the states."""
        rows = self._query("SELECT c.run_id, c.step, c.total_steps, c.failure, c.updated_at FROM c")
        infos: list[RunInfo] = []
        for row in rows:
            run_id, step = row.get("run_id"), row.get("step")
            if not isinstance(run_id, str) or type(step) is not int:
                continue
            total = row.get("total_steps")
            updated = row.get("updated_at")
            infos.append(
                RunInfo(
                    run_id,
                    run_status(step, total, row.get("failure") is not None),
                    step,
                    total,
                    None if updated is None else _parse_time(updated),
                )
            )
        return iter(infos)

    def close(self) -> None:
        with self._open_lock:
            self._closed = True
            client, self._client = self._client, None
            self._container = self._database = None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    # -- Cosmos-specific ---------------------------------------------------------------

    def expire(self, run_id: str, ttl_seconds: int | None) -> bool:
        """Let Cosmos delete the run ``ttl_seconds`` after its last write (native TTL).

        ``-1`` keeps it forever, None falls back to the store's ``ttl`` / the container's
        default. Read plus conditional replace, retried if a save lands in between; the
        run's version changes, so meant for finished runs. Returns False if no such run.
        """
        check_run_id(run_id)
        if ttl_seconds is not None and ttl_seconds != -1 and ttl_seconds < 1:
            raise ValueError(f"ttl_seconds must be >= 1, -1 or None, got {ttl_seconds}")
        container = self._ensure_open()
        doc_id = item_id(run_id)
        for _ in range(5):
            with self._wire.calling(), self._translate("expire", run_id):
                try:
                    doc = dict(container.read_item(doc_id, partition_key=doc_id))
                except CosmosHttpResponseError as exc:
                    if exc.status_code == 404 and exc.sub_status != _OWNER_MISSING:
                        return False
                    raise
                self._checkpoint(doc, run_id)  # refuse to touch what is not ours
                etag = doc["_etag"]
                body = {k: v for k, v in doc.items() if not k.startswith("_")}
                if ttl_seconds is None:
                    body.pop("ttl", None)
                else:
                    body["ttl"] = ttl_seconds
                try:
                    container.replace_item(
                        doc_id, body, etag=etag, match_condition=MatchConditions.IfNotModified
                    )
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
                with self._wire.calling(), self._translate("init"):
                    client = self._client or self._new_client()
                    self._client = client
                    lines = self._create_resources(client)
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

    def doctor(self) -> list[Diagnosis]:
        """The base probe checks, plus the container's partition key, TTL and schemas."""
        results: list[Diagnosis] = []
        try:
            container = self._ensure_open()
            with self._wire.calling(), self._translate("doctor"):
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
        try:
            foreign = self._query(
                "SELECT TOP 5 c.id, c.stepstone FROM c "
                "WHERE NOT IS_DEFINED(c.stepstone) OR c.stepstone != @v",
                [{"name": "@v", "value": SCHEMA_VERSION}],
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


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None


def _key_from_connection_string(conn_str: str, endpoint: str) -> str:
    """Return the AccountKey of a connection string whose endpoint matches ``endpoint``."""
    if not conn_str.strip():
        raise StorePermissionError(
            f"auth=connection-string but AZURE_COSMOS_CONNECTION_STRING is not set for "
            f"{endpoint}. {_CREDENTIAL_HELP}"
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
