"""Effects and drivers: each adapter rule is written once and run on sync or async I/O.

A rule is a generator that yields the store operations it needs (``Load``, ``Save``,
``Delete``, ``Scan``) and receives each result, or has the store's exception thrown in,
so the rule decides what an error means; ``Emit`` hands one item to the caller of a
listing. ``iterate`` runs a rule on a store's sync methods and ``aiterate`` on its async
ones; ``drive`` / ``adrive`` return what the rule returns. The shape is the engine's own
(``stepstone._effects.step_through`` / ``astep_through``); only each effect's
``perform`` / ``aperform``, the store call itself, exists twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from .._checkpoint import Checkpoint
from .._errors import StoreUnavailable
from .._store import Store

__all__ = [
    "Delete",
    "Effect",
    "Emit",
    "Load",
    "Rule",
    "Save",
    "SaveMany",
    "Scan",
    "adrive",
    "aiterate",
    "asave",
    "drive",
    "iterate",
    "save",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Load:
    """Load the record ``key``; the result is the ``Checkpoint`` or None."""

    key: str

    def perform(self, store: Store) -> Checkpoint | None:
        return store.load(self.key)

    async def aperform(self, store: Store) -> Checkpoint | None:
        return await store.aload(self.key)


@dataclass(frozen=True, slots=True)
class Save:
    """Save ``checkpoint`` (a compare-and-swap); the result is the stored ``Checkpoint``."""

    checkpoint: Checkpoint

    def perform(self, store: Store) -> Checkpoint:
        return save(store, self.checkpoint)

    async def aperform(self, store: Store) -> Checkpoint:
        return await asave(store, self.checkpoint)


def save(store: Store, checkpoint: Checkpoint) -> Checkpoint:
    """``store.save``, once more with the same object if its answer may have been lost.

    A ``StoreUnavailable`` save may have landed (a timeout after COMMIT). Saved again,
    the same object is recognised by the built-in stores as that save's retry: its
    success if the first write landed, else it is written now; a conflict only if
    another writer came between. A second failure is raised.
    """
    try:
        return store.save(checkpoint)
    except StoreUnavailable:
        return store.save(checkpoint)


async def asave(store: Store, checkpoint: Checkpoint) -> Checkpoint:
    """Async ``save``: ``store.asave``, once more with the same object after a lost answer."""
    try:
        return await store.asave(checkpoint)
    except StoreUnavailable:
        return await store.asave(checkpoint)


@dataclass(frozen=True, slots=True)
class SaveMany:
    """Save each of ``checkpoints`` (``Store.save_many``: one commit where the store can);
    the result is each one's outcome, the stored ``Checkpoint`` or the exception."""

    checkpoints: tuple[Checkpoint, ...]

    def perform(self, store: Store) -> list[Checkpoint | Exception]:
        outcomes = store.save_many(self.checkpoints)
        # A lost answer, as ``save``: the same object once more, alone.
        for n, outcome in enumerate(outcomes):
            if isinstance(outcome, StoreUnavailable):
                try:
                    outcomes[n] = store.save(self.checkpoints[n])
                except Exception as exc:  # noqa: BLE001 - that save's outcome
                    outcomes[n] = exc
        return outcomes

    async def aperform(self, store: Store) -> list[Checkpoint | Exception]:
        outcomes = await store.asave_many(self.checkpoints)
        for n, outcome in enumerate(outcomes):
            if isinstance(outcome, StoreUnavailable):
                try:
                    outcomes[n] = await store.asave(self.checkpoints[n])
                except Exception as exc:  # noqa: BLE001 - that save's outcome
                    outcomes[n] = exc
        return outcomes


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the record ``key`` (at ``version`` if given); the result is whether it was."""

    key: str
    version: str | None = None

    def perform(self, store: Store) -> bool:
        return store.delete(self.key, expected_version=self.version)

    async def aperform(self, store: Store) -> bool:
        return await store.adelete(self.key, expected_version=self.version)


@dataclass(frozen=True, slots=True)
class Scan:
    """List the ids of the store's records that start with ``prefix``."""

    prefix: str

    def perform(self, store: Store) -> list[str]:
        return [r for r in store.list_runs() if r.startswith(self.prefix)]

    async def aperform(self, store: Store) -> list[str]:
        return [r async for r in store.alist_runs() if r.startswith(self.prefix)]


