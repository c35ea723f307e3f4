"""A Map's bookkeeping on every backend, both forms: store errors pause it, leases hold.

Issue 23, items 2 and 5. A Map parent loads and creates its child records, re-queues
failed ones, and its children nudge it when they finish. One ``StoreUnavailable`` at
any of those points must stop the run as a failed save does (a worker resumes it),
never fail the step for good. And the Map's owner must keep its lease while
``items()`` runs or while it creates many children, as it does during a long step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Self

import pytest

from fresh_stores import BACKENDS, fresh_config
from stepstone import (
    Map,
    RunOwned,
    Step,
    StepFailed,
    Store,
    StoreUnavailable,
    Suspended,
    Workflow,
    arun,
    open_store,
    run,
)
from stepstone._checkpoint import Checkpoint, utcnow
from stepstone._effects import step_through
from stepstone._suspend import CHILD_POLL, child_run_id, nudge
from stepstone.testing import Ops
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.testing._ops import MODES, Mode
from stepstone.testing._runtime_kit import Serving, time_ahead, until
from stepstone.worker._io import perform

State = dict[str, Any]


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of the backend named by the parameter, as a config string."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture(params=MODES)
def ops(request: pytest.FixtureRequest, config: str) -> Iterator[Ops]:
    """The store under test in one form: sync calls and ``run``, or awaits and ``arun``."""
    mode: Mode = request.param
    with open_store(config) as store:
        ops = Ops(mode, store)
        try:
            yield ops
        finally:
            ops.close()


# --- a store that fails or holds on cue -------------------------------------------------

Cue = Callable[[str, str, Checkpoint | None], bool]


class Cued(Store):
    """Wraps a store; the first call that ``cue(op, run_id, checkpoint)`` picks misbehaves.

    Without ``hold`` that call raises ``StoreUnavailable``. With ``hold`` (an event) it
    waits until the test sets ``hold``, then goes through; ``reached`` tells the test it
    is waiting. Everything else goes straight to the wrapped store, sync or async, so
    the runner sees exactly that backend plus one misbehaving call.
    """

    scheme = "cued-test"

    def __init__(self, inner: Store, cue: Cue, hold: threading.Event | None = None) -> None:
        self.inner = inner
        self.cue = cue
        self.hold = hold
        self.reached = threading.Event()
        self.fired: list[str] = []
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: str) -> Self:
        raise NotImplementedError

    def _picked(self, op: str, run_id: str, checkpoint: Checkpoint | None) -> bool:
        with self._lock:
            if self.fired or not self.cue(op, run_id, checkpoint):
                return False
            self.fired.append(f"{op} {run_id}")
            return True

    def _fail(self, op: str, run_id: str) -> StoreUnavailable:
        return StoreUnavailable(f"injected: {op} {run_id!r} could not reach the store")

    def _wait(self) -> None:
        assert self.hold is not None
        self.reached.set()
        assert self.hold.wait(WAIT_TIMEOUT), "the test never let the held store call go"

    def load(self, run_id: str) -> Checkpoint | None:
        if self._picked("load", run_id, None):
            if self.hold is None:
                raise self._fail("load", run_id)
            self._wait()
        return self.inner.load(run_id)

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        if self._picked("save", checkpoint.run_id, checkpoint):
            if self.hold is None:
                raise self._fail("save", checkpoint.run_id)
            self._wait()
        return self.inner.save(checkpoint)

    async def aload(self, run_id: str) -> Checkpoint | None:
        if self._picked("load", run_id, None):
            if self.hold is None:
                raise self._fail("load", run_id)
            await asyncio.to_thread(self._wait)
        return await self.inner.aload(run_id)

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        if self._picked("save", checkpoint.run_id, checkpoint):
            if self.hold is None:
                raise self._fail("save", checkpoint.run_id)
            await asyncio.to_thread(self._wait)
        return await self.inner.asave(checkpoint)

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        return self.inner.delete(run_id, expected_version=expected_version)

    def list_runs(self) -> Iterator[str]:
        return self.inner.list_runs()

    def close(self) -> None:
        """The wrapped store belongs to the test; it closes it."""


# --- workflows --------------------------------------------------------------------------

FAILING: set[int] = set()


def _square(state: State) -> State:
    if state["n"] in FAILING:
        raise RuntimeError(f"child {state['n']} fails on purpose")
    return {"square": state["n"] ** 2}


CHILD = Workflow("square", [Step("square", _square)])


def fanout(size: int, items: Callable[[State], list[Any]] | None = None) -> Workflow:
    """A parent that maps ``CHILD`` over ``range(size)`` and sums the squares."""
    return Workflow(
        f"sum-of-squares-{size}",
        [
            Step("size", lambda s: {"size": size}),
            Map("kids", CHILD, items or (lambda s: [{"n": n} for n in range(s["size"])])),
            Step("total", lambda s: {"total": sum(kid["square"] for kid in s["kids"])}),
        ],
    )


def finished_by_a_worker(ops: Ops, config: str, parent: Workflow, run_id: str) -> State:
    """Serve the parent (and its children) until ``run_id`` is done; return its state."""

    def done() -> bool:
        cp = ops.store.load(run_id)
        return cp is not None and cp.status == "done"

    with Serving(config, [parent], ops.mode, concurrency=4, poll=0.05):
        until(f"a worker to finish the Map parent {run_id!r}", done)
    final = ops.load(run_id)
    assert final is not None
    return final.state


# --- item 2: one transient error in the bookkeeping -------------------------------------


def _child_load(op: str, run_id: str, cp: Checkpoint | None) -> bool:
    return op == "load" and run_id == child_run_id("p", "kids", 1)


def _child_create(op: str, run_id: str, cp: Checkpoint | None) -> bool:
    return (
        op == "save"
        and run_id == child_run_id("p", "kids", 1)
        and cp is not None
        and cp.version is None
    )


def test_store_error_while_the_parent_starts_a_child_pauses_it(ops: Ops, config: str) -> None:
    """One StoreUnavailable loading or creating a child stops the parent unfailed; a worker ends."""
    parent = fanout(3)
    # Creating first: a first look makes its children without loading them (none can
    # exist yet); the look after that failure finds them listed on the parent, so loads.
    for cue in (_child_create, _child_load):
        cued = Cued(ops.store, cue)
        with pytest.raises(StoreUnavailable, match="injected"):
            ops.run("p", parent, cued)
        assert cued.fired, f"the injected error never fired ({cue.__name__})"
        stopped = ops.load("p")
        assert stopped is not None
        # Not failed, and given back: claimable at once, as after a plain step's failed save.
        assert (stopped.failure, stopped.owner, stopped.step) == (None, None, 0), stopped
    assert finished_by_a_worker(ops, config, parent, "p")["total"] == 0 + 1 + 4


def test_store_error_in_a_childs_nudge_does_not_fail_anything(ops: Ops, config: str) -> None:
    """A child whose nudge of its parent fails still finishes; the parent's poll ends the Map."""
    parent = fanout(2)
    with pytest.raises(Suspended):
        ops.run("p", parent)
    # Child 0's nudge fails reading its sibling (a child whose parent was made in this
    # process looks at a sibling before the parent, ``_mapseen.LISTED``), child 1's
    # writing the parent.
    for n, (op, target) in enumerate((("load", child_run_id("p", "kids", 1)), ("save", "p"))):

        def on_target(
            o: str, run_id: str, cp: Checkpoint | None, op: str = op, target: str = target
        ) -> bool:
            return o == op and run_id == target

        cued = Cued(ops.store, on_target)
        assert ops.run(child_run_id("p", "kids", n), CHILD, cued) == {"n": n, "square": n * n}
        assert cued.fired == [f"{op} {target}"]
    waiting = ops.load("p")
    assert waiting is not None and waiting.failure is None and waiting.status == "waiting"
    assert waiting.wake_at is not None and waiting.wake_at > utcnow(), "a nudge landed"
    # Time driven explicitly: the worker's clocks (its claim query, the Map's due check)
    # read one poll interval later, when the parent looks at its children unprompted.
    ahead = timedelta(seconds=CHILD_POLL + 1)
    with time_ahead(ahead):
        assert finished_by_a_worker(ops, config, parent, "p")["total"] == 1


