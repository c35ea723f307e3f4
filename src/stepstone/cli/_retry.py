"""``stepstone runs retry``: queue a failed, parked or cancelled run again."""

from __future__ import annotations

import argparse

from ._commands import Commands
from ._common import EXIT_OK, existing, store_config
from ._output import emit_json, out, safe

__all__ = ["add_retry_parser"]


def add_retry_parser(actions: Commands) -> None:
    """Add ``runs retry`` to the ``runs`` actions."""
    retry = actions.run("retry", _retry)
    retry.add_argument(
        "--version",
        dest="expected_version",
        metavar="VERSION",
        help="act only if the run is still at this version (compare-and-swap)",
    )


def _retry(args: argparse.Namespace) -> int:
    """queue a failed (or parked, or cancelled) run again for a worker

    Queue RUN_ID again from its last checkpoint, with a fresh attempt budget: a worker
    serving its workflow claims it and runs its next step (the failed one). Only failed runs
    (those parked by a worker as WorkflowChanged included) and cancelled ones can be
    retried. With --version (the version `runs show` printed) nothing is done if the run
    changed since.
    """
    from .._control import retry  # noqa: PLC0415  (the runtime, only when used)

    with existing(store_config(args)) as store:
        info = retry(store, args.run_id, expected_version=args.expected_version)
    if args.json:
        emit_json(
            {
                "run_id": info.run_id,
                "status": info.status,
                "step": info.step,
                "version": info.version,
            }
        )
    else:
        out(
            f"queued run {safe(repr(info.run_id))} again: a worker serving its workflow "
            f"runs it from step {info.step + 1} (version now {safe(info.version)})"
        )
    return EXIT_OK
