"""Unit tests of ``stepstone._statelog`` on ``memory://``: change detection, refusals, bases.

A long state (JSON above ``INLINE_MAX``) is kept as a base plus a log of changes. Each
test saves checkpoints straight through the store and compares what a fresh load
returns with what was saved, and, where it matters, with the same state saved whole.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import stepstone
from fresh_stores import fresh_config
from stepstone import ConflictError, CorruptCheckpoint, InvalidState, Step, open_store
from stepstone import _statelog as sl
from stepstone._checkpoint import Checkpoint, Stored
from stepstone._codec import MAX_DEPTH, dump_json
from stepstone.stores.memory import MemoryStore

State = dict[str, Any]


def _store() -> MemoryStore:
    return MemoryStore()


def _long(n: int = 0) -> State:
    """A state well above INLINE_MAX: a transcript of messages."""
    return {
        "messages": [{"i": i, "text": "m" * 200} for i in range(sl.INLINE_MAX // 100 + n)],
        "meta": {"a": 1, "b": {"c": [1, 2]}},
    }


def _save(store: MemoryStore, cp: Checkpoint, state: State | None = None) -> Checkpoint:
    """Save ``cp`` (with ``state`` if given) as the runner would: the next step."""
    if state is not None:
        cp = replace(cp, state=state, step=cp.step + 1)
    return store.save(cp)


def _first(store: MemoryStore, state: State) -> Checkpoint:
    return store.save(Checkpoint(f"r-{uuid.uuid4().hex[:8]}", state=state))


def _loaded(store: MemoryStore, run_id: str) -> State:
    cp = store.load(run_id)
    assert cp is not None
    return cp.state


def _decode(data: bytes) -> Any:
    from stepstone._codec import decode_json

    return decode_json(data)


def _newest_ops(store: MemoryStore, cp: Checkpoint) -> list[Any]:
    handle = cp.stored_state
    assert isinstance(handle, Stored) and handle.ref is not None
    keys = sl.pieces_of(handle.ref)[len(handle.ref["base"]) :]
    assert keys, "no log piece: the save was written whole"
    ops: list[Any] = _decode(store.pieces(cp.run_id, [keys[-1]])[keys[-1]])
    return ops


def _ref(cp: Checkpoint) -> dict[str, Any]:
    handle = cp.stored_state
    assert isinstance(handle, Stored) and handle.ref is not None
    return handle.ref


# -- change detection ----------------------------------------------------------------------


def test_an_append_in_place_is_logged_as_its_tail_only() -> None:
    """Appending to the handed list in place writes one "x" op with the new item only."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["messages"].append({"i": -1, "text": "new"})
    cp = _save(store, cp, state)
    assert _newest_ops(store, cp) == [["x", ["messages"], [{"i": -1, "text": "new"}]]]
    assert _loaded(store, cp.run_id) == state


def test_an_append_by_a_new_list_is_logged_as_its_tail_only() -> None:
    """A new list whose head is the handed list's items is an append too."""
    store = _store()
    cp = _first(store, _long())
    state = dict(cp.state)
    state["messages"] = [*cp.state["messages"], {"i": -2}]
    cp = _save(store, cp, state)
    assert _newest_ops(store, cp) == [["x", ["messages"], [{"i": -2}]]]
    assert _loaded(store, cp.run_id) == state


