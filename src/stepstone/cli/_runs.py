"""``stepstone runs ...``: list, show, history, fork, rerun, delete, cancel, signal (prune
in ``_prune``, retry in ``_retry``)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from .._checkpoint import STATUSES, Checkpoint
from .._errors import CorruptCheckpoint
from .._redact import redact_url
from .._store import RunInfo
from ._budget import add_budget_parser, over_budget, spend_json, spend_text
from ._common import (
    EXIT_OK,
    OperationalError,
    UsageError,
    age_arg,
    existing,
    info_matches,
    infos,
    newest_first,
    positive_int,
    store_config,
)
from ._output import age, emit_json, iso, out, safe, safe_lines, span, table, when
from ._prune import add_prune_parser
from ._retry import add_retry_parser
from ._upgrade import add_upgrade_parser
from ._worker import add_start_parser

__all__ = ["add_parsers"]


def add_parsers(commands: Any, store: argparse.ArgumentParser, parser_class: type) -> None:
    """Add ``runs`` and its actions to the ``commands`` subparsers."""
    runs = commands.add_parser(
        "runs", help="start, list, show, retry, cancel, signal, delete and prune runs"
    )
    actions = runs.add_subparsers(dest="runs_command", metavar="ACTION", parser_class=parser_class)
    actions.required = True

    ls = actions.add_parser(
        "list",
        parents=[store],
        help="list runs, newest first",
        description=(
            "List runs, most recently updated first, with the owner of a running run and "
            "when it is next due (a running run's lease end, a waiting run's wake-up)."
        ),
    )
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
    ls.set_defaults(handler=_list)
    add_budget_parser(actions, store, ls)  # runs budget; runs list --over-budget

    add_start_parser(actions, store)
    add_upgrade_parser(actions, store)

    show = actions.add_parser(
        "show", parents=[store], help="show one run: status, lease, what it waits for, state"
    )
    show.add_argument("run_id", metavar="RUN_ID")
    show.set_defaults(handler=_show)

    hist = actions.add_parser(
        "history",
        parents=[store],
        help="list a run's kept saves (runs of Workflow(history=True))",
        description=(
            "List every kept save of a run, oldest first: step, time, attempt, status, "
            "state size and what the save changed."
        ),
    )
    hist.add_argument("run_id", metavar="RUN_ID")
    hist.set_defaults(handler=_history)

    fork = actions.add_parser(
        "fork",
        parents=[store],
        help="start a new run from the state a run had after a step",
        description=(
            "Write NEW_RUN_ID with the state RUN_ID had after step AT_STEP (-1: its input); "
            "it continues at the next step. RUN_ID is not changed."
        ),
    )
    fork.add_argument("run_id", metavar="RUN_ID")
    fork.add_argument("at_step", metavar="AT_STEP", type=int)
    fork.add_argument("new_run_id", metavar="NEW_RUN_ID")
    fork.set_defaults(handler=_fork)

    rerun = actions.add_parser(
        "rerun",
        parents=[store],
        help="rewind a run to before a step, to run it again from there",
        description=(
            "Rewind RUN_ID to the state it had before step FROM_STEP (its failure and "
            "attempts cleared), optionally updated with --patch, a JSON object."
        ),
    )
    rerun.add_argument("run_id", metavar="RUN_ID")
    rerun.add_argument("from_step", metavar="FROM_STEP", type=int)
    rerun.add_argument("--patch", metavar="JSON", help="a JSON object merged into the state")
    rerun.set_defaults(handler=_rerun)

    delete = actions.add_parser("delete", parents=[store], help="delete one run")
    delete.add_argument("run_id", metavar="RUN_ID")
    delete.add_argument(
        "--missing-ok", action="store_true", help="exit 0 when there is no such run"
    )
    delete.set_defaults(handler=_delete)

    add_prune_parser(actions, store)
    add_retry_parser(actions, store)

    cancel = actions.add_parser(
        "cancel",
        parents=[store],
        help="cancel a run: it stops at its next step boundary",
        description=(
            "Cancel a run, whoever owns it: a queued or waiting run at once, a running one "
            "at its next step boundary (a step in flight that completes is saved first). "
            "Cancelling a finished run is an error."
        ),
    )
    cancel.add_argument("run_id", metavar="RUN_ID")
    cancel.set_defaults(handler=_cancel)

    signal = actions.add_parser(
        "signal",
        parents=[store],
        help="send a signal to a run (e.g. an approval a WaitFor step waits for)",
        description=(
            "Send the signal NAME with a JSON payload to a run. A run accepts signals while "
            "queued, running, waiting or failed. A repeated --id is a no-op, whatever its "
            "payload and whatever the run's state (a webhook's retry after the run finished "
            "included): it prints 'already delivered (id ID)', exits 0 and, with --json, "
            'reports "delivered": false.'
        ),
    )
    signal.add_argument("run_id", metavar="RUN_ID")
    signal.add_argument("name", metavar="NAME")
    signal.add_argument(
        "--data", metavar="JSON", default="null", help="the payload, as JSON (default: null)"
    )
    signal.add_argument(
        "--id",
        dest="signal_id",
        metavar="ID",
        help="an id that makes re-sending a no-op (exit 0, 'already delivered')",
    )
    signal.set_defaults(handler=_signal)


# --- list ----------------------------------------------------------------------------


#: Record-id heads of the framework adapters' records (``maf/<workflow>/<checkpoint>``,
#: ``langgraph/<thread>/...``; ``kind:rest`` is accepted too), and the journal suffix of
#: the pydantic-ai adapter. Everything else is a stepstone run.
_ADAPTER_HEADS = ("langgraph", "maf", "openai-agents")
_JOURNAL_SUFFIX = "/pydantic-ai-journal"
_KINDS = ("run", *_ADAPTER_HEADS, "pydantic-ai")


def _kind(run_id: str) -> str:
    """Return what wrote the record: ``run`` (stepstone's runner) or an adapter's name."""
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
    config = store_config(args)
    with existing(config) as store:
        found = [
            i
            for i in infos(store)
            if info_matches(i, args.status, args.older_than, args.newer_than)
            and (args.prefix is None or i.run_id.startswith(args.prefix))
            and (args.kind is None or _kind(i.run_id) == args.kind)
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


# --- show ----------------------------------------------------------------------------


def _lease(cp: Checkpoint, now: datetime) -> tuple[str, bool | None]:
    """Return a sentence about the run's lease, and whether it looks live (None: no
    lease). Judged by this machine's clock against the owner's last renewal: a hint, as
    workers decide takeovers by seeing no renewal for a whole lease, not by clocks."""
    if cp.owner is None:
        return "none (no process owns the run)", None
    if cp.lease is None or cp.renewed_at is None:
        return f"held by {safe(cp.owner)} (no lease length recorded)", None
    renewed = cp.renewed_at if cp.renewed_at.tzinfo else cp.renewed_at.replace(tzinfo=UTC)
    left = (renewed - now).total_seconds() + cp.lease
    ago = span((now - renewed).total_seconds())
    if left > 0:
        return (
            f"live: held by {safe(cp.owner)}, renewed {ago} ago, expires in {span(left)} "
            f"unless renewed (lease {cp.lease:g}s)",
            True,
        )
    return (
        f"EXPIRED {span(-left)} ago: {safe(cp.owner)} last renewed it {ago} ago (lease "
        f"{cp.lease:g}s); the next worker that looks will take the run over",
        False,
    )


def _owner_lost(cp: Checkpoint, now: datetime) -> float | None:
    """Return how many seconds ago a running run's lease expired, or None if it did not."""
    if cp.status != "running" or cp.owner is None or cp.lease is None or cp.renewed_at is None:
        return None
    renewed = cp.renewed_at if cp.renewed_at.tzinfo else cp.renewed_at.replace(tzinfo=UTC)
    over = (now - renewed).total_seconds() - cp.lease
    return over if over > 0 else None


