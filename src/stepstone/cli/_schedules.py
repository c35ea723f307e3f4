"""``stepstone schedules add|list|show|pause|resume|delete|backfill``: cron schedules.

A schedule is stored in the store (``stepstone.schedule``); workers serving its workflow
fire its slots. ``add`` and ``backfill`` import the workflow (``--workflows
MODULE:ATTR``, as ``stepstone worker`` does), so an unknown workflow is refused before
anything is stored.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from ._commands import Commands
from ._common import EXIT_OK, existing, json_arg, opened, store_config
from ._output import emit_json, iso, out, safe, table, when
from ._worker import add_workflow_version, add_workflows

__all__ = ["add_parsers"]


def add_parsers(commands: Commands) -> None:
    """Add ``schedules`` and its actions."""
    actions = commands.group(
        "schedules",
        "cron schedules: add, list, show, pause, resume, delete, backfill",
        "Schedules fire runs of a workflow at cron times, each slot exactly once "
        "(run id sched/NAME/SLOT-TIME-UTC), from any worker serving the workflow.",
    )
    add = actions.add("add", _add)
    add.add_argument("name", metavar="NAME")
    add.add_argument("--cron", required=True, help="five fields, e.g. '0 7 * * *'")
    add.add_argument("--workflow", required=True, metavar="WORKFLOW", help="the workflow's name")
    add_workflows(add, "where it is")
    add_workflow_version(add)
    add.add_argument("--tz", default="UTC", help="IANA time zone of the cron fields (UTC)")
    add.add_argument("--input", metavar="JSON", default="{}", help="the runs' input object")
    add.add_argument(
        "--overlap",
        default="skip",
        choices=("skip", "buffer_one", "allow", "cancel_previous"),
        help="while the previous slot's run is active (default: skip)",
    )
    add.add_argument(
        "--catchup",
        default="latest",
        choices=("latest", "all"),
        help="slots missed while no worker looked (default: latest)",
    )
    add.add_argument("--paused", action="store_true", help="store it paused")
    add.add_argument("--replace", action="store_true", help="change a schedule of that name")
    actions.add("list", _list)
    for action, text in (
        ("show", "show one schedule"),
        ("pause", "stop firing a schedule's slots"),
        ("resume", "fire a schedule's slots again, from the next one"),
        ("delete", "delete a schedule (its runs stay)"),
    ):
        sub = actions.add(action, _one, text)
        sub.add_argument("name", metavar="NAME")
        sub.set_defaults(action_name=action)
    backfill = actions.add("backfill", _backfill)
    backfill.add_argument("name", metavar="NAME")
    backfill.add_argument("--start", required=True, type=_instant, help="ISO time, e.g. 2030-01-01")
    backfill.add_argument("--end", required=True, type=_instant, help="ISO time (inclusive)")
    add_workflows(backfill)


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO time: e.g. 2030-01-01 or 2030-01-01T07:00+01:00"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _workflow(spec: str, name: str, version: str | None) -> Any:
    from ._worker import _pick, load_workflows  # noqa: PLC0415 - imports the user's module

    return _pick(load_workflows(spec), name, version, spec)


def _row(info: Any) -> dict[str, Any]:
    return {
        "name": info.name,
        "cron": info.cron,
        "tz": info.tz,
        "workflow": info.workflow,
        "workflow_version": info.workflow_version,
        "input": info.input,
        "overlap": info.overlap,
        "catchup": info.catchup,
        "paused": info.paused,
        "next_fire": iso(info.next_fire),
        "last_fired": iso(info.last_fired),
        "last_run": info.last_run,
        "pending": list(info.pending),
        "buffered": info.buffered,
        "fired": info.fired,
        "skipped": info.skipped,
    }


def _add(args: argparse.Namespace) -> int:
    """store a schedule"""
    from .._observe import escape  # noqa: PLC0415 - when used
    from .._schedule import schedule  # noqa: PLC0415 - the runtime, only when used

    flow = _workflow(args.workflows, args.workflow, args.workflow_version)
    payload = json_arg(args.input, "--input", '{"team": 7}')
    with opened(store_config(args)) as store:
        info = schedule(
            store,
            args.name,
            cron=args.cron,
            workflow=flow,
            tz=args.tz,
            input=payload,
            overlap=args.overlap,
            catchup=args.catchup,
            paused=args.paused,
            replace=args.replace,
        )
    if args.json:
        emit_json(_row(info))
    else:
        out(
            f"schedule {escape(info.name)}: {escape(info.cron)} ({escape(info.tz)}), workflow "
            f"{escape(info.workflow)}; next slot {when(info.next_fire)}"
            + (" (paused)" if info.paused else "")
        )
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    """list the schedules"""
    from .._schedule import schedules  # noqa: PLC0415

    with existing(store_config(args)) as store:
        found = schedules(store)
    if args.json:
        emit_json([_row(i) for i in found])
        return EXIT_OK
    if not found:
        out("no schedules")
        return EXIT_OK
    rows = [
        [
            safe(i.name),
            safe(i.cron),
            safe(i.tz),
            safe(i.workflow),
            "paused" if i.paused else when(i.next_fire),
            str(i.fired),
            str(i.skipped),
        ]
        for i in found
    ]
    for line in table(["NAME", "CRON", "TZ", "WORKFLOW", "NEXT", "FIRED", "SKIPPED"], rows):
        out(line)
    return EXIT_OK


def _one(args: argparse.Namespace) -> int:
    from .. import _schedule  # noqa: PLC0415
    from .._observe import escape  # noqa: PLC0415 - when used

    with existing(store_config(args)) as store:
        if args.action_name == "show":
            found = {i.name: i for i in _schedule.schedules(store)}
            if args.name not in found:
                raise _schedule.ScheduleNotFound(f"no schedule is named {args.name!r}")
            info = found[args.name]
        else:
            act = {
                "pause": _schedule.pause_schedule,
                "resume": _schedule.resume_schedule,
                "delete": _schedule.delete_schedule,
            }[args.action_name]
            info = act(store, args.name)
    if args.json:
        emit_json({**_row(info), "action": args.action_name})
        return EXIT_OK
    if args.action_name != "show":
        out(f"schedule {escape(info.name)}: {args.action_name}d")
        return EXIT_OK
    for key, value in _row(info).items():
        out(f"{key:>17}: {safe(value if isinstance(value, str) else json.dumps(value))}")
    return EXIT_OK


def _backfill(args: argparse.Namespace) -> int:
    """start the slots of a past window that have no run"""
    from .. import _schedule  # noqa: PLC0415
    from .._observe import escape  # noqa: PLC0415 - when used
    from .._schedule_fire import backfill  # noqa: PLC0415

    with existing(store_config(args)) as store:
        found = {i.name: i for i in _schedule.schedules(store)}
        if args.name not in found:
            raise _schedule.ScheduleNotFound(f"no schedule is named {args.name!r}")
        info = found[args.name]
        flow = _workflow(args.workflows, info.workflow, info.workflow_version)
        run_ids = backfill(store, args.name, flow, args.start, args.end)
    if args.json:
        emit_json({"name": args.name, "run_ids": run_ids})
    else:
        out(f"schedule {escape(args.name)}: {len(run_ids)} slots in the window have a run")
        for run_id in run_ids:
            out(f"  {escape(run_id)}")
    return EXIT_OK
