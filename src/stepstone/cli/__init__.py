"""The ``stepstone`` command: run workers, inspect, signal, cancel and prune runs, and
manage stores.

One module per command group: ``_runs`` (``runs list|show|delete|cancel|signal``, with
``_prune`` and ``_retry``),
``_store_cmds`` (``init``, ``doctor``, ``migrate``), ``_worker`` (``worker``),
``_demo_bench`` (``demo``, ``bench``), ``_ui`` (``ui``, the dashboard), ``_limits``
(``limits list|show|set``, flow control); ``_common`` holds
exit codes, argument types and store opening, ``_output`` everything printed (secrets
masked, control characters escaped, ``--json``).

Exit status: 0 success; 1 an operational error (the store failed, a run is missing,
``doctor`` found a failing check, ``migrate`` left conflicts or failures); 2 a usage or
configuration error (bad option or value, bad store config string); 130 interrupted.
``runs signal`` with an ``--id`` delivered before exits 0 (nothing recorded).

Every error is one line on stderr, ``stepstone: error: ...``; ``--verbose`` adds the
traceback and debug logs. Secrets in store config strings (passwords, keys, tokens) are
replaced by ``***`` in everything printed. Every command that prints takes ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from .. import __version__
from .._errors import ConfigError, InvalidRunId, StepstoneError
from .._redact import redact_url as redact
from .._registry import DEFAULT_STORE, ENV_VAR
from . import _demo_bench, _limits, _runs, _schedules, _store_cmds, _ui, _worker
from ._commands import Commands
from ._common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    OperationalError,
    Parser,
    UsageError,
    parse_age,
)
from ._output import PROG, REDACT, emit_json, err

__all__ = ["build_parser", "main", "parse_age", "redact"]

_EPILOG = f"""\
The store is --store URL, else ${ENV_VAR}, else {DEFAULT_STORE} (in the working
directory). Forms: sqlite:///rel.db, sqlite:////abs.db, file:rel/dir, file:///abs/dir,
postgresql://USER@HOST/DB, mysql://USER@HOST/DB, cosmos://ACCOUNT-HOST/DATABASE/CONTAINER,
memory:// (this process only).

Exit status: 0 ok; 1 operational error (store failed, run missing, a doctor check
failed, migrate left conflicts or failures); 2 usage or configuration error.
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the ``stepstone`` argument parser."""
    parser = Parser(
        prog=PROG,
        description=("Run and manage stepstone workflows: durable runs that resume after a crash."),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help=f"store config string (default: ${ENV_VAR}, else {DEFAULT_STORE})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=False, help="tracebacks and debug logs"
    )
    parser.add_argument(
        "--json", action="store_true", default=False, help="print JSON, for scripts"
    )

    # Options also accepted after the subcommand; SUPPRESS keeps a value given before it.
    common = Parser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="tracebacks and debug logs",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON, for scripts"
    )
    store = Parser(add_help=False, parents=[common])
    store.add_argument(
        "--store", metavar="URL", default=argparse.SUPPRESS, help="store config string"
    )

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    group = Commands(commands, store)
    _worker.add_parsers(group)
    _runs.add_parsers(group)
    _store_cmds.add_parsers(group, common)
    _demo_bench.add_parsers(group)
    _ui.add_parsers(group)
    _schedules.add_parsers(group)  # issue 33
    _limits.add_parsers(group)  # flow control (issue 37)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``stepstone`` command with ``argv`` (default ``sys.argv[1:]``); return
    its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    REDACT.clear()
    for i, arg in enumerate(argv):
        # Mask the store strings before anything can print them, even a usage error.
        if arg in ("--store", "--from", "--to") and i + 1 < len(argv):
            REDACT.add(argv[i + 1])
        elif arg.startswith(("--store=", "--from=", "--to=")):
            REDACT.add(arg.partition("=")[2])
    REDACT.add(os.environ.get(ENV_VAR))
    verbose = any(a in ("-v", "--verbose") for a in argv)
    # Scripts that asked for JSON get their errors as JSON too (on stdout, beside the
    # usual line on stderr), whether the parser or the command failed.
    as_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
    Parser.last_error = None
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        verbose = bool(args.verbose)
        # Here, not at the top: --help and usage errors end above without logging.
        from ._logs import setup_logging  # noqa: PLC0415 - deferred: see above

        setup_logging(verbose)
        if args.command == "bench":
            return _demo_bench.run_bench(args, extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        result: int = args.handler(args)
        return result
    except SystemExit as exc:  # --help, --version and usage errors from argparse
        code = exc.code
        status = code if isinstance(code, int) else (EXIT_OK if code is None else EXIT_USAGE)
        if as_json and status != EXIT_OK and Parser.last_error is not None:
            _json_error(status, "UsageError", Parser.last_error)
        return status
    except KeyboardInterrupt:
        err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``stepstone runs list | head``): not an error worth a line.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the last resort: any failure is one line and an exit code
        code, message = _classify(exc)
        if verbose:
            import traceback  # noqa: PLC0415 - only for --verbose's traceback

            text = "".join(traceback.format_exception(exc))
            print(REDACT(text), file=sys.stderr, end="")
        elif code == EXIT_ERROR and not isinstance(exc, (OperationalError, StepstoneError)):
            message += " (run with --verbose for the traceback)"
        err(message)
        if as_json:
            _json_error(code, type(exc).__name__, message)
        return code
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()


def _json_error(code: int, kind: str, message: str) -> None:
    """Print an error as one JSON object on stdout, for a command run with ``--json``."""
    if kind in ("OperationalError", "UsageError"):
        kind = "UsageError" if code == EXIT_USAGE else "Error"
    with contextlib.suppress(OSError, ValueError):
        emit_json({"error": {"type": kind, "message": message, "exit_status": code}})


def _hint(message: str) -> str:
    """Return what to do about a few errors whose fix is not in their text."""
    lowered = message.lower()
    if "certificate" in lowered and ("verify" in lowered or "self-signed" in lowered):
        return (
            " (a self-signed certificate, e.g. a local emulator's: add verify=false to the "
            "URL, or set REQUESTS_CA_BUNDLE to its certificate)"
        )
    return ""


def _classify(exc: Exception) -> tuple[int, str]:
    """Return the exit status and message for an error that ended a command."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, OperationalError):
        return EXIT_ERROR, str(exc)
    if isinstance(exc, (ConfigError, InvalidRunId)):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, StepstoneError):
        return EXIT_ERROR, f"{type(exc).__name__}: {exc}{_hint(str(exc))}"
    if isinstance(exc, OSError):
        return EXIT_ERROR, f"{exc}"
    if isinstance(exc, RecursionError):
        return EXIT_ERROR, "the data is nested too deeply to process"
    return EXIT_ERROR, f"unexpected {type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
