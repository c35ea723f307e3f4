"""Copying every run from one store to another: ``stepstone migrate``.

The copy is idempotent and safe to re-run after an interruption. For each source run:

- missing in the destination: saved there with ``version=None``, so a run another
  process created meanwhile is never overwritten (that counts as a conflict);
- present with the same content (state, step, step names, total steps, attempt,
  failure): skipped, also when it appeared during the copy (two migrations of the same
  data at once);
- present with different content: a conflict, unless ``force``, which overwrites it
  with a compare-and-swap against the version just read.

What is copied is a snapshot of each source run at the moment it is read: migrate while
no worker runs, or re-run afterwards (runs advanced meanwhile then show as conflicts).
Everything a resumed run depends on is copied (state, progress, failure, input,
workflow, cancellation, suspension, signals, parent); the lease is not: a copied run
has no owner, so the destination's workers can claim it at once. A run that keeps
history (``Workflow(history=True)``) has its pieces copied first, so its history
carries over (between backends that hold pieces; Cosmos DB gets the latest only).

Timestamps: every write goes through ``_write``, which calls ``Store.import_checkpoint``:
compare-and-swap like ``save``, but the copy keeps the source's ``created_at`` and
``updated_at``, so ``prune --older-than`` treats migrated runs as it treated the
originals.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from . import _statelog
from ._checkpoint import Checkpoint, Failure
from ._errors import (
    CheckpointTooLarge,
    ConflictError,
    CorruptCheckpoint,
    InvalidRunId,
    InvalidState,
)
from ._store import Store

__all__ = ["MigrationReport", "Outcome", "ProgressCallback", "migrate"]

Outcome = Literal["copied", "skipped", "conflict", "failed"]
#: Called after each run with ``(done, total, run_id, outcome)``.
ProgressCallback = Callable[[int, int, str, Outcome], None]

# Two stores may keep timestamps at different precisions; a failure time that differs by
# less than this is the same failure.
_TIME_TOLERANCE_SECONDS = 1.0


@dataclass
class MigrationReport:
    """What ``migrate`` did, run by run counted once.

    Attributes:
        copied: Runs written to the destination (``overwritten`` of them replaced one).
        skipped: Runs the destination already held with the same content, or that
            vanished from the source while migrating.
        conflicts: Runs the destination holds with different content (without
            ``force``), or that changed in the destination during the copy.
        failed: Runs that could not be read or written (corrupt, too large...).
        overwritten: How many of ``copied`` replaced a differing destination run.
        total: Runs listed in the source.
        dry_run: Nothing was written; the counts say what would happen.
        problems: ``(run_id, outcome, detail)`` for every conflict and failure.
    """

    copied: int = 0
    skipped: int = 0
    conflicts: int = 0
    failed: int = 0
    overwritten: int = 0
    total: int = 0
    dry_run: bool = False
    problems: list[tuple[str, Outcome, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether the destination now holds every source run as it was read."""
        return self.conflicts == 0 and self.failed == 0

    def summary(self) -> str:
        """Return the one-line summary, e.g. ``copied 3, skipped 1, conflicts 0, failed 0``."""
        copied = f"copied {self.copied}"
        if self.overwritten:
            copied += f" ({self.overwritten} overwritten)"
        line = f"{copied}, skipped {self.skipped}, conflicts {self.conflicts}, failed {self.failed}"
        return f"dry run, nothing written: would have {line}" if self.dry_run else line


def _canonical(state: dict[str, Any]) -> str:
    # Compare as JSON text: in Python 1 == 1.0 == True, in a checkpoint they differ.
    return json.dumps(state, sort_keys=True, ensure_ascii=False, allow_nan=False)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _same_failure(a: Failure | None, b: Failure | None) -> bool:
    if a is None or b is None:
        return a is b
    # Every field equal but the time, which only has to be close.
    close = abs((_utc(a.at) - _utc(b.at)).total_seconds()) < _TIME_TOLERANCE_SECONDS
    return close and replace(a, at=b.at) == b


def differences(a: Checkpoint, b: Checkpoint) -> list[str]:
    """Return the names of the content fields in which two checkpoints differ.

    Content is what a resumed run depends on; ``version`` and the timestamps are not.
    """
    diff = []
    if a.step != b.step:
        diff.append("step")
    if tuple(a.step_names) != tuple(b.step_names):
        diff.append("step_names")
    if a.total_steps != b.total_steps:
        diff.append("total_steps")
    if a.attempt != b.attempt:
        diff.append("attempt")
    if not _same_failure(a.failure, b.failure):
        diff.append("failure")
    if _canonical(a.state) != _canonical(b.state):
        diff.append("state")
    for name in _RUNTIME_FIELDS:
        if getattr(a, name) != getattr(b, name):
            diff.append(name)
    if _canonical({"v": a.input}) != _canonical({"v": b.input}):
        diff.append("input")
    if [(s.name, s.id, _canonical({"v": s.payload})) for s in a.signals] != [
        (s.name, s.id, _canonical({"v": s.payload})) for s in b.signals
    ]:
        diff.append("signals")
    return diff


