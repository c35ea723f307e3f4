"""The database file of a SQLite store: created safely, never followed through a link.

The only SQL store with a file of its own is SQLite's; this is its file handling, kept
apart from the statements and connections (``sqlite.py``).
"""

from __future__ import annotations

import os
import stat

from ..._errors import StoreError, StorePermissionError

__all__ = ["create_database_file", "fsync_dir"]


def create_database_file(path: str, *, durable: bool) -> None:
    """Create ``path`` with mode 0600 if missing; refuse a link or a non-regular file.

    With ``durable`` the directory is fsynced after creating the file, so the new entry
    survives a power cut too, not just what is in it.

    Raises:
        StoreError: the path is a symbolic link or not a regular file, or its directory
            does not exist.
        StorePermissionError: the file may not be created.
    """
    # A symlink at the path (dangling or not) is refused: following it would create or
    # write a database wherever its owner pointed it.
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise StoreError(f"{path}: cannot inspect the path: {exc}") from exc
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise StoreError(
                f"{path}: is a symbolic link (to {os.readlink(path)!r}); "
                "refusing to follow it. Give the real path of the database"
            )
        if not stat.S_ISREG(info.st_mode):
            raise StoreError(f"{path}: not a regular file; refusing to open it")
        return
    # Create the file ourselves with 0600 before SQLite does (it would use 0644): SQLite
    # gives the -wal and -shm files the database file's permissions, so they follow.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return create_database_file(path, durable=durable)  # created meanwhile: look again
    except FileNotFoundError as exc:
        raise StoreError(
            f"{path}: cannot create the database: directory {os.path.dirname(path)} does not exist"
        ) from exc
    except PermissionError as exc:
        raise StorePermissionError(
            f"{path}: cannot create the database: permission denied"
        ) from exc
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the database: {exc}") from exc
    os.close(fd)
    if durable:
        fsync_dir(os.path.dirname(path))


def fsync_dir(directory: str) -> None:
    """Flush a directory's entries to disk, where the file system can."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; nothing more we can do
    finally:
        os.close(fd)
