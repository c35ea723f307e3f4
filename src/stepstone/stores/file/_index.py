"""The ``.active/`` index: one marker per run that may be queued, running or waiting.

``claimable`` reads only the runs with a marker, so its cost does not grow with finished
runs. A marker is written (durably, in both modes) before the save that makes a run
active, and removed after the save that puts it at rest, so no active run is ever
unindexed; a marker left over is only a hint ``claimable`` re-checks and removes. The
index is read through the descriptor opened with the store; a marker is opened
``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file, and one that cannot be removed is
left with a warning rather than failing a save that already landed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time

from ..._errors import StoreError
from ._disk import O_MARK, STALE_SECONDS, open_subdir, sync
from ._errors import foreign_marker, translating
from ._names import ACTIVE, HASHED_NAME, decode_name, join

__all__ = ["drop_orphan", "has_marker", "mark", "marker_run", "open_index", "unmark"]

logger = logging.getLogger("stepstone.stores.file")


def open_index(dir_fd: int, directory: str) -> int:
    """Open (creating it if need be) the index directory; return its fd.

    Raises:
        StoreError: something other than a directory is at ``.active``.
        OSError: it cannot be created or opened.
    """
    created = False
    try:
        os.mkdir(ACTIVE, 0o700, dir_fd=dir_fd)
        created = True
    except FileExistsError:
        pass
    try:
        fd = open_subdir(dir_fd, ACTIVE)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StoreError(
                f"{join(directory, ACTIVE)}: not a directory; the file store keeps its index "
                "of active runs there: move it away"
            ) from exc
        raise
    if created:
        sync(dir_fd)  # in both modes, for the reason ``mark`` gives
    return fd


def mark(active_fd: int, directory: str, name: str, status: str) -> None:
    """Create (or refresh) the run's marker, durably.

    Raises:
        StoreError: something not ours is at the marker's name, or the write failed.
    """
    with translating(directory, f"{ACTIVE}/{name}"):
        # O_TRUNC and a write refresh the marker's mtime, which is what tells a fresh
        # marker (its first save under way) from one left by a crashed first save.
        # O_NONBLOCK: a FIFO planted here must fail the open (ENXIO), not wait for a
        # reader forever; O_NOFOLLOW: a symlink is never written through.
        try:
            fd = os.open(name, O_MARK, 0o600, dir_fd=active_fd)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):
                raise foreign_marker(directory, name, exc) from exc
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise foreign_marker(directory, name, None)
            os.write(fd, status.encode())
        finally:
            os.close(fd)
        # In both modes: a run whose document survives a power cut but whose marker
        # does not would never be claimed again. Paid once per activation, not per save.
        sync(active_fd)


def has_marker(active_fd: int | None, name: str) -> bool:
    """Whether the run has a marker (of any kind)."""
    if active_fd is None:
        return False
    try:
        os.stat(name, dir_fd=active_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def unmark(active_fd: int | None, directory: str, name: str) -> None:
    """Remove the run's marker if it has one; a directory planted there is left."""
    if active_fd is None:
        return
    # A marker left behind is only a hint the next claimable re-checks and removes.
    with translating(directory, f"{ACTIVE}/{name}"), contextlib.suppress(FileNotFoundError):
        try:
            os.unlink(name, dir_fd=active_fd)
        except IsADirectoryError:
            # Not ours (a directory planted there): leave it, and never fail a save
            # that already landed over it; listings and claims re-check the run.
            logger.warning(
                "leaving %s: a directory, not an index marker the file store wrote",
                join(directory, f"{ACTIVE}/{name}"),
            )


def marker_run(name: str) -> tuple[bool, str | None]:
    """Read a marker's name: whether it names a run, and its run_id (None if hashed)."""
    if HASHED_NAME.fullmatch(name) is not None:
        return True, None
    run_id = decode_name(name)
    return run_id is not None, run_id


def drop_orphan(active_fd: int, dir_fd: int, directory: str, name: str) -> None:
    """Remove the marker of a run that has no document, once it is stale; best effort."""
    # A marker is written before a run's first save: a young one may belong to a save
    # under way. Only one older than any save is left over from a crash (or a delete).
    try:
        # Not the scan's entry.stat(): the fd the scan ran on is closed by now.
        st = os.stat(name, dir_fd=active_fd, follow_symlinks=False)
        if st.st_mtime < time.time() - STALE_SECONDS:
            sync(dir_fd)  # the run's absence must be durable before its marker goes
            unmark(active_fd, directory, name)
    except (OSError, StoreError) as exc:
        logger.debug("could not clean index marker %s: %s", name, exc)
