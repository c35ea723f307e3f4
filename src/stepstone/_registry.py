"""Choosing a backend from a config string.

Lookup order: schemes registered in this process with ``register_store``, then the
built-in table below, then the ``stepstone.stores`` entry-point group. Built-in schemes
come before entry points and cannot be registered over, so installing a package can
never silently redirect ``sqlite://`` or ``cosmos://`` somewhere else.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import TYPE_CHECKING, Any, TypeGuard

from ._errors import ConfigError, StepstoneError
from ._redact import check_unambiguous, redact_url, secrets_of, split_userinfo
from ._redact import redact as redact_text

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["DEFAULT_STORE", "ENV_VAR", "open_store", "register_store", "schemes"]

ENV_VAR = "STEPSTONE_STORE"
#: Used when neither an argument nor ``STEPSTONE_STORE`` names a store: a SQLite file in
#: the working directory, durable by default.
DEFAULT_STORE = "sqlite:///stepstone.db"

# scheme -> ("module:Class", extra to install or None, the URL forms shown in errors)
_BUILTIN: dict[str, tuple[str, str | None, str]] = {
    "memory": ("stepstone.stores.memory:MemoryStore", None, "memory:// or memory://NAME"),
    "file": ("stepstone.stores.file:FileStore", None, "file:///abs/dir or file:rel/dir"),
    "sqlite": (
        "stepstone.stores.sqlite:SQLiteStore",
        None,
        "sqlite:///rel.db or sqlite:////abs.db",
    ),
    "postgresql": (
        "stepstone.stores.postgres:PostgresStore",
        "postgres",
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
    ),
    "mysql": (
        "stepstone.stores.mysql:MySQLStore",
        "mysql",
        "mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (MySQL or MariaDB)",
    ),
    "cosmos": (
        "stepstone.stores.cosmos:CosmosStore",
        "cosmos",
        "cosmos://ACCOUNT-HOST[:PORT]/DATABASE/CONTAINER",
    ),
}

_registered: dict[str, type[Store]] = {}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(.*)$", re.DOTALL)
_ENTRY_POINT_GROUP = "stepstone.stores"


def redact(config: str) -> str:
    """Return ``config`` with its password and secret-named option values masked.

    Kept under this name for callers of the registry; the routine is ``_redact``'s.
    """
    return redact_url(config)


def _scrubbed(exc: StepstoneError, config: str) -> StepstoneError:
    """Mask the secrets of ``config`` in ``exc``'s message, in place; return ``exc``.

    A backend's own message may quote the string it was given; this is the one place
    every backend's errors pass through on their way out of ``open_store``.
    """
    secrets = secrets_of(config)
    args = tuple(redact_text(a, secrets) if isinstance(a, str) else a for a in exc.args)
    if args != exc.args:
        exc.args = args
    return exc


_MAX_PORT = 65535


def _check_port(config: str) -> None:
    """Refuse a port that no server can listen on, whatever the backend.

    Raises:
        ConfigError: the URL's port is not a whole number from 1 to 65535.
    """
    parts = split_userinfo(config)
    if parts is not None:
        authority = parts[2][1:]  # after the '@'
    elif "://" in config:
        authority = config.partition("://")[2]
    else:
        return
    hostport = re.split(r"[/?#]", authority, maxsplit=1)[0]
    if hostport.startswith("["):
        port = hostport.partition("]")[2].removeprefix(":") if "]:" in hostport else ""
    else:
        port = hostport.rpartition(":")[2] if ":" in hostport else ""
    if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= _MAX_PORT):
        raise ConfigError(
            f"port {port[:20]!r} in store config {redact(config)!r} is not a port: use a "
            f"whole number from 1 to {_MAX_PORT}, or leave it out for the default"
        )


def register_store(scheme: str, cls: type[Store]) -> None:
    """Make ``scheme://`` open ``cls`` in this process.

    Raises:
        ConfigError: ``scheme`` is built in, or ``cls`` is not a ``Store`` subclass.
    """
    if not isinstance(scheme, str) or not _SCHEME.match(f"{scheme}:"):
        raise ConfigError(f"a scheme is a str like 'mystore', got {scheme!r}")
    scheme = scheme.lower()
    if scheme in _BUILTIN:
        raise ConfigError(f"scheme {scheme!r} is built in and cannot be registered over")
    if not _is_store_class(cls):
        raise ConfigError(f"{cls!r} is not a stepstone.Store subclass")
    _registered[scheme] = cls


def _is_store_class(cls: object) -> TypeGuard[type[Store]]:
    # The Store contract is imported here, not with this module: the CLI reads this
    # module's constants to build its parser, and `stepstone --help` should not pay for
    # the contract (a store class about to be opened has imported it already).
    from ._store import Store  # noqa: PLC0415 - deferred: see above

    return isinstance(cls, type) and issubclass(cls, Store)


def entry_points(group: str) -> list[Any]:
    """Return the installed entry points of ``group`` (imported lazily: it is slow)."""
    from importlib.metadata import entry_points as installed  # noqa: PLC0415 - deferred: slow

    return list(installed(group=group))


def _entry_point_schemes() -> dict[str, str]:
    return {
        ep.name.lower(): ep.value
        for ep in entry_points(group=_ENTRY_POINT_GROUP)
        if ep.name.lower() not in _BUILTIN
    }


def schemes() -> list[str]:
    """Return every scheme ``open_store`` understands here, sorted."""
    return sorted({*_BUILTIN, *_registered, *_entry_point_schemes()})


def _valid_forms() -> str:
    forms = [form for _, _, form in _BUILTIN.values()]
    forms += [f"{s}://..." for s in sorted({*_registered, *_entry_point_schemes()})]
    return "; ".join(forms)


def _load_class(target: str, scheme: str, extra: str | None) -> type[Store]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if extra is None:
            raise ConfigError(f"cannot import the {scheme}:// backend {target}: {exc}") from exc
        raise ConfigError(
            f"the {scheme}:// store needs the '{extra}' extra, which is not installed "
            f"({exc.name or exc}): pip install 'stepstone[{extra}]'"
        ) from exc
    cls = getattr(module, attr, None)
    if not _is_store_class(cls):
        raise ConfigError(f"{target} (scheme {scheme!r}) is not a stepstone.Store subclass")
    return cls


def store_class(scheme: str) -> type[Store]:
    """Return the backend class for ``scheme``, importing it lazily.

    A driver suffix in SQLAlchemy's style (``postgresql+psycopg``) selects the backend of
    the part before the ``+``; the backend itself checks the driver.
    """
    scheme = scheme.lower().partition("+")[0]
    if scheme in _registered:
        return _registered[scheme]
    if scheme in _BUILTIN:
        target, extra, _ = _BUILTIN[scheme]
        return _load_class(target, scheme, extra)
    plugins = _entry_point_schemes()
    if scheme in plugins:
        return _load_class(plugins[scheme], scheme, None)
    import difflib  # noqa: PLC0415 - only to suggest a name for an unknown scheme

    close = difflib.get_close_matches(scheme, schemes(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown store scheme {scheme!r}.{hint} Valid forms: {_valid_forms()}")


def open_store(config: str | None = None) -> Store:
    """Open the store a config string names.

    With no argument, reads ``STEPSTONE_STORE``; without that, opens the embedded
    default, ``sqlite:///stepstone.db`` in the working directory.

    Raises:
        ConfigError: the string is malformed, its scheme unknown, or the backend's extra
            is not installed. The message lists the valid forms.
    """
    if config is None:
        config = os.environ.get(ENV_VAR) or DEFAULT_STORE
    if not isinstance(config, str):
        raise ConfigError(f"a store config must be a str, got {type(config).__name__}")
    match = _SCHEME.match(config.strip())
    if match is None:
        raise ConfigError(
            f"malformed store config {redact(config)!r}: expected SCHEME:..., "
            f"one of: {_valid_forms()}"
        )
    # Every URL parser cuts such a string in the wrong place, and a backend would then
    # quote half of the password as a host or a database name.
    check_unambiguous(config)
    _check_port(config.strip())
    cls = store_class(match.group(1))
    try:
        return cls.from_config(config.strip())
    except StepstoneError as exc:
        _scrubbed(exc, config)
        raise
    except ValueError as exc:
        # urllib's own complaints (an unclosed IPv6 bracket, a bad port) mean a malformed
        # string too; the caller gets the same error type as for any other bad config.
        raise ConfigError(
            f"malformed store config {redact(config)!r} "
            f"({redact_text(str(exc), secrets_of(config))}); valid forms: {_valid_forms()}"
        ) from None
