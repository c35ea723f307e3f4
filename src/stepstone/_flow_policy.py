"""What a flow-control limit does when its key is full: the policies.

Outside the ``_flow`` package, as its record prefix is in ``_reserved``: ``_flow._limit``
declares limits with them, and the CLI's parser offers them as ``--policy``'s choices,
reading them here without importing flow control (its operations import asyncio;
``stepstone --help``).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["POLICIES", "Policy"]

Policy = Literal["queue", "reject", "replace_pending", "cancel_running"]
#: What happens when a key is full. ``queue``: wait (the run parks, holding no thread).
#: ``reject``: a step fails with ``LimitReached`` (recorded, not retried), and
#: ``start`` of a run holding the key refuses it. For a run's own keys (``start``):
#: ``replace_pending`` cancels the runs started with the key that have not taken it yet
#: (debounce), ``cancel_running`` cancels the runs holding it; a step's keys queue.
POLICIES: tuple[Policy, ...] = ("queue", "reject", "replace_pending", "cancel_running")
