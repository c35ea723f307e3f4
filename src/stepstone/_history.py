"""A run's kept saves: ``history``, and starting again from one of them (``fork``, ``rerun``).

A run started from ``Workflow(..., history=True)`` keeps every save. Each save writes,
beside its checkpoint and before the compare-and-swap that commits it, one immutable
*history record* (a piece, ``_statelog._recorded``): the step, attempt, time, status,
what changed, and the state, either inline or as the ``state_ref`` of that save (whose
pieces are then never collected). Records are chained newest to oldest by ``prev``;
the run's document names the newest. A save that loses its swap leaves a record
nobody names: it is never listed, since the chain starts at the committed document.

``fork`` writes a new run whose state is the one after a step; ``rerun`` rewinds a run
(typically a failed one) to before a step. Both are one compare-and-swap; what runs
next runs through the ordinary ``run``/worker path, so every guarantee stays. Written
once as effect generators (``_effects``) for the sync and the async API.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import _clock, _statelog
from ._acquire import watch_lease
from ._checkpoint import Checkpoint, Stored, check_run_id
from ._code_history import fork_at_call, rerun_from_call, save_fork, save_rewound
from ._codec import decode_json, encode_state
from ._effects import Announce, Effect, Load, Pause, Save, astep_through, step_through
from ._errors import (
    CorruptCheckpoint,
    HistoryNotKept,
    RunNotFound,
    StepNotKept,
)
from ._store import Store
from ._wake import aannounce, announce

__all__ = [
    "HistoryEntry",
    "afork",
    "ahistory",
    "arerun",
    "fork",
    "history",
    "rerun",
]

State = dict[str, Any]

#: The most records one ``history`` call follows: a chain longer than this is corrupt
#: (a loop), not long (a run with a million saves is refused with a clear error).
MAX_RECORDS = 1_000_000


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One kept save of a run, oldest first in ``history``.

    Attributes:
        step: Index of the last completed step at this save (-1: none yet).
        step_names: The names of the completed steps.
        attempt: Attempts begun on the next step.
        at: When the save was made (the saving process's clock).
        status: The run's status after this save.
        size: Bytes of the state at this save.
        changes: What this save changed: the top-level keys it set, extended or
            deleted (``["*"]``: the whole state was written).
        key: The record's key (opaque).
    """

    step: int
    step_names: tuple[str, ...]
    attempt: int
    at: datetime | None
    status: str
    size: int
    changes: tuple[str, ...]
    key: str


class _Pieces(Effect):
    """Fetch some of a run's pieces; the result is ``{key: bytes}`` (absent keys absent)."""

    __slots__ = ("keys", "run_id")

    def __init__(self, run_id: str, keys: list[str]) -> None:
        self.run_id = run_id
        self.keys = keys


class _Keys(Effect):
    """List a run's piece keys; the result is a sorted list."""

    __slots__ = ("run_id",)

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


Op = Generator[Effect, Any, Any]

#: How many history records one fetch asks for (records are small: a save's changes).
RECORD_BATCH = 256


def _perform(store: Store) -> Any:
    def perform(effect: Effect) -> Any:
        if isinstance(effect, _Pieces):
            return store.pieces(effect.run_id, effect.keys)
        if isinstance(effect, _Keys):
            return store.piece_keys(effect.run_id)
        if isinstance(effect, Save):
            return store.save(effect.cp)
        if isinstance(effect, Announce):
            return announce(store)
        if isinstance(effect, Pause):  # watching a lease (``watch_lease``): renews nothing
            _clock.sleep(effect.seconds)  # the clock the lease is counted on
            return None
        assert isinstance(effect, Load)
        return store.load(effect.run_id)

    return perform


def _aperform(store: Store) -> Any:
    async def perform(effect: Effect) -> Any:
        if isinstance(effect, _Pieces):
            return await store.apieces(effect.run_id, effect.keys)
        if isinstance(effect, _Keys):
            return await store.apiece_keys(effect.run_id)
        if isinstance(effect, Save):
            return await store.asave(effect.cp)
        if isinstance(effect, Announce):
            return await aannounce(store)
        if isinstance(effect, Pause):
            await _clock.asleep(effect.seconds)
            return None
        assert isinstance(effect, Load)
        return await store.aload(effect.run_id)

    return perform


