"""PostgreSQL's save of a long state: one transaction, one round trip (psycopg's pipeline).

``BEGIN``, the swap, the pieces and ``COMMIT`` are sent together. Each piece is inserted
only if the run's row holds the save's new version (``PieceSQL.insert_landed``), so the
transaction can commit without the client waiting for the swap's answer, and a lost
swap commits nothing. Where libpq has no pipeline mode (before libpq 14) the same
statements go one round trip each. An error leaves the transaction open or aborted:
the caller rolls it back (``ServerStore._abandon``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from ... import _hooks
from .._group import Pending
from .connections import Pieces

__all__ = ["asave_pieces", "save_many", "save_pieces"]

#: Called once a round trip (the store's request count).
Counter = Callable[[], None]


@functools.cache
def _pipelines(is_async: bool) -> bool:
    """Whether this libpq has pipeline mode."""
    import psycopg  # noqa: PLC0415 - only a PostgreSQL store gets here

    return bool((psycopg.AsyncPipeline if is_async else psycopg.Pipeline).is_supported())


def _fire(index: int, last: int) -> None:
    """The chaos points after the statement at ``index`` (1: the swap; last: COMMIT)."""
    if 1 < index < last - 1:
        _hooks.fire("pieces.piece")  # a kill between two pieces of a save
    elif index == last - 1:
        _hooks.fire("pieces.piece")
        _hooks.fire("pieces.written")  # all sent but COMMIT: nothing committed


def _sends(
    cursor: Any, swap: Any, sql: str, params: Any, first: Pieces, pipelined: bool, count: Counter
) -> Iterator[tuple[Any, str, Any]]:
    """Yield each statement of the save with the cursor to run it on; both saves' one rule.

    The swap runs on ``swap``, whose rowcount says whether it landed. Each round trip is
    counted, and the chaos points fire once the statement before them has run.
    """
    statements = [("BEGIN", None), (sql, params), *first, ("COMMIT", None)]
    last = len(statements) - 1
    if pipelined:
        count()  # one round trip for all of them
    for index, (statement, values) in enumerate(statements):
        if not pipelined:
            count()
        yield (swap if index == 1 else cursor), statement, values
        _fire(index, last)


def save_pieces(
    conn: Any, cursor: Any, sql: str, params: Any, first: Pieces, count: Counter
) -> int:
    """Run the save (``sql``) and its pieces in one transaction; return its rowcount."""
    swap, pipelined = conn.cursor(), _pipelines(False)
    with conn.pipeline() if pipelined else contextlib.nullcontext():
        for target, statement, values in _sends(cursor, swap, sql, params, first, pipelined, count):
            target.execute(statement, values)
    return int(swap.rowcount)


async def asave_pieces(
    conn: Any, cursor: Any, sql: str, params: Any, first: Pieces, count: Counter
) -> int:
    """Async ``save_pieces``."""
    swap, pipelined = conn.cursor(), _pipelines(True)
    async with conn.pipeline() if pipelined else contextlib.nullcontext():
        for target, statement, values in _sends(cursor, swap, sql, params, first, pipelined, count):
            await target.execute(statement, values)
    return int(swap.rowcount)


def save_many(conn: Any, cursor: Any, items: list[Pending], count: Counter) -> None:
    """Run several saves, each with its pieces, in ONE transaction and one round trip.

    ``Store.save_many`` on PostgreSQL: ``BEGIN``, each save's swap (on a cursor of its
    own, whose rowcount says whether it landed) and its pieces (each inserted only if
    that swap landed), ``COMMIT``. A lost swap writes nothing and fails its save alone;
    a statement's error aborts the transaction, and the caller fails every save of it
    (``ServerStore._abandon`` rolls it back). Sets each item's ``stored``.
    """
    pipelined = _pipelines(False)
    swaps = [conn.cursor() for _ in items]
    statements: list[tuple[Any, str, Any]] = [(cursor, "BEGIN", None)]
    for swap, item in zip(swaps, items, strict=True):
        statements.append((swap, item.sql, item.params))
        statements.extend((cursor, statement, values) for statement, values in item.first)
    statements.append((cursor, "COMMIT", None))
    if pipelined:
        count()  # one round trip for all of them
    with conn.pipeline() if pipelined else contextlib.nullcontext():
        for target, statement, values in statements:
            if not pipelined:
                count()
            target.execute(statement, values)
    for swap, item in zip(swaps, items, strict=True):
        item.stored = int(swap.rowcount)
        swap.close()
