"""The Agent Framework checkpoint storage on every backend, with the real ``agent_framework``.

The protocol's behaviour (save, load, list, delete, get_latest, ids by workflow name) on
all six backends; a real MAF workflow SIGKILLed inside an executor and resumed with
``checkpoint_id`` by a fresh process that reopens the store from its config string; two
processes writing one checkpoint id with different content. Run as a script, this file
is the child process of those tests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Never

import pytest
from agent_framework import (
    Agent,
    AgentExecutor,
    BaseChatClient,
    ChatResponse,
    CheckpointStorage,
    Executor,
    InMemoryCheckpointStorage,
    Message,
    WorkflowBuilder,
    WorkflowCheckpoint,
    WorkflowContext,
    WorkflowEvent,
    WorkflowMessage,
    WorkflowRunState,
    handler,
    response_handler,
)
from agent_framework.exceptions import WorkflowCheckpointException

from fresh_stores import BACKENDS, DURABLE_BACKENDS, fresh_config
from stepstone import ConflictError, InvalidState, open_store
from stepstone.adapters.agent_framework import (
    AgentFrameworkCheckpointError,
    CheckpointNotFound,
    StepstoneCheckpointStorage,
    parse_record_id,
    record_id,
)

WORKFLOW = "pipeline"
STAGES = ("fetch", "parse", "think", "write", "publish")
DURABLE = DURABLE_BACKENDS
#: Seconds a child process may take (it imports MAF and opens the store).
CHILD_TIMEOUT = 180.0


# --- the workflow the crash tests run (also imported by the child processes) ----------


class Stage(Executor):
    """One stage of a chain: logs that it ran, then passes the list on with its name.

    ``STAGE_HANG`` names a stage that, once logged, signals the parent and hangs until
    it is killed: the crash happens inside an executor, after earlier supersteps were
    checkpointed.
    """

    def __init__(self, name: str, log: Path, last: bool) -> None:
        super().__init__(id=name)
        self.log = log
        self.last = last

    @handler
    async def run(self, done: list[str], ctx: WorkflowContext[list[str], list[str]]) -> None:
        """Run the stage."""
        with self.log.open("a", encoding="utf-8") as f:
            f.write(self.id + "\n")
        if os.environ.get("STAGE_HANG") == self.id:
            Path(f"{self.log}.hanging").write_text(self.id, encoding="utf-8")  # noqa: ASYNC240 - a tiny marker file for the test
            await asyncio.sleep(3600)
        if self.last:
            await ctx.yield_output([*done, self.id])
        else:
            await ctx.send_message([*done, self.id])


def build(storage: Any, log: Path) -> Any:
    """Return the five-stage workflow, checkpointed into ``storage``."""
    stages = [Stage(name, log, last=i == len(STAGES) - 1) for i, name in enumerate(STAGES)]
    builder = WorkflowBuilder(start_executor=stages[0], checkpoint_storage=storage, name=WORKFLOW)
    for a, b in itertools.pairwise(stages):
        builder = builder.add_edge(a, b)
    return builder.build()


class Reviewer(Executor):
    """Asks a human whether to publish (a ``request_info``), then reports the answer."""

    @handler
    async def draft(self, topic: str, ctx: WorkflowContext[Never, str]) -> None:
        """Ask."""
        await ctx.request_info({"question": f"publish the post on {topic}?"}, bool)

    @response_handler
    async def answered(
        self, request: dict[str, str], approved: bool, ctx: WorkflowContext[Never, str]
    ) -> None:
        """Report the answer."""
        await ctx.yield_output(f"{request['question']} {'yes' if approved else 'no'}")


def build_review(storage: Any) -> Any:
    """Return the one-executor human-in-the-loop workflow."""
    return WorkflowBuilder(
        start_executor=Reviewer(id="reviewer"), checkpoint_storage=storage, name="review"
    ).build()


class CountedModel(BaseChatClient):
    """A fake chat model (no API): logs each call and answers from the last message.

    With ``STAGE_HANG`` naming its agent, the call signals the parent and hangs until the
    process is killed: the crash happens inside a model call.
    """

    def __init__(self, agent: str, log: Path) -> None:
        super().__init__()
        self.agent = agent
        self.log = log

    async def _inner_get_response(
        self, *, messages: Any, stream: bool, options: Any, **_: Any
    ) -> Any:
        with self.log.open("a", encoding="utf-8") as f:
            f.write(self.agent + "\n")
        if os.environ.get("STAGE_HANG") == self.agent:
            Path(f"{self.log}.hanging").write_text(self.agent, encoding="utf-8")  # noqa: ASYNC240 - a tiny marker file for the test
            await asyncio.sleep(3600)
        text = messages[-1].text
        return ChatResponse(
            messages=[Message(role="assistant", contents=[f"{self.agent}({text})"])]
        )


def build_agents(storage: Any, log: Path) -> Any:
    """Return a writer agent feeding an editor agent, each on a counted fake model."""
    writer, editor = (
        AgentExecutor(Agent(client=CountedModel(name, log), name=name, instructions=name), id=name)
        for name in ("writer", "editor")
    )
    return (
        WorkflowBuilder(start_executor=writer, checkpoint_storage=storage, name="agents")
        .add_edge(writer, editor)
        .build()
    )


def ran(log: Path) -> list[str]:
    """Return the stages that started, in order, as the log recorded them."""
    return log.read_text(encoding="utf-8").split() if log.exists() else []


# --- backends ---------------------------------------------------------------------------


@pytest.fixture
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of the backend named by the parameter, as a config string.

    (Cosmos DB's key goes in the environment, so the child processes find it as the
    parent does.)
    """
    return fresh_config(str(request.param), request, tmp_path)


