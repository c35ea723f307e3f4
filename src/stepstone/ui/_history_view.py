"""The run page's history: the kept saves, a diff between two, and rerun or fork from one.

Read through ``stepstone._history`` (the same records ``stepstone runs history`` shows);
``rerun`` and ``fork`` are its operations, driven with every load of the run checked
against the version the page showed (as ``_actions`` does for cancel and signal), so an
operator never rewinds or forks a run they have not seen.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

from .. import _history
from .._checkpoint import Checkpoint
from .._effects import step_through
from .._errors import ConflictError, RunOwned
from .._history import _current, _fork, _perform, _records, _rerun, _state_of
from .._lease import dead_here
from .._store import Store
from . import _views
from ._actions import RunChanged, changed, pinned

__all__ = [
    "MAX_ROWS",
    "DiffRow",
    "HistoryView",
    "SaveRow",
    "diff",
    "fork",
    "kept",
    "rerun",
    "view",
]

#: The newest saves the page lists; older ones are counted, not shown.
MAX_ROWS = 200
#: Top-level keys a diff shows at most.
MAX_DIFF_KEYS = 200


@dataclass(frozen=True, slots=True)
class SaveRow:
    """One kept save, as the history table shows it."""

    index: int
    step: int
    step_name: str
    attempt: int
    at: str
    status: str
    size: int
    changes: str
    #: For a save that recorded a failure: which step failed, and its error if known.
    failure: str
    #: Whether rerun and fork from this save's step start from this save (the newest
    #: kept save of each step is the one they use), and rerun may start after it.
    fork_here: bool
    rerun_here: bool


@dataclass(frozen=True, slots=True)
class HistoryView:
    """A run's history for its page: rows newest first, and what the actions offer."""

    rows: list[SaveRow]
    total: int
    #: Completed steps a fork may start after: ``(index, name)``, -1 is the input.
    fork_steps: list[tuple[int, str]]
    #: Steps a rerun may start from: ``(index, name)``.
    rerun_steps: list[tuple[int, str]]
    #: The longest list of step names any save recorded (names steps not reached now).
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DiffRow:
    """One top-level key that differs between two saves."""

    key: str
    #: ``added``, ``removed`` or ``changed``.
    kind: str
    text: str


def kept(store: Store, cp: Checkpoint) -> bool:
    """Whether the run keeps its history in this store."""
    return cp.history and type(store).holds_pieces


def _name(names: tuple[str, ...], index: int) -> str:
    return names[index] if 0 <= index < len(names) else ""


def view(store: Store, cp: Checkpoint) -> HistoryView:
    """Return the run's kept saves for its page.

    Raises:
        StoreError: the store failed or a record is corrupt.
        HistoryNotKept, RunNotFound: as ``stepstone.history``.
    """
    entries = _history.history(store, cp.run_id)
    names: tuple[str, ...] = max((e.step_names for e in entries), key=len, default=())
    if len(cp.step_names) >= len(names):
        names = cp.step_names
    failure = cp.failure
    if failure is not None and failure.step_index == len(names):
        names = (*names, failure.step_name)
    newest = {e.step: i for i, e in enumerate(entries)}
    rows = []
    for index, entry in enumerate(entries):
        failed = ""
        if entry.status == "failed":
            failed = f"step {entry.step + 1}"
            if failure is not None and failure.step_index == entry.step + 1:
                failed = (
                    f"step {failure.step_index} ({failure.step_name}) failed on attempt "
                    f"{failure.attempt}: {failure.error_type}: {failure.message}"
                )
        rows.append(
            SaveRow(
                index=index,
                step=entry.step,
                step_name=_name(entry.step_names, entry.step),
                attempt=entry.attempt,
                at=_views.when(entry.at),
                status=entry.status,
                size=entry.size,
                # ``*``: the save wrote the whole state (a diff shows what differs).
                changes="whole state"
                if entry.changes == ("*",)
                else ", ".join(entry.changes) or "nothing",
                failure=failed,
                fork_here=newest[entry.step] == index,
                rerun_here=newest[entry.step] == index and entry.step <= cp.step,
            )
        )
    kept_steps = sorted({e.step for e in entries if e.step >= 0})
    fork_steps = [(-1, "the input")] + [(s, _name(names, s)) for s in kept_steps]
    rerun_steps = [(s + 1, _name(names, s + 1)) for s in [-1, *kept_steps] if s + 1 <= cp.step + 1]
    rows.reverse()
    return HistoryView(rows[:MAX_ROWS], len(rows), fork_steps, rerun_steps, names)


