"""Cosmos DB's error table: SDK and transport exceptions in, stepstone's errors out.

Two tables of :class:`~stepstone.stores._errortable.ErrorRule` rows, applied by
:func:`error_for` in this one place: ``STATUS_RULES`` for the service's HTTP answers (by
status and sub-status), ``EXCEPTION_RULES`` for everything else a call can raise (azure-core
timeouts and connection failures, the socket, ``http.client``, aiohttp and requests
errors, an answer that does not decode). An exception of the SDK that no row covers is
wrapped by the drivers as :class:`UnexpectedSdkError`, which the last row makes a
``StoreError``: nothing a Cosmos call raises escapes the store as a bare exception.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, NamedTuple
from urllib.parse import urlsplit

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.cosmos.exceptions import CosmosClientTimeoutError, CosmosHttpResponseError

from ..._errors import (
    CheckpointTooLarge,
    ConflictError,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
)
from ..._redact import redact
from .._errortable import ErrorRule, translate
from ._config import Settings
from ._wire import MAX_ITEM_BYTES

__all__ = [
    "EXCEPTION_RULES",
    "MAYBE_APPLIED",
    "OWNER_MISSING",
    "STATUS_RULES",
    "Call",
    "UnexpectedSdkError",
    "closed_error",
    "error_for",
    "is_known",
]

# Cosmos sub-status 1003: "owner resource does not exist" (the database or container).
OWNER_MISSING: Final = 1003
_WRITES: Final = frozenset({"save", "delete", "expire"})


class Call(NamedTuple):
    """What a store call was doing, for its error message."""

    action: str
    run_id: str | None = None
    size: int | None = None


class UnexpectedSdkError(Exception):
    """An exception of an SDK call that no table row names (its cause is the original)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {_safe(exc)}")


_PERMISSION: Final = (
    "Cosmos DB account {host!r} refused the {auth} credentials (HTTP {status}) for {what}: "
    "{detail}. With Entra ID the identity needs the 'Cosmos DB Built-in Data Contributor' "
    "role on the container; with a key, check it belongs to this account"
)
_UNAVAILABLE: Final = "{where}: {what}: service unavailable (HTTP {status}): {detail}"


def _status(status: int, sub: int | None, error: type[StoreError], message: str) -> ErrorRule:
    # The code ``error_for`` passes is "STATUS/SUB-STATUS" ("412/" without one): a row
    # with a sub-status matches exactly, one without matches any of its status.
    if sub is None:
        return ErrorRule(error, message, prefixes=(f"{status}/",))
    return ErrorRule(error, message, codes=frozenset({f"{status}/{sub}"}))


#: HTTP status and sub-status -> the stepstone error and its message. A None sub-status
#: matches any; the specific row comes first and wins. Statuses not listed: 5xx ->
#: ``StoreUnavailable``, anything else -> ``StoreError`` (``_HTTP_RULES``).
STATUS_RULES: Final[Mapping[tuple[int, int | None], ErrorRule]] = MappingProxyType(
    {
        (status, sub): _status(status, sub, error, message)
        for status, sub, error, message in (
            (401, None, StorePermissionError, _PERMISSION),
            (403, None, StorePermissionError, _PERMISSION),
            (
                404,
                OWNER_MISSING,
                StoreError,
                "{where}: {what}: the database or container no longer exists ({detail}); "
                "create it with `stepstone init` or create=true",
            ),
            (404, None, StoreError, "{where}: {what}: not found (HTTP 404): {detail}"),
            (408, None, StoreUnavailable, "{where}: {what}: request timed out (HTTP 408)"),
            (
                409,
                None,
                ConflictError,
                "run {run!r}: a checkpoint already exists but the save expected none (HTTP "
                "409); nothing was stored. Another worker started the run; reload it",
            ),
            (
                412,
                None,
                ConflictError,
                "run {run!r}: the stored checkpoint changed since it was read (HTTP 412, ETag "
                "mismatch); nothing was {undone}. Another worker owns the run; reload it",
            ),
            (
                413,
                None,
                CheckpointTooLarge,
                "run {run!r}: {where} refused the item as too large: {detail}",
            ),
            (
                429,
                None,
                StoreUnavailable,
                "{where}: {what}: throttled (HTTP 429) after {retries} retries; raise the "
                "throughput or the retries= option: {detail}",
            ),
            (449, None, StoreUnavailable, _UNAVAILABLE),
            (500, None, StoreUnavailable, _UNAVAILABLE),
            (502, None, StoreUnavailable, _UNAVAILABLE),
            (503, None, StoreUnavailable, _UNAVAILABLE),
            (504, None, StoreUnavailable, _UNAVAILABLE),
        )
    }
)
_HTTP_RULES: Final = (
    *STATUS_RULES.values(),
    ErrorRule(StoreUnavailable, _UNAVAILABLE, prefixes=tuple(f"5{d}" for d in "0123456789")),
    ErrorRule(
        StoreError,
        "{where}: {what} failed (HTTP {status}): {detail}",
        types=(CosmosHttpResponseError,),
    ),
)