every_backend = pytest.mark.parametrize("config", BACKENDS, indirect=True)
durable_backends = pytest.mark.parametrize("config", DURABLE, indirect=True)


def checkpoint(
    workflow: str = WORKFLOW,
    *,
    at: str,
    previous: str | None = None,
    checkpoint_id: str | None = None,
    state: dict[str, Any] | None = None,
) -> WorkflowCheckpoint:
    """Return a checkpoint with messages and nested state, timestamped ``at``."""
    return WorkflowCheckpoint(
        workflow_name=workflow,
        graph_signature_hash="abc123",
        checkpoint_id=checkpoint_id or str(uuid.uuid4()),
        previous_checkpoint_id=previous,
        timestamp=at,
        messages={
            "fetch": [WorkflowMessage(data={"text": "héllo", "n": [1, 2.5]}, source_id="fetch")]
        },
        state=state
        or {
            "_executor_state": {"fetch": {"count": 3}},
            "user": {"k": None},
            # A str enum of MAF's: must come back as the enum, not as its str value.
            "phase": WorkflowRunState.IN_PROGRESS,
        },
        iteration_count=2,
        metadata={"superstep": 2},
    )


def run(coro: Any) -> Any:
    """Run one coroutine on a fresh event loop."""
    return asyncio.run(coro)


# --- the protocol on every backend ------------------------------------------------------


@every_backend
def test_protocol_round_trip_filter_order_and_delete(config: str) -> None:
    """save/load/list/get_latest/delete behave as MAF's storages do, filtered by workflow name.

    Checkpoints are saved out of timestamp order: listings are oldest first and
    ``get_latest`` is the newest by MAF's timestamp, not by when it was written.
    """

    async def scenario() -> None:
        first = checkpoint(at="2026-01-01T10:00:00.000001+00:00")
        second = checkpoint(at="2026-01-01T10:00:01+00:00", previous=first.checkpoint_id)
        third = checkpoint(at="2026-01-01T10:00:02.5+00:00", previous=second.checkpoint_id)
        other = checkpoint("other/flow", at="2026-01-01T11:00:00+00:00")
        async with StepstoneCheckpointStorage(config) as storage:
            for cp in (third, first, other, second):
                assert await storage.save(cp) == cp.checkpoint_id
        # A fresh storage object on the same config string: nothing comes from memory.
        async with StepstoneCheckpointStorage(config) as storage:
            assert await storage.load(second.checkpoint_id) == second
            loaded = await storage.load(first.checkpoint_id)
            assert loaded == first and loaded is not first
            assert isinstance(loaded.messages["fetch"][0], WorkflowMessage)
            assert type(loaded.state["phase"]) is WorkflowRunState
            ids = [first.checkpoint_id, second.checkpoint_id, third.checkpoint_id]
            assert await storage.list_checkpoint_ids(workflow_name=WORKFLOW) == ids
            assert await storage.list_checkpoints(workflow_name=WORKFLOW) == [first, second, third]
            assert await storage.list_checkpoints(workflow_name="other/flow") == [other]
            assert await storage.get_latest(workflow_name=WORKFLOW) == third
            assert await storage.get_latest(workflow_name="nobody") is None
            assert await storage.list_checkpoint_ids(workflow_name="nobody") == []
            assert await storage.delete(third.checkpoint_id) is True
            assert await storage.delete(third.checkpoint_id) is False
            assert await storage.get_latest(workflow_name=WORKFLOW) == second
            with pytest.raises(WorkflowCheckpointException, match="No checkpoint found"):
                await storage.load(third.checkpoint_id)
        async with StepstoneCheckpointStorage(config) as storage:
            with pytest.raises(CheckpointNotFound):
                await storage.load(third.checkpoint_id)
            assert await storage.delete(third.checkpoint_id) is False

    run(scenario())


