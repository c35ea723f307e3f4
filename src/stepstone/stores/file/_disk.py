"""The file store's system calls that make a write atomic and durable, and read it back.

A save writes a temp file and renames it over the document: ``rename`` is atomic, so a
reader sees the old or the new document, never a mix, and needs no lock. ``sync`` is the
one way the store flushes a file or a directory to the disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import stat
import sys
import time

from ..._errors import CheckpointTooLarge, StoreError
from ._errors import translating
from ._names import TEMP_PREFIX, join

__all__ = [
    "O_DIRECTORY",
    "O_MARK",
    "O_READ",
    "STALE_SECONDS",
    "open_subdir",
    "open_temp",
    "read_all",
    "remove_stale_temps",
    "scan",
    "sync",
    "unlink_quietly",
    "write_all",
]

logger = logging.getLogger("stepstone.stores.file")

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC
# O_NONBLOCK: opening a FIFO someone planted at a run's path must not wait for a writer.
# It changes nothing for regular files, the only kind read.
O_READ = os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW | os.O_NONBLOCK
O_MARK = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC | _O_NOFOLLOW | os.O_NONBLOCK
_O_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW
_O_SUBDIR = O_DIRECTORY | _O_NOFOLLOW

# A temp file (or an index marker whose run never appeared) this old belongs to a
# writer that crashed: no save takes an hour.
STALE_SECONDS = 3600.0

# The random part of temp names comes from the ``random`` module: seeded from the OS
# once, reseeded in forked children by ``random`` itself, and free of system calls, which
# ``secrets`` is not. Names need to be unique, not secret: O_EXCL does the rest.
_randbits = random.getrandbits


def sync(fd: int) -> None:
    """Flush an open file or directory to the disk."""
    if sys.platform == "darwin":
        # fsync on macOS leaves the data in the drive's cache; only this reaches the disk.
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
    else:
        os.fsync(fd)


def read_all(fd: int, size: int, limit: int) -> bytes:
    """Read a whole document of ``size`` bytes, refusing one over ``limit``."""
    if size > limit:
        raise CheckpointTooLarge(
            f"document is {size} bytes, over the {limit}-byte limit", size, limit
        )
    # Documents are never changed in place (a save renames a new file over the old), so
    # one read of size + 1 bytes returns the whole file; the loop is for the odd file
    # someone else appends to.
    data = os.read(fd, size + 1)
    if len(data) <= size:
        return data
    chunks = [data]
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
        if sum(map(len, chunks)) > limit:
            break
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` whole."""
    written = os.write(fd, data)
    if written < len(data):  # short writes are rare: copy only then
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


def open_temp(dir_fd: int, directory: str) -> tuple[int, str]:
    """Create a new temp file in the store directory; return its fd and name."""
    while True:
        temp = f"{TEMP_PREFIX}{_randbits(64):016x}"
        try:
            with translating(directory, temp):
                return os.open(temp, _O_TEMP, 0o600, dir_fd=dir_fd), temp
        except StoreError as exc:
            if not isinstance(exc.__cause__, FileExistsError):
                raise


def scan(dir_fd: int, where: str) -> list[os.DirEntry[str]]:
    """List the directory ``where`` (relative to ``dir_fd``), never through a symlink."""
    # A private open file description: scandir on a dup of the shared fd would share
    # its read position with concurrent listings in other threads.
    fd = os.open(where, _O_SUBDIR, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as entries:
            return list(entries)
    finally:
        os.close(fd)


def open_subdir(dir_fd: int, name: str) -> int:
    """Open the directory ``name`` in the store directory, never through a symlink."""
    return os.open(name, _O_SUBDIR, dir_fd=dir_fd)


def remove_stale_temps(dir_fd: int, directory: str, names: list[str]) -> None:
    """Delete ``.tmp-*`` files left by writers that crashed; best effort."""
    cutoff = time.time() - STALE_SECONDS
    for file_name in names:
        if not file_name.startswith(TEMP_PREFIX):
            continue
        try:
            st = os.stat(file_name, dir_fd=dir_fd, follow_symlinks=False)
            if st.st_mtime < cutoff and stat.S_ISREG(st.st_mode):
                os.unlink(file_name, dir_fd=dir_fd)
                logger.info("removed stale temp file %s", join(directory, file_name))
        except OSError as exc:
            # Leftovers only waste space; never let them stop the store from opening.
            logger.debug("could not remove temp file %s: %s", join(directory, file_name), exc)


def unlink_quietly(dir_fd: int, name: str) -> None:
    """Remove ``name`` if it is there; a name left behind is only a leftover."""
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)
