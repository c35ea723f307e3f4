"""A FUSE file system that forgets, on command, everything that was not made durable.

Usage: ``python tools/powercut/powercut_fs.py MOUNTPOINT`` (foreground; unmount with
``fusermount3 -u MOUNTPOINT``). Everything lives in this process's memory.

It models a disk with a write-back cache, as strictly as POSIX allows:

- A file's data is durable only once the file is fsynced (``fsync``/``fdatasync``).
- A directory's entries (create, link, unlink, rename, mkdir) are durable only once the
  directory is fsynced; until then each change sits in that directory's log, in order.

Writing ``cut SEED`` to ``MOUNTPOINT/.control`` cuts the power: in every directory a
random prefix of the logged changes survives (anything from none to all, a rename being
one change, as journaling file systems make it), and every file with unsynced data keeps,
at random, its durable data, all of its new data, or a torn version (a prefix of the new
data, with or without zeros up to the new size, which is what a disk that persisted the
size before the blocks shows). Files no surviving entry names are gone. Reading
``.control`` returns JSON counters of what the cuts dropped.

Mounted with ``direct_io`` and zero cache timeouts so the kernel keeps no stale copy, and
``hard_remove`` so an open file that is unlinked or renamed over is gone at once (its
``st_nlink`` drops to 0), as on a disk file system. Single-threaded: the state needs no
lock. ``flock`` is left to the kernel (local locks), as on a disk file system.
"""

from __future__ import annotations

import errno
import json
import os
import random
import stat
import sys
import time
from typing import Any

import mfusepy as fuse

CONTROL = "/.control"


