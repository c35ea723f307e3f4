"""The journal of one agent step: its units' entries in the run's journal (``_journaled``)."""

from __future__ import annotations

import hashlib
import json
import re
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from ..._budget import Prices
from ..._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, utcnow
from ..._errors import ConflictError, LeaseLost, StepstoneError
from ..._journal import entry_ok
from ..._store import Store
from ..._suspend import pending_signals
from .._journaled import UnitJournal

#: Version of the journal record's layout the release before wrote (``state["format"]``):
#: such a record is read once and moved into the run's journal (``adopt_legacy``).
JOURNAL_FORMAT = 1
_JOURNAL_SUFFIX = "pydantic-ai-journal"


class ConcurrentUnits(StepstoneError):
    """Two durable units of one stepstone agent run were in flight at once.

    Their encounter counters would depend on scheduling, so a replay could hand one
    call's recorded result to another: refused instead.
    """


def journal_run_id(run_id: str, step_name: str) -> str:
    """Return the id of the record where the release before kept step ``step_name``'s journal.

    This release journals into the run's own record (``stepstone.journal``); a record
    of this id left by the release before is moved there on the step's next execution.

    ``RUN_ID/STEP/pydantic-ai-journal``; where that would pass the 1,024-character limit,
    ``pydantic-ai~<sha256 of RUN_ID NUL STEP>/pydantic-ai-journal``. Either form ends in
    ``/pydantic-ai-journal``, which ``stepstone runs list`` shows as kind ``pydantic-ai``.
    """
    plain = f"{run_id}/{step_name}/{_JOURNAL_SUFFIX}"
    if len(plain) <= MAX_RUN_ID_LENGTH:
        return plain
    digest = hashlib.sha256(f"{run_id}\x00{step_name}".encode()).hexdigest()
    return f"pydantic-ai~{digest}/{_JOURNAL_SUFFIX}"


def wait_token(run_id: str, signal: str) -> str:
    return json.dumps({"stepstone_run": run_id, "signal": signal}, ensure_ascii=False)


def parse_token(token: str) -> tuple[str, str]:
    """Return ``(run_id, signal name)`` from a token an ``ask`` callback received.

    Answer the wait with ``stepstone.signal(store, run_id, name, payload)``.

    Raises:
        ValueError: ``token`` is not a token handed out by a stepstone agent run.
    """
    try:
        data = json.loads(token)
        run_id, signal = data["stepstone_run"], data["signal"]
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            f"{token[:80]!r} is not a stepstone wait token (a JSON object with "
            "'stepstone_run' and 'signal')"
        ) from None
    if not isinstance(run_id, str) or not isinstance(signal, str):
        raise ValueError(  # noqa: TRY004 - a malformed token, whatever is wrong in it
            "a stepstone wait token holds a str run id and a str signal name"
        )
    return run_id, signal


# --- the journal of one agent step ----------------------------------------------------


class Suspend(BaseException):
    """Unwinds the agent run to the step: wait for ``signal`` until ``wake_at``.

    A ``BaseException`` so no ``except Exception`` inside pydantic-ai or a tool takes it
    for a failure.
    """

    def __init__(self, signal: str, wake_at: datetime | None) -> None:
        super().__init__(signal)
        self.signal = signal
        self.wake_at = wake_at