def test_an_item_replaced_in_place_inside_the_stored_prefix_is_detected() -> None:
    """Changing an item of the stored prefix in place is seen (== with the private copy)."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["messages"][3]["text"] = "changed"
    state["messages"].append({"i": -3})
    cp = _save(store, cp, state)
    loaded = _loaded(store, cp.run_id)
    assert loaded["messages"][3]["text"] == "changed"
    assert loaded == state


def test_a_new_list_of_equal_but_fresh_items_of_another_type_is_saved_whole() -> None:
    """A head item that is not the handed one, == to it but not the same JSON, is seen."""
    store = _store()
    base = _long()
    base["messages"][2]["flag"] = 1
    cp = _first(store, base)
    fresh = [dict(item) for item in cp.state["messages"]]
    fresh[2]["flag"] = True  # == 1, so only its identity tells it from the stored item
    cp = _save(store, cp, {**cp.state, "messages": [*fresh, {"i": -4}]})
    assert _newest_ops(store, cp)[0][0] == "s"
    assert _loaded(store, cp.run_id)["messages"][2]["flag"] is True


def test_a_list_grown_in_place_then_copied_longer_is_logged_as_its_tail() -> None:
    """The handed list grown in place, then a new list of it and more: one "x" of both."""
    store = _store()
    cp = _first(store, _long())
    state = dict(cp.state)
    cp.state["messages"].append({"i": -5})
    state["messages"] = [*cp.state["messages"], {"i": -6}]
    cp = _save(store, cp, state)
    assert _newest_ops(store, cp) == [["x", ["messages"], [{"i": -5}, {"i": -6}]]]
    assert _loaded(store, cp.run_id) == state


def test_nested_keys_set_and_deleted() -> None:
    """Setting and deleting keys deep in dicts is logged and replayed exactly."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["meta"]["b"]["new"] = {"x": [1, {"y": None}]}
    del state["meta"]["a"]
    state["top"] = "t"
    cp = _save(store, cp, state)
    ops = _newest_ops(store, cp)
    assert ["d", ["meta", "a"]] in ops
    assert _loaded(store, cp.run_id) == state
    state = cp.state
    del state["meta"]
    cp = _save(store, cp, state)
    assert _newest_ops(store, cp) == [["d", ["meta"]]]
    assert _loaded(store, cp.run_id) == state


def test_an_equal_value_of_another_type_is_saved_as_the_new_type() -> None:
    """A key set from 1 to True (equal in Python) is stored as True."""
    store = _store()
    base = _long()
    base["flag"] = 1
    base["ratio"] = 2
    cp = _first(store, base)
    state = cp.state
    state["flag"] = True
    state["ratio"] = 2.0
    cp = _save(store, cp, state)
    loaded = _loaded(store, cp.run_id)
    assert loaded["flag"] is True
    assert type(loaded["ratio"]) is float


@pytest.mark.parametrize(
    ("where", "new"),
    [
        ("a nested dict's number", True),
        ("a nested dict's number", 1.0),
        ("a list item's number", True),
        ("a stored message's number", 3.0),
        ("a number in the stored head of a grown list", False),
    ],
)
def test_a_number_changed_in_place_to_an_equal_one_of_another_type_is_stored(
    where: str, new: Any
) -> None:
    """``1 == True == 1.0``: a change in place between them is still a change, stored as such.

    Before the fix the private copy's ``==`` took these for unchanged: the run went on
    with the new value while the store kept the old one.
    """
    store = _store()
    base = _long()
    base["messages"][3]["i"] = 0 if new is False else 3
    cp = _first(store, base)
    state = cp.state
    if where == "a nested dict's number":
        state["meta"]["a"] = new  # was 1
        reach: Any = lambda s: s["meta"]["a"]  # noqa: E731
    elif where == "a list item's number":
        state["meta"]["b"]["c"][0] = new  # was 1
        reach = lambda s: s["meta"]["b"]["c"][0]  # noqa: E731
    elif where == "a stored message's number":
        state["messages"][3]["i"] = new  # was 3
        reach = lambda s: s["messages"][3]["i"]  # noqa: E731
    else:
        state["messages"][3]["i"] = new  # was 0
        state["messages"] = [*state["messages"], {"i": -7}]
        reach = lambda s: s["messages"][3]["i"]  # noqa: E731
    cp = _save(store, cp, state)
    assert _newest_ops(store, cp), "the save was not a log piece: the test misses its path"
    loaded = _loaded(store, cp.run_id)
    assert type(reach(loaded)) is type(new), f"{where}: stored as {reach(loaded)!r}"
    assert type(reach(cp.state)) is type(new), f"{where}: handed back as {reach(cp.state)!r}"
    assert dump_json(loaded) == dump_json(state)


