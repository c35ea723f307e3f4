"""The journal of one agent step: its units' entries in the run's journal (``_journaled``),
counted names, one unit at a time per scope; the records of the release before moved in."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from contextvars import ContextVar
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..._budget import Prices
from ..._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, utcnow
from ..._codec import encode_state
from ..._errors import ConflictError, InvalidState, InvalidWorkflow, StepstoneError
from ..._journal import entry_ok
from ..._store import Store
from .._agent_call import find
from .._drive import Load, Rule, Scan, adrive, drive
from .._journaled import UnitJournal

#: The head of every record this adapter writes.
PREFIX = "openai-agents:"
#: Version of the records' layout (``state["format"]``).
FORMAT = 1
#: The signal that carries approvals, unless ``approval_signal=`` says otherwise.
APPROVAL_SIGNAL = "approval"
# Each retry means another writer changed the record between our load and our save.
MAX_TRIES = 200
MISSING: Any = object()


class ConcurrentUnits(StepstoneError):
    """Two journaled units of one scope of an agent run were in flight at once.

    Their encounter counters would depend on scheduling, so a replay could hand one
    call's recorded result to another: refused instead.
    """


def record_id(rest: str) -> str:
    plain = PREFIX + rest
    if len(plain) <= MAX_RUN_ID_LENGTH:
        return plain
    return PREFIX + "~" + hashlib.sha256(rest.encode("utf-8", "surrogatepass")).hexdigest()


def journal_record_id(run_id: str, step_name: str, key: str) -> str:
    """Return the id of the record where the release before kept journal entry ``key``
    of one agent step (this release journals into the run's own record)."""
    return record_id(f"{run_id}/{step_name}/{key}")


def done_record(record_id: str, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(run_id=record_id, step=0, state=state, step_names=("record",), total_steps=1)


def to_json(value: Any, what: str) -> Any:
    """Return ``value`` in its JSON form, or raise ``InvalidWorkflow`` saying what it is."""
    try:
        plain = to_jsonable_python(value, by_alias=True)
        return encode_state({"value": plain})[1]["value"]
    except (InvalidState, PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidWorkflow(f"{what} is not JSON ({exc}); stepstone journals JSON only") from None


async def backoff(attempt: int) -> None:
    # Jittered, growing: writers that collide once do not collide in lockstep again.
    await asyncio.sleep(random.uniform(0, 0.002 * min(attempt, 25)))


class Journal(UnitJournal):
    """One execution of an agent step: its units' entries in the run's journal, counters.

    The entries are the run's (``_journaled``): ``get`` answers from those journaled
    already, ``put`` appends one by the core's fenced compare-and-swap (so a stale
    owner's write is refused by the lease, and every replay reads the first value).
    """

    def __init__(self, cp: Checkpoint, step_name: str, link: Any, sync: bool) -> None:
        super().__init__(cp, step_name, link, sync)
        # As the release before wrote it: a session write's id names it (``_session``).
        self.run_created = (cp.created_at or utcnow()).isoformat()
        #: The scopes with a unit in flight (one at a time per scope: ``unit``).
        self.scopes: set[str] = set()
        #: Units whose recorded result was returned / whose body ran, in this execution.
        self.replayed = 0
        self.executed = 0
        #: Spend budgets: the run has one (check before each new model call), the step's
        #: prices, and the input and output tokens of this agent run's calls so far.
        self.budgeted = False
        self.prices: Prices | None = None
        self.used = [0, 0]

    def next_name(self, name: str) -> str:
        """Return ``name`` with its encounter counter: the first is bare, then ``#2``, ...

        The names the release before gave its records, kept: its journals move in as
        they are (``adopt_legacy``), and a session write's id stays the one it applied.
        """
        count = self.counters.get(name, 0) + 1
        self.counters[name] = count
        return name if count == 1 else f"{name}#{count}"

    def get(self, key: str) -> Any:
        """Return the value journaled for ``key``, or ``MISSING``."""
        return self.entries.get(key, MISSING)

    async def put(self, key: str, value: Any) -> Any:
        """Journal ``value`` for ``key`` unless journaled already; return what is journaled."""
        return await self.record(key, value)

    async def adopt_legacy(self, store: Store) -> None:
        """Move the entries the release before kept in records of their own
        (``journal_record_id``) into the run's journal, once, in the order it saved them,
        then delete those records (by compare-and-swap on what was read)."""
        if self.entries:
            return
        rule = legacy_entries(self.run_id, self.step_name, self.run_created)
        found = drive(store, rule) if self.sync else await adrive(store, rule)
        moved = []
        for _, _, key, value in found:
            if key is not None:
                entry = entry_ok(self.take_seq(), key, 1, value)
                entry.pop("at")  # not known: the release before kept no times
                entry["step"] = self.step_name
                moved.append(entry)
        if moved:
            await self.save(moved)
            self.entries.update({e["call"]: e["result"] for e in moved})
        for record, version, _, _ in found:
            if self.sync:
                store.delete(record, expected_version=version)
            else:
                await store.adelete(record, expected_version=version)


#: Entries every started agent run of the release before recorded first (one of them):
#: a run without either has no records to move, found without a listing.
_PROBES = ("get_response", "session.get_items", "pause#1")


def legacy_entries(
    run_id: str, step_name: str, run_created: str
) -> Rule[list[tuple[str, str | None, str | None, Any]]]:
    """The records the release before journaled step ``step_name`` of ``run_id`` in:
    ``(record id, version, key, value)`` in the order saved; key None for a record a
    deleted run of the same id left (not this run's: only deleted).

    Each entry was a record of its own, ``openai-agents:RUN/STEP/KEY``, written once:
    ordered by their save times. (Ids past the length limit were hashed: not listed.)
    """
    for probe in _PROBES:
        if (yield Load(journal_record_id(run_id, step_name, probe))) is not None:
            break
    else:
        return []
    ids = yield Scan(f"{PREFIX}{run_id}/{step_name}/")
    found = []
    for rid in ids:
        cp: Checkpoint | None = yield Load(rid)
        if cp is None:
            continue
        state = cp.state
        if (state.get("run"), state.get("step")) != (run_id, step_name) or not isinstance(
            state.get("key"), str
        ):
            raise ConflictError(
                f"record {rid!r} exists but is not a journal entry of step {step_name!r} "
                f"of run {run_id!r}; remove it or rename the step",
                rid,
            )
        ours = state.get("run_created") == run_created
        when = cp.updated_at or cp.created_at
        found.append((0.0 if when is None else when.timestamp(), rid, cp.version, ours, state))
    found.sort(key=lambda f: (f[0], f[1]))
    return [
        (rid, version, state["key"] if ours else None, state.get("value"))
        for _, rid, version, ours, state in found
    ]


journal_var: ContextVar[Journal | None] = ContextVar("stepstone_openai_journal", default=None)
#: Where journal names are counted: "" for the agent run, ``tool:NAME:CALL_ID/`` inside a
#: durable tool call (copied into the tasks a tool starts, as contextvars are).
scope_var: ContextVar[str] = ContextVar("stepstone_openai_scope", default="")


class Fatal(BaseException):
    """Carries a ``ConcurrentUnits`` through the SDK to the step.

    A ``BaseException``: the SDK turns a tool's ``Exception`` into a message to the model,
    which would journal a scheduling accident as the tool's result.
    """

    def __init__(self, error: ConcurrentUnits) -> None:
        super().__init__(str(error))
        self.error = error


class BudgetPause(BaseException):
    """Unwinds the agent run to the step: the run is at its spend limit before a new
    model call (a ``BaseException``, so no handler of the SDK takes it for a failure)."""


def find_fatal(error: BaseException) -> Fatal | None:
    found = find(error, Fatal)
    return found if isinstance(found, Fatal) else None


@contextlib.asynccontextmanager
async def unit(journal: Journal, scope: str) -> Any:
    if scope in journal.scopes:
        raise Fatal(
            ConcurrentUnits(
                f"run {journal.run_id!r}: two journaled calls of scope {scope or 'agent'!r} were "
                "in flight at once; their encounter counters would depend on scheduling. Run "
                "sub-agents of one tool one after another, or give each its own durable_tool"
            )
        )
    journal.scopes.add(scope)
    try:
        yield
    finally:
        journal.scopes.discard(scope)