class Session(UnitJournal):
    """One execution of an ``AgentStep``: its units' entries in the run's journal."""

    def __init__(self, cp: Checkpoint, step_name: str, link: Any, sync: bool) -> None:
        super().__init__(cp, step_name, link, sync)
        self.epoch = cp.epoch
        # Milliseconds: what every backend keeps of a time, whatever it rounds off.
        self.run_created = (cp.created_at or utcnow()).isoformat(timespec="milliseconds")
        #: Spend budgets: the run has one (check before each new model request), and the
        #: step's prices (its usage in dollars).
        self.budgeted = False
        self.prices: Prices | None = None

    async def adopt_legacy(self, store: Store) -> None:
        """Move the journal the release before kept in a record of its own (``journal_run_id``)
        into the run's journal, once: its entries appended in the order it saved them,
        named as this release names them (``legacy_call``), then that record deleted."""
        if self.entries:
            return
        record_id = journal_run_id(self.run_id, self.step_name)
        stored = store.load(record_id) if self.sync else await store.aload(record_id)
        if stored is None:
            return
        state = stored.state
        if state.get("run") != self.run_id or state.get("step") != self.step_name:
            raise ConflictError(
                f"record {record_id!r} exists but is not the pydantic-ai journal of step "
                f"{self.step_name!r} of run {self.run_id!r}; remove it or rename the step",
                record_id,
            )
        epoch = state.get("epoch", 0)
        if isinstance(epoch, int) and epoch > self.epoch:
            raise LeaseLost(
                f"run {self.run_id!r}: lease lost: its pydantic-ai journal was written at epoch "
                f"{epoch}, this owner holds epoch {self.epoch}; nothing was written",
                self.run_id,
            )
        old = state.get("entries")
        if state.get("run_created") == self.run_created and isinstance(old, dict) and old:
            # Not left by a deleted run of the same id (its results are not this run's).
            moved = []
            for key, value in old.items():
                entry = entry_ok(self.take_seq(), legacy_call(key), 1, value)
                entry.pop("at")  # not known: the release before kept no times
                entry["step"] = self.step_name
                moved.append(entry)
            await self.save(moved)
            self.entries.update({e["call"]: e["result"] for e in moved})
        # Moved (or not this run's): the record goes, by compare-and-swap on what was read.
        # A crash before the delete leaves it behind, unread: the run's journal answers.
        if self.sync:
            store.delete(record_id, expected_version=stored.version)
        else:
            await store.adelete(record_id, expected_version=stored.version)

    def taken_signal_ids(self) -> set[str]:
        return {
            value["signal_id"]
            for value in self.entries.values()
            if isinstance(value, dict) and isinstance(value.get("signal_id"), str)
        }

    def taken_by_name(self, cp: Checkpoint) -> dict[str, int]:
        """Return, per signal name, the signals this step took that ``cp`` counts as pending."""
        taken = self.taken_signal_ids()
        counts: dict[str, int] = {}
        for value in self.entries.values():
            if isinstance(value, dict) and isinstance(value.get("signal"), str):
                name = value["signal"]
                if name not in counts:
                    counts[name] = sum(1 for s in pending_signals(cp, name) if s.id in taken)
        return {name: n for name, n in counts.items() if n}


_LEGACY = re.compile(r"(?P<name>.+?)(?:#(?P<n>\d+))?(?P<sub>\.ask|\.deadline)?")


def legacy_call(key: str) -> str:
    """The call name of an entry the release before journaled under ``key``.

    It named a unit's first encounter bare and the next ones ``#2``, ``#3``, and a
    wait's parts ``WAIT.ask`` / ``WAIT#2.deadline``; this release numbers every call
    (``NAME#1``) and names a wait's parts ``WAIT.ask#N``, as it journals them now.
    """
    match = _LEGACY.fullmatch(key)
    assert match is not None  # every non-empty key matches
    return f"{match['name']}{match['sub'] or ''}#{match['n'] or 1}"


def sub_call(key: str, part: str) -> str:
    """The call name of part ``part`` (``ask``, ``deadline``) of the wait ``key`` (``W#N``)."""
    name, _, n = key.rpartition("#")
    return f"{name}.{part}#{n}"


session_var: ContextVar[Session | None] = ContextVar("stepstone_pydantic_ai_session", default=None)
#: True inside a unit's body, and in the tasks it starts (they inherit the context).
in_unit: ContextVar[bool] = ContextVar("stepstone_pydantic_ai_in_unit", default=False)