def test_numbers_in_items_appended_by_earlier_saves_are_checked_too() -> None:
    """The places of a transcript's numbers are carried from save to save as it grows
    (an item without them in between): a type changed in place in an item appended
    saves ago, or in the first, is still stored."""
    store = _store()
    base = _long()
    for i, message in enumerate(base["messages"]):
        message["usage"] = {"in": i, "out": 2 * i}
    cp = _first(store, base)
    for item in ({"i": -1, "usage": {"in": 7, "out": 0}}, {"i": -2}):
        state = dict(cp.state)  # two appends: the second save's places come from the first's
        state["messages"] = [*cp.state["messages"], item]
        cp = _save(store, cp, state)
        assert _newest_ops(store, cp)[0][0] == "x"
    state = cp.state
    state["messages"][-2]["usage"]["in"] = 7.0  # appended two saves ago
    state["messages"][0]["usage"]["out"] = False  # was 0
    state["messages"][0]["usage"]["in"] = -0.0  # was 0
    state["messages"].append({"i": -3})
    cp = _save(store, cp, state)
    loaded = _loaded(store, cp.run_id)
    assert type(loaded["messages"][-3]["usage"]["in"]) is float
    assert loaded["messages"][0]["usage"]["out"] is False
    assert str(loaded["messages"][0]["usage"]["in"]) == "-0.0"
    assert dump_json(loaded) == dump_json(state)


class _EqualToAnything:
    """Not JSON, and equal to everything: ``==`` alone would take it for the stored value."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


@pytest.mark.parametrize("where", ["a number", "a dict holding numbers"])
def test_a_non_json_value_equal_to_the_stored_one_is_refused_not_skipped(where: str) -> None:
    """Set in place where a number (or a dict of them) was, an object that says it is
    equal to anything is still a change: the save refuses it as any non-JSON value."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    if where == "a number":
        state["meta"]["a"] = _EqualToAnything()  # was 1
    else:
        state["messages"][2] = _EqualToAnything()  # was {"i": 2, "text": ...}
    with pytest.raises(InvalidState):
        _save(store, cp, state)
    assert _loaded(store, cp.run_id) == _long()


