"""The error each adapter package raises when its framework is not installed."""

from __future__ import annotations

import importlib

__all__ = ["missing_extra", "require"]


def require(
    adapter: str, framework: str, extra: str, *modules: str, name_missing: bool = False
) -> None:
    """Import ``modules`` (``framework``'s), or raise ``missing_extra``'s ImportError.

    Each adapter package calls it first, so it fails at its own import, naming the extra,
    rather than deeper with a bare ModuleNotFoundError.
    """
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError as exc:
        raise missing_extra(exc, adapter, framework, extra, name_missing=name_missing) from exc


def missing_extra(
    exc: ImportError, adapter: str, framework: str, extra: str, *, name_missing: bool = False
) -> ImportError:
    """Return the ImportError for ``stepstone.adapters.<adapter>`` when importing
    ``framework`` failed with ``exc``: it names the extra to install (and, with
    ``name_missing``, the module missing, for an adapter that needs several)."""
    missing = f" ({exc.name} is missing)" if name_missing else ""
    return ImportError(
        f"stepstone.adapters.{adapter} needs {framework}{missing}: pip install 'stepstone[{extra}]'"
    )
