"""Small pieces every built-in backend shares."""

from __future__ import annotations

import random

__all__ = ["new_version", "version_token"]

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


def version_token() -> str:
    """Return the random part of a version token (``new_version``), for a store that
    counts in the database: one per claim statement, unique within each run's history."""
    return f"{_randbits(48):012x}"