def _status_text(cp: Checkpoint, now: datetime) -> str:
    """Return the status as an operator should read it: a running run nobody runs says so."""
    text: str = cp.status
    lost = _owner_lost(cp, now)
    if lost is not None:
        text += f" (owner lost, lease expired {span(lost)} ago: a worker will take it over)"
    elif cp.status == "running" and cp.owner is None:
        text += " (no process holds it: the next worker that looks claims it)"
    return text + (" (cancel requested)" if cp.cancel_requested else "")


def _in_flight(cp: Checkpoint, now: datetime) -> tuple[int, str | None, float | None] | None:
    """Return ``(index, name, seconds)`` of the step a running run is executing, or None.

    The name is known only once that step has failed (its failure names it); the time
    is since the run's last save, which is when the previous step completed or the
    step's last attempt was counted.
    """
    if cp.status != "running":
        return None
    index = cp.step + 1
    failure = cp.failure
    name = failure.step_name if failure is not None and failure.step_index == index else None
    since = None
    if cp.updated_at is not None:
        updated = cp.updated_at if cp.updated_at.tzinfo else cp.updated_at.replace(tzinfo=UTC)
        since = max((now - updated).total_seconds(), 0.0)
    return index, name, since


def _attempt(cp: Checkpoint) -> tuple[int | None, str]:
    """Return the attempt that is running or failed on the next step, and a sentence."""
    failure = cp.failure
    failed_here = failure is not None and failure.step_index == cp.step + 1
    if cp.status == "failed" and failure is not None:
        return failure.attempt, f"{failure.attempt} (failed; see failure)"
    if cp.status == "running":
        if failed_here and failure is not None and cp.attempt <= failure.attempt:
            # A failed attempt whose retry has not begun yet: the owner waits the backoff.
            return failure.attempt, f"{failure.attempt} failed, retrying after a backoff"
        running = max(cp.attempt, 1)
        return running, f"{running} running"
    if cp.attempt:
        return cp.attempt, f"{cp.attempt} begun on the next step, none running now"
    return None, "none running"


