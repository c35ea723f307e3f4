"""The ``stepstone`` command: inspect, prune, migrate and check stores, and a demo.

Exit status: 0 success; 1 an operational error (the store failed, a run is missing,
``doctor`` found a failing check, ``migrate`` left conflicts or failures); 2 a usage or
configuration error (bad option, bad store config string); 130 interrupted.

Every error is one line on stderr, ``stepstone: error: ...``; ``--verbose`` adds the
traceback and debug logs. Secrets in store config strings (passwords, keys, tokens) are
replaced by ``***`` in everything printed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TextIO
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from . import __version__
from ._checkpoint import Checkpoint
from ._demo import run_demo
from ._errors import (
    ConfigError,
    CorruptCheckpoint,
    InvalidRunId,
    StepstoneError,
    StoreError,
    StorePermissionError,
)
from ._migrate import migrate
from ._registry import DEFAULT_STORE, ENV_VAR, open_store
from ._store import Diagnosis, RunInfo, Store

__all__ = ["main", "parse_age", "redact"]

PROG = "stepstone"
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_STATUSES = ("running", "failed", "done")
_SECRET_NAME = re.compile(r"key|secret|pass|pwd|token|sig|cred|auth", re.IGNORECASE)
_DURATION = re.compile(
    r"^(?:(?P<w>\d+)w)?(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$"
)
_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


class UsageError(Exception):
    """A command line that cannot be carried out as given: exit status 2."""


class OperationalError(Exception):
    """A command that ran and failed (missing run, failing check): exit status 1."""


# --- secrets ---------------------------------------------------------------------------


# Secrets shorter than this are masked only where they sit in a URL, never by a blind
# replace over all output: replacing a 3-letter password everywhere would mangle run ids
# and states that happen to contain it.
_MIN_GLOBAL_SECRET = 8
_URL_PASSWORD = re.compile(r"(://[^/@:\s]*:)[^/@\s]*@")
_URL_OPTION = re.compile(r"([?&])([^=&#\s]+)=([^&#\s]*)")


def _secrets_in(config: str) -> list[str]:
    """Return the secrets of a store config string: its password and secret-named options.

    A user name is not a secret (``postgres``, ``root``), so it is left alone.
    """
    found: list[str] = []
    try:
        parts = urlsplit(config)
    except ValueError:
        return found
    if parts.password:
        found.append(parts.password)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if value and _SECRET_NAME.search(name):
            found.append(value)
    # Also their percent-encoded spellings, as they appear in the string itself.
    found += [quote(s, safe="") for s in found] + [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


def _mask_urls(text: str) -> str:
    """Mask passwords and secret-named options wherever a URL appears in ``text``."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    return _URL_OPTION.sub(
        lambda m: f"{m[1]}{m[2]}=***" if _SECRET_NAME.search(m[2]) else m[0], text
    )


class _Redactor:
    """Masks the secrets of the store config strings in use, in everything printed."""

    def __init__(self) -> None:
        self._secrets: list[str] = []

    def add(self, config: str | None) -> None:
        if config:
            long_enough = [s for s in _secrets_in(config) if len(s) >= _MIN_GLOBAL_SECRET]
            self._secrets = sorted({*self._secrets, *long_enough}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _mask_urls(text)


_redact = _Redactor()


def redact(config: str) -> str:
    """Return ``config`` with its password and secret-looking query values as ``***``."""
    text = config
    for secret in _secrets_in(config):
        text = text.replace(secret, "***")
    return _mask_urls(text)


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return _redact(super().format(record))


# --- output helpers ----------------------------------------------------------------------


def _err(message: str) -> None:
    """Print one error line on stderr."""
    line = " ".join(_redact(message).split())
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)


