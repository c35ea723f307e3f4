"""FileStore: one JSON document per run in a local directory.

On disk
-------
``DIR/<name>.json`` holds the run's checkpoint: the shared stepstone document (see
``_codec.encode_document``) plus a top-level ``"version"`` key holding the version token.
``<name>`` encodes the run_id: the bytes ``a-z 0-9 _ -`` and ``.`` (not first) of its UTF-8
pass through, every other byte becomes ``%xx`` in lowercase hex. An encoded name over 200
bytes becomes ``~`` + the SHA-256 hex of the run_id instead. ``DIR/<name>.lock`` is the
run's lock file (empty). ``DIR/.tmp-*`` are files being written. Nothing else is written,
and files this store did not write are never modified or deleted (except by ``delete``
of the run whose name they carry). ``backends/file/README.md`` has the details.

Why these choices
-----------------
- Names hold only lowercase ASCII, so two run_ids differing in case cannot collide on a
  case-insensitive or Unicode-normalising file system, ``/`` and ``..`` cannot escape the
  directory, and the mapping is reversible, so ``list_runs`` needs no index. Hashing
  keeps names under NAME_MAX (255); the document keeps the real run_id, and ``~`` is
  never produced by escaping, so hashed and escaped names cannot collide.
- A save writes a temp file and renames it over the document: ``rename`` is atomic, so a
  reader sees the old or the new document, never a mix, and needs no lock.
- Compare-and-swap holds ``flock`` on the run's lock file. ``flock`` locks belong to an
  open file description, so one lock excludes other processes and other threads of this
  process alike, and the kernel drops it if the holder dies: no stale locks. The lock is
  per run, so saves of different runs never wait on each other. The data file itself
  cannot carry the lock, since every save replaces its inode.
- Every operation touches a fixed number of files through a directory fd held open, so
  the cost of a save does not grow with the number of runs stored, and a later ``chdir``
  does not move a store opened from a relative path.

Guarantees
----------
``durability=full`` (the default) fsyncs the temp file before the rename and the
directory after it (and after ``delete``). A save that returned survives a process crash
and a power cut. ``durability=none`` skips both fsyncs: a save that returned survives a
process crash (the data is in the kernel's page cache), but a power cut or kernel crash
may lose recent saves, or on some file systems leave an empty document (which then loads
as ``CorruptCheckpoint``). In both modes a crash never leaves a partly written document.
A crash between writing and renaming leaves a ``.tmp-*`` file, removed when a store is
next opened on the directory if it is over an hour old.

If the save raises after the rename (only the directory fsync can), the new checkpoint
may be visible and may or may not survive a power cut; reload to find out.

Meant for local file systems; POSIX only (``fcntl``). On network file systems ``flock``
may not exclude other hosts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Iterator
from typing import Any, ClassVar, Literal, Self
from urllib.parse import unquote_to_bytes, urlsplit

from .._checkpoint import Checkpoint, check_run_id, utcnow
from .._codec import checkpoint_from_doc, decode_document, encode_document, encode_state
from .._errors import (
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    StepstoneError,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
)
from .._hooks import fire
from .._store import Store
from ._common import new_version, parse_options

__all__ = ["MAX_DOCUMENT_BYTES", "FileStore"]

logger = logging.getLogger("stepstone.stores.file")

#: Largest document a save writes (and a load reads): far above any sane checkpoint, low
#: enough that a runaway state fails loudly instead of filling the disk.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024

Durability = Literal["full", "none"]

_FORMS = (
    "file:///abs/dir or file:rel/dir (relative to the working directory), "
    "optionally followed by ?durability=full or ?durability=none"
)
_MAX_NAME = 200
_TEMP_PREFIX = ".tmp-"
# A temp file this old belongs to a writer that crashed: no save takes an hour.
_STALE_TEMP_SECONDS = 3600.0

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

# byte -> how it appears in a name
_ESCAPE = [
    chr(b) if chr(b) in "abcdefghijklmnopqrstuvwxyz0123456789_-." else f"%{b:02x}"
    for b in range(256)
]
_PLAIN_NAME = re.compile(r"[a-z0-9_-][a-z0-9_.-]*")
_ESCAPED_NAME = re.compile(r"(?:[a-z0-9_-]|%[0-9a-f]{2})(?:[a-z0-9_.-]|%[0-9a-f]{2})*")
_HASHED_NAME = re.compile(r"~[0-9a-f]{64}")


def _hashed(run_id: str) -> str:
    return "~" + hashlib.sha256(run_id.encode("utf-8")).hexdigest()


def encode_name(run_id: str) -> str:
    """Return the file name stem for a (valid) run_id; see the module docstring."""
    if _PLAIN_NAME.fullmatch(run_id) is not None:
        name = run_id
    else:
        name = "".join([_ESCAPE[b] for b in run_id.encode("utf-8")])
        if name[0] == ".":
            name = "%2e" + name[1:]
    return name if len(name) <= _MAX_NAME else _hashed(run_id)


def decode_name(name: str) -> str | None:
    """Return the run_id an escaped stem encodes, or None if no run_id encodes to it.

    Hashed stems (``~...``) are not reversible: their run_id is read from the document.
    """
    if _ESCAPED_NAME.fullmatch(name) is None:
        return None
    try:
        run_id = check_run_id(unquote_to_bytes(name).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    # Only the canonical spelling counts ("%61" is not "a"), so each run has one file.
    return run_id if encode_name(run_id) == name else None


def _sync(fd: int) -> None:
    if sys.platform == "darwin":
        # fsync on macOS leaves the data in the drive's cache; only this reaches the disk.
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
    else:
        os.fsync(fd)


class _translate:  # lowercase: it reads like a function at each use
    """Turn an ``OSError`` about ``directory/name`` into the matching ``StoreError``.

    The one place OS errors are translated. A class, not ``@contextmanager``: it sits on
    the save path several times, and the path string is only built when something failed.
    """

    __slots__ = ("directory", "name")

    def __init__(self, directory: str, name: str = "") -> None:
        self.directory = directory
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        # StorePermissionError is an OSError too: never wrap our own errors.
        if not isinstance(exc, OSError) or isinstance(exc, StepstoneError):
            return
        path = os.path.join(self.directory, self.name) if self.name else self.directory
        if isinstance(exc, PermissionError):
            raise StorePermissionError(f"{path}: permission denied ({exc.strerror})") from exc
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        message = f"{path}: {exc.strerror or exc} ({code})"
        if exc.errno in (errno.ENOLCK, errno.ESTALE, errno.ETIMEDOUT):
            raise StoreUnavailable(message) from exc
        raise StoreError(message) from exc


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    if size > MAX_DOCUMENT_BYTES:
        raise CheckpointTooLarge(
            f"document is {size} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit",
            size,
            MAX_DOCUMENT_BYTES,
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
    return b"".join(chunks)


def _make_dirs(path: str, durable: bool) -> None:
    """Create ``path`` and missing parents with mode 0700, persisting the new entries."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if parent == path:
            raise
        _make_dirs(parent, durable)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return
    if durable:
        # A new directory's entry lives in its parent: without this a power cut can lose
        # the directory with every checkpoint saved in it.
        fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        try:
            _sync(fd)
        finally:
            os.close(fd)


