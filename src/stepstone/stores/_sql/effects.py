"""The one effect of the SQL store logic, and the sync and async drivers that perform it.

Each store method (``load``, ``save``, ``delete``, listing, ``claimable``) is written
once, as a generator that yields ``Exec`` (run this statement) and receives its
``(rowcount, rows)``; an error of the statement is thrown back in at the ``yield``, so
the method decides what it means. ``drive`` performs the effects with the sync I/O
primitive, ``adrive`` awaits the async one: the pattern of ``_core.step_through``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple, TypeVar

__all__ = ["Exec", "Plan", "Result", "adrive", "drive"]

T = TypeVar("T")
#: What a statement returns: the rows it changed and the rows it read.
Result = tuple[int, list[Any]]


class Exec(NamedTuple):
    """Run one statement.

    ``save``: the statement of a save (its kill-point hooks fire around it, and a store
    with group commit batches it). ``keys``: it reads keys that may not decode as text
    (SQLite's run_id key), so read them raw. ``first``: with ``save``, the statements
    (sql, params) of the save's pieces, run in the save's own transaction (before it;
    on PostgreSQL after it, each inserting only if it landed), so they land only if its
    compare-and-swap does, with its one commit. A NamedTuple, not
    a frozen dataclass: one is made per statement, on every save and load, and a tuple
    is the cheapest record.
    """

    sql: str
    params: Any = None
    save: bool = False
    keys: bool = False
    first: tuple[tuple[str, Any], ...] = ()


#: A store method as a generator of effects, returning its result.
Plan = Generator[Exec, Result, T]


# The drivers are written out flat, not through a shared iterator: they run on every
# store call, and each layer of calls between the plan and the I/O is paid per statement.


def drive(plan: Plan[T], perform: Callable[[Exec], Result]) -> T:
    """Run ``plan`` to its end, performing each effect with ``perform``.

    An error of ``perform`` is thrown into the plan at its ``yield``: the plan decides
    what it means (a conflict peek, a salvage) or lets it propagate.
    """
    try:
        effect = plan.send(None)  # type: ignore[arg-type]
        while True:
            try:
                result = perform(effect)
            except Exception as exc:  # noqa: BLE001 - thrown back into the plan, which decides
                effect = plan.throw(exc)
            else:
                effect = plan.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value
    except BaseException:
        plan.close()  # a finished plan needs no close; one cut short by an error does
        raise


async def adrive(plan: Plan[T], perform: Callable[[Exec], Awaitable[Result]]) -> T:
    """``drive`` for an async ``perform``: the same plan, each effect awaited."""
    try:
        effect = plan.send(None)  # type: ignore[arg-type]
        while True:
            try:
                result = await perform(effect)
            except Exception as exc:  # noqa: BLE001 - thrown back into the plan, which decides
                effect = plan.throw(exc)
            else:
                effect = plan.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value
    except BaseException:
        plan.close()  # a finished plan needs no close; one cut short by an error does
        raise