def _out(text: str = "") -> None:
    print(_redact(text))


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _age(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "-"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = max(0, int((now - value).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


# --- ages --------------------------------------------------------------------------------


def parse_age(text: str, now: datetime | None = None) -> datetime:
    """Turn ``30d``/``12h``/``15m``/``45s``/``2w`` (or ``1h30m``) or an ISO timestamp
    into the cutoff instant: ``now`` minus the duration, or the timestamp itself.

    A timestamp without a zone is UTC.

    Raises:
        ValueError: neither form; the message shows both.
    """
    now = now or datetime.now(UTC)
    value = text.strip()
    match = _DURATION.match(value)
    if value and match is not None:
        seconds = sum(int(n) * _UNITS[unit] for unit, n in match.groupdict().items() if n)
        return now - timedelta(seconds=seconds)
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"invalid age {text!r}: use a duration such as 30d, 12h, 15m, 45s, 2w or 1h30m, "
            "or a timestamp such as 2024-05-01T12:00:00Z"
        ) from None
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp


def _age_arg(text: str) -> datetime:
    try:
        return parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _ttl_arg(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(
            f"invalid TTL {text!r}: use a duration such as 1s, 15m, 12h or 30d"
        )
    seconds = sum(int(n) * _UNITS[unit] for unit, n in match.groupdict().items() if n)
    if seconds < 1:
        raise argparse.ArgumentTypeError("the TTL must be at least 1s")
    return seconds


# --- the parser --------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        _err(f"{message} (see '{self.prog} --help')")
        raise SystemExit(EXIT_USAGE)


_EPILOG = f"""\
The store is --store URL, else ${ENV_VAR}, else {DEFAULT_STORE} (in the working
directory). Forms: sqlite:///rel.db, sqlite:////abs.db, file:rel/dir, file:///abs/dir,
cosmos://ACCOUNT-HOST/DATABASE/CONTAINER, memory:// (this process only).

Exit status: 0 ok; 1 operational error (store failed, run missing, a doctor check
failed, migrate left conflicts or failures); 2 usage or configuration error.
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the ``stepstone`` argument parser."""
    parser = _Parser(
        prog=PROG,
        description="Inspect and manage stepstone stores: durable runs that resume after a crash.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help=f"store config string (default: ${ENV_VAR}, else {DEFAULT_STORE})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=False, help="tracebacks and debug logs"
    )

    # Options also accepted after the subcommand; SUPPRESS keeps a value given before it.
    verbose = _Parser(add_help=False)
    verbose.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="tracebacks and debug logs",
    )
    store = _Parser(add_help=False, parents=[verbose])
    store.add_argument(
        "--store", metavar="URL", default=argparse.SUPPRESS, help="store config string"
    )

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    runs = commands.add_parser("runs", help="list, show, delete and prune runs")
    runs_commands = runs.add_subparsers(dest="runs_command", metavar="ACTION", parser_class=_Parser)
    runs_commands.required = True

    ls = runs_commands.add_parser(
        "list",
        parents=[store],
        help="list runs, newest first",
        description="List runs, most recently updated first.",
    )
    ls.add_argument("--status", choices=_STATUSES, help="only runs with this status")
    ls.add_argument(
        "--older-than",
        type=_age_arg,
        metavar="AGE",
        help="only runs last updated before AGE ago (30d, 12h, 15m, 45s) or an ISO timestamp",
    )
    ls.add_argument(
        "--newer-than",
        type=_age_arg,
        metavar="AGE",
        help="only runs last updated after AGE ago, or after an ISO timestamp",
    )
    ls.add_argument("--limit", type=_positive_int, metavar="N", help="show at most N runs")
    ls.add_argument("--json", action="store_true", help="print one JSON array, for scripts")
    ls.set_defaults(handler=_cmd_runs_list)

    show = runs_commands.add_parser(
        "show", parents=[store], help="show one run, with its failure and state"
    )
    show.add_argument("run_id", metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
    show.set_defaults(handler=_cmd_runs_show)

    delete = runs_commands.add_parser("delete", parents=[store], help="delete one run")
    delete.add_argument("run_id", metavar="RUN_ID")
    delete.add_argument(
        "--missing-ok", action="store_true", help="exit 0 when there is no such run"
    )
    delete.set_defaults(handler=_cmd_runs_delete)

    prune = runs_commands.add_parser(
        "prune",
        parents=[store],
        help="delete runs not updated for a while",
        description=(
            "Delete runs whose last update is older than --older-than. Runs without an "
            "update time are never pruned. Each run is re-read just before it is deleted, "
            "so one that advanced meanwhile is kept."
        ),
    )
    prune.add_argument(
        "--older-than",
        type=_age_arg,
        metavar="AGE",
        required=True,
        help="prune runs last updated before AGE ago (30d, 12h, 15m, 45s) or an ISO timestamp",
    )
    prune.add_argument("--status", choices=_STATUSES, help="only prune runs with this status")
    prune.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    prune.add_argument(
        "--ttl",
        type=_ttl_arg,
        nargs="?",
        const=1,
        default=None,
        metavar="DURATION",
        help=(
            "instead of deleting, set the store's native per-run TTL (default 1s) so the "
            "store expires them itself; only for stores with native TTL (cosmos)"
        ),
    )
    prune.set_defaults(handler=_cmd_runs_prune)

    mig = commands.add_parser(
        "migrate",
        parents=[verbose],
        help="copy every run from one store to another",
        description=(
            "Copy every run from --from to --to. Runs missing in the destination are "
            "created, identical ones skipped, differing ones reported as conflicts (or "
            "overwritten with --force). Safe to re-run after an interruption. Exit status "
            "1 when conflicts or failures remain, so scripts notice an incomplete copy."
        ),
    )
    mig.add_argument("--from", dest="src", metavar="URL", required=True, help="source store")
    mig.add_argument("--to", dest="dst", metavar="URL", required=True, help="destination store")
    mig.add_argument("--force", action="store_true", help="overwrite destination runs that differ")
    mig.add_argument(
        "--dry-run", action="store_true", help="report what would happen; write nothing"
    )
    mig.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr even when it is not a terminal",
    )
    mig.set_defaults(handler=_cmd_migrate)

    init = commands.add_parser(
        "init", parents=[store], help="create what the store needs (tables, container)"
    )
    init.set_defaults(handler=_cmd_init)

    doctor = commands.add_parser(
        "doctor", parents=[store], help="check connectivity, permissions and schema"
    )
    doctor.set_defaults(handler=_cmd_doctor)

    demo = commands.add_parser(
        "demo",
        parents=[store],
        help="watch a run survive its process being killed",
        description=(
            "Run a 4-step workflow in a child process that kills itself during step 2, "
            "then resume the same run in a fresh process. Uses the store as usual "
            f"(default {DEFAULT_STORE} in the working directory); a new run id each time."
        ),
    )
    demo.set_defaults(handler=_cmd_demo)

    bench = commands.add_parser(
        "bench", parents=[store], add_help=False, help="benchmark a store (options: bench --help)"
    )
    bench.set_defaults(handler=_cmd_bench)
    return parser


# --- stores ------------------------------------------------------------------------------


def _store_config(args: argparse.Namespace) -> str:
    config: str | None = args.store
    if config is None:
        config = os.environ.get(ENV_VAR) or DEFAULT_STORE
    _redact.add(config)
    return config


@contextlib.contextmanager
def _opened(config: str) -> Iterator[Store]:
    _redact.add(config)
    store = open_store(config)
    try:
        yield store
    finally:
        store.close()


def _warn(message: str) -> None:
    line = " ".join(_redact(message).split())
    print(f"{PROG}: warning: {line}", file=sys.stderr, flush=True)


def _infos(store: Store) -> Iterator[RunInfo]:
    """Yield ``store.list_info()``, but skip (with a warning) runs that cannot be read.

    The default ``Store.list_info`` loads every run, and one corrupt checkpoint would
    end the whole listing; backends with their own index are used as they are.
    """
    if type(store).list_info is not Store.list_info:
        yield from store.list_info()
        return
    for run_id in store.list_runs():
        try:
            cp = store.load(run_id)
        except CorruptCheckpoint as exc:
            _warn(f"skipping run {run_id!r}: {exc}")
            continue
        if cp is not None:
            yield RunInfo(run_id, cp.status, cp.step, cp.total_steps, cp.updated_at)


def _info_matches(
    info: RunInfo, status: str | None, older: datetime | None, newer: datetime | None
) -> bool:
    if status is not None and info.status != status:
        return False
    if older is None and newer is None:
        return True
    updated = info.updated_at
    if updated is None:
        return False  # unknown age: never matched by an age filter
    if updated.tzinfo is None:
        updated = updated.replace(tzinfo=UTC)
    if older is not None and not updated < older:
        return False
    return newer is None or updated > newer


def _newest_first(infos: list[RunInfo]) -> list[RunInfo]:
    """Sort by ``updated_at``, newest first (unknown last); ties by run_id."""
    epoch = datetime.min.replace(tzinfo=UTC)

    def updated(info: RunInfo) -> datetime:
        value = info.updated_at or epoch
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value

    return sorted(sorted(infos, key=lambda i: i.run_id), key=updated, reverse=True)


def _progress_text(step: int, total: int | None) -> str:
    return f"{step + 1}/{'?' if total is None else total}"


# --- runs --------------------------------------------------------------------------------


def _cmd_runs_list(args: argparse.Namespace) -> int:
    config = _store_config(args)
    with _opened(config) as store:
        infos = [
            info
            for info in _infos(store)
            if _info_matches(info, args.status, args.older_than, args.newer_than)
        ]
    infos = _newest_first(infos)
    if args.limit is not None:
        infos = infos[: args.limit]
    if args.json:
        _out(
            json.dumps(
                [
                    {
                        "run_id": i.run_id,
                        "status": i.status,
                        "step": i.step,
                        "completed_steps": i.step + 1,
                        "total_steps": i.total_steps,
                        "updated_at": _iso(i.updated_at),
                    }
                    for i in infos
                ],
                ensure_ascii=False,
                indent=2,
            )
        )
        return EXIT_OK
    if not infos:
        _out(
            "no runs"
            if not (args.status or args.older_than or args.newer_than)
            else "no matching runs"
        )
        return EXIT_OK
    now = datetime.now(UTC)
    rows = [
        [
            i.run_id,
            i.status,
            _progress_text(i.step, i.total_steps),
            _when(i.updated_at),
            _age(i.updated_at, now),
        ]
        for i in infos
    ]
    for line in _table(["RUN_ID", "STATUS", "STEPS", "UPDATED", "AGE"], rows):
        _out(line)
    return EXIT_OK


def _checkpoint_json(cp: Checkpoint) -> dict[str, Any]:
    failure = cp.failure
    return {
        "run_id": cp.run_id,
        "status": cp.status,
        "step": cp.step,
        "completed_steps": cp.step + 1,
        "total_steps": cp.total_steps,
        "step_names": list(cp.step_names),
        "attempt": cp.attempt,
        "failure": None
        if failure is None
        else {
            "step_index": failure.step_index,
            "step_name": failure.step_name,
            "error_type": failure.error_type,
            "message": failure.message,
            "attempt": failure.attempt,
            "at": _iso(failure.at),
        },
        "created_at": _iso(cp.created_at),
        "updated_at": _iso(cp.updated_at),
        "version": cp.version,
        "state": cp.state,
    }


def _missing(run_id: str, config: str) -> OperationalError:
    return OperationalError(f"no run {run_id!r} in {redact(config)}")


def _cmd_runs_show(args: argparse.Namespace) -> int:
    config = _store_config(args)
    with _opened(config) as store:
        cp = store.load(args.run_id)
    if cp is None:
        raise _missing(args.run_id, config)
    if args.json:
        _out(json.dumps(_checkpoint_json(cp), ensure_ascii=False, indent=2))
        return EXIT_OK
    total = "?" if cp.total_steps is None else str(cp.total_steps)
    names = ", ".join(cp.step_names) if cp.step_names else "none yet"
    fields = [
        ("run id", cp.run_id),
        ("status", cp.status),
        ("progress", f"{cp.step + 1} of {total} steps completed (last completed index {cp.step})"),
        ("completed", names),
        ("attempt", f"{cp.attempt} attempt(s) begun on the next step"),
        ("created", _when(cp.created_at)),
        ("updated", _when(cp.updated_at)),
        ("version", cp.version or "-"),
    ]
    width = max(len(label) for label, _ in fields) + 2
    for label, value in fields:
        _out(f"{label + ':':<{width}}{value}")
    failure = cp.failure
    if failure is None:
        _out(f"{'failure:':<{width}}none")
    else:
        _out("failure:")
        _out(f"  step:     {failure.step_index} ({failure.step_name})")
        _out(f"  error:    {failure.error_type}")
        _out(f"  attempt:  {failure.attempt}")
        _out(f"  at:       {_when(failure.at)}")
        lines = failure.message.splitlines() or [""]
        _out(f"  message:  {lines[0]}")
        for line in lines[1:]:
            _out(f"            {line}")
    _out("state:")
    _out(json.dumps(cp.state, ensure_ascii=False, indent=2))
    return EXIT_OK


def _cmd_runs_delete(args: argparse.Namespace) -> int:
    config = _store_config(args)
    with _opened(config) as store:
        deleted = store.delete(args.run_id)
    if deleted:
        _out(f"deleted run {args.run_id!r}")
        return EXIT_OK
    if args.missing_ok:
        _out(f"no run {args.run_id!r}; nothing to delete")
        return EXIT_OK
    raise _missing(args.run_id, config)


def _cmd_runs_prune(args: argparse.Namespace) -> int:
    config = _store_config(args)
    cutoff: datetime = args.older_than
    verb = "expire" if args.ttl is not None else "delete"
    with _opened(config) as store:
        expire = getattr(store, "expire", None)
        if args.ttl is not None and not callable(expire):
            raise UsageError(
                f"the {store.scheme or type(store).__name__} store has no native TTL; "
                "prune without --ttl to delete the runs"
            )
        candidates = _newest_first(
            [i for i in _infos(store) if _info_matches(i, args.status, cutoff, None)]
        )
        count = 0
        for info in candidates:
            if args.dry_run:
                when = _when(info.updated_at)
                _out(f"would {verb} {info.run_id!r} ({info.status}, updated {when})")
                count += 1
                continue
            # Re-read: a run that advanced since it was listed is not old any more.
            cp = store.load(info.run_id)
            if cp is None:
                continue
            fresh = RunInfo(cp.run_id, cp.status, cp.step, cp.total_steps, cp.updated_at)
            if not _info_matches(fresh, args.status, cutoff, None):
                continue
            if expire is not None and args.ttl is not None:
                count += expire(info.run_id, args.ttl) is not False
            elif store.delete(info.run_id):
                count += 1
    which = f"{args.status + ' ' if args.status else ''}{'run' if count == 1 else 'runs'}"
    done = {"delete": "deleted", "expire": f"set a {args.ttl}s TTL on"}[verb]
    if args.dry_run:
        _out(f"dry run: would {verb} {count} {which} updated before {_when(cutoff)}")
    else:
        _out(f"{done} {count} {which} updated before {_when(cutoff)}")
    return EXIT_OK


# --- migrate -----------------------------------------------------------------------------


class _ProgressBar:
    """A progress bar on stderr: redrawn in place on a terminal, a line a second otherwise."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = stream.isatty()
        self.interval = 0.1 if self.tty else 1.0
        self.last = 0.0
        self.drawn = False
        self.counts: dict[str, int] = {"copied": 0, "skipped": 0, "conflict": 0, "failed": 0}

    def __call__(self, done: int, total: int, run_id: str, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if not self.enabled:
            return
        now = time.monotonic()
        if done != total and now - self.last < self.interval:
            return
        self.last = now
        width = 30
        filled = width * done // total if total else width
        c = self.counts
        text = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
            f"copied {c['copied']} skipped {c['skipped']} conflicts {c['conflict']} "
            f"failed {c['failed']}"
        )
        if self.tty:
            self.stream.write(f"\r{text}")
        else:
            self.stream.write(f"{text}\n")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.enabled and self.drawn and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _cmd_migrate(args: argparse.Namespace) -> int:
    _redact.add(args.src)
    _redact.add(args.dst)
    if args.src.strip() == args.dst.strip():
        raise UsageError("--from and --to name the same store")
    bar = _ProgressBar(sys.stderr, args.progress or sys.stderr.isatty())
    with _opened(args.src) as src, _opened(args.dst) as dst:
        try:
            report = migrate(src, dst, force=args.force, dry_run=args.dry_run, progress=bar)
        finally:
            bar.close()
    shown = 20
    for run_id, outcome, detail in report.problems[:shown]:
        _out(f"{outcome}: run {run_id!r}: {detail}")
    if len(report.problems) > shown:
        _out(f"... and {len(report.problems) - shown} more")
    _out(f"{report.summary()} ({report.total} runs from {redact(args.src)} to {redact(args.dst)})")
    return EXIT_OK if report.complete else EXIT_ERROR


# --- init, doctor ------------------------------------------------------------------------


def _cmd_init(args: argparse.Namespace) -> int:
    config = _store_config(args)
    with _opened(config) as store:
        try:
            lines = store.init()
        except StorePermissionError as exc:
            _out("Not allowed to create what the store needs. Provision it by hand:")
            for line in str(exc).splitlines():
                _out(f"  {line}")
            _out("then check with: stepstone doctor")
            raise OperationalError(f"init: permission denied: {exc}") from exc
    for line in lines:
        _out(line)
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    config = _store_config(args)
    _out(f"store: {redact(config)}")
    try:
        with _opened(config) as store:
            results = store.doctor()
    except ConfigError:
        raise
    except (StoreError, OSError) as exc:
        if args.verbose:
            print(_redact("".join(traceback.format_exception(exc))), file=sys.stderr, end="")
        results = [Diagnosis("open the store", False, f"{type(exc).__name__}: {exc}")]
    failed = [d for d in results if not d.ok]
    for d in results:
        detail = "" if d.ok and d.detail == "ok" else f": {' '.join(d.detail.split())}"
        _out(f"{'ok' if d.ok else 'FAIL':<6}{d.check}{detail}")
    _out(f"{len(results) - len(failed)} checks passed, {len(failed)} failed")
    return EXIT_ERROR if failed else EXIT_OK


# --- demo, bench -------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    config = _store_config(args)
    if config.strip().lower().startswith("memory:"):
        raise UsageError(
            "the demo needs a store shared between processes; memory:// lives in one "
            f"process only. Try --store {DEFAULT_STORE}"
        )
    with _opened(config):
        pass  # fail early, in this process, on a bad config string or store
    option = "" if args.store is None else f" --store {redact(config)}"
    try:
        return run_demo(
            config,
            sys.stdout,
            shown_store=redact(config),
            store_option=option,
            verbose=args.verbose,
        )
    except RuntimeError as exc:
        raise OperationalError(str(exc)) from exc


def _cmd_bench(args: argparse.Namespace, extra: list[str]) -> int:
    if importlib.util.find_spec("stepstone._bench") is None:
        raise OperationalError(
            "the benchmark is not available in this installation (no stepstone._bench module)"
        )
    module = importlib.import_module("stepstone._bench")
    entry = getattr(module, "main", None)
    if not callable(entry):
        raise OperationalError("stepstone._bench has no main(argv) function")
    argv = list(extra)
    if args.store is not None:
        argv = ["--store", args.store, *argv]
    result = entry(argv)
    return result if isinstance(result, int) else EXIT_OK


# --- main --------------------------------------------------------------------------------


def _setup_logging(verbose: bool) -> None:
    logger = logging.getLogger("stepstone")
    handler = logging.StreamHandler(sys.stderr)
    if verbose:
        handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.setLevel(logging.DEBUG)
    else:
        handler.setFormatter(_RedactingFormatter(f"{PROG}: %(levelname)s: %(message)s"))
        logger.setLevel(logging.WARNING)
    logger.handlers[:] = [handler]
    logger.propagate = False
    # Drivers' own warnings (urllib3's InsecureRequestWarning for an emulator with
    # verify=false, azure-identity's long credential-chain report) would break the
    # one-line error promise; they go through the same redacting handler, and only
    # with --verbose.
    logging.captureWarnings(True)
    for name in ("py.warnings", "azure", "urllib3"):
        noisy = logging.getLogger(name)
        noisy.handlers[:] = [handler]
        noisy.propagate = False
        noisy.setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def _verbose_requested(argv: Sequence[str]) -> bool:
    return any(a in ("-v", "--verbose") for a in argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``stepstone`` command; return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    parser = build_parser()
    verbose = _verbose_requested(argv)
    try:
        args, extra = parser.parse_known_args(argv)
        verbose = bool(args.verbose)
        _setup_logging(verbose)
        if args.command == "bench":
            return _cmd_bench(args, extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        result: int = args.handler(args)
        return result
    except SystemExit as exc:  # --help, --version and usage errors from argparse
        code = exc.code
        return code if isinstance(code, int) else (EXIT_OK if code is None else EXIT_USAGE)
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``stepstone runs list | head``): not an error worth a line.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:
        code, message = _classify(exc)
        if verbose:
            text = "".join(traceback.format_exception(exc))
            print(_redact(text), file=sys.stderr, end="")
        elif code == EXIT_ERROR and not isinstance(exc, (OperationalError, StepstoneError)):
            message += " (run with --verbose for the traceback)"
        _err(message)
        return code


def _classify(exc: Exception) -> tuple[int, str]:
    """Return the exit status and message for an error that ended a command."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, OperationalError):
        return EXIT_ERROR, str(exc)
    if isinstance(exc, (ConfigError, InvalidRunId)):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, StepstoneError):
        return EXIT_ERROR, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        return EXIT_ERROR, f"{exc}"
    return EXIT_ERROR, f"unexpected {type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
