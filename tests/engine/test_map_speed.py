"""A ``Map`` parent is resumed once its children are done, not on every child's end.

Issue 20: told of each child's completion, a Map parent loaded all N children N times
(O(N^2) loads). These tests count the store's loads and the parent's resumptions (counts,
never time) for a Map of 20 children run one by one, the parent resumed whenever it is
due, as a worker would at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS as ALL_BACKENDS
from fresh_stores import fresh_config
from stepstone import Map, Step, StepFailed, Store, Suspended, Workflow, open_store, run
from stepstone._checkpoint import Checkpoint, utcnow
from stepstone._suspend import TOGETHER_BATCH, child_run_id

State = dict[str, Any]
#: Every backend but Cosmos DB.
BACKENDS = tuple(kind for kind in ALL_BACKENDS if kind != "cosmos")
SIZE = 20

CHILD = Workflow("speed-child", [Step("square", lambda s: {"square": s["n"] * s["n"]})])


def _items(state: State) -> list[State]:
    return [{"n": n} for n in range(SIZE)]


def _boom(state: State) -> State:
    raise RuntimeError("child 7 fails")


PARENT = Workflow("speed-parent", [Map("kids", CHILD, _items)])
FAILING = Workflow("speed-failing", [Step("boom", _boom)])


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of the backend named by the parameter, as a config string."""
    return fresh_config(str(request.param), request, tmp_path)


class Counts:
    """Loads of child records (by anyone) and resumptions of the parent."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.child_loads = 0
        self.resumed = 0
        inner: Callable[[str], Checkpoint | None] = store.load

        def load(run_id: str) -> Checkpoint | None:
            if run_id != "p":
                self.child_loads += 1
            return inner(run_id)

        monkeypatch.setattr(store, "load", load)


def _resume_if_due(store: Store, counts: Counts) -> State | None:
    """Run the parent if it is due (as a worker would at once); its result, if done."""
    parent = store.load("p")
    assert parent is not None
    if parent.status == "done":
        return parent.state
    if parent.wake_at is None or parent.wake_at > utcnow():
        return None
    counts.resumed += 1
    try:
        return run("p", PARENT, store)
    except Suspended:
        return None


@pytest.mark.parametrize("order", ["in order", "reversed", "shuffled"])
def test_a_map_parent_is_resumed_once_and_loads_each_child_a_few_times(
    config: str, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 children ending one by one: the parent resumes once (shuffled: a few times), not 20."""
    with open_store(config) as store:
        with pytest.raises(Suspended):
            run("p", PARENT, store)
        counts = Counts(store, monkeypatch)
        indexes = list(range(SIZE))
        if order == "reversed":
            indexes.reverse()
        elif order == "shuffled":
            random.Random(20).shuffle(indexes)
        result: State | None = None
        for n in indexes:
            assert result is None, "the parent finished before its last child"
            assert run(child_run_id("p", "kids", n), CHILD, store)["square"] == n * n
            result = _resume_if_due(store, counts)
        assert result is not None, "the parent was never told its last child finished"
        assert [kid["square"] for kid in result["kids"]] == [n * n for n in range(SIZE)]
        # Told of every child's end, the parent resumed 20 times and loaded 20 children
        # each time: ~21 loads a child. Now: the child's own load, the siblings it looks
        # at, and the parent's pass over all of them when it resumes.
        # A child looks at no more than 3 siblings (``_PEEKS``): in a shuffled order the
        # last few ends may each find those done and tell the parent, in vain (then
        # ~10 loads a child: still half of the 20 resumptions' 21).
        most = 1 if order != "shuffled" else 8
        assert counts.resumed <= most, f"the parent resumed {counts.resumed} times"
        per_child = counts.child_loads / SIZE
        assert per_child <= 12, f"{per_child:.1f} loads a child ({counts.child_loads} in all)"


def test_a_failed_child_resumes_its_parent_at_once(config: str) -> None:
    """A failing child tells its parent while its siblings are still queued; the Map fails."""
    failing = Workflow("speed-parent", [Map("kids", FAILING, _items)])
    with open_store(config) as store:
        with pytest.raises(Suspended):
            run("p", failing, store)
        with pytest.raises(StepFailed, match="boom"):
            run(child_run_id("p", "kids", 7), FAILING, store)
        parent = store.load("p")
        assert parent is not None and parent.status == "waiting"
        assert parent.wake_at is not None and parent.wake_at <= utcnow(), "parent not told"


