"""Adversarial cases against the runtime: hostile steps, careless operators, odd inputs.

Each case pins what stepstone must do when a user or an operator does something odd:
raise the clear error from the tree, store nothing wrong, never hang, never lose or
double work. The cases that found bugs (21 in the first review) stay here as their
regression tests; those against a serving ``Worker`` are in
``worker/test_worker_odd_cases.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import stepstone
from stepstone import (
    ConflictError,
    InputMismatch,
    InvalidState,
    InvalidWorkflow,
    Map,
    RetryPolicy,
    RunCancelled,
    RunNotActive,
    RunNotFound,
    RunOwned,
    Sleep,
    Step,
    StepFailed,
    Store,
    Suspended,
    WaitFor,
    Worker,
    Workflow,
    WorkflowChanged,
    arun,
    cancel,
    open_store,
    run,
    signal,
    start,
)
from stepstone._checkpoint import Checkpoint
from stepstone._suspend import child_run_id
from stepstone.stores.memory import MemoryStore
from stepstone.testing import use_clock
from stepstone.testing._runtime_kit import ClockAhead
from waiting import loaded
from worker_support import LIVE_LEASE, ODD_TIMEOUT, ODD_WAIT, bounded

State = dict[str, Any]
WAIT = ODD_WAIT
LIVE = LIVE_LEASE
pytestmark = pytest.mark.timeout(ODD_TIMEOUT)
#: The shared helpers, bounded by ``WAIT``.
until, in_thread, arun_in_time, _Serving = bounded(WAIT)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each quick kind."""
    config = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/adv.db"
    with open_store(config) as opened:
        yield opened


