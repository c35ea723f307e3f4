"""The pieces of long states (``stepstone._statelog``): ``DIR/.pieces/<name>/<key>``.

``<name>`` is the run's name (``_names.encode_name``), ``<key>`` the piece key itself
(``<inc>:<gen>.<token>.<n>``, or legacy ``<gen>.<token>.<n>``, lowercase ASCII:
checked, so a key read from a document can never name a path outside the run's
directory). A piece is written once: a temp file in the run's directory, fsynced,
linked to its key, then the directory fsynced, all before the document that names it
is written, in both durability modes: with ``durability=none`` a document's rename may
survive a power cut, and pieces it names that did not would leave the run torn, which
that mode promises never happens.

Nothing is followed: ``.pieces`` and a run's directory are opened ``O_NOFOLLOW |
O_DIRECTORY`` relative to the store's directory fd, pieces ``O_NOFOLLOW`` relative to
their directory's fd, and with ``trust=strict`` both directories must be this user's
(or root's) and not writable by everyone, as the store's own directory.

A run's directory is ``flock``ed: shared by a save from before its pieces are written
until it has collected the old ones, exclusive by ``delete`` while it removes them. So
a delete never removes the pieces of a save of the same run_id under way (a run deleted
and started again at once), and a save never writes into a directory a delete removed
(it re-opens the directory until the one it locked is still the one at the name).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from ... import _hooks
from ..._errors import CorruptCheckpoint, StoreError
from ..._statelog import ORPHAN_AGE, Piece, gen_of, inc_of, is_orphan
from ._disk import STALE_SECONDS, open_subdir, open_temp, read_all, scan, sync, write_all
from ._errors import translating
from ._names import TEMP_PREFIX, join
from ._trust import check_held

__all__ = [
    "EVERY",
    "KEY",
    "PIECES",
    "PieceDir",
    "check_key",
    "collect_orphans",
    "open_root",
    "open_run",
    "remove_run",
]

logger = logging.getLogger("stepstone.stores.file")

PIECES = ".pieces"
#: A piece key as ``_statelog`` makes them: an incarnation and a colon (none in a legacy
#: key), a generation, a dot, then lowercase ASCII.
KEY = re.compile(r"(?:[0-9a-f]{16}:)?[0-9]{1,18}\.[a-z0-9_-][a-z0-9_.-]{0,180}")
#: ``remove_run``'s incarnation for every piece of the run (not an incarnation: those
#: are 16 hex digits).
EVERY: Final = "*"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# O_NONBLOCK: a FIFO planted at a key fails the open instead of waiting for a writer.
_O_READ = os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW | os.O_NONBLOCK


def check_key(key: object) -> str:
    """Return ``key`` if it is a piece key this store can keep, else raise ``ValueError``."""
    if not isinstance(key, str) or KEY.fullmatch(key) is None:
        raise ValueError(
            f"piece key {key!r} is not '[<incarnation>:]<generation>.<lowercase letters, "
            "digits, _ - .>' "
            "(at most 200 characters), as stepstone._statelog makes them"
        )
    return key


def _foreign(path: str, what: str, exc: OSError) -> StoreError:
    kind = "a symlink" if exc.errno == errno.ELOOP else "not a directory"
    return StoreError(
        f"{path}: {kind}, not the directory the file store keeps {what} in; refusing to "
        "follow or use it, so nothing was read or written there. Move it away"
    )


def _check_dir(fd: int, path: str, strict: bool) -> None:
    """With ``trust=strict``, refuse a pieces directory another user could change."""
    if not strict:
        return
    check_held(
        fd,
        path,
        "refusing this directory of pieces: owned by {owner} with mode {mode}, so another "
        "user could forge or remove the pieces of long states",
    )


def _open_dir(parent_fd: int, name: str, path: str, what: str, create: bool) -> int | None:
    """Open the directory ``name`` in ``parent_fd`` (creating it, durably, with ``create``)."""
    with translating(path):
        for _ in range(3):
            try:
                return open_subdir(parent_fd, name)
            except FileNotFoundError:
                if not create:
                    return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _foreign(path, what, exc) from exc
                raise
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                continue  # made meanwhile by another saver: open it
            # The new entry lives in the parent: durable before any piece in it is
            # named by a document, in both modes.
            sync(parent_fd)
        raise StoreError(f"{path}: created and removed again three times; try again")


def open_root(dir_fd: int, directory: str, *, create: bool, strict: bool) -> int | None:
    """Open ``DIR/.pieces``; None if absent and not ``create``.

    Raises:
        StoreError: a symlink or a file is there (never followed), or the open failed.
        StorePermissionError: with ``strict``, another user could change it.
    """
    path = join(directory, PIECES)
    fd = _open_dir(dir_fd, PIECES, path, "the pieces of long states", create)
    if fd is not None:
        try:
            _check_dir(fd, path, strict)
        except BaseException:
            os.close(fd)
            raise
    return fd


class PieceDir:
    """A run's directory of pieces, open (and, for writers, ``flock``ed)."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def close(self) -> None:
        """Close the directory (which releases its ``flock``)."""
        os.close(self.fd)

    def read(self, keys: Iterable[str], limit: int) -> dict[str, bytes]:
        """The data of those of ``keys`` stored here; absent keys absent.

        Raises:
            CorruptCheckpoint: a key is malformed, or something not ours is at it.
        """
        found: dict[str, bytes] = {}
        for key in keys:
            if not isinstance(key, str) or KEY.fullmatch(key) is None:
                raise CorruptCheckpoint(
                    f"{self.path}: the document names the piece {key!r}, which is not a "
                    "piece key; left untouched"
                )
            data = self._read_one(key, limit)
            if data is not None:
                found[key] = data
        return found

    def _read_one(self, key: str, limit: int) -> bytes | None:
        where = join(self.path, key)
        with translating(self.path, key):
            try:
                fd = os.open(key, _O_READ, dir_fd=self.fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO):
                    raise CorruptCheckpoint(
                        f"{where}: not a piece the file store wrote (a symlink or FIFO); "
                        "refusing to follow it; left untouched"
                    ) from exc
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise CorruptCheckpoint(
                        f"{where}: not a regular file, so not a piece the file store wrote; "
                        "left untouched"
                    )
                return read_all(fd, st.st_size, limit)
            finally:
                os.close(fd)

    def write(self, pieces: Sequence[Piece]) -> None:
        """Store ``pieces`` durably: each whole under its key, or not at all.

        A key already stored keeps what it holds (keys are written once).
        """
        for piece in pieces:
            temp_fd, temp = open_temp(self.fd, self.path)
            try:
                with translating(self.path, temp):
                    try:
                        write_all(temp_fd, piece.data)
                        sync(temp_fd)
                    finally:
                        os.close(temp_fd)
                # link, not rename: a key that exists is never replaced.
                with translating(self.path, piece.key), contextlib.suppress(FileExistsError):
                    os.link(
                        temp,
                        piece.key,
                        src_dir_fd=self.fd,
                        dst_dir_fd=self.fd,
                        follow_symlinks=False,
                    )
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=self.fd)
            _hooks.fire("pieces.piece")  # chaos: a kill between two pieces of a save
        with translating(self.path):
            sync(self.fd)

    def names(self) -> list[str]:
        """Every entry of the directory (keys, temps, and whatever else is there)."""
        with translating(self.path):
            return [entry.name for entry in scan(self.fd, ".")]

    def keys(self) -> list[str]:
        """Every piece key stored here, sorted."""
        return sorted(name for name in self.names() if KEY.fullmatch(name) is not None)

    def remove(self, keys: Iterable[str]) -> None:
        """Remove these pieces if present; best effort (a piece left is only garbage)."""
        for key in keys:
            try:
                os.unlink(key, dir_fd=self.fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("could not remove piece %s: %s", join(self.path, key), exc)

    def collect(self, below: int, inc: str | None, orphan_age: float = ORPHAN_AGE) -> None:
        """Remove incarnation ``inc``'s pieces of generations below ``below`` (legacy keys
        for None), orphans older than ``orphan_age`` and stale temp files."""
        cutoff = time.time() - STALE_SECONDS
        doomed: list[str] = []
        for name in self.names():
            if KEY.fullmatch(name) is not None:
                if (inc_of(name) == inc and gen_of(name) < below) or is_orphan(
                    name, inc, orphan_age
                ):
                    doomed.append(name)
            elif name.startswith(TEMP_PREFIX):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                    if st.st_mtime < cutoff and stat.S_ISREG(st.st_mode):
                        doomed.append(name)
            else:
                logger.warning(
                    "leaving %s: not a piece the file store wrote", join(self.path, name)
                )
        self.remove(doomed)


def _lock(fd: int, path: str, shared: bool) -> None:
    with translating(path):
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)


