"""FileStore: one JSON document per run in a local directory.

On disk
-------
``DIR/<name>.json`` holds the run's checkpoint: the shared stepstone document (see
``_codec.encode_document``) plus a top-level ``"version"`` key holding the version token.
``<name>`` encodes the run_id: the bytes ``a-z 0-9 _ -`` and ``.`` (not first) of its UTF-8
pass through, every other byte becomes ``%xx`` in lowercase hex. An encoded name over 200
bytes becomes ``~`` + the SHA-256 hex of the run_id instead. ``DIR/.tmp-*`` are files being
written. ``DIR/.active/<name>`` marks a run that may be queued, running or waiting (the
index ``claimable`` reads). Nothing else is written, and files this store did not write
are never modified or deleted (except by ``delete`` of the run whose name they carry).
``backends/file/README.md`` has the details.

Why these choices
-----------------
- Names hold only lowercase ASCII, so two run_ids differing in case cannot collide on a
  case-insensitive or Unicode-normalising file system, ``/`` and ``..`` cannot escape the
  directory, and the mapping is reversible, so ``list_runs`` needs no index. Hashing
  keeps names under NAME_MAX (255); the document keeps the real run_id, and ``~`` is
  never produced by escaping, so hashed and escaped names cannot collide.
- A save writes a temp file and renames it over the document: ``rename`` is atomic, so a
  reader sees the old or the new document, never a mix, and needs no lock.
- Compare-and-swap holds ``flock`` on the run's current document. A save replaces the
  document's inode, so a saver that waited on the old inode sees, once it holds the lock,
  that its inode has no link left (``st_nlink == 0``) and starts over on the new one.
  ``flock`` locks belong to an open file description, so one lock excludes other
  processes and other threads (each thread uses its own description) alike, and the
  kernel drops it if the holder dies: no stale locks, and no lock files.
- The store keeps the document it last wrote or read for a run open, with its version.
  While the file is open its inode cannot be freed and reused, so "this inode still has
  a link" proves the run is still at that version without reading or parsing it: a save
  of a run this process saved or loaded last is ``flock``, ``fstat``, ``open``, ``write``,
  ``fsync``, ``rename``, ``fsync`` (directory), ``close``: eight system calls.
- Every operation touches a fixed number of files through a directory fd held open, so
  the cost of a save does not grow with the number of runs stored, and a later ``chdir``
  does not move a store opened from a relative path.
- The directory must be one only this user (or root) can change: see ``_check_trust``.
- Nothing planted in it is read or written through, and nothing planted can block a
  call: documents and index markers are opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO fails
  the open instead of waiting for its other end) and must be regular files, the index is
  read through the descriptor opened with the store, and a marker that cannot be
  removed is left with a warning (it is only a hint) rather than failing a save that
  already landed.

Guarantees
----------
``durability=full`` (the default) fsyncs the temp file before the rename and the
directory after it (and after ``delete``). A save that returned survives a process crash
and a power cut. ``durability=none`` fsyncs the temp file but never the directory: a
save that returned survives a process crash; a power cut may undo recent renames, so a
run may come back at an earlier checkpoint, or vanish if its first save was recent, but
every document that survives is whole: a power cut never leaves an empty or torn one.
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
import random
import re
import stat
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Self
from urllib.parse import unquote_to_bytes, urlsplit

from .._checkpoint import ACTIVE_STATUSES, Checkpoint, RunStatus, check_run_id, utcnow
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
from .._redact import redact_url
from .._store import RunInfo, Store, check_page
from ._common import parse_options

__all__ = ["MAX_DOCUMENT_BYTES", "FileStore"]

logger = logging.getLogger("stepstone.stores.file")

#: Largest document a save writes (and a load reads): far above any sane checkpoint, low
#: enough that a runaway state fails loudly instead of filling the disk.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024

Durability = Literal["full", "none"]
Trust = Literal["strict", "any"]

_FORMS = (
    "file:///abs/dir or file:rel/dir (relative to the working directory), "
    "optionally followed by ?durability=full|none and &trust=strict|any"
)
_MAX_NAME = 200
_TEMP_PREFIX = ".tmp-"
_ACTIVE = ".active"
# A temp file (or an index marker whose run never appeared) this old belongs to a
# writer that crashed: no save takes an hour.
_STALE_SECONDS = 3600.0
# Documents kept open per store (see the module docstring). Bounded so that a process
# touching many runs never runs out of file descriptors.
_MAX_OPEN = 128

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# O_NONBLOCK: opening a FIFO someone planted at a run's path must not wait for a writer.
# It changes nothing for regular files, the only kind read.
_O_READ = os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW | os.O_NONBLOCK
_O_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW
_O_MARK = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC | _O_NOFOLLOW | os.O_NONBLOCK

# byte -> how it appears in a name
_ESCAPE = [
    chr(b) if chr(b) in "abcdefghijklmnopqrstuvwxyz0123456789_-." else f"%{b:02x}"
    for b in range(256)
]
_PLAIN_NAME = re.compile(r"[a-z0-9_-][a-z0-9_.-]*")
_ESCAPED_NAME = re.compile(r"(?:[a-z0-9_-]|%[0-9a-f]{2})(?:[a-z0-9_.-]|%[0-9a-f]{2})*")
_HASHED_NAME = re.compile(r"~[0-9a-f]{64}")

# The random parts of versions and temp names come from the ``random`` module: seeded
# from the OS once, reseeded in forked children by ``random`` itself, and free of system
# calls, which ``secrets`` is not (one ``getrandom`` per token). They need to be unique,
# not secret: the version's counter and compare-and-swap do the rest.
_randbits = random.getrandbits


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


def _new_version(previous: str | None) -> str:
    count = 1
    if previous is not None:
        head = previous.partition(".")[0]
        if head.isdigit():
            count = int(head) + 1
    return f"{count}.{_randbits(48):012x}"


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


def _read_all(fd: int, size: int) -> bytes:
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
        if sum(map(len, chunks)) > MAX_DOCUMENT_BYTES:
            break
    return b"".join(chunks)


def _make_dirs(path: str, durable: bool) -> None:
    """Create the store directory ``path`` (mode 0700), persisting its new entry.

    Only the last component is created, as SQLite creates only the database file: a
    typo in the path then fails with the missing parent named, instead of creating a
    tree of directories nobody reads.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    except FileNotFoundError:
        raise StoreError(
            f"{path}: the parent directory {os.path.dirname(path)} does not exist; "
            "create it or fix the path (only the store directory itself is created)"
        ) from None
    if durable:
        # A new directory's entry lives in its parent: without this a power cut can lose
        # the directory with every checkpoint saved in it.
        fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        try:
            _sync(fd)
        finally:
            os.close(fd)


