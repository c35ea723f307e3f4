"""The file store's directory: created with care, and refused if another user could
change it (as OpenSSH's StrictModes refuses a key file others can write).
"""

from __future__ import annotations

import os
import stat

from ..._errors import StoreError, StorePermissionError
from ._disk import O_DIRECTORY, sync

__all__ = ["OPT_OUT", "check_held", "check_opened", "check_trust", "make_dirs", "who"]

OPT_OUT = "pass ?trust=any in the config string (FileStore(..., trust='any')) to accept it"
_MAX_HOPS = 40  # symlinks followed on the way, as the kernel's ELOOP limit


def make_dirs(path: str, durable: bool) -> None:
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
        fd = os.open(os.path.dirname(path), O_DIRECTORY)
        try:
            sync(fd)
        finally:
            os.close(fd)


def who(uid: int) -> str:
    """Name a user for a message: the uid and, where known, the login name."""
    try:
        import pwd  # noqa: PLC0415 - only on this error path

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_trust(path: str) -> None:
    """Refuse a store directory another local user could change.

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
                    f"by {who(st.st_uid)}, who could point it elsewhere; {OPT_OUT}"
                )
            hops += 1
            if hops > _MAX_HOPS:
                raise StoreError(f"{path}: too many levels of symbolic links")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(part for part in reversed(target.split("/")) if part)
            continue
        _check_entry(path, candidate, st, last=not pending, trusted=trusted)
        current = candidate


def _check_entry(
    path: str, candidate: str, st: os.stat_result, *, last: bool, trusted: set[int]
) -> None:
    """Refuse one directory on the way to the store (``last``: the store's own)."""
    what = "the store directory" if last else f"{candidate}, on the way to it,"
    if st.st_uid not in trusted:
        raise StorePermissionError(
            f"{path}: refusing {what} owned by {who(st.st_uid)}, who could replace "
            f"or forge its checkpoints; {OPT_OUT}"
        )
    if st.st_mode & stat.S_IWOTH and (last or not st.st_mode & stat.S_ISVTX):
        raise StorePermissionError(
            f"{path}: refusing {what}: it is writable by every user (mode "
            f"{stat.S_IMODE(st.st_mode):04o}), so anyone could plant or swap checkpoints "
            f"(chmod o-w to fix); {OPT_OUT}"
        )


def check_opened(path: str, dir_fd: int) -> None:
    """Judge the directory that was opened too, in case the path changed since the walk.

    Raises:
        StorePermissionError: it is now another user's, or writable by everyone.
    """
    check_held(
        dir_fd,
        path,
        "refusing the store directory: it changed while being checked and is now owned "
        "by {owner} with mode {mode}",
    )


def check_held(fd: int, path: str, refusal: str) -> None:
    """Refuse the opened directory ``fd`` unless it is root's or this user's and not
    writable by every user; ``refusal`` says what is refused and why (its ``{owner}``
    and ``{mode}`` filled in).

    Raises:
        StorePermissionError: it is another user's, or writable by everyone.
    """
    st = os.fstat(fd)
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & stat.S_IWOTH:
        text = refusal.format(owner=who(st.st_uid), mode=f"{stat.S_IMODE(st.st_mode):04o}")
        raise StorePermissionError(f"{path}: {text}; {OPT_OUT}")
