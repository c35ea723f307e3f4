"""Small pieces every built-in backend shares."""

from __future__ import annotations

import random
from urllib.parse import parse_qsl

from .._errors import ConfigError

__all__ = ["new_version", "parse_options"]

# Not ``secrets``: a token only has to differ from the tokens a run had before it was
# deleted, not be unguessable, and a system call per save costs more than the rest of
# the token. ``random`` reseeds itself in a forked child, so forks never share tokens.
_randbits = random.getrandbits


def new_version(previous: str | None) -> str:
    """Return a fresh version token: a save counter, for people, plus randomness.

    The random part makes a token unique even when a run is deleted and created again,
    so a worker holding a token from before the delete can never match the new run.
    """
    count = 1
    if previous is not None:
        head = previous.partition(".")[0]
        if head.isdigit():
            count = int(head) + 1
    return f"{count}.{_randbits(48):012x}"


def parse_options(
    query: str, allowed: dict[str, tuple[str, ...] | None], forms: str
) -> dict[str, str]:
    """Parse a config string's query into options, refusing unknown names and values.

    ``allowed`` maps each option to its permitted values (None: any value).
    """
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise ConfigError(f"unknown option {name!r}; known options: {known}. Forms: {forms}")
        choices = allowed[name]
        if choices is not None and value not in choices:
            raise ConfigError(
                f"option {name}={value!r} is not allowed; choose one of: {', '.join(choices)}"
            )
        if name in options:
            raise ConfigError(f"option {name!r} is given twice")
        options[name] = value
    return options