def test_store_error_requeueing_a_failed_child_keeps_the_real_failure(
    ops: Ops, config: str
) -> None:
    """A StoreUnavailable re-queueing a failed child leaves the child's failure on record."""
    parent = fanout(2)
    with pytest.raises(Suspended):
        ops.run("p", parent)
    FAILING.add(1)
    try:
        ops.run(child_run_id("p", "kids", 0), CHILD)
        with pytest.raises(StepFailed):
            ops.run(child_run_id("p", "kids", 1), CHILD)
        with pytest.raises(StepFailed):
            ops.run("p", parent)
    finally:
        FAILING.clear()
    requeue = child_run_id("p", "kids", 1)
    cued = Cued(ops.store, lambda o, run_id, cp: o == "save" and run_id == requeue)
    with pytest.raises(StoreUnavailable, match="injected"):
        ops.run("p", parent, cued)
    assert cued.fired == [f"save {requeue}"]
    kept = ops.load("p")
    assert kept is not None and kept.failure is not None and kept.owner is None
    assert kept.failure.error_type == "ChildFailed", kept.failure
    with pytest.raises(Suspended):
        ops.run("p", parent)  # the retry goes through now and re-queues child 1
    assert finished_by_a_worker(ops, config, parent, "p")["total"] == 1


class Raced(Cued):
    """A store where, just before the cued save, another writer saves ``meanwhile(cp)``."""

    def __init__(self, inner: Store, cue: Cue, meanwhile: Callable[[Checkpoint], Checkpoint]):
        super().__init__(inner, cue)
        self.meanwhile = meanwhile

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        if self._picked("save", checkpoint.run_id, checkpoint):
            self.inner.save(self.meanwhile(checkpoint))
        return self.inner.save(checkpoint)

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        if self._picked("save", checkpoint.run_id, checkpoint):
            await self.inner.asave(self.meanwhile(checkpoint))
        return await self.inner.asave(checkpoint)


