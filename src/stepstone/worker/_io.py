"""The effects a worker's claim loop yields beyond the core's, and the calls that do them.

The worker's rules (claim, park, serve) are generators of effects (``_effects``), written
once; ``Worker.serve`` drives them with plain calls and ``Worker.aserve`` with awaits.
``perform`` and ``aperform`` are those calls for the effects that touch the store or
drive a run. ``Spawn``, ``Rest``, ``Subscribe``, ``Listen``, ``Unlisten`` and ``Drain``
are left to each loop (a thread or a task, a ``threading.Event`` or an
``asyncio.Event``, a listener opened in the loop's thread or in one of asyncio's): what
they do differs by driver; when they happen is the claim loop's rule, written once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._effects import Announce, Effect, Load, Save
from .._runner import drive
from .._store import aclaim_page, claim_page
from .._store_time import Now, astore_now, store_now
from .._wake import aannounce, announce

if TYPE_CHECKING:
    from datetime import datetime

    from .._checkpoint import RunStatus
    from .._plan import Plan
    from .._runinfo import ReadyAsk
    from .._store import Store

__all__ = [
    "ClaimReady",
    "Drain",
    "Execute",
    "Listen",
    "Page",
    "Rest",
    "Spawn",
    "Subscribe",
    "Unlisten",
    "aperform",
    "perform",
]


class Page(Effect):
    """Read one page of the claim index (``claim_page``); the result is its ``RunInfo``s."""

    __slots__ = ("args",)

    def __init__(self, now: datetime, limit: int, status: RunStatus | None, skip: int) -> None:
        self.args = (now, limit, status, skip)


class ClaimReady(Effect):
    """Claim what needs no judgement in one call (``Store.claim_ready``, its arguments
    ``ask``); the result is its ``Claim``s."""

    __slots__ = ("ask",)

    def __init__(self, ask: ReadyAsk) -> None:
        self.ask = ask


class Execute(Effect):
    """Drive a claimed run's plan to its end (``drive``); the result is its final state."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan) -> None:
        self.plan = plan


class Spawn(Effect):
    """Start driving a claimed run's plan beside the loop (a thread, or a task)."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan) -> None:
        self.plan = plan


class Rest(Effect):
    """Wait up to ``seconds`` for the loop to be woken, then re-arm; the result: whether woken.

    Woken by a ring (work announced, ``_wake``), a run ending, or ``stop``.
    """

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class Subscribe(Effect):
    """Ring the loop on this process's own wake-ups (``Store.doorbell``) from now on.

    Yielded once, before the first look; the subscription ends with the loop (``Drain``
    ends it on a stop, the driver's teardown on anything else).
    """

    __slots__ = ()


class Listen(Effect):
    """Open the store's listener for other processes' rings (``Store.listen``).

    The result is None; ``Claims.pushed`` says afterwards whether one is open (a store
    that cannot push has none, and the loop backs off instead).
    """

    __slots__ = ()


class Unlisten(Effect):
    """Close the listener ``Listen`` opened (if one is open)."""

    __slots__ = ()


class Drain(Effect):
    """The loop has stopped: end the subscription, then wait up to the grace for the runs
    in flight to hand over."""

    __slots__ = ()


async def _adrive(plan: Plan, store: Store) -> Any:
    # Imported when first awaited: ``_arunner`` imports asyncio, which a process that
    # only serves with threads (or only starts runs) never pays for.
    from .._arunner import adrive  # noqa: PLC0415

    return await adrive(plan, store)


#: Each effect with its plain call and its awaited one: the only place the worker's I/O
#: is written twice.
_IO: dict[
    type[Effect], tuple[Callable[[Store, Any], Any], Callable[[Store, Any], Awaitable[Any]]]
] = {
    Load: (lambda store, e: store.load(e.run_id), lambda store, e: store.aload(e.run_id)),
    Save: (lambda store, e: store.save(e.cp), lambda store, e: store.asave(e.cp)),
    Page: (
        lambda store, e: claim_page(store, *e.args),
        lambda store, e: aclaim_page(store, *e.args),
    ),
    Execute: (lambda store, e: drive(e.plan, store), lambda store, e: _adrive(e.plan, store)),
    ClaimReady: (
        lambda store, e: store.claim_ready(*e.ask[:5], exclude=e.ask.exclude),
        lambda store, e: store.aclaim_ready(*e.ask[:5], exclude=e.ask.exclude),
    ),
    Announce: (lambda store, e: announce(store), lambda store, e: aannounce(store)),
    Now: (lambda store, e: store_now(store), lambda store, e: astore_now(store)),
}


def perform(store: Store, effect: Effect) -> Any:
    """Do ``effect`` (a load, a save, a page of the claim index, a run) with a plain call."""
    return _IO[type(effect)][0](store, effect)


async def aperform(store: Store, effect: Effect) -> Any:
    """Do ``effect`` as ``perform`` does, awaited."""
    return await _IO[type(effect)][1](store, effect)
