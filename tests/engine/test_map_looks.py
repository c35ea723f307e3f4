"""A ``Map`` parent that looks at its children again reads only those not seen done.

Each look of a waiting parent (its poll, a worker taking it over) used to load every
child: a Map of N children whose parent looked once per finished child cost N * N
loads. These tests count the loads a parent's looks make (counts, never time) for 10
and 20 children finishing one by one: they must grow with N, not with its square.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import QUICK_BACKENDS
from stepstone import Map, Step, Store, Suspended, Workflow, _suspend, open_store, run
from stepstone._checkpoint import Checkpoint
from stepstone._suspend import child_run_id

State = dict[str, Any]
BACKENDS = QUICK_BACKENDS

CHILD = Workflow("looks-child", [Step("double", lambda s: {"double": 2 * s["n"]})])


def _parent(size: int) -> Workflow:
    return Workflow(
        f"looks-parent-{size}", [Map("kids", CHILD, lambda s: [{"n": n} for n in range(size)])]
    )


@pytest.fixture(params=BACKENDS)
def make_config(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """Return a maker of fresh, empty stores' configs of the backend named by the parameter."""

    def make() -> str:
        if request.param == "memory":
            return f"memory://map-looks-{uuid.uuid4().hex}"
        return f"sqlite:///{tmp_path}/runs-{uuid.uuid4().hex}.db"

    return make


class _ParentLoads:
    """Counts the loads of child records made while the parent runs."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loads = 0
        self.in_parent = False
        inner: Callable[[str], Checkpoint | None] = store.load

        def load(run_id: str) -> Checkpoint | None:
            if self.in_parent and run_id != "p":
                self.loads += 1
            return inner(run_id)

        monkeypatch.setattr(store, "load", load)


def _child_loads(config: str, size: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Loads of children by the parent's looks, one look after each child's end."""
    parent = _parent(size)
    # The parent's poll is due at once: each ``run`` below is a look, as a worker's
    # would be whenever the poll comes round while the children run.
    monkeypatch.setattr(_suspend, "CHILD_POLL", 0.0)
    with open_store(config) as store:
        with pytest.raises(Suspended):
            run("p", parent, store)  # makes the children (not counted)
        counts = _ParentLoads(store, monkeypatch)
        result: State | None = None
        for n in range(size):
            assert result is None, "the parent finished before its last child"
            run(child_run_id("p", "kids", n), CHILD, store)
            counts.in_parent = True
            try:
                result = run("p", parent, store)
            except Suspended:
                result = None
            finally:
                counts.in_parent = False
        assert result is not None, "the parent did not finish after its last child"
        assert [kid["double"] for kid in result["kids"]] == [2 * n for n in range(size)]
        return counts.loads


def test_a_map_parent_looking_again_loads_only_children_not_seen_done(
    make_config: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loads by a parent looking once per finished child grow linearly: 20 children cost
    about twice 10 (each look reads the children not yet seen done, up to one still going)."""
    ten = _child_loads(make_config(), 10, monkeypatch)
    twenty = _child_loads(make_config(), 20, monkeypatch)
    assert twenty <= 2.5 * ten, f"10 children: {ten} loads, 20 children: {twenty}"
    assert twenty <= 5 * 20, f"{twenty} loads for 20 children: more than 5 a child"
