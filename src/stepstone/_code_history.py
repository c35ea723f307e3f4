"""A code workflow's run, call by call: ``journal``, and ``fork``/``rerun`` at a call.

A code workflow's run holds its journal in its state (``_journal``), so its calls are
listed from the run's record alone, and starting again at a call is cutting the
journal there: the function replays what is kept and runs the rest for real.

- ``fork(store, run_id, "revise#2", new_run_id)``: a new run whose journal holds the
  calls up to and including ``revise#2`` (by position in call order).
- ``rerun(store, run_id, "revise#3")``: the run rewound to before ``revise#3``; that
  call and every later one run again.

Neither needs ``history=True``: the journal is the run's own history. Both are one
compare-and-swap (``_history`` routes a call name here), then the ordinary
``run``/worker path runs what comes next.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._acquire import watch_lease
from ._checkpoint import Checkpoint, check_run_id, evolve
from ._effects import Announce, Effect, Load, Save, astep_through, step_through
from ._errors import ConflictError, InvalidWorkflow, RunNotFound, StepNotKept
from ._journal import ATTEMPTS_KEY, JOURNAL_KEY, RERUNS_KEY, journal_of, recorded_calls
from ._store import Store

__all__ = [
    "JournalEntry",
    "ajournal",
    "entries_of",
    "fork_at_call",
    "journal",
    "rerun_from_call",
    "save_fork",
    "save_rewound",
]

State = dict[str, Any]
Op = Generator[Effect, Any, Any]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journaled call of a code workflow's run, in call order in ``journal``.

    Attributes:
        seq: The call's position in the function's call order (0 first).
        call: Its journal name, the name numbered per name (``"revise#2"``).
        name: The name the function gave (``"revise"``; ``"@wait:approve"`` for a wait).
        ordinal: Which call of that name it is (2 for ``revise#2``).
        attempt: Attempts it took.
        at: When it ended (None in entries written before times were recorded).
        size: Bytes of the entry as JSON (its result, mostly).
        error_type: The failure's type for a call that failed for good, else None.
    """

    seq: int
    call: str
    name: str
    ordinal: int
    attempt: int
    at: datetime | None
    size: int
    error_type: str | None


def _entry(raw: dict[str, Any]) -> JournalEntry:
    call = raw["call"]
    name, _, ordinal = call.rpartition("#")
    at = raw.get("at")
    error = raw.get("error")
    return JournalEntry(
        seq=raw["seq"],
        call=call,
        name=name or call,
        ordinal=int(ordinal) if ordinal.isdigit() else 0,
        attempt=int(raw.get("attempt", 1)),
        at=datetime.fromisoformat(at) if isinstance(at, str) else None,
        size=len(json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode()),
        error_type=str(error.get("type", "Exception")) if isinstance(error, dict) else None,
    )


def entries_of(run_id: str, state: State) -> list[JournalEntry]:
    """Return the journal held in ``state``, in call order (empty if it holds none).

    Raises:
        InvalidWorkflow: the state's journal is malformed.
    """
    return [_entry(raw) for _, raw in sorted(recorded_calls(run_id, journal_of(state)).items())]


def _load(run_id: str) -> Generator[Effect, Any, Checkpoint]:
    check_run_id(run_id)
    cp: Checkpoint | None = yield Load(run_id)
    if cp is None:
        raise RunNotFound(f"run {run_id!r} does not exist; it has no journal", run_id)
    return cp


def _journal(run_id: str) -> Op:
    cp = yield from _load(run_id)
    return entries_of(run_id, cp.state)


def _cut(cp: Checkpoint, call: object, keep_it: bool) -> tuple[State, int, tuple[str, ...]]:
    """Return ``cp``'s state with its journal cut at ``call`` (kept or not), and the step
    the run is at then (with the names of the steps before), or refuse."""
    try:
        recorded = recorded_calls(cp.run_id, journal_of(cp.state))
    except InvalidWorkflow as exc:
        raise StepNotKept(f"{exc}; nothing was changed", cp.run_id, call) from None
    found = [seq for seq, entry in recorded.items() if entry["call"] == call]
    if not found:
        calls = [recorded[seq]["call"] for seq in sorted(recorded)]
        shown = ", ".join(calls[:20]) + (f" and {len(calls) - 20} more" if len(calls) > 20 else "")
        raise StepNotKept(
            f"run {cp.run_id!r} has no journaled call {call!r}; its journal holds "
            f"{shown or 'no call'} (a call is named NAME#N, N counting calls of that name "
            "from 1)",
            cp.run_id,
            call,
        )
    entry = recorded[found[0]]
    state = dict(cp.state)
    state.pop(ATTEMPTS_KEY, None)  # counted for calls that will run again, afresh
    if not keep_it:
        # A ctx.map at or after the cut runs again with new children (``_code._map``).
        reruns = cp.state.get(RERUNS_KEY)
        state[RERUNS_KEY] = (reruns if type(reruns) is int else 0) + 1
    journal = journal_of(cp.state)
    if isinstance(entry.get("step"), str):
        # An agent step's unit (``adapters._journaled``): its entries were saved one at
        # a time, so the journal is cut where this one was saved, and the run goes back
        # to before that step if it had completed it (later steps run again too).
        at = journal.index(entry) + (1 if keep_it else 0)
        state[JOURNAL_KEY] = journal[:at]
        names = cp.step_names
        if entry["step"] in names:
            names = names[: names.index(entry["step"])]
        return state, len(names) - 1, names
    limit = found[0] + 1 if keep_it else found[0]
    state[JOURNAL_KEY] = [e for e in journal if e["seq"] < limit]
    # A finished run's return value is the function's, which runs again.
    given = cp.input if isinstance(cp.input, dict) else {}
    if "result" in given:
        state["result"] = given["result"]
    else:
        state.pop("result", None)
    return state, -1, ()


