"""What this process remembers of the ``Map`` steps it runs, between looks.

``SEEN``: a child that is done stays done, so a waiting parent's poll reads on from the
first child it has not seen done, up to one still going, instead of every child on
every look (``_suspend.Map``): over a Map's life its polls read each child about once,
where N looks at N children read N * N records.

``LISTED``: the children each parent made here, so a child that ends in this process
looks at a sibling before it loads its parent (``_nudge``): while a sibling is still
going, the parent (whose record lists every child) is not read at all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime
from typing import Generic, TypeVar

__all__ = ["LISTED", "SEEN", "Key", "Listed", "Seen", "nudged"]

K = TypeVar("K")
V = TypeVar("V")

#: (parent run id, Map step name, the parent's ``created_at``).
Key = tuple[str, str, datetime | None]


def nudged(wake_at: datetime | None, due_now_until: datetime) -> bool:
    """Whether the parent looks because it was told (a child's ``nudge`` or a signal
    made it due "now", before ``due_now_until``), not because its poll came round."""
    return wake_at is not None and wake_at < due_now_until


class Bounded(Generic[K, V]):
    """A map of at most ``size`` entries, the least recently written dropped first;
    safe across threads. What both hints below keep."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._items.pop(key, None)


class Seen:
    """How many leading children of each waiting Map this process has seen done.

    A hint only, kept per process (a look by another process starts from the first
    child): a child seen done is not read again by a poll, and the full look that
    merges reads every child anyway, so a child deleted or re-run since is still seen
    there. Keyed by the parent's id, the step's name and the parent's ``created_at`` (a
    run deleted and started again under the same id is another), bounded in size.
    """

    def __init__(self, size: int = 4096) -> None:
        self._seen: Bounded[Key, tuple[int, int]] = Bounded(size)

    def start(self, key: Key, count: int) -> int:
        """Return where a poll of ``count`` children reads from."""
        found = self._seen.get(key)
        return found[1] if found is not None and found[0] == count else 0

    def remember(self, key: Key, count: int, position: int) -> None:
        """Record that the first ``position`` of ``count`` children are done."""
        self._seen.put(key, (count, position))

    def forget(self, key: Key) -> None:
        """Drop the entry of a Map that finished or failed."""
        self._seen.pop(key)


#: The process's one ``Seen``.
SEEN = Seen()


class Listed:
    """The child run ids of the Maps this process ran, by parent run id: a hint only.

    Bounded in size. An entry may be stale (the parent was deleted and started again,
    or retried with other items): ``_nudge`` only ever uses it to learn that a sibling
    is still going, which proves that sibling's own end tells the parent; anything
    else (a sibling missing, all done) takes the full path, which reads the parent.
    """

    def __init__(self, size: int = 1024) -> None:
        self._listed: Bounded[str, tuple[str, ...]] = Bounded(size)

    def get(self, parent: str) -> tuple[str, ...] | None:
        """Return the children ``parent`` listed here last, or None."""
        return self._listed.get(parent)

    def remember(self, parent: str, children: tuple[str, ...]) -> None:
        """Record that ``parent`` made (or is making) ``children``."""
        self._listed.put(parent, children)

    def forget(self, parent: str) -> None:
        """Drop the entry of a parent whose Map finished or failed."""
        self._listed.pop(parent)


#: The process's one ``Listed``.
LISTED = Listed()
