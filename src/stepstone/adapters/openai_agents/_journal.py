"""The journal of one agent step: write-once records, counted names, one unit at a time."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from contextvars import ContextVar
from typing import Any, TypeVar

from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..._budget import Prices
from ..._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, evolve
from ..._codec import encode_state
from ..._errors import ConflictError, InvalidState, InvalidWorkflow, StepstoneError
from ..._store import Store
from .._agent_call import find
from .._drive import Load, Rule, Save, adrive, drive

#: The head of every record this adapter writes.
PREFIX = "openai-agents:"
#: Version of the records' layout (``state["format"]``).
FORMAT = 1
#: The signal that carries approvals, unless ``approval_signal=`` says otherwise.
APPROVAL_SIGNAL = "approval"
# Each retry means another writer changed the record between our load and our save.
MAX_TRIES = 200
MISSING: Any = object()
T = TypeVar("T")


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
    """Return the id of the record holding journal entry ``key`` of one agent step."""
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


class Journal:
    """The write-once entries of one execution of an agent step, and its counters."""

    def __init__(
        self, store: Store, run_id: str, step_name: str, run_created: str, *, sync: bool
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.step_name = step_name
        self.run_created = run_created
        self.sync = sync
        self.counters: dict[str, int] = {}
        self.busy: set[str] = set()
        #: Scopes where a counted name was not found: the names after it in that scope
        #: were never recorded either (a scope's units run one at a time), so they are
        #: not looked up. Write-once ``put`` keeps this safe against any racing writer.
        self.missed: set[str] = set()
        #: Units whose recorded result was returned / whose body ran, in this execution.
        self.replayed = 0
        self.executed = 0
        #: Spend budgets: the run has one (check before each new model call), the step's
        #: prices, and the input and output tokens of this agent run's calls so far.
        self.budgeted = False
        self.prices: Prices | None = None
        self.used = [0, 0]

    async def run(self, rule: Rule[T]) -> T:
        """Run one journal rule: on the sync store methods under ``run`` (the agent's
        loop is private to the step there, so a blocking call stalls nothing else), on
        the async ones under ``arun``."""
        if self.sync:
            return drive(self.store, rule)
        return await adrive(self.store, rule)

    def next_name(self, name: str) -> str:
        """Return ``name`` with its encounter counter: the first is bare, then ``#2``, ..."""
        count = self.counters.get(name, 0) + 1
        self.counters[name] = count
        return name if count == 1 else f"{name}#{count}"

    def _ours(self, cp: Checkpoint, key: str) -> bool:
        """Return whether ``cp`` is entry ``key`` of this run (False: a deleted run's)."""
        state = cp.state
        if (state.get("run"), state.get("step"), state.get("key")) != (
            self.run_id,
            self.step_name,
            key,
        ):
            raise ConflictError(
                f"record {cp.run_id!r} exists but is not journal entry {key!r} of step "
                f"{self.step_name!r} of run {self.run_id!r}; remove it or rename the step",
                cp.run_id,
            )
        return state.get("run_created") == self.run_created

    def get_rule(self, key: str) -> Rule[Any]:
        """The value recorded for ``key``, or ``MISSING``."""
        cp = yield Load(journal_record_id(self.run_id, self.step_name, key))
        if cp is None or not self._ours(cp, key):
            return MISSING
        return cp.state.get("value")

    async def get(self, key: str) -> Any:
        """Return the value recorded for ``key``, or ``MISSING``."""
        return await self.run(self.get_rule(key))

    async def lookup(self, scope: str, key: str) -> Any:
        """``get`` for a counted name of ``scope``; ``MISSING`` at once after a miss there."""
        if scope in self.missed:
            return MISSING
        found = await self.get(key)
        if found is MISSING:
            self.missed.add(scope)
        return found

    def put_rule(self, key: str, value: Any) -> Rule[Any]:
        """Record ``value`` for ``key`` unless recorded already; return what is recorded.

        Write-once: an owner that lost its lease without knowing may have recorded ``key``
        first; its value stands, so every replay agrees.
        """
        record_id = journal_record_id(self.run_id, self.step_name, key)
        state = {
            "format": FORMAT,
            "run": self.run_id,
            "step": self.step_name,
            "key": key,
            "run_created": self.run_created,
            "value": value,
        }
        intended = done_record(record_id, state)
        for _ in range(MAX_TRIES):
            try:
                yield Save(intended)
            except ConflictError:
                existing = yield Load(record_id)
                if existing is None:
                    intended = done_record(record_id, state)
                    continue
                if self._ours(existing, key):
                    return existing.state.get("value")
                intended = evolve(existing, state=state)  # a deleted run's: replace it
                continue
            return value
        raise ConflictError(f"journal entry {record_id!r}: too many concurrent writers", record_id)

    async def put(self, key: str, value: Any) -> Any:
        """Run ``put_rule``: record ``value`` for ``key`` once; return what is recorded."""
        return await self.run(self.put_rule(key, value))


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
    if scope in journal.busy:
        raise Fatal(
            ConcurrentUnits(
                f"run {journal.run_id!r}: two journaled calls of scope {scope or 'agent'!r} were "
                "in flight at once; their encounter counters would depend on scheduling. Run "
                "sub-agents of one tool one after another, or give each its own durable_tool"
            )
        )
    journal.busy.add(scope)
    try:
        yield
    finally:
        journal.busy.discard(scope)
