"""The nesting limit, at its boundary, everywhere a JSON value is taken in.

The rule (``stepstone._codec.MAX_DEPTH``, 200): a state is level 1, each value inside a
dict or list one level below its container, and a value of any kind at a level past 200
is refused with ``InvalidState`` whose path is ``state``; a state whose text holds at
most 200 ``[`` and ``{`` passes (kept from the bracket count the check used to start
with). Every test builds a value exactly at the limit (accepted) and one level deeper
(refused), with lists, dicts and both mixed, with an empty container or a scalar at the
bottom, through the orjson and the standard-library paths and through each place that
checks: a store's save, a step's output, a run's input, ``start``, a signal's payload
and a ``WaitFor`` default. ``PAD`` (201 brackets, two levels) keeps the exception out of
the way where a test is about the rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    Checkpoint,
    InvalidState,
    InvalidWorkflow,
    Step,
    StepFailed,
    Store,
    Suspended,
    WaitFor,
    Workflow,
    _codec,
    _statejson,
    open_store,
    run,
    signal,
    start,
)
from stepstone._codec import MAX_DEPTH

REFUSAL = (
    f"state: nested more than {MAX_DEPTH} levels deep; a state that deep could not be "
    "loaded from every call stack. Flatten it (keep deep data as a JSON string, say)"
)
SHAPES = ("lists", "dicts", "mixed")
LEAVES = ("empty", "scalar")
#: Shallow and wide: 201 ``[`` in the text, so the rule, not the exception, decides.
PAD: list[Any] = [[] for _ in range(MAX_DEPTH)]


def nest(shape: str, containers: int, leaf: str) -> Any:
    """Return ``containers`` nested containers of ``shape``, holding ``leaf`` at the bottom.

    The value itself is the outermost container; ``leaf`` ``"scalar"`` puts the int 7
    (or ``{"k": 7}``'s 7, for a dict) inside the innermost, one level further down.
    """
    value: Any = None
    for i in range(containers):
        as_dict = shape == "dicts" or (shape == "mixed" and i % 2 == 1)
        if value is None:
            inner: Any = [] if leaf == "empty" else [7]
            if as_dict:
                inner = {} if leaf == "empty" else {"k": 7}
            value = inner
        else:
            value = {"k": value} if as_dict else [value]
    return value


def deepest(value: Any, level: int = 1) -> int:
    """Return the level of the deepest value in ``value`` (itself at ``level``)."""
    children = value.values() if isinstance(value, dict) else value
    if isinstance(value, (dict, list)) and children:
        return max(deepest(child, level + 1) for child in children)
    return level


def at_level(depth: int, shape: str, leaf: str, wrap: int = 1) -> Any:
    """Return a value whose deepest part is at level ``depth`` once it sits ``wrap`` deep.

    ``wrap`` is the level the value itself has where it is used: 2 under a key of a
    state, 1 as a whole state or input.
    """
    containers = depth - wrap + 1 - (1 if leaf == "scalar" else 0)
    value = nest(shape, containers, leaf)
    assert deepest(value, wrap) == depth, (shape, leaf, depth)
    return value


@pytest.fixture(params=["orjson", "stdlib"])
def json_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each of the two encoding paths, which must refuse alike."""
    if request.param == "orjson":
        if _statejson._load_orjson() is None:
            pytest.skip("orjson is not installed")
    else:
        monkeypatch.setattr(_statejson, "_orjson", None)
    return str(request.param)


@pytest.fixture(params=["memory", "sqlite", "file"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each local kind."""
    config = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path}/depth.db",
        "file": f"file://{tmp_path}/runs",
    }[request.param]
    with open_store(config) as opened:
        yield opened


def _refused(info: pytest.ExceptionInfo[InvalidState]) -> None:
    assert info.value.path == "state"
    assert str(info.value) == REFUSAL


# --- encode_state itself ------------------------------------------------------------------


@pytest.mark.parametrize("leaf", LEAVES)
@pytest.mark.parametrize("shape", SHAPES)
def test_state_at_the_limit_passes_and_one_more_is_refused(
    json_path: str, shape: str, leaf: str
) -> None:
    """A state whose deepest value is at level 200 encodes; at level 201 it is refused."""
    fits = {"x": at_level(MAX_DEPTH, shape, leaf, wrap=2), "pad": PAD}
    text, copy = _codec.encode_state(fits)
    assert copy == fits and json.loads(text) == fits
    with pytest.raises(InvalidState) as info:
        _codec.encode_state({"x": at_level(MAX_DEPTH + 1, shape, leaf, wrap=2), "pad": PAD})
    _refused(info)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_lone_deep_chain_is_limited_by_its_containers(json_path: str, shape: str) -> None:
    """Without PAD, 200 containers may hold a scalar at level 201; 201 containers are refused.

    This is the exception kept from the old check: its bracket count (at most 200) let
    the state through before its walk ran. Kept so that no state saved before is
    refused now, nor one refused before saved.
    """
    for leaf in LEAVES:
        assert _codec.encode_state({"x": at_level(MAX_DEPTH, shape, leaf, wrap=2)})
    lone = {"x": at_level(MAX_DEPTH + 1, shape, "scalar", wrap=2)}
    assert _codec.encode_state(lone)[1] == lone
    for state in (
        {"x": at_level(MAX_DEPTH + 1, shape, "empty", wrap=2)},
        {"x": at_level(MAX_DEPTH + 2, shape, "scalar", wrap=2)},
        {**lone, "other": []},
        {**lone, "text": "["},
    ):
        with pytest.raises(InvalidState) as info:
            _codec.encode_state(state)
        _refused(info)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_deepest_branch_decides_wherever_it_is(json_path: str, shape: str) -> None:
    """Among many shallow branches, one branch one level too deep is refused, first or last."""
    shallow = [{"a": [1, 2], "b": {"c": "d"}} for _ in range(300)]
    too_deep = at_level(MAX_DEPTH + 1, shape, "scalar", wrap=3)
    for position in (0, len(shallow)):
        items = [*shallow]
        items.insert(position, too_deep)
        with pytest.raises(InvalidState) as info:
            _codec.encode_state({"items": items})
        _refused(info)
    items = [*shallow, at_level(MAX_DEPTH, shape, "scalar", wrap=3)]
    assert _codec.encode_state({"items": items})[1] == {"items": items}


def test_brackets_inside_strings_are_not_nesting(json_path: str) -> None:
    """A state full of ``[`` and ``{`` characters in strings and keys, but shallow, passes."""
    state = {"text": "[{" * 10_000, "keys": {"[" * 300: "{" * 300}, "n": [[["[]"]]], "pad": PAD}
    assert _codec.encode_state(state)[1] == state


def test_a_wide_state_of_many_containers_passes(json_path: str) -> None:
    """Thousands of containers side by side are not depth: a wide, shallow state passes."""
    wide = {"records": [{"id": i, "tags": ["a", {"b": [i]}]} for i in range(5_000)]}
    assert _codec.encode_state(wide)[1] == wide


# --- every place that takes a value in ----------------------------------------------------


def _state(depth: int, shape: str, leaf: str) -> dict[str, Any]:
    """A state (or input) whose deepest value is at level ``depth``."""
    return {"x": at_level(depth, shape, leaf, wrap=2), "pad": PAD}


def _payload(depth: int, shape: str, leaf: str) -> dict[str, Any]:
    """A payload that, at level 2 of a state, has its deepest value at level ``depth``."""
    return {"v": at_level(depth, shape, leaf, wrap=3), "pad": PAD}


@pytest.mark.parametrize("shape", SHAPES)
def test_store_save_at_the_limit_and_past_it(any_store: Store, shape: str) -> None:
    """A store saves and loads a state at the limit and refuses one level more, storing nothing."""
    for leaf in LEAVES:
        run_id = f"fits-{leaf}"
        fits = _state(MAX_DEPTH, shape, leaf)
        saved = any_store.save(Checkpoint(run_id=run_id, state=fits))
        loaded = any_store.load(run_id)
        assert loaded is not None and loaded.state == fits and loaded.version == saved.version
        too_deep = _state(MAX_DEPTH + 1, shape, leaf)
        with pytest.raises(InvalidState) as info:
            any_store.save(Checkpoint(run_id=f"deep-{leaf}", state=too_deep))
        _refused(info)
        assert any_store.load(f"deep-{leaf}") is None
        with pytest.raises(InvalidState):
            any_store.save(Checkpoint(run_id=run_id, state=too_deep, version=saved.version))
        again = any_store.load(run_id)
        assert again is not None and again.version == saved.version and again.state == fits


@pytest.mark.parametrize("shape", SHAPES)
def test_step_output_at_the_limit_and_past_it(any_store: Store, shape: str) -> None:
    """A step's output may reach level 200; level 201 fails the run, its state at step 0."""
    for leaf in LEAVES:
        fits = _state(MAX_DEPTH, shape, leaf)
        assert run(f"ok-{leaf}", [Step("a", lambda s, fits=fits: fits)], any_store) == fits
        too_deep = _state(MAX_DEPTH + 1, shape, leaf)
        steps = [Step("first", lambda s: {"y": 1}), Step("a", lambda s, d=too_deep: d)]
        with pytest.raises(StepFailed) as failed:
            run(f"deep-{leaf}", steps, any_store)
        cause = failed.value.__cause__
        assert isinstance(cause, InvalidState)
        assert cause.path == "state" and str(cause) == REFUSAL
        cp = any_store.load(f"deep-{leaf}")
        assert cp is not None and cp.step == 0 and cp.state == {"y": 1}
        assert cp.status == "failed"


@pytest.mark.parametrize("shape", SHAPES)
def test_run_input_at_the_limit_and_past_it(any_store: Store, shape: str) -> None:
    """An input is a state: level 200 inside it runs, level 201 is refused before any save."""
    for leaf in LEAVES:
        fits = _state(MAX_DEPTH, shape, leaf)
        assert run(f"ok-{leaf}", [Step("a", lambda s: None)], any_store, input=fits) == fits
        too_deep = _state(MAX_DEPTH + 1, shape, leaf)
        with pytest.raises(InvalidState) as info:
            run(f"deep-{leaf}", [Step("a", lambda s: None)], any_store, input=too_deep)
        _refused(info)
        assert any_store.load(f"deep-{leaf}") is None


@pytest.mark.parametrize("shape", SHAPES)
def test_start_input_at_the_limit_and_past_it(any_store: Store, shape: str) -> None:
    """``start`` queues an input reaching level 200 and refuses level 201, queuing nothing."""
    flow = Workflow("w", [Step("a", lambda s: None)])
    for leaf in LEAVES:
        fits = _state(MAX_DEPTH, shape, leaf)
        start(any_store, flow, f"ok-{leaf}", fits)
        queued = any_store.load(f"ok-{leaf}")
        assert queued is not None and queued.input == fits and queued.state == fits
        with pytest.raises(InvalidState) as info:
            start(any_store, flow, f"deep-{leaf}", _state(MAX_DEPTH + 1, shape, leaf))
        _refused(info)
        assert any_store.load(f"deep-{leaf}") is None


@pytest.mark.parametrize("shape", SHAPES)
def test_signal_payload_at_the_limit_and_past_it(any_store: Store, shape: str) -> None:
    """A payload lands at level 2 (under the WaitFor's name): 200 is delivered, 201 refused."""
    steps = [WaitFor("w", "go")]
    for leaf in LEAVES:
        for run_id in (f"ok-{leaf}", f"deep-{leaf}"):
            with pytest.raises(Suspended):
                run(run_id, steps, any_store)
        with pytest.raises(InvalidState) as info:
            signal(any_store, f"deep-{leaf}", "go", _payload(MAX_DEPTH + 1, shape, leaf))
        _refused(info)
        refused = any_store.load(f"deep-{leaf}")
        assert refused is not None and refused.signals == ()
        fits = _payload(MAX_DEPTH, shape, leaf)
        assert signal(any_store, f"ok-{leaf}", "go", fits)
        assert run(f"ok-{leaf}", steps, any_store) == {"w": fits}


@pytest.mark.parametrize("leaf", LEAVES)
@pytest.mark.parametrize("shape", SHAPES)
def test_wait_for_default_at_the_limit_and_past_it(shape: str, leaf: str) -> None:
    """A ``WaitFor`` default lands where a payload does: level 200 is taken, 201 refused."""
    WaitFor("w", "go", timeout=1, default=_payload(MAX_DEPTH, shape, leaf))
    with pytest.raises(InvalidWorkflow, match="default is not JSON: state: nested more than"):
        WaitFor("w", "go", timeout=1, default=_payload(MAX_DEPTH + 1, shape, leaf))


# --- the copy built by walking a plain state ----------------------------------------------


class _Key(str):
    pass


class _Text(str):
    pass


_SHARED: list[Any] = [1, [2]]
ODD_STATES: list[dict[str, Any]] = [
    {"f": [0.0, -0.0, 5e-324, 1e16, 1.7976931348623157e308, 0.1, 1e-7]},
    {"i": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1], "b": [True, False, None]},
    {"big": 2**64, "neg": -(2**70)},
    {"u": "日本 \u2028 \x00 emoji \U0001f680", "e": "", "k": {"": {"": []}}},
    {"twice": [_SHARED, _SHARED], "again": _SHARED},
    {_Key("k"): 1},
    {"t": _Text("x")},
    {"n": float("nan")},
    {"inf": [1.0, float("inf")]},
    {"tuple": (1, 2)},
    {"nested": {"tuple": [1, (2,)]}},
    {"int key": {1: "a"}},
    {"surrogate": "\ud800"},
    {"set": {1}},
]


def _typed(value: Any) -> Any:
    """``value`` with every key and value paired with its exact type."""
    if isinstance(value, dict):
        return [(type(k), k, _typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [type(value), [_typed(v) for v in value]]
    return (type(value), repr(value))


def _outcome(state: dict[str, Any]) -> tuple[str, Any]:
    try:
        text, copy = _codec.encode_state(state)
    except InvalidState as exc:
        return "refused", (exc.path, str(exc))
    return "accepted", (text, _typed(copy))


@pytest.mark.parametrize("state", ODD_STATES, ids=[str(i) for i in range(len(ODD_STATES))])
def test_walked_copy_is_what_the_round_trip_gives(
    monkeypatch: pytest.MonkeyPatch, state: dict[str, Any]
) -> None:
    """With or without the walked copy, each state gets the same text, copy and refusal."""
    if _statejson._load_orjson() is None:
        pytest.skip("orjson is not installed")
    walked = _outcome(state)

    def never(value: Any, level: int) -> Any:
        raise _statejson._NotPlain

    monkeypatch.setattr(_statejson, "_plain_dict", never)
    assert _outcome(state) == walked


def test_walked_copy_shares_no_container_with_the_state() -> None:
    """Every dict and list of the copy is new: changing one never changes the other."""
    state: dict[str, Any] = {"twice": [_SHARED, _SHARED], "d": {"l": [1, 2]}, "s": "text"}
    _, copy = _codec.encode_state(state)
    assert copy == state
    copy["twice"][0].append(3)
    copy["d"]["l"].append(3)
    assert state == {"twice": [[1, [2]], [1, [2]]], "d": {"l": [1, 2]}, "s": "text"}
    assert copy["twice"][1] == [1, [2]]
    assert copy["s"] is state["s"]  # an immutable str is shared, not copied


def test_a_cyclic_state_is_refused_on_both_paths(json_path: str) -> None:
    """A state that holds itself is refused, not walked for ever."""
    state: dict[str, Any] = {"a": [1]}
    state["a"].append(state)
    with pytest.raises(InvalidState):
        _codec.encode_state(state)
