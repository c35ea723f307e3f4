"""``stepstone runs show``: one run's record, in words or as JSON.

What the record says besides its fields is worked out here: whether its lease is held
or lost, which step is in flight, which attempt it is on.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._redact import redact_url
from ._budget import spend_json, spend_text
from ._common import EXIT_OK, OperationalError, existing, store_config
from ._output import emit_json, iso, out, safe, safe_lines, span, when
from ._rewind import journal_lines

if TYPE_CHECKING:
    from .._checkpoint import Checkpoint

__all__ = ["missing", "show_run"]


def missing(run_id: str, config: str) -> OperationalError:
    """The error for a run that is not in the store ``config`` names."""
    return OperationalError(f"no run {run_id!r} in {redact_url(config)}")


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
    from dataclasses import asdict  # noqa: PLC0415 - when used

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
        # The failure as the checkpoint records it, its time in this output's form.
        "failure": None if failure is None else {**asdict(failure), "at": iso(failure.at)},
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
        "timing": cp.timing,  # issue 33: the run's deadline
        "signals": [
            {"name": s.name, "id": s.id, "payload": s.payload, "at": iso(s.at)} for s in cp.signals
        ],
        "spend": spend_json(cp),
        "input": cp.input,
        "state": cp.state,
    }


def show_run(args: argparse.Namespace) -> int:
    """Print one run's record (``--json``: as JSON); exit 1 if there is no such run."""
    config = store_config(args)
    with existing(config) as store:
        cp = store.load(args.run_id)
    if cp is None:
        raise missing(args.run_id, config)
    now = datetime.now(UTC)
    if args.json:
        data = _checkpoint_json(cp, now)
        try:
            emit_json(data)
        except RecursionError:
            # Too deep for json's recursion: the stored text, as the store holds it.
            emit_json({**data, "state": None, "state_json": cp.state_json, "input": None})
        return EXIT_OK
    fields = _fields(cp, now)
    width = max(len(label) for label, _ in fields) + 2
    for label, value in fields:
        out(f"{label + ':':<{width}}{value}")
    _print_failure(cp, width)
    for line in journal_lines(cp):
        out(line)
    out("state:")
    try:
        text = json.dumps(cp.state, ensure_ascii=False, indent=2)
    except RecursionError:
        text = cp.state_json or "(nested too deeply to print)"
    # json escapes C0 controls; safe() the rest (C1, bidi), line by line.
    for line in text.split("\n"):
        out(safe(line))
    return EXIT_OK


def _fields(cp: Checkpoint, now: datetime) -> list[tuple[str, str]]:
    """The labelled lines ``runs show`` prints above the failure, the journal and the state."""
    from .._deadline import describe  # noqa: PLC0415 - when used

    total = "?" if cp.total_steps is None else str(cp.total_steps)
    names = ", ".join(safe(n) for n in cp.step_names) if cp.step_names else "none yet"
    fields: list[tuple[str, str]] = [
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
    if cp.timing:  # issue 33
        fields.append(("deadline", safe(describe(cp.timing, now))))
    if cp.signals:
        pending = ", ".join(safe(s.name) for s in cp.signals[-5:])
        fields.append(("signals", f"{len(cp.signals)} received (latest: {pending})"))
    fields += [
        ("created", when(cp.created_at)),
        ("updated", when(cp.updated_at)),
        ("version", safe(cp.version) if cp.version else "-"),
    ]
    return fields


def _print_failure(cp: Checkpoint, width: int) -> None:
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
