"""The SDK calls a store rule asks for (effects), and the sync and async drivers.

Each store rule (a load, a save, a query, the container set-up) is written once, as a
generator that yields these effects and is sent their results; an SDK exception is
thrown back in at the ``yield``, so the rule's own ``try`` and its error translation
see it. :func:`drive` performs the effects with plain calls on the sync SDK,
:func:`adrive` awaits them on ``azure.cosmos.aio``: the only places that differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from ._errors import UnexpectedSdkError, is_known
from ._meter import Meter

__all__ = [
    "OPEN",
    "Effect",
    "Enter",
    "Gather",
    "Open",
    "Query",
    "Send",
    "Sleep",
    "Steps",
    "adrive",
    "aperform",
    "drive",
    "perform",
    "sdk_call",
]

T = TypeVar("T")


class Effect:
    """Something a store rule asks its driver to do."""

    __slots__ = ()


class Open(Effect):
    """Open the store (client, database and container, checked); the result: the container."""

    __slots__ = ()


OPEN: Final = Open()


@dataclass(frozen=True, slots=True)
class Send(Effect):
    """Call ``target.method(*args, **kwargs)`` (awaited on the aio SDK); ``saving``: a save."""

    target: Any
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    saving: bool = False

    def start(self) -> Any:
        """Make the call: its result on the sync SDK, an awaitable on the aio one."""
        return getattr(self.target, self.method)(*self.args, **self.kwargs)


@dataclass(frozen=True, slots=True)
class Query(Effect):
    """Run a query on ``container`` and read every page; the result: the rows."""

    container: Any
    query: str
    parameters: list[dict[str, Any]] | None
    timeout: float

    def rows(self, **options: Any) -> Any:
        """Start the query: an iterable of rows (an async one on the aio SDK)."""
        return self.container.query_items(
            self.query, parameters=self.parameters, timeout=self.timeout, **options
        )


@dataclass(frozen=True, slots=True)
class Gather(Effect):
    """Perform each of ``effects`` (concurrently where async); the result: their results.

    ``settle``: an effect's exception is its result (each one performed) instead of
    being raised at once.
    """

    effects: tuple[Effect, ...]
    settle: bool = False


@dataclass(frozen=True, slots=True)
class Sleep(Effect):
    """Wait ``seconds`` (``asyncio.sleep`` on the aio SDK): a short back-off between reads."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Enter(Effect):
    """Enter an aio client (its account read); nothing to do on the sync SDK."""

    client: Any


Steps = Generator[Effect, Any, T]


@contextlib.contextmanager
def sdk_call(meter: Meter, saving: bool = False) -> Iterator[None]:
    """Mark an SDK call for the meter; an exception no error-table row names is wrapped.

    So the rule's translation turns it into a ``StoreError`` instead of letting a bare
    exception out of the store.
    """
    with meter.calling(saving):
        try:
            yield
        except Exception as exc:
            if is_known(exc):
                raise
            raise UnexpectedSdkError(exc) from exc


def _next(gen: Steps[T], result: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Resume ``gen`` with a result or an error: (True, its return) or (False, an effect)."""
    try:
        return False, (gen.send(result) if error is None else gen.throw(error))
    except StopIteration as stop:
        return True, stop.value


Outcome = tuple[Any, Exception | None]


def _attempt(run: Callable[[Effect], Any], effect: Effect) -> Outcome:
    try:
        return run(effect), None
    except Exception as exc:  # noqa: BLE001 - thrown back in: the rule decides
        return None, exc


async def _aattempt(run: Callable[[Effect], Awaitable[Any]], effect: Effect) -> Outcome:
    try:
        return await run(effect), None
    except Exception as exc:  # noqa: BLE001 - thrown back in: the rule decides
        return None, exc


def drive(gen: Steps[T], run: Callable[[Effect], Any]) -> T:
    """Run a rule to its end, performing each effect with ``run``; return its result."""
    with contextlib.closing(gen):
        outcome: Outcome = (None, None)
        while not (step := _next(gen, *outcome))[0]:
            outcome = _attempt(run, step[1])
        return step[1]  # type: ignore[no-any-return]


async def adrive(gen: Steps[T], run: Callable[[Effect], Awaitable[Any]]) -> T:
    """``drive`` for an async ``run``: the same loop, each effect awaited."""
    with contextlib.closing(gen):
        outcome: Outcome = (None, None)
        while not (step := _next(gen, *outcome))[0]:
            outcome = await _aattempt(run, step[1])
        return step[1]  # type: ignore[no-any-return]


def perform(effect: Effect, meter: Meter, open_: Callable[[], Any]) -> Any:
    """Perform one effect on the sync SDK."""
    if isinstance(effect, Open):
        return open_()
    if isinstance(effect, Gather):
        if not effect.settle:
            return [perform(each, meter, open_) for each in effect.effects]
        results: list[Any] = []
        for each in effect.effects:
            try:
                results.append(perform(each, meter, open_))
            except Exception as exc:  # noqa: BLE001 - settled: the rule looks at each
                results.append(exc)
        return results
    if isinstance(effect, Sleep):
        time.sleep(effect.seconds)
        return None
    with sdk_call(meter, _saving(effect)):
        if isinstance(effect, Query):
            return list(effect.rows(enable_cross_partition_query=True))
        return effect.start() if isinstance(effect, Send) else None  # Enter: nothing to do


async def aperform(effect: Effect, meter: Meter, open_: Callable[[], Awaitable[Any]]) -> Any:
    """Perform one effect on the aio SDK."""
    if isinstance(effect, Open):
        return await open_()
    if isinstance(effect, Gather):
        # Each in its own task, which marks itself for the meter (a task is a caller).
        return await asyncio.gather(
            *(aperform(each, meter, open_) for each in effect.effects),
            return_exceptions=effect.settle,
        )
    if isinstance(effect, Sleep):
        await asyncio.sleep(effect.seconds)
        return None
    with sdk_call(meter, _saving(effect)):
        if isinstance(effect, Query):
            return [row async for row in effect.rows()]
        return await (effect.start() if isinstance(effect, Send) else _enter(effect))


def _saving(effect: Effect) -> bool:
    return isinstance(effect, Send) and effect.saving


def _enter(effect: Effect) -> Awaitable[Any]:
    if not isinstance(effect, Enter):
        raise TypeError(f"not a Cosmos effect: {effect!r}")
    return effect.client.__aenter__()  # type: ignore[no-any-return]
