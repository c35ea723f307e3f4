"""Keeping secrets out of everything stepstone prints: one routine for every caller.

Three things are secret in a store config string: the password of its user info, the
values of secret-named query options (``key``, ``password``, ``secret``, ``token``,
``sig``, ...), and connection-string parts such as ``AccountKey=...``. The user name is
not (``postgres``, ``root``), nor the host, nor the help text that error messages quote.

Passwords are found by position, not by ``urlsplit``: a raw ``@``, ``/``, ``:`` or ``%``
in a password makes ``urlsplit`` cut the URL in the wrong place (``u:p/w@h`` has the
netloc ``u:p``), so here the user info runs from ``//USER:`` to the last ``@`` of the
URL's authority-and-path. Over-masking a host is harmless; printing half a password is
not.

- ``redact_url(config)``: the config string itself, for messages and ``repr``.
- ``redact(text, secrets)``: free text (an error, a log line, a traceback): every URL in
  it masked as above, plus every known secret replaced wherever it appears.
- ``Redactor``: remembers the secrets of the config strings a program uses (the CLI) and
  masks them in everything it prints.
- ``ambiguous_password(config)``: whether the password holds a raw ``@`` or ``/``, which
  no URL parser reads as meant; ``open_store`` refuses such strings before a backend
  can quote a misparsed half of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote, unquote

__all__ = [
    "MASK",
    "Redactor",
    "ambiguous_password",
    "check_unambiguous",
    "is_secret_name",
    "redact",
    "redact_url",
    "secrets_of",
    "split_userinfo",
]

MASK: Final = "***"

# Option names whose values are secrets. Matched as a substring of the lower-cased name,
# so ``AccountKey``, ``sas_token``, ``client_secret`` and ``x-sig`` count too.
_SECRET_WORDS: Final = (
    "key",
    "secret",
    "pass",
    "pwd",
    "token",
    "sig",
    "cred",
    "auth",
    "connection_string",
    "connectionstring",
    "connection-string",
)
# ...except names that merely contain a word and never carry a secret (``auth=entra``
# names a method; ``partition_key`` a path), whose values are safe and useful in errors.
_NOT_SECRET: Final = frozenset({"auth", "partition_key", "partitionkey"})

# Secrets shorter than this are masked only where they sit (in a URL's user info or an
# option value), never by a blind replace over all text: replacing a 3-letter password
# everywhere would mangle run ids, states and help text that happen to contain it.
MIN_GLOBAL_SECRET: Final = 6

# A URL inside free text: scheme://, then anything up to white space or a quote.
_URL_IN_TEXT: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"`<>]*")
# Connection-string style secrets outside URLs: AccountKey=...; SharedAccessSignature=...
_CONNECTION_PART: Final = re.compile(
    r"(?i)\b(AccountKey|SharedAccessKey|SharedAccessSignature|Password|Pwd)=([^;&\s'\"`]+)"
)
# HTTP authorization headers quoted by SDK errors.
_AUTH_HEADER: Final = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\s,}]+")


def is_secret_name(name: str) -> bool:
    """Return whether a query option or field called ``name`` holds a secret."""
    lowered = unquote(name).strip().lower()
    if lowered in _NOT_SECRET:
        return False
    return any(word in lowered for word in _SECRET_WORDS)


def _authority_end(rest: str) -> int:
    """Return where the query (or fragment) of the text after ``//`` begins."""
    for i, char in enumerate(rest):
        if char in "?#":
            return i
    return len(rest)


def split_userinfo(config: str) -> tuple[str, str | None, str] | None:
    """Split ``config`` around the password of its user info.

    Returns ``(before, password, after)`` such that ``before + password + after`` is
    ``config`` and ``before`` ends with ``USER:``; ``password`` is None (and ``before``
    the whole prefix up to the ``@``) for user info without a password. Returns None
    when there is no user info.

    The user runs from ``//`` to the first ``:`` and holds no ``/``, ``@`` or ``[``
    (``USER[:PASSWORD]@HOST`` in help text is a form, not a URL). The password runs to
    the last ``@`` before the query, or, when the query holds none and the password
    itself a ``?``, to the last ``@`` of the string.
    """
    start = config.find("://")
    if start < 0:
        return None
    head = start + 3
    rest = config[head:]
    user_end = 0
    while user_end < len(rest) and rest[user_end] not in ":/@?#[":
        user_end += 1
    if user_end == len(rest) or rest[user_end] not in ":@":
        return None
    if rest[user_end] == "@":
        return config[: head + user_end], None, config[head + user_end :]
    limit = _authority_end(rest)
    at = rest.rfind("@", user_end, limit)
    if at < 0:
        at = rest.rfind("@", user_end)  # a '?' inside the password itself
    if at < 0:
        return None
    return config[: head + user_end + 1], rest[user_end + 1 : at], config[head + at :]


