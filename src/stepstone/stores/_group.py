"""Group commit: concurrent saves in one process share one transaction and its fsync.

Shape: leader and followers, no committer thread. A save that finds no commit in
progress *is* the committer: it runs its own statement and commits at once, on its own
thread and connection, so a lone save waits for nothing but its fsync. A save that
arrives while a commit is in progress queues and sleeps. When the commit finishes, the
leader wakes every save of its batch with its outcome and hands leadership to the first
queued save, which takes the *whole* queue as the next batch. So a batch is exactly what
was waiting when the previous commit finished; nothing is delayed to fill a batch.

Each save keeps its own outcome: the batch's ``execute`` records, per save, the rows its
statement changed (0: its compare-and-swap lost, it alone fails with ``ConflictError``)
or the error its statement raised (it alone fails). An error of the batch as a whole
(``BEGIN``, ``COMMIT``, a kill-point hook) fails every save of the batch that had no
error of its own: none of them was committed.

A save returns only after the ``COMMIT`` containing it returned: followers are woken
after it, never before. A waiter interrupted while queued (``KeyboardInterrupt``) is
taken out of the queue, so it lands whole or not at all; one interrupted while its batch
runs lands with that batch.

Fork: a child process has none of the parent's threads, so ``reset`` gives it a fresh,
empty committer; it never waits for a leader that lives in the parent.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from .._errors import StoreError

__all__ = ["GroupCommit", "Pending"]

_QUEUED: Final = 0
_LEAD: Final = 1
_DONE: Final = 2


class Pending:
    """One save waiting to be committed: its statement, then its outcome."""

    __slots__ = ("error", "event", "first", "params", "sql", "state", "stored")

    def __init__(self, sql: str, params: Any, first: tuple[tuple[str, Any], ...] = ()) -> None:
        self.sql = sql
        self.params = params
        #: Statements run before ``sql`` in its transaction, landing only with it (the
        #: save's pieces: ``effects.Exec.first``).
        self.first = first
        #: Rows the statement changed (1: stored; 0: the compare-and-swap lost).
        self.stored: int | None = None
        #: The error this save raises, if any (its own, or its batch's).
        self.error: BaseException | None = None
        self.state = _QUEUED
        # Created only for a save that has to wait: a lone save never needs one.
        self.event: threading.Event | None = None


class GroupCommit:
    """Batches concurrent saves into shared transactions (see the module docstring).

    Args:
        execute: Runs one batch in one transaction: sets each item's ``stored`` or
            ``error`` and returns once the commit returned; raises for a failure of
            the whole batch.
        where: Names the store in the errors given to followers of a failed batch.
    """

    def __init__(self, execute: Callable[[list[Pending]], None], where: str) -> None:
        self._execute = execute
        self._where = where
        self.reset()

    def reset(self) -> None:
        """Forget every waiter and leader (a forked child: those threads are gone)."""
        self._lock = threading.Lock()
        self._queue: list[Pending] = []
        self._leading = False
        #: How many batches of each size committed (for tests and benchmarks).
        self.batch_sizes: Counter[int] = Counter()
        #: Test seam: called with each batch after its COMMIT returned, before any of
        #: its saves is woken.
        self.after_commit: Callable[[list[Pending]], None] | None = None

    def submit(self, item: Pending) -> None:
        """Return once ``item`` is committed or failed (its ``stored`` or ``error`` set)."""
        with self._lock:
            if self._leading:
                item.event = threading.Event()
                self._queue.append(item)
                lead = False
            else:
                self._leading = True
                lead = True
        if lead:
            # A lone save, the common case, inlined: it commits at once, on this thread.
            try:
                self._execute([item])
            except BaseException as exc:  # noqa: BLE001 - the save's outcome: submit raises it
                item.error = exc
            else:
                self._committed([item])
            with self._lock:
                following = self._handoff()
            item.state = _DONE
            if following is not None:
                self._wake(following)
            return
        self._wait(item)
        if item.state == _DONE:
            return
        # Handed leadership: the batch is everything queued now, this save included.
        with self._lock:
            batch, self._queue = self._queue, []
        self._lead(batch)

    def submit_many(self, items: list[Pending]) -> None:
        """Return once every one of ``items`` is committed or failed, all in ONE batch.

        ``Store.save_many``: the items are queued together (or led together), so the
        batch that takes the first takes them all, and they share its transaction and
        commit; each keeps its own outcome, as any save of a batch does.
        """
        if len(items) == 1:
            self.submit(items[0])
            return
        with self._lock:
            if self._leading:
                for item in items:
                    item.event = threading.Event()
                self._queue.extend(items)
                lead = False
            else:
                self._leading = True
                lead = True
        if lead:
            self._lead(items)
            return
        first = items[0]
        assert first.event is not None
        try:
            first.event.wait()
        except BaseException:
            with self._lock:
                # Still queued (all of them: they were queued at once and are taken at
                # once): none lands. Already in a batch: they land with it.
                if first in self._queue:
                    for item in items:
                        self._queue.remove(item)
                    following = self._handoff() if first.state == _LEAD else None
                else:
                    following = None
            if following is not None:
                self._wake(following)
            raise
        if first.state != _DONE:
            # Handed leadership: the batch is everything queued now, all of ours included.
            with self._lock:
                batch, self._queue = self._queue, []
            self._lead(batch)
            return
        for item in items[1:]:  # in the batch the first was in: done with it
            assert item.event is not None
            item.event.wait()

    def _wait(self, item: Pending) -> None:
        event = item.event
        assert event is not None
        try:
            event.wait()
        except BaseException:
            # Interrupted while waiting: leave nothing half done behind.
            with self._lock:
                if item not in self._queue:
                    raise  # done, or in the batch being committed: it lands with it
                self._queue.remove(item)  # not yet in a batch: it will not land
                handed = item.state == _LEAD
                following = self._handoff() if handed else None
            if following is not None:
                self._wake(following)
            raise

    def _handoff(self) -> Pending | None:
        """Under the lock: make the first queued save the leader, or stop leading."""
        if self._queue:
            following = self._queue[0]
            following.state = _LEAD
            return following
        self._leading = False
        return None

    @staticmethod
    def _wake(item: Pending) -> None:
        assert item.event is not None
        item.event.set()

    def _lead(self, batch: list[Pending]) -> None:
        try:
            self._execute(batch)
        except BaseException as exc:  # noqa: BLE001 - every waiter of the batch raises it
            self._fail(batch, exc)
        else:
            self._committed(batch)
        finally:
            with self._lock:
                following = self._handoff()
            # The leader's own item (batch[0] of a lone save, or the handed one) is
            # done too; only the others sleep.
            for other in batch:
                other.state = _DONE
                if other.event is not None:
                    other.event.set()
            if following is not None:
                self._wake(following)

    def _committed(self, batch: list[Pending]) -> None:
        sizes = self.batch_sizes
        size = len(batch)
        sizes[size] = sizes.get(size, 0) + 1
        hook = self.after_commit
        if hook is not None:
            hook(batch)

    def _fail(self, batch: list[Pending], exc: BaseException) -> None:
        """The batch as a whole failed: every save without an error of its own fails."""
        leader = batch[0]
        for item in batch:
            if item.error is not None:
                continue
            item.stored = None
            item.error = exc if item is leader else self._shared(exc)

    def _shared(self, exc: BaseException) -> BaseException:
        """A follower's own copy of the batch's error (each thread raises its own)."""
        clone: BaseException
        if isinstance(exc, Exception):
            try:
                clone = copy.copy(exc)
            except Exception:  # noqa: BLE001 - an error that cannot be copied is described
                clone = StoreError(f"{self._where}: {type(exc).__name__}: {exc}")
        else:
            clone = StoreError(
                f"{self._where}: the shared commit was interrupted "
                f"({type(exc).__name__}); this save was not committed"
            )
        clone.__traceback__ = None
        clone.__cause__ = exc
        return clone
