"""The one effect of the SQL store logic, and the sync and async drivers that perform it.

Each store method (``load``, ``save``, ``delete``, listing, ``claimable``) is written
once, as a generator that yields ``Exec`` (run this statement) and receives its
``(rowcount, rows)``; an error of the statement is thrown back in at the ``yield``, so
the method decides what it means. ``drive`` performs the effects with the sync I/O
primitive, ``adrive`` awaits the async one: they are ``_effects.step_through`` and
``astep_through``, the loops that drive the core.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NamedTuple, TypeVar

from ..._effects import astep_through, step_through

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


# The drivers are the core's (``_effects``): one loop for every rule written as a generator.
drive = step_through
adrive = astep_through
