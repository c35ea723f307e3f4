"""Push wake-ups: telling the workers that share a store that there is work for them.

A write that makes work for a worker (``start``, a signal, a child's completion telling
its parent, a lease given back) is followed by ``announce(store)``: it rings the
store's ``Doorbell`` (every worker of this process serving that store object wakes at
once) and calls ``Store.announce`` (the cross-process half: PostgreSQL sends a
``NOTIFY``; by default nothing). A worker in another process hears it through
``Store.listen``.

Every wake-up is a hint. A worker woken looks at the claim index as it would after its
poll interval, and acts only by compare-and-swap; a ring that is lost (dropped, a store
that cannot notify, a process that dies between its write and its announce) only
delays the work until the next poll, it never strands it. So nothing here raises into
the writer: the write has landed, and that is what counts.

A leaf module: it imports nothing of the engine but the hook points and the logger (not
even the store contract, which imports it: ``Announcing`` is what it needs of a store),
so the contract and every driver may import it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from . import _hooks
from ._observe import logger

__all__ = ["Announcing", "Doorbell", "WakeupDropped", "aannounce", "announce", "dropped"]


class WakeupDropped(Exception):
    """Raised by a test hook at the point ``wake.ring`` to drop that ring.

    Fault injection only (the fleet's lost-notification test): a ring dropped there
    reaches no callback, as a notification lost on the wire would not.
    """


def dropped() -> bool:
    """Fire the ``wake.ring`` hook point; return whether a test drops this ring there.

    Every ring passes here: ``Doorbell.ring`` and the worker's callback for the rings a
    store's listener hears from other processes.
    """
    try:
        _hooks.fire("wake.ring")
    except WakeupDropped:
        return True
    return False


class Doorbell:
    """A thread-safe set of callbacks, all called by ``ring``.

    Callbacks must be cheap and must not block (``threading.Event.set``,
    ``loop.call_soon_threadsafe(event.set)``): ``ring`` runs in the writer's thread,
    right after its write. One that raises is logged at DEBUG and the others still run;
    nothing reaches the writer.
    """

    __slots__ = ("_callbacks", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Replaced whole under the lock, read without it: ``ring`` takes no lock.
        self._callbacks: tuple[_Entry, ...] = ()

    def __repr__(self) -> str:
        return f"Doorbell({len(self._callbacks)} subscribed)"

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on every ring from now on; return the function that stops it.

        The returned function may be called any number of times, from any thread.
        """
        # A holder of our own, compared by identity: the same callback subscribed twice
        # is called twice, and each unsubscribe removes only its own subscription.
        entry = _Entry(callback)
        with self._lock:
            self._callbacks = (*self._callbacks, entry)

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks = tuple(c for c in self._callbacks if c is not entry)

        return unsubscribe

    def ring(self) -> None:
        """Call every subscribed callback (unless a test drops this ring, ``WakeupDropped``)."""
        if dropped():
            return
        for entry in self._callbacks:
            try:
                entry.callback()
            except Exception as exc:  # noqa: BLE001 - a listener's fault must not reach the writer
                # Only the type: the exception's own text may raise when read.
                logger.debug("a wake-up callback raised %s; ignored", type(exc).__name__)


class _Entry:
    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback


class Announcing(Protocol):
    """What ``announce`` needs of a store (``Store`` has it); the store contract imports us."""

    @property
    def doorbell(self) -> Doorbell: ...

    def announce(self) -> None: ...

    async def aannounce(self) -> None: ...


def _failed(store: Announcing, exc: Exception) -> None:
    logger.debug(
        "%s: announcing new work failed (%s); workers find it at their next poll",
        type(store).__name__,
        type(exc).__name__,
    )


def announce(store: Announcing) -> None:
    """Tell the workers sharing ``store`` that there is work: ring, then ``store.announce()``.

    Never raises the store's error into the caller: the write has landed, and a worker
    that misses this finds the work at its next poll. Logged at DEBUG.
    """
    store.doorbell.ring()
    try:
        store.announce()
    except Exception as exc:  # noqa: BLE001 - a lost notification only delays (the poll)
        _failed(store, exc)


async def aannounce(store: Announcing) -> None:
    """Async ``announce``: the ring at once, then ``await store.aannounce()``."""
    store.doorbell.ring()
    try:
        await store.aannounce()
    except Exception as exc:  # noqa: BLE001 - a lost notification only delays (the poll)
        _failed(store, exc)
