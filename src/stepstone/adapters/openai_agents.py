"""OpenAI Agents SDK runs on stepstone (``pip install 'stepstone[openai-agents]'``).

Three pieces, each on the SDK's public hooks only (``ModelProvider``/``Model``,
``FunctionTool``, ``RunState``, the ``Session`` protocol):

* ``StepstoneRunner.run(store, run_id, agent, input)`` (and ``run_sync``): the SDK's
  ``Runner.run`` as a durable stepstone run, in the shape of DBOS's ``DBOSRunner``. The
  run config's model provider is wrapped (``StepstoneModelProvider``) so that every
  ``Model.get_response`` is a journaled unit, and the starting agent's function tools are
  wrapped too (``durable_tool``). ``AgentRunStep`` is the same as one step of a stepstone
  ``Workflow`` that workers serve.
* Durable approvals: a run whose tools need approval is saved ``waiting`` (its
  ``RunState`` in the store) and answered by a stepstone signal (``approve``/``reject``,
  or ``stepstone runs signal RUN approval --data '{"call_id": "c1", "approved": true}'``),
  days later, from any process; the next ``StepstoneRunner.run`` or a worker resumes it.
* ``StepstoneSession``: the SDK's conversation memory in any stepstone store, every change
  a compare-and-swap, so two concurrent turns never interleave or lose items.

Records (all kept at status ``done``: no worker ever claims them), each id under the
prefix ``openai-agents:`` (longer than 1,024 characters: the rest becomes its SHA-256):

* ``openai-agents:RUN_ID/STEP/NAME``: one journal entry of agent step STEP of run RUN_ID,
  written once (compare-and-swap on "nothing stored yet"; the first writer wins and every
  replay reads its value). NAME is ``get_response`` (``get_response#2``, ... by encounter);
  inside a durable tool call ``tool:TOOL:CALL_ID/get_response``; ``tool:TOOL:CALL_ID`` for
  a durable tool's output; ``pause#K`` (the ``RunState`` at the K-th approval pause) and
  ``resume#K`` (the decisions it was resumed with); ``session.get_items#N`` for a session
  read inside the run. Model responses are stored as the SDK's ``ModelResponse`` in
  pydantic's JSON mode (by alias), RunStates as the SDK's own JSON.
* ``openai-agents:session:SESSION_ID``: a session's head (its newest items, the list of
  its pages, the ids of the last writes applied), and
  ``openai-agents:session-page:SEQ-RANDOM:SESSION_ID``: older items, written once, never
  changed, deleted once no head refers to them.

How a run survives a crash. The agent runs again from its start (or from the RunState of
its last approval pause); each model call and durable tool call found in the journal
returns its recorded result instead of running, so finished model calls are never paid
twice and the one in flight at the crash runs at most once more. Names are counted per
scope, and a durable tool's scope is its call id (the SDK runs tool calls concurrently):
replays line up whatever the scheduling. Two units in flight at once in one scope (a tool
that gathers two sub-agents, say) are refused with ``ConcurrentUnits``. Tools not wrapped
run again on resume.

A second process resuming a run another one executes gets ``stepstone.RunOwned`` (the
run's lease, itself a compare-and-swap), so a restored ``RunState`` is never resumed
twice at once, as the SDK's documentation requires.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import random
from collections.abc import Callable, Coroutine, Generator
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

try:
    import agents  # noqa: F401 - fail here, naming the extra, rather than deeper
except ImportError as exc:  # pragma: no cover - the tests run with the extra installed
    raise ImportError(
        "stepstone.adapters.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'stepstone[openai-agents]'"
    ) from exc

import pydantic
from agents import Agent, FunctionTool, ModelResponse, RunConfig, Runner, RunState
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.run import DEFAULT_MAX_TURNS
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .._checkpoint import MAX_RUN_ID_LENGTH, Checkpoint, evolve, utcnow
from .._codec import encode_state
from .._control import asignal, signal
from .._errors import ConflictError, InvalidState, InvalidWorkflow, StepstoneError
from .._observe import logger
from .._steps import RetryPolicy, Step, StepContext, _check_name, idempotency_key
from .._store import Store
from .._suspend import Complete, SuspendingStep, Wait

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import TResponseInputItem, TResponseStreamEvent
    from agents.lifecycle import RunHooks
    from agents.model_settings import ModelSettings
    from agents.tool import Tool
    from agents.tool_context import ToolContext
    from openai.types.responses.response_prompt_param import ResponsePromptParam

    from .._core import Effect, Plan

__all__ = [
    "PREFIX",
    "AgentRunStep",
    "ConcurrentUnits",
    "StepstoneModel",
    "StepstoneModelProvider",
    "StepstoneRunner",
    "StepstoneSession",
    "aapprove",
    "apending_approvals",
    "approve",
    "areject",
    "durable_tool",
    "journal_record_id",
    "pending_approvals",
    "reject",
]

#: The head of every record this adapter writes.
PREFIX = "openai-agents:"
#: Version of the records' layout (``state["format"]``).
FORMAT = 1
#: The signal that carries approvals, unless ``approval_signal=`` says otherwise.
APPROVAL_SIGNAL = "approval"
# Each retry means another writer changed the record between our load and our save.
_MAX_TRIES = 200
_RESPONSE = pydantic.TypeAdapter(ModelResponse)
_MISSING: Any = object()
T = TypeVar("T")


class ConcurrentUnits(StepstoneError):
    """Two journaled units of one scope of an agent run were in flight at once.

    Their encounter counters would depend on scheduling, so a replay could hand one
    call's recorded result to another: refused instead.
    """


def _record_id(rest: str) -> str:
    plain = PREFIX + rest
    if len(plain) <= MAX_RUN_ID_LENGTH:
        return plain
    return PREFIX + "~" + hashlib.sha256(rest.encode("utf-8", "surrogatepass")).hexdigest()


def journal_record_id(run_id: str, step_name: str, key: str) -> str:
    """Return the id of the record holding journal entry ``key`` of one agent step."""
    return _record_id(f"{run_id}/{step_name}/{key}")


def _done_record(record_id: str, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(run_id=record_id, step=0, state=state, step_names=("record",), total_steps=1)


def _json(value: Any, what: str) -> Any:
    """Return ``value`` in its JSON form, or raise ``InvalidWorkflow`` saying what it is."""
    try:
        plain = to_jsonable_python(value, by_alias=True)
        return encode_state({"value": plain})[1]["value"]
    except (InvalidState, PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidWorkflow(f"{what} is not JSON ({exc}); stepstone journals JSON only") from None


async def _backoff(attempt: int) -> None:
    # Jittered, growing: writers that collide once do not collide in lockstep again.
    await asyncio.sleep(random.uniform(0, 0.002 * min(attempt, 25)))


# --- the journal of one agent step -----------------------------------------------------


class _Journal:
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

    async def _load(self, record_id: str) -> Checkpoint | None:
        if self.sync:
            return self.store.load(record_id)
        return await self.store.aload(record_id)

    async def _save(self, cp: Checkpoint) -> Checkpoint:
        if self.sync:
            return self.store.save(cp)
        return await self.store.asave(cp)

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

    async def get(self, key: str) -> Any:
        """Return the value recorded for ``key``, or ``_MISSING``."""
        cp = await self._load(journal_record_id(self.run_id, self.step_name, key))
        if cp is None or not self._ours(cp, key):
            return _MISSING
        return cp.state.get("value")

    async def lookup(self, scope: str, key: str) -> Any:
        """``get`` for a counted name of ``scope``; ``_MISSING`` at once after a miss there."""
        if scope in self.missed:
            return _MISSING
        found = await self.get(key)
        if found is _MISSING:
            self.missed.add(scope)
        return found

    async def put(self, key: str, value: Any) -> Any:
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
        intended = _done_record(record_id, state)
        for _ in range(_MAX_TRIES):
            try:
                await self._save(intended)
            except ConflictError:
                existing = await self._load(record_id)
                if existing is None:
                    intended = _done_record(record_id, state)
                    continue
                if self._ours(existing, key):
                    return existing.state.get("value")
                intended = evolve(existing, state=state)  # a deleted run's: replace it
                continue
            return value
        raise ConflictError(f"journal entry {record_id!r}: too many concurrent writers", record_id)


_journal: ContextVar[_Journal | None] = ContextVar("stepstone_openai_journal", default=None)
#: Where journal names are counted: "" for the agent run, ``tool:NAME:CALL_ID/`` inside a
#: durable tool call (copied into the tasks a tool starts, as contextvars are).
_scope: ContextVar[str] = ContextVar("stepstone_openai_scope", default="")


class _Fatal(BaseException):
    """Carries a ``ConcurrentUnits`` through the SDK to the step.

    A ``BaseException``: the SDK turns a tool's ``Exception`` into a message to the model,
    which would journal a scheduling accident as the tool's result.
    """

    def __init__(self, error: ConcurrentUnits) -> None:
        super().__init__(str(error))
        self.error = error


def _find_fatal(error: BaseException) -> _Fatal | None:
    if isinstance(error, _Fatal):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _find_fatal(inner)
            if found is not None:
                return found
    return None


@contextlib.asynccontextmanager
async def _unit(journal: _Journal, scope: str) -> Any:
    if scope in journal.busy:
        raise _Fatal(
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


# --- models and tools ------------------------------------------------------------------


class StepstoneModel(Model):
    """A ``Model`` whose ``get_response`` is journaled inside a stepstone agent run.

    Outside one it is the wrapped model. Streaming is not journaled: inside a stepstone
    run ``stream_response`` is refused (use ``StepstoneRunner.run``, not ``run_streamed``).
    """

    def __init__(self, model: Model, name: str | None = None) -> None:
        self.model = model
        self.name = name

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        async def call() -> ModelResponse:
            return await self.model.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )

        journal = _journal.get()
        if journal is None:
            return await call()
        scope = _scope.get()
        key = journal.next_name(f"{scope}get_response")
        found = await journal.lookup(scope, key)
        if found is _MISSING:
            async with _unit(journal, scope):
                response = await call()
            payload = {
                "model": self.name,
                "response": _RESPONSE.dump_python(response, mode="json", by_alias=True),
            }
            found = await journal.put(key, payload)
            journal.executed += 1
        else:
            journal.replayed += 1
        return _RESPONSE.validate_python(found["response"])

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        if _journal.get() is not None:
            raise InvalidWorkflow(
                "streamed model responses are not journaled: inside a stepstone run use "
                "StepstoneRunner.run (not Runner.run_streamed)"
            )
        return self.model.stream_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )

    async def close(self) -> None:
        await self.model.close()


class StepstoneModelProvider(ModelProvider):
    """Wraps a ``ModelProvider``: every model it returns is a ``StepstoneModel``."""

    def __init__(self, provider: ModelProvider) -> None:
        self.provider = provider

    def get_model(self, model_name: str | None) -> Model:
        model = self.provider.get_model(model_name)
        return model if isinstance(model, StepstoneModel) else StepstoneModel(model, model_name)

    async def aclose(self) -> None:
        await self.provider.aclose()


def durable_tool(tool: FunctionTool) -> FunctionTool:
    """Return a copy of ``tool`` whose calls are journaled inside a stepstone agent run.

    A call's output (JSON) is recorded under ``tool:NAME:CALL_ID`` and returned on every
    replay instead of calling the tool again; model calls made inside it (a sub-agent)
    are counted in the call's own scope. Outside a stepstone run it is ``tool``.
    """
    if not isinstance(tool, FunctionTool):
        raise InvalidWorkflow(f"durable_tool takes a FunctionTool, got {type(tool).__name__}")
    if getattr(tool.on_invoke_tool, "_stepstone_durable", False):
        return tool
    invoke = tool.on_invoke_tool
    name = tool.name

    async def on_invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        journal = _journal.get()
        if journal is None:
            return await invoke(ctx, arguments)
        call_id = getattr(ctx, "tool_call_id", None) or ""
        if not call_id:
            raise InvalidWorkflow(
                f"tool {name!r} was called without a call id; a durable tool's result is "
                "recorded under its call id (the model must give every tool call one)"
            )
        key = f"tool:{name}:{call_id}"
        found = await journal.get(key)
        if found is not _MISSING:
            journal.replayed += 1
            return found["output"]
        token = _scope.set(f"{key}/")
        try:
            output = await invoke(ctx, arguments)
        finally:
            _scope.reset(token)
        recorded = await journal.put(key, {"output": _json(output, f"tool {name!r}'s output")})
        journal.executed += 1
        return recorded["output"]

    on_invoke._stepstone_durable = True  # type: ignore[attr-defined]
    wrapped = copy.copy(tool)
    wrapped.on_invoke_tool = on_invoke
    return wrapped


def _durable_agent(
    agent: Agent[Any], durable_tools: bool, done: dict[int, Agent[Any]] | None = None
) -> Agent[Any]:
    """Return a copy of ``agent`` (and of the agents it hands off to) with model instances
    and, if ``durable_tools``, function tools journaled; names are kept, so a stored
    ``RunState`` restores onto the copy."""
    done = {} if done is None else done
    if id(agent) in done:
        return done[id(agent)]
    changes: dict[str, Any] = {}
    if isinstance(agent.model, Model) and not isinstance(agent.model, StepstoneModel):
        changes["model"] = StepstoneModel(agent.model)
    if durable_tools:
        changes["tools"] = [
            durable_tool(t) if isinstance(t, FunctionTool) else t for t in agent.tools
        ]
    copied = agent.clone(**changes)
    done[id(agent)] = copied  # before the handoffs: agents may hand off in a cycle
    # Agents named directly in ``handoffs``; a ``Handoff`` object builds its agent itself.
    copied.handoffs = [
        _durable_agent(h, durable_tools, done) if isinstance(h, Agent) else h
        for h in agent.handoffs
    ]
    return copied


def _durable_config(run_config: RunConfig | None) -> RunConfig:
    config = run_config if run_config is not None else RunConfig()
    if not isinstance(config, RunConfig):
        raise InvalidWorkflow(f"run_config must be a RunConfig, got {type(config).__name__}")
    changes: dict[str, Any] = {}
    if not isinstance(config.model_provider, StepstoneModelProvider):
        changes["model_provider"] = StepstoneModelProvider(config.model_provider)
    if isinstance(config.model, Model) and not isinstance(config.model, StepstoneModel):
        changes["model"] = StepstoneModel(config.model)
    return dataclasses.replace(config, **changes) if changes else config


# --- approvals -------------------------------------------------------------------------


def _approval_payload(
    call_id: str | None, approved: bool, always: bool, message: str | None
) -> dict[str, Any]:
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise InvalidWorkflow(f"call_id must be a non-empty str or None (all), got {call_id!r}")
    if message is not None and not isinstance(message, str):
        raise InvalidWorkflow("message must be a str or None")
    return {"call_id": call_id, "approved": approved, "always": always, "message": message}


def approve(
    store: Store,
    run_id: str,
    call_id: str | None = None,
    *,
    always: bool = False,
    signal_name: str = APPROVAL_SIGNAL,
) -> bool:
    """Approve the tool call ``call_id`` (None: every pending one) of a waiting agent run.

    The approval is a stepstone signal: stored in the run by compare-and-swap, taken by
    whichever process resumes the run next (a worker, or ``StepstoneRunner.run``).
    ``always`` approves that tool for the rest of the run (the SDK's ``always_approve``).
    """
    payload = _approval_payload(call_id, True, always, None)
    return signal(store, run_id, signal_name, payload)


def reject(
    store: Store,
    run_id: str,
    call_id: str | None = None,
    *,
    message: str | None = None,
    always: bool = False,
    signal_name: str = APPROVAL_SIGNAL,
) -> bool:
    """Reject the tool call ``call_id`` (None: every pending one); ``message`` goes to the model."""
    payload = _approval_payload(call_id, False, always, message)
    return signal(store, run_id, signal_name, payload)


async def aapprove(
    store: Store,
    run_id: str,
    call_id: str | None = None,
    *,
    always: bool = False,
    signal_name: str = APPROVAL_SIGNAL,
) -> bool:
    """Async ``approve``."""
    payload = _approval_payload(call_id, True, always, None)
    return await asignal(store, run_id, signal_name, payload)


async def areject(
    store: Store,
    run_id: str,
    call_id: str | None = None,
    *,
    message: str | None = None,
    always: bool = False,
    signal_name: str = APPROVAL_SIGNAL,
) -> bool:
    """Async ``reject``."""
    payload = _approval_payload(call_id, False, always, message)
    return await asignal(store, run_id, signal_name, payload)


def _decide(pending: list[dict[str, Any]], payloads: list[Any]) -> dict[str, dict[str, Any]]:
    """Return the decision per pending call id that ``payloads`` make (the first one wins)."""
    ids = [p["call_id"] for p in pending]
    decisions: dict[str, dict[str, Any]] = {}
    for payload in payloads:
        if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
            # Ignored rather than failing the run at every resume, and said so.
            logger.warning(
                "an approval signal's payload is not {'call_id': str | None, 'approved': "
                "bool, ...}; ignored: %.200r",
                payload,
            )
            continue
        target = payload.get("call_id")
        for call_id in ids if target is None else [target]:
            if call_id in ids and call_id not in decisions:
                decisions[call_id] = {
                    "approved": payload["approved"],
                    "always": payload.get("always") is True,
                    "message": payload.get("message")
                    if isinstance(payload.get("message"), str)
                    else None,
                }
    return decisions


def _interruptions(result: Any) -> list[dict[str, Any]]:
    return [
        {
            "call_id": item.call_id or "",  # "" for an approval without one: null decides it
            "tool": item.name,
            "arguments": item.arguments,
            "agent": getattr(item.agent, "name", None),
        }
        for item in result.interruptions
    ]


async def _latest_pause(journal: _Journal) -> tuple[int, Any]:
    """Return ``(K, entry)`` of the newest ``pause#K`` entry, or ``(0, None)``."""
    k, entry = 0, None
    while True:
        found = await journal.get(f"pause#{k + 1}")
        if found is _MISSING:
            return k, entry
        k, entry = k + 1, found


def pending_approvals(store: Store, run_id: str, step_name: str = "agent") -> list[dict[str, Any]]:
    """Return the tool calls a waiting agent run waits on: call_id, tool, arguments, agent.

    Empty when the run is not waiting for an approval.
    """
    cp = store.load(run_id)
    if cp is None or cp.status != "waiting":
        return []
    journal = _Journal(store, run_id, step_name, (cp.created_at or utcnow()).isoformat(), sync=True)
    return _drive(_pending(journal))


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (a sync journal's), even inside an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()  # pragma: no cover - a sync journal awaits nothing that suspends
    raise RuntimeError("a sync journal read suspended")  # pragma: no cover


async def apending_approvals(
    store: Store, run_id: str, step_name: str = "agent"
) -> list[dict[str, Any]]:
    """Async ``pending_approvals``."""
    cp = await store.aload(run_id)
    if cp is None or cp.status != "waiting":
        return []
    journal = _Journal(
        store, run_id, step_name, (cp.created_at or utcnow()).isoformat(), sync=False
    )
    return await _pending(journal)


async def _pending(journal: _Journal) -> list[dict[str, Any]]:
    k, pause = await _latest_pause(journal)
    if pause is None or await journal.get(f"resume#{k}") is not _MISSING:
        return []
    return list(pause["interruptions"])


# --- the step --------------------------------------------------------------------------


class AgentRunStep(SuspendingStep):
    """A step that runs an OpenAI agent durably; its final output is merged under ``name``.

    ``input`` is the agent's input (a str or a list of input items), or a function of the
    run's state returning it. ``store`` is where the journal is kept: the store the run
    lives in (``StepstoneRunner`` passes its own). While tool calls wait for approval the
    step saves the run ``waiting`` for the signal ``approval_signal``; it completes with
    the final output in its JSON form. ``retry`` retries a failed agent run; the retry
    replays the journal, so finished model calls are not paid again.
    """

    __slots__ = (
        "agent",
        "approval_signal",
        "context",
        "input",
        "max_turns",
        "options",
        "run_config",
        "store",
    )

    def __init__(
        self,
        name: str,
        agent: Agent[Any],
        input: str | list[Any] | Callable[[dict[str, Any]], Any],
        *,
        store: Store | None = None,
        context: Any = None,
        max_turns: int | None = DEFAULT_MAX_TURNS,
        run_config: RunConfig | None = None,
        durable_tools: bool = True,
        approval_signal: str = APPROVAL_SIGNAL,
        retry: RetryPolicy | None = None,
        **options: Any,
    ) -> None:
        self.name = _check_name(name)
        if not isinstance(agent, Agent):
            raise InvalidWorkflow(f"AgentRunStep {name!r}: agent must be an agents.Agent")
        if store is not None and not isinstance(store, Store):
            raise InvalidWorkflow(f"AgentRunStep {name!r}: store must be a stepstone Store")
        if not isinstance(approval_signal, str) or not 1 <= len(approval_signal) <= 200:
            raise InvalidWorkflow(f"AgentRunStep {name!r}: approval_signal is 1-200 characters")
        for bad in ("previous_response_id", "conversation_id", "auto_previous_response_id"):
            if options.get(bad):
                raise InvalidWorkflow(
                    f"AgentRunStep {name!r}: {bad} keeps the conversation on OpenAI's servers, "
                    "which a replay cannot rewind; use a StepstoneSession"
                )
        self.agent = _durable_agent(agent, durable_tools)
        self.input = input
        self.store = store
        self.context = context
        self.max_turns = max_turns
        self.run_config = _durable_config(run_config)
        self.approval_signal = approval_signal
        self.retry = retry
        self.options = options

    def __repr__(self) -> str:
        return f"AgentRunStep({self.name!r}, {self.agent.name!r})"

    def ready(self, cp: Checkpoint) -> bool:
        received = sum(1 for s in cp.signals if s.name == self.approval_signal)
        return received > cp.consumed.get(self.approval_signal, 0)

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Complete | Wait]:
        from .._core import Call  # noqa: PLC0415 - the core imports the steps, not back

        store = self.store or _plan_store.get()
        if store is None:
            raise InvalidWorkflow(
                f"AgentRunStep {self.name!r} has no store for its journal: pass store= (the "
                "store the run lives in), or run it with StepstoneRunner.run"
            )
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
        journal = _Journal(
            store, plan.run_id, self.name, (cp.created_at or utcnow()).isoformat(), sync=sync
        )
        signals = [s.payload for s in cp.signals if s.name == self.approval_signal]
        consumed = cp.consumed.get(self.approval_signal, 0)

        async def body() -> dict[str, Any]:
            return await self._execute(journal, state, signals, consumed)

        if sync:

            def call_sync(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
                return asyncio.run(body())

            step = Step(self.name, call_sync)
        else:

            async def call_async(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
                return await body()

            step = Step(self.name, call_async)
        outcome: dict[str, Any] = yield Call(step, state, ctx, cp)
        if asyncio.iscoroutine(outcome):
            outcome.close()
            raise InvalidWorkflow(
                f"AgentRunStep {self.name!r}: stepstone.run (sync) was called from inside a "
                "running event loop; there, use `await stepstone.arun(...)`"
            )
        changes: dict[str, Any] = {}
        if outcome["upto"] > consumed:
            changes["consumed"] = {**cp.consumed, self.approval_signal: outcome["upto"]}
        if outcome.get("wait"):
            return Wait(f"signal {self.approval_signal}", None, changes)
        return Complete({self.name: outcome["output"]}, changes)

    async def _execute(
        self, journal: _Journal, state: dict[str, Any], signals: list[Any], consumed: int
    ) -> dict[str, Any]:
        """Run the agent with the journal: its output, or the approval it waits for.

        Approvals come from the run's signals: pause K was recorded with how many signals
        had been consumed then (``start``); every signal after that decides its calls. The
        decisions are recorded (``resume#K``) before the agent resumes, so a replay
        resumes with the same ones whatever arrived since.
        """
        token = _journal.set(journal)
        try:
            k, pause = await _latest_pause(journal)
            while True:
                upto = consumed
                if pause is None:
                    agent_input: Any = self.input(state) if callable(self.input) else self.input
                    journal.counters, journal.missed = {}, set()
                else:
                    resumed = await journal.get(f"resume#{k}")
                    if resumed is _MISSING:
                        decisions = _decide(pause["interruptions"], signals[pause["start"] :])
                        if len(decisions) < len(pause["interruptions"]):
                            return {"wait": True, "upto": len(signals)}
                        resumed = await journal.put(
                            f"resume#{k}", {"upto": len(signals), "decisions": decisions}
                        )
                    upto = max(upto, resumed["upto"])
                    agent_input = await self._restore(pause["state"], resumed["decisions"])
                    journal.counters, journal.missed = dict(pause["counters"]), set()
                result = await Runner.run(
                    self.agent,
                    agent_input,
                    context=self.context,
                    max_turns=self.max_turns,
                    run_config=self.run_config,
                    **self.options,
                )
                if not result.interruptions:
                    output = _json(result.final_output, "the agent's final output")
                    return {"output": output, "upto": upto}
                k += 1
                pause = await journal.put(
                    f"pause#{k}",
                    {
                        "state": json.loads(result.to_state().to_string()),
                        "counters": dict(journal.counters),
                        "start": upto,
                        "interruptions": _interruptions(result),
                    },
                )
        except BaseException as error:
            fatal = _find_fatal(error)
            if fatal is None:
                raise
            raise fatal.error from None
        finally:
            _journal.reset(token)

    async def _restore(self, stored: dict[str, Any], decisions: dict[str, Any]) -> RunState[Any]:
        run_state: RunState[Any] = await RunState.from_string(
            self.agent,
            json.dumps(stored),
            **({"context_override": self.context} if self.context is not None else {}),
        )
        for item in run_state.get_interruptions():
            decision = decisions.get(item.call_id or "")
            if decision is None:  # pragma: no cover - every pending call was decided
                continue
            if decision["approved"]:
                run_state.approve(item, always_approve=decision["always"])
            else:
                run_state.reject(
                    item, always_reject=decision["always"], rejection_message=decision["message"]
                )
        return run_state


# The store an AgentRunStep journals to: the runner's effects carry no store, so the
# entry points set it for the run.
_plan_store: ContextVar[Store | None] = ContextVar("stepstone_openai_store", default=None)


@contextlib.contextmanager
def _using(store: Store) -> Generator[None]:
    token = _plan_store.set(store)
    try:
        yield
    finally:
        _plan_store.reset(token)


class StepstoneRunner:
    """``Runner.run`` as a durable stepstone run: the extra arguments are a store and a run id.

    Example:
        ``output = await StepstoneRunner.run(store, "ticket-42", agent, "refund order 7")``
    """

    @classmethod
    def _step(
        cls,
        agent: Agent[Any],
        *,
        context: Any,
        max_turns: int | None,
        hooks: RunHooks[Any] | None,
        run_config: RunConfig | None,
        session: Any,
        error_handlers: Any,
        durable_tools: bool,
        approval_signal: str,
        retry: RetryPolicy | None,
    ) -> AgentRunStep:
        options: dict[str, Any] = {}
        if hooks is not None:
            options["hooks"] = hooks
        if session is not None:
            options["session"] = session
        if error_handlers is not None:
            options["error_handlers"] = error_handlers
        return AgentRunStep(
            "agent",
            agent,
            lambda state: state["input"],
            context=context,
            max_turns=max_turns,
            run_config=run_config,
            durable_tools=durable_tools,
            approval_signal=approval_signal,
            retry=retry,
            **options,
        )

    @staticmethod
    def _input(input: Any) -> dict[str, Any] | None:
        if input is None:
            return None
        if isinstance(input, RunState):
            raise InvalidWorkflow(
                "StepstoneRunner keeps the RunState itself: pass the original input, and "
                "answer approvals with approve()/reject() (stepstone signals)"
            )
        return {"input": _json(input, "the agent's input")}

    @classmethod
    async def run(
        cls,
        store: Store,
        run_id: str,
        starting_agent: Agent[Any],
        input: str | list[Any] | None = None,
        *,
        context: Any = None,
        max_turns: int | None = DEFAULT_MAX_TURNS,
        hooks: RunHooks[Any] | None = None,
        run_config: RunConfig | None = None,
        session: Any = None,
        error_handlers: Any = None,
        durable_tools: bool = True,
        approval_signal: str = APPROVAL_SIGNAL,
        lease: float | timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Run ``starting_agent`` on ``input`` as the stepstone run ``run_id``; return its output.

        Calling it again after a crash (``input`` may be None then) resumes the run:
        finished model calls and durable tool calls are replayed from the journal, not
        repeated. The output is the final output in its JSON form. ``hooks`` see the
        replayed calls too (they run again on resume, as the agent's own code does).

        Raises:
            Suspended: tool calls wait for approval (``pending_approvals`` lists them);
                answer with ``approve``/``reject``, then call again (or let a worker).
            RunOwned: another process is executing (or resuming) the run right now.
            StepFailed: the agent run raised; the failure is saved on the run.
            InputMismatch: the run exists with another input.
        """
        from .._runner import arun  # noqa: PLC0415

        step = cls._step(
            starting_agent,
            context=context,
            max_turns=max_turns,
            hooks=hooks,
            run_config=run_config,
            session=session,
            error_handlers=error_handlers,
            durable_tools=durable_tools,
            approval_signal=approval_signal,
            retry=retry,
        )
        with _using(store):
            state = await arun(run_id, [step], store, input=cls._input(input), lease=lease)
        return state["agent"]

    @classmethod
    def run_sync(
        cls,
        store: Store,
        run_id: str,
        starting_agent: Agent[Any],
        input: str | list[Any] | None = None,
        *,
        context: Any = None,
        max_turns: int | None = DEFAULT_MAX_TURNS,
        hooks: RunHooks[Any] | None = None,
        run_config: RunConfig | None = None,
        session: Any = None,
        error_handlers: Any = None,
        durable_tools: bool = True,
        approval_signal: str = APPROVAL_SIGNAL,
        lease: float | timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """``run`` for sync code (``stepstone.run`` underneath; not inside an event loop)."""
        from .._runner import run  # noqa: PLC0415

        step = cls._step(
            starting_agent,
            context=context,
            max_turns=max_turns,
            hooks=hooks,
            run_config=run_config,
            session=session,
            error_handlers=error_handlers,
            durable_tools=durable_tools,
            approval_signal=approval_signal,
            retry=retry,
        )
        with _using(store):
            state = run(run_id, [step], store, input=cls._input(input), lease=lease)
        return state["agent"]


# --- the session -----------------------------------------------------------------------


def _session_head_id(session_id: str) -> str:
    return _record_id(f"session:{session_id}")


def _session_page_id(session_id: str, key: str) -> str:
    return _record_id(f"session-page:{key}:{session_id}")


def _size(items: list[Any]) -> int:
    return len(json.dumps(items, ensure_ascii=False, separators=(",", ":")))


class StepstoneSession:
    """The SDK's ``Session`` (conversation memory) in a stepstone store, on every backend.

    Every change is one compare-and-swap on the session's head record, retried on
    conflict, so concurrent turns (threads, tasks, processes) never interleave a batch
    or lose an item. When the head's items pass ``page_bytes`` of JSON, the older ones
    move to a write-once page record, so no record grows past a backend's limit (Cosmos
    DB: 2 MB). Inside a stepstone agent run, reads are journaled and writes applied once
    per run (a replay neither sees the history its crashed attempt added nor adds it
    again).

    Example:
        ``session = StepstoneSession("chat-42", store)``, then
        ``StepstoneRunner.run(store, run_id, agent, text, session=session)`` or the SDK's own
        ``Runner.run(agent, text, session=session)``.
    """

    #: Write ids (of writes made inside durable runs) the head remembers, newest last.
    APPLIED_KEPT = 64

    def __init__(
        self,
        session_id: str,
        store: Store,
        *,
        page_bytes: int = 256_000,
        session_settings: Any = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidWorkflow(f"session_id must be a non-empty str, got {session_id!r}")
        if not isinstance(store, Store):
            raise InvalidWorkflow(f"store must be a stepstone Store, got {type(store).__name__}")
        if isinstance(page_bytes, bool) or not isinstance(page_bytes, int) or page_bytes < 1:
            raise InvalidWorkflow(f"page_bytes must be a positive int, got {page_bytes!r}")
        self.session_id = session_id
        self.store = store
        self.page_bytes = page_bytes
        self.session_settings = session_settings
        self.head_id = _session_head_id(session_id)
        #: Compare-and-swap conflicts met (and retried) by this object's writes.
        self.conflicts = 0

    def _empty(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "session": self.session_id,
            "items": [],
            "pages": [],
            "next_page": 1,
            "applied": [],
        }

    async def _head(self) -> tuple[Checkpoint | None, dict[str, Any]]:
        cp = await self.store.aload(self.head_id)
        if cp is None:
            return None, self._empty()
        if cp.state.get("session") != self.session_id:
            raise ConflictError(
                f"record {self.head_id!r} exists but is not the head of session "
                f"{self.session_id!r}",
                self.head_id,
            )
        return cp, cp.state

    async def _commit(self, cp: Checkpoint | None, state: dict[str, Any]) -> bool:
        """Save ``state`` as the head over ``cp``; return False on a conflict (retry)."""
        intended = _done_record(self.head_id, state) if cp is None else evolve(cp, state=state)
        try:
            await self.store.asave(intended)
        except ConflictError:
            self.conflicts += 1
            return False
        return True

    async def _drop_pages(self, keys: list[str]) -> None:
        # Best effort: a page no head refers to is never read; a failed delete leaves
        # a dead record, not a wrong session.
        for key in keys:
            with contextlib.suppress(Exception):
                await self.store.adelete(_session_page_id(self.session_id, key))

    async def _write_page(self, seq: int, items: list[Any]) -> str:
        """Create a page of ``items``; return its key, ``SEQ-RANDOM``.

        The random part makes every writer's page its own: a writer that loses the head's
        compare-and-swap deletes only the page it made, never one another head refers to.
        """
        key = f"{seq}-{os.urandom(6).hex()}"
        state = {"format": FORMAT, "session": self.session_id, "items": items}
        await self.store.asave(_done_record(_session_page_id(self.session_id, key), state))
        return key

    @staticmethod
    def _write_id() -> tuple[_Journal, str] | None:
        journal = _journal.get()
        if journal is None:
            return None
        return journal, journal.next_name(f"{_scope.get()}session.write")

    @staticmethod
    def _applied(state: dict[str, Any], write: tuple[_Journal, str] | None) -> Any:
        if write is None:
            return _MISSING
        journal, key = write
        wid = f"{journal.run_id}/{journal.step_name}/{journal.run_created}/{key}"
        for applied, result in state.get("applied", []):
            if applied == wid:
                return result
        return _MISSING

    def _remember(
        self, state: dict[str, Any], write: tuple[_Journal, str] | None, result: Any
    ) -> None:
        if write is not None:
            journal, key = write
            wid = f"{journal.run_id}/{journal.step_name}/{journal.run_created}/{key}"
            state["applied"] = [*state.get("applied", []), [wid, result]][-self.APPLIED_KEPT :]

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """Return the history, oldest first; with ``limit``, only the newest ``limit`` items."""
        if limit is None and self.session_settings is not None:
            limit = getattr(self.session_settings, "limit", None)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidWorkflow(f"limit must be an int or None, got {limit!r}")
        journal = _journal.get()
        if journal is not None:
            scope = _scope.get()
            key = journal.next_name(f"{scope}session.get_items")
            found = await journal.lookup(scope, key)
            if found is not _MISSING:
                return list(found["items"])
            items = await self._read(limit)
            recorded = await journal.put(key, {"items": items})
            return list(recorded["items"])
        return await self._read(limit)

    async def _read(self, limit: int | None) -> list[Any]:
        if limit is not None and limit <= 0:
            return []
        for attempt in range(_MAX_TRIES):
            _, state = await self._head()
            items = list(state["items"])
            complete = True
            for seq, _count in reversed(state["pages"]):
                if limit is not None and len(items) >= limit:
                    break
                page = await self.store.aload(_session_page_id(self.session_id, seq))
                if page is None:  # dropped by a pop or clear since we read the head
                    complete = False
                    break
                items = list(page.state["items"]) + items
            if complete:
                return items if limit is None else items[-limit:]
            await _backoff(attempt)
        raise ConflictError(
            f"session {self.session_id!r}: changed too often to be read", self.head_id
        )

    async def add_items(self, items: list[Any]) -> None:
        """Append ``items`` (one batch, kept together and in order) to the history."""
        if not isinstance(items, list):
            raise InvalidWorkflow(f"items must be a list, got {type(items).__name__}")
        batch = _json(items, "the session items")
        if not batch:
            return
        write = self._write_id()
        for attempt in range(_MAX_TRIES):
            cp, state = await self._head()
            if self._applied(state, write) is not _MISSING:
                return
            new = dict(state)
            old = list(state["items"])
            new["items"] = old + batch
            moved: str | None = None
            if old and _size(new["items"]) > self.page_bytes:
                # The head's older items become a page; the head keeps this batch.
                moved = await self._write_page(state["next_page"], old)
                new["pages"] = [*state["pages"], [moved, len(old)]]
                new["next_page"] = state["next_page"] + 1
                new["items"] = batch
            self._remember(new, write, None)
            if await self._commit(cp, new):
                return
            if moved is not None:
                await self._drop_pages([moved])
            await _backoff(attempt)
        raise ConflictError(
            f"session {self.session_id!r}: {_MAX_TRIES} other writers got in first", self.head_id
        )

    async def pop_item(self) -> Any:
        """Remove and return the newest item, or None when the history is empty."""
        write = self._write_id()
        for attempt in range(_MAX_TRIES):
            cp, state = await self._head()
            done = self._applied(state, write)
            if done is not _MISSING:
                return done
            new = dict(state)
            items = list(state["items"])
            dropped: list[str] = []
            if not items and state["pages"]:
                seq = state["pages"][-1][0]
                page = await self.store.aload(_session_page_id(self.session_id, seq))
                if page is None:
                    await _backoff(attempt)
                    continue
                items = list(page.state["items"])
                new["pages"] = state["pages"][:-1]
                dropped = [seq]
            if not items:
                return None
            popped = items.pop()
            new["items"] = items
            self._remember(new, write, popped)
            if await self._commit(cp, new):
                await self._drop_pages(dropped)
                return popped
            await _backoff(attempt)
        raise ConflictError(
            f"session {self.session_id!r}: {_MAX_TRIES} other writers got in first", self.head_id
        )

    async def clear_session(self) -> None:
        """Remove every item of the session."""
        write = self._write_id()
        for attempt in range(_MAX_TRIES):
            cp, state = await self._head()
            if cp is None or self._applied(state, write) is not _MISSING:
                return
            new = {**self._empty(), "next_page": state["next_page"], "applied": state["applied"]}
            self._remember(new, write, None)
            if await self._commit(cp, new):
                await self._drop_pages([seq for seq, _ in state["pages"]])
                return
            await _backoff(attempt)
        raise ConflictError(
            f"session {self.session_id!r}: {_MAX_TRIES} other writers got in first", self.head_id
        )
