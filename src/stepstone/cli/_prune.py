"""``stepstone runs prune``: delete (or expire) runs not updated for a while.

By default only finished runs go (done, failed, cancelled): a nightly prune must not
delete a run queued for a worker or waiting on a two-week approval. Active runs are
pruned only when ``--status`` names them, and only after a confirmation on a terminal
(``--yes`` for scripts). A prune that deletes also sweeps the store's orphaned pieces
of long states older than a day (``Store.collect_orphans``, as ``doctor --fix`` does), so
a nightly prune keeps the pieces tables from leaking what crashed deletes left.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .._bounds import ORPHAN_AGE
from .._errors import ConflictError
from .._reserved import is_reserved
from .._status import ACTIVE_STATUSES, STATUSES
from ._commands import Commands
from ._common import (
    EXIT_OK,
    OperationalError,
    UsageError,
    age_arg,
    existing,
    info_matches,
    infos,
    newest_first,
    store_config,
    ttl_arg,
)
from ._output import emit_json, iso, out, safe, when

if TYPE_CHECKING:
    from .._store import RunInfo

__all__ = ["FINISHED", "add_prune_parser"]

#: What prune deletes when ``--status`` is not given.
FINISHED = ("done", "failed", "cancelled")


def add_prune_parser(actions: Commands) -> None:
    """Add ``runs prune`` to the ``runs`` actions."""
    prune = actions.add("prune", _prune)
    prune.add_argument(
        "--older-than",
        type=age_arg,
        metavar="AGE",
        required=True,
        help="prune runs last updated before AGE ago (30d, 12h, 15m, 45s) or an ISO timestamp",
    )
    prune.add_argument(
        "--status",
        choices=STATUSES,
        action="append",
        help="only prune runs with this status; repeat for several (default: done, failed "
        "and cancelled; an active status needs a confirmation or --yes)",
    )
    prune.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    prune.add_argument(
        "--yes",
        action="store_true",
        help="prune the queued, running or waiting runs --status names without asking",
    )
    prune.add_argument(
        "--ttl",
        type=ttl_arg,
        nargs="?",
        const=1,
        default=None,
        metavar="DURATION",
        help=(
            "instead of deleting, set the store's native per-run TTL (default 1s) so the "
            "store expires them itself; only for stores with native TTL (cosmos)"
        ),
    )


def _matches(info: RunInfo, statuses: tuple[str, ...], cutoff: datetime) -> bool:
    if is_reserved(info.run_id):
        # stepstone's own records, never pruned as runs (one rule, ``_reserved``): the
        # schedules, flow control's limits, a tenant's cap and spend (status "done",
        # so an old one matched and its cap was lifted), a stream's blocks (they go
        # with their run, or as orphans below).
        return False
    return info.status in statuses and info_matches(info, None, cutoff, None)


def _confirm(active: list[RunInfo], verb: str) -> None:
    """Ask on a terminal before active runs go; refuse without one (scripts say --yes)."""
    counts = ", ".join(
        f"{sum(i.status == s for i in active)} {s}"
        for s in ACTIVE_STATUSES
        if any(i.status == s for i in active)
    )
    if not sys.stdin.isatty():
        raise UsageError(
            f"prune would {verb} {counts} run(s), which are not finished (a worker may be "
            "running them or about to): add --yes to confirm, or --dry-run to list them"
        )
    sys.stdout.flush()
    print(f"{verb} {counts} active run(s) as well? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise OperationalError(f"prune cancelled: nothing was {verb}d")


def _prune(args: argparse.Namespace) -> int:
    """delete finished runs not updated for a while

    Delete runs whose last update is older than --older-than: by default only finished ones
    (done, failed, cancelled). Queued, running or waiting runs are pruned only when --status
    names them, after a confirmation (--yes in scripts). Runs without an update time are
    never pruned. Each run is re-read just before it is deleted and deleted by
    compare-and-swap on the version read, so one that advanced meanwhile is kept.
    """
    from .._checkpoint import utcnow  # noqa: PLC0415 - when used
    from .._store import RunInfo  # noqa: PLC0415 - when used
    from .._stream import delete_stream, expire_stream, is_block  # noqa: PLC0415 - when used
    from .._stream._retention import delete_orphan_streams  # noqa: PLC0415 - when used

    config = store_config(args)
    cutoff: datetime = args.older_than
    verb = "expire" if args.ttl is not None else "delete"
    statuses: tuple[str, ...] = tuple(dict.fromkeys(args.status)) if args.status else FINISHED
    affected: list[str] = []
    kept: list[str] = []
    orphans = streams = 0
    with existing(config) as store:
        if args.ttl is not None and not store.supports_ttl:
            raise UsageError(
                f"the {store.scheme or type(store).__name__} store has no native TTL; "
                "prune without --ttl to delete the runs"
            )
        # A stream's blocks (issue 34) go with their run, never on their own age.
        listed = list(infos(store))
        candidates = newest_first([i for i in listed if _matches(i, statuses, cutoff)])
        active = [i for i in candidates if i.status in ACTIVE_STATUSES]
        if active and not args.dry_run and not args.yes:
            _confirm(active, verb)
        for info in candidates:
            if args.dry_run:
                if not args.json:
                    out(
                        f"would {verb} {safe(repr(info.run_id))} ({info.status}, "
                        f"updated {when(info.updated_at)})"
                    )
                affected.append(info.run_id)
                continue
            # Re-read, and delete by compare-and-swap on what was read: a run a worker
            # advanced since it was listed is not old any more, and is kept.
            cp = store.load(info.run_id)
            if cp is None:
                continue
            if not _matches(RunInfo.of(cp), statuses, cutoff):
                kept.append(info.run_id)
                continue
            if args.ttl is not None:
                if store.expire(info.run_id, args.ttl) is not False:
                    expire_stream(store, info.run_id, args.ttl)
                    affected.append(info.run_id)
                continue
            try:
                if store.delete(info.run_id, expected_version=cp.version):
                    delete_stream(store, info.run_id)
                    affected.append(info.run_id)
            except ConflictError:
                kept.append(info.run_id)
        if not args.dry_run and args.ttl is None:
            # Pieces no document names, of an incarnation older than a day: a crash between
            # a delete's document and its pieces left them (never a save in flight).
            orphans = len(store.collect_orphans(ORPHAN_AGE))
            # Streams whose run is gone: expired by its ttl before it rested (Cosmos DB).
            day_ago = utcnow() - timedelta(seconds=ORPHAN_AGE)
            blocks = [
                (i.run_id, i.updated_at)
                for i in listed
                if is_block(i.run_id) and i.updated_at is not None
            ]
            streams = delete_orphan_streams(store, blocks, day_ago)
    _report(args, verb, statuses, affected, kept, orphans, streams)
    return EXIT_OK


def _report(
    args: argparse.Namespace,
    verb: str,
    statuses: tuple[str, ...],
    affected: list[str],
    kept: list[str],
    orphans: int,
    streams: int = 0,
) -> None:
    """Say what prune did (or would do), as text or ``--json``."""
    cutoff: datetime = args.older_than
    count = len(affected)
    noun = "run" if count == 1 else "runs"
    which = f"{'/'.join(statuses)} {noun}" if args.status else f"{noun} (done, failed or cancelled)"
    if args.json:
        emit_json(
            {
                "action": verb,
                "dry_run": args.dry_run,
                "ttl_seconds": args.ttl,
                "cutoff": iso(cutoff),
                "statuses": list(statuses),
                "count": count,
                "run_ids": affected,
                "kept_because_changed": kept,
                "orphaned_pieces_collected": orphans,
                "orphaned_streams_deleted": streams,
            }
        )
        return
    done = {"delete": "deleted", "expire": f"set a {args.ttl}s TTL on"}[verb]
    if args.dry_run:
        out(f"dry run: would {verb} {count} {which} updated before {when(cutoff)}")
        return
    out(f"{done} {count} {which} updated before {when(cutoff)}")
    if kept:
        out(f"kept {len(kept)} that changed while pruning")
    if orphans:
        out(f"collected {orphans} orphaned piece(s) of long states older than a day")
    if streams:
        out(f"deleted the streams of {streams} run(s) no longer stored")
