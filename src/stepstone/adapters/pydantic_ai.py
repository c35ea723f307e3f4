"""Durable pydantic-ai agents on stepstone (``pip install 'stepstone[pydantic-ai]'``).

Attach ``StepstoneDurability()`` to an ``Agent`` and run the agent inside a stepstone
run: with the one-call helper ``durable_agent_run`` / ``adurable_agent_run``, or as an
``AgentStep(name, agent, prompt, store=store)`` among the steps of ``run``/``arun`` or of
a ``Workflow`` served by workers. Built on pydantic-ai's public durable engine API
(``pydantic_ai.durable_exec``, ``pydantic_ai.external_events``) only.

How a run survives a crash. Every model request (streaming or not), tool call, toolset
discovery and event-stream-handler call is one durable unit, named by pydantic-ai's
``JournalOperationNamer`` (``support__model.request``, ``support__function_toolset__
<agent>.call_tool:lookup``); a name met again in one agent run gets an encounter counter
(``...model.request#2``). When a unit's body returns, its JSON result (pydantic models in
their JSON mode) is saved, by compare-and-swap, in the step's *journal*: one record in
the same store, ``RUN_ID/STEP/pydantic-ai-journal`` (``journal_run_id``), kept at status
``done`` so no worker ever claims it. On resume the agent runs again from its start and
every unit found in the journal returns its recorded result instead of running: finished
model requests and tool calls are never paid twice; the one in flight at the crash runs
at most once more. The journal lives outside the run's own record because the runner's
compare-and-swap refuses a record whose state changed under a running step.

Ordering. Tool calls run one at a time, in the order of the recorded model response
(the engine spec's ``sequential_tools_in_durable_context``: pydantic-ai forces its
``sequential`` mode inside a stepstone run, overriding a ``parallel`` one). An encounter
counter must mean the same call on every replay, which a counter taken by concurrently
scheduled calls would not; anything that still starts a second unit while one runs (a
tool starting ``asyncio.gather`` of durable work) is refused with ``ConcurrentUnits``.

Durable waits. Inside a stepstone run, pydantic-ai's ``wait_for_external_event`` (and so
``RequestInput``) waits for the stepstone *signal* named after the wait: the run is
saved ``waiting`` (``waiting_for: signal NAME``, ``wake_at`` the recorded timeout), no
process is held, ``stepstone.signal(store, RUN_ID, NAME, payload)`` or ``stepstone runs
signal RUN_ID NAME --data ...`` answers it, and any process resumes the agent where it
stopped. The token ``ask`` receives names the run and the signal (``parse_token``).

Fencing. The journal records the fencing epoch of the run's owner that wrote it; a
stale owner (its lease taken over) gets ``LeaseLost`` on its next journal write.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Generator, Mapping
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

try:
    import pydantic_ai  # noqa: F401 - fail here, naming the extra, rather than deeper
except ImportError as exc:  # pragma: no cover - the tests run with the extra installed
    raise ImportError(
        "stepstone.adapters.pydantic_ai needs pydantic-ai: pip install 'stepstone[pydantic-ai]'"
    ) from exc

from pydantic import JsonValue
from pydantic_ai.capabilities.abstract import WrapRunHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalCallableOperationBackend,
    RoleBasedOperationConfig,
    record_durable_unit,
    replay_scope,
)
from pydantic_ai.external_events import (
    ExternalEventError,
    ExternalEventWaiter,
    external_event_scope,
)
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_core import to_jsonable_python

from .._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, evolve, utcnow
from .._errors import ConflictError, InvalidWorkflow, LeaseLost, StepstoneError
from .._runner import arun
from .._steps import RetryPolicy, Step, StepContext, _check_name, idempotency_key
from .._store import Store
from .._suspend import Complete, SuspendingStep, Wait, pending_signals

if TYPE_CHECKING:
    from pydantic_ai.agent import AbstractAgent, EventStreamHandler
    from pydantic_ai.models import Model

    from .._core import Effect, Plan

__all__ = [
    "AgentStep",
    "ConcurrentUnits",
    "JOURNAL_FORMAT",
    "StepstoneDurability",
    "adurable_agent_run",
    "durable_agent_run",
    "journal_run_id",
    "parse_token",
    "read_journal",
]

#: Version of the journal record's layout (``state["format"]``).
JOURNAL_FORMAT = 1
_JOURNAL_SUFFIX = "pydantic-ai-journal"
# Each retry means another writer changed the journal between our load and our save.
_MAX_TRIES = 50


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


def _token(run_id: str, signal: str) -> str:
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


class _Suspend(BaseException):
    """Unwinds the agent run to the step: wait for ``signal`` until ``wake_at``.

    A ``BaseException`` so no ``except Exception`` inside pydantic-ai or a tool takes it
    for a failure.
    """

    def __init__(self, signal: str, wake_at: datetime | None) -> None:
        super().__init__(signal)
        self.signal = signal
        self.wake_at = wake_at


class _Session:
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

    # I/O: sync stores under ``run`` (the agent's loop is private to the step there, so a
    # blocking save stalls nothing else), async stores under ``arun``.
    async def _load(self, run_id: str) -> Checkpoint | None:
        if self.sync:
            return self.store.load(run_id)
        return await self.store.aload(run_id)

    async def _save(self, cp: Checkpoint) -> Checkpoint:
        if self.sync:
            return self.store.save(cp)
        return await self.store.asave(cp)

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

    async def open(self) -> None:
        self._adopt(await self._load(self.journal_id))

    def next_name(self, name: str) -> str:
        """Return ``name`` with its encounter counter: the first is bare, then ``#2``, ..."""
        count = self.counters.get(name, 0) + 1
        self.counters[name] = count
        return name if count == 1 else f"{name}#{count}"

    async def record(self, key: str, payload: Any) -> Any:
        """Save ``key: payload`` in the journal; return what the journal holds for ``key``.

        A concurrent writer of the same run (an owner that lost its lease without knowing)
        may have recorded ``key`` first: its value stands, so every replay agrees.
        """
        for _ in range(_MAX_TRIES):
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
                self.record_cp = await self._save(intended)
            except ConflictError:
                self._adopt(await self._load(self.journal_id))
                continue
            self.entries = entries
            return payload
        raise ConflictError(
            f"run {self.run_id!r}: {_MAX_TRIES} writers changed its pydantic-ai journal "
            "during one save",
            self.journal_id,
        )

    async def latest_run(self) -> Checkpoint:
        cp = await self._load(self.run_id)
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


