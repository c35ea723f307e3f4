"""``find_non_json``: its quick yes (no paths built) agrees with the walk that names the path."""

from __future__ import annotations

import math

import pytest

from stepstone._checkpoint import _find_non_json, _plain_json, find_non_json

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
