"""The error each adapter package raises when its framework is not installed."""

from __future__ import annotations

__all__ = ["missing_extra"]


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
