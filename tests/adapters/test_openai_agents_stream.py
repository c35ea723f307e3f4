"""The OpenAI Agents SDK's streamed runs under stepstone: events on the run's stream, durably.

The agent's model is the SDK's own ``ScriptedModel`` (no network): it streams each
scripted response as the real Responses API does, and a call beyond its script fails,
so a test that passes paid every model call once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from fresh_stores import fresh_config
from stepstone import InvalidWorkflow, RetryPolicy, Step, open_store, run, stream
from stepstone._stream import _writer
from stepstone.adapters._clip import CLIP
from stepstone.adapters.openai_agents import AgentRunStep, StepstoneRunner

KINDS = ("memory", "sqlite")


def _agent(fail_first: bool) -> tuple[Agent[Any], dict[str, int]]:
    """An agent that says a line, looks a number up, then answers; the lookup may fail once."""
    calls = {"lookup": 0}

    @function_tool(failure_error_function=None)
    def lookup(n: int) -> str:
        calls["lookup"] += 1
        if fail_first and calls["lookup"] == 1:
            raise RuntimeError("the lookup service timed out")
        return f"value {n * 42}"

    model = ScriptedModel(
        [
            [
                assistant_message("Let me look.", item_id="m1"),
                function_call("lookup", '{"n": 1}', call_id="c1"),
            ],
            [assistant_message("It is 42.", item_id="m2")],
        ]
    )
    return Agent(name="helper", model=model, tools=[lookup]), calls


@pytest.mark.parametrize("kind", KINDS)
def test_run_streamed_emits_tokens_and_tool_events(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    agent, _ = _agent(fail_first=False)
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        output = asyncio.run(
            StepstoneRunner.run(store, "oa-stream", agent, "what is it?", stream=True)
        )
        assert output == "It is 42."
        events = [(e.topic, e.data) for e in stream(store, "oa-stream", follow=False)]
    assert events == [
        ("agent", "helper"),
        ("tokens", "Let me look."),
        ("tool", {"event": "called", "name": "lookup", "call_id": "c1", "arguments": '{"n": 1}'}),
        ("tool", {"event": "output", "call_id": "c1", "output": "value 42"}),
        ("tokens", "It is 42."),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_retried_attempt_replays_its_model_calls_and_hides_the_failed_attempt(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    agent, calls = _agent(fail_first=True)
    step = AgentRunStep(
        "agent",
        agent,
        "what is it?",
        stream=True,
        retry=RetryPolicy(max_attempts=2, initial_delay=0),
    )
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        step.store = store
        state = run("oa-retry", [step], store)
        assert state["agent"] == "It is 42."
        assert calls["lookup"] == 2  # the tool ran again; the model's first call did not
        shown = [(e.topic, e.data) for e in stream(store, "oa-retry", follow=False)]
        everything = list(stream(store, "oa-retry", follow=False, superseded=True))
    # The committing attempt emitted the whole answer: its replayed first call included.
    assert [d for t, d in shown if t == "tokens"] == ["Let me look.", "It is 42."]
    assert [d["event"] for t, d in shown if t == "tool"] == ["called", "output"]
    hidden = [(e.topic, e.data) for e in everything if e.superseded]
    assert ("tokens", "Let me look.") in hidden  # the failed attempt's, marked
    assert all(e.attempt == 1 for e in everything if e.superseded)


def test_a_huge_tool_output_is_clipped_in_its_event(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A tool output over the stream's event limit does not fail the step: its event
    carries the first ``CLIP`` characters (the journal keeps the whole output)."""

    @function_tool
    def dump() -> str:
        return "x" * 100_000

    model = ScriptedModel(
        [[function_call("dump", "{}", call_id="d1")], [assistant_message("Done.")]]
    )
    agent: Agent[Any] = Agent(name="helper", model=model, tools=[dump])
    with open_store(fresh_config("memory", request, tmp_path)) as store:
        step = AgentRunStep("agent", agent, "dump it", store=store, stream=True)
        assert run("oa-huge", [step], store)["agent"] == "Done."
        tools = [e.data for e in stream(store, "oa-huge", topic="tool", follow=False)]
    output = tools[1]["output"]
    assert output.startswith("x" * CLIP) and output.endswith("[84000 more characters]")


