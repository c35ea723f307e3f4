"""The cosmos:// config string: its options, its credentials and the client settings."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import unquote, urlsplit

from azure.cosmos import SSLConfiguration

# ``ConnectionPolicy.RetryOptions`` is documented as a ``RetryOptions``, which the module
# imports but does not re-export. The retry_total/retry_throttle_total client keywords
# cannot express 0 throttling retries (the SDK reads 0 as "unset"), so the policy is built.
from azure.cosmos.documents import ConnectionPolicy, RetryOptions  # type: ignore[attr-defined]

from ..._errors import ConfigError, StorePermissionError
from .._options import Option, parse

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

__all__ = [
    "CA_BUNDLE_ENV",
    "CONNECTION_STRING_ENV",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT",
    "FORMS",
    "KEY_ENV",
    "Settings",
    "parse_config",
]

FORMS: Final = (
    "cosmos://ACCOUNT-HOST[:PORT]/DATABASE/CONTAINER[?auth=key|entra|connection-string"
    "&protocol=https|http&verify=true|false&create=true|false&consistency=LEVEL"
    "&retries=N&timeout=SECONDS&connect_timeout=SECONDS&read_timeout=SECONDS"
    "&ttl=SECONDS], e.g. cosmos://myaccount.documents.azure.com/stepstone/runs"
)
CONSISTENCY: Final = ("Strong", "BoundedStaleness", "Session", "ConsistentPrefix", "Eventual")
KEY_ENV: Final = "AZURE_COSMOS_KEY"
CONNECTION_STRING_ENV: Final = "AZURE_COSMOS_CONNECTION_STRING"
#: Where a CA bundle for a private or self-signed certificate is read from (requests'
#: variable; this store passes it to the async transport too, so one setting serves both).
CA_BUNDLE_ENV: Final = "REQUESTS_CA_BUNDLE"
CREDENTIAL_HELP: Final = (
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
# Cosmos resource names (database, container): no / \ # ?, at most 255 characters.
_BAD_NAME: Final = re.compile(r"[/\\#?\x00-\x1f\x7f]")


def _seconds(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 86400:
        raise ValueError(raw)
    return value


def _count(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(raw)
    return value


def _ttl(raw: str) -> int:
    value = int(raw)
    if value < 1 and value != -1:
        raise ValueError(raw)
    return value


def _seconds_option(name: str) -> Option[object]:
    return Option(name, _seconds, "a number of seconds, positive and at most 86400")


_TRUE_FALSE: Final = ("true", "false")

#: Every option of the config string, typed; ``backends/cosmos/README.md`` lists them.
OPTIONS: Final[tuple[Option[object], ...]] = (
    Option("auth", str, "", ("key", "entra", "connection-string")),
    Option("protocol", str, "", ("https", "http")),
    Option("verify", lambda raw: raw == "true", "", _TRUE_FALSE),
    Option("create", lambda raw: raw == "true", "", _TRUE_FALSE),
    Option("consistency", str, "", CONSISTENCY),
    Option("retries", _count, "an integer, at least 0"),
    _seconds_option("timeout"),
    _seconds_option("connect_timeout"),
    _seconds_option("read_timeout"),
    Option("ttl", _ttl, "an integer number of seconds, at least 1, or -1"),
)
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


@dataclass(frozen=True, slots=True)
class Settings:
    """Where the container is and how to talk to it: everything but the credential."""

    endpoint: str
    database: str
    container: str
    auth: str = "key"
    verify: bool = True
    create: bool = False
    consistency: str | None = None
    retries: int = DEFAULT_RETRIES
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    ttl: int | None = None

    def __post_init__(self) -> None:
        """Refuse what Cosmos would refuse later, with the rule that was broken."""
        for kind, name in (("database", self.database), ("container", self.container)):
            if not name or len(name) > 255 or _BAD_NAME.search(name) or name != name.strip():
                raise ConfigError(
                    f"invalid Cosmos {kind} name {name!r}: 1-255 characters, no / \\ # ? "
                    "or control characters, no leading or trailing spaces"
                )
        if self.consistency is not None and self.consistency not in CONSISTENCY:
            raise ConfigError(
                f"consistency {self.consistency!r} is not one of: {', '.join(CONSISTENCY)}"
            )
        if self.ttl is not None and self.ttl != -1 and self.ttl < 1:
            raise ConfigError(f"ttl must be a positive number of seconds or -1, got {self.ttl}")
        for label, seconds in (
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            ("read_timeout", self.read_timeout),
        ):
            if not seconds > 0:
                raise ConfigError(f"{label} must be a positive number of seconds, got {seconds}")

    def options(self) -> dict[str, Any]:
        """The fields after the container's location: ``CosmosStore``'s keyword options."""
        return {field.name: getattr(self, field.name) for field in fields(self)[3:]}

    @property
    def where(self) -> str:
        """The container, for messages."""
        return f"Cosmos DB {self.endpoint} {self.database}/{self.container}"

    def verify_setting(self) -> bool | str:
        """What the transports verify TLS against: False, a CA file, or the system CAs."""
        if not self.verify:
            return False
        return os.environ.get(CA_BUNDLE_ENV, "").strip() or True

    def transport_config(self) -> dict[str, Any]:
        """Keyword arguments for the sync and the aiohttp transport alike."""
        return {
            "connection_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "connection_verify": self.verify_setting(),
        }

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the sync and the aio ``CosmosClient`` alike."""
        policy: Any = ConnectionPolicy()
        # Throttling (429) retries: the server applied nothing, so they are safe for writes.
        policy.RetryOptions = RetryOptions(
            max_retry_attempt_count=self.retries, max_wait_time_in_seconds=_MAX_THROTTLE_WAIT
        )
        # The SDK picks its per-request timeouts from the policy (its account reads use
        # shorter ones of their own, which ours may only shorten further).
        policy.RequestTimeout = self.connect_timeout
        policy.ReadTimeout = self.read_timeout
        policy.DBAConnectionTimeout = min(policy.DBAConnectionTimeout, self.connect_timeout)
        policy.DBAReadTimeout = min(policy.DBAReadTimeout, self.read_timeout)
        policy.RecoveryReadTimeout = min(policy.RecoveryReadTimeout, self.read_timeout)
        verify = self.verify_setting()
        kwargs: dict[str, Any] = {
            "connection_policy": policy,
            # Connection-level retries (azure-core policy): a connection that failed to
            # open is retried (nothing was sent); a dropped response only for reads.
            "retry_total": self.retries,
            # Never replay a write whose outcome is unknown (the SDK default; pinned).
            "retry_write": 0,
            "timeout": self.timeout,
            "connection_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
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
        if self.consistency is not None:
            kwargs["consistency_level"] = self.consistency
        return kwargs


def _refuse_secrets(query: str) -> None:
    for name in re.findall(r"(?:^|&)([^=&]*)", query):
        if name.lower() in _SECRET_OPTIONS:
            raise ConfigError(
                f"option {name!r} would put a secret in the config string, which ends up "
                "in logs and process listings; set the key in the AZURE_COSMOS_KEY "
                "environment variable instead (or AZURE_COSMOS_CONNECTION_STRING, or "
                "use Entra ID)"
            )


def _location(config: str) -> tuple[str, str, str, str, dict[str, object]]:
    """Return (host, hostname, database, container, options) of a config string."""
    parts = urlsplit(config)
    if parts.scheme.lower() != "cosmos":
        raise ConfigError(f"not a cosmos:// config string; form: {FORMS}")
    if "@" in parts.netloc:
        raise ConfigError(
            "credentials do not belong in a cosmos:// config string (found 'user@' "
            f"before the host). {CREDENTIAL_HELP}"
        )
    if parts.fragment:
        raise ConfigError(f"unexpected '#...' in a cosmos:// config string; form: {FORMS}")
    _refuse_secrets(parts.query)
    options = parse(parts.query, OPTIONS, FORMS)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"invalid port in the cosmos:// host; form: {FORMS}") from None
    if not parts.hostname or (port is not None and not 0 < port < 65536):
        raise ConfigError(f"missing account host in cosmos:// config string; form: {FORMS}")
    segments = parts.path.split("/")
    if len(segments) != 3 or segments[0] != "" or not segments[1] or not segments[2]:
        raise ConfigError(
            "a cosmos:// config string names the database and the container as its "
            f"path, /DATABASE/CONTAINER; form: {FORMS}"
        )
    return parts.netloc, parts.hostname, unquote(segments[1]), unquote(segments[2]), options


