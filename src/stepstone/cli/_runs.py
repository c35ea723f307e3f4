"""``stepstone runs ...``: list, show, history, fork, rerun, delete, cancel, signal (prune
in ``_prune``, retry in ``_retry``)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._cron import RECORD as SCHEDULES_RECORD
from .._errors import CorruptCheckpoint
from .._reserved import is_reserved
from .._status import STATUSES
from ._budget import add_budget_parser, over_budget, spend_json, spend_text
from ._commands import Commands
from ._common import (
    EXIT_OK,
    add_signal_id,
    age_arg,
    existing,
    info_matches,
    infos,
    json_arg,
    newest_first,
    positive_int,
    store_config,
)
from ._output import age, emit_json, iso, out, safe, span, table, when
from ._prune import add_prune_parser
from ._retry import add_retry_parser
from ._rewind import add_rewind_parsers, runtime
from ._show import missing, show_run
from ._tail import add_tail_parser
from ._upgrade import add_upgrade_parser
from ._worker import add_start_parser

if TYPE_CHECKING:
    from .._checkpoint import Checkpoint
    from .._store import RunInfo

__all__ = ["add_parsers"]


def add_parsers(commands: Commands) -> None:
    """Add ``runs`` and its actions to the top-level ``commands``."""
    actions = commands.group(
        "runs",
        "start, list, show, retry, cancel, signal, delete and prune runs",
        dest="runs_command",
    )

    ls = actions.add("list", _list)
    ls.add_argument("--status", choices=STATUSES, help="only runs with this status")
    ls.add_argument(
        "--older-than",
        type=age_arg,
        metavar="AGE",
        help="only runs last updated before AGE ago (30d, 12h, 15m, 45s) or an ISO timestamp",
    )
    ls.add_argument(
        "--newer-than",
        type=age_arg,
        metavar="AGE",
        help="only runs last updated after AGE ago, or after an ISO timestamp",
    )
    ls.add_argument("--prefix", metavar="TEXT", help="only runs whose id starts with TEXT")
    ls.add_argument(
        "--kind",
        choices=_KINDS,
        help="only records of this kind: run (stepstone's runs) or one adapter's records",
    )
    ls.add_argument("--limit", type=positive_int, metavar="N", help="show at most N runs")
    add_budget_parser(actions, ls)  # runs budget; runs list --over-budget

    add_start_parser(actions)
    add_upgrade_parser(actions)

    actions.run("show", show_run, "show one run: status, lease, what it waits for, state")

    add_rewind_parsers(actions)

    delete = actions.run("delete", _delete)
    delete.add_argument(
        "--missing-ok", action="store_true", help="exit 0 when there is no such run"
    )

    add_prune_parser(actions)
    add_retry_parser(actions)
    add_tail_parser(actions)  # streams (issue 34)

    actions.run("cancel", _cancel)

    signal = actions.run("signal", _signal)
    signal.add_argument("name", metavar="NAME")
    signal.add_argument(
        "--data", metavar="JSON", default="null", help="the payload, as JSON (default: null)"
    )
    add_signal_id(signal, "an id that makes re-sending a no-op (exit 0, 'already delivered')")


# --- list ----------------------------------------------------------------------------


#: Record-id heads of the framework adapters' records (``maf/<workflow>/<checkpoint>``,
#: ``langgraph/<thread>/...``; ``kind:rest`` is accepted too), and the journal suffix of
#: the pydantic-ai adapter. Everything else is a stepstone run.
_ADAPTER_HEADS = ("langgraph", "maf", "openai-agents")
_JOURNAL_SUFFIX = "/pydantic-ai-journal"
_KINDS = ("run", *_ADAPTER_HEADS, "pydantic-ai", "stream", "schedules")
#: The head of a stream block's record id (``_stream._events.HEAD``), here as text so
#: that ``stepstone --help`` imports nothing of streams.
_STREAM_HEAD = "stream:"


def _kind(run_id: str) -> str:
    """Return what wrote the record: ``run`` (stepstone's runner) or an adapter's name."""
    if run_id.startswith(_STREAM_HEAD):
        return "stream"  # a block of a run's event stream (issue 34)
    if run_id == SCHEDULES_RECORD:
        return "schedules"  # issue 33: the record of the store's schedules
    for head in _ADAPTER_HEADS:
        if len(run_id) > len(head) + 1 and run_id[len(head)] in ":/" and run_id.startswith(head):
            return head
    return "pydantic-ai" if run_id.endswith(_JOURNAL_SUFFIX) else "run"


def _info_json(i: RunInfo) -> dict[str, Any]:
    return {
        "run_id": i.run_id,
        "kind": _kind(i.run_id),
        "status": i.status,
        "step": i.step,
        "completed_steps": i.step + 1,
        "total_steps": i.total_steps,
        "updated_at": iso(i.updated_at),
        "owner": i.owner,
        "due_at": iso(i.due_at),
        "version": i.version,
    }


def _due_text(info: RunInfo, now: datetime) -> str:
    """Return the DUE column: ``lease 25s``, ``in 3h``, ``now`` or ``-``."""
    due = info.due_at
    if due is None or info.status not in ("running", "waiting", "queued"):
        return "-"
    if due.tzinfo is None:
        due = due.replace(tzinfo=UTC)
    left = (due - now).total_seconds()
    if info.status == "running":
        if info.owner is None:
            return "now"  # released or never leased: the next worker claims it
        return f"lease {span(left)}" if left > 0 else f"lease expired {span(-left)} ago"
    return f"in {span(left)}" if left > 0 else "now"


def _progress(step: int, total: int | None) -> str:
    return f"{step + 1}/{'?' if total is None else total}"


#: At most this many runs are loaded to say what they wait for and which workflow they
#: run (``RunInfo`` carries neither); past that the columns show ``?`` and ``runs show``
#: tells.
_MAX_LOADS = 200


def _details(store: Any, found: list[RunInfo]) -> dict[str, Checkpoint]:
    """Return the checkpoints of the first 200 stepstone runs among ``found``."""
    loaded: dict[str, Checkpoint] = {}
    for info in [i for i in found if _kind(i.run_id) == "run"][:_MAX_LOADS]:
        try:
            cp = store.load(info.run_id)
        except CorruptCheckpoint:
            continue
        if cp is not None:
            loaded[info.run_id] = cp
    return loaded


def _workflow_text(cp: Checkpoint | None) -> str:
    if cp is None:
        return "?"
    if cp.workflow is None:
        return "-"  # run() with a list of steps: no named workflow
    version = "" if cp.workflow_version is None else f"@{cp.workflow_version}"
    return safe(f"{cp.workflow}{version}")


def _list(args: argparse.Namespace) -> int:
    """list runs, newest first

    List runs, most recently updated first, with the owner of a running run and when it is
    next due (a running run's lease end, a waiting run's wake-up).
    """
    config = store_config(args)
    with existing(config) as store:
        found = [
            i
            for i in infos(store)
            if info_matches(i, args.status, args.older_than, args.newer_than)
            and (args.prefix is None or i.run_id.startswith(args.prefix))
            and (_kind(i.run_id) == args.kind if args.kind else not is_reserved(i.run_id))
        ]
        found = newest_first(found)
        if args.limit is not None:
            found = found[: args.limit]
        loaded = _details(store, found)
    if getattr(args, "over_budget", False):  # spend budgets (``cli/_budget``)
        found = [i for i in found if over_budget(loaded.get(i.run_id))]
    spends = {k: text for k, cp in loaded.items() if (text := spend_text(cp)) is not None}
    waits = {k: cp.waiting_for for k, cp in loaded.items() if cp.status == "waiting"}
    if args.json:
        emit_json(
            [
                {
                    **_info_json(i),
                    **({"workflow": loaded[i.run_id].workflow} if i.run_id in loaded else {}),
                    **({"waiting_for": waits.get(i.run_id)} if i.status == "waiting" else {}),
                    **({"spend": spend_json(loaded[i.run_id])} if i.run_id in spends else {}),
                }
                for i in found
            ]
        )
        return EXIT_OK
    if not found:
        filtered = (
            args.status
            or args.older_than
            or args.newer_than
            or args.prefix
            or args.kind
            or getattr(args, "over_budget", False)
        )
        out("no matching runs" if filtered else "no runs")
        return EXIT_OK
    now = datetime.now(UTC)
    rows = [
        [
            safe(i.run_id),
            i.status,
            _progress(i.step, i.total_steps) if _kind(i.run_id) == "run" else "-",
            _workflow_text(loaded.get(i.run_id)) if _kind(i.run_id) == "run" else "-",
            safe(i.owner) if i.owner else "-",
            _due_text(i, now),
            when(i.updated_at),
            age(i.updated_at, now),
        ]
        for i in found
    ]
    headers = ["RUN_ID", "STATUS", "STEPS", "WORKFLOW", "OWNER", "DUE", "UPDATED", "AGE"]
    kinds = [_kind(i.run_id) for i in found]
    if any(kind != "run" for kind in kinds):
        # Records the framework adapters wrote sit beside the runs: say which is which.
        headers.insert(1, "KIND")
        for row, kind in zip(rows, kinds, strict=True):
            row.insert(1, kind)
    if waits or any(i.status == "waiting" for i in found):
        headers.append("WAITING_FOR")
        for row, info in zip(rows, found, strict=True):
            if info.status != "waiting":
                row.append("-")
            else:
                row.append(safe(waits.get(info.run_id) or "?"))
    if spends:
        headers.append("SPEND")
        for row, info in zip(rows, found, strict=True):
            row.append(safe(spends.get(info.run_id, "-")))
    for line in table(headers, rows):
        out(line)
    return EXIT_OK


# --- delete -------------------------------------------------------------------


def _delete(args: argparse.Namespace) -> int:
    """delete one run"""
    config = store_config(args)
    with existing(config) as store:
        deleted = store.delete(args.run_id)
        from .._stream import delete_stream  # noqa: PLC0415 - only when deleting

        delete_stream(store, args.run_id)  # its stream goes with it (issue 34)
    if deleted:
        if args.json:
            emit_json({"run_id": args.run_id, "deleted": True})
        else:
            out(f"deleted run {safe(repr(args.run_id))}")
        return EXIT_OK
    if args.missing_ok:
        if args.json:
            emit_json({"run_id": args.run_id, "deleted": False})
        else:
            out(f"no run {safe(repr(args.run_id))}; nothing to delete")
        return EXIT_OK
    raise missing(args.run_id, config)


# --- cancel, signal (the runtime API) ------------------------------------------------


def _status_of(result: Any) -> str | None:
    status = getattr(result, "status", None)
    return status if isinstance(status, str) else None


def _cancel(args: argparse.Namespace) -> int:
    """cancel a run: it stops at its next step boundary

    Cancel a run, whoever owns it: a queued or waiting run at once, a running one at its
    next step boundary (a step in flight that completes is saved first). Cancelling a
    finished run is an error.
    """
    cancel = runtime("cancel")
    config = store_config(args)
    with existing(config) as store:
        result = cancel(store, args.run_id)
    status = _status_of(result)
    if args.json:
        emit_json({"run_id": args.run_id, "cancel_requested": True, "status": status})
    elif status == "cancelled":
        out(f"cancelled run {safe(repr(args.run_id))}")
    else:
        tail = f" (status now {status})" if status else ""
        out(
            f"cancel requested for run {safe(repr(args.run_id))}: it stops at its next step "
            f"boundary{tail}"
        )
    return EXIT_OK


def _signal(args: argparse.Namespace) -> int:
    """send a signal to a run (e.g. an approval a WaitFor step waits for)

    Send the signal NAME with a JSON payload to a run. A run accepts signals while queued,
    running, waiting or failed. A repeated --id is a no-op, whatever its payload and
    whatever the run's state (a webhook's retry after the run finished included): it prints
    'already delivered (id ID)', exits 0 and, with --json, reports "delivered": false.
    """
    payload = json_arg(args.data, "--data", '{"approved": true}', object_only=False)
    signal = runtime("signal")
    config = store_config(args)
    with existing(config) as store:
        result = signal(store, args.run_id, args.name, payload, signal_id=args.signal_id)
        # stepstone.signal returns False for an id received before; anything else (True,
        # or None from an older runtime) is a delivery. It returns no status: read it.
        status = _status_of(result)
        if status is None:
            after = store.load(args.run_id)
            status = None if after is None else after.status
    delivered = result is not False
    if args.json:
        emit_json(
            {
                "run_id": args.run_id,
                "signal": args.name,
                "id": args.signal_id,
                "delivered": delivered,
                "status": status,
            }
        )
    elif delivered:
        tail = f" (status {status})" if status else ""
        out(f"sent signal {safe(repr(args.name))} to run {safe(repr(args.run_id))}{tail}")
    else:
        out(
            f"already delivered (id {safe(repr(args.signal_id))}): run "
            f"{safe(repr(args.run_id))} has it; nothing was recorded"
        )
    return EXIT_OK
