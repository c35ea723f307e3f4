"""pydantic-ai agents on stepstone: journaled units, SIGKILL and resume, durable waits.

The agents use pydantic-ai's ``FunctionModel`` (no network); every model request and
tool call appends a line to a log file, so a test counts what ran across processes.
This file is also the child process of the crash and wait tests (``__main__`` below).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import RequestInput
from pydantic_ai.durable_exec import ModelRequestId
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets import DynamicToolset, FunctionToolset

import stepstone
from fresh_stores import DURABLE_BACKENDS, fresh_config
from stepstone import (
    Checkpoint,
    ConflictError,
    InvalidWorkflow,
    LeaseLost,
    RetryPolicy,
    StepFailed,
    Store,
    Suspended,
    Worker,
    Workflow,
    arun,
    open_store,
    run,
)
from stepstone._checkpoint import evolve
from stepstone._codec import checkpoint_from_doc, decode_document
from stepstone._journal import JOURNAL_KEY
from stepstone.adapters.pydantic_ai import (
    AgentStep,
    StepstoneDurability,
    adurable_agent_run,
    durable_agent_run,
    journal_run_id,
    parse_token,
    read_journal,
)
from stepstone.testing import use_clock
from stepstone.testing._runtime_kit import ClockAhead, time_ahead
from waiting import status_of

DURABLE = DURABLE_BACKENDS
#: Seconds a child process may take (it imports pydantic-ai and opens the store).
CHILD_TIMEOUT = 120.0
LOG_ENV = "STEPSTONE_PA_LOG"
KILL_ENV = "STEPSTONE_PA_KILL"
TOOL_CALLS = 2  # the agent looks up 0 and 1, then answers


# --- the agent (also built by the child processes) --------------------------------------


def _log(what: str) -> None:
    """Append ``what`` to the log, and die here if this is the kill point."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(what + "\n")
            f.flush()
            os.fsync(f.fileno())
    if os.environ.get(KILL_ENV) == what:
        os.kill(os.getpid(), signal.SIGKILL)


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = len(_returns(messages))
    _log(f"model {done + 1}")
    if done < TOOL_CALLS:
        return ModelResponse(parts=[ToolCallPart("lookup", {"x": done}, tool_call_id=f"c{done}")])
    return ModelResponse(
        parts=[TextPart("answer: " + ",".join(str(r.content) for r in _returns(messages)))]
    )


def make_agent(**capability: Any) -> Agent[None, str]:
    """The crash tests' agent: two tool calls, three model requests."""
    agent: Agent[None, str] = Agent(
        FunctionModel(_model), name="support", capabilities=[StepstoneDurability(**capability)]
    )

    @agent.tool_plain
    def lookup(x: int) -> str:
        _log(f"tool {x}")
        return f"v{x}"

    return agent


def crash_workflow(store: Store) -> Workflow:
    """The workflow the crash test's processes run: one agent step."""
    step = AgentStep("agent", make_agent(), lambda state: str(state["q"]), store=store)
    return Workflow("pa-crash", [step])


def _approval_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _log("model")
    returns = _returns(messages)
    if not returns:
        return ModelResponse(parts=[ToolCallPart("refund", {"amount": 5}, tool_call_id="r1")])
    return ModelResponse(parts=[TextPart(f"done: {returns[0].content}")])


