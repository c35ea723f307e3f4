"""The vocabulary of a long state's pieces: the limits, a piece, a planned save.

The leaf of ``_statelog`` (whose docstring tells the layout and the rules): what a
save hands a store (``Prepared``), the keys a ``state_ref`` names, and the number
that tells one store object from another in a handle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ._checkpoint import Stored
from ._frozen import Twin

#: A state whose JSON text is at most this many bytes stays in the run's document.
INLINE_MAX = 8 * 1024
#: The largest piece a store is handed by default; a store may ask for smaller.
PIECE_MAX = 1 << 20
#: A new base is written once the log holds this many times the base's bytes...
LOG_FACTOR = 3
#: ... or this many pieces (a load fetches each), for a base of up to
#: ``LOG_MAX * LOG_SHARE`` bytes...
LOG_MAX = 256
#: ... and for a larger base, one piece per this many of its bytes...
LOG_SHARE = 512
#: ... up to this many.
LOG_CEILING = 2048


def log_limit(base_bytes: int) -> int:
    """How many log pieces a base of ``base_bytes`` may have before a new base is written.

    Scaled with the base (issue 36): a fixed count made a long run rewrite its whole
    state every 256 saves, a write that grows with the run, so a 1,000-step chat wrote
    twice the bytes per step that a 500-step one did (its instructions n^1.19 from 500
    to 1,000 steps on SQLite; n^1.10 without the count). With the limit scaled, a new
    base written for the count costs at most ``LOG_SHARE`` bytes per save whatever the
    state's size, and a load fetches at most one piece per ``LOG_SHARE`` bytes of the
    base it reads anyway (and never more than ``LOG_CEILING``).
    """
    return min(LOG_CEILING, max(LOG_MAX, base_bytes // LOG_SHARE))


@dataclass(frozen=True, slots=True)
class Piece:
    """One immutable piece of a run's stored state: written once, never changed."""

    key: str
    gen: int
    data: bytes


class PiecesMissing(Exception):
    """A document names pieces that are not stored (a newer save collected them).

    Internal: a store that sees it reads the document again; if the same document
    still names missing pieces, it raises ``CorruptCheckpoint``.
    """

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"{len(keys)} pieces missing, first {keys[0]!r}")
        self.keys = keys


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a save must do, in order: write ``pieces``, then the document, then collect.

    - ``state_text``: the state's JSON for the document (inline), or None;
    - ``ref``: the ``state_ref`` for the document (chunked), or None;
    - ``pieces``: to be stored before the document's compare-and-swap;
    - ``collect_below``: after the swap succeeded, delete the run's pieces whose
      generation is below this (None: nothing to collect);
    - ``state``: the state for the returned checkpoint; ``stored``: its handle (give the
      returned checkpoint ``stored_state=prepared.bind(version)``).
    """

    state_text: str | None
    ref: dict[str, Any] | None
    pieces: list[Piece]
    collect_below: int | None
    state: dict[str, Any]
    gen: int
    private: dict[str, Any] | None
    store: int
    run_id: str
    #: What the save changed, as ``op path`` strings (``x messages``); None: written whole.
    changes: list[str] | None = None
    #: The key of the run's newest history record (a run that keeps history), or None.
    history: str | None = None
    #: The log chain a log piece was numbered in (``_Chain``), handed to the next save.
    chain: Any = None
    #: The run's incarnation (``new_inc``); None: a legacy lineage (keys without one).
    inc: str | None = None
    #: The number locations found by this save's change detection, for the next.
    numbers: Any = None

    def bind(self, version: str) -> Stored | None:
        """The handle of the saved checkpoint, once its version is known.

        None for a state that is inline and never had pieces (most runs): nothing to
        carry. The handed values are kept as a shallow copy, so a step that rebinds a
        key of the state it was handed in place is still seen to have replaced it.
        """
        if self.ref is None and self.gen == 0:
            return None
        handed = dict(self.state) if self.ref is not None else None
        return Stored(
            self.store,
            self.run_id,
            version,
            self.gen,
            self.ref,
            self.private,
            handed,
            self.history,
            self.chain,
            self.inc,
            self.numbers,
        )

    def document_fields(self) -> dict[str, Any]:
        """``encode_document``'s keywords for this save's document (``ref``, ``gen``, ...)."""
        if self.ref is not None:
            return {"ref": self.ref}
        return {"gen": self.gen, "history_head": self.history, "inc": self.inc}

    @property
    def piece_keys(self) -> list[str]:
        return [piece.key for piece in self.pieces]


# Every save builds a ``Prepared`` (and a long run's a ``Piece`` or more): built on a
# twin (``_frozen``), not through the frozen ``__init__``'s setter call per field, which
# cost about 17,000 of a memory save's instructions. Still frozen to everyone else.
Prepared.__init__ = Twin(Prepared).init()  # type: ignore[method-assign]
Piece.__init__ = Twin(Piece).init()  # type: ignore[method-assign]


def pieces_of(ref: dict[str, Any]) -> list[str]:
    """Every piece key a ``state_ref`` names, base first, in order."""
    keys: list[str] = list(ref["base"])
    for prefix, first, count in ref["log"]:
        keys.extend(f"{prefix}{n}" for n in range(first, first + count))
    return keys


_serials = itertools.count(1)


def serial(store: object) -> int:
    """A number for the store object, unique in the process (``id`` may be reused)."""
    try:
        return store._statelog_serial  # type: ignore[attr-defined,no-any-return]  # noqa: SLF001
    except AttributeError:
        number = next(_serials)
        # Two threads racing here give it two numbers: a save then merely writes whole.
        store._statelog_serial = number  # type: ignore[attr-defined]  # noqa: SLF001
        return number