class FileStore(Store):
    """Keeps each run's checkpoint as a JSON file in a local directory.

    Config strings: ``file:///abs/dir`` or ``file:rel/dir`` (relative to the working
    directory when opened; the path is taken literally, without percent-decoding). The
    directory, and any missing parent, is created with mode 0700; files get mode 0600.

    Option ``durability``:

    - ``full`` (default): fsync the new file before renaming it into place and the
      directory after. A save that returned survives a process crash and a power cut.
    - ``none``: no fsync at all. A save that returned survives a process crash, not a
      power cut or kernel crash, which may lose recent saves. Faster on slow disks.

    Saves of one run are serialised across threads and processes by ``flock`` on the
    run's lock file; saves of different runs run in parallel. Documents over 64 MiB are
    refused with ``CheckpointTooLarge``. POSIX, local file systems only.
    """

    scheme: ClassVar[str] = "file"

    def __init__(self, path: str | os.PathLike[str], durability: Durability = "full") -> None:
        self._dir_fd: int | None = None
        if durability not in ("full", "none"):
            raise ConfigError(
                f"durability must be 'full' or 'none', got {durability!r}. Forms: {_FORMS}"
            )
        raw = os.fspath(path)
        if not isinstance(raw, str) or not raw:
            raise ConfigError(f"the file store needs a directory path, got {path!r}")
        self._path = os.path.abspath(raw)
        self._durable = durability == "full"
        self.durability: Durability = durability
        with _translate(self._path):
            _make_dirs(self._path, self._durable)
            # Held for the store's life: every file is reached relative to it (no path
            # lookups, immune to chdir) and it is what the directory fsync needs.
            self._dir_fd = os.open(self._path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        self._remove_stale_temps()

    @classmethod
    def from_config(cls, config: str) -> Self:
        parts = urlsplit(config)
        if parts.scheme.lower() != "file":
            raise ConfigError(f"not a file store config: {config!r}; forms: {_FORMS}")
        if parts.netloc:
            raise ConfigError(
                f"file store config {config!r} names a host ({parts.netloc!r}); only local "
                f"directories are supported. Forms: {_FORMS}"
            )
        if parts.fragment or config.endswith("#"):
            raise ConfigError(f"file store config {config!r} has a '#' fragment; forms: {_FORMS}")
        path = parts.path
        if not path:
            raise ConfigError(f"file store config {config!r} names no directory; forms: {_FORMS}")
        if path.startswith("//"):
            path = "/" + path.lstrip("/")  # file:////abs, by analogy with sqlite:////abs
        options = parse_options(parts.query, {"durability": ("full", "none")}, _FORMS)
        durability: Durability = "none" if options.get("durability") == "none" else "full"
        return cls(path, durability)

    @property
    def path(self) -> str:
        """The store's directory, absolute."""
        return self._path

    def __repr__(self) -> str:
        return f"FileStore({self._path!r}, durability={self.durability!r})"

    def _fd(self) -> int:
        if self._dir_fd is None:
            raise StoreError(f"{self._path}: the file store is closed")
        return self._dir_fd

    def _file(self, name: str) -> str:
        return f"{self._path}/{name}" if self._path != "/" else f"/{name}"

    # -- reading ------------------------------------------------------------------------

    def _read(self, dir_fd: int, name: str, run_id: str) -> tuple[dict[str, Any], str] | None:
        """Return ``(document, version)`` of ``<name>.json``, None if absent; raise if not ours."""
        file_name = name + ".json"
        with _translate(self._path, file_name):
            try:
                fd = os.open(file_name, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            try:
                data = _read_all(fd)
            except CheckpointTooLarge as exc:
                raise CorruptCheckpoint(
                    f"{self._file(file_name)}: not a stepstone checkpoint ({exc}); left untouched"
                ) from exc
            finally:
                os.close(fd)
        path = self._file(file_name)
        doc = decode_document(data, source=path)
        version = doc.get("version")
        if not isinstance(version, str):
            raise CorruptCheckpoint(
                f"{path}: stepstone checkpoint without a string 'version' key (found "
                f"{version!r}); not written by the file store; left untouched"
            )
        if doc.get("run_id") != run_id:
            # Only a copied or renamed file gets here: the name is derived from the run_id.
            raise CorruptCheckpoint(
                f"{path}: holds run {doc.get('run_id')!r}, not {run_id!r} (copied or renamed "
                "by hand?); left untouched"
            )
        return doc, version

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        name = encode_name(run_id)
        # No lock: the rename that publishes a document is atomic.
        found = self._read(self._fd(), name, run_id)
        if found is None:
            return None
        return checkpoint_from_doc(found[0], found[1], source=self._file(name + ".json"))

    # -- writing ------------------------------------------------------------------------

    def _lock(self, dir_fd: int, name: str) -> int:
        """Open the run's lock file and hold ``flock`` on it; return the fd."""
        lock_name = name + ".lock"
        with _translate(self._path, lock_name):
            while True:
                fd = os.open(
                    lock_name,
                    os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW,
                    0o600,
                    dir_fd=dir_fd,
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    held = os.fstat(fd)
                    try:
                        now = os.stat(lock_name, dir_fd=dir_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        now = None
                except BaseException:
                    os.close(fd)
                    raise
                # ``delete`` unlinks the lock file while holding it; whoever waited on that
                # inode holds a lock nobody else will ever ask for, so start over.
                if now is not None and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
                    return fd
                os.close(fd)

    @staticmethod
    def _unlock(fd: int) -> None:
        # Unlock before closing: a child forked meanwhile shares the open file description
        # and would otherwise keep the run locked until it exits.
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        run_id = check_run_id(checkpoint.run_id)
        text, copy = encode_state(checkpoint.state)
        if len(text) > MAX_DOCUMENT_BYTES:  # characters <= bytes: refuse before any I/O
            raise self._too_large(run_id, len(text.encode("utf-8", "backslashreplace")))
        dir_fd = self._fd()
        name = encode_name(run_id)
        lock_fd = self._lock(dir_fd, name)
        try:
            # Only the version is needed, and a document can only carry the expected one
            # if the caller loaded it (which checked every field) or wrote it: parsing it
            # is what proves the file is ours and whole, so a corrupt file stays put.
            current = self._read(dir_fd, name, run_id)
            current_version = None if current is None else current[1]
            if current_version != checkpoint.version:
                raise ConflictError(
                    f"run {run_id!r}: expected version {checkpoint.version!r}, "
                    f"stored {current_version!r}",
                    run_id,
                )
            version = new_version(current_version)
            saved = checkpoint.stored(copy, text, version, utcnow())
            document = encode_document(saved, text, extra={"version": version})
            # JSON text can hold lone surrogates, which UTF-8 cannot; they only occur inside
            # string literals, where the \\udXXX that backslashreplace writes is the JSON
            # escape for the same character, so the document still round-trips exactly.
            data = document.encode("utf-8", "backslashreplace")
            if len(data) > MAX_DOCUMENT_BYTES:
                raise self._too_large(run_id, len(data))
            self._publish(dir_fd, name + ".json", data)
        finally:
            with _translate(self._path, name + ".lock"):
                self._unlock(lock_fd)
        return saved

    def _too_large(self, run_id: str, size: int) -> CheckpointTooLarge:
        return CheckpointTooLarge(
            f"run {run_id!r}: checkpoint document is {size} bytes, over the file store's "
            f"limit of {MAX_DOCUMENT_BYTES} bytes; nothing was stored",
            size,
            MAX_DOCUMENT_BYTES,
        )

    def _publish(self, dir_fd: int, final: str, data: bytes) -> None:
        """Atomically replace ``final`` with ``data``, durably if so configured."""
        temp = _TEMP_PREFIX + secrets.token_hex(8)
        with _translate(self._path, temp):
            fd = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
        try:
            with _translate(self._path, temp):
                try:
                    written = os.write(fd, data)
                    if written < len(data):  # short writes are rare: copy only then
                        view = memoryview(data)[written:]
                        while view:
                            view = view[os.write(fd, view) :]
                    fire("file.after_temp_write")
                    if self._durable:
                        # Before the rename: else a power cut can leave the new name
                        # pointing at a file whose data never reached the disk.
                        _sync(fd)
                finally:
                    os.close(fd)
            with _translate(self._path, final):
                os.rename(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        fire("file.after_rename")
        fire("file.before_dir_fsync")
        if self._durable:
            # The rename is a change to the directory; only this makes it survive power loss.
            with _translate(self._path):
                _sync(dir_fd)

    def delete(self, run_id: str) -> bool:
        check_run_id(run_id)
        dir_fd = self._fd()
        name = encode_name(run_id)
        lock_fd = self._lock(dir_fd, name)
        try:
            with _translate(self._path, name + ".json"):
                try:
                    os.unlink(name + ".json", dir_fd=dir_fd)
                    existed = True
                except FileNotFoundError:
                    existed = False
            # Unlinked while held, so no one can lock it after us; waiters on this inode
            # notice in ``_lock`` and retry on a fresh file.
            with (
                _translate(self._path, name + ".lock"),
                contextlib.suppress(FileNotFoundError),
            ):
                os.unlink(name + ".lock", dir_fd=dir_fd)
            if existed and self._durable:
                with _translate(self._path):
                    _sync(dir_fd)
        finally:
            with _translate(self._path, name + ".lock"):
                self._unlock(lock_fd)
        return existed

    # -- listing and housekeeping -------------------------------------------------------

    def _names(self) -> list[str]:
        dir_fd = self._fd()
        with _translate(self._path):
            # A private open file description: scandir on a dup of the shared fd would share
            # its read position with concurrent listings in other threads.
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC, dir_fd=dir_fd)
            try:
                with os.scandir(fd) as entries:
                    return [entry.name for entry in entries]
            finally:
                os.close(fd)

    def list_runs(self) -> Iterator[str]:
        names = self._names()  # scan now, so errors surface at the call
        return self._run_ids(names)

    def _run_ids(self, names: list[str]) -> Iterator[str]:
        for file_name in names:
            if not file_name.endswith(".json"):
                continue
            stem = file_name[:-5]
            if _HASHED_NAME.fullmatch(stem) is None:
                run_id = decode_name(stem)
                if run_id is not None:
                    yield run_id
                continue
            found = self._hashed_run_id(stem)
            if found is not None:
                yield found

    def _hashed_run_id(self, stem: str) -> str | None:
        path = self._file(stem + ".json")
        with _translate(path):
            try:
                fd = os.open(
                    stem + ".json", os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW, dir_fd=self._fd()
                )
            except FileNotFoundError:
                return None  # deleted since the scan
            try:
                data = _read_all(fd)
            except CheckpointTooLarge:
                data = b""
            finally:
                os.close(fd)
        try:
            run_id = decode_document(data, source=path).get("run_id")
        except CorruptCheckpoint as exc:
            logger.warning("skipping %s in list_runs: %s", path, exc)
            return None
        if not isinstance(run_id, str) or _hashed(run_id) != stem:
            logger.warning(
                "skipping %s in list_runs: its run_id %r does not hash to its name", path, run_id
            )
            return None
        return run_id

    def _remove_stale_temps(self) -> None:
        """Delete ``.tmp-*`` files left by writers that crashed; best effort."""
        cutoff = time.time() - _STALE_TEMP_SECONDS
        try:
            dir_fd = self._fd()
            names = self._names()
        except StoreError as exc:
            logger.debug("could not clean temp files in %s: %s", self._path, exc)
            return
        for file_name in names:
            if not file_name.startswith(_TEMP_PREFIX):
                continue
            try:
                st = os.stat(file_name, dir_fd=dir_fd, follow_symlinks=False)
                if st.st_mtime < cutoff:
                    os.unlink(file_name, dir_fd=dir_fd)
                    logger.info("removed stale temp file %s", self._file(file_name))
            except OSError as exc:
                # Leftovers only waste space; never let them stop the store from opening.
                logger.debug("could not remove temp file %s: %s", self._file(file_name), exc)

    def close(self) -> None:
        fd, self._dir_fd = self._dir_fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        # Only a safety net for a forgotten close(); never raise from a finaliser.
        with contextlib.suppress(Exception):
            self.close()