_OPT_OUT = "pass ?trust=any in the config string (FileStore(..., trust='any')) to accept it"


def _who(uid: int) -> str:
    try:
        import pwd  # noqa: PLC0415 - only on this error path

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_trust(path: str) -> None:
    """Refuse a store directory another local user could change, as OpenSSH's StrictModes.

    Every directory and symlink on the way to ``path``, and ``path`` itself, must be owned
    by this user or root; no directory on the way may be writable by everyone unless it
    has the sticky bit (``/tmp``: others cannot rename what is ours), and the store's own
    directory may not be writable by everyone at all (the sticky bit does not stop anyone
    from planting a forged checkpoint for a run that has none yet). Symlinks are followed
    by hand so that each one is judged by its owner.

    Raises:
        StorePermissionError: naming what is unsafe and the option that accepts it.
    """
    trusted = {0, os.geteuid()}
    pending = [part for part in reversed(path.split("/")) if part]
    current = "/"
    hops = 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        st = os.lstat(candidate)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted:
                raise StorePermissionError(
                    f"{path}: refusing a store reached through {candidate}, a symlink owned "
                    f"by {_who(st.st_uid)}, who could point it elsewhere; {_OPT_OUT}"
                )
            hops += 1
            if hops > 40:
                raise StoreError(f"{path}: too many levels of symbolic links")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(part for part in reversed(target.split("/")) if part)
            continue
        last = not pending
        if st.st_uid not in trusted:
            what = "the store directory" if last else f"{candidate}, on the way to it,"
            raise StorePermissionError(
                f"{path}: refusing {what} owned by {_who(st.st_uid)}, who could replace "
                f"or forge its checkpoints; {_OPT_OUT}"
            )
        if st.st_mode & stat.S_IWOTH and (last or not st.st_mode & stat.S_ISVTX):
            what = "the store directory" if last else f"{candidate}, on the way to it,"
            raise StorePermissionError(
                f"{path}: refusing {what}: it is writable by every user (mode "
                f"{stat.S_IMODE(st.st_mode):04o}), so anyone could plant or swap checkpoints "
                f"(chmod o-w to fix); {_OPT_OUT}"
            )
        current = candidate


