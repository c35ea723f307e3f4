"""Record ids and errors of the MAF adapter (the scheme the package docstring draws)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Final, Literal
from urllib.parse import quote, unquote

from agent_framework import WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from ..._errors import (
    InvalidState,
    StepstoneError,
)
from ..._store import Store

#: The first segment of the record id of every checkpoint this adapter writes.
PREFIX: Final = "maf/"
#: The ``workflow`` every record of this adapter carries (CLI and dashboard).
WORKFLOW: Final = "maf"
#: The ``format`` tag in each record's state; bumped if the layout ever changes.
FORMAT: Final = "stepstone.maf/1"

Encoding = Literal["json", "maf"]
ENCODINGS: Final = ("json", "maf")


class AgentFrameworkCheckpointError(StepstoneError, WorkflowCheckpointException):
    """A checkpoint this storage cannot hand to MAF; also a ``WorkflowCheckpointException``.

    Raised for an id stored under several workflow names, and for a record written with
    ``encoding="maf"`` read by a storage that did not opt in to unpickling.
    """

    def __init__(self, message: str) -> None:
        # AgentFrameworkException's __init__ logs and takes extra arguments; the message
        # is all either tree needs.
        Exception.__init__(self, message)


class CheckpointNotFound(AgentFrameworkCheckpointError, LookupError):
    """No checkpoint with this id is stored (the protocol's ``WorkflowCheckpointException``)."""

    def __init__(self, checkpoint_id: str) -> None:
        super().__init__(f"No checkpoint found with ID {checkpoint_id}")
        self.checkpoint_id = checkpoint_id


def record_id(workflow_name: str, checkpoint_id: str) -> str:
    """Return the stepstone record id of a MAF checkpoint (see the module docstring)."""
    return f"{workflow_prefix(workflow_name)}{quote(checkpoint_id, safe='')}"


def parse_record_id(run_id: str) -> tuple[str, str] | None:
    """Return ``(workflow_name, checkpoint_id)`` of a record id this adapter writes, else None."""
    parts = run_id.split("/")
    if len(parts) != 3 or f"{parts[0]}/" != PREFIX or not parts[2]:
        return None
    return unquote(parts[1]), unquote(parts[2])


def workflow_prefix(workflow_name: str) -> str:
    return f"{PREFIX}{quote(workflow_name, safe='')}/"


def timestamp_of(checkpoint: WorkflowCheckpoint) -> datetime:
    """Parse the checkpoint's ISO timestamp (naive read as UTC), or refuse it."""
    text = checkpoint.timestamp
    try:
        parsed = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise InvalidState(
            f"MAF checkpoint {checkpoint.checkpoint_id!r}: checkpoint['timestamp'] is "
            f"{text!r}; it must be an ISO 8601 timestamp, as MAF writes it "
            "(get_latest orders checkpoints by it)",
            "checkpoint['timestamp']",
        )
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def id_of(rid: str) -> str | None:
    parsed = parse_record_id(rid)
    return None if parsed is None else parsed[1]


async def maf_ids(store: Store) -> AsyncIterator[str]:
    async for rid in store.alist_runs():
        if rid.startswith(PREFIX):
            yield rid
