"""``Worker``: claims runs that need work and drives them, until stopped.

The public class: its arguments, checked (``_config``), and what it is made of. The
claim loop is one object the worker composes (``_claims.Claims``); ``serve`` performs
it with threads (``_threads``), ``aserve`` with tasks (``_tasks``); ``stop`` and
``abandon`` are the drivers' shared base (``_base``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from .. import _clock, _lease
from .._checks import check_clock
from .._sigevent import SignalSafeEvent
from .._steps import Workflow
from .._store import Store
from ._claims import Claims
from ._config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_POLL,
    check_max_runs,
    check_numbers,
    index,
)
from ._tasks import TaskDriver
from ._threads import ThreadDriver

__all__ = ["Worker"]


class Worker(ThreadDriver, TaskDriver):
    """Claims runs that need work (queued, due, interrupted) and drives them to their end.

    Args:
        store: The store to serve; shared with any number of workers on any hosts.
        workflows: A list or dict of the ``Workflow`` objects this worker may run (the
            child workflows of their ``Map`` steps are served too).
        concurrency: Runs driven at once (threads under ``serve``, tasks under
            ``aserve``). Default 8.
        lease: Seconds (or ``timedelta``) of each claim; renewed every third of it while
            a step runs. Shorter moves a dead worker's runs sooner; longer renews less
            often. Default 30.
        poll: Seconds between looks at the store when idle: the fallback. The worker
            is woken sooner by a ring (a run started, signalled, or a child done, in
            this process or, where the store can push, ``Store.listen``, in another)
            and by the due time of a run it suspended (a ``Sleep``, a timeout). Where
            the store cannot push, it looks quickly after activity and backs off to
            ``poll`` when idle. Default 1.
        grace: Seconds ``stop`` lets steps in flight finish. Default 30.
        max_runs: Executions this worker claims before it stops claiming; ``serve`` and
            ``aserve`` return once they have ended (none is handed back, as ``stop``
            does). A run resumed after a wait is claimed again and counts again. For a
            worker replaced after so many runs, or a job that drains a known number.
            Default None: until ``stop``.
        clock: The clock ``serve`` and ``aserve`` read (rests, leases, timers, the runs
            they drive), in place of the installed one (``stepstone.testing.use_clock``);
            a ``stepstone.testing.FakeClock`` in tests. Default: the installed clock.
    """

    def __init__(
        self,
        store: Store,
        workflows: Iterable[Workflow] | Mapping[Any, Workflow],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float | timedelta = _lease.DEFAULT_LEASE,
        poll: float = DEFAULT_POLL,
        grace: float = DEFAULT_GRACE,
        max_runs: int | None = None,
        clock: _clock.Clock | None = None,
    ) -> None:
        check_numbers(store, concurrency, poll, grace)
        self.max_runs = check_max_runs(max_runs)
        self.clock = check_clock(clock)
        self.store = store
        self.workflows = index(workflows)
        self.concurrency = concurrency
        self.lease = _lease.check_lease(lease)
        self.poll = float(poll)
        self.grace = float(grace)
        self.owner = _lease.new_owner("worker")
        self._stopping = SignalSafeEvent()
        self._wake = SignalSafeEvent()
        self._async_wake = None
        self._claims = Claims(
            store,
            self.workflows,
            owner=self.owner,
            lease=self.lease,
            poll=self.poll,
            concurrency=concurrency,
            limit=self.max_runs,
            stopping=self._stopping,
            wake=self._wake,
            label=repr(self),
        )
