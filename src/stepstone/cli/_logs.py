"""The CLI's logging: one redacted line per record on stderr; more with ``--verbose``.

Set up once a command has parsed (``main``), so that ``--help`` and usage errors do not
import ``logging``.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .._observe import RunEvent
from ._output import PROG, REDACT, json_line

__all__ = ["log_events", "setup_logging"]


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return REDACT(super().format(record))


def setup_logging(verbose: bool) -> None:
    """Send stepstone's records (and noisy drivers', with ``verbose`` only) to stderr."""
    logger = logging.getLogger("stepstone")
    handler = logging.StreamHandler(sys.stderr)
    if verbose:
        handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.setLevel(logging.DEBUG)
    else:
        handler.setFormatter(_RedactingFormatter(f"{PROG}: %(levelname)s: %(message)s"))
        logger.setLevel(logging.WARNING)
    logger.handlers[:] = [handler]
    logger.propagate = False
    # Drivers' own warnings (urllib3's InsecureRequestWarning for an emulator with
    # verify=false, azure-identity's long credential-chain report) would break the
    # one-line error promise; they go through the same redacting handler, and only
    # with --verbose.
    logging.captureWarnings(True)
    for name in ("py.warnings", "azure", "urllib3"):
        noisy = logging.getLogger(name)
        noisy.handlers[:] = [handler]
        noisy.propagate = False
        noisy.setLevel(logging.DEBUG if verbose else logging.CRITICAL)


# --- the worker's run events ------------------------------------------------------------


class _EventLines(logging.Handler):
    """Prints each run event (a record carrying ``stepstone_event``) as a JSON line."""

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "stepstone_event", None)
        if isinstance(event, RunEvent):
            try:
                json_line(event.as_json())
            except (OSError, ValueError):  # stdout closed: the worker goes on
                self.handleError(record)


def _is_event(record: logging.LogRecord) -> bool:
    return isinstance(getattr(record, "stepstone_event", None), RunEvent)


def _event_or_warning(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or _is_event(record)


def _json_elsewhere(record: logging.LogRecord) -> bool:
    """Keep on stderr the warnings and errors that are not events (those are JSON)."""
    return record.levelno >= logging.WARNING and not _is_event(record)


def log_events(args: argparse.Namespace) -> None:
    """Log each run event at INFO (``-q``: warnings and errors only); ``--json``: as
    JSON lines on stdout, the other log lines staying on stderr."""
    logger = logging.getLogger("stepstone")
    if not args.verbose:  # --verbose: every record on stderr already, events among them
        logger.setLevel(logging.WARNING if args.quiet else logging.INFO)
        for handler in logger.handlers:
            # One line per run event: the engine's own INFO lines (starting, waiting
            # for, done after) say the same things again; its warnings and errors stay.
            handler.addFilter(_json_elsewhere if args.json else _event_or_warning)
    if args.json:
        logger.addHandler(_EventLines())
