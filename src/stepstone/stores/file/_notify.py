"""The file store's push wake-ups: inotify on the store's directory, Linux only.

What to watch: every write that can make work for a worker publishes a document in the
store's directory, by ``link`` (a first save: ``IN_CREATE``) or ``rename`` (every other
save: ``IN_MOVED_TO``) of ``<name>.json``. The ``.active/`` index alone is not enough:
a marker is written only when a run becomes active, so a signal or a cancel sent to a
run that is already queued or waiting, and a child's completion that its waiting parent
needs, change no marker. Temp files (``.tmp-*``) and deletions are ignored.

Every save rings, this process's own included (inotify cannot tell who wrote); rings
are spaced at least ``GAP`` apart (the events meanwhile fold into one ring), so a busy
worker makes at most 1 / ``GAP`` extra claim looks a second, an idle one none.

Which directory: the one the store holds open, which ``_trust`` judged when it was
opened, reached through ``/proc/self/fd/<fd>``, never by its path again: a directory
swapped in at the path (or a symlink) since then is not what is watched. Without
``/proc``, and on systems other than Linux, there is no listener (the worker backs
off and polls).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final

from ..._observe import logger
from .._inotify import (
    IN_CREATE,
    IN_IGNORED,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
    open_inotify,
)
from .._listening import ListenerThread
from ._names import TEMP_PREFIX

__all__ = ["GAP", "DirectoryListener", "listen_directory"]

#: Least seconds between two rings.
GAP: Final = 0.005


class DirectoryListener(ListenerThread):
    """Ring when a document is published in the watched directory."""

    def __init__(self, path: str, watcher: Inotify, ring: Callable[[], None]) -> None:
        super().__init__(ring, f"stepstone-listen {path}")
        self._path = path
        self._watcher = watcher

    def _published(self) -> bool:
        found = False
        for mask, name in self._watcher.read():
            if mask & IN_IGNORED:
                raise OSError(f"{self._path} is gone (deleted or unmounted)")
            if mask & IN_Q_OVERFLOW:
                found = True  # events were lost: look once
            elif name.endswith(".json") and not name.startswith(TEMP_PREFIX):
                found = True
        return found

    def serve(self) -> None:
        last = 0.0
        while True:
            ready = self.wait(self._watcher.fd, 3600.0)
            if ready is None:
                return
            if not ready:
                continue
            gap = last + GAP - time.monotonic()
            if gap > 0 and not self.pause(gap):
                return
            try:
                published = self._published()
            except OSError as exc:
                self.ring()
                logger.warning("%s: stopped watching for new work (%s)", self._path, exc)
                return
            if published:
                last = time.monotonic()
                self.ring()

    def release(self) -> None:
        self._watcher.close()


def listen_directory(dir_fd: int, path: str, ring: Callable[[], None]) -> DirectoryListener | None:
    """Start a listener on the directory open at ``dir_fd``; None where none can be."""
    watcher = open_inotify()
    if watcher is None:
        return None
    link = f"/proc/self/fd/{dir_fd}"
    try:
        # The same directory as the descriptor, or no /proc worth the name: not used.
        if not os.path.samestat(os.stat(link), os.fstat(dir_fd)):
            raise FileNotFoundError(link)
        watcher.watch(link, IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
    except OSError as exc:
        watcher.close()
        logger.debug("%s: no inotify watch (%s); workers poll", path, exc)
        return None
    listener = DirectoryListener(path, watcher, ring)
    listener.start()
    return listener
