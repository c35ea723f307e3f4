"""Agent Framework checkpoints: what MAF's own storages load back, ours loads back too.

Each behaviour runs side by side on MAF's ``InMemoryCheckpointStorage`` and
``FileCheckpointStorage`` and on ours (JSON encoding) on the memory, file and SQLite
backends, plus PostgreSQL for the round trips: plain values where MAF puts its own types
(messages, pending requests), the standard value types MAF's restricted unpickler allows
(tuple, set, bytes, datetime, UUID, Decimal, ...), the application's declared types
(``allowed_checkpoint_types``, ``register_checkpoint_type``), and the ownership rules of
MAF's own storage conformance tests (``test_checkpoint_storage_conformance.py`` in the
agent-framework repository: loads and saves are copies). What neither can store is
refused at save, never accepted and then refused by every load.
"""

from __future__ import annotations

import asyncio
import collections
import decimal
import enum
import math
import uuid
import zoneinfo
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any, NamedTuple, Never

import pydantic
import pytest
from agent_framework import (
    Executor,
    FileCheckpointStorage,
    InMemoryCheckpointStorage,
    WorkflowBuilder,
    WorkflowCheckpoint,
    WorkflowContext,
    WorkflowEvent,
    WorkflowMessage,
    WorkflowRunState,
    handler,
    register_checkpoint_type,
    response_handler,
)
from agent_framework.exceptions import WorkflowCheckpointException

from fresh_stores import POSTGRES_URL
from stepstone import Checkpoint, CorruptCheckpoint, InvalidState, open_store
from stepstone.adapters.agent_framework import FORMAT, StepstoneCheckpointStorage, record_id

AT = "2026-01-01T10:00:00+00:00"


class Color(enum.Enum):
    """A declared enum."""

    RED = "red"


class Point(NamedTuple):
    """A declared NamedTuple."""

    x: int
    y: int


@dataclass
class Ask:
    """A declared dataclass, the usual shape of a human-in-the-loop request."""

    question: str
    due: datetime
    tags: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


class Note(pydantic.BaseModel):
    """A declared pydantic model."""

    text: str
    on: date


@dataclass
class Registered:
    """Declared only through MAF's process-wide ``register_checkpoint_type``."""

    n: int


register_checkpoint_type(Registered)


@dataclass
class Undeclared:
    """A type nobody declared."""

    n: int


DECLARED: list[str | type] = [
    f"{Color.__module__}:{Color.__qualname__}",
    f"{Point.__module__}:{Point.__qualname__}",
    Ask,
    f"{Note.__module__}:{Note.__qualname__}",
]
KEYS = [d if isinstance(d, str) else f"{d.__module__}:{d.__qualname__}" for d in DECLARED]

# What MAF's default restricted unpickler builds without being told (see its
# _BUILTIN_ALLOWED_TYPE_KEYS), and the declared types, nested in one another.
VALUES: dict[str, Any] = {
    "tuple": (1, "a", (2, [3])),
    "set": {1, 2, 3},
    "frozenset": frozenset({"x", "y"}),
    "bytes": b"\x00\xffbin",
    "bytearray": bytearray(b"ba"),
    "complex": 1 + 2j,
    "inf": float("-inf"),
    "int keys": {1: "one", (2, 3): "pair"},
    "reserved key": {"__stepstone_maf_type__": "os:system", "value": "rm"},
    "naive": datetime(2026, 1, 2, 3, 4, 5, 6),
    "utc": datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
    "offset": datetime(2026, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=-5), "EST")),
    "date": date(2026, 2, 3),
    "time": time(4, 5, 6, 7),
    "timedelta": timedelta(days=-1, seconds=5, microseconds=7),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "decimal": decimal.Decimal("1.10"),
    "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
    "counter": collections.Counter("abca"),
    "deque": collections.deque([1, 2], maxlen=5),
    "defaultdict": collections.defaultdict(list, {"k": [1]}),
    "range": range(1, 10, 3),
    "slice": slice(None, 5),
    "enum": Color.RED,
    "namedtuple": Point(1, 2),
    "dataclass": Ask("ok?", datetime(2026, 1, 1, tzinfo=UTC), ("a",), {"n": {1, 2}}),
    "pydantic": Note(text="n", on=date(2026, 1, 1)),
    "framework enum": WorkflowRunState.IN_PROGRESS,
}

