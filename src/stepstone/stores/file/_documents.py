"""Reading a run's document: open it only if it is a regular file, parse and check it.

Nothing planted in the directory is read through: documents are opened
``O_NOFOLLOW | O_NONBLOCK`` (a FIFO fails the open instead of waiting for its other
end) and must be regular files.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from ..._checkpoint import ACTIVE_STATUSES
from ..._codec import PiecesNeeded, checkpoint_from_doc, decode_document
from ..._errors import CheckpointTooLarge, CorruptCheckpoint
from ._disk import O_READ, read_all
from ._errors import translating
from ._names import join

__all__ = ["Known", "doc_active", "open_document", "parse"]


class Known:
    """A run's current document as this store last wrote or read it: kept open."""

    __slots__ = ("active", "fd", "version")

    def __init__(self, fd: int, version: str, active: bool) -> None:
        self.fd = fd
        self.version = version
        self.active = active


def open_document(dir_fd: int, directory: str, file_name: str) -> tuple[int, os.stat_result] | None:
    """Open ``file_name`` for reading if it is a regular file; None if absent.

    Raises:
        CorruptCheckpoint: a symlink, directory or other non-regular file is there.
        StoreError: the open failed.
    """
    with translating(directory, file_name):
        try:
            fd = os.open(file_name, O_READ, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CorruptCheckpoint(
                    f"{join(directory, file_name)}: a symlink, not a checkpoint the file "
                    "store wrote; refusing to follow it; left untouched"
                ) from exc
            raise
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise CorruptCheckpoint(
            f"{join(directory, file_name)}: {kind}, not a checkpoint the file store wrote; "
            "left untouched"
        )
    return fd, st


def parse(
    fd: int, size: int, directory: str, file_name: str, run_id: str | None, limit: int
) -> tuple[dict[str, Any], str]:
    """Read and check a document; ``run_id`` None accepts any (hashed names).

    Raises:
        CorruptCheckpoint: not a whole stepstone document of this run, or over ``limit``.
    """
    path = join(directory, file_name)
    with translating(directory, file_name):
        try:
            data = read_all(fd, size, limit)
        except CheckpointTooLarge as exc:
            raise CorruptCheckpoint(
                f"{path}: not a stepstone checkpoint ({exc}); left untouched"
            ) from exc
    doc = decode_document(data, source=path)
    version = doc.get("version")
    if not isinstance(version, str):
        raise CorruptCheckpoint(
            f"{path}: stepstone checkpoint without a string 'version' key (found "
            f"{version!r}); not written by the file store; left untouched"
        )
    if run_id is not None and doc.get("run_id") != run_id:
        # Only a copied or renamed file gets here: the name is derived from the run_id.
        raise CorruptCheckpoint(
            f"{path}: holds run {doc.get('run_id')!r}, not {run_id!r} (copied or renamed "
            "by hand?); left untouched"
        )
    return doc, version


def doc_active(doc: dict[str, Any]) -> bool:
    """Whether a parsed document's run is queued, running or waiting."""
    try:
        try:
            cp = checkpoint_from_doc(doc, None, source="")
        except PiecesNeeded:
            # A long state is in pieces (schema 3): the status is in the metadata alone.
            cp = checkpoint_from_doc(doc, None, source="", state={})
        return cp.status in ACTIVE_STATUSES
    except CorruptCheckpoint:
        return True  # unknown: keep (or create) the marker; claimable re-checks it
