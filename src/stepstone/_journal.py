"""The journal of a code workflow's run: its answered calls, kept in the run's state.

A list under ``JOURNAL_KEY``, one entry per answered call, in the order the answers
were saved (parallel calls complete in any order)::

    {"seq": 3, "call": "revise#2", "attempt": 1, "at": "2026-...", "result": {...}}
    {"seq": 4, "call": "charge#1", "attempt": 3, "at": "...", "error": {"type": ...}}

``seq`` is the call's position in the function's call order (fixed when the call is
made), ``call`` its name numbered per name (``revise#1``, ``revise#2``), ``attempt``
how many attempts it took, ``at`` when it ended (ISO 8601, UTC; entries written before
it was recorded have none). Entries are only ever appended, never changed: so a save
of a long state stores the new entry alone (an ``x`` op of ``_statelog``).
"""

from __future__ import annotations

from typing import Any

from ._checkpoint import utcnow
from ._codec import encode_state
from ._errors import InvalidState, InvalidWorkflow

__all__ = [
    "ATTEMPTS_KEY",
    "JOURNAL_KEY",
    "RERUNS_KEY",
    "answer_of",
    "entry_failed",
    "entry_ok",
    "journal_of",
    "json_value",
    "recorded_calls",
]

#: Where a code workflow's run keeps its journal in the state.
JOURNAL_KEY = "~journal"
#: Where it counts the attempts begun on calls with retries, not yet journaled.
ATTEMPTS_KEY = "~attempts"
#: How often the run was rerun from a call (``_code_history``): a ``ctx.map`` made after
#: a rerun names its children with it, so the rerun runs new children rather than
#: collecting the results of the ones the cut journal forgot.
RERUNS_KEY = "~reruns"


def journal_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the journal held in ``state`` (an empty list for a fresh run)."""
    journal = state.get(JOURNAL_KEY)
    if journal is None:
        return []
    if not isinstance(journal, list):
        raise InvalidWorkflow(
            f"the state's {JOURNAL_KEY!r} is a {type(journal).__name__}, not a code "
            "workflow's journal (a list); that key is reserved for it"
        )
    return journal


def recorded_calls(run_id: str, journal: list[Any]) -> dict[int, dict[str, Any]]:
    """Return the journal's entries by call position, or refuse a malformed one."""
    recorded: dict[int, dict[str, Any]] = {}
    for position, entry in enumerate(journal):
        if (
            not isinstance(entry, dict)
            or type(entry.get("seq")) is not int
            or not isinstance(entry.get("call"), str)
            or ("result" not in entry and not isinstance(entry.get("error"), dict))
        ):
            raise InvalidWorkflow(
                f"run {run_id!r}: journal entry {position} is not a journaled call "
                f"(seq, call, result or error): {entry!r:.200}"
            )
        recorded[entry["seq"]] = entry
    return recorded


def entry_ok(seq: int, call: str, attempt: int, value: Any) -> dict[str, Any]:
    """Return the entry of call ``seq`` that returned ``value`` (already JSON-checked)."""
    return {"seq": seq, "call": call, "attempt": attempt, "at": _now(), "result": value}


def entry_failed(
    seq: int, call: str, attempt: int, error_type: str, message: str
) -> dict[str, Any]:
    """Return the entry of call ``seq`` that failed for good."""
    return {
        "seq": seq,
        "call": call,
        "attempt": attempt,
        "at": _now(),
        "error": {"type": error_type, "message": message},
    }


def _now() -> str:
    return utcnow().isoformat()


def answer_of(entry: dict[str, Any]) -> Any:
    """Return the recorded result of a successful entry."""
    return entry["result"]


def json_value(value: Any, run_id: str, call: str, seq: int) -> Any:
    """Return a JSON copy of ``value``, or raise ``InvalidState`` naming the call and path."""
    try:
        return encode_state({"result": value})[1]["result"]
    except InvalidState as exc:
        path = "result" + exc.path.removeprefix("state['result']")
        where = f"call {seq} ({call!r})" if seq >= 0 else call
        run = f" of run {run_id!r}" if run_id else ""
        message = str(exc).split(": ", 1)[-1]
        raise InvalidState(
            f"{where}{run} returned a value that is not JSON at {path}: {message}; "
            "nothing was journaled",
            path,
        ) from None