KINDS = ["maf-memory", "maf-file", "memory", "file", "sqlite"]


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run one coroutine on a fresh event loop (no async pytest plugin here)."""
    asyncio.run(coro)


def make(kind: str, request: pytest.FixtureRequest, tmp: Path, **options: Any) -> Any:
    """Return a checkpoint storage of ``kind``, MAF's own or ours on a fresh store."""
    if kind == "maf-memory":
        return InMemoryCheckpointStorage()
    if kind == "maf-file":
        return FileCheckpointStorage(tmp / "maf", **options)
    if kind == "memory":
        config = f"memory://maf-values-{uuid.uuid4().hex}"
    elif kind == "file":
        config = f"file://{tmp}/runs"
    elif kind == "sqlite":
        config = f"sqlite:///{tmp}/runs.db"
    else:
        from fresh_stores import fresh_table

        config = fresh_table(request, POSTGRES_URL)
    storage = StepstoneCheckpointStorage(config, **options)
    request.addfinalizer(storage.close)
    return storage


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """The name of one storage: MAF's own, or ours on one backend."""
    return str(request.param)


@pytest.fixture(params=[*KINDS, "postgresql"])
def round_trip_kind(request: pytest.FixtureRequest) -> str:
    """As ``kind``, with one server backend added for the round trips."""
    return str(request.param)


