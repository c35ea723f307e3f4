"""A long run's state as stored: a snapshot plus a log of changes, kept in pieces.

A small state (its JSON text up to ``INLINE_MAX`` bytes) stays inside the run's
document, as it always did (schema 2). A larger one moves out, into immutable
*pieces*, and the document keeps a reference to them (``state_ref``, schema 3):

- a **base**: the state's JSON text at some save, cut into pieces of at most
  ``piece_max`` bytes (so no item, row or packet limit is reached, Cosmos DB's 2 MB
  included);
- a **log**: one piece per later save, holding only what that save changed, as a
  JSON list of operations on the base: ``["s", path, value]`` (set a key),
  ``["x", path, items]`` (append to a list), ``["d", path]`` (delete a key).

So a step that appends a message to a transcript writes that message, not the
transcript. When the log has grown to ``LOG_FACTOR`` times the base (or to
``LOG_MAX`` pieces), the next save writes a new base instead: a growing state is
rewritten a bounded number of times in all (its bases grow geometrically), and a
load reads at most about ``LOG_FACTOR + 1`` times the state, never the run's history.

The commit point is unchanged: pieces are written first, under keys nobody else
uses, and the save is still the one compare-and-swap of the run's document, which
names them. A reader that finds a piece missing has read a document that a newer
save superseded (and whose pieces it collected): it reads the document again.

Every piece key starts with its run's *incarnation* and its *generation*
(``"<inc>:<gen>.<token>.<n>"``, history records ``"<inc>:<gen>.h.<token>"``). Each save's
document has a generation one above the document it replaced. A base's pieces have the
generation of the document that wrote it; a log piece has its base's generation, and a
writer that keeps appending to one base numbers its pieces under one prefix
(``<base gen>.<token>.0``, ``.1``...), so the document names them as one run
``[prefix, first, count]``: its reference stays a few runs long, not one entry per
save. The numbers come from a counter the writer's handles share, so two saves racing
from one handle never write the same key. After a save that
wrote a new base (generation ``g``), no document from then on names a piece below
``g``, so the store deletes the run's pieces below ``g``: the superseded base and
log, and whatever a crashed or out-raced writer left behind (a writer still racing
has read a document of generation ``g - 1`` or later, so it writes at ``g`` or
later and is never collected under it). With history kept, old pieces are never
collected (history records name them), until the run is deleted.

The incarnation (``inc``, ``new_inc``) ties pieces to one lineage of documents: a run
deleted and started again under the same id is a new incarnation, and nothing done
for one incarnation touches another's pieces. Its 16 characters are the unix seconds
it was made at (8 hex digits, the writing host's clock) and 8 random hex digits, so its
age can be read from any of its keys. The rules:

- a save that creates the document (no expected version) starts a new incarnation;
- a save that replaces a document keeps the incarnation of its handle (``Stored.inc``,
  read from the document's ``state_ref.inc`` or ``state_inc``), for the whole life of
  the document's lineage: its history records name pieces of that incarnation;
- a save that replaces a document but has no handle of that run (a checkpoint built by
  hand) cannot know it without a read, so it starts a new incarnation. Nothing is lost
  by that: the pieces of the older incarnation are never collected by this lineage's
  base collections (which delete only their own incarnation's pieces), nor by
  ``delete`` (the document's incarnation only); they become orphans, collected once
  older than the safe age by a base collection of a run that keeps no history (whose
  document then names none of them) or by ``collect_orphans`` once the run is deleted;
- a document written by an earlier release has no incarnation: its keys have no ``:``
  and its lineage keeps writing such *legacy* keys (``inc`` None), collected as before
  but among legacy keys only, until the run is deleted and started again.

The store's rules follow: a base collection deletes only its incarnation's pieces below
``g``; ``delete`` reads the document, deletes it by compare-and-swap on the version
read, then deletes exactly that document's incarnation's pieces (none if there was no
document: a first save in flight may have written its pieces already). Pieces of an
incarnation that no document names, older than a safe age (``ORPHAN_AGE``, by default
a day, so no save in flight is ever touched), are *orphans* (``is_orphan``): a writer
killed between its pieces and its document leaves them.

Change detection never scans text. The saved checkpoint carries a private
``Stored`` handle: the stored state as decoded (``private``: shared with nobody)
and the state handed to the caller (``handed``). A later save of a checkpoint
derived from it compares the new state with both: a value that is the same object
as the one handed out *and* equal to the private copy is unchanged (the equality
is Python's, in C, and catches changes made in place); a list whose head is the
list handed out, unchanged, gained only its tail; anything else is re-encoded
(validated as strictly as a whole state, at its depth in the state).
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from dataclasses import dataclass, replace
from itertools import islice
from operator import is_
from typing import Any

from ._checkpoint import Checkpoint, Stored, utcnow
from ._codec import (
    MAX_DEPTH,
    REF_KEY,
    PiecesNeeded,
    checkpoint_from_doc,
    copy_containers,
    decode_json,
    dump_json,
    encode_state,
)
from ._errors import CorruptCheckpoint
from ._incarnation import (
    INC_LEN,
    ORPHAN_AGE,
    Orphan,
    gen_of,
    inc_cutoff,
    inc_of,
    inc_of_doc,
    is_orphan,
    key_in,
    new_inc,
)

__all__ = [
    "INC_LEN",
    "INLINE_MAX",
    "LOG_FACTOR",
    "LOG_MAX",
    "ORPHAN_AGE",
    "Orphan",
    "PIECE_MAX",
    "REF_KEY",
    "Piece",
    "PiecesNeeded",
    "PiecesMissing",
    "Prepared",
    "assemble",
    "checkpoint_with_pieces",
    "missing_error",
    "gen_of",
    "inc_cutoff",
    "inc_of",
    "inc_of_doc",
    "is_orphan",
    "new_inc",
    "pieces_of",
    "prepare_save",
    "serial",
]

#: A state whose JSON text is at most this many bytes stays in the run's document.
INLINE_MAX = 8 * 1024
#: The largest piece a store is handed by default; a store may ask for smaller.
PIECE_MAX = 1 << 20
#: A new base is written once the log holds this many times the base's bytes...
LOG_FACTOR = 3
#: ... or this many pieces (a load fetches each).
LOG_MAX = 256


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
        )

    def document_fields(self) -> dict[str, Any]:
        """``encode_document``'s keywords for this save's document (``ref``, ``gen``, ...)."""
        if self.ref is not None:
            return {"ref": self.ref}
        return {"gen": self.gen, "history_head": self.history, "inc": self.inc}

    @property
    def piece_keys(self) -> list[str]:
        return [piece.key for piece in self.pieces]


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


def _handle(cp: Checkpoint) -> Stored | None:
    handle = cp.stored_state
    return handle if isinstance(handle, Stored) else None


def prepare_save(
    store: object,
    cp: Checkpoint,
    *,
    piece_max: int = PIECE_MAX,
    history: object = None,
    max_base_age: float | None = None,
) -> Prepared:
    """Plan the save of ``cp`` on ``store``: inline, a new base, or one log piece.

    Raises ``InvalidState`` for a state no backend could store, as ``encode_state``.
    A run that keeps history (``cp.history``) also gets a history record per save, and
    nothing of it is ever collected (until the run is deleted). ``history`` is ignored
    (the checkpoint says whether the run keeps history).

    ``max_base_age``: seconds after which a base is rewritten rather than logged
    against, for a store whose pieces expire (Cosmos DB's TTL): the base records when
    it was written (``at``), and no document names a piece older than this.
    """
    planned = _plan(store, cp, piece_max, cp.history, max_base_age)
    if not cp.history:
        return planned
    handle = _handle(cp)
    return _recorded(planned, cp, handle)


def _inc_for(cp: Checkpoint, handle: Stored | None) -> str | None:
    """The incarnation a whole save of ``cp`` writes under (the module docstring's rules)."""
    if cp.version is None:
        return new_inc()
    if handle is not None and handle.run_id == cp.run_id:
        if handle.inc is not None:
            return handle.inc
        if handle.gen or handle.ref is not None:
            return None  # a legacy lineage keeps its legacy keys
    return new_inc()


def _recorded(planned: Prepared, cp: Checkpoint, handle: Stored | None) -> Prepared:
    """``planned`` plus a history record naming the state it saves (``_history``)."""
    prev = handle.history if handle is not None else None
    gen = planned.gen if planned.pieces else planned.gen + 1
    inc = planned.inc if planned.inc is not None or planned.gen else _inc_for(cp, handle)
    key = key_in(inc, f"{gen}.h.{_token()}")
    ref = planned.ref
    if ref is not None:
        ref = {**ref, "gen": gen, "history": key}
        if inc is not None:
            ref["inc"] = inc
    record: dict[str, Any] = {
        "gen": gen,
        "prev": prev,
        "step": cp.step,
        "step_names": list(cp.step_names),
        "attempt": cp.attempt,
        "at": utcnow().isoformat(),
        "status": cp.status,
        "changes": planned.changes,
    }
    if ref is not None:
        record["ref"] = ref
        record["bytes"] = ref["base_bytes"] + ref["log_bytes"]
        data = dump_json(record).encode("utf-8")
    else:
        text = planned.state_text
        assert text is not None
        record["bytes"] = len(text)
        data = (dump_json(record)[:-1] + ',"state":' + text + "}").encode("utf-8")
    return replace(
        planned,
        ref=ref,
        gen=gen,
        pieces=[*planned.pieces, Piece(key, gen, data)],
        collect_below=None,
        history=key,
        inc=inc,
    )


def _plan(
    store: object, cp: Checkpoint, piece_max: int, history: bool, max_base_age: float | None
) -> Prepared:
    handle = _handle(cp)
    if (
        handle is not None
        and handle.ref is not None
        and handle.private is not None
        and handle.store == serial(store)
        and handle.run_id == cp.run_id
        and handle.version == cp.version
        and (max_base_age is None or time.time() - handle.ref.get("at", 0) <= max_base_age)
    ):
        planned = _delta(store, cp, handle, piece_max)
        if planned is not None:
            return planned
    text, copy = encode_state(cp.state)
    # A stale or foreign handle still tells the generation it came from: a save above it
    # never collects a piece a newer document could name (see the module docstring).
    base_gen = handle.gen if handle is not None else 0
    had_pieces = handle is not None and handle.ref is not None
    if len(text) <= INLINE_MAX // 4 or len(data := text.encode("utf-8")) <= INLINE_MAX:
        if not had_pieces:
            # Most runs: no pieces ever, so no incarnation to make (it costs a syscall).
            inc = _inc_for(cp, handle) if base_gen else None
            return Prepared(
                text, None, [], None, copy, base_gen, None, serial(store), cp.run_id, inc=inc
            )
        gen = base_gen + 1
        collect = None if history else gen
        inc = _inc_for(cp, handle)
        return Prepared(text, None, [], collect, copy, gen, None, serial(store), cp.run_id, inc=inc)
    gen = base_gen + 1
    token = _token()
    inc = _inc_for(cp, handle)
    pieces = [
        Piece(key_in(inc, f"{gen}.{token}.b{n}"), gen, data[start : start + piece_max])
        for n, start in enumerate(range(0, len(data), piece_max))
    ]
    ref = {
        "gen": gen,
        "base": [piece.key for piece in pieces],
        "base_bytes": len(data),
        "log": [],
        "log_bytes": 0,
        "log_count": 0,
    }
    if inc is not None:
        ref["inc"] = inc
    if max_base_age is not None:
        ref["at"] = round(time.time(), 3)
    private: dict[str, Any] = _containers(copy)
    # Collected even when the run had no pieces: a crashed writer's are swept too.
    collect = None if history else gen
    return Prepared(
        None, ref, pieces, collect, copy, gen, private, serial(store), cp.run_id, inc=inc
    )


def _token() -> str:
    return secrets.token_hex(6)


def _delta(store: object, cp: Checkpoint, known: Stored, piece_max: int) -> Prepared | None:
    """One log piece with what changed since ``known``; None when a whole save is due."""
    ref = known.ref
    private = known.private
    assert ref is not None and private is not None
    new = cp.state
    if type(new) is not dict:
        return None  # encode_state refuses it, with its usual message
    changed: list[tuple[tuple[str, ...], str, Any]] = []
    if not _diff((), new, known.handed, private, changed):
        return None
    next_state = dict(new)
    if not changed:
        # Nothing changed: the document keeps naming the same pieces.
        return Prepared(
            None,
            ref,
            [],
            None,
            next_state,
            known.gen,
            private,
            serial(store),
            cp.run_id,
            chain=known.chain,
            inc=known.inc,
        )
    texts: list[str] = []
    next_private: dict[str, Any] = private
    for path, op, value in changed:
        if op == "d":
            texts.append(dump_json(["d", list(path)]))
            next_private = _without(next_private, path)
            _del_in(next_state, path)
            continue
        wrapped: Any = value
        for key in reversed(path):
            wrapped = {key: wrapped}
        try:
            text, copy = encode_state(wrapped)
        except Exception:  # noqa: BLE001 - refused here: the whole-state path says why
            return None
        if text.count("[") + text.count("{") >= MAX_DEPTH - len(path) - 1:
            # Near the depth limit, its one exception counts the whole state's text.
            return None
        inner: Any = copy
        for key in path:
            inner = inner[key]
        mine = _containers(inner)
        # The value's own text, cut out of the wrapper's: the encoder is compact and
        # deterministic, so the wrapper is the keys' prefix, the value, then "}"s.
        head = "".join(["{" + dump_json(key) + ":" for key in path])
        value_text = text[len(head) : len(text) - len(path)]
        texts.append(dump_json([op, list(path)])[:-1] + "," + value_text + "]")
        if op == "x":
            next_private = _extended(next_private, path, mine)
            _extend_in(next_state, path, inner, len(_at(private, path)))
        else:
            next_private = _with(next_private, path, mine)
            _set_in(next_state, path, inner)
    data = ("[" + ",".join(texts) + "]").encode("utf-8")
    log_bytes = ref["log_bytes"] + len(data)
    if (
        len(data) > piece_max
        or ref["log_count"] + 1 > LOG_MAX
        or log_bytes > LOG_FACTOR * max(ref["base_bytes"], INLINE_MAX)
    ):
        return None
    gen = known.gen + 1
    base_gen = gen_of(ref["base"][0])
    chain = _chain_for(known.chain, ref["base"][0], base_gen)
    n = next(chain.numbers)  # atomic in CPython: racing saves get different numbers
    log = [list(run) for run in ref["log"]]
    last = log[-1] if log else None
    if last is not None and last[0] == chain.prefix and last[1] + last[2] == n:
        last[2] += 1
    else:
        log.append([chain.prefix, n, 1])
    next_ref = {
        "gen": gen,
        "base": ref["base"],
        "base_bytes": ref["base_bytes"],
        "log": log,
        "log_bytes": log_bytes,
        "log_count": ref["log_count"] + 1,
    }
    if "inc" in ref:
        next_ref["inc"] = ref["inc"]
    if "at" in ref:
        next_ref["at"] = ref["at"]
    piece = Piece(f"{chain.prefix}{n}", base_gen, data)
    changes = [f"{op} {'.'.join(path)}" for path, op, _ in changed]
    return Prepared(
        None,
        next_ref,
        [piece],
        None,
        next_state,
        gen,
        next_private,
        serial(store),
        cp.run_id,
        changes,
        chain=chain,
        inc=known.inc,
    )


def _chain_for(chain: Any, base: str, base_gen: int) -> _Chain:
    """``chain`` if this process may go on numbering log pieces in it, else a new one."""
    if isinstance(chain, _Chain) and chain.base == base and chain.process == _process_token:
        return chain
    prefix = key_in(inc_of(base), f"{base_gen}.{_token()}.")
    return _Chain(base, prefix, itertools.count(), _process_token)


@dataclass(frozen=True, slots=True)
class _Chain:
    """One writer's log on one base: the key prefix and the numbers it hands out.

    Valid in the process that made it only (``process``): a handle pickled to another
    process, or inherited by a forked child, would hand out the same numbers there,
    and two writers' pieces would share keys. There it starts a chain of its own.
    """

    base: str  # the base's first piece key: which base the chain appends to
    prefix: str
    numbers: Any  # itertools.count
    process: str

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy (pickle, copy, deepcopy) is a spent chain: it would repeat numbers.
        return (_Chain, (self.base, self.prefix, itertools.count(), ""))


def _new_process_token() -> None:
    global _process_token  # noqa: PLW0603 - one per process, renewed in a forked child
    _process_token = secrets.token_hex(8)


_process_token = secrets.token_hex(8)
os.register_at_fork(after_in_child=_new_process_token)


def _containers(value: Any) -> Any:
    """A copy of ``value``'s dicts and lists, sharing its (immutable) scalars.

    The private copy shares strings with the handed state on purpose: the next save's
    equality test then finds them identical at once instead of comparing their text.
    """
    return copy_containers(value)


_MISSING: Any = object()


def _diff(
    path: tuple[str, ...],
    new: dict[str, Any],
    handed: dict[str, Any] | None,
    old: dict[str, Any],
    out: list[tuple[tuple[str, ...], str, Any]],
) -> bool:
    """Append ``(path, op, value)`` for what differs between ``new`` and ``old``.

    Returns False when the change cannot be expressed (a key that is not a str, which
    the whole-state path refuses with its message).
    """
    if handed is None:
        handed = {}
    for key, value in new.items():
        if type(key) is not str:
            return False
        before = old.get(key, _MISSING)
        if before is _MISSING:
            out.append(((*path, key), "s", value))
            continue
        given = handed.get(key, _MISSING)
        kind = type(value)
        if value is given and kind is type(before) and value == before:
            continue  # the object handed out, unchanged in place
        if kind is list and type(before) is list:
            n = len(before)
            if (
                len(value) >= n
                and type(given) is list
                and len(given) >= n
                and all(map(is_, islice(value, n), islice(given, n)))
                and value[:n] == before
            ):
                if len(value) > n:
                    out.append(((*path, key), "x", value[n:]))
                continue
        elif kind is dict and type(before) is dict:
            if not _diff((*path, key), value, given if type(given) is dict else None, before, out):
                return False
            continue
        out.append(((*path, key), "s", value))
    if len(new) < len(old) or any(key not in new for key in old):
        out.extend(((*path, key), "d", None) for key in old if key not in new)
    return True


# The private state is never changed in place (a racing save of the same handle may be
# reading it): each change copies the dicts on its path, and a list it extends.
def _with(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    top = dict(state)
    node = top
    for key in path[:-1]:
        child = dict(node[key])
        node[key] = child
        node = child
    node[path[-1]] = value
    return top


def _extended(state: dict[str, Any], path: tuple[str, ...], items: list[Any]) -> dict[str, Any]:
    return _with(state, path, [*_at(state, path), *items])


def _without(state: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    top = dict(state)
    node = top
    for key in path[:-1]:
        child = dict(node[key])
        node[key] = child
        node = child
    del node[path[-1]]
    return top


# The handed state is the caller's: its dicts on a changed path are copied (the step's
# own objects are not changed under it), the changed values are fresh copies.
def _set_in(state: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = state
    for key in path[:-1]:
        child = dict(node[key])
        node[key] = child
        node = child
    node[path[-1]] = value


def _extend_in(state: dict[str, Any], path: tuple[str, ...], items: list[Any], keep: int) -> None:
    """Replace the list at ``path`` by its first ``keep`` items (the stored ones), then
    ``items`` (fresh copies of the step's new ones)."""
    node = state
    for key in path[:-1]:
        child = dict(node[key])
        node[key] = child
        node = child
    node[path[-1]] = [*islice(node[path[-1]], keep), *items]


def _at(state: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = state
    for key in path:
        node = node[key]
    return node


def _del_in(state: dict[str, Any], path: tuple[str, ...]) -> None:
    node = state
    for key in path[:-1]:
        child = dict(node[key])
        node[key] = child
        node = child
    node.pop(path[-1], None)


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
