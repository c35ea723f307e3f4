"""``AgentStep`` and the one-call helpers: a pydantic-ai agent run as one durable step."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from pydantic_ai.durable_exec import (
    replay_scope,
)
from pydantic_ai.run import AgentRunResult
from pydantic_core import to_jsonable_python

from ..._budget import RAISE_SIGNAL, SPEND_KEY, Prices
from ..._checkpoint import Checkpoint
from ..._effects import Effect
from ..._errors import InvalidWorkflow, LeaseLost
from ..._runner import arun, run
from ..._spending import usage_charge
from ..._steps import RetryPolicy
from ..._store import Store
from ..._suspend import Complete, Wait, _due, pending_signals

if TYPE_CHECKING:
    from pydantic_ai.agent import AbstractAgent

    from ..._core import Plan
from .._agent_call import check_options, find, in_sync_run
from .._agent_step import AgentStepBase
from .._budget_gate import budgeted, unconsumed_raises
from .._journaled import channel, journaled, step_entries, with_journal
from ._capability import StepstoneDurability
from ._journal import Session, Suspend, journal_run_id, legacy_call, session_var

# --- the step -------------------------------------------------------------------------


class AgentStep(AgentStepBase):
    """A step that runs a pydantic-ai agent durably; its output is merged under ``name``.

    ``prompt`` is the user prompt, or a function of the run's state returning it;
    ``deps`` a function of the state returning the agent's dependencies. The agent must
    carry ``StepstoneDurability``. ``store`` is where the step's journal is kept: the
    store the run lives in (the runner hands steps no store). The step suspends the run
    while the agent waits for an external event (a stepstone signal of the wait's name),
    and completes with the agent's output in its JSON form (``to_jsonable_python``), or
    ``output(result)``. ``retry`` retries a failed agent run; the retry replays the
    journal, so finished units are not paid again.

    In a run with a spend budget (or given ``prices``), the agent run's usage is charged
    with its output, by the same save: its tokens, and dollars at ``prices``.
    """

    __slots__ = ("deps", "output", "prompt", "store")

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
        prices: Prices | None = None,
    ) -> None:
        self._begin(name, retry, prices)
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

    def ready(self, cp: Checkpoint, now: datetime | None = None) -> bool:
        signal = (cp.waiting_for or "").removeprefix("signal ")
        if cp.waiting_for is not None and pending_signals(cp, signal):
            return True
        return _due(cp.wake_at, now)

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Complete | Wait]:
        sync = in_sync_run()
        holder: list[Session] = []

        def body() -> Coroutine[Any, Any, dict[str, Any]]:
            return self._execute(holder[0], state)

        link = channel(plan.run_id, self.name, body, sync)
        session = Session(cp, self.name, link, sync)
        session.budgeted, session.prices = budgeted(cp), self.prices  # spend budgets
        holder.append(session)
        cp, outcome = yield from journaled(plan, cp, state, link, sync)
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
        with_journal(state, cp)  # the step completes with the journal as last saved
        update = {self.name: outcome["output"]}
        ledger = usage_charge(plan, state, self.name, outcome["usage"], self.prices)
        if ledger is not None:
            update[SPEND_KEY] = ledger  # spend budgets: saved with the output
        return Complete(update, changes)

    async def _execute(self, session: Session, state: dict[str, Any]) -> dict[str, Any]:
        """Run the agent with the journal; return its output, or the wait that stopped it."""
        await session.adopt_legacy(self.store)
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt(state)
        deps = None if self.deps is None else self.deps(state)
        token = session_var.set(session)
        suspended: Suspend | None = None
        try:
            with replay_scope():
                result = await self.agent.run(prompt, deps=deps)
        except BaseException as error:
            found = find(error, Suspend)
            if found is None:
                lost = find(error, LeaseLost)
                if lost is not None and lost is not error:
                    raise lost from error
                raise
            assert isinstance(found, Suspend)
            suspended = found
        finally:
            session_var.reset(token)
        cp = await session.latest_run()
        taken = session.taken_by_name(cp)
        if suspended is not None:
            if suspended.signal == RAISE_SIGNAL:  # paused by its budget between requests
                taken[RAISE_SIGNAL] = unconsumed_raises(cp)
            wake = None if suspended.wake_at is None else suspended.wake_at.isoformat()
            return {"wait": suspended.signal, "wake_at": wake, "taken": taken}
        value = self.output(result) if self.output is not None else result.output
        used = result.usage
        usage = {"input": used.input_tokens or 0, "output": used.output_tokens or 0}
        return {"output": to_jsonable_python(value), "taken": taken, "usage": usage}


def read_journal(store: Store, run_id: str, step_name: str = "agent") -> dict[str, Any]:
    """Return the journal entries (call name -> JSON result) of one agent step.

    The entries are the run's journal's (``stepstone.journal``) of that step; for a run
    the release before journaled and this one has not resumed yet, those of the record
    it kept (``journal_run_id``), named as this release names them.
    """
    cp = store.load(run_id)
    if cp is not None:
        entries = {e["call"]: e["result"] for e in step_entries(cp, step_name) if "result" in e}
        if entries:
            return entries
    legacy = store.load(journal_run_id(run_id, step_name))
    old = None if legacy is None else legacy.state.get("entries")
    return {legacy_call(k): v for k, v in old.items()} if isinstance(old, dict) else {}


class AgentRunOptions(TypedDict, total=False):
    """The keywords of ``durable_agent_run`` / ``adurable_agent_run``.

    ``deps``: the agent's dependencies; ``lease``: the run's lease (``stepstone.run``'s).
    """

    deps: Any
    lease: float | timedelta | None


def _agent_step(
    function: str, store: Store, agent: AbstractAgent[Any, Any], options: AgentRunOptions
) -> AgentStep:
    check_options(function, options, AgentRunOptions.__optional_keys__)
    deps = options.get("deps")
    return AgentStep("agent", agent, _prompt, store=store, deps=lambda _: deps)


async def adurable_agent_run(
    store: Store,
    run_id: str,
    agent: AbstractAgent[Any, Any],
    prompt: str,
    **options: Unpack[AgentRunOptions],
) -> Any:
    """Run ``agent`` on ``prompt`` as the stepstone run ``run_id``; return its output (JSON).

    Calling it again after a crash resumes the run: finished model requests and tool calls
    are replayed from the journal, not repeated. A run waiting for an external event
    raises ``stepstone.Suspended``; call again once the signal was sent. ``deps`` and
    ``lease`` (keywords, ``AgentRunOptions``) are the agent's dependencies and the run's
    lease.

    Raises:
        Suspended: the agent waits for the signal named in ``Suspended.waiting_for``.
        StepFailed: the agent run raised; the failure is saved on the run.
        InputMismatch: the run exists with another prompt.
    """
    step = _agent_step("adurable_agent_run", store, agent, options)
    lease = options.get("lease")
    state = await arun(run_id, [step], store, input={"prompt": prompt}, lease=lease)
    return state["agent"]


def durable_agent_run(
    store: Store,
    run_id: str,
    agent: AbstractAgent[Any, Any],
    prompt: str,
    **options: Unpack[AgentRunOptions],
) -> Any:
    """``adurable_agent_run`` for sync code (``stepstone.run`` underneath)."""
    step = _agent_step("durable_agent_run", store, agent, options)
    state = run(run_id, [step], store, input={"prompt": prompt}, lease=options.get("lease"))
    return state["agent"]


def _prompt(state: dict[str, Any]) -> str:
    return str(state["prompt"])
