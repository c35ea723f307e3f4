"""The values a ``Store`` hands back: ``RunInfo``, ``Claim``, ``Diagnosis``, ``Listener``.

With ``page_key`` (the order of ``Store.list_page``), ``check_page`` (the check of a
``claimable`` page's arguments) and ``infos_of`` (a listing that skips a corrupt run),
which every backend's listing shares; ``ReadyAsk`` and ``PageAsk``, the arguments of
one ``claim_ready`` and one ``list_page`` call as the backends' hooks take them (the
contract's signature is written once, on ``Store``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ._checkpoint import ACTIVE_STATUSES, Checkpoint
from ._errors import CorruptCheckpoint
from ._observe import logger

if TYPE_CHECKING:
    from ._checkpoint import RunStatus

__all__ = [
    "Claim",
    "Diagnosis",
    "Listener",
    "PageAsk",
    "ReadyAsk",
    "RunInfo",
    "check_page",
    "infos_of",
    "page_key",
]

_NEVER = datetime(1970, 1, 1, tzinfo=UTC)


def page_key(info: RunInfo) -> tuple[datetime, str]:
    """Return the order of ``Store.list_page``: (updated_at in UTC, run_id); larger first."""
    updated = info.updated_at
    if updated is None:
        updated = _NEVER
    elif updated.tzinfo is None:
        updated = updated.replace(tzinfo=UTC)
    return updated, info.run_id


class Listener(Protocol):
    """What ``Store.listen`` returns: hears other processes' announcements until closed."""

    def close(self) -> None:
        """Stop listening and release what the listener holds. Closing twice is allowed."""
        ...


class ReadyAsk(NamedTuple):
    """The arguments of one ``Store.claim_ready`` call, as a backend's hook takes them."""

    owner: str
    lease: float
    limit: int
    served: frozenset[tuple[str, str | None]]
    now: datetime
    exclude: frozenset[str]


class PageAsk(NamedTuple):
    """The arguments of one ``Store.list_page`` call, as a backend's hook takes them."""

    status: RunStatus | None
    prefix: str
    after: tuple[datetime, str] | None
    limit: int


class Claim(NamedTuple):
    """One run claimed by ``Store.claim_ready``: its record before and as now stored.

    ``before.version`` is None where the database does not return the replaced version.
    """

    before: Checkpoint
    claimed: Checkpoint


class Diagnosis(NamedTuple):
    """One check made by ``Store.doctor``."""

    check: str
    ok: bool
    detail: str


class RunInfo:
    """What ``Store.list_info`` reports for one run: enough to list, prune and claim.

    ``version`` lets a caller act on what it read by compare-and-swap (prune deletes
    with it, a worker claims with it); ``owner`` and ``due_at`` come from the same
    record (``Checkpoint.owner``, ``Checkpoint.due_at``). Backends that cannot report
    them leave them None; ``Store.list_info``'s default fills every field.

    ``workflow``, ``workflow_version`` and ``waiting_for`` are what a listing row shows
    besides (the dashboard's). ``Store.list_page`` reports them on every built-in backend
    from the run's metadata, never its state; ``list_info`` and ``claimable`` may leave
    them None.
    """

    __slots__ = (
        "due_at",
        "owner",
        "run_id",
        "status",
        "step",
        "total_steps",
        "updated_at",
        "version",
        "waiting_for",
        "workflow",
        "workflow_version",
    )

    def __init__(
        self,
        run_id: str,
        status: RunStatus,
        step: int,
        total_steps: int | None,
        updated_at: datetime | None,
        *,
        version: str | None = None,
        owner: str | None = None,
        due_at: datetime | None = None,
        workflow: str | None = None,
        workflow_version: str | None = None,
        waiting_for: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.status: RunStatus = status
        self.step = step
        self.total_steps = total_steps
        self.updated_at = updated_at
        self.version = version
        self.owner = owner
        self.due_at = due_at
        self.workflow = workflow
        self.workflow_version = workflow_version
        self.waiting_for = waiting_for

    @classmethod
    def of(cls, cp: Checkpoint) -> RunInfo:
        """Return the ``RunInfo`` of a loaded checkpoint."""
        return cls(
            cp.run_id,
            cp.status,
            cp.step,
            cp.total_steps,
            cp.updated_at,
            version=cp.version,
            owner=cp.owner,
            due_at=cp.due_at,
            workflow=cp.workflow,
            workflow_version=cp.workflow_version,
            waiting_for=cp.waiting_for,
        )

    def __repr__(self) -> str:
        return (
            f"RunInfo(run_id={self.run_id!r}, status={self.status!r}, step={self.step}, "
            f"updated_at={self.updated_at!r}, owner={self.owner!r}, due_at={self.due_at!r})"
        )


def check_page(status: object, skip: object) -> None:
    """Raise ``ValueError`` unless ``status`` and ``skip`` name a page of ``claimable``."""
    if status is not None and status not in ACTIVE_STATUSES:
        raise ValueError(
            f"status must be None or one of {', '.join(ACTIVE_STATUSES)}, got {status!r}"
        )
    if type(skip) is not int or skip < 0:
        raise ValueError(f"skip must be an int >= 0, got {skip!r}")


def infos_of(
    run_ids: Iterator[str],
    load: Callable[[str], Checkpoint | None],
    log: logging.Logger = logger,
) -> Iterator[RunInfo]:
    """Yield a ``RunInfo`` per run ``load`` finds, logging (to ``log``) and skipping a
    corrupt one: one bad document must not hide every other run from a listing."""
    for run_id in run_ids:
        try:
            cp = load(run_id)
        except CorruptCheckpoint as exc:
            log.warning("skipping run %r in listing: %s", run_id, exc)
            continue
        if cp is not None:
            yield RunInfo.of(cp)
