"""Named points inside the runner and the backends where test code may act.

Only tests install a hook (the crash and chaos suites kill the process at a chosen
point); in production ``fire`` is one global lookup and a comparison. The runner's
points are ``runner.before_step``, ``runner.after_step`` (the step returned, its
checkpoint not saved), ``runner.after_save`` and ``runner.backoff`` (a retry is
waiting). The runtime's: ``worker.claimed`` (a worker's claim landed, the run not yet
driven), ``lease.renewed`` (a renewal landed), ``wait.consumed`` (a ``WaitFor`` chose
its signal, the consumption not yet saved), ``map.child_created`` (a child record
landed, its parent not yet saved), ``worker.resting`` (a worker found nothing and is
about to sleep), ``wake.ring`` (a doorbell is rung: the lost-wake-up faults drop it
there), ``upgrade.transformed`` (an upgrade's function returned, the run not yet
saved), ``schedule.advanced`` (a schedule's due slots are pending, none started) and
``schedule.started`` (a slot's run started, the schedule not yet told); the fleet
harness kills workers there. Spend budgets: ``budget.reserved`` (a ``ctx.reserve``
saved, the call not yet made) and ``budget.pooled`` (a child's charge added to its
root's pool, the child's save not yet made). A long state's save
(``stepstone._statelog``) fires ``pieces.written`` (its pieces are stored, the
document not yet swapped) and ``pieces.collect`` (the document swapped, older pieces
not yet collected) in every backend that keeps pieces, and ``pieces.piece`` after each
piece written (a kill between two pieces; Cosmos, which writes a save's pieces
concurrently, after its first piece and after the rest). The SQL stores fire both
inside the save's one transaction, nothing of it committed yet. Outside saves:
``pieces.deleting`` (a delete removed the document, its pieces not yet) and
``pieces.collecting`` (``collect_orphans`` between two deletions), declared in
``Store.cleanup_kill_points``. Flow control (``stepstone._flow``): ``flow.acquired``
(a slot was taken, the step not yet run) and ``flow.released`` (a slot was given back
or handed to a waiter, the waiter not yet woken). ``memory.saved`` and
``sqlite.committed`` follow a save's commit (the tests of lost answers raise there;
``tests/stores/test_lost_commit_answers.py``). Each
backend's points inside a save are declared once, on the backend class, as
``Store.kill_points`` (point -> whether the new checkpoint survives a kill there); the
contract suite and the chaos harness read them from there.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["fire", "install", "installed"]

_hook: Callable[[str], None] | None = None


def install(hook: Callable[[str], None] | None) -> None:
    """Install ``hook`` (called with the point's name), or remove it with None."""
    global _hook  # noqa: PLW0603 - one process-wide test seam, on purpose
    _hook = hook


def installed() -> Callable[[str], None] | None:
    """Return the hook installed now (None if none), so a new one can chain to it."""
    return _hook


def fire(point: str) -> None:
    """Call the installed hook, if any, at ``point``."""
    if _hook is not None:
        _hook(point)
