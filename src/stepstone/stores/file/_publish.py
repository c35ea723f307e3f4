"""Putting a run's document in place and taking it away: the atomic rename of a save, the
unlink of a delete, and the ``.active/`` marker each keeps in step with the document.

The base of ``FileStore`` (``_store``): it declares what a store holds (its directory fd
and open documents, ``_locking.Handles``; its path and options), which the mixins above
it (``_piece_hooks``, ``_listing``) use too.
"""

from __future__ import annotations

import fcntl
import logging
import os
from typing import Any, ClassVar

from ..._errors import ConflictError, CorruptCheckpoint, StorePermissionError
from ..._hooks import fire
from .._common import Unanswered
from ._config import Durability, Trust
from ._disk import open_temp, sync, unlink_quietly, write_all
from ._documents import parse
from ._errors import translating
from ._index import has_marker, mark, unmark
from ._locking import Handles
from ._names import join, run_of

__all__ = ["MAX_DOCUMENT_BYTES", "Publisher", "logger"]

logger = logging.getLogger("stepstone.stores.file")

#: Largest document a save writes (and a load reads): far above any sane checkpoint, low
#: enough that a runaway state fails loudly instead of filling the disk. A long state's
#: document names its pieces instead of holding it, so this bounds the document and each
#: piece, not the state.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


class Publisher:
    """The document side of ``FileStore``; ``FileStore.__init__`` sets the attributes."""

    _path: str
    _handles: Handles
    #: Why saves cannot index active runs (a directory this process may only read).
    _index_error: str
    # Saves whose answer was lost, for their retry (``Unanswered``).
    _unanswered: Unanswered
    _durable: bool
    _strict: bool
    #: ``MAX_DOCUMENT_BYTES``, read from here (tests lower it).
    _max_bytes: ClassVar[int] = MAX_DOCUMENT_BYTES
    durability: Durability
    trust: Trust

    def _file(self, name: str) -> str:
        return join(self._path, name)

    def _parse(
        self, fd: int, size: int, file_name: str, run_id: str | None
    ) -> tuple[dict[str, Any], str]:
        return parse(fd, size, self._path, file_name, run_id, self._max_bytes)

    # -- a save's document ----------------------------------------------------------------

    def _publish(self, dir_fd: int, name: str, data: bytes, *, create: bool, unmark: bool) -> int:
        """Atomically put ``data`` at ``<name>.json``; return the new document's open fd.

        ``create``: the run has no document, and the new one appears only if still none
        does (``link`` fails if the name exists: the compare-and-swap of a first save).
        ``unmark``: the run stops being active; its index marker goes after the save,
        while the new document is locked, so that whoever makes it active again next
        (and marks it) does so after the marker is gone.
        """
        fd, temp = open_temp(dir_fd, self._path)
        self._handles.track(fd)
        try:
            with translating(self._path, temp):
                write_all(fd, data)
                fire("file.after_temp_write")
                # Before the rename, in both modes: else a power cut can leave the name
                # pointing at a file whose data never reached the disk (empty or torn).
                sync(fd)
                if unmark:
                    fcntl.flock(fd, fcntl.LOCK_EX)
            self._rename(dir_fd, temp, name, create=create)
        except BaseException:
            unlink_quietly(dir_fd, temp)
            self._handles.release(fd)
            raise
        try:
            fire("file.after_rename")
            fire("file.before_dir_fsync")
            if self._durable or unmark:
                # The rename is a change to the directory; only this makes it survive power
                # loss. Before a marker goes, in both modes: a power cut must not leave the
                # run active again (the rename undone) with its marker gone.
                with translating(self._path):
                    sync(dir_fd)
            if unmark:
                try:
                    self._unmark(name)
                finally:
                    with translating(self._path, name + ".json"):
                        fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            self._handles.release(fd)
            raise
        return fd

    def _rename(self, dir_fd: int, temp: str, name: str, *, create: bool) -> None:
        """Put the temp file at ``<name>.json``; with ``create``, only if nothing is there."""
        final = name + ".json"
        with translating(self._path, final):
            if not create:
                os.rename(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                return
            try:
                os.link(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                raise ConflictError(
                    f"run {run_of(name)!r}: expected no checkpoint, but one was saved meanwhile",
                    run_of(name),
                ) from None
            finally:
                unlink_quietly(dir_fd, temp)

    # -- the index of active runs --------------------------------------------------------

    def _mark(self, name: str, status: str) -> None:
        active_fd = self._handles.active_fd
        if active_fd is None:
            self._handles.fd()
            raise StorePermissionError(
                f"{self._path}: cannot index the active run {name!r}: {self._index_error}"
            )
        mark(active_fd, self._path, name, status)

    def _unmark(self, name: str) -> None:
        unmark(self._handles.active_fd, self._path, name)

    # -- a delete's document -------------------------------------------------------------

    def _unlink_locked(self, dir_fd: int, name: str) -> None:
        """Remove the run's document, which the caller holds locked, and its marker."""
        with translating(self._path, name + ".json"):
            os.unlink(name + ".json", dir_fd=dir_fd)
        if self._durable:
            with translating(self._path):
                sync(dir_fd)
        # The marker goes after the document is durably gone (a crash in between
        # leaves a hint claimable cleans up), under the lock of the document that was
        # current, so a power cut cannot bring back an active run without its marker.
        if has_marker(self._handles.active_fd, name):
            if not self._durable:
                with translating(self._path):
                    sync(dir_fd)
            self._unmark(name)
        # Lock files of releases before this index existed: their run is gone.
        unlink_quietly(dir_fd, name + ".lock")

    def _unlink_foreign(self, dir_fd: int, name: str) -> bool:
        """Remove a symlink, FIFO or other entry not ours at the run's name; whether
        there was one."""
        # Delete is the operator's explicit request, so the entry goes, without reading
        # through it.
        file_name = name + ".json"
        with translating(self._path, file_name):
            try:
                os.unlink(file_name, dir_fd=dir_fd)
            except IsADirectoryError:
                raise CorruptCheckpoint(
                    f"{self._file(file_name)}: a directory, not a checkpoint; left untouched"
                ) from None
            except FileNotFoundError:
                return False
        self._unmark(name)
        return True