@pytest.fixture(params=["memory", "sqlite", "file"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each local kind, the file store included."""
    config = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path}/adv.db",
        "file": f"file://{tmp_path}/runs",
    }[request.param]
    with open_store(config) as opened:
        yield opened


def _counting(calls: list[str], name: str, update: State | None = None) -> Step:
    def fn(state: State) -> State | None:
        calls.append(name)
        return update

    return Step(name, fn)


# --- BaseException from a step ------------------------------------------------------------


class _Custom(BaseException):
    """A BaseException that is neither of the builtin interrupts (as some libraries raise)."""


BASE_ERRORS = [KeyboardInterrupt, SystemExit, GeneratorExit, _Custom]


@pytest.mark.parametrize("kind", BASE_ERRORS, ids=lambda k: k.__name__)
def test_base_exception_in_step_under_run_releases_and_resumes(
    any_store: Store, kind: type[BaseException]
) -> None:
    """A BaseException from a step under run propagates; no failure is saved; the lease is freed."""
    calls: list[str] = []
    raised: list[int] = []

    def boom(state: State) -> State:
        calls.append("boom")
        if not raised:
            raised.append(1)
            raise kind()
        return {"b": 2}

    steps = [_counting(calls, "a", {"a": 1}), Step("boom", boom), _counting(calls, "c")]
    with pytest.raises(kind):
        run("r", steps, any_store)
    cp = loaded(any_store, "r")
    assert (cp.step, cp.state, cp.failure, cp.owner) == (0, {"a": 1}, None, None)
    assert cp.status == "running"
    assert run("r", steps, any_store) == {"a": 1, "b": 2}
    assert calls == ["a", "boom", "boom", "c"]


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit, _Custom], ids=lambda k: k.__name__)
@pytest.mark.parametrize("flavour", ["async", "thread"])
def test_base_exception_in_step_under_arun_releases_and_resumes(
    store: Store, kind: type[BaseException], flavour: str
) -> None:
    """A BaseException from a step under arun propagates and leaves the last checkpoint unowned."""
    raised: list[int] = []

    def sync_boom(state: State) -> State:
        if not raised:
            raised.append(1)
            raise kind()
        return {"b": 2}

    async def async_boom(state: State) -> State:
        return sync_boom(state)

    steps = [
        Step("a", lambda s: {"a": 1}),
        Step("boom", async_boom if flavour == "async" else sync_boom),
    ]

    async def main() -> State:
        async with asyncio.timeout(WAIT):
            return await arun("r", steps, store)

    # Not asyncio.run: on Python 3.11 a BaseException out of its main task leaves that
    # task's exception unretrieved, and the task's finalizer then logs from inside
    # whatever the garbage collector interrupts (once, pytest's ast.parse at teardown:
    # CPython's "AST constructor recursion depth mismatch"). Retrieved here, no leak.
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(main())
        with pytest.raises(kind):
            loop.run_until_complete(task)
        assert task.done() and isinstance(task.exception(), kind)
    finally:
        loop.close()
    cp = loaded(store, "r")
    assert (cp.step, cp.failure, cp.owner) == (0, None, None)
    assert arun_in_time("resumed arun", arun("r", steps, store)) == {"a": 1, "b": 2}


def test_step_raising_stop_iteration_under_run_fails_the_step(store: Store) -> None:
    """A sync step raising StopIteration under run is a StepFailed with its failure saved."""

    def stop(state: State) -> None:
        raise StopIteration("odd")

    with pytest.raises(StepFailed) as info:
        run("r", [Step("stop", stop)], store)
    assert isinstance(info.value.__cause__, StopIteration)
    failure = loaded(store, "r").failure
    assert failure is not None and failure.error_type == "StopIteration"


def test_step_raising_stop_iteration_under_arun_fails_the_step(store: Store) -> None:
    """A plain step raising StopIteration under arun is a StepFailed, not a hang."""

    def stop(state: State) -> None:
        raise StopIteration("odd")

    with pytest.raises(StepFailed):
        arun_in_time(
            "arun of a step raising StopIteration", arun("r", [Step("s", stop)], store), timeout=5
        )


def test_async_step_raising_stop_iteration_fails_the_step(store: Store) -> None:
    """An async step raising StopIteration is a StepFailed (Python turns it into RuntimeError)."""

    async def stop(state: State) -> None:
        raise StopIteration

    with pytest.raises(StepFailed):
        arun_in_time("arun", arun("r", [Step("s", stop)], store))
    assert loaded(store, "r").failure is not None


# --- what a step returns ------------------------------------------------------------------


@pytest.mark.parametrize("value", [[("a", 1)], "ab", 3, 1.5, True, b"x", ({"a": 1},)])
def test_step_returning_a_non_mapping_fails_the_step(store: Store, value: object) -> None:
    """A step returning something other than a dict or None fails with a saved TypeError."""
    with pytest.raises(StepFailed) as info:
        run("r", [Step("s", lambda s: value)], store)
    assert isinstance(info.value.__cause__, TypeError)
    cp = loaded(store, "r")
    assert cp.failure is not None and cp.failure.error_type == "TypeError"
    assert (cp.step, cp.state, cp.owner) == (-1, {}, None)


def test_step_returning_a_dict_subclass_is_merged(store: Store) -> None:
    """A dict subclass returned by a step is merged as a plain dict and stored as JSON."""

    class Odd(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("items() of a dict subclass")

    assert run("r", [Step("s", lambda s: Odd(a=1))], store) == {"a": 1}
    assert loaded(store, "r").state == {"a": 1}


class _HostileMapping(Mapping[str, Any]):
    """A Mapping whose methods raise, one at a time."""

    def __init__(self, fail: str) -> None:
        self.fail = fail

    def _maybe(self, where: str) -> None:
        if self.fail == where:
            raise RuntimeError(f"hostile mapping: {where}")

    def __getitem__(self, key: str) -> Any:
        self._maybe("getitem")
        return 1

    def __iter__(self) -> Iterator[str]:
        self._maybe("iter")
        return iter(["a"])

    def __len__(self) -> int:
        self._maybe("len")
        return 1

    def keys(self) -> Any:
        self._maybe("keys")
        return ["a"]


@pytest.mark.parametrize("fail", ["len", "keys", "getitem"])
def test_mapping_whose_methods_raise_fails_the_step(store: Store, fail: str) -> None:
    """A returned Mapping whose methods raise ends in StepFailed with the failure saved."""
    with pytest.raises(StepFailed):
        run("r", [Step("s", lambda s: _HostileMapping(fail))], store)
    assert loaded(store, "r").failure is not None


def test_step_returning_non_json_values_saves_nothing(store: Store) -> None:
    """A step whose update is not JSON fails the run (the cause an InvalidState naming
    the path), saves no state and frees the run."""
    steps = [Step("a", lambda s: {"a": 1}), Step("b", lambda s: {"bad": {1, 2}})]
    with pytest.raises(StepFailed) as info:
        run("r", steps, store)
    cause = info.value.__cause__
    assert isinstance(cause, InvalidState) and cause.path == "state['bad']"
    cp = loaded(store, "r")
    assert (cp.step, cp.state, cp.owner, cp.status) == (0, {"a": 1}, None, "failed")


# --- exceptions that misbehave --------------------------------------------------------------


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class _StrNotStr(Exception):
    def __str__(self) -> Any:
        return 42  # noqa: PLE0307 - the point of the case


class _Huge(Exception):
    def __str__(self) -> str:
        return "x" * 5_000_000


class _Surrogate(Exception):
    def __str__(self) -> str:
        return "bad \ud800 text"


@pytest.mark.parametrize("kind", [_StrRaises, _StrNotStr, _Huge, _Surrogate])
def test_misbehaving_exception_text_still_fails_the_step(
    any_store: Store, kind: type[Exception]
) -> None:
    """An exception whose text raises, is no str, is huge or not UTF-8 still gives StepFailed."""

    def bad(state: State) -> None:
        raise kind()

    with pytest.raises(StepFailed) as info:
        run("r", [Step("s", bad)], any_store)
    assert type(info.value.__cause__) is kind
    failure = loaded(any_store, "r").failure
    assert failure is not None and failure.error_type == kind.__qualname__
    assert len(failure.message) <= 10_000
    failure.message.encode("utf-8")


def test_retry_predicate_that_raises_fails_the_step(store: Store) -> None:
    """A retry_on predicate that raises ends the run in StepFailed, with the failure saved."""

    def predicate(exc: BaseException) -> bool:
        raise RuntimeError("predicate bug")

    def bad(state: State) -> None:
        raise ValueError("step error")

    policy = RetryPolicy(max_attempts=3, initial_delay=0, retry_on=predicate)
    with pytest.raises(StepFailed):
        run("r", [Step("s", bad, retry=policy)], store)
    assert loaded(store, "r").failure is not None


# --- RetryPolicy edges ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 1.0},
        {"max_attempts": 10**6 + 1},
        {"initial_delay": float("nan")},
        {"initial_delay": float("inf")},
        {"initial_delay": -1},
        {"max_delay": 86_401},
        {"multiplier": -0.5},
        {"multiplier": float("inf")},
        {"jitter": 1.5},
        {"jitter": True},
        {"retry_on": (int,)},
        {"retry_on": "ValueError"},
        {"retry_on": (ValueError, "x")},
    ],
    ids=str,
)
def test_retry_policy_refuses_bad_values(options: dict[str, Any]) -> None:
    """A RetryPolicy with an out-of-range or mistyped value is refused at construction."""
    with pytest.raises(InvalidWorkflow):
        RetryPolicy(**options)


@pytest.mark.parametrize("initial", [0.0, 5e-324])
def test_retry_delay_never_overflows(initial: float) -> None:
    """RetryPolicy.delay returns a bounded delay for every attempt its max_attempts allows."""
    policy = RetryPolicy(
        max_attempts=10**6, initial_delay=initial, multiplier=1000.0, max_delay=86_400, jitter=0
    )
    for attempt in (2, 50, 104, 200, 10**6 - 1):
        assert 0 <= policy.delay(attempt) <= 86_400


def test_many_fast_retries_end_in_step_failed(store: Store) -> None:
    """A step failing every one of 150 zero-delay attempts ends in StepFailed on attempt 150."""
    policy = RetryPolicy(max_attempts=150, initial_delay=0, multiplier=1000.0, jitter=0)

    def bad(state: State) -> None:
        raise ValueError("always")

    with pytest.raises(StepFailed) as info:
        run("r", [Step("s", bad, retry=policy)], store)
    assert info.value.attempt == 150


def test_retry_policy_edge_values_that_are_allowed_work(store: Store) -> None:
    """Zero delays, multiplier 0, max_delay < initial_delay and retry_on=() work as documented."""
    assert RetryPolicy(initial_delay=10, max_delay=1, jitter=0).delay(1) == 1
    assert RetryPolicy(initial_delay=1, multiplier=0, jitter=0).delay(5) == 0
    tries: list[int] = []

    def bad(state: State) -> None:
        tries.append(1)
        raise ValueError

    with pytest.raises(StepFailed):
        run("r", [Step("s", bad, retry=RetryPolicy(max_attempts=5, retry_on=()))], store)
    assert tries == [1]


# --- in-place changes and the lease -------------------------------------------------------


def test_interrupted_step_in_place_changes_are_not_saved(any_store: Store) -> None:
    """A step mutating its state in place, then interrupted, leaves the last checkpoint as is."""
    interrupted: list[int] = []

    def bump(state: State) -> None:
        state["n"] += 1
        if not interrupted:
            interrupted.append(1)
            raise KeyboardInterrupt

    steps = [Step("a", lambda s: {"n": 1}), Step("bump", bump)]
    with pytest.raises(KeyboardInterrupt):
        run("r", steps, any_store)
    assert loaded(any_store, "r").state == {"n": 1}
    assert run("r", steps, any_store) == {"n": 2}


def test_cancelled_arun_saves_nothing_of_the_step(store: Store) -> None:
    """Cancelling arun inside a step that changed its state in place stores nothing of that step."""
    entered = asyncio.Event

    async def main() -> None:
        inside = entered()

        async def slow(state: State) -> None:
            state["n"] += 1
            inside.set()
            await asyncio.sleep(3600)

        steps = [Step("a", lambda s: {"n": 1}), Step("slow", slow)]
        task = asyncio.create_task(arun("r", steps, store))
        await asyncio.wait_for(inside.wait(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    cp = loaded(store, "r")
    assert cp.owner is None
    assert cp.state == {"n": 1}


def test_renewal_does_not_store_a_running_steps_changes(store: Store) -> None:
    """A renewal during a step stores the last checkpoint, not the step's unfinished changes."""
    seen: list[State] = []

    def slow(state: State) -> None:
        state["n"] += 1
        first = loaded(store, "r").version
        until("a lease renewal during the step", lambda: loaded(store, "r").version != first)
        seen.append(loaded(store, "r").state)

    run("r", [Step("a", lambda s: {"n": 1}), Step("slow", slow)], store, lease=0.15)
    assert seen == [{"n": 1}]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_renewer_survives_a_step_holding_non_json_in_its_state(store: Store) -> None:
    """A step that briefly keeps a non-JSON value in its state does not stop later renewals."""

    def holds_a_set(state: State) -> None:
        state["tmp"] = {1, 2}
        # Two renewals while the set is in the state, however slow the machine.
        versions = [loaded(store, "r").version]

        def renewed_twice() -> bool:
            version = loaded(store, "r").version
            if version != versions[-1]:
                versions.append(version)
            return len(versions) > 2

        until("two renewals while the step holds a set", renewed_twice)
        del state["tmp"]

    def long(state: State) -> None:
        first = loaded(store, "r").version
        until("a renewal in the second step", lambda: loaded(store, "r").version != first)

    steps = [Step("first", lambda s: {"a": 1}), Step("a", holds_a_set), Step("b", long)]
    run("r", steps, store, lease=0.15)


# --- async cancellation -----------------------------------------------------------------


class _GatedStore(MemoryStore):
    """A memory store whose asave can be held on a gate, to cancel callers mid-save."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: Callable[[Checkpoint], bool] = lambda cp: False
        self.entered: asyncio.Event | None = None
        self.gate: asyncio.Event | None = None
        self.saves = 0

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        if self.hold(checkpoint):
            assert self.entered is not None and self.gate is not None
            self.entered.set()
            await asyncio.wait_for(self.gate.wait(), WAIT)
        self.saves += 1
        return self.save(checkpoint)


def test_arun_cancelled_during_a_save_lands_it_whole() -> None:
    """Cancelling arun during a step's save lands that save; the resume skips the step."""
    store = _GatedStore()
    calls: list[str] = []
    steps = [_counting(calls, "a", {"a": 1}), _counting(calls, "b", {"b": 2})]

    async def main() -> None:
        store.entered, store.gate = asyncio.Event(), asyncio.Event()
        store.hold = lambda cp: cp.step == 0 and cp.owner is not None
        task = asyncio.create_task(arun("r", steps, store))
        await asyncio.wait_for(store.entered.wait(), WAIT)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done(), "arun returned before its save landed"
        store.hold = lambda cp: False
        store.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    cp = loaded(store, "r")
    assert (cp.step, cp.state, cp.owner) == (0, {"a": 1}, None)
    assert arun_in_time("resume", arun("r", steps, store)) == {"a": 1, "b": 2}
    assert calls == ["a", "b"]


def test_arun_cancelled_during_a_renewal_waits_for_it_and_releases() -> None:
    """Cancelling arun during a lease renewal lets it land, then gives the lease back."""
    store = _GatedStore()
    running = threading.Event()

    async def slow(state: State) -> None:
        running.set()
        await asyncio.sleep(3600)

    async def main() -> None:
        store.entered, store.gate = asyncio.Event(), asyncio.Event()
        store.hold = lambda cp: running.is_set() and cp.renewed_at is not None and cp.step == 0
        task = asyncio.create_task(
            arun("r", [Step("a", lambda s: {"a": 1}), Step("slow", slow)], store, lease=0.3)
        )
        await asyncio.wait_for(store.entered.wait(), WAIT)
        task.cancel()
        await asyncio.sleep(0.05)
        store.hold = lambda cp: False
        store.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    cp = loaded(store, "r")
    assert (cp.step, cp.owner) == (0, None)


@pytest.mark.parametrize("how", ["sync", "async"])
def test_arun_cancelled_during_backoff_stops_at_once_and_keeps_the_count(
    store: Store, how: str
) -> None:
    """Cancelling arun in a long retry backoff returns at once; the attempt stays counted."""
    tries: list[int] = []

    def flaky(state: State) -> State:
        tries.append(1)
        if len(tries) == 1:
            raise ValueError("first")
        return {"ok": True}

    async def aflaky(state: State) -> State:
        return flaky(state)

    policy = RetryPolicy(max_attempts=3, initial_delay=3600, jitter=0)
    steps = [Step("f", flaky if how == "sync" else aflaky, retry=policy)]

    async def main() -> None:
        task = asyncio.create_task(arun("r", steps, store))
        until_async = time.monotonic() + WAIT
        # In the backoff: the first failure is on record (not a fixed sleep, which a
        # loaded machine may not spend getting there).
        while (await store.aload("r") or Checkpoint(run_id="r")).failure is None:
            assert time.monotonic() < until_async, "the first attempt's failure never landed"
            await asyncio.sleep(0.01)
        task.cancel()
        # At once: a backoff of an hour ends well within WAIT, or wait_for fails.
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    cp = loaded(store, "r")
    assert (cp.attempt, cp.owner) == (1, None)
    assert cp.failure is not None and cp.failure.message == "first"
    assert arun_in_time("resume", arun("r", steps, store)) == {"ok": True}
    assert len(tries) == 2


def test_arun_under_asyncio_timeout_raises_timeout_and_releases(store: Store) -> None:
    """arun inside asyncio.timeout ends with TimeoutError and leaves the run unowned."""

    async def slow(state: State) -> None:
        await asyncio.sleep(3600)

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await arun("r", [Step("slow", slow)], store)

    arun_in_time("main", main())
    assert loaded(store, "r").owner is None


def test_async_step_that_cancels_itself_is_a_cancellation(store: Store) -> None:
    """An async step cancelling its own task ends arun with CancelledError and nothing saved."""

    async def suicide(state: State) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await arun("r", [Step("a", lambda s: {"a": 1}), Step("s", suicide)], store)

    arun_in_time("main", main())
    cp = loaded(store, "r")
    assert (cp.step, cp.failure, cp.owner) == (0, None, None)


def test_async_step_raising_cancelled_error_uncancelled_fails_the_step(store: Store) -> None:
    """An async step raising CancelledError without its task being cancelled is a StepFailed."""

    async def liar(state: State) -> None:
        raise asyncio.CancelledError

    async def main() -> None:
        with pytest.raises(StepFailed):
            await arun("r", [Step("s", liar)], store)

    arun_in_time("main", main())
    assert loaded(store, "r").failure is not None


# --- concurrency from outside -----------------------------------------------------------


@pytest.mark.slow
def test_concurrent_cancel_signal_and_run_keep_every_signal_once(tmp_path: Path) -> None:
    """Signals, a cancel and runs raced on one run: each signal stored once, the status final."""
    config = f"sqlite:///{tmp_path}/race.db"
    steps = [WaitFor("w1", "go"), WaitFor("w2", "go"), WaitFor("w3", "go")]
    with open_store(config) as store:
        with pytest.raises(Suspended):
            run("r", steps, store)
        accepted: list[str] = []
        lock = threading.Lock()

        def signaller(i: int) -> None:
            for j in range(5):
                try:
                    if signal(store, "r", "go", {"i": i, "j": j}, signal_id=f"{i}-{j}"):
                        with lock:
                            accepted.append(f"{i}-{j}")
                except (RunNotActive, ConflictError):
                    return

        def runner() -> None:
            for _ in range(10):
                with contextlib.suppress(Suspended, RunCancelled, RunOwned, ConflictError):
                    run("r", steps, store)

        def canceller() -> None:
            time.sleep(0.02)
            with contextlib.suppress(RunNotActive):
                cancel(store, "r")

        joins = [in_thread(f"signaller {i}", functools.partial(signaller, i)) for i in range(4)]
        joins += [in_thread(f"runner {i}", runner) for i in range(2)]
        joins.append(in_thread("canceller", canceller))
        for join in joins:
            join(60)
        cp = loaded(store, "r")
        ids = [s.id for s in cp.signals]
        assert len(ids) == len(set(ids)), "a signal was stored twice"
        assert sorted(ids) == sorted(accepted), "an accepted signal was lost"
        assert cp.owner is None
        assert cp.status in ("cancelled", "done")
        if cp.status == "cancelled":
            with pytest.raises(RunCancelled):
                run("r", steps, store)


def test_two_direct_runs_on_one_run_execute_each_step_once(store: Store) -> None:
    """Two threads calling run on one run_id: one executes, the other gets RunOwned."""
    calls: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def long(state: State) -> State:
        calls.append("long")
        inside.set()
        release.wait(WAIT)
        return {"x": 1}

    steps = [Step("long", long)]
    first = in_thread("first run", lambda: run("r", steps, store, lease=LIVE))
    assert inside.wait(WAIT), "the first run never entered its step"
    with pytest.raises(RunOwned):
        run("r", steps, store, lease=LIVE)
    release.set()
    assert first() == {"x": 1}
    assert calls == ["long"]


def test_cancel_of_a_directly_running_run_saves_the_step_then_stops(store: Store) -> None:
    """cancel() on a run a direct call executes: the step in flight is saved, nothing more runs."""
    calls: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def long(state: State) -> State:
        calls.append("long")
        inside.set()
        release.wait(WAIT)
        return {"x": 1}

    steps = [Step("long", long), _counting(calls, "after")]
    first = in_thread("the run", lambda: run("r", steps, store))
    assert inside.wait(WAIT)
    assert cancel(store, "r").status == "running"
    release.set()
    with pytest.raises(RunCancelled):
        first()
    cp = loaded(store, "r")
    assert (cp.step, cp.state, cp.status, cp.owner) == (0, {"x": 1}, "cancelled", None)
    assert calls == ["long"]
    with pytest.raises(RunNotActive):
        cancel(store, "r")


# --- signals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        (float("nan"), "state['payload']"),
        ({1: "int key"}, "state['payload'][1]"),
        ((1, 2), "state['payload']"),
        (b"bytes", "state['payload']"),
        ({"s": {1}}, "state['payload']['s']"),
        (object(), "state['payload']"),
    ],
    ids=["nan", "intkey", "tuple", "bytes", "set", "object"],
)
def test_non_json_signal_payload_is_refused_and_nothing_stored(
    store: Store, payload: object, path: str
) -> None:
    """A signal payload that is not JSON is refused with InvalidState and the run is unchanged."""
    with pytest.raises(Suspended):
        run("r", [WaitFor("w", "go")], store)
    before = loaded(store, "r").version
    with pytest.raises(InvalidState) as info:
        signal(store, "r", "go", payload)
    assert info.value.path == path
    assert loaded(store, "r").version == before