def test_a_child_another_writer_wrote_meanwhile_is_reloaded(ops: Ops) -> None:
    """A child created, or re-queued, by someone else as the Map wrote it is adopted."""
    parent = fanout(2)
    raced = Raced(ops.store, _child_create, lambda cp: cp)
    with pytest.raises(Suspended) as info:
        ops.run("p", parent, raced)
    assert raced.fired and info.value.waiting_for == "children 0 of 2"
    FAILING.add(1)
    try:
        ops.run(child_run_id("p", "kids", 0), CHILD)
        with pytest.raises(StepFailed):
            ops.run(child_run_id("p", "kids", 1), CHILD)
        with pytest.raises(StepFailed):
            ops.run("p", parent)
    finally:
        FAILING.clear()
    requeue = child_run_id("p", "kids", 1)
    # Someone re-queues the failed child just before the Map does: the Map's save
    # conflicts, it reloads the child, finds it queued and leaves it so.
    raced = Raced(
        ops.store,
        lambda o, run_id, cp: o == "save" and run_id == requeue,
        lambda cp: cp,
    )
    with pytest.raises(Suspended) as again:
        ops.run("p", parent, raced)
    assert raced.fired == [f"save {requeue}"] and again.value.waiting_for == "children 1 of 2"
    child = ops.load(requeue)
    assert child is not None and child.status == "queued"
    ops.run(requeue, CHILD)
    assert ops.run("p", parent)["total"] == 1


# --- item 5: the lease is kept during the bookkeeping -----------------------------------

LEASE = 1.0


def _holder(
    mode: Mode, config: str, parent: Workflow, wrap: Callable[[Store], Store]
) -> tuple[threading.Thread, list[BaseException]]:
    """Start a thread that runs ``p`` under a short lease, in ``mode``, on its own store."""
    outcome: list[BaseException] = []

    def main() -> None:
        try:
            if mode == "async":

                async def go() -> None:
                    async with open_store(config) as store:
                        await arun("p", parent, wrap(store), lease=LEASE)

                asyncio.run(go())
            else:
                with open_store(config) as store:
                    run("p", parent, wrap(store), lease=LEASE)
        except BaseException as exc:  # noqa: BLE001 - the thread's outcome, whatever it is, goes to the test
            outcome.append(exc)

    thread = threading.Thread(target=main, name=f"{mode} Map owner")
    thread.start()
    return thread, outcome


