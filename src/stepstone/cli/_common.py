"""What every command shares: exit codes, errors, argument types and opening the store."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import unquote, urlsplit

from .._errors import CorruptCheckpoint
from .._redact import redact_url
from .._registry import DEFAULT_STORE, ENV_VAR, open_store
from .._reserved import LIMIT_PREFIX
from ._output import PROG, REDACT, err, warn

if TYPE_CHECKING:
    from .._store import RunInfo, Store

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "OperationalError",
    "Parser",
    "UsageError",
    "add_signal_id",
    "age_arg",
    "bounded_int",
    "existing",
    "infos",
    "json_arg",
    "opened",
    "parse_age",
    "positive_int",
    "require_store",
    "seconds_arg",
    "store_config",
    "without_creating",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: The longest duration any option accepts: a hundred years is a typo, not a retention
#: policy, and beyond ``timedelta``'s range the arithmetic itself would overflow.
MAX_SECONDS = 100 * 366 * 86400
#: Cosmos DB's largest per-item TTL (a signed 32-bit number of seconds).
MAX_TTL_SECONDS = 2**31 - 1

_DURATION = re.compile(
    r"^(?:(?P<w>\d+)w)?(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$"
)
_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_HELP = "use a duration such as 30d, 12h, 15m, 45s, 2w or 1h30m"


class UsageError(Exception):
    """A command line that cannot be carried out as given: exit status 2."""


class OperationalError(Exception):
    """A command that ran and failed (missing run, failing check): exit status 1."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    #: The last usage error, for ``main`` to report under ``--json`` too.
    last_error: str | None = None

    def error(self, message: str) -> NoReturn:
        text = f"{message} (see '{self.prog} --help')"
        Parser.last_error = text
        err(text)
        raise SystemExit(EXIT_USAGE)


# --- argument types ------------------------------------------------------------------


def _duration_seconds(text: str) -> int | None:
    """Return the seconds of ``30d``/``1h30m``-style text, or None if it is not one."""
    value = text.strip()
    match = _DURATION.match(value)
    if not value or match is None:
        return None
    return sum(int(n) * _UNITS[unit] for unit, n in match.groupdict().items() if n)


def parse_age(text: str, now: datetime | None = None) -> datetime:
    """Turn ``30d``/``12h``/``15m``/``45s``/``2w`` (or ``1h30m``) or an ISO timestamp
    into the cutoff instant: ``now`` minus the duration, or the timestamp itself.

    A timestamp without a zone is UTC.

    Raises:
        ValueError: neither form, or a duration longer than a hundred years; the
            message shows both forms.
    """
    now = now or datetime.now(UTC)
    seconds = _duration_seconds(text)
    if seconds is not None:
        if seconds > MAX_SECONDS:
            raise ValueError(
                f"invalid age {text!r}: longer than 100 years; {_DURATION_HELP}, or a "
                "timestamp such as 2024-05-01T12:00:00Z"
            )
        return now - timedelta(seconds=seconds)
    try:
        stamp = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"invalid age {text!r}: {_DURATION_HELP}, or a timestamp such as 2024-05-01T12:00:00Z"
        ) from None
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp


