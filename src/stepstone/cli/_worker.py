"""``stepstone worker``: serve workflows from a store until told to stop.

A thin wrapper around ``stepstone.Worker``: it loads the workflows, opens the store,
and turns SIGTERM/SIGINT into ``worker.stop()`` (stop claiming, let steps in flight
finish within the grace period, release the leases, exit 0). Steps still running after
the grace are abandoned: their runs' leases are given back and the process exits 0 at
once, without waiting for their threads. A second signal exits at once; the runs it
held are then recovered by other workers like a crashed worker's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

from .. import _lease
from ._common import EXIT_OK, OperationalError, UsageError, bounded_int, opened, seconds_arg
from ._common import store_config as _store_config
from ._output import PROG, emit_json, out, safe

__all__ = ["add_parsers", "load_workflows"]

#: Longest lease and grace period accepted: longer is a typo, and a lease that long
#: would leave a crashed worker's runs stranded for days.
MAX_LEASE_SECONDS = _lease.MAX_LEASE
MAX_CONCURRENCY = 1024


def add_parsers(commands: Any, store: argparse.ArgumentParser) -> None:
    """Add ``worker`` to the ``commands`` subparsers."""
    worker = commands.add_parser(
        "worker",
        parents=[store],
        help="claim and run queued, interrupted and due runs until stopped",
        description=(
            "Serve the workflows MODULE:ATTR names (a list or dict of stepstone.Workflow) "
            "from the store: claim queued runs, runs whose owner's lease expired and "
            "waiting runs that are due, and drive them, up to --concurrency at once. "
            "SIGTERM or SIGINT stops claiming, lets steps in flight finish within "
            "--grace, releases the leases and exits 0; steps still running after --grace "
            "are abandoned (their leases given back, to run again on another worker) and "
            "the process exits 0 without waiting for them; a second signal exits at once."
        ),
    )
    worker.add_argument(
        "--workflows",
        metavar="MODULE:ATTR",
        required=True,
        help="the workflows to serve, e.g. myapp.flows:WORKFLOWS (MODULE is imported "
        "with the working directory on sys.path)",
    )
    worker.add_argument(
        "--concurrency",
        type=bounded_int(1, MAX_CONCURRENCY, "concurrency"),
        metavar="N",
        help="runs driven at once (default: the Worker's)",
    )
    worker.add_argument(
        "--lease",
        type=seconds_arg(_lease.MIN_LEASE, MAX_LEASE_SECONDS, allow_low=True),
        metavar="SECONDS",
        help="lease length: how long a dead worker's runs wait before another worker "
        "takes them over, against how often the lease is renewed (default: the Worker's)",
    )
    worker.add_argument(
        "--grace",
        type=seconds_arg(0.0, MAX_LEASE_SECONDS, allow_low=True),
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long steps in flight may take to finish; then the "
        "process exits and the steps still running are abandoned (default: the Worker's)",
    )
    worker.set_defaults(handler=_worker)


def load_workflows(spec: str) -> list[Any]:
    """Import ``MODULE:ATTR`` and return its workflows as a list.

    Raises:
        UsageError: the spec is malformed, the module or attribute is missing, or the
            attribute is not a non-empty list, tuple or dict of ``stepstone.Workflow``.
    """
    import stepstone  # noqa: PLC0415  (the package imports this module's parent)

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--workflows {spec!r}: expected MODULE:ATTR, e.g. myapp.flows:WORKFLOWS")
    # As python -m and celery do: modules next to the operator are importable.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UsageError(
                f"--workflows {spec!r}: no module named {exc.name!r} (working directory {cwd})"
            ) from exc
        raise  # the module exists but imports something missing: its own bug
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise UsageError(f"--workflows {spec!r}: module {module_name!r} has no {attr!r}")
        value = getattr(value, part)
    items = list(value.values()) if isinstance(value, dict) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise UsageError(
            f"--workflows {spec!r} is a {type(value).__name__}; expected a non-empty list "
            "or dict of stepstone.Workflow"
        )
    workflow_type = getattr(stepstone, "Workflow", None)
    if workflow_type is not None:
        wrong = [w for w in items if not isinstance(w, workflow_type)]
        if wrong:
            raise UsageError(
                f"--workflows {spec!r} holds a {type(wrong[0]).__name__}, not a stepstone.Workflow"
            )
    return list(items)


@contextmanager
def _stop_on_signals(worker: Any) -> Iterator[list[int]]:
    """Install SIGTERM/SIGINT handlers: the first calls ``worker.stop()``, a second
    exits at once with 128 + the signal number. Yields the signals received."""
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1:
            os.write(2, f"{PROG}: second signal: exiting at once\n".encode())
            os._exit(128 + signum)
        os.write(
            2,
            f"{PROG}: {signal.Signals(signum).name}: stopping (finishing steps in flight; "
            "a second signal exits at once)\n".encode(),
        )
        worker.stop()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _worker(args: argparse.Namespace) -> int:
    workflows = load_workflows(args.workflows)
    import stepstone  # noqa: PLC0415

    worker_type = getattr(stepstone, "Worker", None)
    if worker_type is None:
        raise OperationalError(
            "this installation of stepstone has no stepstone.Worker (the runtime API); "
            "upgrade stepstone"
        )
    # Only the options given: the Worker's own defaults are the documented ones.
    options = {
        name: getattr(args, name)
        for name in ("concurrency", "lease", "grace")
        if getattr(args, name) is not None
    }
    config = _store_config(args)
    names = ", ".join(safe(getattr(w, "name", repr(w))) for w in workflows)
    with opened(config) as store:
        worker = worker_type(store, workflows, **options)
        if args.json:
            emit_json(
                {
                    "event": "serving",
                    "workflows": [getattr(w, "name", None) for w in workflows],
                    **options,
                }
            )
        else:
            out(f"{PROG} worker: serving {names} (Ctrl-C or SIGTERM to stop)")
        sys.stdout.flush()
        with _stop_on_signals(worker) as received:
            worker.serve()
        # Runs still in a step after the grace: their threads would hold the process at
        # interpreter exit (and write into a closed store). Give their leases back and
        # end the process now, the store left open: each save is durable already.
        stuck = worker.abandon(_ABANDON_TIMEOUT)
        if stuck:
            _stopped(args, received, stuck)
            _exit_now(EXIT_OK)
    _stopped(args, received, [])
    return EXIT_OK


#: Seconds the leases of abandoned runs may take to be given back before the exit.
_ABANDON_TIMEOUT = 5.0


def _stopped(args: argparse.Namespace, received: list[int], stuck: list[str]) -> None:
    if args.json:
        emit_json({"event": "stopped", "signals": len(received), "abandoned": stuck})
    elif stuck:
        shown = ", ".join(safe(repr(run_id)) for run_id in stuck[:5])
        more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
        out(
            f"{PROG} worker: stopped after the grace period, abandoning the steps in flight "
            f"of {len(stuck)} runs ({shown}{more}); other workers run them again"
        )
    else:
        out(f"{PROG} worker: stopped")


def _exit_now(code: int) -> NoReturn:
    """End the process without waiting for threads (``os._exit``), output flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