_session: ContextVar[_Session | None] = ContextVar("stepstone_pydantic_ai_session", default=None)
#: True inside a unit's body, and in the tasks it starts (they inherit the context).
_in_unit: ContextVar[bool] = ContextVar("stepstone_pydantic_ai_in_unit", default=False)


# --- the engine -----------------------------------------------------------------------


class _Backend(JournalCallableOperationBackend[None]):
    """Runs each durable unit's body once per run: its result is journaled, then replayed."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        session = _session.get()
        if session is None or _in_unit.get():
            # Nested in another unit's body (a sub-agent run inside a tool): that unit's
            # result is journaled as a whole, so what it does inside runs directly.
            return await body()
        key = session.next_name(name)
        if key in session.entries:
            record_durable_unit(executed=False)
            return session.entries[key]
        if session.busy is not None:
            raise ConcurrentUnits(
                f"run {session.run_id!r}: durable unit {key!r} started while {session.busy!r} "
                "was still running. Inside a stepstone run the units of one agent run execute "
                "one at a time (tool calls in the order of the model response), so that each "
                "name's encounter counter means the same call on every replay; do not start "
                "durable work concurrently (asyncio.gather) inside one agent run"
            )
        session.busy = key
        token = _in_unit.set(True)
        try:
            payload = await body()
        finally:
            _in_unit.reset(token)
            session.busy = None
        recorded = await session.record(key, payload)
        record_durable_unit(executed=True)
        return recorded


def _not_json(error: Exception) -> BaseException:
    return InvalidWorkflow(
        f"a pydantic-ai durable unit returned a value that is not JSON ({error}); stepstone "
        "journals JSON only"
    )


class StepstoneDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent durable inside a stepstone run: each model request and tool call a step.

    Outside a stepstone run (no ``AgentStep`` or ``durable_agent_run`` around it) the
    capability is transparent and ``agent.run`` is an ordinary run.

    Example:
        ``Agent("openai:gpt-5", name="support", capabilities=[StepstoneDurability()])``
    """

    engine_spec: ClassVar[DurabilityEngineSpec] = DurabilityEngineSpec(
        engine_name="stepstone",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="run",
        codec=JSON_CODEC,
        serialization_failure=_not_json,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        journal_discovery=True,
        sequential_tools_in_durable_context=True,
    )

    def __init__(
        self,
        *,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        name: str | None = None,
    ) -> None:
        """Create the capability.

        Args:
            models: Extra models by id, for ``agent.run(model=...)`` inside a run.
            event_stream_handler: Receives the run's events; each tool event is one step.
            name: The name in persisted step names; default the agent's ``name``.
        """
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._backend: _Backend | None = None

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        self._backend = _Backend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )
        super()._bind_to_agent(agent)

    @property
    def in_durable_context(self) -> bool:
        return _session.get() is not None

    def get_durable_operation_backend(self) -> _Backend:
        assert self._backend is not None, "bound by for_agent before any run"
        return self._backend

    def get_default_run_id(self) -> str | None:
        session = _session.get()
        if session is None:
            return None
        # Replay-stable: the same on every execution of this step of this run.
        n = session.next_name("run_id").partition("#")[2] or "1"
        return f"{session.run_id}/{session.step_name}/{n}"

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        session = _session.get()
        if session is None:
            return None
        key = session.next_name(f"{self.name}.run_start_time")
        recorded = await session.record(key, utcnow().isoformat())
        return datetime.fromisoformat(recorded)

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        session = _session.get()
        if session is None:
            return await super().wrap_run(ctx, handler=handler)
        with external_event_scope(_Waiter(session, self.name)):
            return await super().wrap_run(ctx, handler=handler)


