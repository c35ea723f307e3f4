"""Where the file store keeps what: run names on disk, the temp and index names.

``DIR/<name>.json`` holds a run's document. ``<name>`` encodes the run_id: the bytes
``a-z 0-9 _ -`` and ``.`` (not first) of its UTF-8 pass through, every other byte becomes
``%xx`` in lowercase hex. An encoded name over 200 bytes becomes ``~`` + the SHA-256 hex
of the run_id instead. ``DIR/.tmp-*`` are files being written, ``DIR/.active/<name>``
the index markers.

Names hold only lowercase ASCII, so two run_ids differing in case cannot collide on a
case-insensitive or Unicode-normalising file system, ``/`` and ``..`` cannot escape the
directory, and the mapping is reversible, so ``list_runs`` needs no index. Hashing keeps
names under NAME_MAX (255); the document keeps the real run_id, and ``~`` is never
produced by escaping, so hashed and escaped names cannot collide.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote_to_bytes

from ..._checkpoint import check_run_id

__all__ = [
    "ACTIVE",
    "HASHED_NAME",
    "TEMP_PREFIX",
    "decode_name",
    "encode_name",
    "hashed",
    "join",
    "run_of",
]

TEMP_PREFIX = ".tmp-"
ACTIVE = ".active"
_MAX_NAME = 200

# byte -> how it appears in a name
_ESCAPE = [
    chr(b) if chr(b) in "abcdefghijklmnopqrstuvwxyz0123456789_-." else f"%{b:02x}"
    for b in range(256)
]
_PLAIN_NAME = re.compile(r"[a-z0-9_-][a-z0-9_.-]*")
_ESCAPED_NAME = re.compile(r"(?:[a-z0-9_-]|%[0-9a-f]{2})(?:[a-z0-9_.-]|%[0-9a-f]{2})*")
HASHED_NAME = re.compile(r"~[0-9a-f]{64}")


def hashed(run_id: str) -> str:
    """Return the hashed stem of a run_id whose escaped name is too long."""
    return "~" + hashlib.sha256(run_id.encode("utf-8")).hexdigest()


def encode_name(run_id: str) -> str:
    """Return the file name stem for a (valid) run_id; see the module docstring."""
    if _PLAIN_NAME.fullmatch(run_id) is not None:
        name = run_id
    else:
        name = "".join([_ESCAPE[b] for b in run_id.encode("utf-8")])
        if name[0] == ".":
            name = "%2e" + name[1:]
    return name if len(name) <= _MAX_NAME else hashed(run_id)


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


def run_of(name: str) -> str:
    """Return the run_id a stem stands for, for messages (the stem itself if hashed)."""
    return decode_name(name) or name


def join(directory: str, name: str) -> str:
    """Return the path of ``name`` in the store ``directory``, for messages."""
    return f"{directory}/{name}" if directory != "/" else f"/{name}"