def renewed(ops: Ops, times: int) -> Callable[[], bool]:
    """Return a check that is true once the parent's record has changed ``times`` times."""
    seen: list[str | None] = []

    def check() -> bool:
        cp = ops.store.load("p")
        version = None if cp is None else cp.version
        if cp is not None and (not seen or version != seen[-1]):
            seen.append(version)
        return len(seen) > times

    return check


def _second_caller_is_refused(ops: Ops, parent: Workflow) -> None:
    # Each renewal comes at least a third of the lease after the owner's last write, and
    # RunOwned needs one more: the owner has held the run for a whole lease by then.
    until("two lease renewals of the Map parent", renewed(ops, 2))
    with pytest.raises(RunOwned):
        ops.run("p", parent)


def test_lease_is_kept_while_items_runs(ops: Ops, config: str) -> None:
    """items() longer than the lease: the owner renews, a second caller gets RunOwned."""
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def items(state: State) -> list[State]:
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            assert release.wait(WAIT_TIMEOUT), "the test never let items() return"
        return [{"n": n} for n in range(3)]

    parent = fanout(3, items)
    thread, outcome = _holder(ops.mode, config, parent, lambda store: store)
    try:
        assert entered.wait(WAIT_TIMEOUT), "the owner never called items()"
        _second_caller_is_refused(ops, parent)
    finally:
        release.set()
        thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "the Map owner hung"
    assert len(outcome) == 1 and isinstance(outcome[0], Suspended), outcome
    assert len(calls) == 1, "items() ran again: the run was taken over"
    held = ops.load("p")
    assert held is not None and held.epoch == 1 and held.owner is None


def test_lease_is_kept_while_many_children_are_created(ops: Ops, config: str) -> None:
    """Creating many children under a short lease: renewed throughout, never taken over."""
    # The 1,500 where a child costs nothing; 100 where each is a durable load and
    # save (the hold below makes the creation outlast the lease whatever the count).
    size = 1_500 if config.startswith("memory:") else 100
    calls: list[int] = []

    def items(state: State) -> list[State]:
        calls.append(1)
        return [{"n": n} for n in range(size)]

    parent = fanout(size, items)
    # The owner stops two thirds of the way through, inside one child's save, for as
    # long as the test needs: creating the children takes longer than the lease, by
    # construction and not by the machine's speed.
    middle = child_run_id("p", "kids", size * 2 // 3)
    release = threading.Event()
    holding: list[Cued] = []

    def wrap(store: Store) -> Store:
        cued = Cued(store, lambda op, run_id, cp: op == "save" and run_id == middle, release)
        holding.append(cued)
        return cued

    thread, outcome = _holder(ops.mode, config, parent, wrap)
    try:
        until(
            "the owner to reach the held child",
            lambda: bool(holding) and holding[0].reached.is_set(),
        )
        _second_caller_is_refused(ops, parent)
        # A child that ends now tells nobody: the last child is not made yet (the parent
        # lists its children before it makes them), and its end tells the parent.
        ops.run(child_run_id("p", "kids", 0), CHILD)
        # A child that fails or is cancelled always nudges the parent (due at once), and
        # the owner's next renewal must keep that on the record, or the parent sleeps a
        # whole poll.
        step_through(nudge("p"), lambda effect: perform(ops.store, effect))
        until("a lease renewal after the nudge", renewed(ops, 1))
    finally:
        release.set()
        thread.join(WAIT_TIMEOUT)
    assert not thread.is_alive(), "the Map owner hung"
    assert len(outcome) == 1 and isinstance(outcome[0], Suspended), outcome
    assert outcome[0].waiting_for == f"children 0 of {size}"
    assert len(calls) == 1, "items() ran again: the run was taken over"
    held = ops.load("p")
    assert held is not None and held.epoch == 1 and len(held.children) == size
    assert held.wake_at is not None and held.wake_at <= utcnow(), "the child's nudge was lost"