class _Waiter(ExternalEventWaiter):
    """``wait_for_external_event`` inside a stepstone run: a stepstone signal, durably."""

    def __init__(self, session: _Session, agent_name: str) -> None:
        self.session = session
        self.agent_name = agent_name

    async def wait(
        self,
        name: str,
        *,
        ask: Callable[[str], Awaitable[JsonValue]],
        timeout: timedelta | None,
    ) -> JsonValue:
        session = self.session
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidWorkflow(
                f"a wait's name is its stepstone signal name: 1-200 characters, got {name!r}"
            )
        key = session.next_name(f"{self.agent_name}__external_event.{name}")
        if key in session.entries:
            return _outcome(session.entries[key])
        ask_key = f"{key}.ask"
        if ask_key in session.entries:
            answer = session.entries[ask_key]
        else:
            answer = await session.record(ask_key, await ask(_token(session.run_id, name)))
        if answer is not None:
            return _outcome(await session.record(key, {"payload": answer}))
        deadline: datetime | None = None
        if timeout is not None:
            due = await session.record(f"{key}.deadline", (utcnow() + timeout).isoformat())
            deadline = datetime.fromisoformat(due)
        cp = await session.latest_run()
        taken = session.taken_signal_ids()
        for signal in pending_signals(cp, name):
            if signal.id not in taken:
                value = {"payload": signal.payload, "signal": name, "signal_id": signal.id}
                return _outcome(await session.record(key, value))
        if deadline is not None and utcnow() >= deadline:
            value = {"error": f"no signal {name!r} arrived within {timeout}", "signal": name}
            return _outcome(await session.record(key, value))
        raise _Suspend(name, deadline)


def _outcome(value: Any) -> JsonValue:
    if isinstance(value, dict) and "error" in value:
        raise ExternalEventError(str(value["error"]))
    payload: JsonValue = value["payload"] if isinstance(value, dict) else None
    return payload


# --- the step -------------------------------------------------------------------------