MAYBE_APPLIED: Final = (
    ", so it may or may not have been applied (writes are not retried blindly); load "
    "the run again before continuing"
)
_TLS_HINT: Final = (
    ". The server's TLS certificate is not trusted: set REQUESTS_CA_BUNDLE to the CA "
    "file that signed it, or, for a local emulator only, add verify=false to the config"
)

#: Exceptions other than HTTP answers -> the stepstone error and its message, first
#: match wins (subclasses before their bases). The transport's own errors come after
#: azure-core's (which wrap most of them): the socket, ``http.client``, and, by class
#: name since they are imported lazily, aiohttp's ``ClientError``, requests'
#: ``RequestException`` and urllib3's ``HTTPError``. Anything else a store call raises
#: outside an SDK call propagates: programming errors are not store errors.
EXCEPTION_RULES: Final[tuple[ErrorRule, ...]] = (
    ErrorRule(
        StoreUnavailable,
        "{where}: {what} timed out after {timeout:g}s (timeout=, retries included)",
        types=(CosmosClientTimeoutError,),
    ),
    ErrorRule(
        # azure-identity found no usable identity, or the token request failed. Short on
        # purpose: the credential chain's ~1000-character report stays on __cause__.
        StorePermissionError,
        "no Entra ID token for Cosmos DB {host!r}: set AZURE_COSMOS_KEY (account key) or "
        "AZURE_COSMOS_CONNECTION_STRING, or sign in: `az login`, a managed identity, or "
        "AZURE_CLIENT_ID + AZURE_TENANT_ID + AZURE_CLIENT_SECRET",
        types=(ClientAuthenticationError,),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: {what}: could not connect within {connect_timeout:g}s "
        "(connect_timeout=); nothing was sent",
        types=(ServiceRequestTimeoutError,),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: {what}: cannot connect (unknown host, connection refused or TLS failure; "
        "nothing was sent): {detail}{tls_hint}",
        types=(ServiceRequestError,),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: {what}: no answer within {read_timeout:g}s (read_timeout=){maybe}",
        types=(ServiceResponseTimeoutError,),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: {what}: the connection failed after the request was sent{maybe}: {detail}",
        types=(ServiceResponseError,),
    ),
    ErrorRule(StoreUnavailable, "{where}: {what} timed out{maybe}", types=(TimeoutError,)),
    ErrorRule(StoreUnavailable, "{where}: {what} failed: {kind}: {detail}", types=(AzureError,)),
    ErrorRule(
        # An answer cut short or garbled on the way: the stored item is not at fault (a
        # stored item that does not decode is a CorruptCheckpoint, raised by the decoder).
        StoreUnavailable,
        "{where}: {what}: the service's answer could not be read ({kind}: {detail}){maybe}",
        types=(json.JSONDecodeError, UnicodeDecodeError, http.client.HTTPException),
    ),
    ErrorRule(
        StoreUnavailable,
        "{where}: {what}: the connection failed ({kind}: {detail}){maybe}",
        types=(OSError,),
        classes=("ClientError", "RequestException", "HTTPError"),
    ),
    ErrorRule(
        StoreError,
        "{where}: {what} failed: the Cosmos SDK raised {detail}",
        types=(UnexpectedSdkError,),
    ),
)

_TRANSPORT_RULES: Final = EXCEPTION_RULES[:-1]


def is_known(exc: BaseException) -> bool:
    """Whether a table row names ``exc``, so a driver hands it on as it is."""
    if isinstance(exc, AzureError | StoreError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return any(rule.matches(exc, None, names, "") for rule in _TRANSPORT_RULES)


def _safe(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not hide the real error
        return f"<{type(exc).__name__} whose message cannot be read>"


def _short(exc: BaseException, secret: str | None) -> str:
    """A one-paragraph, secret-free description of an SDK exception."""
    if isinstance(exc, CosmosHttpResponseError):
        message = str(exc.http_error_message or exc.message or _safe(exc))
        # The service answers with JSON: keep its "message" field, which says why.
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(message).get("message", message))
    else:
        message = _safe(exc)
    message = " ".join(message.split())
    if len(message) > 400:
        message = message[:400] + "..."
    return redact(message, (secret,) if secret else ())


def _fields(
    exc: BaseException, call: Call, settings: Settings, secret: str | None
) -> dict[str, Any]:
    """The placeholders of the rule tables, for ``exc`` raised during ``call``."""
    text = _safe(exc)
    tls = "certificate verify failed" in text.lower() or "CERTIFICATE_VERIFY_FAILED" in text
    return {
        "where": settings.where,
        "what": call.action if call.run_id is None else f"{call.action} run {call.run_id!r}",
        "host": urlsplit(settings.endpoint).hostname,
        "auth": settings.auth,
        "run": call.run_id,
        "status": getattr(exc, "status_code", None),
        "detail": _short(exc, secret),
        "retries": settings.retries,
        "timeout": settings.timeout,
        "connect_timeout": settings.connect_timeout,
        "read_timeout": settings.read_timeout,
        "undone": "deleted" if call.action == "delete" else "stored",
        "maybe": MAYBE_APPLIED if call.action in _WRITES else "",
        "tls_hint": _TLS_HINT if tls else "",
    }


def _timeout_status(exc: BaseException) -> int | None:
    """HTTP 408 for a timeout, so callers can tell it from an unreachable host."""
    if isinstance(exc, CosmosClientTimeoutError | ServiceResponseTimeoutError | TimeoutError):
        return 408
    return None


def error_for(
    exc: BaseException, call: Call, settings: Settings, secret: str | None
) -> StoreError | None:
    """Translate ``exc`` by the rule tables; None if no rule covers it."""
    status: int | None = None
    rules = EXCEPTION_RULES
    code: str | None = None
    if isinstance(exc, CosmosHttpResponseError) and not isinstance(exc, CosmosClientTimeoutError):
        status = int(exc.status_code or 0)
        sub_status = getattr(exc, "sub_status", None)
        code = f"{status}/{'' if sub_status is None else sub_status}"
        rules = _HTTP_RULES

    def make(cls: type[StoreError], message: str) -> StoreError:
        if issubclass(cls, ConflictError):
            return cls(message, call.run_id)
        if issubclass(cls, CheckpointTooLarge):
            return cls(message, call.size or 0, MAX_ITEM_BYTES)
        if issubclass(cls, StoreUnavailable):
            return cls(message, status if status is not None else _timeout_status(exc))
        return cls(message)

    return translate(rules, exc, code, make=make, **_fields(exc, call, settings, secret))


def closed_error(store: str, call: Call | None = None) -> StoreError:
    """The error of a call on (or in flight during the closing of) a closed store."""
    if call is None:
        return StoreError(f"{store} is closed")
    what = call.action if call.run_id is None else f"{call.action} run {call.run_id!r}"
    note = MAYBE_APPLIED if call.action in _WRITES else ""
    return StoreError(f"{store} is closed: it was closed during {what}{note}")
