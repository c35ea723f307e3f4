"""One ``LISTEN`` connection per PostgreSQL stream channel and process, shared by its readers.

Every ``stream``/``astream`` reader that follows a live run on PostgreSQL waits on the
table's stream channel (``stepstone.s.TABLE``). A connection each would cost the server
a backend per reader (a UI tailing fifty runs holds fifty), so readers in one process
share one listener per server, database, user and table (issue 34):

- opened by the first reader (``join``), closed when the last one leaves (``close`` of
  its subscription): reference-counted under one lock, from any thread; async readers
  join with a ring that hops onto their loop, as before;
- a writer's ``NOTIFY`` carries the run id (``announce_stream``): the hub rings only the
  readers of that run. An empty payload (a run id too long for one, or a writer of an
  older version) rings every reader; so does every ``LISTEN`` (after a reconnect too:
  what was sent meanwhile is lost) and a reader's joining a hub that listens already
  (it may have missed a flush between its last look and its joining);
- a ring is a hint: a reader looks again at its next poll (50 ms at most) whatever
  happens to the connection, so sharing never delays a reader beyond that;
- per process: a forked child inherits the registry but not the listener's thread, so
  hubs are keyed by the process id too and a child opens its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, Final

from ..._observe import logger
from .listen_pg import PostgresListener

__all__ = ["StreamHub", "Subscription", "join", "open_hubs"]

#: The payload that rings every reader of the channel.
EVERYONE: Final = ""

_hubs: dict[tuple[Any, ...], StreamHub] = {}
_hubs_lock = threading.Lock()


class Subscription:
    """One reader's place in a hub; ``close`` leaves it (the last one closes the hub)."""

    def __init__(self, hub: StreamHub, run_id: str | None, ring: Callable[[], None]) -> None:
        self.hub = hub
        self.run_id = run_id
        self.ring = ring
        self.closed = False

    def close(self) -> None:
        """Stop ringing this reader; no ring comes after this returns."""
        self.hub.leave(self)


class StreamHub:
    """A shared stream-channel listener and the readers it rings, by run id."""

    def __init__(self, key: tuple[Any, ...], make: Callable[[StreamHub], PostgresListener]):
        self.key = key
        self._lock = threading.Lock()
        self._subs: set[Subscription] = set()
        self.listener = make(self)

    @property
    def readers(self) -> int:
        """How many readers the hub rings now."""
        with self._lock:
            return len(self._subs)

    def ring_all(self) -> None:
        """Ring every reader: after a ``LISTEN``, or a notification naming no run."""
        self._ring(None)

    def deliver(self, payloads: set[str]) -> None:
        """Ring the readers of the runs in ``payloads`` (all of them for an empty one)."""
        self._ring(None if EVERYONE in payloads else payloads)

    def _ring(self, runs: set[str] | None) -> None:
        # Under the hub's lock: ``leave`` takes it, so no ring reaches a reader that left.
        # Rings are cheap (an event's set, a loop's call_soon_threadsafe).
        with self._lock:
            for sub in self._subs:
                if runs is None or sub.run_id is None or sub.run_id in runs:
                    try:
                        sub.ring()
                    except Exception as exc:  # noqa: BLE001 - one reader's fault stays its own
                        logger.debug("a stream reader's ring raised %s", type(exc).__name__)

    def leave(self, sub: Subscription) -> None:
        """Remove ``sub``; close the listener if it was the last reader."""
        with _hubs_lock:
            with self._lock:
                if sub.closed:
                    return
                sub.closed = True
                self._subs.discard(sub)
                last = not self._subs
            if last and _hubs.get(self.key) is self:
                del _hubs[self.key]
        if last:
            # Outside the registry's lock: ``close`` may wait for the thread, and a new
            # reader meanwhile opens a hub of its own.
            self.listener.close()


def join(
    key: tuple[Any, ...],
    run_id: str | None,
    ring: Callable[[], None],
    make: Callable[[StreamHub], PostgresListener],
) -> Subscription:
    """Join the hub of ``key`` (opening it with ``make``), rung for ``run_id``'s flushes."""
    key = (os.getpid(), *key)
    with _hubs_lock:
        hub = _hubs.get(key)
        fresh = hub is None
        if hub is None:
            hub = StreamHub(key, make)
            _hubs[key] = hub
        sub = Subscription(hub, run_id, ring)
        with hub._lock:  # noqa: SLF001 - the registry and its hubs are one mechanism
            hub._subs.add(sub)  # noqa: SLF001
    if fresh:
        try:
            hub.listener.start()
        except BaseException:
            sub.close()
            raise
    elif hub.listener.backend_pid is not None:
        # Listening already: its first ring is past, and a flush may have come between
        # this reader's last look and now.
        with contextlib.suppress(Exception):
            ring()
    return sub


def open_hubs() -> list[StreamHub]:
    """The hubs open in this process (for tests and diagnostics)."""
    pid = os.getpid()
    with _hubs_lock:
        return [hub for key, hub in _hubs.items() if key[0] == pid]