def test_an_equal_number_set_again_in_place_is_no_change() -> None:
    """A number replaced in place by an equal one of the same type (a new object) is not
    a change: only the append is logged."""
    store = _store()
    base = _long()
    base["messages"][1]["big"] = 10**20
    cp = _first(store, base)
    state = cp.state
    state["messages"][1]["big"] = int("1" + "0" * 20)  # equal, not the same object
    state["messages"].append({"i": -8})
    cp = _save(store, cp, state)
    assert _newest_ops(store, cp) == [["x", ["messages"], [{"i": -8}]]]


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_run_that_flips_a_flag_in_place_stores_it(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The user's view: a run with a long state whose last step turns ``cfg.flag`` from 1
    to True in place returns True, and the store, reopened from its config, holds True."""
    config = fresh_config(kind, request, tmp_path)

    def grow(state: State) -> State:
        return {"big": "x" * (sl.INLINE_MAX * 4), "cfg": {"flag": 1}}

    def flip(state: State) -> State:
        state["cfg"]["flag"] = True
        return state

    with open_store(config) as store:
        final = stepstone.run("flag", [Step("grow", grow), Step("flip", flip)], store)
    assert final["cfg"]["flag"] is True
    with open_store(config) as store:
        cp = store.load("flag")
    assert cp is not None and cp.status == "done"
    assert cp.state["cfg"]["flag"] is True, f"stored as {cp.state['cfg']['flag']!r}"


def test_keys_swapped_with_equal_values_of_other_types_in_place_are_stored() -> None:
    """Two keys re-inserted in another order with each other's (equal) values: still seen."""
    store = _store()
    base = _long()
    base["meta"] = {"a": 1, "b": True}
    cp = _first(store, base)
    state = cp.state
    meta = state["meta"]
    del meta["a"]
    meta["a"] = True
    meta["b"] = 1  # now {"b": 1, "a": True}: == the stored {"a": 1, "b": True}
    cp = _save(store, cp, state)
    loaded = _loaded(store, cp.run_id)
    assert loaded["meta"]["a"] is True
    assert type(loaded["meta"]["b"]) is int


def test_an_unchanged_state_writes_no_piece() -> None:
    """A save that changes nothing keeps naming the same pieces."""
    store = _store()
    cp = _first(store, _long())
    before = store.piece_keys(cp.run_id)
    cp = _save(store, cp, cp.state)
    assert store.piece_keys(cp.run_id) == before
    assert _loaded(store, cp.run_id) == _long()


def test_mutating_the_handed_state_after_the_save_changes_nothing_stored() -> None:
    """A step that changes the state it was handed after the save does not change the store."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["messages"].append({"i": "after"})
    cp = _save(store, cp, state)
    expected = _loaded(store, cp.run_id)
    cp.state["messages"].append({"i": "later"})
    cp.state["messages"][0]["text"] = "rewritten"
    cp.state["meta"]["a"] = 99
    state["messages"].clear()
    assert _loaded(store, cp.run_id) == expected
    # And the next save sees those late changes as changes.
    again = _save(store, cp, cp.state)
    assert _loaded(store, again.run_id) == cp.state


def test_the_saved_state_shares_no_container_with_the_private_copy() -> None:
    """No list or dict of the returned state is one of the handle's private copy."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["messages"].append({"i": 0})
    cp = _save(store, cp, state)
    handle = cp.stored_state
    assert isinstance(handle, Stored) and handle.private is not None

    def containers(value: Any, out: set[int]) -> set[int]:
        if isinstance(value, dict):
            out.add(id(value))
            for item in value.values():
                containers(item, out)
        elif isinstance(value, list):
            out.add(id(value))
            for item in value:
                containers(item, out)
        return out

    assert not containers(cp.state, set()) & containers(handle.private, set())
    loaded = store.load(cp.run_id)
    assert loaded is not None and isinstance(loaded.stored_state, Stored)
    assert loaded.stored_state.private is not None
    assert not containers(loaded.state, set()) & containers(loaded.stored_state.private, set())


# -- refusals ------------------------------------------------------------------------------


def _refusal(state: State) -> str:
    with pytest.raises(InvalidState) as caught:
        MemoryStore().save(Checkpoint("whole", state=state))
    return str(caught.value)


@pytest.mark.parametrize(
    "bad",
    [
        {1, 2},
        float("nan"),
        (1, 2),
        {1: "int key"},
        "\ud800",
        object(),
    ],
    ids=["set", "nan", "tuple", "int-key", "surrogate", "object"],
)
def test_a_non_json_value_in_a_delta_is_refused_as_a_whole_save_would(bad: Any) -> None:
    """A bad value added to a long state is refused with the whole save's message and path."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["meta"]["b"]["bad"] = bad
    with pytest.raises(InvalidState) as caught:
        _save(store, cp, state)
    whole = dict(_long())
    whole["meta"] = {"a": 1, "b": {"c": [1, 2], "bad": bad}}
    assert str(caught.value) == _refusal(whole)
    assert _loaded(store, cp.run_id) == _long()


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("extra", [-2, -1, 0, 1, 2])
def test_the_depth_limit_is_as_strict_in_a_delta_as_in_a_whole_save(extra: int) -> None:
    """Deep nesting added to a long state is accepted or refused exactly as saved whole."""
    levels = MAX_DEPTH - 3 + extra  # under meta.b: the value's own levels start at 4
    whole = _long()
    whole["meta"]["b"]["deep"] = _nested(levels)
    try:
        MemoryStore().save(Checkpoint("whole", state=whole))
        refused_whole: str | None = None
    except InvalidState as exc:
        refused_whole = str(exc)
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["meta"]["b"]["deep"] = _nested(levels)
    try:
        cp = _save(store, cp, state)
        refused_delta: str | None = None
    except InvalidState as exc:
        refused_delta = str(exc)
    assert refused_delta == refused_whole, (levels, refused_whole, refused_delta)
    if refused_delta is None:
        assert _loaded(store, cp.run_id) == whole


def test_the_depth_boundary_is_exercised_on_both_sides() -> None:
    """Of the depths tried above, at least one is accepted and one refused (the test can fail)."""
    outcomes = set()
    for extra in (-2, -1, 0, 1, 2):
        whole = _long()
        whole["meta"]["b"]["deep"] = _nested(MAX_DEPTH - 3 + extra)
        try:
            MemoryStore().save(Checkpoint("whole", state=whole))
            outcomes.add("accepted")
        except InvalidState:
            outcomes.add("refused")
    assert outcomes == {"accepted", "refused"}


# -- bases and logs ------------------------------------------------------------------------


def test_a_new_base_when_the_log_exceeds_log_factor_times_the_base() -> None:
    """Appending until the log outgrows LOG_FACTOR x base writes a new base, collecting the old."""
    store = _store()
    cp = _first(store, _long())
    first_base = _ref(cp)["base"]
    base_bytes = _ref(cp)["base_bytes"]
    chunk = "z" * 4000
    rebased_at = None
    for n in range(200):
        state = cp.state
        state["messages"].append({"n": n, "text": chunk})
        cp = _save(store, cp, state)
        ref = _ref(cp)
        if ref["base"] != first_base:
            rebased_at = n
            break
        assert ref["log_bytes"] <= sl.LOG_FACTOR * max(base_bytes, sl.INLINE_MAX)
    assert rebased_at is not None
    assert _ref(cp)["log"] == [] and _ref(cp)["log_count"] == 0
    # Just past the limit: the rebasing save is the first whose log would exceed it.
    assert rebased_at * 4000 > (sl.LOG_FACTOR - 1) * base_bytes
    assert not set(first_base) & set(store.piece_keys(cp.run_id))
    assert _loaded(store, cp.run_id) == cp.state


def test_a_new_base_after_log_max_pieces() -> None:
    """Tiny changes: the log holds at most LOG_MAX pieces, then a new base is written."""
    store = _store()
    big = _long()
    big["pad"] = "p" * (sl.LOG_MAX * 200)  # a base large enough that bytes never decide
    cp = _first(store, big)
    counts = []
    for n in range(sl.LOG_MAX + 2):
        state = cp.state
        state["counter"] = n
        cp = _save(store, cp, state)
        counts.append(_ref(cp)["log_count"])
    assert max(counts) == sl.LOG_MAX
    assert counts[sl.LOG_MAX] == 0  # the (LOG_MAX + 1)th change: a new base
    assert _loaded(store, cp.run_id)["counter"] == sl.LOG_MAX + 1
    assert len(store.piece_keys(cp.run_id)) <= sl.LOG_MAX + 2


def test_a_large_base_keeps_a_log_as_long_as_its_share_before_a_new_base() -> None:
    """A base over LOG_MAX * LOG_SHARE bytes: up to one log piece per LOG_SHARE bytes.

    With the count fixed at LOG_MAX, a long run rewrote its whole state every 256 saves,
    which grew with the run (issue 36). Tiny changes here, so bytes never decide.
    """
    store = _store()
    big = _long()
    big["pad"] = "p" * (sl.LOG_MAX * sl.LOG_SHARE + 100 * sl.LOG_SHARE)
    cp = _first(store, big)
    limit = sl.log_limit(_ref(cp)["base_bytes"])
    assert limit > sl.LOG_MAX  # the case under test: more than the fixed count
    first_base = _ref(cp)["base"]
    counts = []
    for n in range(limit + 2):
        state = cp.state
        state["counter"] = n
        cp = _save(store, cp, state)
        counts.append(_ref(cp)["log_count"])
    assert max(counts) == limit
    assert counts[limit - 1] == limit and _ref(cp)["base"] != first_base
    assert counts[limit] == 0  # the (limit + 1)th change: a new base
    assert _loaded(store, cp.run_id) == cp.state


@pytest.mark.parametrize(
    ("base_bytes", "limit"),
    [
        (0, sl.LOG_MAX),
        (sl.LOG_MAX * sl.LOG_SHARE, sl.LOG_MAX),
        (sl.LOG_MAX * sl.LOG_SHARE + sl.LOG_SHARE, sl.LOG_MAX + 1),
        (64 << 20, sl.LOG_CEILING),
    ],
)
def test_the_log_limit_scales_with_the_base_between_its_floor_and_ceiling(
    base_bytes: int, limit: int
) -> None:
    assert sl.log_limit(base_bytes) == limit


def test_a_run_loads_what_run_returned() -> None:
    """stepstone.run with a growing state: the loaded state equals run()'s result."""
    store = open_store(f"memory://statelog-{uuid.uuid4().hex}")

    def grow(state: State) -> State:
        items = state.get("items", [])
        items.append({"n": len(items), "text": "q" * 2000})
        return {**state, "items": items}

    steps = [Step(f"s{i}", grow) for i in range(40)]
    final = stepstone.run("grow", steps, store)
    cp = store.load("grow")
    assert cp is not None and cp.state == final
    assert len(final["items"]) == 40
    # Collection works: only the pieces the document names are kept, and they hold at
    # most about LOG_FACTOR + 1 times the state (never the run's history).
    ref = _ref(cp)
    assert store.piece_keys("grow") == sorted(sl.pieces_of(ref))
    held = sum(map(len, store.pieces("grow", store.piece_keys("grow")).values()))
    assert held <= (sl.LOG_FACTOR + 1) * len(dump_json(final)) + sl.INLINE_MAX


# -- migration, corruption, missing pieces -------------------------------------------------


def test_a_checkpoint_from_another_store_is_written_whole() -> None:
    """A checkpoint loaded from store A and saved to store B carries no delta to B."""
    a, b = _store(), _store()
    cp = _first(a, _long())
    state = cp.state
    state["messages"].append({"i": "a"})
    cp = _save(a, cp, state)
    loaded = a.load(cp.run_id)
    assert loaded is not None
    moved = b.save(replace(loaded, version=None))
    ref = _ref(moved)
    assert ref["log"] == []
    assert b.piece_keys(cp.run_id) == sorted(ref["base"])
    assert _loaded(b, cp.run_id) == loaded.state


def _tamper(store: MemoryStore, run_id: str, key: str, data: bytes) -> None:
    piece = store._pieces[run_id][key]  # the test plays a damaged disk
    store._pieces[run_id][key] = sl.Piece(key, piece.gen, data)


@pytest.mark.parametrize("damage", ["truncated", "not-json", "log-not-json"])
def test_a_tampered_piece_gives_corrupt_checkpoint_naming_the_run(damage: str) -> None:
    """A truncated or invalid piece is CorruptCheckpoint, naming the run, never a wrong state."""
    store = _store()
    cp = _first(store, _long())
    state = cp.state
    state["messages"].append({"i": "x"})
    cp = _save(store, cp, state)
    ref = _ref(cp)
    if damage == "truncated":
        key = ref["base"][0]
        data = store.pieces(cp.run_id, [key])[key][:-5]
    elif damage == "not-json":
        key = ref["base"][0]
        data = b"{" + store.pieces(cp.run_id, [key])[key][1:-1] + b"x"
    else:
        key = sl.pieces_of(ref)[-1]
        data = b'[["x", oops'
    _tamper(store, cp.run_id, key, data)
    with pytest.raises(CorruptCheckpoint) as caught:
        store.load(cp.run_id)
    assert repr(cp.run_id) in str(caught.value) or cp.run_id in str(caught.value)


def test_assemble_raises_pieces_missing_and_missing_error_names_the_key() -> None:
    """A document naming a collected piece: PiecesMissing, then CorruptCheckpoint with its key."""
    store = _store()
    cp = _first(store, _long())
    ref = _ref(cp)
    keys = sl.pieces_of(ref)
    held = store.pieces(cp.run_id, keys)
    del held[keys[0]]
    with pytest.raises(sl.PiecesMissing) as caught:
        sl.assemble(store, cp.run_id, cp.version, ref, held, f"memory run {cp.run_id!r}")
    assert caught.value.keys == [keys[0]]
    error = sl.missing_error(f"memory run {cp.run_id!r}", caught.value)
    assert isinstance(error, CorruptCheckpoint)
    assert keys[0] in str(error) and cp.run_id in str(error)


def test_gen_of_and_pieces_of_agree_with_the_keys_written() -> None:
    """Every piece key starts with its generation (a log piece: its base's), and the ref
    names them in order; one writer's log on one base is one run, however long."""
    store = _store()
    cp = _first(store, _long())
    base_gen = ref_gen = _ref(cp)["gen"]
    for i in range(5):
        state = cp.state
        state["messages"].append({"i": i})
        cp = _save(store, cp, state)
        ref_gen += 1
    ref = _ref(cp)
    keys = sl.pieces_of(ref)
    assert sorted(keys) == store.piece_keys(cp.run_id)
    assert {sl.gen_of(k) for k in keys} == {base_gen}
    assert ref["gen"] == ref_gen
    assert len(ref["log"]) == 1 and ref["log"][0][1:] == [0, 5], ref["log"]


@pytest.mark.parametrize("kind", ["memory", "sqlite", "file"])
def test_two_saves_racing_from_one_handle_write_different_keys(kind: str, tmp_path: Any) -> None:
    """Two saves of one checkpoint (one wins, one conflicts) never share a piece key, and
    the winner's next save still names only pieces that are stored.

    (A store writes the pieces before its compare-and-swap and drops a loser's: with one
    key for both, the loser would overwrite or drop the winner's piece.)
    """
    config = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path}/r.db"}.get(
        kind, f"file://{tmp_path}/runs"
    )
    store = open_store(config)
    cp = store.save(Checkpoint("r", state=_long()))
    one = replace(
        cp,
        step=cp.step + 1,
        step_names=(*cp.step_names, "a"),
        state={**cp.state, "messages": [*cp.state["messages"], {"a": 1}]},
    )
    two = replace(one, state={**cp.state, "messages": [*cp.state["messages"], {"b": 2}]})
    won = store.save(one)
    with pytest.raises(ConflictError):
        store.save(two)
    third = replace(
        won,
        step=won.step + 1,
        step_names=(*won.step_names, "c"),
        state={**won.state, "messages": [*won.state["messages"], {"c": 3}]},
    )
    saved = store.save(third)
    keys = sl.pieces_of(_ref(saved))
    assert len(set(keys)) == len(keys)
    assert set(keys) <= set(store.piece_keys(cp.run_id))
    loaded = store.load(cp.run_id)
    assert loaded is not None and loaded.state == saved.state
    assert loaded.state["messages"][-2:] == [{"a": 1}, {"c": 3}]
    store.close()


