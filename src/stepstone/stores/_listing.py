"""The memory store's indexes: its answers to ``list_page`` and ``claimable``.

``IndexedRuns`` is the memory store's dict of checkpoints, keeping beside it two indexes,
each built on first use (most stores used in tests never list or claim) and then kept in
step on every write:

- the listing: per status and for all runs, two sorted lists, by ``page_key`` (newest
  last) and by run id. A page is then a binary search and a slice, O(log n + page); a
  count per status is a length or two binary searches.
- the claims: per active status, a list sorted by (due_at, arrival), where arrival is
  the run's position in the dict (the order ``Store.claimable``'s scan meets it, so ties
  come out as they did); plus the running runs by arrival, the order of the scan's
  unpaged answer. A claim is then a binary search and a slice, O(log n + limit),
  whatever the number of finished runs, which are never in it.

Writes pay an insertion into a few sorted lists (a memmove, microseconds at 100,000
runs). The dict stays the truth: the lists are rebuilt from it on demand.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from .._checkpoint import ACTIVE_STATUSES, STATUSES, Checkpoint
from .._store import RunInfo, page_key

__all__ = ["IndexedRuns"]

_Key = tuple[datetime, str]
#: A claim index entry: (due_at, arrival, run_id); arrival is unique, run_id never compared.
_Due = tuple[datetime, int, str]


class IndexedRuns(dict[str, Checkpoint]):
    """A ``run_id -> Checkpoint`` dict that keeps the listing index in step.

    Every way of changing a dict goes through ``__setitem__`` / ``__delitem__`` here, so
    no write can leave the index behind. Callers hold the store's lock for both writes
    and reads, as for the dict itself.
    """

    def __init__(self) -> None:
        super().__init__()
        # None: every run; else one status. Built lazily on first use (most stores used
        # in tests never list a page), then maintained on every write.
        self._by_time: dict[str | None, list[_Key]] | None = None
        self._by_id: dict[str | None, list[str]] = {}
        self._indexed: dict[str, tuple[str, _Key]] = {}
        # The claim index, None until the first claim: per active status the due runs by
        # (due_at, arrival); the running runs by arrival; each run's arrival and entry.
        self._due: dict[str, list[_Due]] | None = None
        self._running: list[tuple[int, str]] = []
        self._arrival: dict[str, int] = {}
        self._claimed: dict[str, tuple[str, _Due]] = {}
        self._arrivals = 0

    # -- keeping the index --------------------------------------------------------------

    def _build(self) -> dict[str | None, list[_Key]]:
        by_time: dict[str | None, list[_Key]] = {s: [] for s in (None, *STATUSES)}
        self._by_id = {s: [] for s in (None, *STATUSES)}
        self._indexed = {}
        for run_id, cp in super().items():
            status, key = cp.status, page_key(RunInfo.of(cp))
            self._indexed[run_id] = (status, key)
            for group in (None, status):
                by_time[group].append(key)
                self._by_id[group].append(run_id)
        for times in by_time.values():
            times.sort()
        for ids in self._by_id.values():
            ids.sort()
        self._by_time = by_time
        return by_time

    def _unindex(self, run_id: str) -> None:
        if self._by_time is None:
            return
        status, key = self._indexed.pop(run_id)
        for group in (None, status):
            times, ids = self._by_time[group], self._by_id[group]
            del times[bisect_left(times, key)]
            del ids[bisect_left(ids, run_id)]

    def _build_claims(self) -> dict[str, list[_Due]]:
        self._due = {status: [] for status in ACTIVE_STATUSES}
        self._running, self._arrival, self._claimed = [], {}, {}
        self._arrivals = 0
        for run_id, cp in super().items():
            self._claim(run_id, cp)
        return self._due

    def _claim(self, run_id: str, cp: Checkpoint) -> None:
        """Put ``cp`` in the claim index in place of what ``run_id`` had there."""
        assert self._due is not None
        arrival = self._arrival.get(run_id)
        if arrival is None:
            # A new key goes last in a dict; a re-saved one keeps its place.
            arrival = self._arrival[run_id] = self._arrivals
            self._arrivals += 1
        status = cp.status
        due = cp.due_at if status in ACTIVE_STATUSES else None
        new = None if due is None else (status, (_aware(due), arrival, run_id))
        old = self._claimed.get(run_id)
        if old == new:
            return
        if old is not None:
            self._unclaim_entry(old, None if new is None else new[0])
        if new is None:
            del self._claimed[run_id]
            return
        insort(self._due[new[0]], new[1])
        if new[0] == "running" and (old is None or old[0] != "running"):
            insort(self._running, (arrival, run_id))
        self._claimed[run_id] = new

    def _unclaim_entry(self, old: tuple[str, _Due], status: str | None) -> None:
        """Remove ``old`` from the claim index; ``status`` is the run's next one, if any."""
        assert self._due is not None
        entries = self._due[old[0]]
        del entries[bisect_left(entries, old[1])]
        if old[0] == "running" and status != "running":
            del self._running[bisect_left(self._running, old[1][1:])]

    def _unclaim(self, run_id: str) -> None:
        if self._due is None:
            return
        del self._arrival[run_id]
        old = self._claimed.pop(run_id, None)
        if old is not None:
            self._unclaim_entry(old, None)

    def __setitem__(self, run_id: str, cp: Checkpoint) -> None:
        if self._due is not None:
            self._claim(run_id, cp)
        if self._by_time is not None:
            if run_id in self:
                self._unindex(run_id)
            status, key = cp.status, page_key(RunInfo.of(cp))
            self._indexed[run_id] = (status, key)
            for group in (None, status):
                insort(self._by_time[group], key)
                insort(self._by_id[group], run_id)
        super().__setitem__(run_id, cp)

    def __delitem__(self, run_id: str) -> None:
        super().__delitem__(run_id)  # KeyError first, as a dict does
        self._unindex(run_id)
        self._unclaim(run_id)

    def pop(self, run_id: str, *default: Any) -> Any:
        """``dict.pop``, keeping the index."""
        if run_id not in self:
            return super().pop(run_id, *default)
        cp = self[run_id]
        del self[run_id]
        return cp

    def popitem(self) -> tuple[str, Checkpoint]:
        """``dict.popitem``, keeping the index."""
        run_id, cp = super().popitem()
        self._unindex(run_id)
        self._unclaim(run_id)
        return run_id, cp

    def clear(self) -> None:
        """``dict.clear``, and the index with it."""
        super().clear()
        self._by_time = None
        self._due = None

    def setdefault(self, run_id: str, default: Any = None) -> Any:
        """``dict.setdefault``, keeping the index."""
        if run_id not in self:
            self[run_id] = default
        return self[run_id]

    def update(self, *args: Any, **kwargs: Any) -> None:
        """``dict.update``, keeping the index."""
        for run_id, cp in dict(*args, **kwargs).items():
            self[run_id] = cp

    def __ior__(self, other: Any) -> IndexedRuns:  # type: ignore[override,misc]
        self.update(other)
        return self

    # -- reading it ----------------------------------------------------------------------

    def page(
        self, status: str | None, prefix: str, after: _Key | None, limit: int
    ) -> list[Checkpoint]:
        """Return the checkpoints of one ``list_page`` page, newest first."""
        by_time = self._by_time if self._by_time is not None else self._build()
        times = by_time[status]
        end = len(times) if after is None else bisect_left(times, after)
        if limit <= 0:
            return []
        if not prefix:
            keys: Iterable[_Key] = reversed(times[max(0, end - limit) : end])
        else:
            ids = self._by_id[status]
            lo, hi = _prefix_range(ids, prefix)
            # The ids with the prefix are one slice of the by-id list: sort that slice
            # when it is small, else walk the time order and filter. The walk reads about
            # limit * n / m keys for m matches among n, the slice m: take the smaller.
            if (hi - lo) ** 2 <= limit * max(len(times), 1):
                found = (self._indexed[run_id][1] for run_id in ids[lo:hi])
                keys = heapq.nlargest(limit, (k for k in found if after is None or k < after))
            else:
                keys = _walk(times, end, prefix, limit)
        return [self[run_id] for _, run_id in keys]

    def counts(self, prefix: str) -> dict[str, int]:
        """Return ``count_by_status(prefix)`` from the by-id lists."""
        if self._by_time is None:
            self._build()
        counts: dict[str, int] = {}
        for status in STATUSES:
            ids = self._by_id[status]
            lo, hi = _prefix_range(ids, prefix) if prefix else (0, len(ids))
            counts[status] = hi - lo
        return counts

    def claims(self, now: datetime, limit: int, status: str | None, skip: int) -> list[Checkpoint]:
        """Return the checkpoints of ``Store.claimable(now, limit, status=, skip=)``.

        The scan's answer exactly: without ``status``, the first ``limit`` running runs
        in arrival order and the first ``limit`` due queued or waiting runs by (due_at,
        arrival); with it, that kind's page after ``skip`` by (due_at, arrival).
        ``limit`` is at least 0.
        """
        due = self._due if self._due is not None else self._build_claims()
        if status is None:
            running = [self[run_id] for _, run_id in self._running[:limit]]
            kinds = (due["queued"], due["waiting"])
            merged = heapq.merge(
                *(entries[: min(limit, _due_end(entries, now))] for entries in kinds)
            )
            return running + [self[entry[2]] for entry in islice(merged, limit)]
        entries = due[status]
        # A running run is always claimable (its lease is watched, whatever due_at says).
        end = len(entries) if status == "running" else _due_end(entries, now)
        return [self[entry[2]] for entry in entries[skip : min(end, skip + limit)]]

    def ready(self, now: datetime) -> Iterator[Checkpoint]:
        """Yield what ``Store.claim_ready`` may claim by ``now``, earliest due first.

        The queued and waiting runs due by ``now`` and every running run, merged by
        (due_at, arrival); the caller keeps the unowned ones. Lazy: a claim of a few
        runs reads a few entries. Nothing may be written while it is iterated.
        """
        due = self._due if self._due is not None else self._build_claims()
        kinds = [due[status][: _due_end(due[status], now)] for status in ("queued", "waiting")]
        for entry in heapq.merge(*kinds, due["running"]):
            yield self[entry[2]]


def _due_end(entries: list[_Due], now: datetime) -> int:
    """The number of ``entries`` due at or before ``now``."""
    return bisect_right(entries, now, key=lambda entry: entry[0])


def _aware(at: datetime) -> datetime:
    # A naive time is UTC, as every durable backend reads it back: naive and aware
    # times cannot be compared, and one naive due_at must not break every save.
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _prefix_range(ids: list[str], prefix: str) -> tuple[int, int]:
    """The slice of sorted ``ids`` that start with ``prefix``: truncated, they stay sorted."""
    size = len(prefix)
    return (
        bisect_left(ids, prefix, key=lambda run_id: run_id[:size]),
        bisect_right(ids, prefix, key=lambda run_id: run_id[:size]),
    )


def _walk(times: list[_Key], end: int, prefix: str, limit: int) -> list[_Key]:
    found: list[_Key] = []
    for at in range(end - 1, -1, -1):
        key = times[at]
        if key[1].startswith(prefix):
            found.append(key)
            if len(found) == limit:
                break
    return found
