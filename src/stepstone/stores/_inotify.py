"""Linux inotify through ctypes: a descriptor that becomes readable when a directory changes.

The file store's listener watches its directory for new documents, SQLite's watches
the directory of its database for writes to the WAL. Both wait on the descriptor in
``poll`` (with the listener's stop pipe), so an idle listener uses no CPU at all.
``open_inotify`` returns None where there is no inotify (not Linux, no ``libc``, the
per-user instance limit reached): the caller then falls back to polling or to none.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import struct
import sys
from typing import Final

__all__ = [
    "IN_CREATE",
    "IN_IGNORED",
    "IN_MODIFY",
    "IN_MOVED_TO",
    "IN_ONLYDIR",
    "IN_Q_OVERFLOW",
    "Inotify",
    "open_inotify",
]

# <sys/inotify.h>
IN_MODIFY: Final = 0x00000002
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_Q_OVERFLOW: Final = 0x00004000
IN_IGNORED: Final = 0x00008000
IN_ONLYDIR: Final = 0x01000000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0o2000000)
# struct inotify_event { int wd; uint32_t mask, cookie, len; char name[]; }
_HEADER: Final = struct.Struct("iIII")
_BUFFER: Final = 64 * 1024


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    return libc


class Inotify:
    """One inotify instance (non-blocking, close-on-exec)."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self.fd = fd

    def watch(self, path: str, mask: int) -> None:
        """Watch ``path`` for the events in ``mask``.

        Raises:
            OSError: the kernel refused (no such directory, not a directory, limits).
        """
        if self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask) < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)

    def read(self) -> list[tuple[int, str]]:
        """Return the events waiting, as (mask, name) pairs; [] if there are none."""
        try:
            data = os.read(self.fd, _BUFFER)
        except BlockingIOError:
            return []
        events: list[tuple[int, str]] = []
        offset = 0
        while offset + _HEADER.size <= len(data):
            _, mask, _, size = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            name = data[offset : offset + size].split(b"\0", 1)[0]
            offset += size
            events.append((mask, os.fsdecode(name)))
        return events

    def close(self) -> None:
        """Close the descriptor (and with it every watch)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def open_inotify() -> Inotify | None:
    """Return a new inotify instance, or None where inotify is not available."""
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None
    return Inotify(libc, fd)