def test_too_deep_signal_payload_is_refused(store: Store) -> None:
    """A payload nested deeper than a state may be is refused up front, so the run never breaks."""
    with pytest.raises(Suspended):
        run("r", [WaitFor("w", "go")], store)
    deep: Any = None
    for _ in range(250):
        deep = [deep]
    with pytest.raises(InvalidState):
        signal(store, "r", "go", deep)
    assert loaded(store, "r").signals == ()


def test_huge_signal_payload_is_delivered_exactly(any_store: Store) -> None:
    """A one-megabyte signal payload is kept and merged exactly once."""
    steps = [WaitFor("w", "go")]
    with pytest.raises(Suspended):
        run("r", steps, any_store)
    payload = {"blob": "é" * 500_000, "list": list(range(1000))}
    assert signal(any_store, "r", "go", payload, signal_id="big") is True
    assert signal(any_store, "r", "go", payload, signal_id="big") is False
    assert run("r", steps, any_store) == {"w": payload}


@pytest.mark.parametrize("signal_id", [1, 1.5, b"id", "", "x" * 201, ["a"]], ids=repr)
def test_odd_signal_ids_are_refused(store: Store, signal_id: Any) -> None:
    """A signal id that is not a str of 1-200 characters is refused and nothing is stored."""
    with pytest.raises(Suspended):
        run("r", [WaitFor("w", "go")], store)
    with pytest.raises(InvalidWorkflow):
        signal(store, "r", "go", None, signal_id=signal_id)
    assert loaded(store, "r").signals == ()


