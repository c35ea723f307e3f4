"""A child that ends tells its Map parent without reading the parent while a sibling runs.

Issue 36 (the Map as cheap as its steps). The parent's record lists every child, so a
load of it costs as much as the Map is wide, and every child used to load it when it
ended. A child whose parent was made in this process now looks at a sibling first
(``_mapseen.LISTED``): while one is still going, the parent is not read at all. Every
case where that hint says nothing (a sibling missing, of another parent, failed, or
all done) takes the full path, which reads the parent and tells it as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stepstone import Map, Step, StepFailed, Suspended, Workflow, open_store, run
from stepstone._checkpoint import Checkpoint, utcnow
from stepstone._mapseen import LISTED
from stepstone._store import Store
from stepstone._suspend import child_run_id

State = dict[str, Any]
PARENT = "p"


def _square(state: State) -> State:
    if state["n"] < 0:
        raise RuntimeError("a negative child fails on purpose")
    return {"square": state["n"] ** 2}


CHILD = Workflow("nudge-square", [Step("square", _square)])


def fanout(items: list[int]) -> Workflow:
    return Workflow(
        "nudge-fanout",
        [Map("kids", CHILD, lambda s: [{"n": n} for n in items])],
    )


class Counted:
    """Counts the loads of each run id made through ``store.load`` (sync runs only)."""

    def __init__(self, store: Store) -> None:
        self.loads: list[str] = []
        self._inner = store.load
        store.load = self._load  # type: ignore[method-assign]

    def _load(self, run_id: str) -> Checkpoint | None:
        self.loads.append(run_id)
        return self._inner(run_id)

    def parent_loads(self) -> int:
        return self.loads.count(PARENT)


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store("memory:") as opened:
        yield opened
    LISTED.forget(PARENT)


def _waiting_parent(store: Store, items: list[int]) -> Checkpoint:
    """Start the Map parent: it makes its children and waits on them."""
    with pytest.raises(Suspended, match="waiting for children"):
        run(PARENT, fanout(items), store)
    parent = store.load(PARENT)
    assert parent is not None and parent.status == "waiting"
    assert parent.wake_at is not None and parent.wake_at > utcnow(), "already due"
    return parent


def _kid(n: int) -> str:
    return child_run_id(PARENT, "kids", n)


def _is_told(store: Store) -> bool:
    parent = store.load(PARENT)
    assert parent is not None
    return parent.wake_at is not None and parent.wake_at <= utcnow()


def test_a_child_ending_while_a_sibling_is_queued_does_not_read_the_parent(
    store: Store,
) -> None:
    _waiting_parent(store, [1, 2, 3])
    counted = Counted(store)
    run(_kid(0), CHILD, store)
    assert counted.parent_loads() == 0, counted.loads
    assert _kid(2) in counted.loads, "the last sibling was not looked at"
    assert not _is_told(store), "told while two children are still queued"


def test_the_last_child_to_end_still_tells_the_parent(store: Store) -> None:
    _waiting_parent(store, [1, 2, 3])
    counted = Counted(store)
    run(_kid(2), CHILD, store)
    run(_kid(0), CHILD, store)
    assert counted.parent_loads() == 0, counted.loads
    run(_kid(1), CHILD, store)
    assert counted.parent_loads() >= 1
    assert _is_told(store), "the child that ended last did not tell the parent"
    final = run(PARENT, fanout([1, 2, 3]), store)
    assert isinstance(final, dict)
    assert final == {"kids": [{"n": 1, "square": 1}, {"n": 2, "square": 4}, {"n": 3, "square": 9}]}


def test_without_the_hint_a_child_reads_the_parent(store: Store) -> None:
    """Another process's children (nothing listed here) take the full path, as before."""
    _waiting_parent(store, [1, 2, 3])
    LISTED.forget(PARENT)
    counted = Counted(store)
    run(_kid(0), CHILD, store)
    assert counted.parent_loads() == 1, counted.loads
    assert not _is_told(store)


def test_a_stale_hint_naming_a_missing_sibling_takes_the_full_path(store: Store) -> None:
    _waiting_parent(store, [1, 2])
    # As if the parent had been retried here with three items, then elsewhere with two.
    LISTED.remember(PARENT, (_kid(0), _kid(1), _kid(2)))
    counted = Counted(store)
    run(_kid(1), CHILD, store)
    run(_kid(0), CHILD, store)
    assert counted.parent_loads() >= 1, "a missing sibling was taken for one still going"
    assert _is_told(store), "the last child did not tell the parent"


def test_a_sibling_of_another_parent_is_not_taken_for_one_going(store: Store) -> None:
    _waiting_parent(store, [1, 2])
    stranger = "elsewhere"
    run(stranger, Workflow("holder", [Step("hold", lambda s: {})]), store)
    queued = store.load(stranger)
    assert queued is not None
    LISTED.remember(PARENT, (_kid(0), _kid(1), stranger))
    counted = Counted(store)
    run(_kid(0), CHILD, store)
    run(_kid(1), CHILD, store)
    assert counted.parent_loads() >= 1
    assert _is_told(store), "a run of no Map kept the parent from being told"


def test_a_failed_sibling_is_not_taken_for_one_going(store: Store) -> None:
    """A failed child told the parent itself; the next child to end reads the parent."""
    _waiting_parent(store, [1, 2, -1])
    with pytest.raises(StepFailed):
        run(_kid(2), CHILD, store)
    assert _is_told(store), "a failed child always tells its parent"
    counted = Counted(store)
    run(_kid(0), CHILD, store)
    assert counted.parent_loads() == 1, counted.loads
