"""``StepstoneDurability``: pydantic-ai's durable engine API on the journal; waits as signals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

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
)
from pydantic_ai.external_events import (
    ExternalEventError,
    ExternalEventWaiter,
    external_event_scope,
)
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext

from ..._budget import RAISE_SIGNAL
from ..._errors import InvalidWorkflow
from ..._store_time import plain
from ..._stream import _hooks as _stream
from ..._suspend import _due, pending_signals
from .._budget_gate import over_budget

if TYPE_CHECKING:
    from pydantic_ai.agent import AbstractAgent, EventStreamHandler
    from pydantic_ai.models import Model

from ._journal import (
    ConcurrentUnits,
    Session,
    Suspend,
    in_unit,
    session_var,
    sub_call,
    wait_token,
)

# --- the engine -----------------------------------------------------------------------


class Backend(JournalCallableOperationBackend[None]):
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
        session = session_var.get()
        if session is None or in_unit.get():
            # Nested in another unit's body (a sub-agent run inside a tool): that unit's
            # result is journaled as a whole, so what it does inside runs directly.
            return await body()
        key = session.next_name(name)
        if key in session.entries:
            # Its events, if it emitted any, were committed with its entry: not again.
            record_durable_unit(executed=False)
            return session.entries[key]
        if session.budgeted and "model.request" in name:
            # Spend budgets: at the run's limit, pause before this request (``_budget_gate``).
            await _gate(session)
        if session.busy is not None:
            raise ConcurrentUnits(
                f"run {session.run_id!r}: durable unit {key!r} started while {session.busy!r} "
                "was still running. Inside a stepstone run the units of one agent run execute "
                "one at a time (tool calls in the order of the model response), so that each "
                "name's encounter counter means the same call on every replay; do not start "
                "durable work concurrently (asyncio.gather) inside one agent run"
            )
        session.busy = key
        seq = session.take_seq()
        token = in_unit.set(True)
        # The unit's events are an attempt of their own, shown once its entry lands.
        scope = _stream.begin_call(seq, 1)
        try:
            payload = await body()
            ending, scope = scope, None
            streamed = None if ending is None else await _stream.aend(ending)
        finally:
            if scope is not None:
                _stream.abandon(scope)
            in_unit.reset(token)
            session.busy = None
        recorded = await session.record(key, payload, seq, streamed)
        record_durable_unit(executed=True)
        return recorded


async def _gate(session: Session) -> None:
    """Unwind the agent run waiting for ``budget.raise`` if the run is at its limit,
    counting the usage of this agent run's journaled model requests."""
    inputs = outputs = 0
    for key, value in session.entries.items():
        usage = value.get("usage") if "model.request" in key and isinstance(value, dict) else None
        if isinstance(usage, dict):
            inputs += int(usage.get("input_tokens") or 0)
            outputs += int(usage.get("output_tokens") or 0)
    cp = await session.latest_run()
    if over_budget(cp, inputs, outputs, session.prices) is not None:
        raise Suspend(RAISE_SIGNAL, None)


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
                ``emit_events`` sends them to the run's stream (``stepstone.stream``).
            name: The name in persisted step names; default the agent's ``name``.
        """
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._backend: Backend | None = None

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        self._backend = Backend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )
        super()._bind_to_agent(agent)

    @property
    def in_durable_context(self) -> bool:
        return session_var.get() is not None

    def get_durable_operation_backend(self) -> Backend:
        assert self._backend is not None, "bound by for_agent before any run"
        return self._backend

    def get_default_run_id(self) -> str | None:
        session = session_var.get()
        if session is None:
            return None
        # Replay-stable: the same on every execution of this step of this run.
        n = session.next_name("run_id").partition("#")[2] or "1"
        return f"{session.run_id}/{session.step_name}/{n}"

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        session = session_var.get()
        if session is None:
            return None
        key = session.next_name(f"{self.name}.run_start_time")
        if key in session.entries:
            return datetime.fromisoformat(session.entries[key])
        recorded = await session.record(key, (await session.store_now()).isoformat())
        return datetime.fromisoformat(recorded)

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        session = session_var.get()
        if session is None:
            return await super().wrap_run(ctx, handler=handler)
        with external_event_scope(Waiter(session, self.name)):
            return await super().wrap_run(ctx, handler=handler)


class Waiter(ExternalEventWaiter):
    """``wait_for_external_event`` inside a stepstone run: a stepstone signal, durably."""

    def __init__(self, session: Session, agent_name: str) -> None:
        self.session = session
        self.agent_name = agent_name

    async def wait(
        self,
        name: str,
        *,
        ask: Callable[[str], Awaitable[JsonValue]],
        timeout: timedelta | None,  # noqa: ASYNC109 - ExternalEventWaiter.wait's own signature
    ) -> JsonValue:
        session = self.session
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidWorkflow(
                f"a wait's name is its stepstone signal name: 1-200 characters, got {name!r}"
            )
        key = session.next_name(f"{self.agent_name}__external_event.{name}")
        if key in session.entries:
            return outcome_of(session.entries[key])
        ask_key = sub_call(key, "ask")
        if ask_key in session.entries:
            answer = session.entries[ask_key]
        else:
            answer = await session.record(ask_key, await ask(wait_token(session.run_id, name)))
        if answer is not None:
            return outcome_of(await session.record(key, {"payload": answer}))
        # The deadline is set and judged on the store's clock, as every timer is
        # (``_store_time``): the worker that resumes the wait judges its wake time so,
        # and a host whose clock is off the store's would otherwise end it early, or
        # resume it again and again until its own clock caught up.
        deadline: datetime | None = None
        if timeout is not None:
            deadline_key = sub_call(key, "deadline")
            if deadline_key in session.entries:
                due = session.entries[deadline_key]
            else:
                at = plain(await session.store_now()) + timeout
                due = await session.record(deadline_key, at.isoformat())
            deadline = datetime.fromisoformat(due)
        cp = await session.latest_run()
        taken = session.taken_signal_ids()
        for signal in pending_signals(cp, name):
            if signal.id not in taken:
                value = {"payload": signal.payload, "signal": name, "signal_id": signal.id}
                return outcome_of(await session.record(key, value))
        if deadline is not None and _due(deadline, await session.store_now()):
            value = {"error": f"no signal {name!r} arrived within {timeout}", "signal": name}
            return outcome_of(await session.record(key, value))
        raise Suspend(name, deadline)


def outcome_of(value: Any) -> JsonValue:
    if isinstance(value, dict) and "error" in value:
        raise ExternalEventError(str(value["error"]))
    payload: JsonValue = value["payload"] if isinstance(value, dict) else None
    return payload