@pytest.mark.parametrize("name", ["", 1, None, "x" * 201])
def test_odd_signal_names_are_refused(store: Store, name: Any) -> None:
    """A signal name that is not a str of 1-200 characters is refused."""
    with pytest.raises(Suspended):
        run("r", [WaitFor("w", "go")], store)
    with pytest.raises(InvalidWorkflow):
        signal(store, "r", name, None)


def test_signal_to_unknown_or_finished_runs_is_a_clear_error(store: Store) -> None:
    """A signal to a missing, done or cancelled run raises RunNotFound/RunNotActive, any id."""
    with pytest.raises(RunNotFound):
        signal(store, "nope", "go", None, signal_id="x")
    run("done", [Step("a", lambda s: None)], store)
    with pytest.raises(RunNotActive):
        signal(store, "done", "go", None, signal_id="x")
    with pytest.raises(Suspended):
        run("c", [WaitFor("w", "go")], store)
    cancel(store, "c")
    with pytest.raises(RunNotActive):
        signal(store, "c", "go", None)


# --- timers -----------------------------------------------------------------------------


def test_sleep_until_the_past_completes_at_once_in_utc(store: Store) -> None:
    """A Sleep until a past time in another time zone completes at once with that time in UTC."""
    past = datetime(2001, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert run("r", [Sleep("s", until=past)], store) == {"s": "2001-02-02T22:35:06+00:00"}


def test_sleep_until_far_future_waits_with_that_due_time(store: Store) -> None:
    """A Sleep until year 9999 suspends with wake_at recorded and listed as waiting."""
    far = datetime(9999, 12, 31, 12, tzinfo=UTC)
    with pytest.raises(Suspended) as info:
        run("r", [Sleep("s", until=far)], store)
    assert info.value.wake_at == far
    cp = loaded(store, "r")
    assert (cp.status, cp.wake_at, cp.owner) == ("waiting", far, None)
    with pytest.raises(Suspended):
        run("r", [Sleep("s", until=far)], store)


@pytest.mark.parametrize(
    "until",
    [
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-14))),
        datetime.min.replace(tzinfo=timezone(timedelta(hours=14))),
    ],
    ids=["max-14h", "min+14h"],
)
def test_sleep_until_out_of_range_is_refused(until: datetime) -> None:
    """A Sleep until a time that has no UTC equivalent is refused with InvalidWorkflow."""
    with pytest.raises(InvalidWorkflow):
        Sleep("s", until=until)


