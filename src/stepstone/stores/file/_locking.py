"""The file store's open descriptors and its locks.

Compare-and-swap holds ``flock`` on the run's current document. A save replaces the
document's inode, so a saver that waited on the old inode sees, once it holds the lock,
that its inode has no link left (``st_nlink == 0``) and starts over on the new one.
``flock`` locks belong to an open file description, so one lock excludes other processes
and other threads (each thread uses its own description) alike, and the kernel drops it
if the holder dies: no stale locks, and no lock files.

The store keeps the document it last wrote or read for a run open, with its version.
While the file is open its inode cannot be freed and reused, so "this inode still has a
link" proves the run is still at that version without reading or parsing it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import weakref

from ..._errors import StoreError
from ._documents import Known, open_document
from ._errors import translating

__all__ = ["Handles", "close_all", "linked"]

# Documents kept open per store. Bounded so that a process touching many runs never runs
# out of file descriptors.
_MAX_OPEN = 128


class Handles:
    """A store's descriptors: its directory, its index, and the documents it keeps open.

    close() while other threads work: new calls are refused at once, and the directory
    fds are closed by the last call in flight, never under it (a closed fd number can be
    reused by any open, which would send its writes elsewhere).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.dir_fd: int | None = None
        self.active_fd: int | None = None
        self.known: dict[str, Known] = {}
        self.busy: set[int] = set()
        self.mutex = threading.Lock()
        self.closed = False
        self.inflight = 0
        _HANDLES.add(self)

    # -- the directory, and the calls in flight ------------------------------------------

    def fd(self) -> int:
        """Return the directory fd.

        Raises:
            StoreError: the store is closed.
        """
        dir_fd = self.dir_fd
        if self.closed or dir_fd is None:
            raise StoreError(f"{self.directory}: the file store is closed")
        return dir_fd

    def begin(self) -> int:
        """Enter a call: return the directory fd, kept open until ``end``."""
        with self.mutex:
            dir_fd = self.fd()
            self.inflight += 1
        return dir_fd

    def end(self) -> None:
        """Leave a call; the last one out after ``close`` closes the directory fds."""
        with self.mutex:
            self.inflight -= 1
            if not self.closed or self.inflight:
                return
            fds = self._take_dir_fds()
        close_all(fds)

    def _take_dir_fds(self) -> list[int | None]:
        fds = [self.active_fd, self.dir_fd]
        self.active_fd = self.dir_fd = None
        return fds

    def close(self) -> None:
        """Close the kept documents, and the directory fds unless a call is in flight."""
        with self.mutex:
            self.closed = True
            fds: list[int | None] = [known.fd for known in self.known.values()]
            self.known = {}
            if not self.inflight:
                fds += self._take_dir_fds()
        # Documents in use by a save in flight are closed by that save.
        close_all(fds)

    # -- the open documents --------------------------------------------------------------

    def checkout(self, name: str) -> Known | None:
        """Take the run's open document out of the cache, for this thread alone."""
        with self.mutex:
            known = self.known.pop(name, None)
            if known is not None:
                self.busy.add(known.fd)
            return known

    def keep(self, name: str, known: Known) -> None:
        """Put a run's open document (back) in the cache, closing what it replaces."""
        closing: list[int] = []
        with self.mutex:
            self.busy.discard(known.fd)
            if self.closed:
                closing.append(known.fd)
            else:
                old = self.known.pop(name, None)
                if old is not None:
                    closing.append(old.fd)
                elif len(self.known) >= _MAX_OPEN:
                    oldest = next(iter(self.known))
                    closing.append(self.known.pop(oldest).fd)
                self.known[name] = known
        for fd in closing:
            os.close(fd)

    def track(self, fd: int) -> None:
        """Note a document fd this thread uses, so a fork in the child closes it."""
        with self.mutex:
            self.busy.add(fd)

    def release(self, fd: int) -> None:
        """Close a document fd this thread used (which releases its ``flock``)."""
        with self.mutex:
            self.busy.discard(fd)
        with translating(self.directory):
            os.close(fd)

    def forget_inherited(self) -> None:
        """In a forked child: close the copies of the parent's documents.

        The descriptions are shared with the parent, so holding them would keep the
        parent's locks alive as long as the child lives.
        """
        self.mutex = threading.Lock()
        for fd in [known.fd for known in self.known.values()] + list(self.busy):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.known = {}
        self.busy = set()

    # -- locking -------------------------------------------------------------------------

    def lock_known(self, fd: int, file_name: str) -> bool:
        """Hold ``flock`` on a kept document; return whether it is still current."""
        with translating(self.directory, file_name):
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Still linked means still current: the fd keeps the inode from reuse.
            return linked(fd)

    def lock_current(self, dir_fd: int, name: str) -> tuple[int, os.stat_result] | None:
        """Open the run's current document and hold ``flock`` on it; None if absent."""
        file_name = name + ".json"
        while True:
            opened = open_document(dir_fd, self.directory, file_name)
            if opened is None:
                return None
            fd, _ = opened
            self.track(fd)
            try:
                with translating(self.directory, file_name):
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    st = os.fstat(fd) if linked(fd) else None
            except BaseException:
                self.release(fd)
                raise
            if st is not None:
                return fd, st
            # Replaced or deleted while we waited: the lock guards nothing. Start over.
            self.release(fd)


def close_all(fds: list[int | None]) -> None:
    """Close every fd given; one already closed is no reason to stop."""
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def linked(fd: int) -> bool:
    """Whether the open file still has a name (a save or delete unlinks what it replaces)."""
    try:
        return os.fstat(fd).st_nlink > 0
    except OSError as exc:
        # What some file systems (NFS, FUSE) answer for a file that no longer has a name.
        if exc.errno == errno.ESTALE:
            return False
        raise


# The handles alive in this process, so that a forked child can drop what it inherited.
_HANDLES: weakref.WeakSet[Handles] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for handles in list(_HANDLES):
        handles.forget_inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
