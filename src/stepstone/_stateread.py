"""Reading a long state back: a ``state_ref``'s pieces assembled into the state.

The read side of ``_statelog`` (whose docstring tells the layout): the base's text,
then each log piece's operations applied in order, and the private handle a later
save diffs against.
"""

from __future__ import annotations

from typing import Any

from ._checkpoint import Checkpoint, Stored
from ._codec import REF_KEY, checkpoint_from_doc, decode_json
from ._errors import CorruptCheckpoint
from ._statediff import _containers
from ._statepieces import PiecesMissing, pieces_of, serial

__all__ = ["assemble", "checkpoint_with_pieces", "missing_error"]


def _apply(state: dict[str, Any], ops: Any, source: str) -> None:
    """Apply a log piece's operations to a freshly decoded state, in place."""
    if not isinstance(ops, list):
        raise CorruptCheckpoint(f"{source}: a log piece is not a list; left untouched")
    for op in ops:
        try:
            kind, path = op[0], op[1]
            node: Any = state
            for key in path[:-1]:
                node = node[key]
            last = path[-1]
            if kind == "s":
                node[last] = op[2]
            elif kind == "x":
                node[last].extend(op[2])
            elif kind == "d":
                del node[last]
            else:
                raise ValueError(f"unknown operation {kind!r}")
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptCheckpoint(
                f"{source}: a log piece does not apply to its base ({type(exc).__name__}: "
                f"{exc}); left untouched"
            ) from exc


def assemble(
    store: object,
    run_id: str,
    version: str | None,
    ref: dict[str, Any],
    pieces: dict[str, bytes],
    source: str,
) -> tuple[dict[str, Any], Stored]:
    """Rebuild the state a ``state_ref`` names from its pieces: (state, handle).

    Raises ``PiecesMissing`` if a piece is absent, ``CorruptCheckpoint`` if malformed.
    """
    try:
        base = ref["base"]
        gen = ref["gen"]
        keys = pieces_of(ref)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpoint(
            f"{source}: malformed state_ref ({type(exc).__name__}: {exc}); left untouched"
        ) from exc
    missing = [key for key in keys if key not in pieces]
    if missing:
        raise PiecesMissing(missing)
    text = b"".join(pieces[key] for key in base)
    if len(text) != ref.get("base_bytes"):
        raise CorruptCheckpoint(
            f"{source}: the state's base is {len(text)} bytes, its reference says "
            f"{ref.get('base_bytes')!r}; left untouched"
        )
    try:
        state: Any = decode_json(text)
        logs = [decode_json(pieces[key]) for key in keys[len(base) :]]
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpoint(
            f"{source}: a piece of the state is not JSON ({exc}); left untouched"
        ) from exc
    if type(state) is not dict:
        raise CorruptCheckpoint(f"{source}: the state's base is not an object; left untouched")
    for ops in logs:
        _apply(state, ops, source)
    # No list or dict shared with the state (which is the caller's); strings shared.
    private = _containers(state)
    history = ref.get("history")
    inc = ref.get("inc")
    if inc is not None and not isinstance(inc, str):
        raise CorruptCheckpoint(f"{source}: state_ref's inc is not a string; left untouched")
    return state, Stored(
        serial(store), run_id, version, int(gen), ref, private, dict(state), history, None, inc
    )


def checkpoint_with_pieces(
    store: object,
    doc: dict[str, Any],
    version: str | None,
    source: str,
    run_id: str | None,
    pieces: dict[str, bytes],
) -> Checkpoint:
    """The checkpoint of a schema-3 document, its state rebuilt from ``pieces``.

    Raises ``PiecesMissing`` (read the document again) or ``CorruptCheckpoint``.
    """
    state, handle = assemble(store, str(doc.get("run_id")), version, doc[REF_KEY], pieces, source)
    return checkpoint_from_doc(doc, version, source, run_id, state=state, stored=handle)


def missing_error(source: str, missing: PiecesMissing) -> CorruptCheckpoint:
    """The error for a document that still names missing pieces after re-reading it."""
    return CorruptCheckpoint(
        f"{source}: the stored state names {len(missing.keys)} piece(s) that are not stored "
        f"(first {missing.keys[0]!r}); left untouched"
    )