def age_arg(text: str) -> datetime:
    """argparse type: an age (see ``parse_age``)."""
    try:
        return parse_age(text)
    except (ValueError, OverflowError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bounded_int(low: int, high: int, what: str = "integer") -> Callable[[str], int]:
    """argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {low} to {high}, got {text!r}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be from {low} to {high}, got {value}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def ttl_arg(text: str) -> int:
    """argparse type: a TTL duration (``1s`` to about 68 years, Cosmos DB's range)."""
    seconds = _duration_seconds(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(
            f"invalid TTL {text!r}: use a duration such as 1s, 15m, 12h or 30d"
        )
    if seconds < 1:
        raise argparse.ArgumentTypeError("the TTL must be at least 1s")
    if seconds > MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"the TTL {text!r} is longer than the largest a store accepts "
            f"({MAX_TTL_SECONDS}s, about 68 years)"
        )
    return seconds


def seconds_arg(low: float, high: float, *, allow_low: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number of seconds above ``low`` (or equal, with
    ``allow_low``) and at most ``high``; ``30``, ``2.5`` or a duration such as ``5m``."""

    def parse(text: str) -> float:
        spelled = _duration_seconds(text)
        try:
            value = float(spelled) if spelled is not None else float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds (30, 2.5) or a duration (5m), got {text!r}"
            ) from None
        if not math.isfinite(value) or value < low or (value == low and not allow_low):
            bound = f"at least {low:g}" if allow_low else f"more than {low:g}"
            raise argparse.ArgumentTypeError(f"expected {bound} seconds, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(
                f"expected at most {high:g} seconds ({high / 3600:g}h), got {text!r}"
            )
        return value

    parse.__name__ = "seconds"
    return parse


# --- the store -----------------------------------------------------------------------


def add_signal_id(parser: argparse.ArgumentParser, help_text: str) -> None:
    """Add ``--id ID`` (``args.signal_id``): the id of the signal the command sends, which
    makes sending it again a no-op."""
    parser.add_argument("--id", dest="signal_id", metavar="ID", help=help_text)


def json_arg(text: str, option: str, example: str, *, object_only: bool = True) -> Any:
    """Return the JSON ``text`` given to ``option`` (a JSON object unless not
    ``object_only``).

    Raises:
        UsageError: not JSON, or not an object: the message names ``option`` and shows
            ``example``.
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{option} is not JSON ({exc}): e.g. {option} '{example}'") from None
    if object_only and not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object, got a {type(value).__name__}")
    return value


def store_config(args: argparse.Namespace) -> str:
    """Return the config string the command acts on: --store, $STEPSTONE_STORE or the
    default, with its secrets registered for masking."""
    config: str | None = getattr(args, "store", None)
    if config is None:
        config = os.environ.get(ENV_VAR) or DEFAULT_STORE
    REDACT.add(config)
    return config


@contextlib.contextmanager
def opened(config: str) -> Iterator[Store]:
    """Open ``config`` for the length of a ``with`` block."""
    REDACT.add(config)
    store = open_store(config)
    try:
        yield store
    finally:
        store.close()


def _local_path(config: str) -> tuple[str, str] | None:
    """Return ``(path, kind)`` of a local store (``sqlite``: a file, ``file``: a
    directory), or None for other schemes or a string the backend will refuse itself."""
    text = config.strip()
    scheme = text.partition(":")[0].lower()
    if scheme == "sqlite":
        parts = urlsplit(text)
        path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        return (path, "sqlite") if path and path != ":memory:" and not parts.netloc else None
    if scheme == "file":
        from ..stores.file._config import parse_config  # noqa: PLC0415  (only for file:)

        try:
            return parse_config(text)[0], "file"
        except ValueError:
            return None  # a malformed string: opening it says what is wrong
    return None


def require_store(config: str) -> None:
    """Refuse a local store (SQLite file, file-store directory) that does not exist.

    Commands that only act on existing runs must not create a store: a typo in a path
    would otherwise print "no runs", exit 0 and leave an empty store behind. Nothing is
    created or changed here; server stores are left to their backend.

    Raises:
        OperationalError: the path does not exist (a dangling symlink included), or is
            not what the store needs there (a directory for SQLite, a file for file:).
    """
    found = _local_path(config)
    if found is None:
        return
    path, kind = found
    shown = redact_url(config)
    try:
        mode = os.stat(path).st_mode  # follows a symlink: a dangling one is missing
    except FileNotFoundError:
        dangling = os.path.islink(path)
        raise OperationalError(
            f"no store at {shown}: {os.path.abspath(path)} "
            f"{'is a symlink to a path that does not exist' if dangling else 'does not exist'}"
            f" (check the path; `{PROG} init --store URL` creates a store)"
        ) from None
    except OSError as exc:
        raise OperationalError(f"cannot open the store {shown}: {exc.strerror}") from None
    if kind == "sqlite" and not stat.S_ISREG(mode):
        raise OperationalError(
            f"no store at {shown}: {os.path.abspath(path)} is "
            f"{'a directory' if stat.S_ISDIR(mode) else 'not a regular file'}, not a "
            "SQLite database file"
        )
    if kind == "file" and not stat.S_ISDIR(mode):
        raise OperationalError(
            f"no store at {shown}: {os.path.abspath(path)} is not a directory (a file: "
            "store is a directory)"
        )


def without_creating(config: str) -> str:
    """Return ``config`` opening a SQL server store only if its tables exist (``create=false``).

    Other stores are returned as they are (``require_store`` checks the local ones). A
    ``create`` the string names already is replaced: a read-only command creates nothing.
    """
    text = config.strip()
    if text.partition(":")[0].partition("+")[0].lower() not in ("postgresql", "mysql"):
        return config
    base, _, query = text.partition("?")
    kept = [item for item in query.split("&") if item and item.partition("=")[0] != "create"]
    return f"{base}?{'&'.join([*kept, 'create=false'])}"


@contextlib.contextmanager
def existing(config: str) -> Iterator[Store]:
    """Open ``config`` like ``opened``, refusing a store that does not exist.

    A local store's path must exist (``require_store``); a SQL server store's tables
    must (``without_creating``): a typo must not create a store.
    """
    REDACT.add(config)
    require_store(config)
    with opened(without_creating(config)) as store:
        yield store


def infos(store: Store) -> Iterator[RunInfo]:
    """Yield ``store.list_info()``; with the default implementation, skip (with a
    warning) the runs that cannot be read instead of ending the listing at the first.

    The default ``Store.list_info`` loads every run, so one corrupt checkpoint would end
    the whole listing; backends with their own index report theirs as they are. Limit
    records (``~limit/<key>``, ``stepstone limits``) are left out.
    """
    from .._store import RunInfo, Store  # noqa: PLC0415 - when used

    if type(store).list_info is not Store.list_info:
        # Flow control's limit records are not runs: never listed, never pruned.
        yield from (i for i in store.list_info() if not i.run_id.startswith(LIMIT_PREFIX))
        return
    for run_id in store.list_runs():
        if run_id.startswith(LIMIT_PREFIX):
            continue
        try:
            cp = store.load(run_id)
        except CorruptCheckpoint as exc:
            warn(f"skipping run {run_id!r}: {exc}")
            continue
        if cp is not None:
            yield RunInfo.of(cp)


def info_matches(
    info: RunInfo, status: str | None, older: datetime | None, newer: datetime | None
) -> bool:
    """Whether ``info`` passes the status and age filters (no age: never an age match)."""
    if status is not None and info.status != status:
        return False
    if older is None and newer is None:
        return True
    updated = info.updated_at
    if updated is None:
        return False
    if updated.tzinfo is None:
        updated = updated.replace(tzinfo=UTC)
    if older is not None and not updated < older:
        return False
    return newer is None or updated > newer


def newest_first(items: list[RunInfo]) -> list[RunInfo]:
    """Sort by ``updated_at``, newest first (unknown last); ties by run_id."""
    epoch = datetime.min.replace(tzinfo=UTC)

    def updated(info: RunInfo) -> datetime:
        value = info.updated_at or epoch
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value

    return sorted(sorted(items, key=lambda i: i.run_id), key=updated, reverse=True)