# --- reading ----------------------------------------------------------------------------


def _source(store: Store, run_id: str) -> str:
    return f"{type(store).__name__} run {run_id!r} history"


def _current(store: Store, run_id: str) -> Generator[Effect, Any, Checkpoint]:
    check_run_id(run_id)
    cp: Checkpoint | None = yield Load(run_id)
    if cp is None:
        raise RunNotFound(f"run {run_id!r} does not exist; it has no history", run_id)
    if not cp.history:
        raise HistoryNotKept(
            f"run {run_id!r} keeps no history: start it from Workflow(..., history=True) "
            "to keep every save (a run keeps only its latest checkpoint otherwise)",
            run_id,
        )
    if not type(store).holds_pieces:
        raise HistoryNotKept(
            f"run {run_id!r}: {type(store).__name__} keeps no history (it holds no "
            "pieces); use one of the built-in stores",
            run_id,
        )
    return cp


def _records(store: Store, run_id: str, cp: Checkpoint) -> Op:
    """The run's history records, oldest first: ``[(key, record dict), ...]``."""
    handle = cp.stored_state
    key = handle.history if isinstance(handle, Stored) else None
    source = _source(store, run_id)
    found: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    # Every record at once, in batches (a round trip each, not one per record); the
    # chain is then walked in memory. A record the listing missed is fetched alone.
    fetched: dict[str, bytes] = {}
    if key is not None:
        listed: list[str] = yield _Keys(run_id)
        records = [k for k in listed if ".h." in k]
        for start in range(0, len(records), RECORD_BATCH):
            part: dict[str, bytes] = yield _Pieces(run_id, records[start : start + RECORD_BATCH])
            fetched.update(part)
    while key is not None:
        if key in seen or len(found) >= MAX_RECORDS:
            raise CorruptCheckpoint(f"{source}: the records loop at {key!r}; left untouched")
        seen.add(key)
        got: dict[str, bytes] = fetched if key in fetched else (yield _Pieces(run_id, [key]))
        if key not in got:
            raise CorruptCheckpoint(f"{source}: record {key!r} is not stored; left untouched")
        try:
            record = decode_json(got[key])
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpoint(f"{source}: record {key!r} is not JSON ({exc})") from exc
        if type(record) is not dict:
            raise CorruptCheckpoint(f"{source}: record {key!r} is not an object")
        found.append((key, record))
        prev = record.get("prev")
        if prev is not None and not isinstance(prev, str):
            raise CorruptCheckpoint(f"{source}: record {key!r} has a malformed prev")
        key = prev
    found.reverse()
    return found


#: A log operation's letter (``_statelog``), as ``history`` shows it.
_OPS = {"s": "set", "x": "append to", "d": "delete"}


def _said(change: str) -> str:
    op, _, path = change.partition(" ")
    return f"{_OPS.get(op, op)} {path}"