def test_a_failed_step_that_dirtied_its_long_state_stores_the_state_before_it() -> None:
    """A step that changes its handed long state in place, then fails: the old state is kept."""
    store = open_store(f"memory://statelog-{uuid.uuid4().hex}")

    def first(state: State) -> State:
        return {"transcript": ["x" * (2 * sl.INLINE_MAX)], "a": 1}

    def dirty(state: State) -> State:
        state["junk"] = 1
        state["a"] = "dirty"
        state["transcript"].append("half")
        raise RuntimeError("boom")

    with pytest.raises(stepstone.StepFailed):
        stepstone.run("dirty", [Step("first", first), Step("dirty", dirty)], store)
    cp = store.load("dirty")
    assert cp is not None and cp.step == 0
    assert cp.state == {"transcript": ["x" * (2 * sl.INLINE_MAX)], "a": 1}


@pytest.mark.process
def test_a_copied_or_forked_handle_starts_a_chain_of_its_own() -> None:
    """A handle copied (deepcopy, pickle) or inherited by a forked child never hands out
    the log numbers its original will: their pieces would share keys."""
    import copy
    import os
    import pickle

    store = _store()
    cp = _first(store, _long())
    cp = _save(store, cp, {**cp.state, "messages": [*cp.state["messages"], {"a": 1}]})
    step = {**cp.state, "messages": [*cp.state["messages"], {"b": 2}]}

    def next_key(checkpoint: Checkpoint) -> str:
        prepared = sl.prepare_save(store, replace(checkpoint, state=step, step=cp.step + 1))
        assert len(prepared.pieces) == 1, "not a log save"
        return prepared.pieces[0].key

    keys = {next_key(cp)}
    for twin in (copy.deepcopy(cp), pickle.loads(pickle.dumps(cp))):
        key = next_key(twin)
        assert key not in keys
        keys.add(key)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one key, through the pipe, then out at once
        try:
            os.write(write, next_key(cp).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    assert child and child not in keys | {next_key(cp)}


@pytest.mark.parametrize("json_path", ["orjson", "stdlib"])
@pytest.mark.parametrize("size", ["inline", "pieces"])
def test_a_whole_save_writes_the_same_utf8_json_on_both_paths(
    json_path: str, size: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """orjson's bytes go to the pieces as written and the standard library's text is
    encoded: either way the stored JSON is the state's, non-ASCII text included, and an
    inline state's text is a ``str`` (issue 36: the pieces path no longer decodes)."""
    from stepstone import _statejson

    if json_path == "orjson":
        if _statejson._load_orjson() is None:
            pytest.skip("orjson is not installed")
    else:
        monkeypatch.setattr(_statejson, "_orjson", None)
    state = _long() if size == "pieces" else {"note": "small"}
    state["text"] = "caf\u00e9 \u2603 \U0001f600 <b>&amp;</b>"
    store = _store()
    prepared = sl.prepare_save(store, Checkpoint("r-utf8", state=state), piece_max=4096)
    expected = dump_json(state)
    if size == "inline":
        assert prepared.pieces == []
        assert type(prepared.state_text) is str and prepared.state_text == expected
    else:
        assert prepared.state_text is None and len(prepared.pieces) > 1
        data = b"".join(piece.data for piece in prepared.pieces)
        assert all(type(piece.data) is bytes for piece in prepared.pieces)
        assert data == expected.encode("utf-8")
    saved = store.save(Checkpoint("r-utf8", state=state))
    assert _loaded(store, saved.run_id) == state
