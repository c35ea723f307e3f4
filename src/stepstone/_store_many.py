"""Saving several records in one call: ``Store.save_many``'s one-by-one default.

A ``Map`` makes its children 16 at a time, and the LangGraph saver writes a checkpoint
and advances its head for every superstep: each is several saves that depend on none of
each other's outcomes. ``save_many`` hands them to the store at once; a store that
declares ``saves_together`` (SQLite, by its group commit) commits them in one
transaction, with one fsync, where one by one each would be a commit of its own.

Never all-or-nothing: each save keeps its own outcome, as concurrent saves through a
group commit always did. A compare-and-swap that loses fails that save alone (its
``ConflictError`` in its place in the answer) and the others land; a failure of the
transaction as a whole fails every save it held. A caller that needs one save to land
only with another checks the outcomes and undoes what it must (the saver does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ._checkpoint import Checkpoint

__all__ = ["asave_in_order", "check_many", "save_in_order"]


class _Saves(Protocol):
    def save(self, checkpoint: Checkpoint) -> Checkpoint: ...

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint: ...


def check_many(checkpoints: object) -> list[Checkpoint]:
    """Return ``checkpoints`` as a list if ``save_many`` takes it, else raise.

    Raises:
        TypeError: not a list or tuple of ``Checkpoint``.
        ValueError: two checkpoints of one run (the second would expect the version the
            first replaces: give one per run, and save the next after this call).
    """
    from ._checkpoint import Checkpoint  # noqa: PLC0415 - no cycle at import

    if not isinstance(checkpoints, (list, tuple)):
        raise TypeError(
            f"save_many takes a list of stepstone.Checkpoint, got {type(checkpoints).__name__}"
        )
    seen: set[str] = set()
    for n, checkpoint in enumerate(checkpoints):
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"save_many: item {n} is a {type(checkpoint).__name__}, not a "
                "stepstone.Checkpoint; give a list of Checkpoint, at most one per run"
            )
        if checkpoint.run_id in seen:
            raise ValueError(
                f"save_many: run {checkpoint.run_id!r} appears twice; give at most one "
                "checkpoint per run (save the next one after this call)"
            )
        seen.add(checkpoint.run_id)
    return list(checkpoints)


def save_in_order(store: _Saves, checkpoints: Sequence[Checkpoint]) -> list[Checkpoint | Exception]:
    """Save each checkpoint (``check_many``'d) with ``store.save``, one after another;
    each one's outcome."""
    outcomes: list[Checkpoint | Exception] = []
    for checkpoint in checkpoints:
        try:
            outcomes.append(store.save(checkpoint))
        except Exception as exc:  # noqa: BLE001 - the outcome of that save alone
            outcomes.append(exc)
    return outcomes


async def asave_in_order(
    store: _Saves, checkpoints: Sequence[Checkpoint]
) -> list[Checkpoint | Exception]:
    """Async ``save_in_order``: each with ``store.asave``."""
    outcomes: list[Checkpoint | Exception] = []
    for checkpoint in checkpoints:
        try:
            outcomes.append(await store.asave(checkpoint))
        except Exception as exc:  # noqa: BLE001 - the outcome of that save alone
            outcomes.append(exc)
    return outcomes
