"""The file store's listings: its runs (``list_runs``, ``list_info``), the runs a worker
may have to act on (``claimable``, from the ``.active/`` index), and the cleanup of what
crashed writers left (index markers of runs at rest, old temp files).

A mixin of ``FileStore`` (``_store``): listings read documents through ``_piece_hooks``'s
load, never a long state's pieces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime

from ..._checkpoint import ACTIVE_STATUSES, RunStatus
from ..._errors import CorruptCheckpoint, StoreError
from ..._runinfo import infos_of
from ..._store import RunInfo, Store, check_page
from ._disk import remove_stale_temps, scan, sync
from ._documents import doc_active
from ._errors import translating
from ._index import drop_orphan, marker_run
from ._names import ACTIVE, HASHED_NAME, decode_name, encode_name
from ._piece_hooks import PieceHooks
from ._publish import logger

__all__ = ["Listing"]


class Listing(PieceHooks, Store):
    """The listings of ``FileStore``."""

    __slots__ = ()

    def _scan(self, where: str = ".") -> list[os.DirEntry[str]]:
        dir_fd = self._handles.begin()
        try:
            with translating(self._path, "" if where == "." else where):
                active_fd = self._handles.active_fd
                if where == ACTIVE and active_fd is not None:
                    # The index the markers are written to, not whatever is at the name
                    # now (a symlink or FIFO swapped in since the store opened).
                    return scan(active_fd, ".")
                return scan(dir_fd, where)
        finally:
            self._handles.end()

    def list_runs(self) -> Iterator[str]:
        entries = self._scan()  # scan now, so errors surface at the call
        return self._run_ids(entries)

    def _run_ids(self, entries: list[os.DirEntry[str]]) -> Iterator[str]:
        for entry in entries:
            file_name = entry.name
            if not file_name.endswith(".json"):
                continue
            stem = file_name[:-5]
            try:
                regular = entry.is_file(follow_symlinks=False)
            except OSError:
                continue  # gone since the scan
            if not regular:
                # A symlink, directory or FIFO named like a run: not ours; never let it
                # stop a listing, a prune or a migration.
                logger.warning(
                    "skipping %s: not a regular file, so not a checkpoint the file store wrote",
                    self._file(file_name),
                )
                continue
            if HASHED_NAME.fullmatch(stem) is None:
                run_id = decode_name(stem)
                if run_id is not None:
                    yield run_id
                continue
            try:
                cp = self._load(stem, None, keep=False)  # its run_id only
            except CorruptCheckpoint as exc:
                logger.warning("skipping %s in list_runs: %s", self._file(file_name), exc)
                continue
            if cp is not None:
                yield cp.run_id

    def list_info(self) -> Iterator[RunInfo]:
        """Yield a ``RunInfo`` per run from its document alone: a state kept in pieces is
        not read, so a listing (and the dashboard's page and counts, built on it) costs
        the same whatever the size of the states.
        """
        yield from infos_of(
            self.list_runs(),
            lambda run_id: self._load(encode_name(run_id), run_id, keep=False),
            logger,
        )

    def claimable(
        self,
        now: datetime,
        limit: int = 100,
        *,
        status: RunStatus | None = None,
        skip: int = 0,
    ) -> list[RunInfo]:
        """Return the runs a worker may have to act on, from the ``.active/`` index.

        Only runs with a marker are read (queued, running and waiting ones, plus markers
        not yet cleaned up), so the cost does not grow with finished runs. Each marker is
        re-checked by loading its run; markers of runs at rest are removed. With
        ``status``, one page of that kind (``Store.claimable``).

        Raises:
            ValueError: ``status`` is not an active status, or ``skip`` is negative.
            StoreError: the index cannot be read.
        """
        check_page(status, skip)
        self._handles.fd()
        if self._handles.active_fd is None:
            logger.warning("no index of active runs (%s): scanning every run", self._index_error)
            return super().claimable(now, limit, status=status, skip=skip)
        dir_fd = self._handles.begin()
        try:
            found = self._claimable_in(dir_fd, now, limit if status is None else None)
        finally:
            self._handles.end()
        if status is None:
            return found
        # Running runs first, then the due ones: each kind is in due_at order.
        return [info for info in found if info.status == status][skip : skip + limit]

    def _claimable_in(self, dir_fd: int, now: datetime, limit: int | None) -> list[RunInfo]:
        running: list[RunInfo] = []
        due: list[RunInfo] = []
        for entry in self._scan(ACTIVE):
            name = entry.name
            ours, run_id = marker_run(name)
            if not ours:
                logger.warning("skipping %s: not an index marker", self._file(f"{ACTIVE}/{name}"))
                continue
            try:
                # The metadata only: a long state's pieces are not read to list it.
                cp = self._load(name, run_id, keep=False)
            except CorruptCheckpoint as exc:
                logger.warning("skipping run %r in claimable: %s", run_id or name, exc)
                continue
            active_fd = self._handles.active_fd
            if cp is None:
                if active_fd is not None:
                    drop_orphan(active_fd, dir_fd, self._path, name)
                continue
            status = cp.status
            if status not in ACTIVE_STATUSES:
                self._drop_rest_marker(dir_fd, name)
                continue
            info = RunInfo.of(cp)
            if status == "running":
                running.append(info)
            elif info.due_at is not None and info.due_at <= now:
                due.append(info)
        running.sort(key=lambda info: info.due_at or now)
        due.sort(key=lambda info: info.due_at or now)
        return running[:limit] + due[:limit]

    def _drop_rest_marker(self, dir_fd: int, name: str) -> None:
        # Re-checked under the document's lock: whoever makes the run active again marks
        # it under the same lock, so the marker cannot be lost in between.
        try:
            locked = self._handles.lock_current(dir_fd, name)
            if locked is None:
                return
            lock_fd, st = locked
            try:
                doc, _ = self._parse(lock_fd, st.st_size, name + ".json", None)
                if not doc_active(doc):
                    sync(dir_fd)  # the rest state must be durable before the marker goes
                    self._unmark(name)
            finally:
                self._handles.release(lock_fd)
        except (OSError, StoreError) as exc:
            logger.debug("could not clean index marker %s: %s", name, exc)

    def _remove_stale_temps(self) -> None:
        """Delete ``.tmp-*`` files left by writers that crashed; best effort."""
        try:
            dir_fd = self._handles.fd()
            names = [entry.name for entry in self._scan()]
        except StoreError as exc:
            logger.debug("could not clean temp files in %s: %s", self._path, exc)
            return
        remove_stale_temps(dir_fd, self._path, names)