def _entry(key: str, record: dict[str, Any], source: str) -> HistoryEntry:
    try:
        at = record.get("at")
        changes = record.get("changes")
        return HistoryEntry(
            step=int(record["step"]),
            step_names=tuple(str(n) for n in record["step_names"]),
            attempt=int(record.get("attempt", 0)),
            at=datetime.fromisoformat(at) if isinstance(at, str) else None,
            status=str(record.get("status", "")),
            size=int(record.get("bytes", 0)),
            changes=tuple(_said(str(c)) for c in changes) if isinstance(changes, list) else ("*",),
            key=key,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpoint(f"{source}: record {key!r} is malformed ({exc})") from exc


def _history(store: Store, run_id: str) -> Op:
    cp = yield from _current(store, run_id)
    records = yield from _records(store, run_id, cp)
    source = _source(store, run_id)
    return [_entry(key, record, source) for key, record in records]


def _state_of(store: Store, run_id: str, key: str, record: dict[str, Any]) -> Op:
    """The state a record saved: inline in it, or rebuilt from the pieces it names."""
    source = _source(store, run_id)
    if "state" in record:
        state = record["state"]
        if type(state) is not dict:
            raise CorruptCheckpoint(f"{source}: record {key!r} holds no state object")
        return state
    ref = record.get("ref")
    if type(ref) is not dict:
        raise CorruptCheckpoint(f"{source}: record {key!r} names no state")
    try:
        keys = _statelog.pieces_of(ref)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpoint(f"{source}: record {key!r} has a malformed ref") from exc
    pieces: dict[str, bytes] = yield _Pieces(run_id, keys)
    try:
        state, _ = _statelog.assemble(store, run_id, None, ref, pieces, source)
    except _statelog.PiecesMissing as missing:
        raise _statelog.missing_error(source, missing) from None
    return state


def _after(store: Store, run_id: str, cp: Checkpoint, at_step: int) -> Op:
    """The state after step ``at_step`` (its last kept save), or the input before step 0."""
    if not isinstance(at_step, int) or isinstance(at_step, bool) or at_step < -1:
        raise StepNotKept(f"a step index is an int of -1 or more, got {at_step!r}", run_id, at_step)
    if at_step == -1:
        return dict(cp.input or {}), ()
    records = yield from _records(store, run_id, cp)
    source = _source(store, run_id)
    for key, record in reversed(records):
        entry = _entry(key, record, source)
        if entry.step == at_step:
            state = yield from _state_of(store, run_id, key, record)
            return state, entry.step_names
    kept = sorted({_entry(k, r, source).step for k, r in records})
    raise StepNotKept(
        f"run {run_id!r} has no kept save after step {at_step}; its history has steps "
        f"{kept} (-1: before the first step)",
        run_id,
        at_step,
    )


# --- fork and rerun ---------------------------------------------------------------------


def _fork(store: Store, run_id: str, at_step: int | str, new_run_id: str) -> Op:
    if isinstance(at_step, str):
        return (yield from fork_at_call(run_id, at_step, new_run_id))
    check_run_id(new_run_id)
    cp = yield from _current(store, run_id)
    state, names = yield from _after(store, run_id, cp, at_step)
    return (yield from save_fork(cp, new_run_id, at_step, encode_state(state)[1], names, True))


#: What ``RunOwned`` tells a ``rerun`` of a run whose owner is alive.
_RERUN_ADVICE = (
    "rerun it once it has stopped: wait for it to finish or fail, or cancel it with "
    "stepstone.cancel (the owner stops at its next step boundary) and rerun then"
)


def _rerun(
    store: Store,
    run_id: str,
    from_step: int | str,
    state: State | None,
    patch: Mapping[str, Any] | None,
    input: State | None,
) -> Op:
    if isinstance(from_step, str):
        if state is not None or patch is not None or input is not None:
            raise StepNotKept(
                "rerun from a journaled call takes no state=, patch= or input=: the "
                "function's calls make the state",
                run_id,
                from_step,
            )
        return (yield from rerun_from_call(run_id, from_step))
    if state is not None and patch is not None:
        raise StepNotKept("rerun takes state= or patch=, not both", run_id, from_step)
    if input is not None and from_step != 0:
        raise StepNotKept(
            "rerun replaces the input only from step 0 (input=..., from_step=0)",
            run_id,
            from_step,
        )
    cp = yield from _current(store, run_id)
    if not isinstance(from_step, int) or isinstance(from_step, bool) or from_step < 0:
        raise StepNotKept(
            f"from_step is a step index of 0 or more, got {from_step!r}", run_id, from_step
        )
    if from_step > cp.step + 1:
        raise StepNotKept(
            f"run {run_id!r} completed steps up to {cp.step}; rerun from step {from_step} "
            f"would skip a step that never ran (allowed: 0 to {cp.step + 1})",
            run_id,
            from_step,
        )
    if cp.owner is not None and cp.status == "running":
        # Only a live lease blocks: an owner that wrote nothing for a whole lease (by our
        # clock), or is known dead on this machine, is taken over, as ``run`` does. The
        # rewind's compare-and-swap then fences it: its next write conflicts.
        cp = yield from watch_lease(run_id, cp, _RERUN_ADVICE)
    if input is not None:
        before: State = encode_state(input)[1]
        names: tuple[str, ...] = ()
    else:
        before, names = yield from _after(store, run_id, cp, from_step - 1)
    if state is not None:
        before = state
    elif patch is not None:
        before = {**before, **patch}
    given = encode_state(input)[1] if input is not None else cp.input
    return (yield from save_rewound(cp, from_step - 1, names, encode_state(before)[1], given))


# --- the public API ---------------------------------------------------------------------


def history(store: Store, run_id: str) -> list[HistoryEntry]:
    """Every kept save of ``run_id``, oldest first.

    Raises:
        RunNotFound: no such run.
        HistoryNotKept: the run was not started with ``Workflow(history=True)``, or the
            store keeps no pieces (Cosmos DB).
    """
    result: list[HistoryEntry] = step_through(_history(store, run_id), _perform(store))
    return result


async def ahistory(store: Store, run_id: str) -> list[HistoryEntry]:
    """Async ``history``."""
    result: list[HistoryEntry] = await astep_through(_history(store, run_id), _aperform(store))
    return result


def fork(store: Store, run_id: str, at_step: int | str, new_run_id: str) -> Checkpoint:
    """Start ``new_run_id`` from the state ``run_id`` had after step ``at_step``.

    For a code workflow's run, ``at_step`` may name a journaled call (``"revise#2"``):
    the new run's journal holds the calls up to and including it, and its function
    runs the later ones (``_code_history``; no ``history=True`` needed).

    The new run has the same workflow, input and completed steps up to ``at_step``; it
    continues at step ``at_step + 1``: queued for the workers if the run came from a
    served ``Workflow``, else resumed by ``run(store, steps, new_run_id)``. ``at_step``
    -1 starts it from the input. The original run is not touched.

    Raises:
        ConflictError: ``new_run_id`` exists.
        StepNotKept: no kept save after ``at_step``.
        HistoryNotKept, RunNotFound: as ``history``.
    """
    result: Checkpoint = step_through(_fork(store, run_id, at_step, new_run_id), _perform(store))
    return result


async def afork(store: Store, run_id: str, at_step: int | str, new_run_id: str) -> Checkpoint:
    """Async ``fork``."""
    result: Checkpoint = await astep_through(
        _fork(store, run_id, at_step, new_run_id), _aperform(store)
    )
    return result


def rerun(
    store: Store,
    run_id: str,
    from_step: int | str,
    *,
    state: State | None = None,
    patch: Mapping[str, Any] | None = None,
    input: State | None = None,
) -> Checkpoint:
    """Rewind ``run_id`` to before step ``from_step``, to run it again from there.

    For a code workflow's run, ``from_step`` may name a journaled call (``"revise#3"``):
    the journal is cut before it, so that call and every later one run again (no
    ``history=True`` needed; ``state``, ``patch`` and ``input`` are refused).

    The run's state becomes the one it had after step ``from_step - 1`` (its input for
    0), replaced by ``state`` or updated with ``patch`` if given; ``input`` replaces the
    input (``from_step`` 0 only). Its failure and attempts are cleared; a cancelled or
    finished run becomes runnable again. Signals already received stay, and so do the
    counts of those consumed. One compare-and-swap: a run that changes meanwhile is left
    as it is (``ConflictError``).

    A run whose owner holds a lease is watched for up to that lease: an owner that
    writes nothing meanwhile (a dead one) is taken over, as ``run`` does; one known dead
    on this machine at once.

    Raises:
        RunOwned: a live owner is running it (it renewed its lease while watched).
        StepNotKept: ``from_step`` out of range, or no kept save before it.
        HistoryNotKept, RunNotFound: as ``history``.
    """
    result: Checkpoint = step_through(
        _rerun(store, run_id, from_step, state, patch, input), _perform(store)
    )
    return result


async def arerun(
    store: Store,
    run_id: str,
    from_step: int | str,
    *,
    state: State | None = None,
    patch: Mapping[str, Any] | None = None,
    input: State | None = None,
) -> Checkpoint:
    """Async ``rerun``."""
    result: Checkpoint = await astep_through(
        _rerun(store, run_id, from_step, state, patch, input), _aperform(store)
    )
    return result
