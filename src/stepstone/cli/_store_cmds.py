"""``stepstone init``, ``doctor`` and ``migrate``: the store as a whole."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from .._bounds import ORPHAN_AGE
from .._errors import ConfigError, StoreError, StorePermissionError
from .._redact import redact_url
from ._commands import Commands
from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    OperationalError,
    UsageError,
    existing,
    opened,
    store_config,
)
from ._output import REDACT, emit_json, out, safe

if TYPE_CHECKING:
    from .._statelog import Orphan
    from .._store import Diagnosis, Store

__all__ = ["add_parsers"]


def add_parsers(commands: Commands, verbose: argparse.ArgumentParser) -> None:
    """Add ``init``, ``doctor`` and ``migrate`` to the top-level ``commands``."""
    # migrate names its two stores itself: the common options (``verbose``), no --store.
    mig = Commands(commands.actions, verbose).add("migrate", _migrate)
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

    commands.add("init", _init)

    doctor = commands.add("doctor", _doctor)
    doctor.add_argument(
        "--fix",
        action="store_true",
        help=(
            "also delete orphaned pieces of long states: those of runs with no checkpoint "
            "(a writer killed during a first save), older than --min-age"
        ),
    )
    doctor.add_argument(
        "--min-age",
        type=float,
        default=ORPHAN_AGE,
        metavar="SECONDS",
        help=(
            "with --fix, only pieces of an incarnation made at least this long ago, by the "
            "writing host's clock, so no save in flight is touched (default: %(default)s)"
        ),
    )


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
        self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.enabled and self.drawn and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _migrate(args: argparse.Namespace) -> int:
    """copy every run from one store to another

    Copy every run from --from to --to. Runs missing in the destination are created,
    identical ones skipped, differing ones reported as conflicts (or overwritten with
    --force). Safe to re-run after an interruption. Exit status 1 when conflicts or failures
    remain, so scripts notice an incomplete copy.
    """
    from .._migrate import migrate  # noqa: PLC0415 - only for `migrate`

    REDACT.add(args.src)
    REDACT.add(args.dst)
    if args.src.strip() == args.dst.strip():
        raise UsageError("--from and --to name the same store")
    bar = _ProgressBar(sys.stderr, args.progress or sys.stderr.isatty())
    with opened(args.src) as src, opened(args.dst) as dst:
        try:
            report = migrate(src, dst, force=args.force, dry_run=args.dry_run, progress=bar)
        finally:
            bar.close()
    code = EXIT_OK if report.complete else EXIT_ERROR
    if args.json:
        emit_json(
            {
                "from": redact_url(args.src),
                "to": redact_url(args.dst),
                "dry_run": report.dry_run,
                "total": report.total,
                "copied": report.copied,
                "overwritten": report.overwritten,
                "skipped": report.skipped,
                "conflicts": report.conflicts,
                "failed": report.failed,
                "complete": report.complete,
                "problems": [
                    {"run_id": r, "outcome": o, "detail": d} for r, o, d in report.problems
                ],
            }
        )
        return code
    shown = 20
    for run_id, outcome, detail in report.problems[:shown]:
        out(f"{outcome}: run {safe(repr(run_id))}: {safe(detail)}")
    if len(report.problems) > shown:
        out(f"... and {len(report.problems) - shown} more")
    out(
        f"{report.summary()} ({report.total} runs from {redact_url(args.src)} "
        f"to {redact_url(args.dst)})"
    )
    return code


def _init(args: argparse.Namespace) -> int:
    """create what the store needs (tables, container)"""
    config = store_config(args)
    with opened(config) as store:
        try:
            lines = store.init()
        except StorePermissionError as exc:
            if not args.json:
                out("Not allowed to create what the store needs. Provision it by hand:")
                for line in str(exc).splitlines():
                    out(f"  {line}")
                out("then check with: stepstone doctor")
            raise OperationalError(f"init: permission denied: {exc}") from exc
    if args.json:
        emit_json({"store": redact_url(config), "done": list(lines)})
        return EXIT_OK
    for line in lines:
        out(line)
    return EXIT_OK


def _collected(orphans: list[Orphan]) -> list[dict[str, Any]]:
    """What ``collect_orphans`` deleted, per run: ``{run, pieces, bytes}``."""
    runs: dict[str, dict[str, Any]] = {}
    for orphan in orphans:
        entry = runs.setdefault(orphan.run, {"run": orphan.run, "pieces": 0, "bytes": 0})
        entry["pieces"] += 1
        entry["bytes"] += orphan.size
    return list(runs.values())


def _fix(store: Store, min_age: float) -> tuple[Diagnosis, list[dict[str, Any]]]:
    from .._store import Diagnosis  # noqa: PLC0415 - when used

    if min_age < 0:
        raise UsageError(f"--min-age must be at least 0 seconds, not {min_age}")
    try:
        collected = _collected(store.collect_orphans(min_age))
    except StoreError as exc:
        return Diagnosis("collect orphaned pieces", False, f"{type(exc).__name__}: {exc}"), []
    pieces = sum(entry["pieces"] for entry in collected)
    size = sum(entry["bytes"] for entry in collected)
    detail = f"{pieces} pieces ({size} bytes) of {len(collected)} runs" if collected else "ok"
    return Diagnosis("collect orphaned pieces", True, detail), collected


def _doctor(args: argparse.Namespace) -> int:
    """check connectivity, permissions and schema"""
    from .._store import Diagnosis  # noqa: PLC0415 - when used

    config = store_config(args)
    collected: list[dict[str, Any]] = []
    try:
        with existing(config) as store:  # a typo in a path must not create a store
            results = store.doctor()
            if args.fix:
                fixed, collected = _fix(store, args.min_age)
                results.append(fixed)
    except ConfigError:
        raise
    except OperationalError as exc:  # no store there: a failing check, not a crash
        results = [Diagnosis("open the store", False, str(exc))]
    except (StoreError, OSError) as exc:
        if args.verbose:
            import traceback  # noqa: PLC0415 - only for --verbose's traceback

            print(REDACT("".join(traceback.format_exception(exc))), file=sys.stderr, end="")
        results = [Diagnosis("open the store", False, f"{type(exc).__name__}: {exc}")]
    failed = [d for d in results if not d.ok]
    code = EXIT_ERROR if failed else EXIT_OK
    if args.json:
        emit_json(
            {
                "store": redact_url(config),
                "ok": not failed,
                "checks": [{"check": d.check, "ok": d.ok, "detail": d.detail} for d in results],
                **({"collected": collected} if args.fix else {}),
            }
        )
        return code
    out(f"store: {redact_url(config)}")
    for d in results:
        detail = "" if d.ok and d.detail == "ok" else f": {safe(' '.join(d.detail.split()))}"
        out(f"{'ok' if d.ok else 'FAIL':<6}{d.check}{detail}")
    for entry in collected:
        out(f"collected run {safe(entry['run'])}: {entry['pieces']} pieces, {entry['bytes']} bytes")
    out(f"{len(results) - len(failed)} checks passed, {len(failed)} failed")
    return code