@pytest.mark.parametrize(
    "options",
    [
        {"until": datetime(2030, 1, 1)},
        {},
        {"duration": 1, "until": datetime(2030, 1, 1, tzinfo=UTC)},
        {"duration": -1},
        {"duration": float("nan")},
        {"duration": True},
        {"until": "2030-01-01T00:00:00Z"},
    ],
    ids=["naive", "neither", "both", "negative", "nan", "bool", "str"],
)
def test_sleep_refuses_bad_arguments(options: dict[str, Any]) -> None:
    """Sleep refuses a naive, missing, doubled, negative, NaN or mistyped time."""
    with pytest.raises(InvalidWorkflow):
        Sleep("s", **options)


def test_wait_for_timeout_zero(store: Store) -> None:
    """WaitFor timeout 0: the default at once, else a saved failure; a kept signal wins."""
    assert run("a", [WaitFor("w", "go", timeout=0, default={"d": 1})], store) == {"w": {"d": 1}}
    with pytest.raises(StepFailed) as info:
        run("b", [WaitFor("w", "go", timeout=0)], store)
    assert isinstance(info.value.__cause__, stepstone.WaitTimeout)
    cp = loaded(store, "b")
    assert (cp.status, cp.owner, cp.waiting_for) == ("failed", None, None)
    signal(store, "b", "go", {"late": True})
    assert run("b", [WaitFor("w", "go", timeout=0)], store) == {"w": {"late": True}}


