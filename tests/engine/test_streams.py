"""Event streams (issue 34): emit in steps, read from offsets, attempts that did not commit hidden.

Every backend, sync and async: memory, file and SQLite in the fast tier, PostgreSQL and
MySQL through their parameter ids (a fresh table each, dropped after).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from fresh_stores import BACKENDS, fresh_config
from stepstone import (
    ConfigError,
    EmitOutsideStep,
    EventTooLarge,
    InvalidState,
    RetryPolicy,
    RunNotFound,
    Step,
    StepContext,
    Store,
    arun,
    astream,
    delete_stream,
    open_store,
    run,
    stream,
)
from stepstone._stream._events import block_id, block_record
from stepstone._stream._writer import FLUSH_BYTES, Attempt, current

WAIT = 30.0  # seconds a test waits on another thread before it names what hung


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend."""
    config = fresh_config(str(request.param), request, tmp_path)
    with open_store(config) as opened:
        yield opened


def talker(n: int, fail_first: int = 0) -> Any:
    """A step emitting ``n`` tokens per attempt; its first ``fail_first`` attempts raise."""
    seen = {"attempts": 0}

    def talk(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        seen["attempts"] += 1
        for i in range(n):
            ctx.emit("tokens", {"i": i, "attempt": ctx.attempt})
        if seen["attempts"] <= fail_first:
            raise RuntimeError("flaky")
        return {"said": n}

    return talk


RETRY = RetryPolicy(max_attempts=3, initial_delay=0)


def test_events_of_a_run_in_order(store: Store) -> None:
    """A finished run's events come back in emit order, tagged with step and attempt."""
    steps = [Step("a", talker(3)), Step("quiet", lambda s: None), Step("b", talker(2))]
    run("r", steps, store)
    events = list(stream(store, "r"))
    assert [(e.step, e.data["i"]) for e in events] == [
        ("0", 0),
        ("0", 1),
        ("0", 2),
        ("2", 0),
        ("2", 1),
    ]
    assert [e.seq for e in events] == [0, 1, 2, 0, 1]
    assert all(e.attempt == 1 and not e.superseded for e in events)
    assert len({e.id for e in events}) == 5


def test_failed_attempt_hidden_unless_asked(store: Store) -> None:
    """A retried step shows only its committing attempt; superseded=True shows the rest marked."""
    run("r", [Step("talk", talker(3, fail_first=1), retry=RETRY)], store)
    shown = list(stream(store, "r"))
    assert [e.data for e in shown] == [{"i": i, "attempt": 2} for i in range(3)]
    every = list(stream(store, "r", superseded=True))
    assert [(e.data["attempt"], e.superseded) for e in every] == [(1, True)] * 3 + [(2, False)] * 3


def test_crashed_attempt_hidden_when_retry_emits_nothing(store: Store) -> None:
    """Events of an attempt that never committed vanish once a silent attempt commits."""
    # What a process killed mid-step leaves: a block of step 0 under another token.
    crashed = [["0", 1, "deadbeef0000", 0, "tokens", '"lost"']]
    store.save(block_record("r", 0, 0, crashed))
    assert [e.data for e in stream(store, "r", follow=False)] == ["lost"]  # live, for now
    run("r", [Step("quiet", lambda s: None)], store)
    assert list(stream(store, "r")) == []
    assert [e.superseded for e in stream(store, "r", superseded=True)] == [True]


def test_resume_after_an_id(store: Store) -> None:
    """Reading after an event's id yields exactly the events after it, none twice."""
    run("r", [Step("a", talker(5)), Step("b", talker(4))], store)
    everything = list(stream(store, "r"))
    for cut in range(len(everything)):
        rest = list(stream(store, "r", after=everything[cut].id))
        assert rest == everything[cut + 1 :]


def test_topic_filter(store: Store) -> None:
    """``topic=`` yields that topic's events only."""

    def two(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.emit("progress", 1)
        ctx.emit("tokens", "x")
        ctx.emit("progress", 2)

    run("r", [Step("two", two)], store)
    assert [e.data for e in stream(store, "r", topic="progress")] == [1, 2]


def test_large_batches_split_into_blocks(store: Store) -> None:
    """Past FLUSH_BYTES a step's events are flushed in several blocks, none lost."""
    blob = "x" * 4000
    count = FLUSH_BYTES * 2 // 4000 + 3

    def big(state: dict[str, Any], ctx: StepContext) -> None:
        for i in range(count):
            ctx.emit("blob", [i, blob])

    run("r", [Step("big", big)], store)
    events = list(stream(store, "r"))
    assert [e.data[0] for e in events] == list(range(count))
    assert len({e.id.split(".")[0] for e in events}) >= 2


def test_frozen_owner_cannot_append(store: Store) -> None:
    """After a newer epoch appended, an older owner's flush is refused and never shown."""
    store.save(block_record("r", 0, 5, [["0", 1, "newowner0000", 0, "t", '"new"']]))
    old = Attempt(store, "r", "0", 4, 1, True)
    old.emit("t", "stale")
    assert old.close() is None  # fenced: nothing stored, nothing to commit
    assert store.load(block_id("r", 1)) is None
    # A stale block that did land after a newer one is never shown either.
    store.save(block_record("r", 1, 4, [["0", 1, "stale0000000", 0, "t", '"stale"']]))
    assert [e.data for e in stream(store, "r", follow=False)] == ["new"]


def test_live_reader_sees_events_before_the_run_ends(store: Store) -> None:
    """A reader in another thread gets a step's events while the step still runs."""
    seen = threading.Event()
    release = threading.Event()

    def slow(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.emit("tokens", "first")
        assert release.wait(WAIT), "the reader never saw the first event"
        ctx.emit("tokens", "second")

    store.save(block_record("other", 0, 0, []))  # another run's stream is not ours
    got: list[Any] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for event in stream(store, "r"):
                got.append(event.data)
                if event.data == "first":
                    seen.set()
                    release.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
            release.set()

    runner = threading.Thread(target=run, args=("r", [Step("slow", slow)], store))
    runner.start()
    # The reader starts once the run exists (a reader of a missing run is refused).
    for _ in range(1000):
        if store.load("r") is not None:
            break
        threading.Event().wait(0.01)
    reader = threading.Thread(target=read)
    reader.start()
    assert seen.wait(WAIT), "the live reader never saw the first event"
    runner.join(WAIT)
    reader.join(WAIT)
    assert not reader.is_alive(), "the reader did not end when the run ended"
    assert not errors, errors
    assert got == ["first", "second"]


def test_unknown_run_refused(store: Store) -> None:
    """Reading a run that does not exist raises RunNotFound naming it."""
    with pytest.raises(RunNotFound, match="nope"):
        list(stream(store, "nope"))


def test_delete_stream_with_the_run(store: Store) -> None:
    """``delete_stream`` removes every block; the same id starts an empty stream again."""
    run("r", [Step("a", talker(3))], store)
    assert store.delete("r")
    assert delete_stream(store, "r") == 1
    assert store.load(block_id("r", 0)) is None
    run("r", [Step("quiet", lambda s: None)], store)
    assert list(stream(store, "r")) == []


def test_async_steps_and_reader(store: Store) -> None:
    """``arun`` with async and plain steps emits; ``astream`` reads the same events."""

    async def atalk(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.emit("tokens", "async")
        await asyncio.sleep(0)
        ctx.emit("tokens", "again")

    def plain(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.emit("tokens", "thread")

    async def main() -> list[Any]:
        await arun("r", [Step("a", atalk), Step("p", plain)], store)
        return [e.data async for e in astream(store, "r")]

    assert asyncio.run(main()) == ["async", "again", "thread"]


# --- bad input ---------------------------------------------------------------------------


def test_bad_events_refused_naming_the_problem(tmp_path: Path) -> None:
    """Non-JSON data names its path, an oversized one the limit, a bad topic what is allowed."""
    failures: list[BaseException] = []

    def bad(state: dict[str, Any], ctx: StepContext) -> None:
        for topic, data in (("t", {"a": [1, object()]}), ("t", "x" * 70_000), ("", 1)):
            try:
                ctx.emit(topic, data)
            except Exception as exc:  # noqa: BLE001 - collected and checked below
                failures.append(exc)

    with open_store(f"sqlite:///{tmp_path / 'db'}") as store:
        run("r", [Step("bad", bad)], store)
        assert list(stream(store, "r")) == []
    not_json, too_big, no_topic = failures
    assert isinstance(not_json, InvalidState) and "data['a'][1]" in str(not_json)
    assert isinstance(too_big, EventTooLarge) and "65536" in str(too_big)
    assert isinstance(no_topic, ConfigError) and "1 to 200" in str(no_topic)


def test_emit_outside_a_step() -> None:
    """``emit`` outside any step, or through a context whose step returned, is refused."""
    with pytest.raises(EmitOutsideStep, match="outside a step"):
        stepstone.emit("t", 1)
    kept: list[StepContext] = []
    with open_store(f"memory://{uuid.uuid4().hex}") as store:
        run("r", [Step("keep", lambda s, ctx: kept.append(ctx))], store)
    with pytest.raises(EmitOutsideStep):
        kept[0].emit("t", 1)


def test_bad_offset_refused() -> None:
    """``after=`` that is not an event id raises ConfigError naming the allowed form."""
    with (
        open_store(f"memory://{uuid.uuid4().hex}") as store,
        pytest.raises(ConfigError, match="BLOCK.INDEX"),
    ):
        list(stream(store, "r", after="12"))


# --- code workflows ----------------------------------------------------------------------


@stepstone.workflow(name=f"streams-code-{uuid.uuid4().hex[:8]}")
def chatty(ctx: stepstone.WorkflowContext, input: dict[str, Any]) -> int:
    def speak(word: str) -> int:
        ctx.emit("tokens", word)
        return len(word)

    total = int(ctx.step("hello", speak, "hello")) + int(ctx.step("world", speak, "world"))
    try:
        ctx.emit("tokens", "between calls")
    except EmitOutsideStep:
        total += 100
    return total


@stepstone.workflow(name=f"streams-acode-{uuid.uuid4().hex[:8]}")
async def achatty(ctx: stepstone.AsyncWorkflowContext, input: dict[str, Any]) -> int:
    async def speak(word: str) -> int:
        ctx.emit("tokens", word)
        return len(word)

    def plain(word: str) -> int:
        ctx.emit("tokens", word)
        return len(word)

    return int(await ctx.step("a", speak, "async")) + int(await ctx.step("b", plain, "thread"))


def test_code_workflow_calls_emit(store: Store) -> None:
    """A code workflow emits inside ctx.step functions; between calls is refused."""
    assert run("c", chatty, store)["result"] == 110
    events = list(stream(store, "c"))
    assert [(e.step, e.data) for e in events] == [("0.0", "hello"), ("0.1", "world")]


def test_async_code_workflow_calls_emit(store: Store) -> None:
    """An async code workflow emits from async and plain ctx.step functions."""
    assert asyncio.run(arun("c", achatty, store))["result"] == 11
    assert [e.data for e in stream(store, "c")] == ["async", "thread"]


def test_fake_clock_is_not_moved_by_flushes() -> None:
    """Under a FakeClock, emitting and reading neither move the clock nor wait for it."""
    from stepstone.testing import FakeClock

    def slow(state: dict[str, Any], ctx: StepContext) -> None:
        for i in range(3):
            ctx.emit("t", i)
            # Long enough for the flusher's interval to pass in real time.
            assert not threading.Event().wait(0.15)

    with FakeClock() as clock, open_store(f"memory://{uuid.uuid4().hex}") as store:
        before = clock.monotonic()
        run("r", [Step("slow", slow)], store)
        assert [e.data for e in stream(store, "r")] == [0, 1, 2]
        assert clock.monotonic() == before


@stepstone.workflow(name=f"streams-parallel-{uuid.uuid4().hex[:8]}")
def parallel(ctx: stepstone.WorkflowContext, input: dict[str, Any]) -> list[int]:
    def speak(who: int) -> int:
        for i in range(50):
            ctx.emit("tokens", [who, i])
        return who

    futures = [ctx.submit(f"speaker{who}", speak, who) for who in range(4)]
    return [int(f.result()) for f in futures]


def test_parallel_calls_emit_into_one_stream(store: Store) -> None:
    """``ctx.submit`` calls emitting at once lose nothing: each call's events, in its order."""
    assert run("p", parallel, store)["result"] == [0, 1, 2, 3]
    events = list(stream(store, "p"))
    assert len(events) == 200
    for who in range(4):
        mine = [e.data[1] for e in events if e.data[0] == who]
        assert mine == list(range(50))
    assert len({e.step for e in events}) == 4


def test_tokens_and_other_events_keep_their_order_topics_and_checks(store: Store) -> None:
    """Tokens (the fast path, lines made at the flush) mixed with other events and topic
    changes, across flushes, come back exactly as emitted; what is not JSON or too large
    is still refused at ``emit`` after tokens, and emitting after the step is refused."""
    kept: list[StepContext] = []
    failures: list[BaseException] = []
    emitted: list[tuple[str, Any]] = [
        ("a", "t0"),
        ("a", "t1"),
        ("a", 7),
        ("a", "t2"),
        ("b", "t3"),
        ("b", 'q"{}\n'),
        ("a", "é"),
        ("a", {"x": [1, None]}),
        ("a", "t4"),
    ]

    def talk(state: dict[str, Any], ctx: StepContext) -> None:
        kept.append(ctx)
        for i, (topic, data) in enumerate(emitted):
            ctx.emit(topic, data)
            if i in (1, 4):  # a flush between two tokens of one topic, and after a switch
                attempt = current.get()
                assert attempt is not None and attempt.writer is not None
                attempt.writer.flush()
        for data in ("x" * 70_000, "lone \ud800"):
            try:
                ctx.emit("a", data)
            except Exception as exc:  # noqa: BLE001 - collected and checked below
                failures.append(exc)

    run("r", [Step("talk", talk)], store)
    events = list(stream(store, "r"))
    assert [(e.topic, e.data) for e in events] == emitted
    assert [e.seq for e in events] == list(range(len(emitted)))
    too_big, surrogate = failures
    assert isinstance(too_big, EventTooLarge)
    assert isinstance(surrogate, InvalidState) and "surrogate" in str(surrogate)
    with pytest.raises(EmitOutsideStep):
        kept[0].emit("a", "late")  # the fast path's topic, after the attempt ended