def _same(fd: int, parent_fd: int, name: str) -> bool:
    """Whether the directory open at ``fd`` is still the one at ``name``."""
    try:
        there = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return os.path.samestat(there, os.fstat(fd))


def open_run(
    root_fd: int, directory: str, name: str, *, create: bool, strict: bool, lock: bool
) -> PieceDir | None:
    """Open the run's directory of pieces; None if absent and not ``create``.

    With ``lock``, hold it shared (a saver's lock; see the module docstring), re-opening
    it until the directory locked is the one at the name.

    Raises:
        StoreError: a symlink or a file is there (never followed), or a call failed.
        StorePermissionError: with ``strict``, another user could change it.
    """
    path = join(join(directory, PIECES), name)
    for _ in range(100):
        fd = _open_dir(root_fd, name, path, "a run's pieces", create)
        if fd is None:
            return None
        try:
            _check_dir(fd, path, strict)
            if not lock:
                return PieceDir(fd, path)
            _lock(fd, path, shared=True)
            with translating(path):
                if _same(fd, root_fd, name):
                    return PieceDir(fd, path)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed by a delete while we waited: start over
    raise StoreError(f"{path}: removed under this save 100 times; try again")


def remove_run(
    root_fd: int,
    directory: str,
    name: str,
    strict: bool,
    *,
    still_gone: Callable[[], bool],
    inc: str | None = EVERY,
) -> None:
    """Remove a deleted run's pieces of incarnation ``inc`` (None: its legacy keys;
    ``EVERY``: all), leftover temps, and the directory once empty; best effort, logged.

    ``still_gone()`` is asked once the directory is locked exclusively: False means the
    run was saved again meanwhile (a new run under the same run_id), whose pieces stay.
    """
    path = join(join(directory, PIECES), name)
    try:
        fd = open_subdir(root_fd, name)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            # Planted at the run's name: delete is the operator's explicit request, so the
            # entry goes, never what it points to.
            logger.warning("removing %s: not a directory the file store made", path)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=root_fd)
            return
        logger.warning("could not remove the pieces in %s: %s", path, exc)
        return
    run = PieceDir(fd, path)
    try:
        _check_dir(fd, path, strict)
        _lock(fd, path, shared=False)
        if not still_gone():
            return
        # Under the exclusive lock no saver is in the directory: every temp is a leftover.
        names = run.names()
        doomed = [n for n in names if n.startswith(TEMP_PREFIX) or _of(n, inc)]
        run.remove(doomed)
        left = set(names) - set(doomed)
        if not left:
            try:
                os.rmdir(name, dir_fd=root_fd)
            except OSError as exc:
                logger.warning("leaving %s: %s", path, exc)
        elif any(KEY.fullmatch(n) is None for n in left):
            logger.warning("leaving %s: it holds files the file store did not write", path)
    except (OSError, StoreError) as exc:
        logger.warning("could not remove the pieces in %s: %s", path, exc)
    finally:
        run.close()