class _Overlapping:
    """Wraps a store's ``save``/``asave``: the most child creations seen in flight at once.

    Each creation waits (up to 10 s) until four are in flight, so a Map that makes its
    children one or two at a time shows 1 or 2 (after the waits time out), one that
    makes a batch at once 4 or more.
    """

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.second = threading.Event()
        save, asave = store.save, store.asave

        def enter(cp: Checkpoint) -> bool:
            if cp.version is not None or cp.parent != "p":
                return False
            with self.lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                if self.in_flight >= 4:
                    self.second.set()
            return True

        def leave() -> None:
            with self.lock:
                self.in_flight -= 1

        def counted(cp: Checkpoint) -> Checkpoint:
            if not enter(cp):
                return save(cp)
            try:
                self.second.wait(10)
                return save(cp)
            finally:
                leave()

        async def acounted(cp: Checkpoint) -> Checkpoint:
            import asyncio

            if not enter(cp):
                return await asave(cp)
            try:
                await asyncio.to_thread(self.second.wait, 10)
                return await asave(cp)
            finally:
                leave()

        monkeypatch.setattr(store, "save", counted)
        monkeypatch.setattr(store, "asave", acounted)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_map_makes_its_children_concurrently(
    config: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children are created several at once (``Together``): one flush for many."""
    import asyncio

    from stepstone import arun

    with open_store(config) as store:
        seen = _Overlapping(store, monkeypatch)
        together: list[int] = []  # stores that save several in one commit: each call
        if store.saves_together:
            save_many = store.save_many

            def counted(cps: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
                together.append(len(cps))
                return save_many(cps)

            monkeypatch.setattr(store, "save_many", counted)
        with pytest.raises(Suspended):
            if mode == "async":
                asyncio.run(arun("p", PARENT, store))
            else:
                run("p", PARENT, store)
        if store.saves_together:
            # One transaction and one commit for a batch (SQLite's group commit; on
            # PostgreSQL one round trip).
            assert together and max(together) >= 4, together
            group = getattr(store, "_group", None)
            if group is not None:
                assert max(group.batch_sizes) >= 4, f"no commit held 4: {dict(group.batch_sizes)}"
        else:
            assert seen.most >= 4, f"the Map made at most {seen.most} children at once"
        children = [store.load(child_run_id("p", "kids", n)) for n in range(SIZE)]
        assert all(c is not None and c.status == "queued" for c in children)


def test_children_ending_while_their_parent_makes_the_rest_leave_it_alone(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Children that end while the parent still makes their siblings write nothing to it.

    The parent lists its children before it makes them, and its last child is not made
    yet, so none of them can be the last to end. (Unlisted, each such end wrote the
    parent, due now, and sent it looking at every child once more: under one worker, 40
    to 99 parent writes for 100 children.) Here the first batch of children runs to its
    end inside the parent's creation of the first child of the next batch.
    """
    held = child_run_id("p", "kids", TOGETHER_BATCH)
    parent_writes: list[str] = []
    during: list[int] = []
    with open_store(config) as store:
        inner, inner_many = store.save, store.save_many

        def seen(cp: Checkpoint) -> None:
            if cp.run_id == "p":
                parent_writes.append(cp.status)
            elif cp.run_id == held and cp.version is None and not during:
                before = len(parent_writes)
                for n in range(TOGETHER_BATCH):  # made already (the batch before)
                    assert run(child_run_id("p", "kids", n), CHILD, store)["square"] == n * n
                during.append(len(parent_writes) - before)

        def save(cp: Checkpoint) -> Checkpoint:
            seen(cp)
            return inner(cp)

        def save_many(cps: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
            # A store that saves several in one commit makes a batch of children so.
            for cp in cps:
                seen(cp)
            return inner_many(cps)

        monkeypatch.setattr(store, "save", save)
        monkeypatch.setattr(store, "save_many", save_many)
        with pytest.raises(Suspended):
            run("p", PARENT, store)
        assert during == [0], f"the parent was written {during} times while it made children"
        counts = Counts(store, monkeypatch)
        result: State | None = None
        for n in range(TOGETHER_BATCH, SIZE):
            assert result is None, "the parent finished before its last child"
            assert run(child_run_id("p", "kids", n), CHILD, store)["square"] == n * n
            result = _resume_if_due(store, counts)
        assert result is not None, "the parent was never told its last child finished"
        assert [kid["square"] for kid in result["kids"]] == [n * n for n in range(SIZE)]
        assert counts.resumed == 1, f"the parent resumed {counts.resumed} times"
