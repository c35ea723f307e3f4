"""The classes built on a twin (``_frozen``) behave as their frozen dataclasses would.

``Checkpoint``, ``Stored``, ``Piece`` and ``Prepared`` get a generated ``__init__`` that
sets their slots on a twin class (no ``object.__setattr__`` per field): the objects must
still be frozen, of the right class, equal to what the fields say, and take the same
arguments, defaults and default factories as the dataclass ``__init__``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from stepstone._checkpoint import Checkpoint, Stored
from stepstone._statepieces import Piece, Prepared


def _prepared() -> Prepared:
    return Prepared("{}", None, [], None, {}, 0, None, 1, "r", inc="i")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Checkpoint("r"),
        lambda: Stored(1, "r", "v", 2, None, None, None),
        lambda: Piece("k", 1, b"data"),
        _prepared,
    ],
    ids=["Checkpoint", "Stored", "Piece", "Prepared"],
)
def test_a_twin_built_object_is_frozen_and_of_its_class(make: Any) -> None:
    obj = make()
    cls = type(obj)
    assert cls in (Checkpoint, Stored, Piece, Prepared)
    field = dataclasses.fields(obj)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, field, getattr(obj, field))


def test_prepared_takes_the_dataclass_arguments_and_defaults() -> None:
    prepared = _prepared()
    assert (prepared.state_text, prepared.gen, prepared.run_id, prepared.inc) == ("{}", 0, "r", "i")
    assert (prepared.changes, prepared.history, prepared.chain) == (None, None, None)
    # ``replace`` (used for a history record) builds through the same ``__init__``.
    again = dataclasses.replace(prepared, gen=3)
    assert type(again) is Prepared
    assert again.gen == 3
    assert again == dataclasses.replace(prepared, gen=3) != prepared
    params = inspect.signature(Prepared).parameters
    assert list(params) == [f.name for f in dataclasses.fields(Prepared)]
    with pytest.raises(TypeError):
        Prepared("{}")  # type: ignore[call-arg]