def secrets_of(config: str) -> list[str]:
    """Return the secrets in a config string: its password and secret-named option values.

    Each in the spellings it may be printed in (as written, percent-decoded and
    percent-encoded), longest first.
    """
    found: list[str] = []
    parts = split_userinfo(config)
    tail = config
    if parts is not None:
        if parts[1]:
            found.append(parts[1])
        tail = parts[2]
    query_at = tail.find("?")
    if query_at >= 0:
        for pair in re.split(r"[&;]", tail[query_at + 1 :].partition("#")[0]):
            name, sep, value = pair.partition("=")
            if sep and value and is_secret_name(name):
                found.append(value)
    for match in _CONNECTION_PART.finditer(config):
        found.append(match[2])
    spelled = found + [unquote(s) for s in found] + [quote(s, safe="") for s in found]
    return sorted({s for s in spelled if s}, key=len, reverse=True)


def _mask_query(query: str) -> str:
    """Mask the values of secret-named options in ``key=value&...`` text."""

    def one(match: re.Match[str]) -> str:
        name, value = match[2], match[3]
        return f"{match[1]}{name}={MASK}" if value and is_secret_name(name) else match[0]

    return re.sub(r"(^|[&;])([^=&;#]+)=([^&;#]*)", one, query)


def redact_url(config: str) -> str:
    """Return ``config`` with its password and secret-named option values as ``***``.

    Everything else, the user name and the help text of a form such as
    ``USER[:PASSWORD]@HOST`` included, is left as it is.
    """
    text = config
    parts = split_userinfo(text)
    if parts is not None and parts[1]:
        text = f"{parts[0]}{MASK}{parts[2]}"
    # Only the query part of the (already masked) URL: a path may hold '=' legitimately.
    after_auth = split_userinfo(text)
    scan_from = len(after_auth[0]) if after_auth is not None else 0
    query_at = text.find("?", scan_from)
    if query_at >= 0:
        query, hash_sign, fragment = text[query_at + 1 :].partition("#")
        text = f"{text[: query_at + 1]}{_mask_query(query)}{hash_sign}{fragment}"
    text = _CONNECTION_PART.sub(lambda m: f"{m[1]}={MASK}", text)
    return text


def redact(text: str, secrets: Iterable[str] = (), *, min_length: int = MIN_GLOBAL_SECRET) -> str:
    """Return ``text`` with every URL in it redacted and every known secret masked.

    ``secrets`` (for example ``secrets_of(config)`` for the configs in use) are replaced
    wherever they appear when at least ``min_length`` characters long; shorter ones only
    where they sit in a URL. A backend scrubbing its own driver's messages, which never
    hold help text, may pass ``min_length=1``.
    """
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret and len(secret) >= min_length:
            text = text.replace(secret, MASK)
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m[0]), text)
    text = _CONNECTION_PART.sub(lambda m: f"{m[1]}={MASK}", text)
    return _AUTH_HEADER.sub(rf"\g<1>{MASK}", text)


def ambiguous_password(config: str) -> bool:
    """Return whether the user info's password holds a raw ``@`` or ``/``.

    Such a string means one thing to a person and another to every URL parser (which
    cut at the first ``/`` or take the wrong ``@``), so it cannot be used as written.
    """
    parts = split_userinfo(config)
    return parts is not None and parts[1] is not None and ("@" in parts[1] or "/" in parts[1])


def check_unambiguous(config: str) -> None:
    """Refuse a config string whose password holds a raw ``@`` or ``/``.

    Raises:
        ConfigError: it does; the message (password masked) says how to write it.
    """
    if ambiguous_password(config):
        from ._errors import ConfigError  # noqa: PLC0415  (keeps this module leaf-level)

        raise ConfigError(
            f"the password in store config {redact_url(config)!r} contains a raw '@' or '/', "
            "which no URL parser reads as meant: percent-encode it ('@' as %40, '/' as "
            "%2F, ':' as %3A, '%' as %25) or leave it out of the URL and give it by "
            "environment variable (STEPSTONE_SQL_PASSWORD for the SQL servers)"
        )


class Redactor:
    """Masks the secrets of every config string added, in any text it is given."""

    def __init__(self) -> None:
        self._secrets: list[str] = []

    def add(self, config: str | None) -> None:
        """Remember the secrets of ``config`` (None is ignored)."""
        if config:
            self._secrets = sorted({*self._secrets, *secrets_of(config)}, key=len, reverse=True)

    def clear(self) -> None:
        """Forget every secret added."""
        self._secrets = []

    def __call__(self, text: str) -> str:
        return redact(text, self._secrets)
