"""``stepstone worker``: serve workflows from a store until told to stop.

A thin wrapper around ``stepstone.Worker``: it loads the workflows, opens the store,
and turns SIGTERM/SIGINT into ``worker.stop()`` (stop claiming, let steps in flight
finish within the grace period, release the leases, exit 0). Steps still running after
the grace are abandoned: their runs' leases are given back and the process exits 0 at
once, without waiting for their threads. A second signal exits at once; the runs it
held are then recovered by other workers like a crashed worker's.

Each run event (``stepstone._observe.EVENTS``) is one log line, at INFO (``-q``: the
warnings and errors only), or one JSON object a line on stdout with ``--json``.

``stepstone runs start`` is here too: it loads ``--workflows`` as the worker does, and
queues a run of one of them (``stepstone.start``) for a worker to run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

from .. import _bounds
from .._redact import redact_url
from ._commands import Commands
from ._common import (
    EXIT_OK,
    OperationalError,
    UsageError,
    bounded_int,
    json_arg,
    opened,
    seconds_arg,
)
from ._common import store_config as _store_config
from ._output import PROG, emit_json, json_line, out, safe

__all__ = [
    "add_parsers",
    "add_start_parser",
    "add_workflow_version",
    "add_workflows",
    "load_workflows",
]

#: Longest lease and grace period accepted: longer is a typo, and a lease that long
#: would leave a crashed worker's runs stranded for days.
MAX_LEASE_SECONDS = _bounds.MAX_LEASE
MAX_CONCURRENCY = 1024


def add_parsers(commands: Commands) -> None:
    """Add ``worker`` to the top-level ``commands``."""
    worker = commands.add("worker", _worker)
    add_workflows(
        worker,
        "the workflows to serve, e.g. myapp.flows:WORKFLOWS (MODULE is imported with the "
        "working directory on sys.path)",
    )
    worker.add_argument(
        "--concurrency",
        type=bounded_int(1, MAX_CONCURRENCY, "concurrency"),
        metavar="N",
        help="runs driven at once (default: the Worker's)",
    )
    worker.add_argument(
        "--lease",
        type=seconds_arg(_bounds.MIN_LEASE, MAX_LEASE_SECONDS, allow_low=True),
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
    worker.add_argument(
        "--max-runs",
        type=bounded_int(1, _bounds.MAX_RUNS, "max-runs"),
        metavar="N",
        help="claim N executions, let them end, then exit 0: a worker replaced after N "
        "runs, or a job that drains N (default: until stopped)",
    )
    worker.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="log only warnings and errors, not each run claimed, suspended or finished",
    )


def add_start_parser(actions: Commands) -> None:
    """Add ``start`` to the ``runs`` actions: queue a run for a worker."""
    start = actions.add("start", _start)
    start.add_argument("workflow", metavar="WORKFLOW", help="the workflow's name")
    start.add_argument("run_id", metavar="RUN_ID")
    add_workflows(start, "where the workflow is defined, as for `stepstone worker`")
    add_workflow_version(
        start, "the workflow's version, when MODULE:ATTR holds more than one of its name"
    )
    start.add_argument(
        "--input",
        metavar="JSON",
        default="{}",
        help="the run's input, a JSON object, e.g. '{\"order\": 42}' (default: {})",
    )


def add_workflows(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    """Add the required ``--workflows MODULE:ATTR``: what ``load_workflows`` imports."""
    parser.add_argument("--workflows", metavar="MODULE:ATTR", required=True, help=help_text)


def add_workflow_version(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    """Add ``--workflow-version VERSION``: which of the workflows of one name."""
    parser.add_argument("--workflow-version", metavar="VERSION", default=None, help=help_text)


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
    import signal  # noqa: PLC0415 - when used

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
    """claim and run queued, interrupted and due runs until stopped

    Serve the workflows MODULE:ATTR names (a list or dict of stepstone.Workflow) from the
    store: claim queued runs, runs whose owner's lease expired and waiting runs that are
    due, and drive them, up to --concurrency at once. SIGTERM or SIGINT stops claiming, lets
    steps in flight finish within --grace, releases the leases and exits 0; steps still
    running after --grace are abandoned (their leases given back, to run again on another
    worker) and the process exits 0 without waiting for them; a second signal exits at once.
    Each run event (claimed, taken over, suspended, finished, failed, lease lost) is one
    line on stderr; -q keeps only warnings and errors; --json prints each event as one JSON
    object per line on stdout.
    """
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
        for name in ("concurrency", "lease", "grace", "max_runs")
        if getattr(args, name) is not None
    }
    config = _store_config(args)
    from ._logs import log_events  # noqa: PLC0415 - when used (logging)

    log_events(args)
    names = ", ".join(safe(getattr(w, "name", repr(w))) for w in workflows)
    with opened(config) as store:
        worker = worker_type(store, workflows, **options)
        # The handlers first: once the line is out, a SIGINT or SIGTERM is a graceful stop.
        with _stop_on_signals(worker) as received:
            if args.json:
                json_line(
                    {
                        "event": "serving",
                        "store": redact_url(config),
                        "workflows": [getattr(w, "name", None) for w in workflows],
                        **options,
                    }
                )
            else:
                # The default store depends on the working directory: say which one this is.
                out(
                    f"{PROG} worker: serving {names} from {safe(redact_url(config))} (Ctrl-C or "
                    "SIGTERM to stop)"
                )
            sys.stdout.flush()
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
        json_line({"event": "stopped", "signals": len(received), "abandoned": stuck})
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


# --- the run events' lines ----------------------------------------------------------------


# --- runs start ---------------------------------------------------------------------------


def _pick(workflows: list[Any], name: str, version: str | None, spec: str) -> Any:
    """Return the workflow named ``name`` (and ``version``) among ``workflows``."""
    named = [w for w in workflows if w.name == name]
    if version is not None:
        named = [w for w in named if w.version == version]
    if not named:
        known = ", ".join(sorted({safe(repr(w.name)) for w in workflows}))
        wanted = f"{name!r}" + ("" if version is None else f" version {version!r}")
        raise UsageError(f"--workflows {spec!r} has no workflow {wanted}; it has {known}")
    versions = {w.version for w in named}
    if len(versions) > 1:
        shown = ", ".join(sorted(repr(v) for v in versions))
        raise UsageError(
            f"--workflows {spec!r} has workflow {name!r} in versions {shown}: "
            "say which with --workflow-version"
        )
    return named[0]


def _start(args: argparse.Namespace) -> int:
    """queue a run of a workflow for a worker (as stepstone.start)

    Record a new run RUN_ID of WORKFLOW (a name among the workflows MODULE:ATTR names) as
    queued, with --input as its input, for `stepstone worker` to run.
    """
    from .._observe import escape  # noqa: PLC0415 - when used

    workflows = load_workflows(args.workflows)
    workflow = _pick(workflows, args.workflow, args.workflow_version, args.workflows)
    payload = json_arg(args.input, "--input", '{"order": 42}')
    import stepstone  # noqa: PLC0415  (the package imports this module's parent)

    config = _store_config(args)
    with opened(config) as store:
        existing = store.load(args.run_id)  # a bad run id fails here: InvalidRunId, exit 2
        if existing is not None:
            raise OperationalError(
                f"run {args.run_id!r} exists already (status {existing.status}): pick another "
                f"RUN_ID, or see it with `{PROG} runs show {args.run_id}`"
            )
        info = stepstone.start(store, workflow, args.run_id, payload)
    if args.json:
        emit_json(
            {
                "run_id": info.run_id,
                "workflow": workflow.name,
                "version": workflow.version,
                "status": info.status,
            }
        )
    else:
        version = "" if workflow.version is None else f" version {escape(workflow.version)}"
        out(
            f"queued run {escape(info.run_id)} of workflow {escape(workflow.name)}{version} "
            f"in {safe(redact_url(config))} (status {info.status}): a worker serving it runs "
            f"it, e.g. {PROG} worker --workflows {safe(args.workflows)}"
        )
    return EXIT_OK
