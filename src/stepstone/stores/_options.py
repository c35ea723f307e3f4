"""One typed parser for the options in every backend's config string.

A backend declares its options once as :class:`Option` rows; :func:`parse` turns the
query string into typed values, refusing unknown names, repeated names and values out of
range, with a message that names what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qsl

from .._errors import ConfigError

__all__ = ["Option", "flag", "number", "parse", "text"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Option(Generic[T]):
    """One option: its name, how its text becomes a value, and what to say it allows."""

    name: str
    convert: Callable[[str], T]
    allowed: str  # for the error message: "true or false", "a number > 0", ...
    choices: tuple[str, ...] | None = None

    def value(self, raw: str) -> T:
        """Return ``raw`` converted, or raise ConfigError naming the option and its range."""
        if self.choices is not None and raw not in self.choices:
            raise ConfigError(
                f"option {self.name}={raw!r} is not allowed; choose one of: "
                f"{', '.join(self.choices)}"
            )
        try:
            return self.convert(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"option {self.name}={raw!r} is not allowed: it must be {self.allowed}"
            ) from exc


def _flag(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def flag(name: str) -> Option[bool]:
    """A boolean option: true/false, yes/no, on/off, 1/0."""
    return Option(name, _flag, "true or false")


def number(name: str, *, low: float = 0.0, inclusive: bool = False) -> Option[float]:
    """A finite number above ``low`` (or at least ``low`` when ``inclusive``)."""

    def convert(raw: str) -> float:
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(raw)
        if value < low or (value == low and not inclusive):
            raise ValueError(raw)
        return value

    return Option(name, convert, f"a number {'>=' if inclusive else '>'} {low:g}")


def text(name: str, choices: tuple[str, ...] | None = None) -> Option[str]:
    """A text option, any value or one of ``choices``."""
    return Option(name, str, "text" if choices is None else ", ".join(choices), choices)


def parse(
    query: str, options: Mapping[str, Option[Any]] | tuple[Option[Any], ...], forms: str
) -> dict[str, object]:
    """Parse a config string's query into typed values by ``options``.

    Raises:
        ConfigError: an unknown or repeated option, or a value it does not allow.
    """
    table = options if isinstance(options, Mapping) else {o.name: o for o in options}
    values: dict[str, object] = {}
    for name, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        option = table.get(name)
        if option is None:
            known = ", ".join(sorted(table)) or "none"
            raise ConfigError(f"unknown option {name!r}; known options: {known}. Forms: {forms}")
        if name in values:
            raise ConfigError(f"option {name!r} is given twice")
        values[name] = option.value(raw)
    return values
