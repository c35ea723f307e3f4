"""SQLite push wake-ups: a thread that watches ``PRAGMA data_version`` on its own connection.

Why ``data_version`` and not a notification table: SQLite has no server to push
anything, so some connection has to look. ``data_version`` changes whenever another
connection (of any process) commits to the file, and reading it is a look at the
WAL index in shared memory (4 us): no disk I/O, no lock another connection waits for,
nothing written. A notification table would make every ``start`` and signal write a
second row (a second fsync, or a change to every save statement), and its readers
would still have to poll it; ``data_version`` costs the writers nothing. What it cannot
tell is *what* changed, so every commit rings, the worker's own saves included: a busy
worker rings itself (the doorbell and the worker fold rings together; looks are spaced
at least ``INTERVAL`` apart), an idle one never.

When to look: polling every 10 ms cost 1.5 % of a core when idle (``time.process_time``
over 5 s: 100 wake-ups a second), over the 1 % an idle worker may use. So on Linux the
thread sleeps on inotify, woken by a write to the database's ``-wal`` file (every commit
appends there): 0.02 % idle. It looks then, and every ``INTERVAL`` for ``RECHECK``
seconds while the write is not committed yet (the writer's fsync comes between its
write and its commit), and every ``SAFETY`` seconds in case an event was missed. An
event only triggers a look and only a changed ``data_version`` rings, so a directory
others write to costs spurious looks, never spurious rings. Without inotify it polls
every ``FALLBACK`` seconds (0.55 % idle).

The connection is opened with the store's busy timeout and only ever reads; an error
(the file replaced, a disk error) drops it and the thread opens a new one with a
doubling back-off, ringing once when it can read again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Final

from ..._observe import logger
from .._inotify import (
    IN_CREATE,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
    open_inotify,
)
from .._listening import RETRY_FIRST, RETRY_MAX, ListenerThread

__all__ = ["FALLBACK", "INTERVAL", "RECHECK", "SAFETY", "SQLiteListener"]

#: Least seconds between two looks at ``data_version`` (bounds the cost under load).
INTERVAL: Final = 0.002
#: Seconds to keep looking after a write was heard but no commit seen yet.
RECHECK: Final = 0.1
#: Seconds between looks with inotify when nothing was heard.
SAFETY: Final = 1.0
#: Seconds between looks without inotify.
FALLBACK: Final = 0.025


class SQLiteListener(ListenerThread):
    """Ring whenever another connection committed to the database file."""

    def __init__(
        self,
        path: str,
        busy_timeout_ms: int,
        ring: Callable[[], None],
        *,
        inotify: bool = True,
    ) -> None:
        super().__init__(ring, f"stepstone-listen {path}")
        self._path = path
        self._timeout = busy_timeout_ms / 1000
        self._inotify: Inotify | None = None
        base = os.path.basename(path)
        self._names = frozenset({base, f"{base}-wal", f"{base}-journal"})
        # Opened and read here, in the caller's thread: a commit made after ``listen``
        # returned is never missed, even before the thread runs.
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = self._open()
            self._seen = self._version(self._conn)
            if inotify:
                self._inotify = self._watch(os.path.dirname(path))
        except BaseException:
            self.close()
            raise

    def _open(self) -> sqlite3.Connection:
        # check_same_thread=False: opened here, read on the listener's thread only.
        return sqlite3.connect(
            self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False
        )

    @staticmethod
    def _version(conn: sqlite3.Connection) -> int:
        row = conn.execute("PRAGMA data_version").fetchone()
        return int(row[0])

    def _watch(self, directory: str) -> Inotify | None:
        watcher = open_inotify()
        if watcher is None:
            return None
        try:
            watcher.watch(directory, IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
        except OSError as exc:
            logger.debug("%s: no inotify (%s); polling every %s s", self._path, exc, FALLBACK)
            watcher.close()
            return None
        return watcher

    def _heard(self, watcher: Inotify) -> bool:
        """Drain the events; whether one may be a commit (or was lost: overflow)."""
        found = False
        for mask, name in watcher.read():
            if mask & IN_IGNORED:  # the directory is gone: poll from now on
                watcher.close()
                self._inotify = None
                return True
            if mask & IN_Q_OVERFLOW or name in self._names:
                found = True
        return found

    def serve(self) -> None:
        delay = RETRY_FIRST
        last = 0.0
        # After an event that changed nothing yet (the writer is between its WAL write
        # and its commit, an fsync apart), look again every INTERVAL until this time.
        recheck_until = 0.0
        while True:
            watcher = self._inotify
            if watcher is None:
                timeout = FALLBACK
            elif time.monotonic() < recheck_until:
                timeout = INTERVAL
            else:
                timeout = SAFETY
            ready = self.wait(None if watcher is None else watcher.fd, timeout)
            if ready is None:
                return
            heard = False
            if ready and watcher is not None:
                # Space the looks: the events of the commits meanwhile wait in the kernel.
                gap = last + INTERVAL - time.monotonic()
                if gap > 0 and not self.pause(gap):
                    return
                heard = self._heard(watcher)
                if not heard:
                    continue
            last = time.monotonic()
            try:
                changed = self._look()
            except sqlite3.Error as exc:
                if self._conn is not None:
                    logger.warning(
                        "%s: cannot watch for new work (%s); retrying, workers poll meanwhile",
                        self._path,
                        exc,
                    )
                self._drop()
                if not self.pause(delay):
                    return
                delay = min(delay * 2, RETRY_MAX)
                continue
            delay = RETRY_FIRST
            if changed:
                recheck_until = 0.0
                self.ring()
            elif heard:
                recheck_until = last + RECHECK

    def _look(self) -> bool:
        """Whether ``data_version`` changed since the last look (True after reopening)."""
        if self._conn is None:
            self._conn = self._open()
            self._seen = self._version(self._conn)
            logger.info("%s: watching for new work again", self._path)
            return True  # commits while we could not look: look once
        version = self._version(self._conn)
        if version == self._seen:
            return False
        self._seen = version
        return True

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def release(self) -> None:
        self._drop()
        watcher, self._inotify = self._inotify, None
        if watcher is not None:
            watcher.close()
