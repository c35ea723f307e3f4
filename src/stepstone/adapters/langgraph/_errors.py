"""The LangGraph saver's errors: a refused write, a leased thread, a refused pickle."""

from __future__ import annotations

from ..._errors import ConflictError, StoreError

__all__ = ["CheckpointConflict", "ThreadOwned", "UnsafeCheckpoint"]


class CheckpointConflict(ConflictError):
    """Another writer got there first: the thread advanced, or the checkpoint id is taken.

    Nothing was written by the refused call. Reload the thread (``get_state``) before
    continuing; two processes must not drive one thread at once.
    """

    def __init__(
        self, message: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.checkpoint_id = checkpoint_id


class ThreadOwned(CheckpointConflict):
    """Another owner holds a live lease on the thread (``StepstoneSaver(owner=...)``)."""

    def __init__(self, message: str, thread_id: str, checkpoint_ns: str, owner: str) -> None:
        super().__init__(message, thread_id, checkpoint_ns, None)
        self.owner = owner


class UnsafeCheckpoint(StoreError):
    """A stored value would be unpickled, and the saver was not built with ``allow_pickle``."""