@every_backend
def test_write_once_idempotent_and_conflict(config: str) -> None:
    """The same checkpoint again is a no-op; other content under its id is a ConflictError."""

    async def scenario() -> None:
        cp = checkpoint(at="2026-01-01T10:00:00+00:00")
        async with StepstoneCheckpointStorage(config) as storage:
            await storage.save(cp)
            await storage.save(cp)  # a retry: same content, accepted
        async with StepstoneCheckpointStorage(config) as storage:
            await storage.save(checkpoint(at=cp.timestamp, checkpoint_id=cp.checkpoint_id))
            changed = checkpoint(
                at=cp.timestamp, checkpoint_id=cp.checkpoint_id, state={"other": "content"}
            )
            with pytest.raises(ConflictError, match="write-once") as caught:
                await storage.save(changed)
            assert storage.last_error is caught.value
            assert await storage.load(cp.checkpoint_id) == cp
            assert await storage.list_checkpoint_ids(workflow_name=WORKFLOW) == [cp.checkpoint_id]

    run(scenario())


@every_backend
def test_concurrent_writers_of_one_id_in_one_process(config: str) -> None:
    """Two storages racing to save one id with different content: exactly one lands."""

    async def scenario() -> None:
        cpid = str(uuid.uuid4())
        storages = [StepstoneCheckpointStorage(config) for _ in range(2)]
        try:
            results = await asyncio.gather(
                *(
                    s.save(
                        checkpoint(
                            at="2026-01-01T10:00:00+00:00", checkpoint_id=cpid, state={"w": n}
                        )
                    )
                    for n, s in enumerate(storages)
                ),
                return_exceptions=True,
            )
        finally:
            for s in storages:
                await s.aclose()
        conflicts = [r for r in results if isinstance(r, ConflictError)]
        assert len(conflicts) == 1 and results.count(cpid) == 1, results
        winner = results.index(cpid)
        async with StepstoneCheckpointStorage(config) as storage:
            assert (await storage.load(cpid)).state == {"w": winner}

    run(scenario())


@every_backend
def test_records_are_named_and_at_rest(config: str) -> None:
    """Each checkpoint is one record ``maf/<workflow>/<id>``, status done, aged by its timestamp."""

    async def scenario() -> None:
        cp = checkpoint("team/a b", at="2026-03-04T05:06:07.123456+00:00", checkpoint_id="id/1 %")
        async with StepstoneCheckpointStorage(config) as storage:
            await storage.save(cp)
        rid = record_id("team/a b", cp.checkpoint_id)
        assert rid == "maf/team%2Fa%20b/id%2F1%20%25"
        assert parse_record_id(rid) == ("team/a b", cp.checkpoint_id)
        with open_store(config) as store:
            (info,) = [i for i in store.list_info() if i.run_id.startswith("maf/")]
            record = store.load(rid)
        assert info.run_id == rid and info.status == "done"
        assert info.updated_at is not None
        assert info.updated_at.isoformat() == "2026-03-04T05:06:07.123456+00:00"
        assert record is not None and record.workflow == "maf"
        assert record.state["encoding"] == "json"
        assert record.state["checkpoint"]["messages"]["fetch"][0]["data"]["text"] == "héllo"
        async with StepstoneCheckpointStorage(config) as storage:
            assert await storage.load("id/1 %") == cp

    run(scenario())


