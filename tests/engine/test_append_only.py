"""``Workflow(append_only=[...])``: the declared trade of ``stepstone._append_only``.

A save of a long state compares only the last ``CHECKED`` stored items of a declared
list; older items are trusted. These tests pin both sides of the trade on memory and
SQLite: what is still stored exactly (appends, the last items' changes, a shorter list,
another value, undeclared keys), what is knowingly not (an older item changed in place),
and the refusals of bad declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import InvalidWorkflow, Step, Workflow, open_store, run
from stepstone import _statelog as sl
from stepstone._append_only import CHECKED, check_append_only
from stepstone._checks import make_plan
from stepstone._store import Store

State = dict[str, Any]
TEXT = "t" * 400  # 30 messages of it: a state past INLINE_MAX, kept in pieces
START = 30


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    config = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/a.db"
    opened = open_store(config)
    yield opened
    opened.close()


def _messages(n: int) -> list[State]:
    return [{"role": "user", "content": f"{i}: {TEXT}", "n": i} for i in range(n)]


def _append(state: State) -> State:
    messages = state["messages"]
    return {"messages": [*messages, {"role": "assistant", "content": TEXT, "n": len(messages)}]}


def _workflow(edit: Callable[[State], State], *, trusted: bool = True) -> Workflow:
    """Three appends, then ``edit`` as the fourth step, then one more append."""
    steps = [Step(f"a{i}", _append) for i in range(3)]
    steps += [Step("edit", edit), Step("a3", _append)]
    return Workflow("chat", steps, append_only=["messages"] if trusted else None)


def _stored(store: Store, run_id: str) -> State:
    cp = store.load(run_id)
    assert cp is not None and cp.status == "done"
    return cp.state


def test_appends_are_stored_as_their_tails_and_load_equal(store: Store) -> None:
    """Each save of the declared list writes only the appended items ("x" ops)."""
    ops: list[list[str] | None] = []
    stop = sl.observe(lambda prepared: ops.append(prepared.changes))
    try:
        final = run("r", _workflow(_append), store, input={"messages": _messages(START)})
    finally:
        stop()
    assert len(final["messages"]) == START + 5
    assert _stored(store, "r") == final
    # The first step works on a fresh copy of the created run's state (not the objects
    # a save handed out), so its save sets the list whole; each later one appends.
    assert ops[-4:] == [["x messages"]] * 4


def test_an_older_item_changed_in_place_is_not_stored_when_declared(store: Store) -> None:
    """The trade: an item older than the last CHECKED, changed in place, is trusted."""

    def edit(state: State) -> State:
        state["messages"][0]["content"] = "edited"
        return _append(state)

    final = run("trusted", _workflow(edit), store, input={"messages": _messages(START)})
    assert final["messages"][0]["content"] == "edited"  # the run went on with it
    assert _stored(store, "trusted")["messages"][0]["content"] == f"0: {TEXT}"
    # Without the declaration the same change is stored: nothing is trusted.
    final = run(
        "exact", _workflow(edit, trusted=False), store, input={"messages": _messages(START)}
    )
    assert _stored(store, "exact") == final
    assert final["messages"][0]["content"] == "edited"


@pytest.mark.parametrize("back", [1, CHECKED])
def test_a_change_among_the_last_items_is_stored_when_declared(store: Store, back: int) -> None:
    """The last CHECKED stored items are compared: an edit there is stored."""

    def edit(state: State) -> State:
        state["messages"][-back]["content"] = "edited"
        return _append(state)

    final = run("r", _workflow(edit), store, input={"messages": _messages(START)})
    assert _stored(store, "r") == final
    assert final["messages"][-back - 2]["content"] == "edited"  # two appends since


def test_a_number_changed_to_another_type_among_the_last_items_is_stored(store: Store) -> None:
    def edit(state: State) -> State:
        state["messages"][-1]["n"] = float(state["messages"][-1]["n"])
        return _append(state)

    final = run("r", _workflow(edit), store, input={"messages": _messages(START)})
    stored = _stored(store, "r")
    assert stored == final and type(stored["messages"][-3]["n"]) is float


@pytest.mark.parametrize(
    "edit",
    [
        lambda state: {"messages": state["messages"][:5]},  # shorter
        lambda state: {"messages": {"not": "a list"}},
        lambda state: {"messages": None},
        lambda state: {"messages": [{"fresh": True}] * (len(state["messages"]) + 1)},
    ],
    ids=["shorter", "a-dict", "none", "replaced-items-last-checked"],
)
def test_what_is_not_an_append_is_stored_exactly(store: Store, edit: Any) -> None:
    def last(state: State) -> State:
        return state if not isinstance(state["messages"], list) else _append(state)

    steps = [Step("a0", _append), Step("edit", edit), Step("a1", last)]
    workflow = Workflow("chat", steps, append_only=["messages"])
    final = run("r", workflow, store, input={"messages": _messages(START)})
    assert _stored(store, "r") == final


def test_undeclared_keys_are_compared_in_full(store: Store) -> None:
    def edit(state: State) -> State:
        state["other"][0]["v"] = "edited"
        return _append(state)

    initial = {"messages": _messages(START), "other": [{"v": TEXT} for _ in range(40)]}
    final = run("r", _workflow(edit), store, input=initial)
    assert _stored(store, "r") == final and final["other"][0]["v"] == "edited"


def test_the_declaration_reaches_the_plan_a_worker_makes(store: Store) -> None:
    workflow = _workflow(_append)
    plan = make_plan("r", workflow, store, input=None, lease=None, asynchronous=False)
    assert plan.append_only == frozenset({"messages"})
    plain = make_plan("r", [Step("a", _append)], store, input=None, lease=None, asynchronous=False)
    assert plain.append_only == frozenset()


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ("messages", r"not one string; write append_only=\['messages'\]"),
        ([1], "holds 1; each item must be a non-empty str"),
        ([""], "holds ''; each item must be a non-empty str"),
        (5, "got int"),
    ],
)
def test_a_bad_declaration_is_refused_with_what_is_allowed(keys: Any, match: str) -> None:
    with pytest.raises(InvalidWorkflow, match=match):
        Workflow("chat", [Step("a", _append)], append_only=keys)


def test_a_declaration_is_a_set_of_keys() -> None:
    assert check_append_only("w", ("a", "b", "a")) == frozenset({"a", "b"})
    assert check_append_only("w", None) == frozenset()
    assert Workflow("chat", [Step("a", _append)]).append_only == frozenset()