def parse_config(config: str) -> tuple[Settings, str | TokenCredential]:
    """Parse ``cosmos://HOST[:PORT]/DATABASE/CONTAINER[?OPTIONS]`` and find its credential.

    Raises:
        ConfigError: the string is malformed, has an unknown option or a secret.
        StorePermissionError: ``auth=key`` or ``auth=connection-string`` without the
            environment variable it needs.
    """
    # Never echo ``config`` in an error: someone may have pasted a key into it.
    host, hostname, database, container, options = _location(config)
    endpoint = f"{options.get('protocol', 'https')}://{host}/"
    auth = str(options.pop("auth", None) or default_auth())
    options.pop("protocol", None)
    # The option table converts each value to its field's type (bool, int, float, str).
    settings = Settings(endpoint, database, container, auth=auth, **cast(dict[str, Any], options))
    return settings, credential_for(auth, hostname, endpoint)


def default_auth() -> str:
    """The auth a config string without ``auth=`` means: key, connection string, Entra."""
    if os.environ.get(KEY_ENV):
        return "key"
    if os.environ.get(CONNECTION_STRING_ENV):
        return "connection-string"
    return "entra"


def credential_for(auth: str, hostname: str, endpoint: str) -> str | TokenCredential:
    """The credential ``auth`` names, from the environment or Entra ID."""
    if auth == "key":
        key = os.environ.get(KEY_ENV, "").strip()
        if not key:
            raise StorePermissionError(
                f"auth=key but AZURE_COSMOS_KEY is empty: set it to the account key of "
                f"{hostname}, or set AZURE_COSMOS_CONNECTION_STRING, or use Entra "
                "ID (auth=entra)"
            )
        return key
    if auth == "connection-string":
        return key_from_connection_string(os.environ.get(CONNECTION_STRING_ENV, ""), endpoint)
    try:
        # Imported only when used: it is slow to import and keys do not need it.
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - azure-identity is in the extra
        raise ConfigError(
            "auth=entra needs azure-identity: pip install 'stepstone[cosmos]'"
        ) from exc
    # azure-identity logs its whole credential chain (~1000 characters) as a warning
    # when no identity works; with no logging configured Python prints it to stderr.
    # The store's own error already says what to set, and the chain stays on its
    # __cause__; a NullHandler keeps that text out of stderr while an application's own
    # logging still receives it.
    identity_log = logging.getLogger("azure.identity")
    if not any(isinstance(h, logging.NullHandler) for h in identity_log.handlers):
        identity_log.addHandler(logging.NullHandler())
    return DefaultAzureCredential()


def key_from_connection_string(conn_str: str, endpoint: str) -> str:
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
