"""``AgentRunStep`` and ``StepstoneRunner``: an agent run as one durable stepstone step."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Generator
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from agents import Agent, RunConfig, Runner, RunResult, RunResultStreaming, RunState
from agents.run import DEFAULT_MAX_TURNS

from ..._budget import BUDGET_WAIT, RAISE_SIGNAL, SPEND_KEY, Prices
from ..._checkpoint import Checkpoint
from ..._effects import Effect
from ..._errors import InvalidWorkflow
from ..._runner import arun, run
from ..._spending import usage_charge
from ..._steps import RetryPolicy
from ..._store import Store
from ..._stream import _hooks as _stream
from ..._stream._writer import Attempt, current
from ..._suspend import Complete, Wait
from .._agent_call import check_options, find, in_sync_run
from .._agent_step import AgentStepBase
from .._budget_gate import budgeted, unconsumed_raises
from .._journaled import channel, journaled, with_journal
from ._approvals import decide, interruptions, latest_pause
from ._journal import (
    APPROVAL_SIGNAL,
    MISSING,
    BudgetPause,
    Journal,
    find_fatal,
    journal_var,
    to_json,
)
from ._models import durable_agent, durable_config
from ._streaming import emit_event

if TYPE_CHECKING:
    from agents.lifecycle import RunHooks

    from ..._core import Plan


class AgentRunStep(AgentStepBase):
    """A step that runs an OpenAI agent durably; its final output is merged under ``name``.

    ``input`` is the agent's input (a str or a list of input items), or a function of the
    run's state returning it. The journal is the run's own (its entries name the step);
    ``store`` is the store the run lives in (``StepstoneRunner`` passes its own), where
    the records the release before journaled in are read from, to be moved in. While
    tool calls wait for approval the step saves the run ``waiting`` for the signal
    ``approval_signal``; it completes with
    the final output in its JSON form. ``retry`` retries a failed agent run; the retry
    replays the journal, so finished model calls are not paid again.

    In a run with a spend budget (or given ``prices``), the agent run's usage
    (``result.context_wrapper.usage``) is charged with its output, by the same save.

    ``stream=True`` runs the agent with ``Runner.run_streamed`` and emits its events to
    the run's stream (``stepstone.stream``): text deltas on ``"tokens"``, tool calls and
    outputs on ``"tool"``, handoffs on ``"agent"``. Replayed model calls emit their text
    again, as one event per message part, so the committing attempt's events are whole.
    """

    __slots__ = (
        "approval_signal",
        "context",
        "input",
        "max_turns",
        "options",
        "run_config",
        "store",
        "stream",
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
        prices: Prices | None = None,
        stream: bool = False,
        **options: Any,
    ) -> None:
        self._begin(name, retry, prices)
        if not isinstance(stream, bool):
            raise InvalidWorkflow(f"AgentRunStep {name!r}: stream must be True or False")
        self.stream = stream
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
        self.agent = durable_agent(agent, durable_tools)
        self.input = input
        self.store = store
        self.context = context
        self.max_turns = max_turns
        self.run_config = durable_config(run_config)
        self.approval_signal = approval_signal
        self.options = options

    def ready(self, cp: Checkpoint, now: datetime | None = None) -> bool:
        if cp.waiting_for == BUDGET_WAIT:  # paused by its budget between model calls
            return unconsumed_raises(cp) > 0
        received = sum(1 for s in cp.signals if s.name == self.approval_signal)
        return received > cp.consumed.get(self.approval_signal, 0)

    def evaluate(
        self, plan: Plan, cp: Checkpoint, index: int, state: dict[str, Any], first: bool
    ) -> Generator[Effect, Any, Complete | Wait]:
        store = self.store or _plan_store.get()
        if store is None:
            raise InvalidWorkflow(
                f"AgentRunStep {self.name!r} has no store for its journal: pass store= (the "
                "store the run lives in), or run it with StepstoneRunner.run"
            )
        sync = in_sync_run()
        signals = [s.payload for s in cp.signals if s.name == self.approval_signal]
        consumed = cp.consumed.get(self.approval_signal, 0)
        holder: list[Journal] = []

        async def body() -> dict[str, Any]:
            return await self._streamed(
                lambda: self._execute(holder[0], store, state, signals, consumed)
            )

        link = channel(plan.run_id, self.name, body, sync)
        journal = Journal(cp, self.name, link, sync)
        journal.budgeted, journal.prices = budgeted(cp), self.prices  # spend budgets
        holder.append(journal)
        cp, outcome = yield from journaled(plan, cp, state, link, sync)
        changes: dict[str, Any] = {}
        if outcome["upto"] > consumed:
            changes["consumed"] = {**cp.consumed, self.approval_signal: outcome["upto"]}
        if outcome.get("wait"):
            return Wait(f"signal {self.approval_signal}", None, changes)
        if outcome.get("budget"):  # the raises seen are consumed: a new one makes it due
            consumed_now = changes.get("consumed", cp.consumed)
            raises = consumed_now.get(RAISE_SIGNAL, 0) + unconsumed_raises(cp)
            changes["consumed"] = {**consumed_now, RAISE_SIGNAL: raises}
            return Wait(BUDGET_WAIT, None, changes)
        with_journal(state, cp)  # the step completes with the journal as last saved
        # Its stream's attempt (``stream=True``) commits with it (``_core._with_stream``).
        plan.streamed = outcome.get("streamed")
        update = {self.name: outcome["output"]}
        ledger = usage_charge(plan, state, self.name, outcome["usage"], self.prices)
        if ledger is not None:
            update[SPEND_KEY] = ledger  # spend budgets: the run's usage, saved with its output
        return Complete(update, changes)

    async def _streamed(self, execute: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """``execute()`` (``_execute``); with ``stream``, under one stream attempt for the
        whole agent run.

        The agent's events are emitted between its journaled units (``Runner.run_streamed``
        yields them to this task), so they are the step's attempt, not a unit's: stored
        before the step's completion, which names the attempt (``streams``) readers show.
        A replayed model call emits its text again (``journaled_stream``), so that attempt
        is whole; an attempt that crashed or failed is hidden.
        """
        scope = _step_attempt() if self.stream else None
        try:
            outcome = await execute()
        except BaseException:
            if scope is not None:
                _stream.abandon(scope)
            raise
        if scope is not None:
            streamed = await _stream.aend(scope)
            if "output" in outcome:  # a wait commits nothing: its events are not shown
                outcome["streamed"] = streamed
        return outcome

    async def _execute(
        self,
        journal: Journal,
        store: Store,
        state: dict[str, Any],
        signals: list[Any],
        consumed: int,
    ) -> dict[str, Any]:
        """Run the agent with the journal: its output, or the approval it waits for.

        Approvals come from the run's signals: pause K was recorded with how many signals
        had been consumed then (``start``); every signal after that decides its calls. The
        decisions are recorded (``resume#K``) before the agent resumes, so a replay
        resumes with the same ones whatever arrived since.
        """
        token = journal_var.set(journal)
        try:
            await journal.adopt_legacy(store)
            k, pause = latest_pause(journal.entries)
            while True:
                upto = consumed
                if pause is None:
                    agent_input: Any = self.input(state) if callable(self.input) else self.input
                    journal.counters = {}
                else:
                    resumed = journal.get(f"resume#{k}")
                    if resumed is MISSING:
                        decisions = decide(pause["interruptions"], signals[pause["start"] :])
                        if len(decisions) < len(pause["interruptions"]):
                            return {"wait": True, "upto": len(signals)}
                        resumed = await journal.put(
                            f"resume#{k}", {"upto": len(signals), "decisions": decisions}
                        )
                    upto = max(upto, resumed["upto"])
                    agent_input = await self._restore(pause["state"], resumed["decisions"])
                    journal.counters = dict(pause["counters"])
                    journal.used = list(pause.get("used", [0, 0]))  # usage before the pause
                result = await self._run(agent_input)
                if not result.interruptions:
                    output = to_json(result.final_output, "the agent's final output")
                    used = result.context_wrapper.usage
                    usage = {"input": used.input_tokens, "output": used.output_tokens}
                    return {"output": output, "upto": upto, "usage": usage}
                k += 1
                pause = await journal.put(
                    f"pause#{k}",
                    {
                        "state": json.loads(result.to_state().to_string()),
                        "counters": dict(journal.counters),
                        "used": list(journal.used),
                        "start": upto,
                        "interruptions": interruptions(result),
                    },
                )
        except BaseException as error:
            if find(error, BudgetPause) is not None:
                return {"budget": True, "upto": consumed}
            fatal = find_fatal(error)
            if fatal is None:
                raise
            raise fatal.error from None
        finally:
            journal_var.reset(token)

    async def _run(self, agent_input: Any) -> RunResult | RunResultStreaming:
        """One ``Runner.run`` (or ``run_streamed``, its events emitted) of the agent."""
        if not self.stream:
            return await Runner.run(
                self.agent,
                agent_input,
                context=self.context,
                max_turns=self.max_turns,
                run_config=self.run_config,
                **self.options,
            )
        streamed = Runner.run_streamed(
            self.agent,
            agent_input,
            context=self.context,
            max_turns=self.max_turns,
            run_config=self.run_config,
            **self.options,
        )
        try:
            async for event in streamed.stream_events():  # raises what the run raised
                emit_event(event)
        except BaseException:
            streamed.cancel()  # the SDK's run task would go on without a reader
            raise
        return streamed

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


def _step_attempt() -> _stream.Scope | None:
    """Install a stream attempt of the step running here (its key and number), one that
    may emit; None outside a run. (The agent runs inside the core's wait for its requests,
    whose own attempt may not emit: a code workflow's function emits from its calls only.)"""
    waiting = current.get()
    if waiting is None:
        return None
    attempt = Attempt(
        waiting.store, waiting.run_id, waiting.key, waiting.epoch, waiting.number, True
    )
    return attempt, current.set(attempt)


# The store an AgentRunStep reads the release before's records from: the runner's
# effects carry no store, so the entry points set it for the run.
_plan_store: ContextVar[Store | None] = ContextVar("stepstone_openai_store", default=None)


@contextlib.contextmanager
def _using(store: Store) -> Generator[None]:
    token = _plan_store.set(store)
    try:
        yield
    finally:
        _plan_store.reset(token)


class RunOptions(TypedDict, total=False):
    """The keywords of ``StepstoneRunner.run`` / ``run_sync``, each as in ``Runner.run``.

    ``context``, ``max_turns`` (default the SDK's), ``hooks``, ``run_config``, ``session``
    and ``error_handlers`` are the SDK's; ``durable_tools`` (default True) journals the
    agents' function tools; ``approval_signal`` (default ``"approval"``) names the signal
    that carries approvals; ``lease`` is the run's lease and ``retry`` the step's
    ``RetryPolicy``; ``stream`` (default False) runs the agent streamed, its events on the
    run's stream (``AgentRunStep``).
    """

    context: Any
    max_turns: int | None
    hooks: RunHooks[Any] | None
    run_config: RunConfig | None
    session: Any
    error_handlers: Any
    durable_tools: bool
    approval_signal: str
    lease: float | timedelta | None
    retry: RetryPolicy | None
    stream: bool


class StepstoneRunner:
    """``Runner.run`` as a durable stepstone run: the extra arguments are a store and a run id.

    Example:
        ``output = await StepstoneRunner.run(store, "ticket-42", agent, "refund order 7")``
    """

    @classmethod
    def _step(cls, function: str, agent: Agent[Any], options: RunOptions) -> AgentRunStep:
        check_options(function, options, RunOptions.__optional_keys__)
        # The SDK's keywords it has defaults for are passed on only when given.
        given: dict[str, Any] = dict(options)
        passed: dict[str, Any] = {
            name: given[name]
            for name in ("hooks", "session", "error_handlers")
            if given.get(name) is not None
        }
        return AgentRunStep(
            "agent",
            agent,
            lambda state: state["input"],
            context=options.get("context"),
            max_turns=options.get("max_turns", DEFAULT_MAX_TURNS),
            run_config=options.get("run_config"),
            durable_tools=options.get("durable_tools", True),
            approval_signal=options.get("approval_signal", APPROVAL_SIGNAL),
            retry=options.get("retry"),
            stream=options.get("stream", False),
            **passed,
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
        return {"input": to_json(input, "the agent's input")}

    @classmethod
    async def run(
        cls,
        store: Store,
        run_id: str,
        starting_agent: Agent[Any],
        input: str | list[Any] | None = None,
        **options: Unpack[RunOptions],
    ) -> Any:
        """Run ``starting_agent`` on ``input`` as the stepstone run ``run_id``; return its output.

        Calling it again after a crash (``input`` may be None then) resumes the run:
        finished model calls and durable tool calls are replayed from the journal, not
        repeated. The output is the final output in its JSON form. ``hooks`` see the
        replayed calls too (they run again on resume, as the agent's own code does).
        The keywords are ``RunOptions``.

        Raises:
            Suspended: tool calls wait for approval (``pending_approvals`` lists them);
                answer with ``approve``/``reject``, then call again (or let a worker).
            RunOwned: another process is executing (or resuming) the run right now.
            StepFailed: the agent run raised; the failure is saved on the run.
            InputMismatch: the run exists with another input.
        """
        step = cls._step("run", starting_agent, options)
        lease = options.get("lease")
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
        **options: Unpack[RunOptions],
    ) -> Any:
        """``run`` for sync code (``stepstone.run`` underneath; not inside an event loop)."""
        step = cls._step("run_sync", starting_agent, options)
        with _using(store):
            state = run(run_id, [step], store, input=cls._input(input), lease=options.get("lease"))
        return state["agent"]
