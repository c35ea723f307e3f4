"""What the run's core asks its drivers to do (``Effect``), and the two loops that do it.

The core (``_core.execute``) and every other rule written as a generator (``start``,
``cancel``, ``signal``, a suspending step's bookkeeping, the worker's claims) yields
these effects and is sent their results. ``step_through`` performs them with plain
calls, ``astep_through`` with awaits: the only places where sync and async differ.

A leaf module: it imports nothing of the engine but the checkpoint, so every module
above it (the steps, the core, the drivers, the control operations) may import it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol, TypeVar

from ._checkpoint import Checkpoint

__all__ = [
    "Announce",
    "Call",
    "Callee",
    "Effect",
    "Load",
    "Pause",
    "Renewing",
    "Save",
    "State",
    "Together",
    "astep_through",
    "step_through",
]

State = dict[str, Any]
# The drivers are generic in the effect and the result, so that every rule written as a
# generator (the core's, and the SQL stores' statements) is driven by these two loops.
E = TypeVar("E")
R = TypeVar("R")


class Callee(Protocol):
    """What a driver needs of the step it calls (``Step`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def is_async(self) -> bool: ...


class Effect:
    """Something the core asks its driver to do."""

    __slots__ = ()


class Load(Effect):
    """Load ``run_id``'s checkpoint; the result is a ``Checkpoint`` or None."""

    __slots__ = ("run_id",)

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


class Save(Effect):
    """Save ``cp`` (compare-and-swap); the result is the stored ``Checkpoint``.

    ``owned`` saves are the run's own; the driver records the result as the latest
    record the run holds (the one to release if the run is interrupted).
    """

    __slots__ = ("cp", "owned", "what")

    def __init__(self, cp: Checkpoint, what: str, owned: bool = True) -> None:
        self.cp = cp
        self.what = what
        self.owned = owned


class Together(Effect):
    """Perform ``effects`` (each a ``Load``, or a ``Save`` that is not ``owned``) at once.

    The result is one value per effect, in order: its result, or the exception it
    raised (every one is performed). The sync driver runs them on a small shared thread
    pool, the async one gathers them: a Map makes and reads its children this way, so a
    store that groups concurrent commits (SQLite) or a server that flushes concurrent
    commits together (PostgreSQL, MySQL) pays one flush for many children.
    """

    __slots__ = ("effects",)

    def __init__(self, effects: list[Load | Save]) -> None:
        for effect in effects:
            if isinstance(effect, Save) and effect.owned:
                raise ValueError("Together performs Load and unowned Save effects only")
        self.effects = effects


class Call(Effect):
    """Call ``step.fn`` on ``state`` (and ``ctx``, if given); the result is what it returned.

    While the step runs the driver renews the lease on ``base`` when it has to, and
    keeps ``Plan.current`` at the latest record; a lost lease is thrown back in as
    ``LeaseLost`` once the step has returned. ``ctx`` is the ``StepContext`` passed as
    the step's second argument, or None.
    """

    __slots__ = ("base", "ctx", "state", "step")

    def __init__(self, step: Callee, state: State, ctx: object | None, base: Checkpoint) -> None:
        self.step = step
        self.state = state
        self.ctx = ctx
        self.base = base


class Renewing(Effect):
    """Perform the effects of ``gen`` while renewing the lease as during a step.

    For a suspending step's own bookkeeping (a ``Map`` loading or creating thousands of
    child records), which may take longer than the lease. The result is what ``gen``
    returns; its errors are thrown back in as they are, and a lost lease as
    ``LeaseLost`` once ``gen`` has ended. ``gen`` itself makes no owned save.
    """

    __slots__ = ("gen",)

    def __init__(self, gen: Generator[Effect, Any, Any]) -> None:
        self.gen = gen


class Pause(Effect):
    """Wait ``seconds`` (a retry's backoff, or watching a lease), renewing ``base``'s lease."""

    __slots__ = ("base", "seconds")

    def __init__(self, seconds: float, base: Checkpoint | None) -> None:
        self.seconds = seconds
        self.base = base


class Announce(Effect):
    """Tell the workers sharing the store that there is work (``_wake.announce``).

    Yielded after a write that makes work for a worker has landed (a run started, a
    signal, a parent nudged, a lease given back), never after a plain step's save. The
    result is None; it never fails (a lost announcement only delays, the poll runs).
    ``local``: ring only the workers of this process (no notification to others).
    """

    __slots__ = ("local",)

    def __init__(self, local: bool = False) -> None:
        self.local = local


def step_through(gen: Generator[E, Any, R], perform: Callable[[E], Any]) -> R:
    """Drive ``gen`` to its end, performing each effect it yields with ``perform``.

    The result of an effect is sent back in; an error it raises is thrown back in, so
    the core decides what an error means. Returns what ``gen`` returns.
    """
    send: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                effect = gen.send(send) if error is None else gen.throw(error)
            except StopIteration as stop:
                value: R = stop.value
                return value
            send = error = None
            try:
                send = perform(effect)
            except Exception as exc:  # noqa: BLE001 - thrown back in: the core decides
                error = exc
    except BaseException:
        # Cut short (an error that is not thrown back in, or one ``gen`` raised): close
        # it. Not a ``finally``: a generator that returned needs no close, and this runs
        # on every store call.
        gen.close()
        raise


async def astep_through(gen: Generator[E, Any, R], perform: Callable[[E], Awaitable[Any]]) -> R:
    """``step_through`` for an async ``perform``; the same loop, each effect awaited."""
    send: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                effect = gen.send(send) if error is None else gen.throw(error)
            except StopIteration as stop:
                value: R = stop.value
                return value
            send = error = None
            try:
                send = await perform(effect)
            except Exception as exc:  # noqa: BLE001 - thrown back in: the core decides
                error = exc
    except BaseException:
        gen.close()  # cut short: as in ``step_through``
        raise