def _checkpoint_json(cp: Checkpoint, now: datetime) -> dict[str, Any]:
    failure = cp.failure
    lease_text, live = _lease(cp, now)
    return {
        "run_id": cp.run_id,
        "status": cp.status,
        "step": cp.step,
        "completed_steps": cp.step + 1,
        "total_steps": cp.total_steps,
        "step_names": list(cp.step_names),
        "attempt": _attempt(cp)[0],
        "attempts_recorded": cp.attempt,
        "status_text": _status_text(cp, now),
        "owner_lost": _owner_lost(cp, now) is not None,
        "in_flight": None
        if (flight := _in_flight(cp, now)) is None
        else {"step_index": flight[0], "step_name": flight[1], "seconds": flight[2]},
        "failure": None
        if failure is None
        else {
            "step_index": failure.step_index,
            "step_name": failure.step_name,
            "error_type": failure.error_type,
            "message": failure.message,
            "attempt": failure.attempt,
            "at": iso(failure.at),
        },
        "created_at": iso(cp.created_at),
        "updated_at": iso(cp.updated_at),
        "version": cp.version,
        "workflow": cp.workflow,
        "workflow_version": cp.workflow_version,
        "owner": cp.owner,
        "epoch": cp.epoch,
        "lease": cp.lease,
        "renewed_at": iso(cp.renewed_at),
        "lease_live": live,
        "lease_text": lease_text,
        "cancel_requested": cp.cancel_requested,
        "waiting_for": cp.waiting_for,
        "wake_at": iso(cp.wake_at),
        "due_at": iso(cp.due_at),
        "parent": cp.parent,
        "signals": [
            {"name": s.name, "id": s.id, "payload": s.payload, "at": iso(s.at)} for s in cp.signals
        ],
        "spend": spend_json(cp),
        "input": cp.input,
        "state": cp.state,
    }


def _show(args: argparse.Namespace) -> int:
    config = store_config(args)
    with existing(config) as store:
        cp = store.load(args.run_id)
    if cp is None:
        raise _missing(args.run_id, config)
    now = datetime.now(UTC)
    if args.json:
        data = _checkpoint_json(cp, now)
        try:
            emit_json(data)
        except RecursionError:
            # Too deep for json's recursion: the stored text, as the store holds it.
            emit_json({**data, "state": None, "state_json": cp.state_json, "input": None})
        return EXIT_OK
    total = "?" if cp.total_steps is None else str(cp.total_steps)
    names = ", ".join(safe(n) for n in cp.step_names) if cp.step_names else "none yet"
    fields = [
        ("run id", safe(cp.run_id)),
        ("status", _status_text(cp, now)),
        ("progress", f"{cp.step + 1} of {total} steps completed (last completed index {cp.step})"),
        ("completed", names),
    ]
    flight = _in_flight(cp, now)
    if flight is not None:
        index, name, since = flight
        named = f" ({safe(name)})" if name else ""
        ran = "" if since is None else f", for {span(since)} since the last save"
        fields.append(("in flight", f"step {index}{named}{ran}"))
    fields.append(("attempt", _attempt(cp)[1]))
    if cp.workflow is not None:
        version = f" version {safe(cp.workflow_version)}" if cp.workflow_version else ""
        fields.append(("workflow", f"{safe(cp.workflow)}{version}"))
    if cp.parent is not None:
        fields.append(("parent", safe(cp.parent)))
    fields.append(("lease", _lease(cp, now)[0]))
    if cp.waiting_for is not None:
        wake = "" if cp.wake_at is None else f", until {when(cp.wake_at)}"
        fields.append(("waiting for", f"{safe(cp.waiting_for)}{wake}"))
    spent = spend_text(cp)
    if spent is not None:
        fields.append(("spend", safe(spent)))
    if cp.signals:
        pending = ", ".join(safe(s.name) for s in cp.signals[-5:])
        fields.append(("signals", f"{len(cp.signals)} received (latest: {pending})"))
    fields += [
        ("created", when(cp.created_at)),
        ("updated", when(cp.updated_at)),
        ("version", safe(cp.version) if cp.version else "-"),
    ]
    width = max(len(label) for label, _ in fields) + 2
    for label, value in fields:
        out(f"{label + ':':<{width}}{value}")
    failure = cp.failure
    if failure is None:
        out(f"{'failure:':<{width}}none")
    else:
        out("failure:")
        out(f"  step:     {failure.step_index} ({safe(failure.step_name)})")
        out(f"  error:    {safe(failure.error_type)}")
        out(f"  attempt:  {failure.attempt}")
        out(f"  at:       {when(failure.at)}")
        lines = safe_lines(failure.message)
        out(f"  message:  {lines[0]}")
        for line in lines[1:]:
            out(f"            {line}")
    out("state:")
    try:
        text = json.dumps(cp.state, ensure_ascii=False, indent=2)
    except RecursionError:
        text = cp.state_json or "(nested too deeply to print)"
    # json escapes C0 controls; safe() the rest (C1, bidi), line by line.
    for line in text.split("\n"):
        out(safe(line))
    return EXIT_OK


