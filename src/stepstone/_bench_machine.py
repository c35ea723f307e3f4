"""What the benchmark says about the machine it ran on: CPUs, memory, disk, Python."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from datetime import UTC, datetime
from typing import Any

from ._store import Store

__all__ = ["machine_info", "store_directory"]


def machine_info(directory: str | None = None) -> dict[str, Any]:
    """Describe the machine: CPUs, memory, the disk under ``directory``, Python, date."""
    info: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "platform": sys.platform,
        "nproc": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
    }
    with contextlib.suppress(OSError, AttributeError):
        # Other work on the machine moves every figure: say how busy it was.
        info["loadavg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    for line in _read_text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            info["memory_gib"] = round(int(line.split()[1]) / 1024**2, 1)
            break
    for line in _read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            info["cpu"] = line.split(":", 1)[1].strip()
            break
    if directory is not None:
        info["disk"] = _disk_of(directory)
    return info


def _disk_of(directory: str) -> dict[str, Any]:
    path = os.path.realpath(directory)
    disk: dict[str, Any] = {"path": path}
    best = ""
    for line in _read_text("/proc/mounts").splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1]
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best = mount
            disk.update(device=fields[0], mount=mount, fstype=fields[2])
    with contextlib.suppress(OSError):
        st = os.statvfs(path)
        disk["size_gib"] = round(st.f_blocks * st.f_frsize / 1024**3, 1)
        disk["free_gib"] = round(st.f_bavail * st.f_frsize / 1024**3, 1)
    device = str(disk.get("device", ""))
    if device.startswith("/dev/"):
        name = os.path.basename(device).rstrip("0123456789")
        rotational = _read_text(f"/sys/block/{name}/queue/rotational").strip()
        if rotational:
            disk["rotational"] = rotational == "1"
    return disk


def _read_text(path: str) -> str:
    """Return a small system file's text, or "" if it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def store_directory(store: Store) -> str | None:
    """Return the local directory a file or sqlite store keeps its data in, if any."""
    path = getattr(store, "path", None)
    if not isinstance(path, str):
        return None
    return path if type(store).scheme == "file" else os.path.dirname(path)