# --- Map ----------------------------------------------------------------------------------


CHILD = Workflow("child", [Step("double", lambda s: {"out": s["x"] * 2})])


def _drain_children(store: Store, parent: str, name: str, count: int) -> None:
    for i in range(count):
        run(child_run_id(parent, name, i), CHILD, store)


def test_map_with_zero_items_completes_with_an_empty_list(store: Store) -> None:
    """A Map whose items() returns [] merges [] and starts no child."""
    assert run("p", [Map("m", CHILD, lambda s: [])], store) == {"m": []}
    assert list(store.list_runs()) == ["p"]


def test_map_with_duplicate_items_runs_one_child_each(store: Store) -> None:
    """Equal items still get one child each, merged in item order."""
    steps = [Map("m", CHILD, lambda s: [{"x": 1}, {"x": 1}, {"x": 2}])]
    with pytest.raises(Suspended) as info:
        run("p", steps, store)
    assert info.value.waiting_for == "children 0 of 3"
    _drain_children(store, "p", "m", 3)
    result = run("p", steps, store)
    assert [c["out"] for c in result["m"]] == [2, 2, 4]


def test_map_items_that_raise_fail_the_step(store: Store) -> None:
    """A Map whose items() raises ends in StepFailed with the failure saved and no child."""

    def items(state: State) -> list[Any]:
        raise KeyError("docs")

    with pytest.raises(StepFailed):
        run("p", [Map("m", CHILD, items)], store)
    assert loaded(store, "p").failure is not None
    assert list(store.list_runs()) == ["p"]


@pytest.mark.parametrize("items", [lambda s: ({"x": 1},), lambda s: [1, 2], lambda s: None])
def test_map_items_of_the_wrong_shape_fail_the_step(store: Store, items: Any) -> None:
    """items() returning a tuple, non-dict items or None fails the step with the failure saved."""
    with pytest.raises(StepFailed):
        run("p", [Map("m", CHILD, items)], store)
    assert loaded(store, "p").status == "failed"


def test_map_items_with_nan_fail_the_step(store: Store) -> None:
    """An item that is not JSON fails the step with the failure saved."""
    with pytest.raises(StepFailed) as info:
        run("p", [Map("m", CHILD, lambda s: [{"x": float("nan")}])], store)
    assert isinstance(info.value.__cause__, InvalidState)


def test_map_child_workflow_not_run_leaves_parent_waiting(store: Store) -> None:
    """A parent whose children nobody runs stays waiting, and resumes as soon as they are done."""
    steps = [Map("m", CHILD, lambda s: [{"x": 1}, {"x": 5}])]
    for _ in range(2):
        with pytest.raises(Suspended):
            run("p", steps, store)
    assert loaded(store, child_run_id("p", "m", 0)).status == "queued"
    _drain_children(store, "p", "m", 2)
    assert [c["out"] for c in run("p", steps, store)["m"]] == [2, 10]


def test_two_maps_with_one_name_do_not_share_children(store: Store) -> None:
    """Two Map steps named alike in one run either are refused or get children of their own."""
    other = Workflow("other", [Step("neg", lambda s: {"out": -s["x"]})])
    try:
        steps = [
            Map("m", CHILD, lambda s: [{"x": 1}]),
            Map("m", other, lambda s: [{"x": 1}]),
        ]
        with pytest.raises(Suspended):
            run("p", steps, store)
    except InvalidWorkflow:
        return
    run(child_run_id("p", "m", 0), CHILD, store)
    with pytest.raises(Suspended):
        run("p", steps, store)


def test_map_does_not_adopt_a_foreign_run(store: Store) -> None:
    """A run that merely has a child's run_id is not merged as that child's result."""
    run("p/m/0", [Step("evil", lambda s: {"out": "forged"})], store)
    steps = [Map("m", CHILD, lambda s: [{"x": 1}])]
    try:
        result = run("p", steps, store)
    except (Suspended, StepFailed, ConflictError):
        return
    assert result["m"] == [{"x": 1, "out": 2}]


def test_map_with_a_max_length_parent_id_uses_hashed_child_ids(store: Store) -> None:
    """A parent run_id of 1,024 characters gets valid hashed child ids and completes."""
    parent = "p" * 1024
    steps = [Map("m", CHILD, lambda s: [{"x": 3}])]
    with pytest.raises(Suspended):
        run(parent, steps, store)
    child = child_run_id(parent, "m", 0)
    assert child.startswith("map~") and len(child) <= 1024
    run(child, CHILD, store)
    assert run(parent, steps, store) == {"m": [{"x": 3, "out": 6}]}


def test_parent_cancelled_while_creating_children_cancels_them(store: Store) -> None:
    """A cancel that lands while the parent queues its children cancels those children too."""

    def items(state: State) -> list[State]:
        cancel(store, "p")
        return [{"x": 1}, {"x": 2}]

    with pytest.raises(RunCancelled):
        run("p", [Map("m", CHILD, items)], store)
    for i in range(2):
        assert loaded(store, child_run_id("p", "m", i)).status == "cancelled"