def _two_states(store: Store, run_id: str, a: int, b: int) -> _history.Op:
    cp = yield from _current(store, run_id)
    records = yield from _records(store, run_id, cp)
    if not (0 <= a < len(records) and 0 <= b < len(records)):
        raise ValueError(
            f"run {run_id!r} has {len(records)} kept saves, numbered 0 to "
            f"{len(records) - 1}; there is no save {a if not 0 <= a < len(records) else b}"
        )
    before = yield from _state_of(store, run_id, *records[a])
    after = yield from _state_of(store, run_id, *records[b])
    return before, after


def _lines(value: Any) -> list[str]:
    return _views.pretty_json(value, limit=_views.MAX_TEXT_SHOWN).splitlines()


def diff(store: Store, run_id: str, a: int, b: int) -> list[DiffRow]:
    """Return how the state of save ``b`` differs from save ``a``, key by key.

    Raises:
        ValueError: no such save.
        StoreError, HistoryNotKept, RunNotFound: as ``stepstone.history``.
    """
    before, after = step_through(_two_states(store, run_id, a, b), _perform(store))
    rows: list[DiffRow] = []
    for key in sorted(before.keys() | after.keys()):
        if len(rows) >= MAX_DIFF_KEYS:
            rows.append(DiffRow("...", "changed", "more keys differ; not shown"))
            break
        if key not in before:
            rows.append(DiffRow(key, "added", "\n".join(_lines(after[key]))))
        elif key not in after:
            rows.append(DiffRow(key, "removed", "\n".join(_lines(before[key]))))
        elif before[key] != after[key]:
            lines = difflib.unified_diff(_lines(before[key]), _lines(after[key]), lineterm="", n=2)
            rows.append(DiffRow(key, "changed", "\n".join(list(lines)[2:])))
    return rows


def parse_patch(text: str) -> dict[str, Any] | None:
    """Return the state patch typed on the page (a JSON object), or None if empty.

    Raises:
        ValueError: not a JSON object (the message says what is allowed).
    """
    if not text.strip():
        return None
    try:
        patch = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(
            f'the state patch is not JSON ({exc}); e.g. {{"amount": 40}}, or leave it empty'
        ) from None
    if type(patch) is not dict:
        raise ValueError(
            'the state patch is a JSON object of top-level keys to set, e.g. {"amount": 40}'
        )
    return patch


def rerun(store: Store, run_id: str, version: str, from_step: int | str, patch_text: str) -> str:
    """Rewind the run to before ``from_step`` (``stepstone.rerun``), if still at ``version``.

    Raises:
        ValueError: a malformed patch, or an owner not known dead runs it.
        RunChanged: the run is not at ``version`` any more.
        StepNotKept, HistoryNotKept, RunNotFound: as ``stepstone.rerun``.
    """
    patch = parse_patch(patch_text)
    cp = store.load(run_id)
    if cp is None or cp.version != version:
        raise changed(run_id)
    if cp.status == "running" and cp.owner is not None and not dead_here(cp.owner):
        # ``stepstone.rerun`` would watch the owner for a whole lease: a page does not
        # hold a request that long, and an owner that is alive must stop first anyway.
        raise ValueError(
            f"run {run_id!r} is running (owner {cp.owner}): cancel it first (it stops at "
            "its next step boundary) and rerun it then; `stepstone runs rerun` waits out "
            "the lease of an owner that died elsewhere"
        )
    op = _rerun(store, run_id, from_step, None, patch, None)
    try:
        step_through(op, pinned(_perform(store), run_id, version))
    except RunOwned as exc:
        raise ValueError(str(exc)) from None
    except ConflictError as exc:
        if isinstance(exc, RunChanged):
            raise
        raise RunChanged(str(exc), run_id) from exc
    where = f"call {from_step}" if isinstance(from_step, str) else f"step {from_step}"
    return f"rewound the run to run again from {where}"


def fork(store: Store, run_id: str, version: str, at_step: int | str, new_run_id: str) -> str:
    """Start ``new_run_id`` from the state after ``at_step`` (``stepstone.fork``), if the
    run is still at ``version``.

    Raises:
        ValueError: ``new_run_id`` exists.
        RunChanged: the run is not at ``version`` any more.
        StepNotKept, HistoryNotKept, RunNotFound, InvalidRunId: as ``stepstone.fork``.
    """
    op = _fork(store, run_id, at_step, new_run_id)
    try:
        step_through(op, pinned(_perform(store), run_id, version))
    except ConflictError as exc:
        if isinstance(exc, RunChanged):
            raise
        raise ValueError(str(exc)) from None
    return f"forked into run {new_run_id!r}"
