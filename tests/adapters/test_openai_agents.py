"""OpenAI Agents SDK runs on stepstone: journaled model calls, SIGKILL and resume, approvals.

The agents use a fake ``Model`` behind a fake ``ModelProvider`` (no network); every model
call and tool call appends a line to a log file, so a test counts what ran across
processes. This file is also the child process of the crash and approval tests
(``__main__`` below).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec

import pytest
from agents import (
    Agent,
    FunctionTool,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    Usage,
    function_tool,
)
from agents.testing import assistant_message, function_call

from fresh_stores import DURABLE_BACKENDS, fresh_config
from stepstone import (
    Checkpoint,
    ConflictError,
    InvalidWorkflow,
    RunOwned,
    StepFailed,
    Store,
    Suspended,
    Worker,
    Workflow,
    asignal,
    open_store,
    start,
)
from stepstone._journal import JOURNAL_KEY
from stepstone.adapters._journaled import step_entries
from stepstone.adapters.openai_agents import (
    PREFIX,
    AgentRunStep,
    ConcurrentUnits,
    StepstoneModel,
    StepstoneRunner,
    StepstoneSession,
    aapprove,
    apending_approvals,
    approve,
    areject,
    durable_tool,
    journal_record_id,
    pending_approvals,
)
from stepstone.adapters.openai_agents._journal import MISSING, Journal
from waiting import status_of

DURABLE = DURABLE_BACKENDS
#: Seconds a child process may take (it imports the SDK and opens the store).
CHILD_TIMEOUT = 120.0
LOG_ENV = "STEPSTONE_OA_LOG"
KILL_ENV = "STEPSTONE_OA_KILL"
TOOL_CALLS = 2  # the agent looks up 0 and 1, then answers
P = ParamSpec("P")
LEGACY = Path(__file__).parent / "openai_agents_legacy_records.json"


# --- the fake model and the agents (also built by the child processes) -------------------


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


def _outputs(input: str | list[Any]) -> list[str]:
    """Return the tool outputs the model was sent, in order."""
    if isinstance(input, str):
        return []
    return [
        str(item["output"])
        for item in input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


class FakeModel(Model):
    """Two lookups (``c0``, ``c1``), then an answer; or a refund (``r1``), then done."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        done = _outputs(input)
        _log(f"model {len(done) + 1}")
        if self.kind == "triage":
            out = [function_call("transfer_to_support", {}, call_id="h1")]
        elif self.kind == "refund":
            out = (
                [function_call("refund", {"amount": 5}, call_id="r1")]
                if not done
                else [assistant_message(f"done: {done[0]}")]
            )
        elif len(done) < TOOL_CALLS:
            out = [function_call("lookup", {"x": len(done)}, call_id=f"c{len(done)}")]
        else:
            out = [assistant_message("answer: " + ",".join(done))]
        return ModelResponse(output=out, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


class FakeProvider(ModelProvider):
    """Resolves the model names ``lookup`` and ``refund`` to a ``FakeModel``."""

    def get_model(self, model_name: str | None) -> Model:
        return FakeModel(model_name or "lookup")


def config_() -> RunConfig:
    """The run config of every test: the fake provider, no tracing export."""
    return RunConfig(model_provider=FakeProvider(), tracing_disabled=True)


@function_tool
def lookup(x: int) -> str:
    """Look ``x`` up."""
    _log(f"tool {x}")
    return f"v{x}"


@function_tool(needs_approval=True)
def refund(amount: int) -> str:
    """Refund ``amount``."""
    _log("refund")
    return f"refunded {amount}"


def lookup_agent() -> Agent[Any]:
    """The crash tests' agent: two tool calls, three model calls."""
    return Agent(name="support", model="lookup", tools=[lookup])


def refund_agent() -> Agent[Any]:
    """An agent whose refund tool needs approval."""
    return Agent(name="support", model="refund", tools=[refund])


def synchronously(fn: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an ``async def`` test in its own event loop (no async pytest plugin here)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The call log of this test, in the environment so child processes append to it."""
    path = tmp_path / "calls.log"
    monkeypatch.setenv(LOG_ENV, str(path))
    monkeypatch.delenv(KILL_ENV, raising=False)
    return path


def calls(log: Path) -> Counter[str]:
    """Return how often each model call and tool call ran, by its log line."""
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


def child(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run this file as a child process with ``args``; return when it exits."""
    tests = str(Path(__file__).resolve().parent.parent)
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([tests, full_env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=full_env,
        check=False,
    )


def _journal_calls(store: Store, run_id: str) -> list[str]:
    """The call names of step ``agent``'s entries in the run's journal, in saved order."""
    cp = store.load(run_id)
    assert cp is not None, f"run {run_id!r} not found"
    return [e["call"] for e in step_entries(cp, "agent")]


def _journal_keys(store: Store, run_id: str) -> set[str]:
    return set(_journal_calls(store, run_id))


# --- crash and resume -------------------------------------------------------------------------


def _session_shape(items: list[Any]) -> list[str]:
    """Return each session item as ``user``, ``message`` or its call id."""
    shape = []
    for item in items:
        if item.get("role") == "user":
            shape.append("user")
        elif item.get("type") == "message":
            shape.append("message")
        else:
            shape.append(item["call_id"])
    return shape


def _resume_crash_run(config: str, run_id: str) -> tuple[Any, list[str]]:
    """Resume the crash run in this process from the config string: output, session."""
    with open_store(config) as store:
        session = StepstoneSession(run_id, store, page_bytes=300)
        output = StepstoneRunner.run_sync(
            store, run_id, lookup_agent(), "hi", run_config=config_(), session=session, lease=2
        )
        return output, _session_shape(asyncio.run(session.get_items()))


#: Where each backend's child is killed: inside the second tool call, or inside the
#: last model call (the approval run logs "model 1" and "model 2" too); each backend
#: one kill point, one child.
KILLS = [
    pytest.param(backend, point, id=f"{backend}-{point.replace(' ', '')}")
    for backend, point in [
        ("file", "tool 1"),
        ("sqlite", "tool 1"),
        ("postgresql", "model 3"),
        ("mysql", "tool 1"),
        ("cosmos", "model 3"),
    ]
]


@pytest.mark.crash
@pytest.mark.parametrize(("config", "kill"), KILLS, indirect=["config"])
def test_approval_and_sigkill_across_processes(config: str, kill: str, log: Path) -> None:
    """An agent run waiting for approval holds no process: approved by ``stepstone runs
    signal`` from a second process, a third finishes it; that third process is then
    SIGKILLed inside a tool call (or a model call) of another run, which this process
    resumes from the config string without repeating any finished model call or tool
    call (the interrupted one runs once more) and with each session item stored once."""
    with open_store(config) as store, pytest.raises(Suspended) as waiting:
        StepstoneRunner.run_sync(
            store, "oa-approve", refund_agent(), "refund me", run_config=config_(), lease=2
        )
        assert waiting.value.waiting_for == "signal approval"
    with open_store(config) as store:
        assert pending_approvals(store, "oa-approve") == [
            {"call_id": "r1", "tool": "refund", "arguments": '{"amount":5}', "agent": "support"}
        ]
    assert calls(log) == Counter({"model 1": 1})
    sent = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepstone",
            "runs",
            "signal",
            "--store",
            config,
            "oa-approve",
            "approval",
            "--data",
            '{"call_id": "r1", "approved": true}',
        ],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    killed = child("both", config, "oa-crash", env={KILL_ENV: kill})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert json.loads(killed.stdout.strip().splitlines()[0]) == {"output": "done: refunded 5"}
    # One "model 1" and "model 2" per run: the approval run's ran once each.
    before = Counter({"model 1": 2, "refund": 1, "model 2": 2, "tool 0": 1, "tool 1": 1})
    if kill == "model 3":
        before["model 3"] = 1
    assert calls(log) == before
    output, items = _resume_crash_run(config, "oa-crash")
    assert output == "answer: v0,v1"
    assert items == ["user", "c0", "c0", "c1", "c1", "message"]
    # The interrupted call ran once more; everything finished before it, never again.
    after = before + Counter({kill: 1})
    if kill == "tool 1":
        after["model 3"] = 1
    assert calls(log) == after
    with open_store(config) as store:
        assert pending_approvals(store, "oa-approve") == []
        assert store.load("oa-approve").status == "done"  # type: ignore[union-attr]


def test_persisted_names_are_pinned(log: Path) -> None:
    """The journal names of a run are compatibility data: they never change once stored.
    They are entries of the run's own journal (seq unique, each naming its step); a fresh
    run probes for records of the release before by a few loads, lists nothing, and
    writes no record of its own but the session's."""
    store = open_store("memory://oa-names")
    session = StepstoneSession("s-names", store)
    looked_up: list[str] = []
    load = store.load

    def counting_load(run_id: str) -> Checkpoint | None:
        if run_id.startswith(f"{PREFIX}names/"):
            looked_up.append(run_id.rsplit("/", 1)[1])
        return load(run_id)

    store.load = counting_load  # type: ignore[method-assign]
    output = StepstoneRunner.run_sync(
        store, "names", lookup_agent(), "hi", run_config=config_(), session=session
    )
    assert output == "answer: v0,v1"
    assert looked_up == ["get_response", "session.get_items", "pause#1"]
    assert _journal_calls(store, "names") == [
        "session.get_items",
        "get_response",
        "tool:lookup:c0",
        "get_response#2",
        "tool:lookup:c1",
        "get_response#3",
    ]
    entries = step_entries(load("names"), "agent")  # type: ignore[arg-type]
    assert [e["seq"] for e in entries] == list(range(len(entries)))
    assert {e["step"] for e in entries} == {"agent"}
    assert not [r for r in store.list_runs() if r.startswith(f"{PREFIX}names/")]
    assert journal_record_id("r", "agent", "get_response") == "openai-agents:r/agent/get_response"
    assert journal_record_id("r" * 1100, "agent", "k").startswith("openai-agents:~")
    assert f"{PREFIX}session:s-names" in set(store.list_runs())


@synchronously
async def test_a_failed_run_retried_replays_finished_calls(log: Path) -> None:
    """A run that failed in a tool is resumed by the next call: finished model and tool
    calls are replayed from the journal, only the failed tool runs again."""
    store = open_store("memory://oa-retry")
    fail = {"on": True}

    @function_tool(failure_error_function=None)
    def lookup(x: int) -> str:
        """Look ``x`` up; the second lookup fails the first time."""
        _log(f"tool {x}")
        if x == 1 and fail["on"]:
            raise RuntimeError("backend down")
        return f"v{x}"

    agent: Agent[Any] = Agent(name="support", model="lookup", tools=[lookup])
    with pytest.raises(StepFailed):
        await StepstoneRunner.run(store, "retry", agent, "hi", run_config=config_())
    fail["on"] = False
    assert await StepstoneRunner.run(store, "retry", agent, run_config=config_()) == "answer: v0,v1"
    assert calls(log) == Counter(
        {"model 1": 1, "tool 0": 1, "model 2": 1, "tool 1": 2, "model 3": 1}
    )
    # A finished run returns its output and runs nothing.
    assert await StepstoneRunner.run(store, "retry", agent, run_config=config_()) == "answer: v0,v1"
    assert calls(log)["model 3"] == 1


@synchronously
async def test_tools_not_wrapped_run_again_on_resume(log: Path) -> None:
    """With ``durable_tools=False`` model calls are still journaled but tools re-run."""
    store = open_store("memory://oa-plain-tools")
    fail = {"on": True}

    @function_tool(failure_error_function=None)
    def lookup(x: int) -> str:
        """Look ``x`` up; the second lookup fails the first time."""
        _log(f"tool {x}")
        if x == 1 and fail["on"]:
            raise RuntimeError("backend down")
        return f"v{x}"

    agent: Agent[Any] = Agent(name="support", model="lookup", tools=[lookup])
    with pytest.raises(StepFailed):
        await StepstoneRunner.run(
            store, "plain", agent, "hi", run_config=config_(), durable_tools=False
        )
    fail["on"] = False
    await StepstoneRunner.run(store, "plain", agent, run_config=config_(), durable_tools=False)
    assert calls(log) == Counter(
        {"model 1": 1, "tool 0": 2, "model 2": 1, "tool 1": 2, "model 3": 1}
    )


@synchronously
async def test_journal_entries_are_write_once_and_a_deleted_runs_are_not_replayed(
    log: Path,
) -> None:
    """A journal entry keeps its first value (a stale owner's write cannot replace it);
    a run deleted and started again under its id runs its model calls afresh; a record
    at a journal id that is not an entry is refused."""
    store = open_store("memory://oa-journal")
    # An entry journaled already answers the unit; no save is asked for (no link here).
    entry = {"seq": 0, "call": "get_response", "attempt": 1, "result": {"n": 1}, "step": "agent"}
    cp = Checkpoint(run_id="j", state={JOURNAL_KEY: [entry]})
    journal = Journal(cp, "agent", None, sync=False)
    assert await journal.put("get_response", {"n": 2}) == {"n": 1}
    assert journal.get("get_response") == {"n": 1}
    assert journal.get("get_response#2") is MISSING
    assert Journal(cp, "other", None, sync=False).get("get_response") is MISSING
    # A record at a journal id of the release before that is not an entry: refused.
    await store.asave(Checkpoint(run_id=journal_record_id("j", "agent", "pause#1"), state={}))
    with pytest.raises(ConflictError, match="is not a journal entry"):
        await StepstoneRunner.run(store, "j", lookup_agent(), "hi", run_config=config_())

    agent = lookup_agent()
    assert await StepstoneRunner.run(store, "del", agent, "hi", run_config=config_()) == (
        "answer: v0,v1"
    )
    assert await store.adelete("del")
    assert await StepstoneRunner.run(store, "del", agent, "hi", run_config=config_()) == (
        "answer: v0,v1"
    )
    assert calls(log) == Counter(
        {"model 1": 2, "tool 0": 2, "model 2": 2, "tool 1": 2, "model 3": 2}
    )
    # A record the release before left for a deleted run of the same id (another
    # creation time) is not this run's: not replayed, and deleted.
    stale = journal_record_id("old", "agent", "get_response")
    left = {"format": 1, "run": "old", "step": "agent", "key": "get_response"}
    await store.asave(Checkpoint(run_id=stale, state={**left, "run_created": "then"}))
    assert await StepstoneRunner.run(store, "old", agent, "hi", run_config=config_()) == (
        "answer: v0,v1"
    )
    assert calls(log)["model 1"] == 3
    assert await store.aload(stale) is None


# --- approvals --------------------------------------------------------------------------------


@synchronously
async def test_rejection_sends_its_message_to_the_model(log: Path) -> None:
    """A rejected call never runs; the model gets the rejection message as its output."""
    store = open_store("memory://oa-reject")
    with pytest.raises(Suspended):
        await StepstoneRunner.run(store, "rej", refund_agent(), "refund me", run_config=config_())
    assert [p["call_id"] for p in await apending_approvals(store, "rej")] == ["r1"]
    await areject(store, "rej", "r1", message="not allowed")
    output = await StepstoneRunner.run(store, "rej", refund_agent(), run_config=config_())
    assert output == "done: not allowed"
    assert calls(log) == Counter({"model 1": 1, "model 2": 1})


@synchronously
async def test_a_signal_for_another_call_keeps_the_run_waiting(log: Path) -> None:
    """An approval naming another call decides nothing: the run stays waiting until the
    pending call is decided; an approval that arrived early counts once it is."""
    store = open_store("memory://oa-partial")
    with pytest.raises(Suspended):
        await StepstoneRunner.run(store, "part", refund_agent(), "refund me", run_config=config_())
    await aapprove(store, "part", "other-call")
    await asignal(store, "part", "approval", "yes")  # not an approval: logged, ignored
    with pytest.raises(Suspended):
        await StepstoneRunner.run(store, "part", refund_agent(), run_config=config_())
    assert (await store.aload("part")).status == "waiting"  # type: ignore[union-attr]
    await aapprove(store, "part")  # every pending call
    assert await StepstoneRunner.run(store, "part", refund_agent(), run_config=config_()) == (
        "done: refunded 5"
    )
    assert calls(log) == Counter({"model 1": 1, "refund": 1, "model 2": 1})


@synchronously
async def test_a_second_concurrent_resume_is_refused(log: Path) -> None:
    """While one process resumes an approved run, a second resume gets ``RunOwned`` and
    runs nothing: the stored RunState is never resumed twice at once. (The second one
    watches the record for a third of the lease before it refuses: a 3 s lease here.)"""
    store = open_store("memory://oa-concurrent")
    entered, release = asyncio.Event(), asyncio.Event()

    @function_tool(needs_approval=True)
    async def refund(amount: int) -> str:
        """Refund ``amount``, slowly."""
        _log("refund")
        entered.set()
        await release.wait()
        return f"refunded {amount}"

    agent: Agent[Any] = Agent(name="support", model="refund", tools=[refund])
    with pytest.raises(Suspended):
        await StepstoneRunner.run(store, "conc", agent, "refund me", run_config=config_(), lease=3)
    await aapprove(store, "conc", "r1")
    first = asyncio.create_task(
        StepstoneRunner.run(store, "conc", agent, run_config=config_(), lease=3)
    )
    await asyncio.wait_for(entered.wait(), 30), "the first resume never reached the tool"
    with pytest.raises(RunOwned):
        await StepstoneRunner.run(store, "conc", agent, run_config=config_(), lease=3)
    release.set()
    assert await asyncio.wait_for(first, 30) == "done: refunded 5"
    assert calls(log) == Counter({"model 1": 1, "refund": 1, "model 2": 1})


def test_a_waiting_run_of_the_release_before_resumes(log: Path) -> None:
    """A store written by the release before (``openai_agents_legacy_records.json``, made
    by ``make_openai_agents_legacy.py``) opens: its waiting run resumes on approval,
    its recorded model call and pause answered, not made again."""
    from stepstone._codec import checkpoint_from_doc, decode_document

    records = json.loads(LEGACY.read_text(encoding="utf-8"))
    docs = [decode_document(text, name) for name, text in records.items()]
    store = open_store(f"memory://oa-legacy-{uuid.uuid4().hex}")
    created: dict[str, str] = {}
    for doc in sorted(docs, key=lambda d: d["run_id"].startswith(PREFIX)):  # runs first
        state = doc["state"]
        if doc["run_id"].startswith(PREFIX):
            # A journal entry names its run's creation time, which the store set anew.
            state = {**state, "run_created": created[state["run"]]}
        saved = store.save(checkpoint_from_doc({**doc, "state": state}, None, "fixture"))
        assert saved.created_at is not None
        created[saved.run_id] = saved.created_at.isoformat()
    assert [p["call_id"] for p in pending_approvals(store, "legacy-wait")] == ["r1"]
    approve(store, "legacy-wait", "r1")
    output = StepstoneRunner.run_sync(store, "legacy-wait", refund_agent(), run_config=config_())
    assert output == "done: refunded 5"
    assert calls(log) == Counter({"model 2": 1, "refund": 1})  # not model 1 again
    # Its records moved into the run's journal, by their names, then deleted.
    moved = _journal_calls(store, "legacy-wait")
    assert moved[:3] == ["get_response", "pause#1", "resume#1"]
    assert not [r for r in store.list_runs() if r.startswith(f"{PREFIX}legacy-wait/")]
    done = StepstoneRunner.run_sync(store, "legacy-done", lookup_agent(), run_config=config_())
    assert done == "answer: v0,v1" and calls(log)["model 1"] == 0


def _until(condition: Callable[[], bool], what: str, timeout: float = CHILD_TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def test_a_worker_serves_the_run_and_resumes_it_on_approval(tmp_path: Path, log: Path) -> None:
    """An ``AgentRunStep`` in a queued ``Workflow``: a worker runs it to the approval wait,
    gives it back, and resumes it once the approval signal arrives."""
    with open_store(f"sqlite:///{tmp_path}/w.db") as store:
        step = AgentRunStep(
            "agent", refund_agent(), lambda state: state["q"], store=store, run_config=config_()
        )
        flow = Workflow("oa-refund", [step])
        start(store, flow, "w1", {"q": "refund me"})
        worker = Worker(store, [flow], poll=0.05, lease=3)
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        try:
            _until(lambda: status_of(store, "w1") == "waiting", "the run to wait for approval")
            assert [p["call_id"] for p in pending_approvals(store, "w1")] == ["r1"]
            assert approve(store, "w1", "r1") is True
            _until(lambda: status_of(store, "w1") == "done", "the approved run to finish")
        finally:
            worker.stop()
            thread.join(30)
        cp = store.load("w1")
        assert cp is not None and cp.state["agent"] == "done: refunded 5"
    assert calls(log) == Counter({"model 1": 1, "refund": 1, "model 2": 1})


def test_handoff_targets_are_journaled_too(log: Path) -> None:
    """An agent reached by a handoff gets its model calls and tool calls journaled too."""
    store = open_store("memory://oa-handoff")
    triage: Agent[Any] = Agent(name="triage", model="triage", handoffs=[lookup_agent()])
    output = StepstoneRunner.run_sync(store, "hand", triage, "hi", run_config=config_())
    assert str(output).startswith("answer: ")
    assert _journal_keys(store, "hand") == {
        "get_response",
        "get_response#2",
        "get_response#3",
        "tool:lookup:c1",
    }


# --- refusals ---------------------------------------------------------------------------------


@synchronously
async def test_refusals_say_what_is_wrong() -> None:
    """A RunState input, a value that is not JSON and a tool that is not a FunctionTool
    are refused."""
    store = open_store("memory://oa-refuse")
    with pytest.raises(InvalidWorkflow, match="keeps the RunState itself"):
        result = await Runner.run(refund_agent(), "x", run_config=config_())
        await StepstoneRunner.run(store, "r", refund_agent(), result.to_state())  # type: ignore[arg-type]
    with pytest.raises(InvalidWorkflow, match="not JSON"):
        await StepstoneRunner.run(store, "r2", refund_agent(), [object()])
    with pytest.raises(InvalidWorkflow, match="durable_tool takes a FunctionTool"):
        durable_tool("lookup")  # type: ignore[arg-type]


@synchronously
async def test_concurrent_model_calls_in_one_scope_are_refused(log: Path) -> None:
    """A tool that gathers two sub-agents makes two model calls in one scope at once:
    refused with ``ConcurrentUnits`` (a replay could swap their results)."""
    store = open_store("memory://oa-units")

    @function_tool
    async def fan_out(n: int) -> str:
        """Ask two sub-agents at once (their model journaled: a ``StepstoneModel``)."""
        sub: Agent[Any] = Agent(name="sub", model=StepstoneModel(FanModel("sub")))
        results = await asyncio.gather(
            Runner.run(sub, "a", run_config=config_()), Runner.run(sub, "b", run_config=config_())
        )
        return ",".join(str(r.final_output) for r in results)

    class FanModel(FakeModel):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            given = kwargs["input"] if "input" in kwargs else args[1]
            if self.kind == "fan" and not _outputs(given):
                call = function_call("fan_out", {"n": 2}, call_id="f1")
                return ModelResponse(output=[call], usage=Usage(), response_id=None)
            # The first sub-agent's call stays in flight until the second is refused (the
            # run then fails and its loop cancels this); 30 s bounds a refusal that never comes.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.Event().wait(), 30)
            return ModelResponse(output=[assistant_message("ok")], usage=Usage(), response_id=None)

    class FanProvider(ModelProvider):
        def get_model(self, model_name: str | None) -> Model:
            return FanModel(model_name or "fan")

    agent: Agent[Any] = Agent(name="boss", model="fan", tools=[fan_out])
    run_config = RunConfig(model_provider=FanProvider(), tracing_disabled=True)
    with pytest.raises(StepFailed) as failed:
        await StepstoneRunner.run(store, "units", agent, "go", run_config=run_config)
    assert isinstance(failed.value.__cause__, ConcurrentUnits)


def test_agent_model_instances_are_journaled_too(log: Path) -> None:
    """An agent given a ``Model`` instance (not a name) is journaled like a named one."""
    store = open_store("memory://oa-instance")
    agent: Agent[Any] = Agent(name="support", model=FakeModel("lookup"), tools=[lookup])
    run_config = RunConfig(tracing_disabled=True)
    assert StepstoneRunner.run_sync(store, "inst", agent, "hi", run_config=run_config) == (
        "answer: v0,v1"
    )
    assert "get_response#3" in _journal_keys(store, "inst")
    assert isinstance(durable_tool(lookup), FunctionTool)


# --- the session ------------------------------------------------------------------------------

ALL = ("memory", *DURABLE)
WRITERS = 3
BATCHES = 4


def _batch(writer: str, j: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{writer}-{j}-{half}"} for half in "ab"]


def _check_history(items: list[Any], writers: list[str]) -> None:
    """Every batch is there once, whole (a then b), and each writer's batches in order."""
    contents = [item["content"] for item in items]
    expected = {f"{w}-{j}-{h}" for w in writers for j in range(BATCHES) for h in "ab"}
    assert sorted(contents) == sorted(expected), "items lost or duplicated"
    for position in range(0, len(contents), 2):
        first, second = contents[position], contents[position + 1]
        assert first.endswith("-a") and second == first[:-1] + "b", f"interleaved at {position}"
    for writer in writers:
        mine = [c for c in contents if c.startswith(f"{writer}-") and c.endswith("-a")]
        assert mine == [f"{writer}-{j}-a" for j in range(BATCHES)], f"{writer} out of order"


@pytest.mark.parametrize("config", ALL, indirect=True)
def test_session_concurrent_writers_never_interleave_or_lose_items(config: str) -> None:
    """Threads and tasks appending to one session at once (the head paging older items
    out meanwhile) keep every batch whole and in each writer's order, none lost; reads
    with a limit, pops across a page boundary and clearing see the same history."""
    with open_store(config) as store:
        session = StepstoneSession("chat", store, page_bytes=300)

        async def writer(name: str, session: StepstoneSession = session) -> None:
            for j in range(BATCHES):
                await session.add_items(_batch(name, j))

        async def thread_writer(name: str) -> None:
            # Each thread opens its own store from the config string, as a process would.
            async with open_store(config) as own:
                await writer(name, StepstoneSession("chat", own, page_bytes=300))

        threads = [
            threading.Thread(target=asyncio.run, args=(thread_writer(f"t{i}"),))
            for i in range(WRITERS)
        ]
        for thread in threads:
            thread.start()

        async def tasks() -> None:
            await asyncio.gather(*(writer(f"k{i}") for i in range(WRITERS)))

        asyncio.run(tasks())
        for thread in threads:
            thread.join(CHILD_TIMEOUT)
            assert not thread.is_alive(), "a writer thread hung"

        async def check() -> None:
            # Another object on the same store: nothing is cached in the writer's.
            reader = StepstoneSession("chat", store)
            items = await reader.get_items()
            _check_history(
                items, [f"t{i}" for i in range(WRITERS)] + [f"k{i}" for i in range(WRITERS)]
            )
            head = await store.aload(reader.head_id)
            assert head is not None and head.state["pages"], "the head never paged items out"
            assert await reader.get_items(limit=3) == items[-3:]
            popped = [await reader.pop_item() for _ in range(len(head.state["items"]) + 1)]
            assert popped == items[::-1][: len(popped)]
            assert await reader.get_items() == items[: len(items) - len(popped)]
            await reader.clear_session()
            assert await reader.get_items() == []
            assert await reader.pop_item() is None
            assert [r for r in store.list_runs() if r.startswith(f"{PREFIX}session-page:")] == []

        asyncio.run(check())


def test_session_under_the_sdk_runner_and_bad_input(log: Path) -> None:
    """The SDK's own ``Runner.run`` keeps its history in a ``StepstoneSession``; a second
    turn sees the first; bad arguments are refused with what is allowed."""
    store = open_store("memory://oa-sdk-session")
    session = StepstoneSession("sdk", store)

    async def turns() -> list[Any]:
        await Runner.run(lookup_agent(), "one", run_config=config_(), session=session)
        await Runner.run(lookup_agent(), "two", run_config=config_(), session=session)
        return await session.get_items()

    items = asyncio.run(turns())
    assert [i.get("content") for i in items if i.get("role") == "user"] == ["one", "two"]
    # Turn one: input, two calls and outputs, answer; turn two sees the outputs in its
    # history, so the model answers at once: input and answer.
    assert len(items) == 8
    with pytest.raises(InvalidWorkflow, match="non-empty str"):
        StepstoneSession("", store)
    with pytest.raises(InvalidWorkflow, match="page_bytes"):
        StepstoneSession("x", store, page_bytes=0)
    with pytest.raises(InvalidWorkflow, match="items must be a list"):
        asyncio.run(session.add_items("nope"))  # type: ignore[arg-type]


# --- the child processes ----------------------------------------------------------------------


async def _child_crash(store: Store, run_id: str) -> None:
    session = StepstoneSession(run_id, store, page_bytes=300)
    output = await StepstoneRunner.run(
        store, run_id, lookup_agent(), "hi", run_config=config_(), session=session, lease=2
    )
    print(json.dumps({"output": output}), flush=True)


async def _child(mode: str, config: str, run_id: str) -> None:
    async with open_store(config) as store:
        if mode == "both":
            output = await StepstoneRunner.run(
                store, "oa-approve", refund_agent(), run_config=config_(), lease=2
            )
            print(json.dumps({"output": output}), flush=True)
        await _child_crash(store, run_id)


if __name__ == "__main__":
    asyncio.run(_child(*sys.argv[1:4]))
