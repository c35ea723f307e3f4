"""What one call of a step knows of its limits: the keys it holds and the tokens it used.

A ``FlowCall`` rides on the ``StepContext`` (``ctx.acquire``, ``ctx.settle``). The step
itself does no I/O for flow control: ``ctx.settle`` records the tokens the call really
used, and ``ctx.acquire`` of a key not yet held stops the call with ``NeedLimit`` so
that the runner acquires it (or parks the run) and calls the step again holding it.
Code before ``ctx.acquire`` may thus run twice: acquire first.
"""

from __future__ import annotations

import math

from .._errors import ConfigError
from ._limit import check_key

__all__ = ["FlowCall", "NeedLimit"]


class NeedLimit(Exception):
    """Raised by ``ctx.acquire`` for a key the call does not hold yet (never seen by users).

    An ``Exception`` (the drivers hand only those back to the core): a step must let
    it through, so call ``ctx.acquire`` outside any ``try: ... except Exception``.
    """

    def __init__(self, key: str, tokens: float) -> None:
        super().__init__(key)
        self.key = key
        self.tokens = tokens


def check_tokens(tokens: object, what: str) -> float:
    """Return ``tokens`` if it is a finite number >= 0."""
    if (
        isinstance(tokens, bool)
        or not isinstance(tokens, (int, float))
        or not math.isfinite(tokens)
        or tokens < 0
    ):
        raise ConfigError(f"{what}: tokens must be a finite number >= 0, got {tokens!r}")
    return float(tokens)


class FlowCall:
    """The keys one step call holds (key -> tokens estimated) and what it settled."""

    __slots__ = ("held", "settled")

    def __init__(self) -> None:
        self.held: dict[str, float] = {}
        self.settled: float | None = None

    def acquire(self, key: str, tokens: float = 0) -> None:
        """Hold ``key`` (one request, ``tokens`` tokens) for the rest of the call."""
        check_key(key, "ctx.acquire")
        tokens = check_tokens(tokens, "ctx.acquire")
        if key not in self.held:
            raise NeedLimit(key, tokens)

    def settle(self, tokens: float) -> None:
        """Record the tokens the call really used; the runner corrects the estimate."""
        self.settled = check_tokens(tokens, "ctx.settle")