def test_cli_lists_checkpoints_beside_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``stepstone runs list`` names MAF checkpoints by kind, beside ordinary runs."""
    from stepstone import Checkpoint
    from stepstone.cli import main

    config = f"sqlite:///{tmp_path}/runs.db"
    cp = checkpoint(at="2026-01-01T10:00:00+00:00")
    run(StepstoneCheckpointStorage(config).save(cp))
    with open_store(config) as store:
        store.save(Checkpoint(run_id="order-7", total_steps=3))
        # The other adapters' id shapes (their records, as the CLI sees them).
        store.save(Checkpoint(run_id="langgraph/chat-1/%20/abc", total_steps=0))
        store.save(Checkpoint(run_id="order-7/1/pydantic-ai-journal", total_steps=0))
    assert main(["runs", "list", "--store", config]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["RUN_ID", "KIND", "STATUS"]
    rows = {line.split()[0]: line.split()[1:4] for line in lines[1:]}
    assert rows == {
        record_id(WORKFLOW, cp.checkpoint_id): ["maf", "done", "-"],
        "order-7": ["run", "running", "0/3"],
        "langgraph/chat-1/%20/abc": ["langgraph", "done", "-"],
        "order-7/1/pydantic-ai-journal": ["pydantic-ai", "done", "-"],
    }
    assert main(["runs", "list", "--store", config, "--json"]) == 0
    kinds = {r["run_id"]: r["kind"] for r in json.loads(capsys.readouterr().out)}
    assert kinds[record_id(WORKFLOW, cp.checkpoint_id)] == "maf" and kinds["order-7"] == "run"


@pytest.mark.parametrize("config", ["cosmos"], indirect=True)
def test_a_checkpoint_over_the_item_limit_is_stored_in_pieces(config: str) -> None:
    """On Cosmos (2 MB items) a 2.2 MB checkpoint is kept in piece items: saved, listed
    and loaded back whole."""

    async def scenario() -> None:
        big = checkpoint(at="2026-01-01T10:00:00+00:00", state={"blob": "x" * 2_200_000})
        async with StepstoneCheckpointStorage(config) as storage:
            await storage.save(big)
            ids = await storage.list_checkpoint_ids(workflow_name=WORKFLOW)
            assert ids == [big.checkpoint_id]
            assert await storage.load(big.checkpoint_id) == big

    run(scenario())


# --- encoding: JSON only unless the user opts in ----------------------------------------


@dataclass
class Custom:
    """A value that is not JSON."""

    x: int


def test_non_json_refused_with_its_path() -> None:
    """A value of an undeclared type is refused with its path and a hint; nothing is stored."""

    async def scenario() -> None:
        config = f"memory://maf-{uuid.uuid4().hex}"
        storage = StepstoneCheckpointStorage(config)
        cp = checkpoint(at="2026-01-01T10:00:00+00:00")
        cp.messages["fetch"][0].data = {"text": Custom(1)}
        with pytest.raises(InvalidState, match="allowed_checkpoint_types") as caught:
            await storage.save(cp)
        assert caught.value.path == "checkpoint['messages']['fetch'][0]['data']['text']"
        opaque = checkpoint(at="2026-01-01T10:00:00+00:00", state={"lock": object()})
        with pytest.raises(InvalidState, match=r"checkpoint\['state'\]\['lock'\]: a object"):
            await storage.save(opaque)
        asking = checkpoint(at="2026-01-01T10:00:00+00:00")
        asking.pending_request_info_events = {
            "r1": WorkflowEvent.request_info("r1", "reviewer", Custom(1), bool)
        }
        with pytest.raises(InvalidState) as caught:
            await storage.save(asking)
        assert caught.value.path == "checkpoint['pending_request_info_events']['r1']['data']"
        late = checkpoint(at="yesterday")
        with pytest.raises(InvalidState, match="ISO 8601"):
            await storage.save(late)
        assert await storage.list_checkpoint_ids(workflow_name=WORKFLOW) == []

    run(scenario())


def test_maf_encoding_is_opt_in_both_ways(tmp_path: Path) -> None:
    """encoding='maf' stores what MAF would pickle; a JSON-only storage refuses to unpickle it."""

    async def scenario() -> None:
        config = f"sqlite:///{tmp_path}/runs.db"
        cp = checkpoint(at="2026-01-01T10:00:00+00:00", state={"when": (1, 2), "obj": Custom(7)})
        allowed = [f"{Custom.__module__}:{Custom.__qualname__}"]
        async with StepstoneCheckpointStorage(
            config, encoding="maf", allowed_checkpoint_types=allowed
        ) as storage:
            await storage.save(cp)
            assert await storage.load(cp.checkpoint_id) == cp
        async with StepstoneCheckpointStorage(config) as storage:
            with pytest.raises(AgentFrameworkCheckpointError, match="pickle"):
                await storage.load(cp.checkpoint_id)
        async with StepstoneCheckpointStorage(config, encoding="maf") as storage:
            # Custom is not in MAF's allow-list without allowed_checkpoint_types.
            with pytest.raises(WorkflowCheckpointException, match="blocked"):
                await storage.load(cp.checkpoint_id)

    run(scenario())


@pytest.mark.process
def test_import_stepstone_does_not_import_the_framework() -> None:
    """``import stepstone`` (and the adapters package) stays free of agent_framework."""
    code = (
        "import sys, stepstone, stepstone.adapters; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'agent_framework'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert json.loads(out.replace("'", '"')) == []


def test_bad_options_are_config_errors() -> None:
    """An unknown encoding, or a malformed allow-list entry, is refused at construction."""
    from stepstone import ConfigError

    with pytest.raises(ConfigError, match="encoding must be one of"):
        StepstoneCheckpointStorage("memory://x", encoding="pickle")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'module:qualname'"):
        StepstoneCheckpointStorage("memory://x", allowed_checkpoint_types=["a.B"])


def test_same_id_under_two_workflows_is_ambiguous_for_load() -> None:
    """An id saved under two workflow names is not guessed at: load says which exist."""

    async def scenario() -> None:
        config = f"memory://maf-{uuid.uuid4().hex}"
        async with StepstoneCheckpointStorage(config) as storage:
            await storage.save(checkpoint("a", at="2026-01-01T10:00:00+00:00", checkpoint_id="x"))
            await storage.save(checkpoint("b", at="2026-01-01T10:00:00+00:00", checkpoint_id="x"))
        async with StepstoneCheckpointStorage(config) as storage:
            with pytest.raises(AgentFrameworkCheckpointError, match=r"\['a', 'b'\]"):
                await storage.load("x")
            assert [c.workflow_name for c in await storage.list_checkpoints(workflow_name="b")] == [
                "b"
            ]

    run(scenario())


def test_behaves_like_maf_in_memory_storage() -> None:
    """The same workflow run through MAF's InMemoryCheckpointStorage and ours checkpoints alike."""

    async def scenario(tmp: Path) -> None:
        theirs = InMemoryCheckpointStorage()
        # Typed as MAF's protocol: mypy checks that the signatures match it.
        ours: CheckpointStorage = StepstoneCheckpointStorage(f"memory://maf-{uuid.uuid4().hex}")
        for storage in (theirs, ours):
            result = await build(storage, tmp / f"{id(storage)}.log").run([])
            assert result.get_outputs() == [list(STAGES)]
        mine = await ours.list_checkpoints(workflow_name=WORKFLOW)
        base = sorted(
            await theirs.list_checkpoints(workflow_name=WORKFLOW), key=lambda c: c.timestamp
        )
        assert [c.iteration_count for c in mine] == [c.iteration_count for c in base]
        assert [c.messages for c in mine] == [c.messages for c in base]
        assert [c.state for c in mine] == [c.state for c in base]
        latest = await ours.get_latest(workflow_name=WORKFLOW)
        assert latest is not None and latest.checkpoint_id == mine[-1].checkpoint_id

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        run(scenario(Path(tmp)))


