"""What a ``Map`` parent's poll remembers between looks: the children it has seen done.

A child that is done stays done, so a waiting parent's poll reads on from the first
child it has not seen done, up to one still going, instead of every child on every
look (``_suspend.Map``): over a Map's life its polls read each child about once, where
N looks at N children read N * N records.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime

__all__ = ["SEEN", "Key", "Seen", "nudged"]

#: (parent run id, Map step name, the parent's ``created_at``).
Key = tuple[str, str, datetime | None]


def nudged(wake_at: datetime | None, due_now_until: datetime) -> bool:
    """Whether the parent looks because it was told (a child's ``nudge`` or a signal
    made it due "now", before ``due_now_until``), not because its poll came round."""
    return wake_at is not None and wake_at < due_now_until


class Seen:
    """How many leading children of each waiting Map this process has seen done.

    A hint only, kept per process (a look by another process starts from the first
    child): a child seen done is not read again by a poll, and the full look that
    merges reads every child anyway, so a child deleted or re-run since is still seen
    there. Keyed by the parent's id, the step's name and the parent's ``created_at`` (a
    run deleted and started again under the same id is another), bounded in size.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._seen: OrderedDict[Key, tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, key: Key, count: int) -> int:
        """Return where a poll of ``count`` children reads from."""
        with self._lock:
            found = self._seen.get(key)
        return found[1] if found is not None and found[0] == count else 0

    def remember(self, key: Key, count: int, position: int) -> None:
        """Record that the first ``position`` of ``count`` children are done."""
        with self._lock:
            self._seen[key] = (count, position)
            self._seen.move_to_end(key)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def forget(self, key: Key) -> None:
        """Drop the entry of a Map that finished or failed."""
        with self._lock:
            self._seen.pop(key, None)


#: The process's one ``Seen``.
SEEN = Seen()