@dataclass(frozen=True, slots=True)
class Emit:
    """Hand ``item`` to whoever iterates the rule; the rule resumes with None."""

    item: Any


Effect: TypeAlias = Load | Save | SaveMany | Delete | Scan | Emit
#: A rule: yields effects, receives their results, returns ``T``.
Rule: TypeAlias = Generator[Effect, Any, T]


@dataclass(frozen=True, slots=True)
class _Return:
    """The rule's return value, the last thing a driver's iteration yields."""

    value: Any


class _Cursor:
    """Where a driver is in a rule: what to send in next, or what to throw in.

    Both drivers are this cursor plus the one line that performs an effect.
    """

    __slots__ = ("error", "result", "rule")

    def __init__(self, rule: Rule[Any]) -> None:
        self.rule = rule
        self.result: Any = None
        self.error: Exception | None = None

    def next(self) -> Effect | _Return:
        """Resume the rule with the last result (or error); its next effect or its end."""
        try:
            if self.error is None:
                return self.rule.send(self.result)
            return self.rule.throw(self.error)
        except StopIteration as stop:
            return _Return(stop.value)
        finally:
            self.result = self.error = None

    def failed(self, exc: Exception) -> None:
        """Throw ``exc`` (the store's) into the rule next: the rule decides what it means."""
        self.error = exc


def _steps(store: Store, rule: Rule[Any]) -> Iterator[Any]:
    """Run ``rule`` on the sync store methods; yield its items, then its ``_Return``."""
    cursor = _Cursor(rule)
    with contextlib.closing(rule):
        while not isinstance(effect := cursor.next(), _Return):
            if isinstance(effect, Emit):
                yield effect.item
                continue
            try:
                cursor.result = effect.perform(store)
            except Exception as exc:  # noqa: BLE001 - thrown into the rule, which decides
                cursor.failed(exc)
        yield effect


async def _asteps(store: Store, rule: Rule[Any]) -> AsyncIterator[Any]:
    """``_steps`` on the store's async methods."""
    cursor = _Cursor(rule)
    with contextlib.closing(rule):
        while not isinstance(effect := cursor.next(), _Return):
            if not isinstance(effect, Emit):
                try:
                    cursor.result = await effect.aperform(store)
                except Exception as exc:  # noqa: BLE001 - thrown into the rule, which decides
                    cursor.failed(exc)
            else:
                yield effect.item
        yield effect


def iterate(store: Store, rule: Rule[Any]) -> Iterator[Any]:
    """Yield what ``rule`` emits, running its effects on ``store``'s sync methods."""
    # Drained to the end (the _Return is skipped), so the rule is closed here.
    for item in _steps(store, rule):
        if not isinstance(item, _Return):
            yield item


async def aiterate(store: Store, rule: Rule[Any]) -> AsyncIterator[Any]:
    """``iterate`` on the store's async methods."""
    async for item in _asteps(store, rule):
        if not isinstance(item, _Return):
            yield item


def drive(store: Store, rule: Rule[T]) -> T:
    """Run ``rule`` to its end on ``store``'s sync methods; return what it returns."""
    result: Any = None
    for item in _steps(store, rule):
        if isinstance(item, _Return):
            result = item.value
    return result  # type: ignore[no-any-return]


async def adrive(store: Store, rule: Rule[T]) -> T:
    """``drive`` on the store's async methods."""
    result: Any = None
    async for item in _asteps(store, rule):
        if isinstance(item, _Return):
            result = item.value
    return result  # type: ignore[no-any-return]