def test_agent_checkpoints_round_trip_with_framework_types(tmp_path: Path) -> None:
    """Chat Messages and AgentExecutorResponses come back as themselves, with no pickle."""
    from agent_framework import AgentExecutorResponse

    from stepstone.adapters.agent_framework._encoding import encode_json as _encode_json

    async def scenario() -> None:
        storage = StepstoneCheckpointStorage(f"memory://maf-{uuid.uuid4().hex}")
        await build_agents(storage, tmp_path / "models.log").run("hi")
        loaded = await storage.list_checkpoints(workflow_name="agents")
        assert len(loaded) >= 3
        after_writer = loaded[1]
        (message,) = after_writer.messages["writer"]
        assert isinstance(message.data, AgentExecutorResponse)
        assert message.data.agent_response.text == "writer(hi)"
        conversation = after_writer.state["_executor_state"]["writer"]["full_conversation"]
        assert all(isinstance(m, Message) for m in conversation)
        assert [m.text for m in conversation] == ["hi", "writer(hi)"]
        with storage.store as store:
            for cp in loaded:
                record = store.load(f"maf/agents/{cp.checkpoint_id}")
                assert record is not None
                # Loading and encoding again gives back exactly what is stored.
                assert _encode_json(cp) == record.state["checkpoint"]

    run(scenario())