def fork_at_call(run_id: str, call: str, new_run_id: str) -> Op:
    """``fork`` at a journaled call, as effects (``_history.fork`` runs them)."""
    check_run_id(new_run_id)
    cp = yield from _load(run_id)
    state, step, names = _cut(cp, call, keep_it=True)
    return (yield from save_fork(cp, new_run_id, step, state, names, cp.history))


def save_fork(
    cp: Checkpoint, new_run_id: str, step: int, state: State, names: tuple[str, ...], history: bool
) -> Generator[Effect, Any, Checkpoint]:
    """Save ``cp``'s fork as the new run ``new_run_id`` at ``step``; announce it if queued.

    Shared by a step list's fork (``_history``) and a call's. A run of a served workflow
    is queued for the workers; one of a plain step list waits for ``run`` with the same
    steps, which resumes it after ``step``.
    """
    fresh = Checkpoint(
        run_id=new_run_id,
        step=step,
        state=state,
        step_names=names,
        total_steps=cp.total_steps,
        input=cp.input,
        workflow=cp.workflow,
        workflow_version=cp.workflow_version,
        queued=cp.workflow is not None,
        history=history,
    )
    refused = f"run {new_run_id!r} already exists; fork into a new run_id"
    return (yield from _landed(fresh, "fork", refused))


#: What ``RunOwned`` tells a ``rerun`` of a run whose owner is alive.
_ADVICE = (
    "rerun it once it has stopped: wait for it to finish or fail, or cancel it with "
    "stepstone.cancel (the owner stops at its next journaled call) and rerun then"
)


def rerun_from_call(run_id: str, call: str) -> Op:
    """``rerun`` from a journaled call, as effects (``_history.rerun`` runs them)."""
    cp = yield from _load(run_id)
    if cp.owner is not None and cp.status == "running":
        # As ``rerun`` at a step: a live lease refuses, a dead owner is taken over, and
        # the rewind's compare-and-swap fences it.
        cp = yield from watch_lease(run_id, cp, _ADVICE)
    state, step, names = _cut(cp, call, keep_it=False)
    return (yield from save_rewound(cp, step, names, state, cp.input))


def _perform(store: Store) -> Any:
    def perform(effect: Effect) -> Any:
        assert isinstance(effect, Load)
        return store.load(effect.run_id)

    return perform


def _aperform(store: Store) -> Any:
    async def perform(effect: Effect) -> Any:
        assert isinstance(effect, Load)
        return await store.aload(effect.run_id)

    return perform


def journal(store: Store, run_id: str) -> list[JournalEntry]:
    """Return the journaled calls of code workflow run ``run_id``, in call order.

    A call in flight or not made yet is not listed; a run of a step list has none.

    Raises:
        RunNotFound: no such run.
        InvalidWorkflow: the run's journal is malformed.
    """
    result: list[JournalEntry] = step_through(_journal(run_id), _perform(store))
    return result


async def ajournal(store: Store, run_id: str) -> list[JournalEntry]:
    """Async ``journal``."""
    result: list[JournalEntry] = await astep_through(_journal(run_id), _aperform(store))
    return result


def save_rewound(
    cp: Checkpoint, step: int, names: tuple[str, ...], state: State, input: State | None
) -> Generator[Effect, Any, Checkpoint]:
    """Rewind ``cp`` to after ``step`` (with ``state`` and ``input``) for ``rerun``.

    The run starts afresh from there: no attempts, failure, cancellation, wait or
    children; queued if a worker serves its workflow. Saved by compare-and-swap on the
    version it was read at, and announced if queued. Shared by a step list's rerun
    (``_history``) and a call's.
    """
    rewound = evolve(
        cp,
        step=step,
        step_names=names,
        state=state,
        attempt=0,
        failure=None,
        cancelled=False,
        cancel_requested=False,
        waiting_for=None,
        wake_at=None,
        children=(),
        queued=cp.workflow is not None,
        input=input,
    )
    refused = (
        f"run {cp.run_id!r} changed while it was being rewound; nothing was changed, try again"
    )
    return (yield from _landed(rewound, "rerun", refused))


def _landed(cp: Checkpoint, what: str, refused: str) -> Generator[Effect, Any, Checkpoint]:
    """Save ``cp`` (compare-and-swap, not a save of the run's owner); announce it if queued.

    Raises:
        ConflictError: ``refused``, when the compare-and-swap missed.
    """
    try:
        saved: Checkpoint = yield Save(cp, what, owned=False)
    except ConflictError:
        raise ConflictError(refused, cp.run_id) from None
    if saved.queued:
        yield Announce()
    return saved
