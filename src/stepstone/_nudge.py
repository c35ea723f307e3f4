"""Waking a Map's parent when one of its children ends: the child's end nudges the parent
(due now, or when its last sibling is done), so the parent re-evaluates without polling."""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime, timedelta
from typing import Any

from ._checkpoint import DUE_NOW, Checkpoint, evolve, utcnow
from ._effects import Announce, Effect, Load, Save
from ._errors import ConflictError, StoreError
from ._mapseen import LISTED
from ._observe import logger

#: How often a child tries to nudge a parent that others keep writing (then it polls).
_NUDGE_TRIES = 10
#: How many siblings a finished child looks at before it tells its parent (``nudge``).
_PEEKS = 3
#: Nudged parents are due at ``DUE_NOW`` plus a second per nudge (``_due_again``), below this.
DUE_NOW_UNTIL = DUE_NOW + timedelta(days=365)


def _due_again(wake_at: datetime | None) -> datetime:
    """Return a due-now time (by any clock, as ``DUE_NOW``) unlike ``wake_at``.

    An owned parent's owner keeps a nudge only if ``wake_at`` changed under it
    (``_lease.rebase``); a parent claimed after an earlier child's nudge already holds
    a due-now time, and the same value again would read as no nudge at all, the wake-up
    lost until the parent's own poll. So each nudge moves it one second further from
    the epoch: still decades before any clock's now.
    """
    if wake_at is not None and DUE_NOW <= wake_at < DUE_NOW_UNTIL:
        return wake_at + timedelta(seconds=1)
    return DUE_NOW


def nudge(parent: str, done: str | None = None) -> Generator[Effect, Any, None]:
    """Tell a parent waiting on its children to look now (best effort; it also polls).

    ``done`` names the child that has just been saved done; without it (a child failed
    or was cancelled) the parent is always told. A done child tells the parent only if
    the siblings it looks at are done too (``_siblings_done``): told of every child's
    end, the parent may load all N children N times. Whichever child finishes last sees
    the others done (each looks after its own save), so it tells the parent, waiting
    or still looking (its owner keeps the due time, ``_lease.rebase``); a nudge lost
    to a crash only delays the parent to its poll (``CHILD_POLL``).
    """
    if done is not None:
        try:
            if (yield from _sibling_going(parent, done)):
                return  # that sibling's own end tells the parent
        except StoreError as exc:
            logger.warning("could not wake parent run %r: %s (it polls)", parent, exc)
            return
    for _ in range(_NUDGE_TRIES):
        try:
            cp = yield Load(parent)
            # A parent that is waiting on children, or is being run right now (its Map
            # may be about to save itself waiting): either way, due now.
            if cp is None or cp.status not in ("waiting", "running"):
                return
            # Already due and nobody on it: a worker will look. An owned parent is
            # written anyway: it may be saving itself waiting on what it saw before.
            if cp.owner is None and cp.wake_at is not None and cp.wake_at <= utcnow():
                return
            if done is not None:
                finished = yield from _siblings_done(cp.children, done, cp.status == "running")
                if not finished:
                    return  # a sibling is still going: its own end tells the parent
            yield Save(
                evolve(cp, wake_at=_due_again(cp.wake_at)), f"wake parent {parent}", owned=False
            )
        except ConflictError:
            continue
        except StoreError as exc:
            logger.warning("could not wake parent run %r: %s (it polls)", parent, exc)
            return
        if cp.owner is None:
            # A worker resumes the parent now, not at its next poll. An owned parent
            # needs none: its owner's next save keeps the due time and, if it gives
            # the run back due, announces that itself (``_core``).
            yield Announce()
        return
    logger.info("run %r: gave up waking parent run %r (it polls)", done, parent)


def _sibling_going(parent: str, done: str) -> Generator[Effect, Any, bool]:
    """Whether a sibling of ``done`` is still going, by the children this process saw
    ``parent`` make (``LISTED``); False if unknown here, or if none looked at is.

    The parent's record lists every child, so loading it costs as much as its Map is
    wide; a child whose parent was made here looks at its siblings first, and while
    one is still going (the usual case: all but the last few children to end) the
    parent is not read at all. A stale entry can only find a sibling that does not
    exist, or one of another attempt: either is "not known going" unless the sibling
    names this parent, so the full path (which reads the parent) decides.
    """
    children = LISTED.get(parent)
    if children is None or done not in children:
        return False
    position = children.index(done)
    last = len(children) - 1
    order = [last] if position != last else []
    order.extend(n for n in (position + 1, position - 1) if 0 <= n < last)
    for near in order[:_PEEKS]:
        sibling: Checkpoint | None = yield Load(children[near])
        if sibling is None or sibling.parent != parent:
            return False
        if sibling.status != "done":
            return sibling.status in ("queued", "running", "waiting")
    return False


def _siblings_done(
    children: tuple[str, ...], done: str, running: bool = False
) -> Generator[Effect, Any, bool]:
    """Return whether the siblings of ``done`` looked at are all done (True if unknown).

    Looks at no more than ``_PEEKS`` siblings, stopping at the first one not done: the
    last child (workers take children in the order they were queued, so it is usually
    still queued), then ``done``'s neighbours (near the end, the unfinished ones). True
    after those is no proof that all are done, only that the parent is worth a look;
    False is a proof that it is not, since that sibling's own end tells it.
    """
    try:
        position = children.index(done)
    except ValueError:
        return True  # not (yet) listed as a child of the parent's wait: tell it anyway
    last = len(children) - 1
    order = [last] if position != last else []
    order.extend(n for n in (position + 1, position - 1) if 0 <= n < last)
    for near in order[:_PEEKS]:
        sibling: Checkpoint | None = yield Load(children[near])
        if sibling is None:
            # A running parent lists its children before it makes them
            # (``_suspend._list_children``): not made yet, its own look sees it made,
            # and that child's end tells it. Waiting: deleted meanwhile, the parent's
            # own look deals with it (a deletion under a running parent waits for the
            # parent's poll, ``CHILD_POLL``).
            return not running
        if sibling.status != "done":
            return False
    return True
