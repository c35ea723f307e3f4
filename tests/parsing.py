"""``parse``: ``ast.parse`` for the tests, safe from a CPython 3.11 defect.

CPython 3.11 keeps the depth of its AST-to-object conversion in state shared by every
conversion (fixed in 3.12 and 3.13, not 3.11: python/cpython gh-106905). The conversion
allocates, allocation can run the garbage collector, and a finalizer it runs can nest a
second conversion: an asyncio task collected with an unretrieved exception logs it, and a
3.11 traceback parses each source line to draw its ``^^^`` marks. The outer parse then
fails with ``SystemError: AST constructor recursion depth mismatch``. A loaded CI run saw
exactly that (a test's task, collected while the import-cycle test parsed a module).
With the collector off for the parse, no collection (so no finalizer) runs inside it; a
collection later runs as usual.
"""

from __future__ import annotations

import ast
import gc

__all__ = ["parse"]


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)`` with no garbage collection (so no finalizer) inside."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        if enabled:
            gc.enable()
