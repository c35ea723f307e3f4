"""``stepstone demo`` and ``stepstone bench``."""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import Any

from .._redact import redact_url
from .._registry import DEFAULT_STORE
from ._commands import Commands
from ._common import EXIT_OK, OperationalError, UsageError, opened, store_config
from ._output import emit_json

__all__ = ["add_parsers", "command_name", "run_bench"]


def add_parsers(commands: Commands) -> None:
    """Add ``demo`` and ``bench`` to the top-level ``commands``."""
    demo = commands.add("demo", _demo)
    demo.add_argument(
        "--approval",
        action="store_true",
        help="instead: a run that drafts a reply, waits for a person's approval (a signal), "
        "then sends it",
    )
    demo.add_argument(
        "--manual",
        action="store_true",
        help="with --approval: stop while the run waits, and print the commands to approve "
        "and resume it",
    )
    # ``main`` hands ``bench`` its options unparsed (``run_bench``): no handler, no -h.
    commands.add("bench", None, "benchmark a store (options: bench --help)", add_help=False)


def command_name() -> str:
    """Return how to run this ``stepstone`` from the working directory.

    ``stepstone`` when that name on PATH is this installation's script; else the script
    itself (``.venv/bin/stepstone`` after ``./scripts/demo``), relative when it lies
    below the working directory; else ``python -m stepstone``.
    """
    import shutil  # noqa: PLC0415 - when used
    from pathlib import Path  # noqa: PLC0415 - when used

    script = Path(sys.executable).parent / "stepstone"
    found = shutil.which("stepstone")
    if found is not None and script.exists() and os.path.samefile(found, script):
        return "stepstone"
    if script.exists():
        relative = os.path.relpath(script)
        return relative if not relative.startswith("..") else str(script)
    if found is not None:
        return "stepstone"
    return f"{sys.executable} -m stepstone"


def _demo(args: argparse.Namespace) -> int:
    """watch a run survive its process being killed

    Run a 4-step workflow in a child process that kills itself during step 2, then resume
    the same run in a fresh process. Uses the store as usual (default
    sqlite:///stepstone.db in the working directory); a new run id each time.
    """
    config = store_config(args)
    if config.strip().lower().startswith("memory:"):
        raise UsageError(
            "the demo needs a store shared between processes; memory:// lives in one "
            f"process only. Try --store {DEFAULT_STORE}"
        )
    with opened(config):
        pass  # fail early, in this process, on a bad config string or store
    option = "" if args.store is None else f" --store {redact_url(config)}"
    report: dict[str, Any] = {}
    if args.manual and not args.approval:
        raise UsageError("--manual goes with --approval")
    if args.approval:
        from .._demo import run_approval_demo  # noqa: PLC0415 - only for `demo`

        code = run_approval_demo(
            config,
            io.StringIO() if args.json else sys.stdout,
            shown_store=redact_url(config),
            store_option=option,
            command=command_name(),
            manual=args.manual,
            report=report,
        )
        if args.json:
            emit_json(report)
        return code
    try:
        from .._demo import run_demo  # noqa: PLC0415 - only for `demo`

        code = run_demo(
            config,
            io.StringIO() if args.json else sys.stdout,
            shown_store=redact_url(config),
            store_option=option,
            verbose=args.verbose,
            command=command_name(),
            report=report,
        )
    except RuntimeError as exc:
        raise OperationalError(str(exc)) from exc
    if args.json:
        emit_json(report)
    return code


def run_bench(args: argparse.Namespace, extra: list[str]) -> int:
    """Run ``stepstone bench`` with the options ``bench`` itself parses."""
    import importlib.util  # noqa: PLC0415 - when used

    if importlib.util.find_spec("stepstone._bench") is None:
        raise OperationalError(
            "the benchmark is not available in this installation (no stepstone._bench module)"
        )
    module = importlib.import_module("stepstone._bench")
    entry = getattr(module, "main", None)
    if not callable(entry):
        raise OperationalError("stepstone._bench has no main(argv) function")
    argv = list(extra)
    if args.json:
        argv.append("--json")
    if args.store is not None:
        argv = ["--store", args.store, *argv]
    result = entry(argv)
    return result if isinstance(result, int) else EXIT_OK
