"""What the stores' wake-up listeners share: a daemon thread, a prompt stop, a guarded ring.

A listener (``Store.listen``) runs one daemon thread that waits for a sign that another
process or connection may have made work (a PostgreSQL notification, a new SQLite
``data_version``, an inotify event) and calls the worker's ``ring``. Three rules hold
for every backend, so they are written once, here:

- ``close`` is prompt: the thread waits in ``poll`` on a pipe as well as on its own
  descriptor, and ``close`` writes to that pipe, so the thread wakes at once whatever
  its timeout. ``close`` waits at most ``CLOSE_WAIT`` for the thread; one stuck in a
  call that cannot be interrupted (a connect to a server that never answers) ends by
  that call's own timeout.
- No ring after ``close`` returns: ``ring`` is called under a lock that ``close`` takes
  to mark the listener closed (rings are cheap, so holding it costs nothing).
- A forked child inherits the listener's object but not its thread: it never touches
  what the listener held (a SQLite connection must not be closed across ``fork``).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import weakref
from collections.abc import Callable
from typing import Final

from .._observe import logger

__all__ = ["CLOSE_WAIT", "ListenerThread"]

#: How long ``close`` waits for the listener's thread to end.
CLOSE_WAIT: Final = 2.0
#: After a failure the listener tries again after this long, doubling up to the maximum.
RETRY_FIRST: Final = 0.1
RETRY_MAX: Final = 10.0

_live: weakref.WeakSet[ListenerThread] = weakref.WeakSet()
# Listeners a forked child inherited: kept referenced, so what they hold is never
# finalized there (closing an inherited SQLite connection drops the child's own locks).
_inherited: list[ListenerThread] = []


def _after_fork_in_child() -> None:
    for listener in list(_live):
        listener.forked = True
        _inherited.append(listener)


os.register_at_fork(after_in_child=_after_fork_in_child)


class ListenerThread:
    """A listener's thread; subclasses implement ``serve`` and ``release``.

    ``serve`` runs on the thread until it returns (``wait`` and ``pause`` return None or
    False once ``close`` was called); ``release`` frees what the listener holds, once,
    on the thread as it ends (or in ``close`` if the thread never started).
    """

    def __init__(self, ring: Callable[[], None], name: str) -> None:
        self._callback = ring
        self._lock = threading.Lock()
        self.closed = False
        self.forked = False
        self._done = False
        self._stop_r, self._stop_w = os.pipe()
        os.set_blocking(self._stop_w, False)
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        _live.add(self)

    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "listening"
        return f"<{type(self).__name__} {self.thread.name} {state}>"

    # --- for subclasses -----------------------------------------------------------------

    def serve(self) -> None:
        """Listen until closed, calling ``ring`` on every sign of work."""
        raise NotImplementedError

    def release(self) -> None:
        """Free what the listener holds (connection, descriptors)."""

    def interrupt(self) -> None:
        """Unblock the thread from a call that ``wait`` does not cover (under the lock)."""

    def ring(self) -> None:
        """Call the worker's ``ring``, unless the listener was closed."""
        with self._lock:
            if self.closed:
                return
            try:
                self._callback()
            except Exception as exc:  # noqa: BLE001 - the worker's fault must not stop listening
                logger.debug("a wake-up ring raised %s; ignored", type(exc).__name__)

    def wait(self, fd: int | None, timeout: float) -> bool | None:
        """Wait up to ``timeout`` s for ``fd`` to be readable: True, False on timeout,
        None once closed."""
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        if fd is not None:
            poller.register(fd, select.POLLIN)
        events = poller.poll(max(0, int(timeout * 1000 + 0.999)))
        if self.closed or any(ready == self._stop_r for ready, _ in events):
            return None
        return bool(events)

    def pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless closed meanwhile; return whether to go on."""
        return self.wait(None, seconds) is not None

    # --- the thread and close -----------------------------------------------------------

    def _main(self) -> None:
        try:
            self.serve()
        except Exception:  # noqa: BLE001 - logged; the worker's poll carries on
            logger.warning(
                "%s stopped after an unexpected error; workers fall back to polling",
                self.thread.name,
                exc_info=True,
            )
        finally:
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            # Under the lock: ``close`` writes to the pipe only while it is open, so a
            # descriptor number reused by anyone else is never written to.
            for fd in (self._stop_r, self._stop_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if not self.forked:
            self.release()

    def close(self) -> None:
        """Stop listening: no ring after this returns. Closing twice is allowed."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.forked:
                return  # the parent's thread, descriptors and connection: not ours
            if not self._done:
                with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending
                    os.write(self._stop_w, b"x")
                self.interrupt()
        if self.thread.ident is None:
            self._finish()
        elif self.thread is not threading.current_thread():
            self.thread.join(CLOSE_WAIT)
