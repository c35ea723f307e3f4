"""The file store's errors: the one table turning ``OSError`` into stepstone's errors,
and the messages of the errors the store raises itself.

``translating(directory, name)`` wraps every system call: a ``PermissionError`` becomes
``StorePermissionError``; ``ENOLCK``, ``ESTALE`` and ``ETIMEDOUT`` (a lock or network
file system gone away) ``StoreUnavailable``; any other ``OSError`` ``StoreError``. Each
names the path and the errno.
"""

from __future__ import annotations

import errno
import os

from ..._errors import (
    CheckpointTooLarge,
    StepstoneError,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
)
from .._errortable import ErrorRule, translate
from ._names import ACTIVE, join, run_of

__all__ = ["RULES", "foreign_marker", "os_error", "too_large", "translating"]

RULES = (
    ErrorRule(
        StorePermissionError,
        "{path}: permission denied ({strerror})",
        types=(PermissionError,),
    ),
    ErrorRule(
        StoreUnavailable,
        "{path}: {reason} ({errname})",
        codes=frozenset({errno.ENOLCK, errno.ESTALE, errno.ETIMEDOUT}),
    ),
    ErrorRule(StoreError, "{path}: {reason} ({errname})", types=(OSError,)),
)


def os_error(exc: OSError, directory: str, name: str = "") -> StoreError:
    """Return the stepstone error for ``exc``, raised about ``directory/name``."""
    path = os.path.join(directory, name) if name else directory
    error = translate(
        RULES,
        exc,
        exc.errno,
        path=path,
        strerror=exc.strerror,
        reason=exc.strerror or exc,
        errname=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
    )
    assert error is not None  # the last rule matches every OSError
    return error


class translating:  # lowercase: it reads like a function at each use
    """Translate an ``OSError`` about ``directory/name`` raised in the block by ``RULES``.

    A class, not ``map_exceptions`` (a generator): it sits on the save path several
    times, and the path string is only built when something failed.
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
        raise os_error(exc, self.directory, self.name) from exc


def too_large(run_id: str, size: int, limit: int) -> CheckpointTooLarge:
    """The error for a save whose document is over the store's limit."""
    return CheckpointTooLarge(
        f"run {run_id!r}: checkpoint document is {size} bytes, over the file store's "
        f"limit of {limit} bytes; nothing was stored",
        size,
        limit,
    )


_KINDS = {errno.ENXIO: "a FIFO", errno.ELOOP: "a symlink", errno.EISDIR: "a directory"}


def foreign_marker(directory: str, name: str, exc: OSError | None) -> StoreError:
    """The error for something not ours where a run's index marker goes."""
    kind = "not a regular file" if exc is None else _KINDS.get(exc.errno or 0, "unusable")
    return StoreError(
        f"{join(directory, f'{ACTIVE}/{name}')}: {kind}, not an index marker the file store "
        f"wrote; cannot index run {run_of(name)!r}, so nothing was saved. Move it "
        "away (the file store keeps only regular files there)"
    )