def test_cancelling_a_waiting_parent_cancels_its_children(store: Store) -> None:
    """cancel() on a parent waiting for children cancels the children that are not finished."""
    steps = [Map("m", CHILD, lambda s: [{"x": 1}, {"x": 2}])]
    with pytest.raises(Suspended):
        run("p", steps, store)
    run(child_run_id("p", "m", 0), CHILD, store)
    cancel(store, "p")
    assert loaded(store, child_run_id("p", "m", 0)).status == "done"
    assert loaded(store, child_run_id("p", "m", 1)).status == "cancelled"
    with pytest.raises(RunCancelled):
        run("p", steps, store)


def test_cancelling_a_child_fails_the_waiting_parent_at_once(store: Store) -> None:
    """Cancelling a child of a waiting parent lets the parent fail with ChildFailed right away."""
    steps = [Map("m", CHILD, lambda s: [{"x": 1}])]
    with pytest.raises(Suspended):
        run("p", steps, store)
    cancel(store, child_run_id("p", "m", 0))
    with pytest.raises(StepFailed) as info:
        run("p", steps, store)
    assert isinstance(info.value.__cause__, stepstone.ChildFailed)


# --- input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [[1, 2], "x", 1, {"nan": float("nan")}, {"inf": float("-inf")}, {1: "a"}, {"t": (1,)}],
    ids=["list", "str", "int", "nan", "inf", "intkey", "tuple"],
)
def test_bad_input_is_refused_before_anything_is_stored(store: Store, value: Any) -> None:
    """An input that is not a JSON dict is refused with InvalidState and no run is created."""
    with pytest.raises(InvalidState):
        run("r", [Step("a", lambda s: None)], store, input=value)
    assert store.load("r") is None


def test_resume_with_another_input_runs_nothing(any_store: Store) -> None:
    """Resuming with another input raises InputMismatch naming the path; nothing runs."""
    calls: list[str] = []
    steps = [_counting(calls, "a"), WaitFor("w", "go")]
    with pytest.raises(Suspended):
        run("r", steps, any_store, input={"n": 1, "deep": {"k": [1, 2]}})
    before = loaded(any_store, "r").version
    with pytest.raises(InputMismatch) as info:
        run("r", steps, any_store, input={"n": 1, "deep": {"k": [1, 3]}})
    assert info.value.path == "input['deep']['k'][1]"
    with pytest.raises(InputMismatch):
        run("r", steps, any_store, input={"n": 1.0, "deep": {"k": [1, 2]}})
    assert loaded(any_store, "r").version == before
    assert calls == ["a"]
    with pytest.raises(Suspended):
        run("r", steps, any_store, input={"n": 1, "deep": {"k": [1, 2]}})
    with pytest.raises(Suspended):
        run("r", steps, any_store)


# --- start and workflows -------------------------------------------------------------------


def test_start_on_a_direct_run_without_workflow_is_refused(store: Store) -> None:
    """start() under a workflow on a run created by run() without one raises WorkflowChanged."""
    wf = Workflow("w", [Step("a", lambda s: {"a": 1})])
    run("r", [Step("a", lambda s: {"a": 1})], store)
    before = loaded(store, "r")
    with pytest.raises(WorkflowChanged):
        start(store, wf, "r")
    after = loaded(store, "r")
    assert (after.version, after.workflow, after.status) == (before.version, None, "done")


def test_start_on_a_direct_run_of_the_same_workflow_is_a_no_op(store: Store) -> None:
    """start() on a run that run() made from the same Workflow is a no-op returning its status."""
    wf = Workflow("w", [Step("a", lambda s: {"a": 1})], version="1")
    run("r", wf, store, input={"i": 1})
    version = loaded(store, "r").version
    assert start(store, wf, "r", input={"i": 1}).status == "done"
    with pytest.raises(InputMismatch):
        start(store, wf, "r", input={"i": 2})
    with pytest.raises(WorkflowChanged):
        start(store, Workflow("w", wf.steps, version="2"), "r", input={"i": 1})
    assert loaded(store, "r").version == version


def test_queued_workflow_run_cannot_be_run_with_other_steps(store: Store) -> None:
    """A run started from a Workflow refuses to run with a bare list of different steps."""
    wf = Workflow("w", [Step("a", lambda s: {"a": 1})])
    start(store, wf, "r")
    with pytest.raises(WorkflowChanged):
        run("r", [Step("other", lambda s: {"evil": 1})], store)
    assert loaded(store, "r").status == "queued"


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("nul\x00name", None),
        ("new\nline", "v\t1"),
        ("\x1b[31mred", "1/2/3"),
        ("🚀" * 200, "é" * 50),
        ("a:b:c", "x y"),
    ],
    ids=["nul", "newline", "escape", "emoji", "colons"],
)
def test_odd_workflow_names_round_trip_and_are_served(
    any_store: Store, name: str, version: str | None
) -> None:
    """Workflow names and versions with odd characters are kept exactly; a worker serves them."""
    wf = Workflow(name, [Step("a", lambda s: {"a": 1})], version=version)
    assert start(any_store, wf, "r").status == "queued"
    cp = loaded(any_store, "r")
    assert (cp.workflow, cp.workflow_version) == (name, version)
    serving = _Serving(Worker(any_store, [wf], poll=0.02))
    try:
        until("the odd-named run to finish", lambda: loaded(any_store, "r").status == "done")
    finally:
        serving.stop()


@pytest.mark.parametrize(
    ("name", "version"),
    [("", None), ("x" * 201, None), (1, None), ("w", ""), ("w", 1), ("\ud800", None)],
    ids=["empty", "long", "int", "empty-version", "int-version", "surrogate"],
)
def test_bad_workflow_names_are_refused(name: Any, version: Any) -> None:
    """A Workflow with an empty, too long, mistyped or unencodable name or version is refused."""
    with pytest.raises(InvalidWorkflow):
        Workflow(name, [Step("a", lambda s: None)], version=version)