def test_stream_must_be_a_bool() -> None:
    agent, _ = _agent(fail_first=False)
    with pytest.raises(InvalidWorkflow, match="stream must be True or False"):
        AgentRunStep("agent", agent, "hi", stream="yes")  # type: ignore[arg-type]


def test_streamed_runs_beside_plain_steps_sync(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    agent, _ = _agent(fail_first=False)

    def before(state: dict[str, Any], ctx: Any) -> None:
        ctx.emit("progress", "starting")

    with open_store(fresh_config("sqlite", request, tmp_path)) as store:
        step = AgentRunStep("agent", agent, "what is it?", store=store, stream=True)
        run("oa-mixed", [Step("before", before), step], store)
        topics = [e.topic for e in stream(store, "oa-mixed", follow=False)]
    assert topics[0] == "progress" and topics.count("tokens") == 2


# --- a streamed run SIGKILLed and resumed in another process --------------------------------

KILL_ENV = "STEPSTONE_OA_STREAM_KILL"
#: Seconds the child may take (it imports the SDK and opens the store).
CHILD_TIMEOUT = 120.0


def _crash_agent(first_call: bool) -> Agent[Any]:
    """The agent of the crash test; its model scripts the first call only in the child."""

    @function_tool(failure_error_function=None)
    def lookup(n: int) -> str:
        if os.environ.get(KILL_ENV):
            attempt = _writer.current.get()
            assert attempt is not None and attempt.writer is not None
            attempt.writer.flush()  # the killed attempt's tokens are stored: hidden later
            os.kill(os.getpid(), signal.SIGKILL)
        return f"value {n * 42}"

    steps: list[Any] = [[assistant_message("It is 42.", item_id="m2")]]
    if first_call:
        first = [
            assistant_message("Let me look.", item_id="m1"),
            function_call("lookup", '{"n": 1}', call_id="c1"),
        ]
        steps.insert(0, first)
    return Agent(name="helper", model=ScriptedModel(steps), tools=[lookup])


@pytest.mark.crash
@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_sigkill_mid_stream_then_resume_elsewhere(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A child streams the first model call, then is SIGKILLed inside the tool; this
    process resumes the run from the config string: the first call is replayed from the
    journal (this process's model scripts only the second), and a reader sees the whole
    answer once, from the committing attempt; the killed attempt's tokens are hidden."""
    config = fresh_config(kind, request, tmp_path)
    env = {**os.environ, KILL_ENV: "1"}
    # This file is the child's script, importing the tests' shared modules (fresh_stores):
    # their directory first, then whatever PYTHONPATH there is (none, under CI).
    tests = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH", "")) if p)
    killed = subprocess.run(
        [sys.executable, __file__, config],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=env,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with open_store(config) as store:
        before = [e.data for e in stream(store, "oa-kill", follow=False, superseded=True)]
        assert "Let me look." in before  # the killed attempt flushed it
        output = StepstoneRunner.run_sync(
            store, "oa-kill", _crash_agent(first_call=False), "what?", stream=True, lease=1
        )
        assert output == "It is 42."
        shown = [(e.topic, e.data) for e in stream(store, "oa-kill", follow=False)]
        everything = list(stream(store, "oa-kill", follow=False, superseded=True))
    assert [d for t, d in shown if t == "tokens"] == ["Let me look.", "It is 42."]
    assert [d["event"] for t, d in shown if t == "tool"] == ["called", "output"]
    assert [e.data for e in everything if e.superseded and e.topic == "tokens"] == ["Let me look."]


if __name__ == "__main__":
    with open_store(sys.argv[1]) as child_store:
        StepstoneRunner.run_sync(
            child_store, "oa-kill", _crash_agent(first_call=True), "what?", stream=True, lease=1
        )
