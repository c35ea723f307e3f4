"""``stepstone runs budget``: raise a run's spend budget; spend in ``runs list``/``show``.

Raising is the signal ``budget.raise`` (``stepstone._budget``): stored in the run by
compare-and-swap, so a repeated ``--id`` is a no-op, and a run paused at its limit is
due at once for a worker (or the next ``run`` call) to resume.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from ._commands import Commands
from ._common import (
    EXIT_OK,
    OperationalError,
    UsageError,
    add_signal_id,
    existing,
    positive_int,
    store_config,
)
from ._output import emit_json, out, safe

if TYPE_CHECKING:
    from .._budget import Spend
    from .._checkpoint import Checkpoint

__all__ = ["add_budget_parser", "over_budget", "spend_json", "spend_text"]


def add_budget_parser(actions: Commands, ls: Any) -> None:
    """Add ``runs budget`` to the ``runs`` actions and ``--over-budget`` to ``runs list``."""
    budget = actions.run("budget", _budget)
    budget.add_argument("--raise-usd", type=_dollars, metavar="USD", help="dollars to add")
    budget.add_argument(
        "--raise-tokens", type=positive_int, metavar="N", help="tokens to add to the limit"
    )
    add_signal_id(budget, "an id that makes re-sending a no-op")
    ls.add_argument(
        "--over-budget",
        action="store_true",
        help="only runs whose confirmed plus unconfirmed spend reached a hard limit",
    )


def _dollars(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"dollars must be a finite number > 0, got {text!r}")
    return value


def spend_json(cp: Checkpoint) -> dict[str, Any] | None:
    """The run's spend as ``runs show --json`` and ``runs list --json`` give it, or None."""
    spend = _spend(cp)
    return None if spend is None else spend.to_json()


def _spend(cp: Checkpoint) -> Spend | None:
    from .._budget import spend_of  # noqa: PLC0415  (the runtime, only when used)

    try:
        spend = spend_of(cp)
    except Exception:  # noqa: BLE001 - a malformed ledger is shown as none, never a crash
        return None
    if (
        spend.limit_usd is None
        and spend.limit_tokens is None
        and not spend.by_step
        and not spend.unconfirmed
        and not spend.children_usd
        and not spend.children_tokens
        and not spend.paused
    ):
        return None
    return spend


def spend_text(cp: Checkpoint) -> str | None:
    """One line of spend for ``runs show`` and the SPEND column of ``runs list``."""
    spend = _spend(cp)
    return None if spend is None else spend.text()


def over_budget(cp: Checkpoint | None) -> bool:
    """Whether the run's spend reached a hard limit (``runs list --over-budget``)."""
    spend = None if cp is None else _spend(cp)
    return spend is not None and spend.over


def _budget(args: argparse.Namespace) -> int:
    """raise a run's spend budget (resumes a run paused at its limit)

    Raise RUN_ID's spend budget by --raise-usd dollars and/or --raise-tokens tokens. A run
    paused at its hard limit (waiting for budget.raise) is due at once: a worker, or the
    next run call, resumes it. Without --raise-* it prints the run's spend. A repeated --id
    is a no-op.
    """
    from .._budget import RAISE_SIGNAL  # noqa: PLC0415  (the runtime, only when used)
    from .._control import signal  # noqa: PLC0415  (the runtime, only when used)

    payload: dict[str, Any] = {}
    if args.raise_usd is not None:
        payload["usd"] = args.raise_usd
    if args.raise_tokens is not None:
        payload["tokens"] = args.raise_tokens
    if not payload and args.signal_id is not None:
        raise UsageError("--id needs --raise-usd or --raise-tokens")
    with existing(store_config(args)) as store:
        delivered = None
        if payload:
            delivered = signal(store, args.run_id, RAISE_SIGNAL, payload, signal_id=args.signal_id)
        cp = store.load(args.run_id)
    if cp is None:
        raise OperationalError(f"no run {args.run_id!r} in this store")
    if args.json:
        emit_json(
            {
                "run_id": cp.run_id,
                "status": cp.status,
                "raised": payload or None,
                "delivered": delivered,
                "spend": spend_json(cp),
            }
        )
        return EXIT_OK
    if delivered is True:
        out(f"raised the budget of run {safe(repr(cp.run_id))} by {_raised_text(payload)}")
    elif delivered is False:
        out(f"already raised (id {safe(repr(args.signal_id))}); nothing was recorded")
    out(f"status: {cp.status}")
    out(f"spend:  {spend_text(cp) or 'no budget, nothing charged'}")
    return EXIT_OK


def _raised_text(payload: dict[str, Any]) -> str:
    parts = []
    if "usd" in payload:
        parts.append(f"${payload['usd']:g}")
    if "tokens" in payload:
        parts.append(f"{payload['tokens']} tokens")
    return " and ".join(parts)