def test_empty_workflow_with_input_returns_the_input(store: Store) -> None:
    """A run of no steps returns its input, is done and has no owner."""
    assert run("r", [], store, input={"a": [1]}) == {"a": [1]}
    cp = loaded(store, "r")
    assert (cp.status, cp.owner) == ("done", None)


# --- clocks ----------------------------------------------------------------------------


def test_wall_clock_jump_does_not_expire_a_live_lease(store: Store) -> None:
    """A claimant whose wall clock jumps a day ahead still sees a live owner's lease as live."""
    inside = threading.Event()
    release = threading.Event()

    def long(state: State) -> State:
        inside.set()
        release.wait(WAIT)
        return {"x": 1}

    steps = [Step("long", long)]
    owner = in_thread("owner", lambda: run("r", steps, store, lease=LIVE))
    assert inside.wait(WAIT)
    # Through the clock seam: every reader of the wall clock in this process jumps.
    with use_clock(ClockAhead(timedelta(days=1))), pytest.raises(RunOwned):
        run("r", steps, store, lease=LIVE)
    release.set()
    assert owner() == {"x": 1}


def test_queued_run_from_a_host_with_a_fast_clock_is_claimed_at_once() -> None:
    """A run queued by a host whose clock is an hour ahead is still claimed by a worker at once."""
    store = MemoryStore()
    wf = Workflow("w", [Step("a", lambda s: {"a": 1})])
    with use_clock(ClockAhead(timedelta(hours=1))):
        start(store, wf, "r")
    serving = _Serving(Worker(store, [wf], poll=0.02))
    try:
        until("the queued run to be claimed", lambda: loaded(store, "r").status == "done")
    finally:
        serving.stop()


# --- steps acting on their own run ---------------------------------------------------------


def test_step_signalling_its_own_run_is_rebased_not_conflicted(store: Store) -> None:
    """A step that signals its own run completes, and the next WaitFor takes that signal."""

    def send(state: State) -> State:
        signal(store, "r", "go", {"from": "inside"}, signal_id="self")
        return {"sent": True}

    steps = [Step("a", lambda s: {"a": 1}), Step("send", send), WaitFor("w", "go")]
    assert run("r", steps, store) == {"a": 1, "sent": True, "w": {"from": "inside"}}


def test_step_cancelling_its_own_run_is_saved_then_stops(store: Store) -> None:
    """A step that cancels its own run is saved, and no later step runs."""
    calls: list[str] = []

    def stop_me(state: State) -> State:
        cancel(store, "r")
        return {"x": 1}

    steps = [Step("a", lambda s: {"a": 1}), Step("stop", stop_me), _counting(calls, "later")]
    with pytest.raises(RunCancelled):
        run("r", steps, store)
    cp = loaded(store, "r")
    assert (cp.step, cp.state, cp.status, cp.owner) == (1, {"a": 1, "x": 1}, "cancelled", None)
    assert calls == []


def test_step_running_its_own_run_again_is_refused(store: Store) -> None:
    """A step calling run() on its own run_id gets RunOwned instead of a nested execution."""
    calls: list[str] = []
    nested: list[BaseException] = []

    def reenter(state: State) -> State:
        calls.append("reenter")
        try:
            run("r", steps, store, lease=LIVE)
        except RunOwned as exc:
            nested.append(exc)
        return {"x": 1}

    steps = [Step("a", lambda s: {"a": 1}), Step("reenter", reenter)]
    assert run("r", steps, store, lease=LIVE) == {"a": 1, "x": 1}
    assert calls == ["reenter"]
    assert len(nested) == 1


def test_step_deleting_its_own_run_ends_in_lease_lost_without_resurrection(store: Store) -> None:
    """A run deleted under its owner ends with LeaseLost, and nothing writes it back."""

    def vanish(state: State) -> State:
        assert store.delete("r")
        return {"x": 1}

    with pytest.raises(stepstone.LeaseLost):
        run("r", [Step("a", lambda s: {"a": 1}), Step("vanish", vanish)], store)
    assert store.load("r") is None


def test_lambda_returning_a_coroutine_under_arun_is_awaited(store: Store) -> None:
    """A plain callable returning a coroutine under arun (``lambda s: call(s)``) is awaited."""

    async def work() -> State:
        return {"x": 1}

    def make(state: State) -> Any:
        return work()

    assert arun_in_time("arun", arun("r", [Step("s", make)], store)) == {"x": 1}
    with pytest.raises(StepFailed) as info:
        run("plain", [Step("s", make)], store)  # under run nothing awaits it: a clear error
    assert isinstance(info.value.__cause__, TypeError)


# --- arguments of the wrong type ----------------------------------------------------------


@pytest.mark.parametrize(
    "lease", [0, -1, float("nan"), float("inf"), True, "30", timedelta(days=2)]
)
def test_bad_leases_are_refused(store: Store, lease: Any) -> None:
    """A lease that is not a sane number of seconds is refused before anything is stored."""
    with pytest.raises(InvalidWorkflow):
        run("r", [Step("a", lambda s: None)], store, lease=lease)
    assert store.load("r") is None


@pytest.mark.parametrize("run_id", [1, None, b"r", "", "x" * 1025, "a\x00b", "\ud800"])
def test_bad_run_ids_are_refused_everywhere(store: Store, run_id: Any) -> None:
    """start, cancel, signal and run all refuse a bad run_id with InvalidRunId."""
    wf = Workflow("w", [Step("a", lambda s: None)])
    for call in (
        lambda: start(store, wf, run_id),
        lambda: cancel(store, run_id),
        lambda: signal(store, run_id, "go", None),
        lambda: run(run_id, wf, store),
    ):
        with pytest.raises(stepstone.InvalidRunId):
            call()


def test_start_refuses_what_is_not_a_workflow(store: Store) -> None:
    """start() with a list of steps instead of a Workflow is refused and stores nothing."""
    with pytest.raises(InvalidWorkflow):
        start(store, [Step("a", lambda s: None)], "r")  # type: ignore[arg-type]
    assert store.load("r") is None
