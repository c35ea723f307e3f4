"""Small pieces every built-in backend shares."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["Unanswered", "new_version", "version_token"]

# Not ``secrets``: a token only has to differ from the tokens a run had before it was
# deleted, not be unguessable, and a system call per save costs more than the rest of
# the token. ``random`` reseeds itself in a forked child, so forks never share tokens.
_randbits = random.getrandbits


def new_version(previous: str | None) -> str:
    """Return a fresh version token: a save counter, for people, plus randomness.

    The random part makes a token unique even when a run is deleted and created again,
    so a worker holding a token from before the delete can never match the new run.
    """
    count = 1
    if previous is not None:
        head = previous.partition(".")[0]
        if head.isdigit():
            count = int(head) + 1
    # %-formatting, not an f-string with a format spec: the same text, ~800 fewer
    # instructions on every save.
    return "%d.%012x" % (count, _randbits(48))  # noqa: UP031


def version_token() -> str:
    """Return the random part of a version token (``new_version``), for a store that
    counts in the database: one per claim statement, unique within each run's history."""
    return f"{_randbits(48):012x}"


class Unanswered:
    """Saves whose outcome is unknown, by run: what each one wrote, for its retry.

    A save whose write may have landed though its answer was lost (a read timeout, a
    connection dropped after COMMIT, a hook's error after the write, a cancellation)
    keeps its plan here: its new version token, the record and its pieces. When the
    caller retries the same save (the same ``Checkpoint`` object: compared by identity,
    so a different save never reuses a token, even an equal one) the store writes that
    same plan again; if the compare-and-swap then misses and the stored version is the
    plan's, the first write landed, and the retry is that write's success rather than a
    conflict with itself. Version tokens are random (``new_version``): nobody else
    writes one. The success path pays one test of an empty dict.

    Bounded: past ``LIMIT`` runs the oldest is forgotten (its retry then conflicts, as
    before); a plan holds its record and pieces until retried or forgotten, so the bound
    is small. Thread-safe: single dict operations, atomic under the GIL.
    """

    __slots__ = ("_held",)

    #: Saves kept at most (one per run).
    LIMIT = 256

    def __init__(self) -> None:
        self._held: dict[str, tuple[object, Any]] = {}

    def take(self, checkpoint: object, run_id: str) -> Any:
        """Return (and forget) the plan kept for this very ``checkpoint``, else None."""
        held = self._held
        if not held:
            return None
        try:
            entry = held.get(run_id)
        except TypeError:  # not a str: the save's own check says what is wrong
            return None
        if entry is None or entry[0] is not checkpoint:
            return None
        held.pop(run_id, None)
        return entry[1]

    def keep(self, checkpoint: object, run_id: str, plan: Any) -> None:
        """Keep ``plan`` for a retry of ``checkpoint`` (its write's outcome is unknown)."""
        held = self._held
        held.pop(run_id, None)
        while len(held) >= self.LIMIT:
            try:
                held.pop(next(iter(held)))
            except (StopIteration, KeyError, RuntimeError):  # emptied by another thread
                break
        held[run_id] = (checkpoint, plan)