# Compared as they are; ``input`` and ``signals`` are compared as JSON (above), and the
# lease (owner, epoch, lease, renewed_at) is not content: it is not copied.
_RUNTIME_FIELDS = (
    "workflow",
    "workflow_version",
    "queued",
    "cancelled",
    "cancel_requested",
    "waiting_for",
    "wake_at",
    "consumed",
    "parent",
)


def _copy(cp: Checkpoint, version: str | None) -> Checkpoint:
    """Return the checkpoint to write: the source's, with the destination's version and
    without the source's lease."""
    return replace(
        cp,
        version=version,
        step_names=tuple(cp.step_names),
        state_json=None,
        owner=None,
        lease=None,
        renewed_at=None,
    )


def _copy_history(src: Store, dst: Store, cp: Checkpoint) -> None:
    """Copy a history run's pieces first, so the copy's first record chains onto them.

    Pieces are immutable and their keys unique to the run: ``put_pieces`` skips those
    already there, so a re-run migration copies nothing twice. Written before the
    checkpoint that names them, as every save does. A destination that holds no pieces
    (Cosmos DB) gets the latest checkpoint only.
    """
    if not (cp.history and type(src).holds_pieces and type(dst).holds_pieces):
        return
    keys = src.piece_keys(cp.run_id)
    for start in range(0, len(keys), 64):
        part = keys[start : start + 64]
        data = src.pieces(cp.run_id, part)
        dst.put_pieces(
            cp.run_id,
            [_statelog.Piece(k, _statelog.gen_of(k), data[k]) for k in part if k in data],
        )


def _write(dst: Store, cp: Checkpoint) -> None:
    """Write one copied run, keeping its created_at and updated_at.

    Raises:
        ConflictError: the destination run changed or was created meanwhile.
    """
    dst.import_checkpoint(cp)


def _migrate_one(
    src: Store, dst: Store, run_id: str, force: bool, dry_run: bool
) -> tuple[Outcome, str, bool]:
    """Copy one run; return ``(outcome, detail, overwritten)``."""
    try:
        cp = src.load(run_id)
    except (CorruptCheckpoint, InvalidRunId) as exc:
        return "failed", f"cannot read it from the source: {exc}", False
    if cp is None:
        return "skipped", "vanished from the source during the migration", False
    try:
        existing = dst.load(run_id)
    except CorruptCheckpoint as exc:
        return "failed", f"the destination holds an unreadable checkpoint: {exc}", False
    overwrite = False
    if existing is not None:
        diff = differences(cp, existing)
        if not diff:
            return "skipped", "", False
        if not force:
            return (
                "conflict",
                f"the destination holds a different checkpoint ({', '.join(diff)} differ); "
                "use --force to overwrite it",
                False,
            )
        overwrite = True
    if dry_run:
        return "copied", "", overwrite
    try:
        _copy_history(src, dst, cp)
        _write(dst, _copy(cp, None if existing is None else existing.version))
    except ConflictError:
        # Someone wrote the run meanwhile: another migration of the same data, most
        # likely. Only a different content is a conflict.
        try:
            now = dst.load(run_id)
        except CorruptCheckpoint as exc:
            return "failed", f"the destination holds an unreadable checkpoint: {exc}", False
        if now is not None and not differences(cp, now):
            return "skipped", "", False
        what = "changed" if overwrite else "was created"
        return "conflict", f"it {what} in the destination during the migration", False
    except (InvalidState, CheckpointTooLarge, InvalidRunId) as exc:
        return "failed", f"the destination refused it: {exc}", False
    return "copied", "", overwrite


def migrate(
    src: Store,
    dst: Store,
    force: bool = False,
    *,
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
) -> MigrationReport:
    """Copy every run from ``src`` to ``dst``; see the module docstring for the rules.

    Errors about one run (unreadable, refused by the destination, a lost compare-and-swap)
    are counted in the report and the migration goes on. Errors about a store as a whole
    (``StoreUnavailable``, ``StorePermissionError``) propagate: fix the cause and re-run,
    runs already copied are then skipped.

    Args:
        src: The store to read.
        dst: The store to write.
        force: Overwrite destination runs whose content differs.
        dry_run: Write nothing; report what would happen.
        progress: Called after each run with ``(done, total, run_id, outcome)``.
    """
    run_ids = sorted(src.list_runs())
    report = MigrationReport(total=len(run_ids), dry_run=dry_run)
    for done, run_id in enumerate(run_ids, 1):
        outcome, detail, overwritten = _migrate_one(src, dst, run_id, force, dry_run)
        if outcome == "copied":
            report.copied += 1
            report.overwritten += overwritten
        elif outcome == "skipped":
            report.skipped += 1
        elif outcome == "conflict":
            report.conflicts += 1
        else:
            report.failed += 1
        if outcome in ("conflict", "failed"):
            report.problems.append((run_id, outcome, detail))
        if progress is not None:
            progress(done, len(run_ids), run_id, outcome)
    return report