class Node:
    """One inode: a directory (with entries and their log) or a regular file."""

    def __init__(self, ino: int, mode: int, uid: int, gid: int) -> None:
        self.ino = ino
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.nlink = 0
        self.data = bytearray()
        self.durable = b""
        self.entries: dict[str, int] = {}
        self.durable_entries: dict[str, int] = {}
        self.log: list[tuple[Any, ...]] = []
        now = time.time_ns()
        self.mtime = self.ctime = self.atime = now

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class PowerCutFS(fuse.Operations):  # type: ignore[misc]
    """The file system; see the module docstring."""

    use_ns = True

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.next_ino = 1
        self.fhs: dict[int, int] = {}
        self.next_fh = 1
        self.counters = {"cuts": 0, "entries_lost": 0, "files_reverted": 0, "files_torn": 0}
        self.root = self._new(stat.S_IFDIR | 0o755, 0, 0)
        self.root.nlink = 2

    # -- helpers -------------------------------------------------------------------------

    def _new(self, mode: int, uid: int | None = None, gid: int | None = None) -> Node:
        if uid is None or gid is None:
            uid, gid, _ = fuse.fuse_get_context()
        node = Node(self.next_ino, mode, uid, gid)
        self.nodes[node.ino] = node
        self.next_ino += 1
        return node

    def _lookup(self, path: str) -> Node:
        node = self.root
        for part in path.split("/"):
            if not part:
                continue
            if not node.is_dir:
                raise fuse.FuseOSError(errno.ENOTDIR)
            ino = node.entries.get(part)
            if ino is None:
                raise fuse.FuseOSError(errno.ENOENT)
            node = self.nodes[ino]
        return node

    def _split(self, path: str) -> tuple[Node, str]:
        parent, _, name = path.rpartition("/")
        directory = self._lookup(parent or "/")
        if not directory.is_dir:
            raise fuse.FuseOSError(errno.ENOTDIR)
        return directory, name

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh and fh in self.fhs:
            return self.nodes[self.fhs[fh]]
        if path is None:
            raise fuse.FuseOSError(errno.EBADF)
        return self._lookup(path)

    def _set(self, directory: Node, name: str, ino: int) -> None:
        old = directory.entries.get(name)
        if old is not None:
            self.nodes[old].nlink -= 1
        directory.entries[name] = ino
        self.nodes[ino].nlink += 1
        directory.log.append(("set", name, ino))
        directory.mtime = directory.ctime = time.time_ns()

    def _del(self, directory: Node, name: str) -> Node:
        ino = directory.entries.pop(name)
        node = self.nodes[ino]
        node.nlink -= 1
        node.ctime = time.time_ns()
        directory.log.append(("del", name))
        directory.mtime = directory.ctime = time.time_ns()
        return node

    def _open_fh(self, node: Node) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.fhs[fh] = node.ino
        return fh

    # -- the power cut -------------------------------------------------------------------

    def cut(self, seed: int) -> None:
        """Drop what was not durable, as a power cut would; see the module docstring."""
        rng = random.Random(seed)
        for node in list(self.nodes.values()):
            if node.is_dir:
                keep = rng.randint(0, len(node.log))
                entries = dict(node.durable_entries)
                for change in node.log[:keep]:
                    if change[0] == "set":
                        entries[change[1]] = change[2]
                    elif change[0] == "del":
                        entries.pop(change[1], None)
                    else:  # rename, one indivisible change
                        entries.pop(change[1], None)
                        entries[change[2]] = change[3]
                self.counters["entries_lost"] += len(node.log) - keep
                node.entries = entries
                node.durable_entries = dict(entries)
                node.log = []
            elif bytes(node.data) != node.durable:
                fate = rng.choice(("durable", "new", "torn"))
                if fate == "durable":
                    node.data = bytearray(node.durable)
                    self.counters["files_reverted"] += 1
                elif fate == "torn":
                    size = len(node.data)
                    kept = rng.randint(0, size)
                    zeros = rng.random() < 0.5
                    node.data = node.data[:kept] + (b"\0" * (size - kept) if zeros else b"")
                    self.counters["files_torn"] += 1
                node.durable = bytes(node.data)
        # Every process died with the power: no open files; recount the links.
        self.fhs.clear()
        for node in self.nodes.values():
            node.nlink = 0
        self.root.nlink = 1
        seen: set[int] = set()
        stack = [self.root]
        while stack:
            directory = stack.pop()
            if directory.ino in seen:
                continue
            seen.add(directory.ino)
            for ino in directory.entries.values():
                child = self.nodes.get(ino)
                if child is None:
                    continue
                child.nlink += 1
                if child.is_dir:
                    stack.append(child)
        self.nodes = {ino: node for ino, node in self.nodes.items() if ino in seen or node.nlink}
        self.counters["cuts"] += 1

    # -- operations ----------------------------------------------------------------------

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        if path == CONTROL:
            size = len(json.dumps(self.counters))
            return {
                "st_mode": stat.S_IFREG | 0o600,
                "st_nlink": 1,
                "st_size": size,
                "st_ino": 999999999,
            }
        node = self._node(path, fh)
        return {
            "st_mode": node.mode,
            "st_ino": node.ino,
            "st_nlink": node.nlink + (1 if node.is_dir else 0),
            "st_uid": node.uid,
            "st_gid": node.gid,
            "st_size": len(node.data),
            "st_mtime": node.mtime,
            "st_ctime": node.ctime,
            "st_atime": node.atime,
            "st_blocks": (len(node.data) + 511) // 512,
        }

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        node = self._lookup(path)
        # With use_ino the inode number is passed on, and readdir(3) hides entries whose
        # d_ino is 0: give every entry its own.
        items = [(".", {"st_ino": node.ino, "st_mode": node.mode}, 0)]
        items.append(("..", {"st_ino": 1, "st_mode": stat.S_IFDIR}, 0))
        for name, ino in node.entries.items():
            items.append((name, {"st_ino": ino, "st_mode": self.nodes[ino].mode}, 0))
        if path == "/":
            items.append((CONTROL[1:], {"st_ino": 999999999, "st_mode": stat.S_IFREG}, 0))
        return items

    def mkdir(self, path: str, mode: int) -> int:
        directory, name = self._split(path)
        if name in directory.entries:
            raise fuse.FuseOSError(errno.EEXIST)
        node = self._new(stat.S_IFDIR | (mode & 0o7777))
        self._set(directory, name, node.ino)
        return 0

    def rmdir(self, path: str) -> int:
        directory, name = self._split(path)
        node = self._lookup(path)
        if node.entries:
            raise fuse.FuseOSError(errno.ENOTEMPTY)
        self._del(directory, name)
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        directory, name = self._split(path)
        if name in directory.entries:
            raise fuse.FuseOSError(errno.EEXIST)
        node = self._new(mode)
        self._set(directory, name, node.ino)
        return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        directory, name = self._split(path)
        ino = directory.entries.get(name)
        if ino is not None:
            if flags & os.O_EXCL:
                raise fuse.FuseOSError(errno.EEXIST)
            return self._open_fh(self.nodes[ino])
        node = self._new(stat.S_IFREG | (mode & 0o7777))
        self._set(directory, name, node.ino)
        return self._open_fh(node)

    def open(self, path: str, flags: int) -> int:
        if path == CONTROL:
            return 0
        return self._open_fh(self._lookup(path))

    def opendir(self, path: str) -> int:
        return self._open_fh(self._lookup(path))

    def releasedir(self, path: str | None, fh: int) -> int:
        self.fhs.pop(fh, None)
        return 0

    def release(self, path: str | None, fh: int) -> int:
        self.fhs.pop(fh, None)
        return 0

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        if path == CONTROL:
            return json.dumps(self.counters).encode()[offset : offset + size]
        node = self._node(path, fh)
        return bytes(node.data[offset : offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        if path == CONTROL:
            command = data.decode().split()
            if command[:1] == ["cut"]:
                self.cut(int(command[1]))
                return len(data)
            raise fuse.FuseOSError(errno.EINVAL)
        node = self._node(path, fh)
        if offset > len(node.data):
            node.data.extend(b"\0" * (offset - len(node.data)))
        node.data[offset : offset + len(data)] = data
        node.mtime = node.ctime = time.time_ns()
        return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        if path == CONTROL:
            return 0
        node = self._node(path, fh)
        if length < len(node.data):
            del node.data[length:]
        else:
            node.data.extend(b"\0" * (length - len(node.data)))
        node.mtime = node.ctime = time.time_ns()
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        node = self._node(path, fh)
        node.durable = bytes(node.data)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        node = self._node(path, fh)
        node.durable_entries = dict(node.entries)
        node.log = []
        return 0

    def unlink(self, path: str) -> int:
        directory, name = self._split(path)
        if name not in directory.entries:
            raise fuse.FuseOSError(errno.ENOENT)
        if self.nodes[directory.entries[name]].is_dir:
            raise fuse.FuseOSError(errno.EISDIR)
        self._del(directory, name)
        return 0

    def rename(self, old: str, new: str) -> int:
        source, old_name = self._split(old)
        target, new_name = self._split(new)
        ino = source.entries.get(old_name)
        if ino is None:
            raise fuse.FuseOSError(errno.ENOENT)
        existing = target.entries.get(new_name)
        if existing is not None and self.nodes[existing].is_dir:
            if not self.nodes[ino].is_dir:
                raise fuse.FuseOSError(errno.EISDIR)
            if self.nodes[existing].entries:
                raise fuse.FuseOSError(errno.ENOTEMPTY)
        if source is target:
            # One change in the log: a journal makes a rename all or nothing.
            if existing is not None:
                self.nodes[existing].nlink -= 1
            del source.entries[old_name]
            source.entries[new_name] = ino
            source.log.append(("rename", old_name, new_name, ino))
            source.mtime = source.ctime = time.time_ns()
        else:
            self._set(target, new_name, ino)
            self._del(source, old_name)
        return 0

    def link(self, target: str, source: str) -> int:
        node = self._lookup(source)
        directory, name = self._split(target)
        if name in directory.entries:
            raise fuse.FuseOSError(errno.EEXIST)
        self._set(directory, name, node.ino)
        return 0

    def chmod(self, path: str | None, mode: int) -> int:
        node = self._lookup(path or "/")
        node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        node = self._lookup(path or "/")
        if uid not in (-1, 4294967295):
            node.uid = uid
        if gid not in (-1, 4294967295):
            node.gid = gid
        return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        node = self._lookup(path or "/")
        now = time.time_ns()
        node.atime, node.mtime = times if times else (now, now)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": 1 << 20,
            "f_bfree": 1 << 19,
            "f_bavail": 1 << 19,
            "f_files": 1 << 20,
            "f_ffree": 1 << 19,
            "f_namemax": 255,
        }


def main(argv: list[str]) -> int:
    """Mount the file system at ``argv[0]`` in the foreground until unmounted."""
    fuse.FUSE(
        PowerCutFS(),
        argv[0],
        foreground=True,
        nothreads=True,
        hard_remove=True,
        use_ino=True,
        direct_io=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        fsname="powercut",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
