"""The one effect of the SQL store logic, and the sync and async drivers that perform it.

Each store method (``load``, ``save``, ``delete``, listing, ``claimable``) is written
once, as a generator that yields ``Exec`` (run this statement) and receives its
``(rowcount, rows)``; an error of the statement is thrown back in at the ``yield``, so
the method decides what it means. ``drive`` performs the effects with the sync I/O
primitive, ``adrive`` awaits the async one: the pattern of ``_core.step_through``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Exec", "Plan", "Result", "adrive", "drive"]

T = TypeVar("T")
#: What a statement returns: the rows it changed and the rows it read.
Result = tuple[int, list[Any]]


@dataclass(frozen=True, slots=True)
class Exec:
    """Run one statement.

    ``save``: the statement of a save (its kill-point hooks fire around it, and a store
    with group commit batches it). ``keys``: it reads keys that may not decode as text
    (SQLite's run_id key), so read them raw.
    """

    sql: str
    params: Any = None
    save: bool = False
    keys: bool = False


#: A store method as a generator of effects, returning its result.
Plan = Generator[Exec, Result, T]


class _Steps(Generic[T]):
    """The plan's side of a driver: iterating yields effects, ``outcome`` answers each."""

    __slots__ = ("outcome", "plan", "value")

    def __init__(self, plan: Plan[T]) -> None:
        self.plan = plan
        self.outcome: Result | Exception | None = None
        self.value: T

    def __iter__(self) -> Iterator[Exec]:
        try:
            while True:
                outcome, self.outcome = self.outcome, None
                try:
                    if isinstance(outcome, Exception):
                        effect = self.plan.throw(outcome)
                    else:
                        effect = self.plan.send(outcome)  # type: ignore[arg-type]
                except StopIteration as stop:
                    self.value = stop.value
                    return
                yield effect
        finally:
            self.plan.close()


def _now(perform: Callable[[Exec], Result], effect: Exec) -> Result | Exception:
    try:
        return perform(effect)
    except Exception as exc:  # noqa: BLE001 - thrown back into the plan, which decides
        return exc


async def _later(perform: Callable[[Exec], Awaitable[Result]], effect: Exec) -> Result | Exception:
    try:
        return await perform(effect)
    except Exception as exc:  # noqa: BLE001 - thrown back into the plan, which decides
        return exc


def drive(plan: Plan[T], perform: Callable[[Exec], Result]) -> T:
    """Run ``plan`` to its end, performing each effect with ``perform``."""
    steps = _Steps(plan)
    for effect in steps:
        steps.outcome = _now(perform, effect)
    return steps.value


async def adrive(plan: Plan[T], perform: Callable[[Exec], Awaitable[Result]]) -> T:
    """``drive`` for an async ``perform``: the same plan, each effect awaited."""
    steps = _Steps(plan)
    for effect in steps:
        steps.outcome = await _later(perform, effect)
    return steps.value
