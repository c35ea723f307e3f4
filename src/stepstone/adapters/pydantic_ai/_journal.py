"""The journal of one agent step: one record of JSON results, fenced by the owner's epoch."""

from __future__ import annotations

import hashlib
import json
from contextvars import ContextVar
from datetime import datetime
from typing import Any, TypeVar

from ..._budget import Prices
from ..._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, evolve
from ..._errors import ConflictError, LeaseLost, StepstoneError
from ..._store import Store
from ..._suspend import pending_signals
from .._drive import Load, Rule, Save, adrive, drive

T = TypeVar("T")


#: Version of the journal record's layout (``state["format"]``).
JOURNAL_FORMAT = 1
_JOURNAL_SUFFIX = "pydantic-ai-journal"
# Each retry means another writer changed the journal between our load and our save.
MAX_TRIES = 50


class ConcurrentUnits(StepstoneError):
    """Two durable units of one stepstone agent run were in flight at once.

    Their encounter counters would depend on scheduling, so a replay could hand one
    call's recorded result to another: refused instead.
    """


def journal_run_id(run_id: str, step_name: str) -> str:
    """Return the id of the record holding the journal of step ``step_name`` of ``run_id``.

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


class Session:
    """One execution of an ``AgentStep``: its journal, counters, and the store to save to."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        step_name: str,
        *,
        epoch: int,
        run_created: str,
        sync: bool,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.step_name = step_name
        self.journal_id = journal_run_id(run_id, step_name)
        self.epoch = epoch
        self.run_created = run_created
        self.sync = sync
        self.record_cp: Checkpoint | None = None
        self.entries: dict[str, Any] = {}
        self.counters: dict[str, int] = {}
        self.busy: str | None = None
        #: Spend budgets: the run has one (check before each new model request), and the
        #: step's prices (its usage in dollars).
        self.budgeted = False
        self.prices: Prices | None = None

    async def run(self, rule: Rule[T]) -> T:
        """Run one journal rule: on the sync store methods under ``run`` (the agent's loop
        is private to the step there, so a blocking save stalls nothing else), on the
        async ones under ``arun``."""
        if self.sync:
            return drive(self.store, rule)
        return await adrive(self.store, rule)

    def _adopt(self, stored: Checkpoint | None) -> None:
        """Take ``stored`` as the journal, after checking it is this run's and not newer."""
        self.record_cp = stored
        if stored is None:
            self.entries = {}
            return
        state = stored.state
        if state.get("run") != self.run_id or state.get("step") != self.step_name:
            raise ConflictError(
                f"record {self.journal_id!r} exists but is not the pydantic-ai journal of step "
                f"{self.step_name!r} of run {self.run_id!r}; remove it or rename the step",
                self.journal_id,
            )
        if state.get("run_created") != self.run_created:
            # Left by a deleted run of the same id: its results are not this run's.
            self.entries = {}
            return
        epoch = state.get("epoch", 0)
        if isinstance(epoch, int) and epoch > self.epoch:
            raise LeaseLost(
                f"run {self.run_id!r}: lease lost: its pydantic-ai journal was written at epoch "
                f"{epoch}, this owner holds epoch {self.epoch}; nothing was written",
                self.run_id,
            )
        entries = state.get("entries")
        self.entries = dict(entries) if isinstance(entries, dict) else {}

    def _open(self) -> Rule[None]:
        self._adopt((yield Load(self.journal_id)))

    async def open(self) -> None:
        """Read the journal as it is stored now."""
        await self.run(self._open())

    def next_name(self, name: str) -> str:
        """Return ``name`` with its encounter counter: the first is bare, then ``#2``, ..."""
        count = self.counters.get(name, 0) + 1
        self.counters[name] = count
        return name if count == 1 else f"{name}#{count}"

    async def record(self, key: str, payload: Any) -> Any:
        """Run ``_record``: save ``key: payload`` once; return what the journal holds."""
        return await self.run(self._record(key, payload))

    def _record(self, key: str, payload: Any) -> Rule[Any]:
        """Save ``key: payload`` in the journal; return what the journal holds for ``key``.

        A concurrent writer of the same run (an owner that lost its lease without knowing)
        may have recorded ``key`` first: its value stands, so every replay agrees.
        """
        for _ in range(MAX_TRIES):
            if key in self.entries:
                return self.entries[key]
            entries = {**self.entries, key: payload}
            state = {
                "format": JOURNAL_FORMAT,
                "run": self.run_id,
                "step": self.step_name,
                "run_created": self.run_created,
                "epoch": self.epoch,
                "entries": entries,
            }
            base = self.record_cp
            if base is None:
                intended = Checkpoint(
                    run_id=self.journal_id,
                    step=0,
                    state=state,
                    step_names=("journal",),
                    total_steps=1,
                )
            else:
                intended = evolve(base, state=state)
            try:
                self.record_cp = yield Save(intended)
            except ConflictError:
                self._adopt((yield Load(self.journal_id)))
                continue
            self.entries = entries
            return payload
        raise ConflictError(
            f"run {self.run_id!r}: {MAX_TRIES} writers changed its pydantic-ai journal "
            "during one save",
            self.journal_id,
        )

    async def latest_run(self) -> Checkpoint:
        """Return the run's record as stored now."""
        return await self.run(self._latest_run())

    def _latest_run(self) -> Rule[Checkpoint]:
        cp: Checkpoint | None = yield Load(self.run_id)
        if cp is None:
            raise LeaseLost(f"run {self.run_id!r} was deleted while its agent ran", self.run_id)
        return cp

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


session_var: ContextVar[Session | None] = ContextVar("stepstone_pydantic_ai_session", default=None)
#: True inside a unit's body, and in the tasks it starts (they inherit the context).
in_unit: ContextVar[bool] = ContextVar("stepstone_pydantic_ai_in_unit", default=False)
