"""``AgentStepBase``: what the adapters' agent steps (``AgentRunStep``, ``AgentStep``) share."""

from __future__ import annotations

from typing import Any

from .._budget import Prices
from .._errors import InvalidWorkflow
from .._steps import RetryPolicy, SuspendingStep, check_name

__all__ = ["AgentStepBase"]


class AgentStepBase(SuspendingStep):
    """A step that runs an agent framework's agent: its name and retry policy, the agent,
    and the prices its usage is charged at; shown as ``Kind('name', 'agent name')``."""

    __slots__ = ("agent", "prices")

    agent: Any
    prices: Prices | None

    def _begin(self, name: str, retry: RetryPolicy | None, prices: Prices | None) -> None:
        """Set the name and the prices, both checked, and the retry policy."""
        self.name = check_name(name)
        if prices is not None and not isinstance(prices, Prices):
            raise InvalidWorkflow(
                f"{type(self).__name__} {name!r}: prices must be a stepstone.Prices"
            )
        self.prices = prices
        self.retry = retry

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.agent.name!r})"
