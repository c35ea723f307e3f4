"""``stepstone limits list|show|set``: see and change flow-control limits at run time.

Limits are records in the store (``stepstone._flow``), so a change made here holds for
every worker at its next acquisition, with no restart: ``set`` changes only the values
it is given (``--unset`` removes one) and keeps who holds the key.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .._flow_policy import POLICIES
from ._commands import Commands
from ._common import EXIT_OK, OperationalError, existing, opened, store_config
from ._output import emit_json, iso, out, safe, table

if TYPE_CHECKING:
    from .._flow import Limit

__all__ = ["add_parsers"]

_FIELDS = ("concurrency", "rpm", "tpm", "requests", "tokens", "per", "policy")


def add_parsers(commands: Commands) -> None:
    """Add ``limits`` (``list``, ``show``, ``set``) to the top-level ``commands``."""
    actions = commands.group(
        "limits",
        "see and change flow-control limits (concurrency, request and token rates)",
        "Limits are stored records: what you set here holds for every worker at its "
        "next acquisition.",
    )
    actions.add("list", _list)
    show = actions.add("show", _show)
    show.add_argument("key")
    put = actions.add("set", _set)
    put.add_argument("key")
    put.add_argument("--concurrency", type=int, help="most holders at once")
    put.add_argument("--rpm", type=float, help="requests per minute")
    put.add_argument("--tpm", type=float, help="tokens per minute")
    put.add_argument("--requests", type=float, help="requests per --per seconds")
    put.add_argument("--tokens", type=float, help="tokens per --per seconds")
    put.add_argument("--per", type=float, help="the window of --requests and --tokens, seconds")
    put.add_argument("--policy", choices=POLICIES, help="when full: queue (wait) or reject")
    put.add_argument(
        "--unset",
        action="append",
        choices=_FIELDS[:-1],
        default=[],
        metavar="FIELD",
        help=f"remove a value ({', '.join(_FIELDS[:-1])}); repeatable",
    )


def _row(limit: Limit) -> dict[str, Any]:
    return {"key": limit.key, **limit.config(), "updated_at": iso(limit.updated_at)}


def _list(args: argparse.Namespace) -> int:
    """list the limits"""
    from .._flow import list_limits  # noqa: PLC0415 - when used (asyncio)

    with existing(store_config(args)) as store:
        found = list_limits(store)
    if getattr(args, "json", False):
        emit_json([_row(limit) for limit in found])
        return EXIT_OK
    if not found:
        out("no limits")
        return EXIT_OK
    for line in table(["KEY", "LIMITS"], [[safe(limit.key), limit.describe()] for limit in found]):
        out(line)
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    """show a limit, who holds it and who waits for it"""
    from .._flow import limit_usage  # noqa: PLC0415 - when used (asyncio)

    with existing(store_config(args)) as store:
        usage = limit_usage(store, args.key)
    if usage is None:
        raise OperationalError(f"no limit {args.key!r} (`stepstone limits set` creates one)")
    blocked = iso(usage.blocked_until)
    if getattr(args, "json", False):
        emit_json(
            {
                **_row(usage.limit),
                "holders": usage.holders,
                "waiters": usage.waiters,
                "lapsed": list(usage.lapsed),
                "blocked_until": blocked,
            }
        )
        return EXIT_OK
    out(f"key:      {safe(usage.limit.key)}")
    out(f"limits:   {usage.limit.describe()}")
    holders = [f"{safe(r)}" + (" (kept for it)" if e < 0 else "") for r, e in usage.holders.items()]
    out(f"holders:  {len(usage.holders)}" + (f": {', '.join(holders)}" if holders else ""))
    out(
        f"waiters:  {len(usage.waiters)}"
        + (f": {', '.join(map(safe, usage.waiters))}" if usage.waiters else "")
    )
    if usage.lapsed:
        out(f"lapsed:   {len(usage.lapsed)} (their runs gave their lease back; free to take)")
    if blocked is not None:
        out(f"blocked until {blocked} (a rate-limit answer)")
    return EXIT_OK


def _set(args: argparse.Namespace) -> int:
    """create a limit or change its values (the others are kept)"""
    from .._flow import Limit, get_limit, set_limit  # noqa: PLC0415 - when used (asyncio)

    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name) is not None}
    with opened(store_config(args)) as store:
        current = get_limit(store, args.key)
        values: dict[str, Any] = {} if current is None else current.config()
        values.update(given)
        for name in args.unset:
            values[name] = None
        limit = Limit(args.key, **{k: v for k, v in values.items() if v is not None})
        saved = set_limit(store, limit)
    if getattr(args, "json", False):
        emit_json(_row(saved))
    else:
        out(f"{safe(saved.key)}: {saved.describe()}")
    return EXIT_OK