def _history(args: argparse.Namespace) -> int:
    history = _runtime("history")
    with existing(store_config(args)) as store:
        entries = history(store, args.run_id)
    if args.json:
        emit_json(
            [
                {
                    "step": e.step,
                    "step_name": e.step_names[-1] if e.step_names else None,
                    "at": iso(e.at),
                    "attempt": e.attempt,
                    "status": e.status,
                    "size": e.size,
                    "changes": list(e.changes),
                }
                for e in entries
            ]
        )
        return EXIT_OK
    rows = [
        [
            str(e.step),
            safe(e.step_names[-1]) if e.step_names else "-",
            when(e.at),
            str(e.attempt),
            e.status,
            str(e.size),
            safe(", ".join(e.changes))[:60],
        ]
        for e in entries
    ]
    for line in table(["STEP", "NAME", "AT", "ATTEMPT", "STATUS", "BYTES", "CHANGED"], rows):
        out(line)
    return EXIT_OK


def _fork(args: argparse.Namespace) -> int:
    fork = _runtime("fork")
    with existing(store_config(args)) as store:
        cp = fork(store, args.run_id, args.at_step, args.new_run_id)
    if args.json:
        emit_json({"run_id": cp.run_id, "step": cp.step, "status": cp.status})
    else:
        out(f"forked {safe(repr(args.run_id))} after step {args.at_step}: {safe(repr(cp.run_id))}")
        out(f"  {cp.status}, continues at step {cp.step + 1}")
    return EXIT_OK


def _rerun(args: argparse.Namespace) -> int:
    rerun = _runtime("rerun")
    patch = None
    if args.patch is not None:
        try:
            patch = json.loads(args.patch)
        except ValueError as exc:
            raise UsageError(f"--patch is not JSON ({exc}); give a JSON object") from None
        if not isinstance(patch, dict):
            raise UsageError(f"--patch must be a JSON object, got {type(patch).__name__}")
    with existing(store_config(args)) as store:
        cp = rerun(store, args.run_id, args.from_step, patch=patch)
    if args.json:
        emit_json({"run_id": cp.run_id, "step": cp.step, "status": cp.status})
    else:
        out(f"rewound {safe(repr(cp.run_id))}: {cp.status}, runs again from step {cp.step + 1}")
    return EXIT_OK


def _missing(run_id: str, config: str) -> OperationalError:
    return OperationalError(f"no run {run_id!r} in {redact_url(config)}")


# --- delete -------------------------------------------------------------------


def _delete(args: argparse.Namespace) -> int:
    config = store_config(args)
    with existing(config) as store:
        deleted = store.delete(args.run_id)
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
    raise _missing(args.run_id, config)


# --- cancel, signal (the runtime API) ------------------------------------------------


def _runtime(name: str) -> Any:
    """Return ``stepstone.NAME`` of the runtime API, or explain that it is missing."""
    import stepstone  # noqa: PLC0415  (the package imports this module's parent)

    found = getattr(stepstone, name, None)
    if found is None:
        raise OperationalError(
            f"this installation of stepstone has no stepstone.{name} (the runtime API); "
            "upgrade stepstone"
        )
    return found


def _status_of(result: Any) -> str | None:
    status = getattr(result, "status", None)
    return status if isinstance(status, str) else None


def _cancel(args: argparse.Namespace) -> int:
    cancel = _runtime("cancel")
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
    try:
        payload = json.loads(args.data)
    except (ValueError, RecursionError) as exc:
        raise UsageError(
            f"--data is not JSON ({exc}): e.g. --data '{{\"approved\": true}}'"
        ) from None
    signal = _runtime("signal")
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
