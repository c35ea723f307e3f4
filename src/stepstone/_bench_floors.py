"""Floors: the least any code can do to store the same bytes with the same durability.

``stepstone bench`` measures each floor beside the store, interleaved with it, and
reports the store's cost as a ratio to it (see ``_bench.py``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ._codec import encode_state
from ._store import Store

__all__ = ["FileFloor", "Floor", "FloorFactory", "SQLiteFloor", "floor_for"]


class Floor(Protocol):
    """The least work that stores a blob with a given durability; ``op`` does it once."""

    label: str

    def op(self) -> None:
        """Store the blob once (replacing the previous one)."""

    def close(self) -> None:
        """Remove every file the floor created."""


class FileFloor:
    """Temp file + write + fsync + rename over a target + fsync of the directory."""

    def __init__(self, directory: str, data: bytes, durable: bool = True) -> None:
        tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        # Names a FileStore never reads as runs: they start with '.' and end not in .json.
        self._temp = f".stepstone-bench-floor-{tag}.tmp"
        self._final = f".stepstone-bench-floor-{tag}.dat"
        self._data = data
        self._durable = durable
        self._dir = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        self.label = "write+fsync+rename+fsync(dir)" if durable else "write+rename (no fsync)"
        self.op()  # the target exists from now on, as a run's document does

    def op(self) -> None:
        """Replace the target file with the data, as durably as configured."""
        dir_fd = self._dir
        fd = os.open(self._temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=dir_fd)
        try:
            os.write(fd, self._data)
            if self._durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(self._temp, self._final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        if self._durable:
            os.fsync(dir_fd)

    def close(self) -> None:
        """Remove the floor's files and release the directory."""
        for name in (self._temp, self._final):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._dir)
        with contextlib.suppress(OSError):
            os.close(self._dir)


class SQLiteFloor:
    """Raw ``sqlite3``: one upsert of the JSON text + commit, WAL, given ``synchronous``."""

    def __init__(self, path: str, text: str, synchronous: str = "full") -> None:
        self.path = path
        self._text = text
        self.label = f"sqlite3 upsert+commit, WAL, synchronous={synchronous.upper()}"
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, version INTEGER, doc TEXT)"
        )
        self._version = 0
        self.op()

    def op(self) -> None:
        """Upsert the text under one key with a new version number, and commit."""
        # The version must change: SQLite skips writing a row identical to the stored one,
        # and a commit with nothing written does not fsync. Every real save changes its row.
        self._version += 1
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO runs (id, version, doc) VALUES ('r', ?, ?) ON CONFLICT (id) "
            "DO UPDATE SET version = excluded.version, doc = excluded.doc",
            (self._version, self._text),
        )
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection and remove the floor's database files."""
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                os.unlink(self.path + suffix)


#: Makes the floor for a store and a state, or None when there is no floor to compare to.
FloorFactory = Callable[[Store, Mapping[str, Any]], "Floor | None"]


def _level(store: Store, attribute: str) -> str:
    """The durability the store was opened with: its option, else its declared default."""
    levels = type(store).durability_levels
    return str(getattr(store, attribute, None) or (levels[0] if levels else "full"))


def floor_for(store: Store, state: Mapping[str, Any]) -> Floor | None:
    """Return the floor matching ``store``'s backend and durability, or None if it has none.

    The floor stores the state's JSON text, encoded as the store encodes it.
    """
    text, _ = encode_state(dict(state))
    scheme = type(store).scheme
    if scheme == "file":
        directory = getattr(store, "path", None)
        if not isinstance(directory, str):
            return None
        durable = _level(store, "durability") != "none"
        return FileFloor(directory, text.encode("utf-8"), durable)
    if scheme == "sqlite":
        path = getattr(store, "path", None)
        if not isinstance(path, str):
            return None
        synchronous = _level(store, "synchronous")
        floor_path = f"{path}.stepstone-bench-floor-{os.getpid()}-{secrets.token_hex(4)}.db"
        return SQLiteFloor(floor_path, text, synchronous)
    return None
