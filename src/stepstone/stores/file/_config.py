"""The file store's configuration: its config-string forms, its options, their checks."""

from __future__ import annotations

import os
from typing import Any, Literal
from urllib.parse import urlsplit

from ..._errors import ConfigError
from ..._redact import redact_url
from .._options import Option, parse, text

__all__ = ["FORMS", "Durability", "Trust", "check_settings", "parse_config"]

Durability = Literal["full", "none"]
Trust = Literal["strict", "any"]

#: The config-string forms the file store accepts, named in every configuration error.
FORMS = (
    "file:///abs/dir or file:rel/dir (relative to the working directory), "
    "optionally followed by ?durability=full|none and &trust=strict|any"
)

# Option[Any]: ``parse`` takes options of any value type.
_OPTIONS: tuple[Option[Any], ...] = (
    text("durability", ("full", "none")),
    text("trust", ("strict", "any")),
)


def parse_config(config: str) -> tuple[str, Durability, Trust]:
    """Return the directory, durability and trust a ``file:`` config string names.

    Raises:
        ConfigError: not a file store config, a host, a fragment, no directory, or an
            option that is unknown, repeated or out of range.
    """
    parts = urlsplit(config)
    shown = redact_url(config)
    if parts.scheme.lower() != "file":
        raise ConfigError(f"not a file store config: {shown!r}; forms: {FORMS}")
    if parts.netloc:
        raise ConfigError(
            f"file store config {shown!r} names a host ({redact_url(parts.netloc)!r}); "
            f"only local directories are supported. Forms: {FORMS}"
        )
    if parts.fragment or config.endswith("#"):
        raise ConfigError(f"file store config {shown!r} has a '#' fragment; forms: {FORMS}")
    path = parts.path
    if not path:
        raise ConfigError(f"file store config {shown!r} names no directory; forms: {FORMS}")
    if path.startswith("//"):
        path = "/" + path.lstrip("/")  # file:////abs, by analogy with sqlite:////abs
    options = parse(parts.query, _OPTIONS, FORMS)
    durability: Durability = "none" if options.get("durability") == "none" else "full"
    trust: Trust = "any" if options.get("trust") == "any" else "strict"
    return path, durability, trust


def check_settings(path: str | os.PathLike[str], durability: str, trust: str) -> str:
    """Return the store directory, absolute, once the settings are known to be valid.

    Raises:
        ConfigError: an unknown durability or trust, or no directory path.
    """
    if durability not in ("full", "none"):
        raise ConfigError(
            f"durability must be 'full' or 'none', got {durability!r}. Forms: {FORMS}"
        )
    if trust not in ("strict", "any"):
        raise ConfigError(f"trust must be 'strict' or 'any', got {trust!r}. Forms: {FORMS}")
    raw = os.fspath(path)
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"the file store needs a directory path, got {path!r}")
    return os.path.abspath(raw)