def approval_agent(timeout: timedelta | None = None) -> Agent[None, str]:
    """An agent whose refund tool needs approval, asked for through ``RequestInput``."""

    def ask(ctx: RunContext[None], requests: DeferredToolRequests, token: str) -> None:
        _log("ask " + token)

    agent: Agent[None, str] = Agent(
        FunctionModel(_approval_model),
        name="support",
        capabilities=[StepstoneDurability(), RequestInput(ask, name="approve", timeout=timeout)],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        _log("refund")
        return f"refunded {amount}"

    return agent


def wait_workflow(store: Store) -> Workflow:
    """The wait test's workflow: the approval agent, waiting without a timeout."""
    step = AgentStep("agent", approval_agent(), lambda state: "refund me", store=store)
    return Workflow("pa-wait", [step])


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The call log of this test, in the environment so child processes append to it."""
    path = tmp_path / "calls.log"
    monkeypatch.setenv(LOG_ENV, str(path))
    monkeypatch.delenv(KILL_ENV, raising=False)
    return path


def calls(log: Path) -> Counter[str]:
    """Return how often each model request and tool call ran, by its log line."""
    if not log.exists():
        return Counter()
    return Counter(line for line in log.read_text(encoding="utf-8").splitlines() if line)


@pytest.fixture
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of the backend named by the parameter, as a config string.

    (Cosmos DB's key goes in the environment, so the child processes find it as the
    parent does.)
    """
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture
def memory_store() -> Iterator[Store]:
    """A fresh in-process store."""
    with open_store(f"memory://pa-{uuid.uuid4().hex}") as store:
        yield store


# --- names: compatibility data --------------------------------------------------------------


def test_persisted_names_are_pinned(memory_store: Store, log: Path) -> None:
    """The journal names of model requests and tool calls never change once persisted."""
    assert durable_agent_run(memory_store, "names", make_agent(), "q") == "answer: v0,v1"
    assert list(read_journal(memory_store, "names")) == [
        "support__model.request#1",
        "support__function_toolset__<agent>.call_tool:lookup#1",
        "support__model.request#2",
        "support__function_toolset__<agent>.call_tool:lookup#2",
        "support__model.request#3",
    ]
    assert journal_run_id("names", "agent") == "names/agent/pydantic-ai-journal"
    long = journal_run_id("r" * 1020, "agent")
    assert long.startswith("pydantic-ai~") and long.endswith("/pydantic-ai-journal")
    assert len(long) == len("pydantic-ai~") + 64 + len("/pydantic-ai-journal")


def test_streaming_and_event_handler_names_are_pinned(memory_store: Store, log: Path) -> None:
    """With an event-stream handler, requests stream and each handled event is a unit."""
    seen: list[str] = []

    async def handler(ctx: RunContext[None], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            seen.append(type(event).__name__)

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        _log("model")
        if not _returns(messages):
            yield {0: DeltaToolCall(name="lookup", json_args='{"x": 7}', tool_call_id="s1")}
        else:
            yield "streamed"

    agent: Agent[None, str] = Agent(
        FunctionModel(stream_function=stream),
        name="support",
        capabilities=[StepstoneDurability(event_stream_handler=handler)],
    )

    @agent.tool_plain
    def lookup(x: int) -> str:
        _log("tool")
        return f"v{x}"

    assert asyncio.run(adurable_agent_run(memory_store, "stream", agent, "q")) == "streamed"
    names = list(read_journal(memory_store, "stream"))
    assert names[0] == "support__model.request_stream#1"
    assert "support__function_toolset__<agent>.call_tool:lookup#1" in names
    assert "support__model.request_stream#2" in names
    handled = [n for n in names if n.startswith("support__event_stream_handler")]
    assert handled and handled[0] == "support__event_stream_handler#1"
    assert all(n.startswith("support__event_stream_handler#") for n in handled)
    assert seen, "the handler received no event"
    seen_before = list(seen)
    # A resume replays everything: no model call, no tool call, no handler call again.
    assert asyncio.run(adurable_agent_run(memory_store, "stream", agent, "q")) == "streamed"
    assert calls(log) == Counter({"model": 2, "tool": 1})
    assert seen == seen_before


def test_toolset_discovery_is_journaled(memory_store: Store, log: Path) -> None:
    """A dynamic toolset's discovery and its calls are units with pinned names, replayed."""

    def extra_tools(ctx: RunContext[None]) -> FunctionToolset[None]:
        _log("discover")
        tools: FunctionToolset[None] = FunctionToolset()

        @tools.tool_plain
        def lookup(x: int) -> str:
            _log(f"tool {x}")
            return f"v{x}"

        return tools

    agent: Agent[None, str] = Agent(
        FunctionModel(_model),
        name="support",
        toolsets=[DynamicToolset(extra_tools, id="extra")],
        capabilities=[StepstoneDurability()],
    )
    assert durable_agent_run(memory_store, "discover", agent, "q") == "answer: v0,v1"
    names = list(read_journal(memory_store, "discover"))
    assert names[:3] == [
        "support__dynamic_toolset__extra.get_tools#1",
        "support__model.request#1",
        "support__dynamic_toolset__extra.call_tool:lookup#1",
    ]
    assert "support__dynamic_toolset__extra.get_tools#2" in names
    ran = calls(log)
    durable_agent_run(memory_store, "discover", agent, "q")
    assert calls(log) == ran


# --- replay in one process -----------------------------------------------------------------


@pytest.mark.parametrize("form", ["sync", "async"])
def test_retry_replays_finished_units(memory_store: Store, log: Path, form: str) -> None:
    """A failed attempt's finished model requests and tool calls are replayed, not repeated."""
    failures = {"left": 1}
    agent: Agent[None, str] = Agent(
        FunctionModel(_model), name="support", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    def lookup(x: int) -> str:
        _log(f"tool {x}")
        if x == 1 and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("lookup service down")
        return f"v{x}"

    retry = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    steps = [AgentStep("agent", agent, "q", retry=retry, store=memory_store)]
    if form == "sync":
        state = run("retry", steps, memory_store)
    else:
        state = asyncio.run(arun("retry", steps, memory_store))
    assert state["agent"] == "answer: v0,v1"
    assert calls(log) == Counter(
        {"model 1": 1, "tool 0": 1, "model 2": 1, "tool 1": 2, "model 3": 1}
    )


def test_finished_run_runs_nothing(memory_store: Store, log: Path) -> None:
    """Calling the helper again on a finished run returns the recorded output."""
    agent = make_agent()
    first = asyncio.run(adurable_agent_run(memory_store, "again", agent, "q"))
    again = asyncio.run(adurable_agent_run(memory_store, "again", agent, "q"))
    assert first == again == "answer: v0,v1"
    assert sum(calls(log).values()) == 5


def test_journal_of_a_deleted_run_is_not_replayed(memory_store: Store, log: Path) -> None:
    """A run deleted and started again under its id pays again: the old journal is not its."""
    agent = make_agent()
    durable_agent_run(memory_store, "reborn", agent, "q")
    cp = memory_store.load("reborn")
    assert cp is not None
    time.sleep(0.005)  # a creation time a millisecond or more after the first run's
    memory_store.delete("reborn")
    durable_agent_run(memory_store, "reborn", agent, "q")
    assert calls(log)["model 1"] == 2


def test_parallel_tool_calls_run_one_at_a_time(memory_store: Store, log: Path) -> None:
    """Two tool calls of one response run sequentially, in response order, named by counter."""
    active: list[str] = []
    overlaps: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not _returns(messages):
            return ModelResponse(
                parts=[
                    ToolCallPart("slow", {"x": 1}, tool_call_id="p1"),
                    ToolCallPart("slow", {"x": 2}, tool_call_id="p2"),
                ]
            )
        return ModelResponse(parts=[TextPart("ok")])

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="support", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    async def slow(x: int) -> str:
        if active:
            overlaps.append(f"{x} during {active}")
        active.append(str(x))
        await asyncio.sleep(0.01)
        active.remove(str(x))
        _log(f"slow {x}")
        return str(x)

    async def main() -> Any:
        with agent.parallel_tool_call_execution_mode("parallel"):
            return await adurable_agent_run(memory_store, "par", agent, "q")

    assert asyncio.run(main()) == "ok"
    assert overlaps == []
    assert log.read_text(encoding="utf-8").split("\n")[:2] == ["slow 1", "slow 2"]
    journal = read_journal(memory_store, "par")
    first = journal["support__function_toolset__<agent>.call_tool:slow#1"]
    second = journal["support__function_toolset__<agent>.call_tool:slow#2"]
    assert (first["result"], second["result"]) == ("1", "2")


def test_sub_agent_inside_a_tool_is_part_of_the_tool_call(memory_store: Store, log: Path) -> None:
    """A durable agent run inside a tool runs directly: the tool call's result is the unit."""
    inner = make_agent()
    outer: Agent[None, str] = Agent(
        FunctionModel(_model), name="outer", capabilities=[StepstoneDurability()]
    )

    @outer.tool_plain
    async def lookup(x: int) -> str:
        _log(f"outer tool {x}")
        return (await inner.run("q")).output

    assert durable_agent_run(memory_store, "nested", outer, "q") == (
        "answer: answer: v0,v1,answer: v0,v1"
    )
    assert list(read_journal(memory_store, "nested")) == [
        "outer__model.request#1",
        "outer__function_toolset__<agent>.call_tool:lookup#1",
        "outer__model.request#2",
        "outer__function_toolset__<agent>.call_tool:lookup#2",
        "outer__model.request#3",
    ]
    durable_agent_run(memory_store, "nested", outer, "q")
    assert calls(log)["outer tool 1"] == 1


def test_concurrent_units_are_refused(memory_store: Store) -> None:
    """Two units of one agent run in flight at once raise ConcurrentUnits, naming both."""
    from stepstone.adapters.pydantic_ai import ConcurrentUnits
    from stepstone.adapters.pydantic_ai._journal import Session, session_var

    backend = StepstoneDurability.from_agent(make_agent())
    assert backend is not None
    engine = backend.get_durable_operation_backend()
    cp = Checkpoint(run_id="conc", step=-1, state={}, step_names=(), total_steps=1)
    session = Session(cp, "agent", None, sync=False)  # never reaches the core: refused first

    async def body() -> object:
        await asyncio.sleep(0.05)
        return "x"

    async def main() -> None:
        token = session_var.set(session)
        try:
            await asyncio.gather(
                *(
                    engine.execute(
                        operation_id=ModelRequestId(model_name="default"),
                        name=name,
                        body=body,
                        cache_key=(),
                        config=None,
                    )
                    for name in ("first", "second")
                )
            )
        finally:
            session_var.reset(token)

    with pytest.raises(ConcurrentUnits, match="'second#1' started while 'first#1'"):
        asyncio.run(main())


def test_stale_owner_is_fenced(memory_store: Store, log: Path) -> None:
    """An owner whose lease was taken over mid-run journals nothing more (LeaseLost)."""
    agent: Agent[None, str] = Agent(
        FunctionModel(_model), name="support", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    def lookup(x: int) -> str:
        _log(f"tool {x}")
        while x == 1:  # another owner takes the run over while this call runs
            cp = memory_store.load("fence")
            assert cp is not None
            try:
                memory_store.save(evolve(cp, owner="thief", epoch=cp.epoch + 1))
            except ConflictError:
                continue  # a renewal landed between our load and save: take it again
            break
        return f"v{x}"

    with pytest.raises(LeaseLost):
        durable_agent_run(memory_store, "fence", agent, "q")
    assert list(read_journal(memory_store, "fence")) == [
        "support__model.request#1",
        "support__function_toolset__<agent>.call_tool:lookup#1",
        "support__model.request#2",
    ]


def test_the_sync_helper_inside_an_event_loop_is_refused(memory_store: Store, log: Path) -> None:
    """``durable_agent_run`` (sync) called from a running event loop fails the step,
    saying to use the async helper; the agent runs nothing."""

    async def main() -> None:
        with pytest.raises(StepFailed):
            durable_agent_run(memory_store, "in-loop", make_agent(), "q")

    asyncio.run(main())
    cp = memory_store.load("in-loop")
    assert cp is not None and cp.failure is not None
    assert cp.failure.error_type == "InvalidWorkflow"
    assert "inside a running event loop" in cp.failure.message
    assert calls(log) == Counter()


def test_outside_a_run_the_agent_is_ordinary(log: Path) -> None:
    """Without a stepstone run around it the capability journals nothing and changes nothing."""
    result = make_agent().run_sync("q")
    assert result.output == "answer: v0,v1"
    assert sum(calls(log).values()) == 5


def test_bad_setup_is_refused(memory_store: Store) -> None:
    """An agent without the capability, or a step without a store, is refused clearly."""
    plain: Agent[None, str] = Agent(FunctionModel(_model), name="plain")
    with pytest.raises(InvalidWorkflow, match="StepstoneDurability"):
        AgentStep("agent", plain, "q", store=memory_store)
    with pytest.raises(InvalidWorkflow, match="store must be a stepstone Store"):
        AgentStep("agent", make_agent(), "q", store="sqlite:///x.db")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a stepstone wait token"):
        parse_token("not-json")


# --- durable waits ------------------------------------------------------------------------


def test_wait_suspends_and_a_signal_resumes(memory_store: Store, log: Path) -> None:
    """A RequestInput wait saves the run waiting for its signal; the signal's answer is used."""
    agent = approval_agent()
    with pytest.raises(Suspended) as waiting:
        asyncio.run(adurable_agent_run(memory_store, "approve", agent, "refund me"))
    assert waiting.value.waiting_for == "signal approve"
    cp = memory_store.load("approve")
    assert cp is not None and cp.status == "waiting" and cp.owner is None
    [asked] = [line for line in calls(log) if line.startswith("ask ")]
    run_id, name = parse_token(asked.removeprefix("ask "))
    assert (run_id, name) == ("approve", "approve")
    # Not yet answered: calling again runs nothing and still waits.
    with pytest.raises(Suspended):
        asyncio.run(adurable_agent_run(memory_store, "approve", agent, "refund me"))
    stepstone.signal(memory_store, run_id, name, {"approvals": {"r1": True}})
    out = asyncio.run(adurable_agent_run(memory_store, "approve", agent, "refund me"))
    assert out == "done: refunded 5"
    assert calls(log) == Counter({"model": 2, "refund": 1, asked: 1})
    names = list(read_journal(memory_store, "approve"))
    assert names == [
        "support__model.request#1",
        "support__external_event.approve.ask#1",
        "support__external_event.approve#1",
        "support__function_toolset__<agent>.call_tool:refund#1",
        "support__model.request#2",
    ]
    done = memory_store.load("approve")
    assert done is not None and done.consumed == {"approve": 1}


def test_two_waits_of_one_name_take_one_signal_each(memory_store: Store, log: Path) -> None:
    """Two approvals in one agent run consume the signals of their name in arrival order."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = _returns(messages)
        _log("model")
        if len(done) < 2:
            call = f"r{len(done) + 1}"
            return ModelResponse(parts=[ToolCallPart("refund", {"amount": 5}, tool_call_id=call)])
        return ModelResponse(parts=[TextPart(" ".join(str(r.content) for r in done))])

    agent: Agent[None, str] = Agent(
        FunctionModel(model),
        name="support",
        capabilities=[StepstoneDurability(), RequestInput(lambda c, r, t: None, name="approve")],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        _log("refund")
        return f"refunded {amount}"

    def attempt() -> Any:
        return durable_agent_run(memory_store, "two", agent, "q")

    with pytest.raises(Suspended):
        attempt()
    stepstone.signal(memory_store, "two", "approve", {"approvals": {"r1": True}})
    with pytest.raises(Suspended):
        attempt()
    waiting = memory_store.load("two")
    assert waiting is not None and waiting.consumed == {"approve": 1}
    stepstone.signal(memory_store, "two", "approve", {"approvals": {"r2": True}})
    assert attempt() == "refunded 5 refunded 5"
    done = memory_store.load("two")
    assert done is not None and done.consumed == {"approve": 2}
    assert calls(log) == Counter({"model": 3, "refund": 2})


def test_an_answer_from_ask_is_recorded_and_not_asked_again(memory_store: Store, log: Path) -> None:
    """An ask that answers at once (a policy) does not suspend; a replay does not ask again."""
    from pydantic_ai.tools import DeferredToolResults

    def ask(ctx: RunContext[None], requests: DeferredToolRequests, token: str) -> Any:
        _log("policy")
        return DeferredToolResults(
            approvals={call.tool_call_id: True for call in requests.approvals}
        )

    agent: Agent[None, str] = Agent(
        FunctionModel(_approval_model),
        name="support",
        capabilities=[StepstoneDurability(), RequestInput(ask, name="approve")],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        _log("refund")
        return f"refunded {amount}"

    assert durable_agent_run(memory_store, "policy", agent, "q") == "done: refunded 5"
    journal = read_journal(memory_store, "policy")
    assert journal["support__external_event.approve#1"] == {
        "payload": journal["support__external_event.approve.ask#1"]
    }
    # Rerun from the last model request (``stepstone.rerun`` at a journal entry): the
    # entries before it answer their units, so the ask is not made again.
    stepstone.rerun(memory_store, "policy", "support__model.request#2")
    assert durable_agent_run(memory_store, "policy", agent, "q") == "done: refunded 5"
    assert calls(log) == Counter({"model": 3, "refund": 1, "policy": 1})


def test_wait_timeout_is_durable(tmp_path: Path, log: Path) -> None:
    """The timeout is recorded when the wait begins; a worker wakes the run at it and denies."""
    with open_store(f"sqlite:///{tmp_path}/t.db") as store:
        step = AgentStep("agent", approval_agent(timedelta(seconds=0.5)), "go", store=store)
        flow = Workflow("pa-timeout", [step])
        with pytest.raises(Suspended) as waiting:
            asyncio.run(arun("late", flow, store))
        deadline = read_journal(store, "late")["support__external_event.approve.deadline#1"]
        assert waiting.value.wake_at == datetime.fromisoformat(deadline)
        worker = Worker(store, [flow], poll=0.05)
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        try:
            _until(lambda: status_of(store, "late") == "done", "the timed-out run to finish")
        finally:
            worker.stop()
            thread.join(30)
        cp = store.load("late")
        assert cp is not None
        assert "No decision on this tool call arrived" in str(cp.state["agent"])
    assert calls(log)["refund"] == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_wait_timeout_counts_and_ends_on_the_store_clock(memory_store: Store, mode: str) -> None:
    """Begun on a host 3 h behind, the wait's deadline is ten minutes from the store's
    now; a host 3 h ahead does not end it early; the store's time past it ends it."""
    skew, wait = timedelta(hours=3), timedelta(minutes=10)
    step = AgentStep("agent", approval_agent(wait), "go", store=memory_store)
    flow = Workflow("pa-skew", [step])

    def attempt() -> Any:
        if mode == "sync":
            return stepstone.run("skew", flow, memory_store)
        return asyncio.run(arun("skew", flow, memory_store))

    real = datetime.now(UTC)
    with use_clock(ClockAhead(-skew)), pytest.raises(Suspended) as began:
        attempt()
    deadline = datetime.fromisoformat(
        read_journal(memory_store, "skew")["support__external_event.approve.deadline#1"]
    )
    assert abs(deadline - (real + wait)) < timedelta(seconds=30), (deadline, real + wait)
    assert began.value.wake_at == deadline
    with use_clock(ClockAhead(skew)), pytest.raises(Suspended) as again:
        attempt()  # three hours ahead: not due yet on the store's clock
    assert again.value.wake_at == deadline
    with time_ahead(wait + timedelta(seconds=5)):
        final = attempt()
    assert "No decision on this tool call arrived" in str(final["agent"])


def _until(condition: Any, what: str, timeout: float = CHILD_TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


# --- across processes ---------------------------------------------------------------------


def _child(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run this file as a child process; a hung child is killed and named in the failure."""
    # The child imports this module's helpers from tests/ (CI's fresh clone sets no PYTHONPATH).
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"child {args[0]!r} hung for {CHILD_TIMEOUT:g}s; its stderr ends:\n{err[-4000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


crash_cases = [(name, "tool 1") for name in DURABLE] + [("sqlite", "model 2")]


@pytest.mark.crash
@pytest.mark.parametrize(
    ("config", "kill_at"),
    crash_cases,
    indirect=["config"],
    ids=[f"{b}-{k}" for b, k in crash_cases],
)
def test_sigkill_mid_run_then_a_worker_resumes(config: str, kill_at: str, log: Path) -> None:
    """SIGKILLed inside a unit, the run resumes under a worker without repeating finished ones."""
    killed = _child("start", config, env={KILL_ENV: kill_at})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = calls(log)
    assert before[kill_at] == 1
    resumed = _child("serve", config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1]) == "answer: v0,v1"
    ran = calls(log)
    expected = ["model 1", "tool 0", "model 2", "tool 1", "model 3"]
    assert set(ran) == set(expected)
    for unit in expected:
        # Finished before the kill: once. The one killed: once more at most.
        assert ran[unit] == (2 if unit == kill_at else 1), (unit, ran)


@pytest.mark.crash
@pytest.mark.parametrize("config", ["sqlite"], indirect=True)
def test_wait_across_processes(config: str, log: Path) -> None:
    """One process suspends at the approval, the CLI signals, an async worker elsewhere ends it."""
    started = _child("wait", config)
    assert started.returncode == 0, started.stderr[-3000:]
    assert started.stdout.strip().splitlines()[-1] == "waiting for signal approve"
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepstone",
            "runs",
            "signal",
            "w1",
            "approve",
            "--store",
            config,
            "--data",
            json.dumps({"approvals": {"r1": True}}),
        ],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    finished = _child("aserve", config)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert json.loads(finished.stdout.strip().splitlines()[-1]) == "done: refunded 5"
    ran = calls(log)
    assert (ran["model"], ran["refund"]) == (2, 1)
    assert sum(n for line, n in ran.items() if line.startswith("ask ")) == 1


# --- the child processes --------------------------------------------------------------------


def _serve_until_done(store: Store, flow: Workflow, run_id: str, asynchronous: bool) -> Any:
    worker = Worker(store, [flow], poll=0.05, lease=2)
    if asynchronous:

        async def main() -> None:
            task = asyncio.create_task(worker.aserve())
            while status_of(store, run_id) != "done":  # noqa: ASYNC110 - polls the store, which has no event to wait on
                await asyncio.sleep(0.02)
            worker.stop()
            await task

        asyncio.run(main())
    else:
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        _until(lambda: status_of(store, run_id) == "done", f"run {run_id!r} to finish")
        worker.stop()
        thread.join(60)
    cp = store.load(run_id)
    assert cp is not None
    return cp.state["agent"]


def _child_main(argv: list[str]) -> None:
    mode, config = argv
    if os.environ.get("STEPSTONE_PA_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG)
    with open_store(config) as store:
        if mode == "start":
            # Async code, with a lease short enough that the worker takes over soon.
            flow = crash_workflow(store)
            asyncio.run(arun("crash", flow, store, input={"q": "q"}, lease=1))
            raise SystemExit("the kill point was never reached")
        if mode == "serve":
            print(json.dumps(_serve_until_done(store, crash_workflow(store), "crash", False)))
        elif mode == "wait":
            try:
                asyncio.run(arun("w1", wait_workflow(store), store))
            except Suspended as exc:
                print(f"waiting for {exc.waiting_for}")
        elif mode == "aserve":
            print(json.dumps(_serve_until_done(store, wait_workflow(store), "w1", True)))


if __name__ == "__main__":
    _child_main(sys.argv[1:])


# --- the run's public journal (issue 31), and stores of the release before ---------------
#
# An agent step's model requests and tool calls are entries of the run's journal, as a
# code workflow's calls are: ``stepstone.journal`` lists them, ``rerun`` at one runs it
# and the later ones again, the others are answered from the journal. A store written by
# the release before (its journal in a record of its own, ``pydantic_ai_legacy_records
# .json``, written by ``make_pydantic_ai_legacy.py``) opens: a waiting run resumes with
# its recorded units answered, their record moved into the run's journal.

LEGACY = Path(__file__).parent / "pydantic_ai_legacy_records.json"


@pytest.fixture(params=("memory", "sqlite"))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh in-process store."""
    config = {
        "memory": f"memory://paj-{uuid.uuid4().hex}",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
    }[str(request.param)]
    with open_store(config) as opened:
        yield opened


def test_units_are_entries_of_the_runs_journal(store: Store, log: Path) -> None:
    """Each unit is one entry of the run's journal, named NAME#N, with its step."""
    assert durable_agent_run(store, "pj", make_agent(), "q") == "answer: v0,v1"
    entries = stepstone.journal(store, "pj")
    assert [e.call for e in entries] == [
        "support__model.request#1",
        "support__function_toolset__<agent>.call_tool:lookup#1",
        "support__model.request#2",
        "support__function_toolset__<agent>.call_tool:lookup#2",
        "support__model.request#3",
    ]
    assert [e.seq for e in entries] == [0, 1, 2, 3, 4]
    assert entries[2].name == "support__model.request" and entries[2].ordinal == 2
    assert all(e.at is not None and e.size > 0 for e in entries)
    cp = store.load("pj")
    assert cp is not None and {e["step"] for e in cp.state[JOURNAL_KEY]} == {"agent"}
    assert store.load(journal_run_id("pj", "agent")) is None  # no record of its own


def test_rerun_from_a_tool_call_runs_it_and_the_later_units_again(store: Store, log: Path) -> None:
    """``rerun`` at the second tool call: the first request, tool and second request are
    answered from the journal; that call and the last request run again."""
    agent = make_agent()
    durable_agent_run(store, "pr", agent, "q")
    rewound = stepstone.rerun(store, "pr", "support__function_toolset__<agent>.call_tool:lookup#2")
    assert rewound.step == -1 and len(rewound.state[JOURNAL_KEY]) == 3
    assert durable_agent_run(store, "pr", agent, "q") == "answer: v0,v1"
    assert calls(log) == Counter(
        {"model 1": 1, "tool 0": 1, "model 2": 1, "tool 1": 2, "model 3": 2}
    )
    assert len(stepstone.journal(store, "pr")) == 5


def test_fork_at_a_unit_keeps_the_units_up_to_it(store: Store, log: Path) -> None:
    """``fork`` at the second model request: the new run answers the units up to it from
    its journal and runs the later ones; the original run is untouched."""
    agent = make_agent()
    durable_agent_run(store, "pf", agent, "q")
    forked = stepstone.fork(store, "pf", "support__model.request#2", "pf-fork")
    assert forked.step == -1 and len(forked.state[JOURNAL_KEY]) == 3
    assert durable_agent_run(store, "pf-fork", agent, "q") == "answer: v0,v1"
    assert calls(log) == Counter(
        {"model 1": 1, "tool 0": 1, "model 2": 1, "tool 1": 2, "model 3": 2}
    )
    assert len(stepstone.journal(store, "pf")) == len(stepstone.journal(store, "pf-fork")) == 5


def test_rerun_from_an_agent_steps_unit_goes_back_to_that_step(store: Store, log: Path) -> None:
    """In a step list, a rerun at a unit of a completed agent step reruns that step on."""
    steps = [
        stepstone.Step("before", lambda state: {"n": 1}),
        AgentStep("agent", make_agent(), "q", store=store),
        stepstone.Step("after", lambda state: {"done": state["agent"]}),
    ]
    assert stepstone.run("ps", steps, store)["done"] == "answer: v0,v1"
    rewound = stepstone.rerun(store, "ps", "support__model.request#3")
    assert rewound.step == 0 and rewound.step_names == ("before",)
    assert stepstone.run("ps", steps, store)["done"] == "answer: v0,v1"
    assert calls(log)["model 3"] == 2 and calls(log)["model 1"] == 1


def _load_legacy(store: Store) -> None:
    """Save the release before's records into ``store``, as that release left them."""
    records = json.loads(LEGACY.read_text(encoding="utf-8"))
    docs = [decode_document(text, name) for name, text in records.items()]
    for doc in sorted(docs, key=lambda d: "/" in d["run_id"]):  # runs first
        cp = checkpoint_from_doc(doc, None, "fixture")
        if "/" in cp.run_id:
            # The journal names its run's creation time, which the store set anew.
            run = store.load(doc["state"]["run"])
            assert run is not None and run.created_at is not None
            created = run.created_at.isoformat(timespec="milliseconds")
            cp = checkpoint_from_doc(
                {**doc, "state": {**doc["state"], "run_created": created}}, None, "fixture"
            )
        store.save(cp)


def test_a_waiting_run_of_the_release_before_resumes(store: Store, log: Path) -> None:
    """The release before's waiting run resumes: its first model request and its ask are
    answered from its old journal (moved into the run's journal), not made again."""
    _load_legacy(store)
    legacy_id = journal_run_id("legacy-wait", "agent")
    assert store.load(legacy_id) is not None
    assert list(read_journal(store, "legacy-wait")) == [
        "support__model.request#1",
        "support__external_event.approve.ask#1",
    ]
    agent = approval_agent()
    with pytest.raises(Suspended):  # not answered yet: still waits, runs nothing
        asyncio.run(adurable_agent_run(store, "legacy-wait", agent, "refund me"))
    assert calls(log) == Counter()
    stepstone.signal(store, "legacy-wait", "approve", {"approvals": {"r1": True}})
    out = asyncio.run(adurable_agent_run(store, "legacy-wait", agent, "refund me"))
    assert out == "done: refunded 5"
    assert calls(log) == Counter({"model": 1, "refund": 1})  # the second request only
    assert store.load(legacy_id) is None  # moved into the run's journal
    assert [e.call for e in stepstone.journal(store, "legacy-wait")] == [
        "support__model.request#1",
        "support__external_event.approve.ask#1",
        "support__external_event.approve#1",
        "support__function_toolset__<agent>.call_tool:refund#1",
        "support__model.request#2",
    ]


def test_a_finished_run_of_the_release_before_reads(store: Store, log: Path) -> None:
    """The release before's finished run: its journal reads under today's names, and
    calling it again runs nothing."""
    _load_legacy(store)
    names = list(read_journal(store, "legacy-done"))
    assert names[0] == "support__model.request#1" and names[-1] == "support__model.request#3"
    assert durable_agent_run(store, "legacy-done", make_agent(), "q") == "answer: v0,v1"
    assert calls(log) == Counter()  # finished: nothing runs
