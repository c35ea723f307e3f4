"""An event a signal handler may set: ``threading.Event`` without its lock.

A signal handler runs in the main thread between two bytecodes, anywhere. If the main
thread is inside ``threading.Event.wait`` at that moment, it may hold the event's own
lock (the few bytecodes before the wait parks, and after it wakes), and a handler that
calls ``set`` on the same event then waits for that lock for ever: the process hangs
(seen as a ``stepstone worker`` that ignored Ctrl-C; the window is a few bytecodes wide,
so it shows under load). ``Worker.stop`` is documented as safe in a signal handler and
sets the worker's events, so those events are this class.

It keeps ``threading.Event``'s meaning (a flag that ``set`` raises and ``clear`` lowers;
``wait`` returns once it is up, for every waiter) with no lock of its own: the flag is a
plain attribute, and waiters park on a ``queue.SimpleQueue``, whose ``put`` is
documented as reentrant ("can be interrupted by another put() call in the same thread
without deadlocking"), which is what a handler interrupting a waiting ``get`` is. ``set``
puts a token when it raises the flag; a waiter that takes one while the flag is up
puts it back for the next waiter, so one ``set`` wakes them all, and a flag that stays
up holds one token however often it is set (a busy worker's rings). ``clear`` drains
the tokens.

In the main thread a wait is cut in slices of ``MAIN_SLICE`` seconds. Python runs a
signal's handler only in the main thread, between two bytecodes; a signal that lands
while the main thread is parked in C (the queue's ``get``) wakes it only if the kernel
delivers it to that thread and after the park began. One delivered to another thread,
or in the few instructions before the park, only marks the handler as due, and a wait
with no timeout would never get back to bytecode to run it: ``stepstone worker`` at
concurrency 1 parks its main thread so for its whole life, and ignored a Ctrl-C (seen
in CI, once in some hundreds of signals). Each slice's end runs the handlers that are
due, so a stop is at most one slice late.

A subclass of ``threading.Event`` so that it goes wherever one is typed (the clock seam's
``wait``); none of the base class's methods or state is used.
"""

from __future__ import annotations

import queue
import threading
import time

__all__ = ["MAIN_SLICE", "SignalSafeEvent"]

#: Seconds the main thread parks at most before it looks for signal handlers that are due.
MAIN_SLICE = 0.25


class SignalSafeEvent(threading.Event):
    """``threading.Event``'s methods, safe to call from a signal handler."""

    def __init__(self) -> None:
        super().__init__()  # the base's state stays valid for anything that reads it
        self._up = False
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()

    def is_set(self) -> bool:
        """Return whether the flag is up."""
        return self._up

    def set(self) -> None:
        """Raise the flag and wake every waiter; never blocks, takes no lock."""
        if not self._up:  # up already: its token is in the queue or with a waiter
            self._up = True
            self._tokens.put(None)

    def clear(self) -> None:
        """Lower the flag.

        Tokens first, then the flag: a ``set`` racing in between is ordered before this
        clear (the flag ends down, as if it came first), and a token it left behind costs
        a waiter one more look at the flag. Unlike ``threading.Event``, a waiter parked
        through a ``set`` and a ``clear`` in quick succession may sleep on; the worker
        never races them (only its resting thread clears, after its own wait).
        """
        while True:
            try:
                self._tokens.get_nowait()
            except queue.Empty:
                break
        self._up = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is up or ``timeout`` seconds pass; return the flag."""
        deadline = None if timeout is None else time.monotonic() + timeout
        main = threading.current_thread() is threading.main_thread()
        took = False
        while not self._up:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            sliced = main and (left is None or left > MAIN_SLICE)
            try:
                self._tokens.get(timeout=MAIN_SLICE if sliced else left)
            except queue.Empty:
                if not sliced:
                    return self._up
                continue  # a slice ended: back in bytecode, due handlers have run
            took = True
        if took:
            # Up: hand the token on, so that every other waiter wakes too (as Event's
            # notify_all). A token left after a later clear only costs one more look.
            self._tokens.put(None)
        return True

    def __repr__(self) -> str:
        return f"<SignalSafeEvent {'set' if self._up else 'unset'}>"
