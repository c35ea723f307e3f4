"""FileStore: the store itself, putting the directory, documents, locks and index together.

Every operation touches a fixed number of files through a directory fd held open, so
the cost of a save does not grow with the number of runs stored, and a later ``chdir``
does not move a store opened from a relative path. A save of a run this process saved
or loaded last is ``flock``, ``fstat``, ``open``, ``write``, ``fsync``, ``rename``,
``fsync`` (directory), ``close``: eight system calls.

Loads, saves and deletes are the pieces protocol (``.._pieces_protocol``) driven by this
store's hooks (``_piece_hooks``), on top of the document's publication (``_publish``);
listings and claims are ``_listing``'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, Self

from ... import _statelog
from ..._checkpoint import Checkpoint, check_run_id
from ..._errors import StorePermissionError
from .._common import Unanswered
from .._pieces_protocol import run_plain
from ._config import Durability, Trust, check_settings, parse_config
from ._disk import O_DIRECTORY, scan
from ._errors import too_large, translating
from ._index import open_index
from ._listing import Listing
from ._locking import Handles
from ._names import ACTIVE, encode_name, run_of
from ._notify import DirectoryListener, listen_directory
from ._pieces import PIECES, check_key, collect_orphans, open_root
from ._publish import MAX_DOCUMENT_BYTES
from ._trust import check_opened, check_trust, make_dirs

__all__ = ["MAX_DOCUMENT_BYTES", "FileStore"]


class FileStore(Listing):
    """Keeps each run's checkpoint as a JSON file in a local directory.

    Config strings: ``file:///abs/dir`` or ``file:rel/dir`` (relative to the working
    directory when opened; the path is taken literally, without percent-decoding). The
    directory, and any missing parent, is created with mode 0700; files get mode 0600.

    Option ``durability``:

    - ``full`` (default): fsync the new file before renaming it into place and the
      directory after. A save that returned survives a process crash and a power cut.
    - ``none``: fsync the new file, never the directory. A save that returned survives a
      process crash; a power cut may roll a run back to an earlier checkpoint (or remove
      a run saved recently for the first time), never leave it torn or empty.

    Option ``trust``: ``strict`` (default) refuses a directory another user could change
    (see ``_trust.check_trust``); ``any`` accepts it, for a directory shared on purpose.

    Saves of one run are serialised across threads and processes by ``flock`` on the
    run's document; saves of different runs run in parallel. Documents over 64 MiB are
    refused with ``CheckpointTooLarge``. POSIX, local file systems only.

    A state over ``_statelog.INLINE_MAX`` is kept in pieces under ``.pieces/<name>/``
    (``_pieces``), written durably before the document naming them, in both modes.
    """

    scheme: ClassVar[str] = "file"
    durability_levels: ClassVar[tuple[str, ...]] = ("full", "none")
    kill_points = MappingProxyType(
        {
            "file.after_temp_write": False,
            "file.after_rename": True,
            "file.before_dir_fsync": True,
        }
    )
    native_async: ClassVar[bool] = False
    claims_by_kind: ClassVar[bool] = True
    #: inotify on the store's directory (``_notify``): Linux only.
    pushes_wakeups: ClassVar[bool] = sys.platform.startswith("linux")
    holds_pieces: ClassVar[bool] = True
    piece_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.piece": False, "pieces.written": False, "pieces.collect": True}
    )
    cleanup_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.deleting": True, "pieces.collecting": True}
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        durability: Durability = "full",
        *,
        trust: Trust = "strict",
    ) -> None:
        self._path = check_settings(path, durability, trust)
        self._handles = Handles(self._path)
        self._index_error = "the file store is closed"
        # Saves whose answer was lost, for their retry (``Unanswered``).
        self._unanswered = Unanswered()
        self._durable = durability == "full"
        self._strict = trust == "strict"
        self.durability: Durability = durability
        self.trust: Trust = trust
        with translating(self._path):
            make_dirs(self._path, self._durable)
            if trust == "strict":
                check_trust(self._path)
            # Held for the store's life: every file is reached relative to it (no path
            # lookups, immune to chdir) and it is what the directory fsync needs.
            dir_fd = self._handles.dir_fd = os.open(self._path, O_DIRECTORY)
            if trust == "strict":
                try:
                    check_opened(self._path, dir_fd)
                except StorePermissionError:
                    self.close()
                    raise
            try:
                self._handles.active_fd = open_index(dir_fd, self._path)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                # A directory this process may only read (an operator listing runs):
                # loads and listings work; saves and claimable say why they cannot.
                self._index_error = f"{self._file(ACTIVE)}: {exc.strerror}"
        self._remove_stale_temps()

    @classmethod
    def from_config(cls, config: str) -> Self:
        path, durability, trust = parse_config(config)
        return cls(path, durability, trust=trust)

    @property
    def path(self) -> str:
        """The store's directory, absolute."""
        return self._path

    def __repr__(self) -> str:
        extra = ", trust='any'" if self.trust == "any" else ""
        return f"FileStore({self._path!r}, durability={self.durability!r}{extra})"

    # -- load, save, delete: the pieces protocol (``_piece_hooks``) ------------------------

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        return self._load(encode_name(run_id), run_id, keep=True)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        check_run_id(checkpoint.run_id)
        self._handles.begin()
        try:
            return run_plain(self._pieces_save(checkpoint))
        finally:
            self._handles.end()

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        check_run_id(run_id)
        dir_fd = self._handles.begin()
        try:
            return self._delete_in(dir_fd, run_id, expected_version)
        finally:
            self._handles.end()

    def collect_orphans(self, min_age: float = _statelog.ORPHAN_AGE) -> list[_statelog.Orphan]:
        """Delete orphaned pieces older than ``min_age`` (``Store.collect_orphans``): of
        runs with no document, each run's directory locked as ``delete`` locks it.

        Raises:
            StoreError: the store's directory cannot be read.
        """
        dir_fd = self._handles.begin()
        try:
            root = open_root(dir_fd, self._path, create=False, strict=self._strict)
            if root is None:
                return []
            try:
                with translating(self._path, PIECES):
                    names = sorted(entry.name for entry in scan(root, "."))
                found: list[_statelog.Orphan] = []
                for name in names:

                    def still_gone(name: str = name) -> bool:
                        try:
                            os.stat(name + ".json", dir_fd=dir_fd, follow_symlinks=False)
                        except FileNotFoundError:
                            return True
                        return False

                    if not still_gone():
                        continue
                    pieces = collect_orphans(
                        root, self._path, name, self._strict, min_age, still_gone=still_gone
                    )
                    run_id = run_of(name)
                    found.extend(_statelog.Orphan(run_id, k, size) for k, size in pieces)
                return found
            finally:
                os.close(root)
        finally:
            self._handles.end()

    # -- the pieces of long states (``_pieces``) ---------------------------------------

    def piece_keys(self, run_id: str) -> list[str]:
        """Every piece key stored for ``run_id``, sorted (history, migration, checks).

        Raises:
            StoreError: something not ours is where the run's pieces go, or a call failed.
        """
        check_run_id(run_id)
        dir_fd = self._handles.begin()
        try:
            run = self._piece_dir(dir_fd, encode_name(run_id), create=False, lock=False)
            if run is None:
                return []
            try:
                return run.keys()
            finally:
                run.close()
        finally:
            self._handles.end()

    def pieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The data of those of ``keys`` stored for ``run_id``; absent keys are absent.

        Raises:
            ValueError: a key is not a piece key (``_pieces.KEY``).
            CorruptCheckpoint: something not ours is at a key.
            StoreError: something not ours is where the run's pieces go, or a call failed.
        """
        check_run_id(run_id)
        wanted = [check_key(key) for key in keys]
        dir_fd = self._handles.begin()
        try:
            return self._read_pieces(dir_fd, encode_name(run_id), wanted)
        finally:
            self._handles.end()

    def put_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> None:
        """Store ``pieces`` for ``run_id`` durably; a key already stored keeps its data.

        Raises:
            ValueError: a key is not a piece key, or does not start with its generation.
            CheckpointTooLarge: a piece is over ``MAX_DOCUMENT_BYTES``.
            StoreError: something not ours is where the run's pieces go, or a call failed.
        """
        check_run_id(run_id)
        for piece in pieces:
            check_key(piece.key)
            if _statelog.gen_of(piece.key) != piece.gen:
                raise ValueError(f"piece {piece.key!r} says generation {piece.gen}")
            if not isinstance(piece.data, bytes):
                raise TypeError(f"piece {piece.key!r}: data must be bytes")
            if len(piece.data) > self._max_bytes:
                raise too_large(run_id, len(piece.data), self._max_bytes)
        if not pieces:
            return
        dir_fd = self._handles.begin()
        try:
            run = self._piece_dir(dir_fd, encode_name(run_id), create=True, lock=True)
            assert run is not None
            try:
                run.write(pieces)
            finally:
                run.close()
        finally:
            self._handles.end()

    def listen(self, ring: Callable[[], None]) -> DirectoryListener | None:
        """Watch the store's directory with inotify; call ``ring`` when a run is saved.

        The directory watched is the one this store holds open and judged when it was
        opened (``_notify`` says why the directory and not only ``.active/``). None on
        systems without inotify: the worker polls.

        Raises:
            StoreError: the store is closed.
        """
        dir_fd = self._handles.begin()
        try:
            return listen_directory(dir_fd, self._path, ring)
        finally:
            self._handles.end()

    def close(self) -> None:
        self._handles.close()

    def __del__(self) -> None:
        # Only a safety net for a forgotten close(); never raise from a finaliser.
        with contextlib.suppress(Exception):
            self.close()