@pytest.fixture
def storage(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A fresh storage of ``kind`` with no types declared."""
    return make(kind, request, tmp_path)


def cp(workflow: str = "wf", **fields: Any) -> WorkflowCheckpoint:
    """A checkpoint of ``workflow`` with ``fields``."""
    return WorkflowCheckpoint(
        workflow_name=workflow, graph_signature_hash="h", timestamp=AT, **fields
    )


def attrs(event: object) -> dict[str, Any]:
    """An event's attributes (WorkflowEvent has no ``__eq__``)."""
    return dict(vars(event))


# --- round trips ------------------------------------------------------------------------


def test_values_and_declared_types_round_trip(
    round_trip_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Standard value types and declared types load back equal, and of the same types."""

    async def scenario() -> None:
        storage = make(round_trip_kind, request, tmp_path, allowed_checkpoint_types=KEYS)
        values = dict(VALUES)
        if round_trip_kind == "maf-file":
            # MAF's own JSON layer writes dict keys with str() (1 comes back as "1"), and
            # str enums as their plain str: two things its file storage does not round-trip.
            del values["int keys"], values["framework enum"]
        nan = {"nan": float("nan")}
        saved = cp(state={"values": values, "nan": nan}, metadata={"when": VALUES["utc"]})
        await storage.save(saved)
        loaded = await storage.load(saved.checkpoint_id)
        assert loaded.state["values"] == values
        for name, value in values.items():
            assert type(loaded.state["values"][name]) is type(value), name
        assert type(loaded.state["values"]["dataclass"].extra["n"]) is set
        assert math.isnan(loaded.state["nan"]["nan"])
        assert loaded.metadata == {"when": VALUES["utc"]}
        assert loaded.state["values"]["deque"].maxlen == 5
        assert loaded.state["values"]["defaultdict"].default_factory is list
        assert loaded.state["values"]["offset"].tzinfo.tzname(None) == "EST"

    run(scenario())


def test_plain_values_where_maf_puts_its_types_round_trip(
    round_trip_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Plain dicts and other values in messages and pending requests load back as saved."""

    async def scenario() -> None:
        storage = make(round_trip_kind, request, tmp_path, allowed_checkpoint_types=KEYS)
        ask = Ask("publish?", datetime(2026, 3, 1, tzinfo=UTC), ("blog",))
        request_event = WorkflowEvent.request_info("r3", "reviewer", ask, bool)
        message = WorkflowMessage(
            data=(1, 2), source_id="a", original_request_info_event=request_event
        )
        saved = cp(
            messages={
                "a": [{"data": 1, "source_id": "x"}, message, "text"],
                "b": [],
            },
            pending_request_info_events={
                "r1": {"plain": "dict"},
                "r2": WorkflowEvent(type="data", data="original"),
                "r3": request_event,
            },
        )
        await storage.save(saved)
        loaded = await storage.load(saved.checkpoint_id)
        plain, again, text = loaded.messages["a"]
        assert plain == {"data": 1, "source_id": "x"} and text == "text"
        assert isinstance(again, WorkflowMessage) and again.data == (1, 2)
        assert again.original_request_info_event is not None
        assert again.original_request_info_event.data == ask
        assert loaded.messages["b"] == []
        pending = loaded.pending_request_info_events
        assert pending["r1"] == {"plain": "dict"}
        assert attrs(pending["r2"]) == attrs(saved.pending_request_info_events["r2"])
        assert pending["r3"].data == ask and pending["r3"].request_type is Ask
        assert pending["r3"].response_type is bool

    run(scenario())


def test_messages_not_in_maf_layout_round_trip(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A messages or pending field that is not a dict of lists loads back as saved."""

    async def scenario() -> None:
        storage = make(kind, request, tmp_path)
        saved = cp(messages={"a": ("t",), "b": "x"}, pending_request_info_events=["x"])
        await storage.save(saved)
        loaded = await storage.load(saved.checkpoint_id)
        assert loaded.messages == {"a": ("t",), "b": "x"}
        assert loaded.pending_request_info_events == ["x"]

    run(scenario())


def test_registered_types_count_as_declared(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A type registered with MAF's register_checkpoint_type is stored without declaring it."""

    async def scenario() -> None:
        storage = make(kind, request, tmp_path)
        saved = cp(state={"r": Registered(3)})
        await storage.save(saved)
        assert (await storage.load(saved.checkpoint_id)).state == {"r": Registered(3)}

    run(scenario())


# --- refusals: at save, with the path and the way to declare --------------------------


def test_undeclared_types_refused_at_save(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """An undeclared type is refused by save and nothing is stored (MAF's file storage too)."""
    if kind == "maf-memory":
        pytest.skip("MAF's InMemoryCheckpointStorage keeps objects (deepcopy): nothing to refuse")

    async def scenario() -> None:
        storage = make(kind, request, tmp_path)
        refused: list[object] = [Undeclared(1), Ask("q", datetime(2026, 1, 1))]
        if kind != "maf-file":
            refused.append(object())  # MAF's pickle allows a bare object (builtins:object)
        for value in refused:
            saved = cp(state={"deep": [{"v": value}]})
            with pytest.raises((InvalidState, WorkflowCheckpointException)) as caught:
                await storage.save(saved)
            if isinstance(caught.value, InvalidState):
                assert caught.value.path == "checkpoint['state']['deep'][0]['v']"
                assert "allowed_checkpoint_types" in str(caught.value)
            assert await storage.list_checkpoint_ids(workflow_name="wf") == []

    run(scenario())


def test_refused_request_payload_is_refused_at_save(tmp_path: Path) -> None:
    """A pending request with an undeclared payload is refused at save, naming its path."""

    async def scenario() -> None:
        async with StepstoneCheckpointStorage(f"sqlite:///{tmp_path}/r.db") as storage:
            asking = cp(
                pending_request_info_events={
                    "r1": WorkflowEvent.request_info("r1", "x", Undeclared(1), bool)
                }
            )
            with pytest.raises(InvalidState) as caught:
                await storage.save(asking)
            assert caught.value.path == "checkpoint['pending_request_info_events']['r1']['data']"
            zoned = cp(state={"t": datetime(2026, 1, 1, tzinfo=_OtherTz())})
            with pytest.raises(InvalidState, match="zoneinfo.ZoneInfo"):
                await storage.save(zoned)
            assert await storage.list_checkpoint_ids(workflow_name="wf") == []

    run(scenario())


class _OtherTz(tzinfo):
    """A tzinfo that is neither ``timezone`` nor ``ZoneInfo``."""

    def utcoffset(self, dt: datetime | None) -> timedelta:
        """One hour east."""
        return timedelta(hours=1)

    def dst(self, dt: datetime | None) -> timedelta:
        """No daylight saving."""
        return timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        """A name."""
        return "OTHER"


def test_zoneinfo_datetimes_round_trip(tmp_path: Path) -> None:
    """A datetime in a ZoneInfo zone loads back in that zone, fold included."""

    async def scenario() -> None:
        zone = zoneinfo.ZoneInfo("Europe/Paris")
        late = datetime(2026, 10, 25, 2, 30, tzinfo=zone, fold=1)  # the second 02:30
        async with StepstoneCheckpointStorage(f"sqlite:///{tmp_path}/z.db") as storage:
            saved = cp(state={"t": late, "time": time(1, 2, tzinfo=UTC)})
            await storage.save(saved)
            loaded = (await storage.load(saved.checkpoint_id)).state
        assert loaded["t"].tzinfo is zone and loaded["t"].fold == 1
        assert loaded["t"].utcoffset() == late.utcoffset()
        assert loaded["time"] == time(1, 2, tzinfo=UTC)

    run(scenario())


def test_a_type_declared_elsewhere_is_not_built_on_load(tmp_path: Path) -> None:
    """A storage that did not declare a stored type refuses to build it, and says how."""

    async def scenario() -> None:
        config = f"sqlite:///{tmp_path}/d.db"
        saved = cp(state={"ask": Ask("q", datetime(2026, 1, 1))})
        async with StepstoneCheckpointStorage(config, allowed_checkpoint_types=[Ask]) as storage:
            await storage.save(saved)
        async with StepstoneCheckpointStorage(config) as storage:
            with pytest.raises(CorruptCheckpoint, match="allowed_checkpoint_types"):
                await storage.load(saved.checkpoint_id)

    run(scenario())


def test_a_stored_tag_of_a_dict_is_data_not_a_type(tmp_path: Path) -> None:
    """A user dict with the tag key comes back as that dict; no type is looked up."""

    async def scenario() -> None:
        forged = {"__stepstone_maf_type__": "os:system", "value": "rm"}
        async with StepstoneCheckpointStorage(f"sqlite:///{tmp_path}/f.db") as storage:
            saved = cp(state={"x": forged})
            await storage.save(saved)
            assert (await storage.load(saved.checkpoint_id)).state == {"x": forged}

    run(scenario())


# --- documents written before this encoding still load ----------------------------------

# What the first release of this adapter stored for a checkpoint with a message, a
# pending request, a MAF enum and a chat Message (its encode_json, verbatim).
LEGACY: dict[str, Any] = {
    "workflow_name": "legacy",
    "graph_signature_hash": "h",
    "checkpoint_id": "old-1",
    "previous_checkpoint_id": None,
    "timestamp": AT,
    "messages": {
        "fetch": [
            {
                "data": {"text": "hi"},
                "source_id": "fetch",
                "target_id": None,
                "type": "standard",
                "trace_contexts": None,
                "source_span_ids": None,
                "original_request_info_event": {
                    "type": "request_info",
                    "data": {"question": "publish?"},
                    "request_id": "r1",
                    "source_executor_id": "reviewer",
                    "request_type": "builtins.dict",
                    "response_type": "builtins.bool",
                },
            }
        ]
    },
    "state": {
        "phase": {
            "__stepstone_maf_type__": "agent_framework._workflows._events:WorkflowRunState",
            "value": "IN_PROGRESS",
        },
        "chat": [
            {
                "__stepstone_maf_type__": "agent_framework._types:Message",
                "value": {
                    "type": "message",
                    "role": "user",
                    "contents": [{"type": "text", "text": "hi", "additional_properties": {}}],
                    "additional_properties": {},
                },
            }
        ],
    },
    "pending_request_info_events": {
        "r1": {
            "type": "request_info",
            "data": {"question": "publish?"},
            "request_id": "r1",
            "source_executor_id": "reviewer",
            "request_type": "builtins.dict",
            "response_type": "builtins.bool",
        }
    },
    "iteration_count": 1,
    "metadata": {"superstep": 1},
    "version": "1.0",
}


def test_documents_of_the_first_release_still_load(tmp_path: Path) -> None:
    """A checkpoint stored by the first release's encoding loads, and encodes the same."""
    from stepstone.adapters.agent_framework._encoding import encode_json

    async def scenario() -> None:
        config = f"sqlite:///{tmp_path}/old.db"
        rid = record_id("legacy", "old-1")
        with open_store(config) as store:
            state = {"format": FORMAT, "encoding": "json", "checkpoint": LEGACY}
            store.save(Checkpoint(run_id=rid, state=state, total_steps=0, workflow="maf"))
        async with StepstoneCheckpointStorage(config) as storage:
            loaded = await storage.load("old-1")
        (message,) = loaded.messages["fetch"]
        assert message.data == {"text": "hi"}
        assert message.original_request_info_event is not None
        assert message.original_request_info_event.request_id == "r1"
        assert loaded.pending_request_info_events["r1"].response_type is bool
        assert loaded.state["phase"] is WorkflowRunState.IN_PROGRESS
        assert loaded.state["chat"][0].text == "hi"
        assert encode_json(loaded) == LEGACY

    run(scenario())


# --- MAF's own storage conformance behaviours (ownership: copies in and out) ----------


def test_loads_and_saves_are_copies(storage: Any) -> None:
    """Mutating what save took or what load, list or get_latest gave leaves the stored copy."""

    async def scenario() -> None:
        saved = cp(
            state={"nested": {"deep": {"value": "original"}}},
            metadata={"nested": {"value": "original"}},
            messages={"e": [WorkflowMessage(source_id="s", target_id="t", data="original")]},
            pending_request_info_events={"r": WorkflowEvent(type="data", data="original")},
        )
        assert await storage.save(saved) == saved.checkpoint_id
        saved.state["nested"]["deep"]["value"] = "mutated"
        first = await storage.load(saved.checkpoint_id)
        second = await storage.load(saved.checkpoint_id)
        first.state["nested"]["deep"]["value"] = "mutated"
        first.metadata["nested"]["value"] = "mutated"
        first.messages["e"][0].data = "mutated"
        first.pending_request_info_events["r"].data = "mutated"
        latest = await storage.get_latest(workflow_name="wf")
        latest.state["nested"] = "mutated"
        (listed,) = await storage.list_checkpoints(workflow_name="wf")
        listed.state["nested"] = "mutated"
        for again in (second, await storage.load(saved.checkpoint_id)):
            assert again.state["nested"]["deep"]["value"] == "original"
            assert again.metadata["nested"]["value"] == "original"
            assert again.messages["e"][0].data == "original"
            assert again.pending_request_info_events["r"].data == "original"

    run(scenario())


# --- human in the loop: a dataclass request, checkpointed and answered ------------------


class Reviewer(Executor):
    """Asks a human with an ``Ask`` (a dataclass with a datetime), then reports the answer."""

    @handler
    async def draft(self, topic: str, ctx: WorkflowContext[Never, str]) -> None:
        """Ask."""
        await ctx.request_info(Ask(f"publish {topic}?", datetime(2026, 5, 1, tzinfo=UTC)), bool)

    @response_handler
    async def answered(
        self, request: Ask, approved: bool, ctx: WorkflowContext[Never, str]
    ) -> None:
        """Report the answer."""
        await ctx.yield_output(f"{request.question} {request.due:%m-%d} {approved}")


def test_a_dataclass_request_is_answered_from_its_checkpoint(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A workflow paused on a dataclass request resumes from its latest checkpoint."""

    async def scenario() -> None:
        storage = make(kind, request, tmp_path, allowed_checkpoint_types=KEYS)

        def build() -> Any:
            return WorkflowBuilder(
                start_executor=Reviewer(id="reviewer"), checkpoint_storage=storage, name="hitl"
            ).build()

        asked = await build().run("cats")
        (pending,) = [e.request_id for e in asked.get_request_info_events()]
        latest = await storage.get_latest(workflow_name="hitl")
        assert latest is not None and list(latest.pending_request_info_events) == [pending]
        result = await build().run(checkpoint_id=latest.checkpoint_id, responses={pending: True})
        assert result.get_outputs() == ["publish cats? 05-01 True"]

    run(scenario())