def test_a_stored_type_tag_builds_only_agent_framework_types() -> None:
    """A record naming a type outside Agent Framework's packages is refused as corrupt."""
    from stepstone import Checkpoint, CorruptCheckpoint

    async def scenario() -> None:
        config = f"memory://maf-{uuid.uuid4().hex}"
        cp = checkpoint(at="2026-01-01T10:00:00+00:00")
        async with StepstoneCheckpointStorage(config) as storage:
            await storage.save(cp)
        rid = record_id(WORKFLOW, cp.checkpoint_id)
        with open_store(config) as store:
            record = store.load(rid)
            assert record is not None
            state = json.loads(json.dumps(record.state))
            state["checkpoint"]["state"] = {"__stepstone_maf_type__": "os:system", "value": "x"}
            store.save(Checkpoint(run_id=rid, state=state, version=record.version))
        async with StepstoneCheckpointStorage(config) as storage:
            with pytest.raises(CorruptCheckpoint, match="not an Agent Framework type"):
                await storage.load(cp.checkpoint_id)

    run(scenario())


# --- crash and resume -------------------------------------------------------------------


def _child(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    # This file is the child's script: it imports the tests' shared modules (fresh_stores),
    # so their directory goes on the child's path (a script's own is tests/adapters/).
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], what: str) -> None:
    """Wait until ``path`` exists; fail naming ``what`` if the child dies or hangs first."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not path.exists():
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"{what}: child exited {proc.returncode} first: {err[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what} did not happen within {CHILD_TIMEOUT:.0f}s")
        time.sleep(0.02)


def _finish(proc: subprocess.Popen[str], what: str) -> str:
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{what} hung: killed after {CHILD_TIMEOUT:.0f}s") from None
    assert proc.returncode == 0, f"{what} exited {proc.returncode}: {err[-3000:]}"
    return out


@pytest.mark.crash
@durable_backends
def test_sigkill_inside_an_executor_then_resume_from_get_latest(
    config: str, tmp_path: Path
) -> None:
    """SIGKILLed inside a stage, a fresh process resumes at get_latest's checkpoint_id.

    The stages that finished before the kill never run again; the killed one runs once more;
    the run's output is what an uninterrupted run gives.
    """
    log = tmp_path / "stages.log"
    first = _child("run", config, str(log), env={"STAGE_HANG": "think"})
    _wait_for(Path(f"{log}.hanging"), first, "the first process reaching stage 'think'")
    first.send_signal(signal.SIGKILL)
    first.wait(CHILD_TIMEOUT)
    assert first.returncode == -signal.SIGKILL
    assert ran(log) == ["fetch", "parse", "think"]

    resumed = json.loads(_finish(_child("resume", config, str(log)), "the resuming process"))
    assert resumed["outputs"] == [list(STAGES)]
    assert ran(log) == ["fetch", "parse", "think", "think", "write", "publish"]
    # It resumed from the checkpoint taken after 'parse' (superstep 2), the newest one.
    assert resumed["resumed_from"]["iteration_count"] == 2
    assert resumed["resumed_from"]["sources"] == ["parse"]

    async def history() -> list[WorkflowCheckpoint]:
        async with StepstoneCheckpointStorage(config) as storage:
            return await storage.list_checkpoints(workflow_name=WORKFLOW)

    chain = run(history())
    ids = {c.checkpoint_id for c in chain}
    # The resumed run's checkpoints chain on to the one it resumed from.
    assert resumed["resumed_from"]["checkpoint_id"] in ids
    assert any(c.previous_checkpoint_id == resumed["resumed_from"]["checkpoint_id"] for c in chain)


def test_resume_in_process_on_memory(tmp_path: Path) -> None:
    """memory:// outlives no process: a run cancelled inside a stage resumes from a new storage."""

    async def scenario() -> None:
        config = f"memory://maf-{uuid.uuid4().hex}"
        log = tmp_path / "stages.log"
        os.environ["STAGE_HANG"] = "think"
        try:
            task = asyncio.ensure_future(build(StepstoneCheckpointStorage(config), log).run([]))
            deadline = time.monotonic() + 60
            while not Path(f"{log}.hanging").exists():  # noqa: ASYNC240 - polls a marker file another process writes
                assert time.monotonic() < deadline, "the run never reached stage 'think'"
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            del os.environ["STAGE_HANG"]
        storage = StepstoneCheckpointStorage(config)
        latest = await storage.get_latest(workflow_name=WORKFLOW)
        assert latest is not None and latest.iteration_count == 2
        result = await build(storage, log).run(checkpoint_id=latest.checkpoint_id)
        assert result.get_outputs() == [list(STAGES)]
        assert ran(log) == ["fetch", "parse", "think", "think", "write", "publish"]

    run(scenario())


