"""``find_non_json``: its quick yes (no paths built) agrees with the walk that names the path,
and ``is_json`` (orjson's round trip, the walk where orjson declines) agrees with both."""

from __future__ import annotations

import dataclasses
import enum
import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from stepstone import _statejson
from stepstone._checkpoint import _find_non_json, _plain_json, find_non_json
from stepstone._statejson import is_json

GOOD: list[object] = [
    {},
    {"a": 1, "b": [1, 2.5, None, True, "x"], "c": {"d": {"e": []}}},
    ["é", {"k": -0.0}, [[[]]]],
    "plain",
    1 << 80,
]
BAD: list[tuple[object, str]] = [
    ({"a": [1, math.nan]}, "state['a'][1]"),
    ({"a": {"b": math.inf}}, "state['a']['b']"),
    ({"a": (1, 2)}, "state['a']"),
    ({"a": {1, 2}}, "state['a']"),
    ({"a": {3: "x"}}, "state['a'][3]"),
    ({"a": ["ok", "\ud800"]}, "state['a'][1]"),
    ({"ok": 1, "\udfff": 1}, "state['\\udfff']"),
    ([{"t": object()}], "state[0]['t']"),
]


@pytest.mark.parametrize("value", GOOD)
def test_plain_json_is_found_clean_by_both(value: object) -> None:
    assert _plain_json(value)
    assert _find_non_json(value, "state") is None
    assert find_non_json(value) is None


@pytest.mark.parametrize(("value", "path"), BAD)
def test_a_value_that_is_not_json_is_named_by_its_path(value: object, path: str) -> None:
    assert not _plain_json(value)
    found = find_non_json(value)
    assert found is not None and found[0] == path, found
    assert found == _find_non_json(value, "state")


class _Color(enum.Enum):
    RED = 1


class _Level(enum.IntEnum):
    HIGH = 3


class _Name(str):
    """A str subclass: JSON by the walk's rules (it reads back a plain str)."""


class _Liar:
    """Says it equals anything (the kind of value a round trip alone would let through)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


@dataclasses.dataclass(eq=False)
class _LyingRecord:
    n: int

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


#: Values orjson encodes differently, declines, or cannot encode; each must get the
#: walk's answer from ``is_json``.
EDGES: list[object] = [
    {"counters": {"messages": (2, 3)}},  # what LangGraph's DeltaChannel metadata holds
    {"when": datetime(2026, 1, 1, tzinfo=UTC)},
    {"id": uuid.UUID(int=7)},
    {"color": _Color.RED},
    {"level": _Level.HIGH},
    {"name": _Name("x")},
    {_Name("key"): 1},
    {"liar": _Liar()},
    {"record": _LyingRecord(1)},
    {"big": 1 << 70, "small": -(1 << 63)},
    {"deep": _nested(300)},
    {"f": 1e308, "g": -0.0, "h": 5e-324},
    {"nan": math.nan},
    {"surrogate": "\udc80"},
    {1: "int key"},
    {"set": {1}},
    {"bytes": b"x"},
]


@pytest.mark.parametrize("value", GOOD + [bad for bad, _ in BAD] + EDGES)
def test_is_json_answers_what_the_walk_answers(value: object) -> None:
    assert is_json(value) is _plain_json(value) is (find_non_json(value) is None)


@pytest.mark.parametrize("value", GOOD + [bad for bad, _ in BAD] + EDGES)
def test_is_json_without_orjson_answers_the_same(
    value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_statejson, "_orjson", None)
    assert is_json(value) is (find_non_json(value) is None)


def test_the_edges_hold_both_answers() -> None:
    """The edge cases are not all of one kind: a test of agreement could otherwise pass on
    a function that always says yes, or always no."""
    answers = [is_json(value) for value in EDGES]
    assert True in answers and False in answers
