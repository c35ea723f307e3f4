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
``log_limit(base)`` pieces: ``LOG_MAX``, more for a base over 128 KiB), the next save
writes a new base instead: a growing state is rewritten a bounded number of times in
all (its bases grow geometrically), and a load reads at most about ``LOG_FACTOR + 1``
times the state, never the run's history.

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
as the one handed out *and* the same JSON as the private copy is unchanged (Python's
equality, in C, catches changes made in place; ``_statediff._same_json`` then checks
the types of the numbers, since ``1 == True``); a list whose head is the
list handed out, unchanged, gained only its tail; anything else is re-encoded
(validated as strictly as a whole state, at its depth in the state).
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ._checkpoint import Checkpoint, Stored, utcnow
from ._codec import MAX_DEPTH, REF_KEY, PiecesNeeded, dump_json, encode_state
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
from ._statediff import (
    Numbers,
    _at,
    _carry,
    _containers,
    _del_in,
    _diff,
    _extend_in,
    _set_in,
    _with,
    _without,
)
from ._statejson import encode_state_as_written
from ._statepieces import (
    INLINE_MAX,
    LOG_CEILING,
    LOG_FACTOR,
    LOG_MAX,
    LOG_SHARE,
    PIECE_MAX,
    Piece,
    PiecesMissing,
    Prepared,
    log_limit,
    pieces_of,
    serial,
)
from ._stateread import assemble, checkpoint_with_pieces, missing_error

__all__ = [
    "INC_LEN",
    "INLINE_MAX",
    "LOG_FACTOR",
    "LOG_CEILING",
    "LOG_MAX",
    "LOG_SHARE",
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
    "log_limit",
    "new_inc",
    "observe",
    "pieces_of",
    "prepare_save",
    "serial",
]


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
    prepared = _plan(store, cp, piece_max, cp.history, max_base_age)
    if cp.history:
        prepared = _recorded(prepared, cp, _handle(cp))
    for observe in _observers:
        observe(prepared)
    return prepared


#: Who is told of every planned save (``stepstone.testing.StateMeter``); empty in
#: production, where the loop above costs one empty-tuple iteration.
_observers: tuple[Callable[[Prepared], None], ...] = ()


def observe(observer: Callable[[Prepared], None]) -> Callable[[], None]:
    """Call ``observer`` with every save's plan from now on; return what stops it."""
    global _observers  # noqa: PLW0603 - a process-wide test seam, as ``_hooks``
    _observers = (*_observers, observer)

    def stop() -> None:
        global _observers  # noqa: PLW0603 - see above
        _observers = tuple(o for o in _observers if o is not observer)

    return stop


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
    # A long state's pieces are the bytes orjson wrote, never made a str and encoded
    # back (issue 36: 6% of the LangGraph saver's instructions, whose records are ~100 KB
    # each); an inline state's text is decoded once, for the document.
    written, copy = encode_state_as_written(cp.state)
    text: str | None = None
    data: bytes | None = None
    if type(written) is str:
        text = written
        if len(text) > INLINE_MAX // 4:  # else at most INLINE_MAX bytes in UTF-8
            data = text.encode("utf-8")
    else:
        assert type(written) is bytes
        data = written
    # A stale or foreign handle still tells the generation it came from: a save above it
    # never collects a piece a newer document could name (see the module docstring).
    base_gen = handle.gen if handle is not None else 0
    had_pieces = handle is not None and handle.ref is not None
    if data is None or len(data) <= INLINE_MAX:
        if text is None:
            assert data is not None
            text = data.decode("utf-8")
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
    assert data is not None
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
    numbers: Numbers = {}  # what _same_json looked up this save, for the next
    if not _diff(
        (), new, known.handed, private, changed, known.numbers, numbers, known.append_only
    ):
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
            numbers=numbers,
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
            head = _at(next_private, path)
            longer = head + mine  # one C copy of the stored head
            next_private = _with(next_private, path, longer)
            _carry(numbers, head, longer, mine)
            _extend_in(next_state, path, inner, len(_at(private, path)))
        else:
            next_private = _with(next_private, path, mine)
            _set_in(next_state, path, inner)
    data = ("[" + ",".join(texts) + "]").encode("utf-8")
    log_bytes = ref["log_bytes"] + len(data)
    if (
        len(data) > piece_max
        or ref["log_count"] + 1 > log_limit(ref["base_bytes"])
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
        numbers=numbers,
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
