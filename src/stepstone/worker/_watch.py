"""``Watch``: which runs a worker claims now, from what the claim index shows over time.

No I/O and no clock of its own: the worker passes monotonic times in, so the rules
(when an owner is presumed dead, which runs are left for other workers, where the next
page of each kind starts) are tested without a store or a sleep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _clock, _lease

if TYPE_CHECKING:
    from .._checkpoint import Checkpoint, RunStatus
    from .._store import RunInfo

__all__ = ["FORGET", "KINDS", "RECHECK", "Seen", "Watch", "lease_hint"]

#: Seconds before a run of a workflow this worker does not serve is loaded again.
RECHECK = 60.0
#: Seconds after which a run the index no longer shows is forgotten.
FORGET = 600.0
#: The claim index's kinds, in the order a worker reads them: takeovers, runs resumed
#: (a signal, a timer, children done), new runs.
KINDS: tuple[RunStatus, ...] = ("running", "waiting", "queued")


def lease_hint(info: RunInfo) -> float | None:
    """Return the lease a running run's index entry shows, or None if it shows none.

    Its due_at is the owner's ``renewed_at`` plus its lease, and its updated_at the
    time of that same write (a claim, a renewal or a save), both by the owner's clock:
    their difference is the lease, a little short, with no clock of ours compared.
    So a worker need not load every run it sees held to learn its lease (with many
    workers, a load by each for every run claimed): it loads one once the hinted lease
    has passed unrenewed, and ``expired`` then judges by the lease recorded.
    """
    if info.status != "running" or info.due_at is None or info.updated_at is None:
        return None
    try:
        seconds = (info.due_at - info.updated_at).total_seconds()
    except TypeError:  # one naive, one aware: a foreign store's times
        return None
    if not _lease.MIN_LEASE / 2 <= seconds <= _lease.MAX_LEASE:
        return None
    return seconds


class Seen:
    """What a worker saw of one run held by another owner (see ``Watch``)."""

    __slots__ = ("cp_mark", "info_mark", "lease", "sighted", "since")

    def __init__(self, info_mark: Any, cp_mark: Any, since: float, lease: float | None) -> None:
        self.info_mark = info_mark  # the owner's fields the claim index shows
        self.cp_mark = cp_mark  # ``_lease.owner_mark`` of the last load, None until one
        self.since = since  # monotonic: when the owner's mark was first seen as it is
        self.lease = lease  # the owner's recorded lease, once a load told it
        self.sighted = since  # monotonic: when the claim index last showed the run


class Watch:
    """Which runs to claim now, from what the claim index shows over time (no I/O).

    For each run another owner holds it remembers the owner's mark (what only the owner
    writes: claims, renewals, saves; never signals or cancel requests, see
    ``_lease.owner_mark``), when (monotonic) that mark was first seen, and the owner's
    lease once a load told it. A run is loaded only to learn its lease (once) and when
    that lease may have passed, not on every poll: watching a thousand busy runs costs
    no reads. Runs of workflows this worker does not serve are remembered too, and not
    loaded again for ``RECHECK`` seconds.

    It also keeps the worker's place in each kind of the claim index (``skip``): runs
    it leaves (another workflow or version) cannot fill its view for ever, and every
    running run comes under watch, whatever due_at its owner's clock wrote.
    """

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}
        self.unserved: set[tuple[str | None, str | None]] = set()
        # run_id -> monotonic time of the load that found its workflow not served here.
        self.left: dict[str, float] = {}
        self.skip: dict[RunStatus, int] = dict.fromkeys(KINDS, 0)
        self._pruned = _clock.monotonic()

    def pick(self, infos: list[RunInfo], busy: set[str], now: float) -> list[RunInfo]:
        """Return the runs worth loading to claim, in the index's order."""
        picked: list[RunInfo] = []
        # An owner usually holds many runs of a page: judged once (a /proc read each).
        gone: dict[str, bool] = {}
        for info in infos:
            run_id = info.run_id
            if run_id in busy:
                continue
            left = self.left.get(run_id)
            if left is not None and now - left < RECHECK:
                continue
            if info.owner is None:
                picked.append(info)
                continue
            dead = gone.get(info.owner)
            if dead is None:
                dead = gone[info.owner] = _lease.dead_here(info.owner)
            if dead:
                # Its owner was a process on this host that is gone: no lease to wait
                # out (as ``run`` takes over), so loaded at once to be taken over.
                picked.append(info)
                continue
            # renewed_at moves with every write of the owner's, and due_at with it.
            mark = (info.owner, info.due_at, info.step, info.status)
            seen = self.seen.get(run_id)
            if seen is None:
                hint = lease_hint(info)
                self.seen[run_id] = Seen(mark, None, now, hint)
                if hint is None:
                    picked.append(info)  # loaded once, to learn the owner's lease
                continue
            seen.sighted = now
            if seen.info_mark != mark:
                seen.info_mark, seen.cp_mark, seen.since = mark, None, now
                continue
            if seen.lease is None or now - seen.since >= seen.lease:
                picked.append(info)
        return picked

    def expired(self, cp: Checkpoint, now: float) -> bool:
        """Return whether ``cp``'s owner let its whole lease pass without a write, by our clock.

        Or whether its owner is known gone at once (``_lease.dead_here``).
        """
        if _lease.dead_here(cp.owner):
            return True  # the same certainty ``run`` takes over on: its owner is gone
        lease = cp.lease or _lease.DEFAULT_LEASE
        mark = _lease.owner_mark(cp)
        seen = self.seen.get(cp.run_id)
        if seen is None:
            self.seen[cp.run_id] = Seen(None, mark, now, lease)
            return False
        seen.lease = lease
        if seen.cp_mark is None:
            seen.cp_mark = mark
            # The index showed this owner's mark unchanged since ``since``; a running
            # run's due_at moves with each of its owner's writes, so that age holds when
            # the record is the one the index showed. Otherwise count from now.
            if cp.status != "running" or seen.info_mark != (
                cp.owner,
                cp.due_at,
                cp.step,
                cp.status,
            ):
                seen.since = now
                return False
        elif seen.cp_mark != mark:
            seen.cp_mark, seen.since = mark, now
            return False
        return bool(now - seen.since >= lease)

    def next_expiry(self, after: float) -> float | None:
        """Return the earliest monotonic time after ``after`` at which a watched lease runs out.

        That is when a run another owner holds is worth loading again (``pick``), if
        the index shows no write of its owner's before. Only runs whose lease a load
        told; a time at or before ``after`` is left out (the look then covered it).
        """
        soonest: float | None = None
        for seen in self.seen.values():
            if seen.lease is None:
                continue
            at = seen.since + seen.lease
            if at > after and (soonest is None or at < soonest):
                soonest = at
        return soonest

    def leave(self, run_id: str, now: float) -> None:
        """Remember that ``run_id`` is of a workflow this worker does not serve."""
        self.left[run_id] = now
        self.seen.pop(run_id, None)

    def first_look(self, infos: list[RunInfo], limit: int) -> dict[str, tuple[list[RunInfo], bool]]:
        """Split one ``claimable(now, limit)`` answer into pages of each kind.

        Each kind's page comes with whether more of that kind may follow: the running
        part was full, or the due part (queued and waiting merged by due_at) was.
        """
        kinds: dict[str, list[RunInfo]] = {status: [] for status in KINDS}
        for info in infos:
            if info.status in kinds:
                kinds[info.status].append(info)
        due_full = len(kinds["queued"]) + len(kinds["waiting"]) >= limit
        return {
            status: (page, len(page) >= limit if status == "running" else due_full)
            for status, page in kinds.items()
        }

    def at_start(self) -> bool:
        """Whether every kind is read from its earliest due (one combined query serves)."""
        return not any(self.skip.values())

    def turn(
        self, status: RunStatus, got: int, taken: int, more: bool, filled: bool, capped: bool
    ) -> bool:
        """Move past a page of ``got`` runs of ``status``; return whether to read the next now.

        ``taken`` of them were claimed (a claimed queued or waiting run leaves its
        kind, so the next page starts that much earlier); ``more``: the page was full.
        A short page is the last: the next look starts again from the earliest due. A
        worker whose slots are full starts its next look at the earliest due too (they
        go first); one that read as many pages as it may (``capped``) carries on from
        here next time.
        """
        if not more:
            self.skip[status] = 0
            return False
        moved = self.skip[status] + got - (0 if status == "running" else taken)
        if filled and status != "running":
            self.skip[status] = 0
            return False
        self.skip[status] = max(moved, 0)
        return not (filled or capped)

    def prune(self) -> None:
        """Forget runs the index has not shown for a while (finished, deleted)."""
        now = _clock.monotonic()
        if now - self._pruned < RECHECK:
            return
        self._pruned = now
        self.seen = {k: s for k, s in self.seen.items() if now - s.sighted < FORGET}
        self.left = {k: t for k, t in self.left.items() if now - t < RECHECK}
