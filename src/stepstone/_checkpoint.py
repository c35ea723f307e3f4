"""The checkpoint: what a store keeps for one run, and how it is validated."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ._errors import InvalidRunId, InvalidState

__all__ = [
    "MAX_RUN_ID_LENGTH",
    "SCHEMA_VERSION",
    "Checkpoint",
    "Failure",
    "RunStatus",
    "check_run_id",
    "run_status",
    "utcnow",
]

#: Bumped whenever the stored layout changes; every stored checkpoint carries it so a
#: later release can migrate old documents instead of misreading them.
SCHEMA_VERSION = 1

MAX_RUN_ID_LENGTH = 1024

RunStatus = Literal["running", "failed", "done"]

# C0 controls, DEL, C1 controls, and lone surrogates (which cannot be encoded as UTF-8,
# so no backend could store them).
_BAD_RUN_ID_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def utcnow() -> datetime:
    """Return the current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def check_run_id(run_id: object) -> str:
    """Return ``run_id`` if every backend can store it, else raise ``InvalidRunId``.

    Allowed: any ``str`` of 1 to 1024 characters without control characters. Slashes,
    dots, ``#``, ``?``, ``%``, spaces and non-ASCII are all fine: backends encode ids.
    """
    if not isinstance(run_id, str):
        raise InvalidRunId(f"run_id must be a str, got {type(run_id).__name__}")
    if not run_id or len(run_id) > MAX_RUN_ID_LENGTH:
        raise InvalidRunId(
            f"run_id must be 1 to {MAX_RUN_ID_LENGTH} characters long, got {len(run_id)}"
        )
    bad = _BAD_RUN_ID_CHAR.search(run_id)
    if bad is not None:
        raise InvalidRunId(
            f"run_id contains the control or surrogate character {bad.group()!r} at position "
            f"{bad.start()}; allowed: any characters except control characters (U+0000-U+001F, "
            "U+007F-U+009F) and lone surrogates"
        )
    return run_id


@dataclass(frozen=True, slots=True)
class Failure:
    """Why the step after the last completed one failed, as saved for operators."""

    step_index: int
    step_name: str
    error_type: str
    message: str
    attempt: int
    at: datetime


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The saved progress of one run.

    Attributes:
        run_id: The run this checkpoint belongs to.
        step: Index of the last completed step; -1 when none has completed yet (a run
            whose first step failed or is being retried).
        state: The accumulated JSON state after ``step``.
        version: Opaque token of the stored version; None before the first save. A save
            succeeds only if the store still holds exactly this version.
        step_names: Names of the completed steps, in order (``len == step + 1``).
        total_steps: How many steps the workflow had at the last save, so ``status`` is
            known from the checkpoint alone.
        attempt: Attempts begun on the next step (``step + 1``); saved before each retried
            attempt so a crash does not reset the count.
        failure: The last failure of the next step, cleared once it succeeds.
        created_at: When the run was first saved.
        updated_at: When this checkpoint was saved.
    """

    run_id: str
    step: int = -1
    state: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    step_names: tuple[str, ...] = ()
    total_steps: int | None = None
    attempt: int = 0
    failure: Failure | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    # The JSON text of ``state`` as stored, set by the store that produced this object.
    # Lets the runner rebuild the pristine state after a step mutated its working copy
    # without encoding the state a second time on every step.
    state_json: str | None = field(default=None, repr=False, compare=False)

    def stored(
        self, state: dict[str, Any], state_json: str, version: str, now: datetime
    ) -> Checkpoint:
        """Return this checkpoint as a store saved it (a helper for backends)."""
        return Checkpoint(
            run_id=self.run_id,
            step=self.step,
            state=state,
            version=version,
            step_names=self.step_names,
            total_steps=self.total_steps,
            attempt=self.attempt,
            failure=self.failure,
            created_at=self.created_at or now,
            updated_at=now,
            state_json=state_json,
        )

    @property
    def status(self) -> RunStatus:
        """``done`` when every recorded step completed, ``failed`` after a saved failure."""
        return run_status(self.step, self.total_steps, self.failure is not None)


def run_status(step: int, total_steps: int | None, failed: bool) -> RunStatus:
    """Return a run's status from its stored fields (for backends that list without loading)."""
    if total_steps is not None and step + 1 >= total_steps:
        return "done"
    return "failed" if failed else "running"


def find_non_json(value: object, path: str = "state") -> tuple[str, str] | None:
    """Return ``(path, reason)`` of the first value that would not round-trip through JSON."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            return path, "the string holds a lone surrogate, which is not UTF-8"
        return None
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return path, f"{value!r} is not allowed in JSON"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _SURROGATE.search(key):
                return f"{path}[{key!r}]", "the key holds a lone surrogate, which is not UTF-8"
            if not isinstance(key, str):
                return (
                    f"{path}[{key!r}]",
                    f"key {key!r} is a {type(key).__name__}; JSON object keys must be str",
                )
            found = find_non_json(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = find_non_json(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    kind = type(value).__name__
    hint = " (use a list)" if isinstance(value, (tuple, set, frozenset)) else ""
    return path, f"a {kind} is not JSON{hint}"


def invalid_state(state: object, cause: str | None = None) -> InvalidState:
    """Build the error for a state that failed to encode, naming the bad value's path."""
    if not isinstance(state, dict):
        return InvalidState(
            f"state must be a dict with str keys, got {type(state).__name__}", "state"
        )
    try:
        found = find_non_json(state)
    except RecursionError:
        found = ("state", "it is nested too deeply to encode")
    if found is None:
        path, reason = "state", cause or "it does not round-trip through JSON"
    else:
        path, reason = found
    return InvalidState(
        f"{path}: {reason}; a state must be JSON: dict with str keys, list, str, int, "
        "finite float, bool or None",
        path,
    )