@pytest.mark.crash
@durable_backends
def test_two_processes_write_one_checkpoint_id(config: str, tmp_path: Path) -> None:
    """Two processes saving one checkpoint id with different content: one wins, one conflicts."""
    cpid = str(uuid.uuid4())
    go = tmp_path / "go"
    writers = [_child("write", config, cpid, str(n), str(go)) for n in (1, 2)]
    for n, proc in enumerate(writers, 1):
        _wait_for(tmp_path / f"go.ready{n}", proc, f"writer {n} getting ready")
    go.touch()
    results = [json.loads(_finish(p, f"writer {n}")) for n, p in enumerate(writers, 1)]
    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes == ["conflict", "saved"], results
    (winner,) = [r["writer"] for r in results if r["outcome"] == "saved"]
    (loser,) = [r for r in results if r["outcome"] == "conflict"]
    assert "write-once" in loser["error"] and loser["type"] == "ConflictError"

    async def stored() -> WorkflowCheckpoint:
        async with StepstoneCheckpointStorage(config) as storage:
            return await storage.load(cpid)

    assert run(stored()).state == {"writer": winner}


@pytest.mark.crash
@pytest.mark.parametrize("config", ["sqlite"], indirect=True)
def test_human_in_the_loop_as_json_across_processes(config: str, tmp_path: Path) -> None:
    """A pending request_info is stored as JSON; a fresh process answers it from get_latest.

    The asking process is SIGKILLed while it waits for the human, without closing its store.
    """
    asked = tmp_path / "asked.json"
    asking = _child("ask", config, str(asked))
    _wait_for(asked, asking, "the first process asking its question")
    asking.send_signal(signal.SIGKILL)
    asking.wait(CHILD_TIMEOUT)
    (request_id,) = json.loads(asked.read_text(encoding="utf-8"))
    answered = json.loads(_finish(_child("answer", config), "the answering process"))
    assert answered == {"pending": [request_id], "outputs": ["publish the post on cats? yes"]}
    with open_store(config) as store:
        records = [store.load(r) for r in store.list_runs() if r.startswith("maf/review/")]
    events = [
        event
        for r in records
        if r is not None
        for event in r.state["checkpoint"]["pending_request_info_events"].values()
    ]
    assert {e["request_id"] for e in events} == {request_id}
    assert events[0]["data"] == {"question": "publish the post on cats?"}
    assert events[0]["response_type"] == "builtins.bool"


