"""``evolve`` is typed with one keyword-only parameter per ``Checkpoint`` field.

The type checker's ``evolve`` is written out by hand in ``_checkpoint`` (under ``if
TYPE_CHECKING:``; at run time ``evolve`` is a generated copy) so that mypy refuses a
misspelt or mistyped field. These tests keep the written signature equal to the
dataclass, so a field added to ``Checkpoint`` without its parameter fails here rather
than going unchecked.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import stepstone._checkpoint
from parsing import parse
from stepstone._checkpoint import Checkpoint, Failure, Signal, Stored, evolve

FIELDS = dataclasses.fields(Checkpoint)


def _written() -> ast.FunctionDef:
    """Return the ``def evolve`` the type checker reads (inside ``if TYPE_CHECKING:``)."""
    source = Path(stepstone._checkpoint.__file__).read_text(encoding="utf-8")
    found = [
        node
        for node in ast.walk(parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "evolve"
    ]
    assert len(found) == 1, "one written-out `def evolve` in _checkpoint.py"
    return found[0]


def test_the_written_signature_names_every_field_in_order() -> None:
    """The checkpoint positional-only, then one keyword-only parameter per field, in order."""
    args = _written().args
    assert [a.arg for a in args.posonlyargs] == ["cp"]
    assert not args.args and args.vararg is None and args.kwarg is None
    assert [a.arg for a in args.kwonlyargs] == [f.name for f in FIELDS]


def test_every_written_parameter_is_optional_and_typed_as_its_field() -> None:
    """Each parameter has a default and the field's own type; the result is a Checkpoint."""
    written = _written()
    types = {f.name: f.type for f in FIELDS}  # source text: ``from __future__ import annotations``
    for arg, default in zip(written.args.kwonlyargs, written.args.kw_defaults, strict=True):
        assert default is not None, arg.arg
        assert arg.annotation is not None, arg.arg
        assert ast.unparse(arg.annotation) == types[arg.arg], arg.arg
    assert written.returns is not None and ast.unparse(written.returns) == "Checkpoint"


def test_the_generated_evolve_takes_the_same_parameters() -> None:
    """The function that runs has the checkpoint, then every field as a keyword-only one."""
    params = list(inspect.signature(evolve).parameters.values())
    assert [p.kind for p in params[1:]] == [inspect.Parameter.KEYWORD_ONLY] * len(FIELDS)
    assert [p.name for p in params[1:]] == [f.name for f in FIELDS]


def test_evolve_changes_only_what_it_is_given() -> None:
    """``evolve`` matches ``dataclasses.replace`` for every field, one at a time."""
    at = datetime(2030, 1, 2, tzinfo=UTC)
    cp = Checkpoint(run_id="r", step=1, state={"a": 1}, step_names=("x", "y"), owner="o")
    samples: dict[str, Any] = {
        "run_id": "other",
        "step": 5,
        "state": {"b": 2},
        "version": "v9",
        "step_names": ("p",),
        "total_steps": 9,
        "attempt": 3,
        "failure": Failure(0, "x", "E", "m", 1, at),
        "created_at": at,
        "updated_at": at,
        "state_json": '{"b":2}',
        "input": {"i": 1},
        "workflow": "wf",
        "workflow_version": "2",
        "queued": True,
        "cancelled": True,
        "cancel_requested": True,
        "owner": None,
        "epoch": 4,
        "lease": 12.5,
        "renewed_at": at,
        "waiting_for": "timer",
        "wake_at": at,
        "signals": (Signal("s", "id", None, at),),
        "consumed": {"s": 1},
        "parent": "p",
        "children": ("c",),
        "history": True,
        "streams": {"0": "token"},
        "timing": {"deadline": 60.0},
        "flow": {"keys": ["k"], "limits": {}, "priority": 1},  # flow control (issue 37)
        "stored_state": Stored(1, "r", "v9", 3, None, None, None, None),
    }
    assert set(samples) == {f.name for f in FIELDS}
    for name, value in samples.items():
        changed = evolve(cp, **{name: value})
        expected = dataclasses.replace(cp, **{name: value})
        assert type(changed) is Checkpoint
        for field in FIELDS:
            assert getattr(changed, field.name) == getattr(expected, field.name), name
    assert evolve(cp) == cp
    assert evolve(cp) is not cp


def test_an_unknown_field_is_refused_at_run_time_too() -> None:
    """What mypy refuses statically (``cancelld``) also fails when called."""
    with pytest.raises(TypeError):
        evolve(Checkpoint(run_id="r"), cancelld=True)  # type: ignore[call-arg]