def _of(name: str, inc: str | None) -> bool:
    """Whether ``name`` is a piece key of incarnation ``inc`` (``EVERY``: of any)."""
    return KEY.fullmatch(name) is not None and (inc == EVERY or inc_of(name) == inc)


def collect_orphans(
    root_fd: int,
    directory: str,
    name: str,
    strict: bool,
    min_age: float,
    *,
    still_gone: Callable[[], bool],
) -> list[tuple[str, int]]:
    """Remove the orphans (``_statelog.is_orphan``) of a run with no document:
    ``(key, bytes)`` of each; the directory too once empty. Best effort, logged.

    ``still_gone()`` is asked under the directory's exclusive lock, as by ``remove_run``.
    """
    path = join(join(directory, PIECES), name)
    try:
        fd = open_subdir(root_fd, name)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            logger.warning("could not look for orphans in %s: %s", path, exc)
        return []
    run = PieceDir(fd, path)
    found: list[tuple[str, int]] = []
    try:
        _check_dir(fd, path, strict)
        _lock(fd, path, shared=False)
        if not still_gone():
            return []
        names = run.names()
        for key in names:
            if KEY.fullmatch(key) is not None and is_orphan(key, None, min_age):
                size = os.stat(key, dir_fd=fd, follow_symlinks=False).st_size
                run.remove([key])
                found.append((key, size))
                _hooks.fire("pieces.collecting")  # chaos: a kill between two orphans
        if len(found) == len(names):
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=root_fd)
    except (OSError, StoreError) as exc:
        logger.warning("could not collect the orphans in %s: %s", path, exc)
    finally:
        run.close()
    return found