def _find(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """Return the first ``kind`` inside ``error`` (task groups wrap it in exception groups)."""
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


class AgentStep(SuspendingStep):
    """A step that runs a pydantic-ai agent durably; its output is merged under ``name``.

    ``prompt`` is the user prompt, or a function of the run's state returning it;
    ``deps`` a function of the state returning the agent's dependencies. The agent must
    carry ``StepstoneDurability``. ``store`` is where the step's journal is kept: the
    store the run lives in (the runner hands steps no store). The step suspends the run
    while the agent waits for an external event (a stepstone signal of the wait's name),
    and completes with the agent's output in its JSON form (``to_jsonable_python``), or
    ``output(result)``. ``retry`` retries a failed agent run; the retry replays the
    journal, so finished units are not paid again.
    """

    __slots__ = ("agent", "deps", "output", "prompt", "store")

    def __init__(
        self,
        name: str,
        agent: AbstractAgent[Any, Any],
        prompt: str | Callable[[dict[str, Any]], str],
        *,
        store: Store,
        deps: Callable[[dict[str, Any]], Any] | None = None,
        output: Callable[[AgentRunResult[Any]], Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.name = _check_name(name)
        if not isinstance(store, Store):
            raise InvalidWorkflow(f"AgentStep {name!r}: store must be a stepstone Store")
        self.store = store
        if StepstoneDurability.from_agent(agent) is None:
            raise InvalidWorkflow(
                f"AgentStep {name!r}: the agent has no StepstoneDurability capability; create "
                "it with Agent(..., name='...', capabilities=[StepstoneDurability()])"
            )
        if not (isinstance(prompt, str) or callable(prompt)):
            raise InvalidWorkflow(f"AgentStep {name!r}: prompt must be a str or a function")
        self.agent = agent
        self.prompt = prompt
        self.deps = deps
        self.output = output
        self.retry = retry

    def __repr__(self) -> str:
        return f"AgentStep({self.name!r}, {self.agent.name!r})"

    def ready(self, cp: Checkpoint) -> bool:
        signal = (cp.waiting_for or "").removeprefix("signal ")
        if cp.waiting_for is not None and pending_signals(cp, signal):
            return True
        return cp.wake_at is not None and utcnow() >= cp.wake_at

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Complete | Wait]:
        from .._core import Call  # noqa: PLC0415 - the core imports the steps, not back

        store = self.store
        try:
            asyncio.get_running_loop()
            sync = False
        except RuntimeError:
            sync = True
        ctx = StepContext(
            plan.run_id,
            index,
            self.name,
            max(cp.attempt, 1),
            idempotency_key(plan.run_id, index, self.name),
        )
        session = _Session(
            store,
            plan.run_id,
            self.name,
            epoch=cp.epoch,
            # Milliseconds: what every backend keeps of a time, whatever it rounds off.
            run_created=(cp.created_at or utcnow()).isoformat(timespec="milliseconds"),
            sync=sync,
        )
        if sync:

            def call_sync(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
                return asyncio.run(self._execute(session, state))

            step = Step(self.name, call_sync)
        else:

            async def call_async(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
                return await self._execute(session, state)

            step = Step(self.name, call_async)
        outcome: dict[str, Any] = yield Call(step, state, ctx, cp)
        if inspect.iscoroutine(outcome):
            outcome.close()
            raise InvalidWorkflow(
                f"AgentStep {self.name!r}: stepstone.run (sync) was called from inside a "
                "running event loop; there, use `await stepstone.arun(...)`"
            )
        consumed = dict(cp.consumed)
        for signal, count in outcome["taken"].items():
            consumed[signal] = consumed.get(signal, 0) + count
        changes = {"consumed": consumed} if outcome["taken"] else {}
        if "wait" in outcome:
            wake = outcome["wake_at"]
            return Wait(
                f"signal {outcome['wait']}",
                None if wake is None else datetime.fromisoformat(wake),
                changes,
            )
        return Complete({self.name: outcome["output"]}, changes)

    async def _execute(self, session: _Session, state: dict[str, Any]) -> dict[str, Any]:
        """Run the agent with the journal; return its output, or the wait that stopped it."""
        await session.open()
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt(state)
        deps = None if self.deps is None else self.deps(state)
        token = _session.set(session)
        suspended: _Suspend | None = None
        try:
            with replay_scope():
                result = await self.agent.run(prompt, deps=deps)
        except BaseException as error:
            found = _find(error, _Suspend)
            if found is None:
                lost = _find(error, LeaseLost)
                if lost is not None and lost is not error:
                    raise lost from error
                raise
            assert isinstance(found, _Suspend)
            suspended = found
        finally:
            _session.reset(token)
        cp = await session.latest_run()
        taken = session.taken_by_name(cp)
        if suspended is not None:
            wake = None if suspended.wake_at is None else suspended.wake_at.isoformat()
            return {"wait": suspended.signal, "wake_at": wake, "taken": taken}
        value = self.output(result) if self.output is not None else result.output
        return {"output": to_jsonable_python(value), "taken": taken}


def read_journal(store: Store, run_id: str, step_name: str = "agent") -> dict[str, Any]:
    """Return the journal entries (persisted name -> JSON result) of one agent step."""
    cp = store.load(journal_run_id(run_id, step_name))
    if cp is None:
        return {}
    entries = cp.state.get("entries")
    return dict(entries) if isinstance(entries, dict) else {}


async def adurable_agent_run(
    store: Store,
    run_id: str,
    agent: AbstractAgent[Any, Any],
    prompt: str,
    *,
    deps: Any = None,
    lease: float | timedelta | None = None,
) -> Any:
    """Run ``agent`` on ``prompt`` as the stepstone run ``run_id``; return its output (JSON).

    Calling it again after a crash resumes the run: finished model requests and tool calls
    are replayed from the journal, not repeated. A run waiting for an external event
    raises ``stepstone.Suspended``; call again once the signal was sent.

    Raises:
        Suspended: the agent waits for the signal named in ``Suspended.waiting_for``.
        StepFailed: the agent run raised; the failure is saved on the run.
        InputMismatch: the run exists with another prompt.
    """
    step = AgentStep("agent", agent, _prompt, store=store, deps=lambda _: deps)
    state = await arun(run_id, [step], store, input={"prompt": prompt}, lease=lease)
    return state["agent"]


def durable_agent_run(
    store: Store,
    run_id: str,
    agent: AbstractAgent[Any, Any],
    prompt: str,
    *,
    deps: Any = None,
    lease: float | timedelta | None = None,
) -> Any:
    """``adurable_agent_run`` for sync code (``stepstone.run`` underneath)."""
    from .._runner import run  # noqa: PLC0415

    step = AgentStep("agent", agent, _prompt, store=store, deps=lambda _: deps)
    state = run(run_id, [step], store, input={"prompt": prompt}, lease=lease)
    return state["agent"]


def _prompt(state: dict[str, Any]) -> str:
    return str(state["prompt"])