@pytest.mark.crash
@pytest.mark.parametrize("config", ["sqlite"], indirect=True)
def test_agents_on_a_fake_model_resume_without_calling_it_again(
    config: str, tmp_path: Path
) -> None:
    """Agent workflows checkpoint as JSON (chat Messages included) and resume after SIGKILL.

    The editor's model call is killed; the resumed run calls the writer's model never again
    and the editor's once more, and answers from the writer's checkpointed reply.
    """
    log = tmp_path / "models.log"
    first = _child("agents", config, str(log), env={"STAGE_HANG": "editor"})
    _wait_for(Path(f"{log}.hanging"), first, "the first process calling the editor's model")
    first.send_signal(signal.SIGKILL)
    first.wait(CHILD_TIMEOUT)
    assert ran(log) == ["writer", "editor"]
    resumed = json.loads(_finish(_child("agents-resume", config, str(log)), "the resuming process"))
    assert ran(log) == ["writer", "editor", "editor"]
    assert resumed["texts"][-1] == "editor(writer(draft a post))"
    with open_store(config) as store:
        records = [store.load(r) for r in store.list_runs() if r.startswith("maf/agents/")]
    assert all(r is not None and r.state["encoding"] == "json" for r in records)
    stored = json.dumps([r.state for r in records if r is not None])
    assert "agent_framework._types:Message" in stored and "__pickled__" not in stored


# --- the child processes ----------------------------------------------------------------


async def _child_main(argv: list[str]) -> None:
    mode, config = argv[0], argv[1]
    async with StepstoneCheckpointStorage(config) as storage:
        if mode == "run":
            await build(storage, Path(argv[2])).run([])
        elif mode == "resume":
            latest = await storage.get_latest(workflow_name=WORKFLOW)
            assert latest is not None, "no checkpoint to resume from"
            result = await build(storage, Path(argv[2])).run(checkpoint_id=latest.checkpoint_id)
            report = {
                "outputs": result.get_outputs(),
                "resumed_from": {
                    "checkpoint_id": latest.checkpoint_id,
                    "iteration_count": latest.iteration_count,
                    "sources": sorted(latest.messages),
                },
            }
            print(json.dumps(report))
        elif mode == "agents":
            await build_agents(storage, Path(argv[2])).run("draft a post")
        elif mode == "agents-resume":
            latest = await storage.get_latest(workflow_name="agents")
            assert latest is not None, "no checkpoint to resume from"
            result = await build_agents(storage, Path(argv[2])).run(
                checkpoint_id=latest.checkpoint_id
            )
            print(json.dumps({"texts": [r.text for r in result.get_outputs()]}))
        elif mode == "ask":
            result = await build_review(storage).run("cats")
            asked = json.dumps([e.request_id for e in result.get_request_info_events()])
            Path(f"{argv[2]}.tmp").write_text(asked, encoding="utf-8")  # noqa: ASYNC240 - a tiny marker file for the test
            Path(f"{argv[2]}.tmp").rename(argv[2])  # noqa: ASYNC240 - a tiny marker file for the test
            await asyncio.sleep(3600)  # a human takes their time; the process is killed
        elif mode == "answer":
            latest = await storage.get_latest(workflow_name="review")
            assert latest is not None, "no checkpoint to answer from"
            pending = list(latest.pending_request_info_events)
            result = await build_review(storage).run(
                checkpoint_id=latest.checkpoint_id, responses={pending[0]: True}
            )
            print(json.dumps({"pending": pending, "outputs": result.get_outputs()}))
        elif mode == "write":
            cpid, writer, go = argv[2], int(argv[3]), Path(argv[4])
            cp = WorkflowCheckpoint(
                workflow_name=WORKFLOW,
                graph_signature_hash="h",
                checkpoint_id=cpid,
                state={"writer": writer},
            )
            Path(f"{go}.ready{writer}").touch()  # noqa: ASYNC240 - a tiny marker file for the test
            deadline = time.monotonic() + CHILD_TIMEOUT
            while not go.exists():  # a start gate, so both saves race  # noqa: ASYNC240 - polls a marker file another process writes
                assert time.monotonic() < deadline, "the start signal never came"
                await asyncio.sleep(0.001)
            try:
                await storage.save(cp)
                outcome: dict[str, Any] = {"outcome": "saved"}
            except ConflictError as exc:
                outcome = {"outcome": "conflict", "type": type(exc).__name__, "error": str(exc)}
            print(json.dumps({"writer": writer, **outcome}))


@pytest.fixture(autouse=True)
def _no_stage_hang() -> Iterator[None]:
    """Stages hang only where a test asks for it."""
    os.environ.pop("STAGE_HANG", None)
    yield


if __name__ == "__main__":
    asyncio.run(_child_main(sys.argv[1:]))
