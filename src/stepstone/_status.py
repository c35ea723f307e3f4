"""The statuses of a run, in a module of their own.

Kept apart from ``_checkpoint`` (which re-exports them) so that the CLI can offer them as
choices while it builds its parser, without importing the record and what it needs:
``stepstone --help`` imports no more than its parser.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["ACTIVE_STATUSES", "STATUSES", "RunStatus"]

RunStatus = Literal["queued", "running", "waiting", "failed", "done", "cancelled"]
STATUSES: tuple[RunStatus, ...] = ("queued", "running", "waiting", "failed", "done", "cancelled")
#: Statuses a worker may have to act on; the others are at rest until someone acts.
ACTIVE_STATUSES: tuple[RunStatus, ...] = ("queued", "running", "waiting")
