"""The tests' ``parse`` survives a finalizer that parses (CPython 3.11's gh-106905)."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

import stepstone.adapters.langgraph._rules as rules
from parsing import parse


class _ParsesWhenCollected:
    """A cycle whose finalizer parses, as a 3.11 traceback does when an orphaned task logs."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        ast.parse("x = (1 + (2 * [3, {4: 5}]))")


def test_parse_is_not_broken_by_a_finalizer_that_parses_during_it() -> None:
    """With plain ``ast.parse`` on 3.11, about two in three of such rounds raise
    ``SystemError: AST constructor recursion depth mismatch``."""
    source = Path(rules.__file__).read_text(encoding="utf-8")
    old = gc.get_threshold()
    gc.set_threshold(50)  # collect often, so a collection lands inside the parse
    try:
        for _ in range(10):
            for _ in range(200):
                _ParsesWhenCollected()
            assert isinstance(parse(source, rules.__file__), ast.Module)
    finally:
        gc.set_threshold(*old)
        gc.collect()
