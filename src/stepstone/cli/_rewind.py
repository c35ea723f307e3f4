"""``stepstone runs history|journal|fork|rerun``: a run's past, and starting again from it.

``history`` lists a run's kept saves (``Workflow(history=True)``); ``journal`` lists a
code workflow run's journaled calls. ``fork`` and ``rerun`` take a step index, or, for
a code workflow's run, a journaled call's name (``revise#3``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import InvalidWorkflow
from ._commands import Commands
from ._common import (
    EXIT_OK,
    OperationalError,
    existing,
    json_arg,
    store_config,
)
from ._output import emit_json, iso, out, safe, table, when

if TYPE_CHECKING:
    from .._checkpoint import Checkpoint

__all__ = ["add_rewind_parsers", "journal_lines", "runtime"]


def runtime(name: str) -> Any:
    """Return ``stepstone.NAME`` of the runtime API, or explain that it is missing."""
    import stepstone  # noqa: PLC0415  (the package imports this module's parent)

    found = getattr(stepstone, name, None)
    if found is None:
        raise OperationalError(
            f"this installation of stepstone has no stepstone.{name} (the runtime API); "
            "upgrade stepstone"
        )
    return found


def _step_or_call(text: str) -> int | str:
    """A step index (an int), or else a journaled call's name (``revise#3``)."""
    try:
        return int(text)
    except ValueError:
        if "#" not in text:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither a step index nor a journaled call (NAME#N, e.g. revise#3)"
            ) from None
        return text


def add_rewind_parsers(actions: Commands) -> None:
    """Add ``history``, ``journal``, ``fork`` and ``rerun`` to ``stepstone runs``."""
    actions.run("history", _history)

    actions.run("journal", _journal)

    fork = actions.run("fork", _fork)
    fork.add_argument("at_step", metavar="AT_STEP", type=_step_or_call)
    fork.add_argument("new_run_id", metavar="NEW_RUN_ID")

    rerun = actions.run("rerun", _rerun)
    rerun.add_argument("from_step", metavar="FROM_STEP", type=_step_or_call)
    rerun.add_argument("--patch", metavar="JSON", help="a JSON object merged into the state")


def _listing(
    args: argparse.Namespace,
    name: str,
    record: Callable[[Any], dict[str, Any]],
    headers: list[str],
    rows: Callable[[list[Any]], list[list[str]]],
) -> int:
    """Print the entries the runtime's ``name`` (``history``, ``journal``) lists for the
    run: one JSON record each with --json, else a table."""
    lister = runtime(name)
    with existing(store_config(args)) as store:
        entries = lister(store, args.run_id)
    if args.json:
        emit_json([record(e) for e in entries])
    else:
        for line in table(headers, rows(entries)):
            out(line)
    return EXIT_OK


def _history(args: argparse.Namespace) -> int:
    """list a run's kept saves (runs of Workflow(history=True))

    List every kept save of a run, oldest first: step, time, attempt, status, state size and
    what the save changed.
    """
    return _listing(args, "history", _save_json, _SAVE_HEADERS, _save_rows)


def _save_json(e: Any) -> dict[str, Any]:
    return {
        "step": e.step,
        "step_name": e.step_names[-1] if e.step_names else None,
        "at": iso(e.at),
        "attempt": e.attempt,
        "status": e.status,
        "size": e.size,
        "changes": list(e.changes),
    }


def _save_rows(entries: list[Any]) -> list[list[str]]:
    return [
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


_SAVE_HEADERS = ["STEP", "NAME", "AT", "ATTEMPT", "STATUS", "BYTES", "CHANGED"]


def _rows(entries: list[Any]) -> list[list[str]]:
    return [
        [
            str(e.seq),
            safe(e.call),
            str(e.attempt),
            when(e.at) if e.at is not None else "-",
            str(e.size),
            "ok" if e.error_type is None else f"failed: {safe(e.error_type)}",
        ]
        for e in entries
    ]


_HEADERS = ["SEQ", "CALL", "ATTEMPT", "AT", "BYTES", "OUTCOME"]


def journal_lines(cp: Checkpoint) -> list[str]:
    """The journal section of ``runs show`` for a code workflow's run (none for others)."""
    from .._code_history import entries_of  # noqa: PLC0415 - the runtime, only when used

    try:
        entries = entries_of(cp.run_id, cp.state)
    except InvalidWorkflow as exc:
        return [f"journal:  malformed ({safe(str(exc))[:200]})"]
    if not entries:
        return []
    return [
        f"journal:  {len(entries)} calls",
        *(f"  {line}" for line in table(_HEADERS, _rows(entries))),
    ]


def _journal(args: argparse.Namespace) -> int:
    """list a code workflow run's journaled calls

    List the journaled calls of a run of a @workflow function, in call order: position, call
    (NAME#N), attempts, when it ended, bytes and outcome.
    """
    return _listing(args, "journal", _call_json, _HEADERS, _rows)


#: A journaled call's fields in ``runs journal --json``, in this order.
_CALL_FIELDS = ("seq", "call", "name", "ordinal", "attempt", "at", "size", "error_type")


def _call_json(e: Any) -> dict[str, Any]:
    record = {field: getattr(e, field) for field in _CALL_FIELDS}
    record["at"] = iso(e.at)  # in its place: replacing a key keeps the order
    return record


def _fork(args: argparse.Namespace) -> int:
    """start a new run from the state a run had after a step (or a journaled call)

    Write NEW_RUN_ID with the state RUN_ID had after step AT_STEP (-1: its input); it
    continues at the next step. For a code workflow's run, AT_STEP may be a journaled call
    (revise#2): the new run keeps the calls up to it. RUN_ID is not changed.
    """
    fork = runtime("fork")
    with existing(store_config(args)) as store:
        cp = fork(store, args.run_id, args.at_step, args.new_run_id)
    if args.json:
        emit_json({"run_id": cp.run_id, "step": cp.step, "status": cp.status})
    elif isinstance(args.at_step, str):
        new = safe(repr(cp.run_id))
        out(f"forked {safe(repr(args.run_id))} after call {safe(args.at_step)}: {new}")
        out(f"  {cp.status}, the calls after it run again")
    else:
        out(f"forked {safe(repr(args.run_id))} after step {args.at_step}: {safe(repr(cp.run_id))}")
        out(f"  {cp.status}, continues at step {cp.step + 1}")
    return EXIT_OK


def _rerun(args: argparse.Namespace) -> int:
    """rewind a run to before a step (or a journaled call), to run it again from there

    Rewind RUN_ID to the state it had before step FROM_STEP (its failure and attempts
    cleared), optionally updated with --patch, a JSON object. For a code workflow's run,
    FROM_STEP may be a journaled call (revise#3): it and every later call run again.
    """
    rerun = runtime("rerun")
    patch = None if args.patch is None else json_arg(args.patch, "--patch", '{"amount": 40}')
    with existing(store_config(args)) as store:
        cp = rerun(store, args.run_id, args.from_step, patch=patch)
    if args.json:
        emit_json({"run_id": cp.run_id, "step": cp.step, "status": cp.status})
    elif isinstance(args.from_step, str):
        call = safe(args.from_step)
        out(f"rewound {safe(repr(cp.run_id))}: {cp.status}, runs again from call {call}")
    else:
        out(f"rewound {safe(repr(cp.run_id))}: {cp.status}, runs again from step {cp.step + 1}")
    return EXIT_OK
