"""One error-table mechanism for every backend: driver exceptions in, stepstone's out.

Each backend declares a tuple of :class:`ErrorRule` rows, first match wins, and calls
:func:`translate` (or wraps its calls in :func:`map_exceptions`) in one place. A row
matches an exception by its Python types, a driver code (SQLSTATE, MySQL error number,
SQLite result code, HTTP status), a code prefix, a class name (for drivers imported
lazily, whose classes cannot be named at import time) or a lower-case substring of its
text. The message template is formatted with the fields the backend passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from .._errors import StoreError, safe_text

__all__ = ["ErrorRule", "map_exceptions", "translate"]


@dataclass(frozen=True, slots=True)
class ErrorRule:
    """One row of a backend's error table: which driver errors become which of ours.

    A rule matches when any of its criteria does. ``message`` is a ``str.format``
    template over the fields given to :func:`translate` plus ``text`` (the driver's
    message, whitespace-collapsed and scrubbed) and ``kind`` (its class name).
    """

    error: type[StoreError]
    message: str
    codes: frozenset[int | str] = frozenset()
    prefixes: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    text: tuple[str, ...] = ()
    types: tuple[type[BaseException], ...] = ()

    def matches(
        self, exc: BaseException, code: int | str | None, names: set[str], lowered: str
    ) -> bool:
        """Return whether ``exc`` (with this code, class names and text) matches."""
        if self.types and isinstance(exc, self.types):
            return True
        if code is not None and code in self.codes:
            return True
        if isinstance(code, str) and code and self.prefixes and code.startswith(self.prefixes):
            return True
        if names.intersection(self.classes):
            return True
        return any(t in lowered for t in self.text)


def _collapsed(exc: BaseException) -> str:
    """The driver's message on one line; safe when its ``__str__`` raises."""
    return " ".join(safe_text(exc).split())


def translate(
    rules: tuple[ErrorRule, ...],
    exc: BaseException,
    code: int | str | None = None,
    *,
    scrub: Callable[[str], str] = str,
    make: Callable[[type[StoreError], str], StoreError] | None = None,
    **fields: object,
) -> StoreError | None:
    """Return the stepstone error for driver error ``exc`` by the first matching rule.

    None when no rule matches: the caller decides (re-raise, or a generic error).
    ``make`` builds the error when its class needs more than the message (a conflict's
    run id, a size); by default ``rule.error(message)``.
    """
    text = scrub(_collapsed(exc))
    names = {cls.__name__ for cls in type(exc).__mro__}
    lowered = text.lower()
    for rule in rules:
        if rule.matches(exc, code, names, lowered):
            message = rule.message.format_map(_Fields(fields, text=text, kind=type(exc).__name__))
            return make(rule.error, message) if make else rule.error(message)
    return None


class _Fields(dict[str, object]):
    """Template fields; a field a template names but the caller did not give is blank."""

    def __init__(self, fields: Mapping[str, object], **extra: object) -> None:
        super().__init__(fields, **extra)

    def __missing__(self, key: str) -> str:
        return ""


@contextlib.contextmanager
def map_exceptions(
    rules: tuple[ErrorRule, ...],
    *,
    code: Callable[[BaseException], int | str | None] = lambda exc: None,
    scrub: Callable[[str], str] = str,
    make: Callable[[type[StoreError], str], StoreError] | None = None,
    **fields: object,
) -> Iterator[None]:
    """Translate exceptions raised in the block by ``rules``; unmatched ones propagate.

    A plain context manager, so sync code and awaiting async code share it.
    """
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        error = translate(rules, exc, code(exc), scrub=scrub, make=make, **fields)
        if error is None:
            raise
        raise error from exc
