"""The MySQL store's connection pieces: the handshake socket and the quiet async cursor.

``stepstone.stores.mysql`` tells why: the connect deadline caps PyMySQL's handshake
reads, and aiomysql's ``SHOW WARNINGS`` round trip is skipped.
"""

from __future__ import annotations

import functools
import socket
import time
from typing import Any


@functools.cache
def _quiet(base: type) -> type:
    """Return the aiomysql cursor class ``base``, quiet about the server's notes.

    aiomysql turns each note into a Python warning (after one more round trip, ``SHOW
    WARNINGS``); PyMySQL, the sync path, never does. The notes the store meets are
    expected, ``CREATE TABLE IF NOT EXISTS`` finding the pieces table there, and errors
    arrive as errors on both paths, so the async path stays as quiet as the sync one.
    """

    async def _show_warnings(self: Any, conn: Any) -> None:
        return None

    return type(f"Quiet{base.__name__}", (base,), {"_show_warnings": _show_warnings})


class _HandshakeSocket(socket.socket):
    """A socket whose timeouts end at ``deadline`` until ``release`` lifts the cap."""

    __slots__ = ("asked", "deadline")

    def __init__(self, fileno: int) -> None:
        super().__init__(fileno=fileno)
        self.asked: float | None = None
        self.deadline: float | None = None

    def settimeout(self, value: float | None) -> None:
        """Set the timeout PyMySQL asks for, but never past the deadline."""
        self.asked = value
        if self.deadline is not None:
            left = max(self.deadline - time.monotonic(), 0.001)
            value = left if value is None else min(value, left)
        super().settimeout(value)

    def expired(self) -> bool:
        """Whether the deadline has passed (a timeout then was the connect's)."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def release(self) -> None:
        """Lift the cap: from now on the timeouts are the ones PyMySQL asked for."""
        self.deadline = None
        super().settimeout(self.asked)
