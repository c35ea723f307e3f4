"""How the SQL stores turn driver errors into stepstone's, through the one error table.

Each dialect declares its rows (``_errortable.ErrorRule``); ``store_error`` applies them
with the store's ``where`` and ``table`` and falls back to a plain ``StoreError`` naming
the driver's class. Two errors are the SQL base's own: ``Undecodable`` (a row held text
the driver could not decode; a listing skips that row, ``load`` reports that run's
``CorruptCheckpoint``) and ``invalid_text`` (a state string that is not UTF-8).
"""

from __future__ import annotations

from collections.abc import Callable

from ..._errors import InvalidState, StoreError, safe_text
from .._errortable import ErrorRule, translate

__all__ = ["Undecodable", "invalid_text", "store_error"]


class Undecodable(Exception):
    """A row held text the driver could not decode (hand-edited, not UTF-8)."""


def store_error(
    rules: tuple[ErrorRule, ...],
    exc: BaseException,
    code: int | str | None,
    *,
    where: str,
    table: str,
    scrub: Callable[[str], str] = str,
) -> StoreError:
    """Return the stepstone error for driver error ``exc``: the first matching rule's."""
    error = translate(rules, exc, code, scrub=scrub, where=where, table=table)
    if error is None:
        error = StoreError(f"{where}: {type(exc).__name__}: {scrub(safe_text(exc))}")
    return error


def invalid_text(exc: UnicodeEncodeError) -> InvalidState:
    """The error of a save whose state holds a lone surrogate."""
    return InvalidState(
        f"state: a string holds a lone surrogate ({exc.reason}); a state must be "
        "encodable as UTF-8",
        "state",
    )
