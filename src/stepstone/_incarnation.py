"""A run's incarnation, which every piece key of its lineage starts with (``_statelog``).

An incarnation is 16 characters: the unix seconds it was made at (8 hex digits, by the
writing host's clock, read through ``_clock`` so a test's ``FakeClock`` sets it), then 8
random hex digits. A piece key is
``"<inc>:<gen>.<token>.<n>"``; keys written before incarnations existed have no
``<inc>:`` (*legacy* keys) and still load. The rules that use it are in ``_statelog``'s
docstring.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from . import _clock
from ._bounds import ORPHAN_AGE
from ._codec import REF_KEY

__all__ = [
    "INC_LEN",
    "ORPHAN_AGE",
    "Orphan",
    "gen_of",
    "inc_cutoff",
    "inc_of",
    "inc_of_doc",
    "is_orphan",
    "key_in",
    "new_inc",
]

#: An incarnation's length: 8 hex digits of unix seconds, 8 random hex digits.
INC_LEN = 16


@dataclass(frozen=True, slots=True)
class Orphan:
    """A piece ``collect_orphans`` deleted: its run (id, or how the store names it),
    key and size in bytes."""

    run: str
    key: str
    size: int


def gen_of(key: str) -> int:
    """The generation of a piece key (``<inc>:<gen>.`` or, legacy, ``<gen>.``)."""
    return int(key.rpartition(":")[2].split(".", 1)[0])


def inc_of(key: str) -> str | None:
    """The incarnation a piece key starts with; None for a legacy key (no ``:``)."""
    inc, colon, _ = key.partition(":")
    return inc if colon else None


def _now() -> float:
    return _clock.now().timestamp()


def new_inc(now: float | None = None) -> str:
    """A new incarnation: 8 hex digits of unix seconds (``now``), 8 random hex digits."""
    seconds = int(_now() if now is None else now)
    return f"{max(seconds, 0) & 0xFFFFFFFF:08x}{secrets.token_hex(4)}"


def inc_cutoff(min_age: float, now: float | None = None) -> str:
    """The incarnations at least ``min_age`` seconds old sort below this string.

    An incarnation's age is counted from the second it names (made at ``s``: its age is
    ``now - s``), so ``min_age=0`` takes one made in the current second too. Counting
    from the end of that second instead would keep it until the next: an orphan made
    just now would survive ``collect_orphans(0)``. With the default age of a day, the
    fraction of a second this can add is nothing beside the margin it leaves a save in
    flight.
    """
    seconds = math.floor((_now() if now is None else now) - min_age) + 1
    return f"{max(seconds, 0):08x}"


def is_orphan(key: str, live: str | None, min_age: float, now: float | None = None) -> bool:
    """Whether ``key`` is an orphan: of an incarnation other than ``live`` (the run's
    document's, None: no document), at least ``min_age`` seconds old (``inc_cutoff``).

    Legacy keys (no incarnation) are never orphans: their age cannot be told.
    """
    inc = inc_of(key)
    if inc is None or inc == live or len(inc) != INC_LEN:
        return False
    return inc[:8] < inc_cutoff(min_age, now)


def inc_of_doc(doc: dict[str, Any]) -> tuple[bool, str | None]:
    """``(has_pieces, inc)`` of a decoded document: whether its lineage may have pieces,
    and its incarnation (None: legacy, or none)."""
    ref = doc.get(REF_KEY)
    if isinstance(ref, dict):
        inc = ref.get("inc")
        return True, inc if isinstance(inc, str) else None
    inc = doc.get("state_inc")
    if isinstance(inc, str):
        return True, inc
    return doc.get("state_gen") is not None, None


def key_in(inc: str | None, rest: str) -> str:
    """``rest`` (``<gen>.<token>...``) as a key of incarnation ``inc`` (None: legacy)."""
    return rest if inc is None else f"{inc}:{rest}"
