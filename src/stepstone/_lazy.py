"""Public names a package imports on first use (PEP 562), from a table of their modules.

A package (``stepstone``, ``stepstone._stream``) keeps each name's module in a table
and imports it the first time the name is looked up, so that importing the package
costs only what is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(
    package: str, table: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], object]:
    """Return the module ``__getattr__`` of ``package`` for the names in ``table``.

    ``table`` maps each name to the module (relative to ``package``) that defines it;
    the value found is kept in ``namespace`` (the package's globals), so that later
    lookups are plain attribute reads.
    """

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