class _Known:
    """A run's current document as this store last wrote or read it: kept open."""

    __slots__ = ("active", "fd", "version")

    def __init__(self, fd: int, version: str, active: bool) -> None:
        self.fd = fd
        self.version = version
        self.active = active


# Stores alive in this process, so that a forked child can drop what it inherited.
_STORES: weakref.WeakSet[FileStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._forget_inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class FileStore(Store):
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
    (see ``_check_trust``); ``any`` accepts it, for a directory shared on purpose.

    Saves of one run are serialised across threads and processes by ``flock`` on the
    run's document; saves of different runs run in parallel. Documents over 64 MiB are
    refused with ``CheckpointTooLarge``. POSIX, local file systems only.
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

    def __init__(
        self,
        path: str | os.PathLike[str],
        durability: Durability = "full",
        *,
        trust: Trust = "strict",
    ) -> None:
        self._dir_fd: int | None = None
        self._active_fd: int | None = None
        self._known: dict[str, _Known] = {}
        self._busy: set[int] = set()
        self._mutex = threading.Lock()
        # close() while other threads work: new calls are refused at once, and the
        # directory fds are closed by the last call in flight, never under it (a closed
        # fd number can be reused by any open, which would send its writes elsewhere).
        self._closed = False
        self._inflight = 0
        self._index_error = "the file store is closed"
        if durability not in ("full", "none"):
            raise ConfigError(
                f"durability must be 'full' or 'none', got {durability!r}. Forms: {_FORMS}"
            )
        if trust not in ("strict", "any"):
            raise ConfigError(f"trust must be 'strict' or 'any', got {trust!r}. Forms: {_FORMS}")
        raw = os.fspath(path)
        if not isinstance(raw, str) or not raw:
            raise ConfigError(f"the file store needs a directory path, got {path!r}")
        self._path = os.path.abspath(raw)
        self._durable = durability == "full"
        self.durability: Durability = durability
        self.trust: Trust = trust
        with _translate(self._path):
            _make_dirs(self._path, self._durable)
            if trust == "strict":
                _check_trust(self._path)
            # Held for the store's life: every file is reached relative to it (no path
            # lookups, immune to chdir) and it is what the directory fsync needs.
            self._dir_fd = os.open(self._path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
            if trust == "strict":
                # Judge what was opened too, in case the path changed since the walk.
                st = os.fstat(self._dir_fd)
                if st.st_uid not in (0, os.geteuid()) or st.st_mode & stat.S_IWOTH:
                    self.close()
                    raise StorePermissionError(
                        f"{self._path}: refusing the store directory: it changed while being "
                        f"checked and is now owned by {_who(st.st_uid)} with mode "
                        f"{stat.S_IMODE(st.st_mode):04o}; {_OPT_OUT}"
                    )
            try:
                self._active_fd = self._open_index(self._dir_fd)
            except (PermissionError, OSError) as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                # A directory this process may only read (an operator listing runs):
                # loads and listings work; saves and claimable say why they cannot.
                self._index_error = f"{self._file(_ACTIVE)}: {exc.strerror}"
        _STORES.add(self)
        self._remove_stale_temps()

    def _open_index(self, dir_fd: int) -> int:
        created = False
        try:
            os.mkdir(_ACTIVE, 0o700, dir_fd=dir_fd)
            created = True
        except FileExistsError:
            pass
        try:
            fd = os.open(
                _ACTIVE, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW, dir_fd=dir_fd
            )
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreError(
                    f"{self._file(_ACTIVE)}: not a directory; the file store keeps its index "
                    "of active runs there: move it away"
                ) from exc
            raise
        if created:
            _sync(dir_fd)  # in both modes, for the reason ``_mark`` gives
        return fd

    @classmethod
    def from_config(cls, config: str) -> Self:
        parts = urlsplit(config)
        shown = redact_url(config)
        if parts.scheme.lower() != "file":
            raise ConfigError(f"not a file store config: {shown!r}; forms: {_FORMS}")
        if parts.netloc:
            raise ConfigError(
                f"file store config {shown!r} names a host ({redact_url(parts.netloc)!r}); "
                f"only local directories are supported. Forms: {_FORMS}"
            )
        if parts.fragment or config.endswith("#"):
            raise ConfigError(f"file store config {shown!r} has a '#' fragment; forms: {_FORMS}")
        path = parts.path
        if not path:
            raise ConfigError(f"file store config {shown!r} names no directory; forms: {_FORMS}")
        if path.startswith("//"):
            path = "/" + path.lstrip("/")  # file:////abs, by analogy with sqlite:////abs
        options = parse_options(
            parts.query,
            {"durability": ("full", "none"), "trust": ("strict", "any")},
            _FORMS,
        )
        durability: Durability = "none" if options.get("durability") == "none" else "full"
        trust: Trust = "any" if options.get("trust") == "any" else "strict"
        return cls(path, durability, trust=trust)

    @property
    def path(self) -> str:
        """The store's directory, absolute."""
        return self._path

    def __repr__(self) -> str:
        extra = ", trust='any'" if self.trust == "any" else ""
        return f"FileStore({self._path!r}, durability={self.durability!r}{extra})"

    def _fd(self) -> int:
        dir_fd = self._dir_fd
        if self._closed or dir_fd is None:
            raise StoreError(f"{self._path}: the file store is closed")
        return dir_fd

    def _begin(self) -> int:
        """Enter a call: return the directory fd, kept open until ``_end``."""
        with self._mutex:
            dir_fd = self._fd()
            self._inflight += 1
        return dir_fd

    def _end(self) -> None:
        with self._mutex:
            self._inflight -= 1
            if not self._closed or self._inflight:
                return
            fds = self._take_dir_fds()
        _close_all(fds)

    def _take_dir_fds(self) -> list[int | None]:
        fds = [self._active_fd, self._dir_fd]
        self._active_fd = self._dir_fd = None
        return fds

    def _file(self, name: str) -> str:
        return f"{self._path}/{name}" if self._path != "/" else f"/{name}"

    # -- the open documents --------------------------------------------------------------

    def _checkout(self, name: str) -> _Known | None:
        """Take the run's open document out of the cache, for this thread alone."""
        with self._mutex:
            known = self._known.pop(name, None)
            if known is not None:
                self._busy.add(known.fd)
            return known

    def _keep(self, name: str, known: _Known) -> None:
        """Put a run's open document (back) in the cache, closing what it replaces."""
        closing: list[int] = []
        with self._mutex:
            self._busy.discard(known.fd)
            if self._closed:
                closing.append(known.fd)
            else:
                old = self._known.pop(name, None)
                if old is not None:
                    closing.append(old.fd)
                elif len(self._known) >= _MAX_OPEN:
                    oldest = next(iter(self._known))
                    closing.append(self._known.pop(oldest).fd)
                self._known[name] = known
        for fd in closing:
            os.close(fd)

    def _release(self, fd: int) -> None:
        """Close a document fd this thread used (which releases its ``flock``)."""
        with self._mutex:
            self._busy.discard(fd)
        with _translate(self._path):
            os.close(fd)

    def _forget_inherited(self) -> None:
        # In a forked child: the descriptions are shared with the parent, so holding them
        # would keep the parent's locks alive as long as the child lives. Close the copies.
        self._mutex = threading.Lock()
        for fd in [known.fd for known in self._known.values()] + list(self._busy):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._known = {}
        self._busy = set()

    # -- reading ------------------------------------------------------------------------

    def _open_document(self, dir_fd: int, file_name: str) -> tuple[int, os.stat_result] | None:
        """Open ``file_name`` for reading if it is a regular file; None if absent."""
        with _translate(self._path, file_name):
            try:
                fd = os.open(file_name, _O_READ, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise CorruptCheckpoint(
                        f"{self._file(file_name)}: a symlink, not a checkpoint the file store "
                        "wrote; refusing to follow it; left untouched"
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
                f"{self._file(file_name)}: {kind}, not a checkpoint the file store wrote; "
                "left untouched"
            )
        return fd, st

    def _parse(
        self, fd: int, size: int, file_name: str, run_id: str | None
    ) -> tuple[dict[str, Any], str]:
        """Read and check a document; ``run_id`` None accepts any (hashed names)."""
        path = self._file(file_name)
        with _translate(self._path, file_name):
            try:
                data = _read_all(fd, size)
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

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        return self._load(encode_name(run_id), run_id, keep=True)

    def _load(self, name: str, run_id: str | None, keep: bool) -> Checkpoint | None:
        """Load ``<name>.json``; ``run_id`` None for a hashed name found by listing."""
        dir_fd = self._begin()
        try:
            return self._load_in(dir_fd, name, run_id, keep)
        finally:
            self._end()

    def _load_in(self, dir_fd: int, name: str, run_id: str | None, keep: bool) -> Checkpoint | None:
        file_name = name + ".json"
        # No lock: the rename that publishes a document is atomic.
        opened = self._open_document(dir_fd, file_name)
        if opened is None:
            return None
        fd, st = opened
        try:
            doc, version = self._parse(fd, st.st_size, file_name, run_id)
            if run_id is None:
                found = doc.get("run_id")
                if not isinstance(found, str) or _hashed(found) != name:
                    raise CorruptCheckpoint(
                        f"{self._file(file_name)}: its run_id {found!r} does not hash to its "
                        "name; left untouched"
                    )
            cp = checkpoint_from_doc(doc, version, source=self._file(file_name))
        except BaseException:
            os.close(fd)
            raise
        if keep:
            # Keeping it open lets the next save of this run skip reading it again.
            with self._mutex:
                self._busy.add(fd)
            self._keep(name, _Known(fd, version, cp.status in ACTIVE_STATUSES))
        else:
            os.close(fd)
        return cp

    # -- locking ------------------------------------------------------------------------

    def _lock_current(self, dir_fd: int, name: str) -> tuple[int, os.stat_result] | None:
        """Open the run's current document and hold ``flock`` on it; None if absent."""
        file_name = name + ".json"
        while True:
            opened = self._open_document(dir_fd, file_name)
            if opened is None:
                return None
            fd, _ = opened
            with self._mutex:
                self._busy.add(fd)
            try:
                with _translate(self._path, file_name):
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    st = os.fstat(fd) if _linked(fd) else None
            except BaseException:
                self._release(fd)
                raise
            if st is not None:
                return fd, st
            # Replaced or deleted while we waited: the lock guards nothing. Start over.
            self._release(fd)

    # -- writing ------------------------------------------------------------------------

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        run_id = check_run_id(checkpoint.run_id)
        text, copy = encode_state(checkpoint.state)
        if len(text) > MAX_DOCUMENT_BYTES:  # characters <= bytes: refuse before any I/O
            raise self._too_large(run_id, len(text.encode("utf-8", "backslashreplace")))
        dir_fd = self._begin()
        try:
            return self._save_in(dir_fd, checkpoint, run_id, text, copy)
        finally:
            self._end()

    def _save_in(
        self, dir_fd: int, checkpoint: Checkpoint, run_id: str, text: str, copy: dict[str, Any]
    ) -> Checkpoint:
        name = encode_name(run_id)
        file_name = name + ".json"
        lock_fd: int | None = None
        current_version: str | None = None
        was_active = False
        known = self._checkout(name)
        try:
            if known is not None:
                lock_fd = known.fd
                with _translate(self._path, file_name):
                    fcntl.flock(lock_fd, fcntl.LOCK_EX)
                    # Still linked means still current: the fd keeps the inode from reuse.
                    linked = _linked(lock_fd)
                if linked:
                    current_version, was_active = known.version, known.active
                else:
                    self._release(lock_fd)
                    lock_fd = known = None
            if known is None:
                locked = self._lock_current(dir_fd, name)
                if locked is not None:
                    lock_fd, st = locked
                    # Parsing proves the file is ours and whole, so a corrupt file stays put.
                    doc, current_version = self._parse(lock_fd, st.st_size, file_name, run_id)
                    was_active = _doc_active(doc)
            if current_version != checkpoint.version:
                raise ConflictError(
                    f"run {run_id!r}: expected version {checkpoint.version!r}, "
                    f"stored {current_version!r}",
                    run_id,
                )
            version = _new_version(current_version)
            saved = checkpoint.stored(copy, text, version, utcnow())
            document = encode_document(saved, text, extra={"version": version})
            # JSON text can hold lone surrogates, which UTF-8 cannot; they only occur inside
            # string literals, where the \\udXXX that backslashreplace writes is the JSON
            # escape for the same character, so the document still round-trips exactly.
            data = document.encode("utf-8", "backslashreplace")
            if len(data) > MAX_DOCUMENT_BYTES:
                raise self._too_large(run_id, len(data))
            active = saved.status in ACTIVE_STATUSES
            if active and not was_active:
                self._mark(name, saved.status)  # before the save, so no active run is unindexed
            new_fd = self._publish(
                dir_fd, name, data, create=current_version is None, unmark=was_active and not active
            )
        finally:
            if lock_fd is not None:
                self._release(lock_fd)
        self._keep(name, _Known(new_fd, version, active))
        return saved

    def _too_large(self, run_id: str, size: int) -> CheckpointTooLarge:
        return CheckpointTooLarge(
            f"run {run_id!r}: checkpoint document is {size} bytes, over the file store's "
            f"limit of {MAX_DOCUMENT_BYTES} bytes; nothing was stored",
            size,
            MAX_DOCUMENT_BYTES,
        )

    def _publish(self, dir_fd: int, name: str, data: bytes, *, create: bool, unmark: bool) -> int:
        """Atomically put ``data`` at ``<name>.json``; return the new document's open fd.

        ``create``: the run has no document, and the new one appears only if still none
        does (``link`` fails if the name exists: the compare-and-swap of a first save).
        ``unmark``: the run stops being active; its index marker goes after the save,
        while the new document is locked, so that whoever makes it active again next
        (and marks it) does so after the marker is gone.
        """
        final = name + ".json"
        while True:
            temp = f"{_TEMP_PREFIX}{_randbits(64):016x}"
            try:
                with _translate(self._path, temp):
                    fd = os.open(temp, _O_TEMP, 0o600, dir_fd=dir_fd)
                break
            except StoreError as exc:
                if not isinstance(exc.__cause__, FileExistsError):
                    raise
        with self._mutex:
            self._busy.add(fd)
        try:
            with _translate(self._path, temp):
                written = os.write(fd, data)
                if written < len(data):  # short writes are rare: copy only then
                    view = memoryview(data)[written:]
                    while view:
                        view = view[os.write(fd, view) :]
                fire("file.after_temp_write")
                # Before the rename, in both modes: else a power cut can leave the name
                # pointing at a file whose data never reached the disk (empty or torn).
                _sync(fd)
                if unmark:
                    fcntl.flock(fd, fcntl.LOCK_EX)
            if create:
                with _translate(self._path, final):
                    try:
                        os.link(
                            temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False
                        )
                    except FileExistsError:
                        raise ConflictError(
                            f"run {self._run_of(name)!r}: expected no checkpoint, but one was "
                            "saved meanwhile",
                            self._run_of(name),
                        ) from None
                    finally:
                        with contextlib.suppress(OSError):
                            os.unlink(temp, dir_fd=dir_fd)
            else:
                with _translate(self._path, final):
                    os.rename(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            self._release(fd)
            raise
        try:
            fire("file.after_rename")
            fire("file.before_dir_fsync")
            if self._durable or unmark:
                # The rename is a change to the directory; only this makes it survive power
                # loss. Before a marker goes, in both modes: a power cut must not leave the
                # run active again (the rename undone) with its marker gone.
                with _translate(self._path):
                    _sync(dir_fd)
            if unmark:
                try:
                    self._unmark(name)
                finally:
                    with _translate(self._path, final):
                        fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            self._release(fd)
            raise
        return fd

    @staticmethod
    def _run_of(name: str) -> str:
        return decode_name(name) or name

    # -- the index of active runs --------------------------------------------------------

    def _mark(self, name: str, status: str) -> None:
        """Create (or refresh) the run's marker in ``.active/``, durably."""
        active_fd = self._active_fd
        if active_fd is None:
            self._fd()
            raise StorePermissionError(
                f"{self._path}: cannot index the active run {name!r}: {self._index_error}"
            )
        with _translate(self._path, f"{_ACTIVE}/{name}"):
            # O_TRUNC and a write refresh the marker's mtime, which is what tells a fresh
            # marker (its first save under way) from one left by a crashed first save.
            # O_NONBLOCK: a FIFO planted here must fail the open (ENXIO), not wait for a
            # reader forever; O_NOFOLLOW: a symlink is never written through.
            try:
                fd = os.open(name, _O_MARK, 0o600, dir_fd=active_fd)
            except OSError as exc:
                if exc.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):
                    raise self._foreign_marker(name, exc) from exc
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise self._foreign_marker(name, None)
                os.write(fd, status.encode())
            finally:
                os.close(fd)
            # In both modes: a run whose document survives a power cut but whose marker
            # does not would never be claimed again. Paid once per activation, not per save.
            _sync(active_fd)

    def _foreign_marker(self, name: str, exc: OSError | None) -> StoreError:
        what = {errno.ENXIO: "a FIFO", errno.ELOOP: "a symlink", errno.EISDIR: "a directory"}
        kind = "not a regular file" if exc is None else what.get(exc.errno or 0, "unusable")
        return StoreError(
            f"{self._file(f'{_ACTIVE}/{name}')}: {kind}, not an index marker the file store "
            f"wrote; cannot index run {self._run_of(name)!r}, so nothing was saved. Move it "
            "away (the file store keeps only regular files there)"
        )

    def _has_marker(self, name: str) -> bool:
        if self._active_fd is None:
            return False
        try:
            os.stat(name, dir_fd=self._active_fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def _unmark(self, name: str) -> None:
        active_fd = self._active_fd
        if active_fd is None:
            return
        # A marker left behind is only a hint the next claimable re-checks and removes.
        with _translate(self._path, f"{_ACTIVE}/{name}"), contextlib.suppress(FileNotFoundError):
            try:
                os.unlink(name, dir_fd=active_fd)
            except IsADirectoryError:
                # Not ours (a directory planted there): leave it, and never fail a save
                # that already landed over it; listings and claims re-check the run.
                logger.warning(
                    "leaving %s: a directory, not an index marker the file store wrote",
                    self._file(f"{_ACTIVE}/{name}"),
                )

    # -- deleting -----------------------------------------------------------------------

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        check_run_id(run_id)
        dir_fd = self._begin()
        try:
            return self._delete_in(dir_fd, run_id, expected_version)
        finally:
            self._end()

    def _delete_in(self, dir_fd: int, run_id: str, expected_version: str | None) -> bool:
        name = encode_name(run_id)
        file_name = name + ".json"
        known = self._checkout(name)
        if known is not None:
            self._release(known.fd)
        try:
            locked = self._lock_current(dir_fd, name)
        except CorruptCheckpoint:
            if expected_version is not None:
                raise
            # A symlink, FIFO or directory at the run's path: delete is the operator's
            # explicit request, so remove the entry without reading through it.
            with _translate(self._path, file_name):
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
        if locked is None:
            return False
        lock_fd, st = locked
        try:
            if expected_version is not None:
                _, current = self._parse(lock_fd, st.st_size, file_name, run_id)
                if current != expected_version:
                    raise ConflictError(
                        f"run {run_id!r}: delete expected version {expected_version!r}, "
                        f"stored {current!r}; nothing was deleted",
                        run_id,
                    )
            with _translate(self._path, file_name):
                os.unlink(file_name, dir_fd=dir_fd)
            if self._durable:
                with _translate(self._path):
                    _sync(dir_fd)
            # The marker goes after the document is durably gone (a crash in between
            # leaves a hint claimable cleans up), under the lock of the document that was
            # current, so a power cut cannot bring back an active run without its marker.
            if self._has_marker(name):
                if not self._durable:
                    with _translate(self._path):
                        _sync(dir_fd)
                self._unmark(name)
            # Lock files of releases before this index existed: their run is gone.
            with contextlib.suppress(OSError):
                os.unlink(name + ".lock", dir_fd=dir_fd)
        finally:
            self._release(lock_fd)
        return True

    # -- listing and housekeeping -------------------------------------------------------

    def _scan(self, where: str = ".") -> list[os.DirEntry[str]]:
        dir_fd = self._begin()
        try:
            return self._scan_in(dir_fd, where)
        finally:
            self._end()

    def _scan_in(self, dir_fd: int, where: str) -> list[os.DirEntry[str]]:
        with _translate(self._path, "" if where == "." else where):
            if where == _ACTIVE and self._active_fd is not None:
                # The index the markers are written to, not whatever is at the name now
                # (a symlink or FIFO swapped in since the store opened).
                dir_fd, where = self._active_fd, "."
            # A private open file description: scandir on a dup of the shared fd would share
            # its read position with concurrent listings in other threads.
            fd = os.open(
                where, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW, dir_fd=dir_fd
            )
            try:
                with os.scandir(fd) as entries:
                    return list(entries)
            finally:
                os.close(fd)

    def _names(self) -> list[str]:
        return [entry.name for entry in self._scan()]

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
            if _HASHED_NAME.fullmatch(stem) is None:
                run_id = decode_name(stem)
                if run_id is not None:
                    yield run_id
                continue
            try:
                cp = self._load(stem, None, keep=False)
            except CorruptCheckpoint as exc:
                logger.warning("skipping %s in list_runs: %s", self._file(file_name), exc)
                continue
            if cp is not None:
                yield cp.run_id

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
        self._fd()
        if self._active_fd is None:
            logger.warning("no index of active runs (%s): scanning every run", self._index_error)
            return super().claimable(now, limit, status=status, skip=skip)
        self._begin()
        try:
            found = self._claimable_in(now, limit if status is None else None)
        finally:
            self._end()
        if status is None:
            return found
        # Running runs first, then the due ones: each kind is in due_at order.
        return [info for info in found if info.status == status][skip : skip + limit]

    def _claimable_in(self, now: datetime, limit: int | None) -> list[RunInfo]:
        running: list[RunInfo] = []
        due: list[RunInfo] = []
        for entry in self._scan(_ACTIVE):
            name = entry.name
            run_id = None if _HASHED_NAME.fullmatch(name) else decode_name(name)
            if run_id is None and _HASHED_NAME.fullmatch(name) is None:
                logger.warning("skipping %s: not an index marker", self._file(f"{_ACTIVE}/{name}"))
                continue
            try:
                cp = self._load(name, run_id, keep=False)
            except CorruptCheckpoint as exc:
                logger.warning("skipping run %r in claimable: %s", run_id or name, exc)
                continue
            if cp is None:
                self._drop_orphan_marker(entry)
                continue
            status = cp.status
            if status not in ACTIVE_STATUSES:
                self._drop_rest_marker(name)
                continue
            info = RunInfo.of(cp)
            if status == "running":
                running.append(info)
            elif info.due_at is not None and info.due_at <= now:
                due.append(info)
        running.sort(key=lambda info: info.due_at or now)
        due.sort(key=lambda info: info.due_at or now)
        return running[:limit] + due[:limit]

    def _drop_orphan_marker(self, entry: os.DirEntry[str]) -> None:
        # A marker is written before a run's first save: a young one may belong to a save
        # under way. Only one older than any save is left over from a crash (or a delete).
        try:
            # Not entry.stat(): the fd the scan ran on is closed by now.
            st = os.stat(entry.name, dir_fd=self._active_fd, follow_symlinks=False)
            if st.st_mtime < time.time() - _STALE_SECONDS:
                _sync(self._fd())  # the run's absence must be durable before its marker goes
                self._unmark(entry.name)
        except (OSError, StoreError) as exc:
            logger.debug("could not clean index marker %s: %s", entry.name, exc)

    def _drop_rest_marker(self, name: str) -> None:
        # Re-checked under the document's lock: whoever makes the run active again marks
        # it under the same lock, so the marker cannot be lost in between.
        try:
            locked = self._lock_current(self._fd(), name)
            if locked is None:
                return
            lock_fd, st = locked
            try:
                doc, _ = self._parse(lock_fd, st.st_size, name + ".json", None)
                if not _doc_active(doc):
                    _sync(self._fd())  # the rest state must be durable before the marker goes
                    self._unmark(name)
            finally:
                self._release(lock_fd)
        except (OSError, StoreError) as exc:
            logger.debug("could not clean index marker %s: %s", name, exc)

    def _remove_stale_temps(self) -> None:
        """Delete ``.tmp-*`` files left by writers that crashed; best effort."""
        cutoff = time.time() - _STALE_SECONDS
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
                if st.st_mtime < cutoff and stat.S_ISREG(st.st_mode):
                    os.unlink(file_name, dir_fd=dir_fd)
                    logger.info("removed stale temp file %s", self._file(file_name))
            except OSError as exc:
                # Leftovers only waste space; never let them stop the store from opening.
                logger.debug("could not remove temp file %s: %s", self._file(file_name), exc)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            fds: list[int | None] = [known.fd for known in self._known.values()]
            self._known = {}
            if not self._inflight:
                fds += self._take_dir_fds()
        # Documents in use by a save in flight are closed by that save.
        _close_all(fds)

    def __del__(self) -> None:
        # Only a safety net for a forgotten close(); never raise from a finaliser.
        with contextlib.suppress(Exception):
            self.close()


def _close_all(fds: list[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _linked(fd: int) -> bool:
    """Whether the open file still has a name (a save or delete unlinks what it replaces)."""
    try:
        return os.fstat(fd).st_nlink > 0
    except OSError as exc:
        # What some file systems (NFS, FUSE) answer for a file that no longer has a name.
        if exc.errno == errno.ESTALE:
            return False
        raise


def _doc_active(doc: dict[str, Any]) -> bool:
    """Whether a parsed document's run is queued, running or waiting."""
    try:
        return checkpoint_from_doc(doc, None, source="").status in ACTIVE_STATUSES
    except CorruptCheckpoint:
        return True  # unknown: keep (or create) the marker; claimable re-checks it
