"""``Worker``: claims runs that need work and drives them, until stopped.

A worker polls the store's claim index (``Store.claimable``: running runs, and queued
or waiting runs that are due) and claims runs by compare-and-swap, never by a lock or a
second coordinator: workers on many hosts share one store and nothing else.

- A run nobody owns (queued, due, or given back) is claimed at once.
- A run with an owner is watched: the worker remembers its version and, on its own
  monotonic clock, when it first saw it. Once that version has not changed for the
  owner's whole recorded lease, the owner is presumed dead and the run is taken over
  (a claim that bumps the epoch, fencing the old owner). Wall clocks are never
  compared, so hosts whose clocks disagree neither strand nor steal runs.
- A run recorded under a workflow (name, version) this worker does not serve is left
  alone for a worker that does, and logged once.

The claim decision is ``_Watch``, shared by ``serve`` (threads running ``run``'s
driver) and ``aserve`` (tasks running ``arun``'s); only the waiting and spawning differ.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import _lease
from ._checkpoint import Checkpoint, utcnow
from ._core import Interrupted, Plan, _ready
from ._errors import (
    ConflictError,
    InvalidWorkflow,
    RunCancelled,
    StepFailed,
    StepstoneError,
    StoreError,
    Suspended,
)
from ._observe import logger
from ._runner import adrive, drive, make_plan
from ._steps import Workflow
from ._store import RunInfo, Store
from ._suspend import Map

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_GRACE", "DEFAULT_POLL", "Worker"]

DEFAULT_CONCURRENCY = 8
#: Seconds between looks at the claim index when there is nothing to do.
DEFAULT_POLL = 1.0
#: Seconds a stopping worker lets steps in flight finish before it gives up on them.
DEFAULT_GRACE = 30.0
_CLAIM_BATCH = 100


def _index(
    workflows: Iterable[Workflow] | Mapping[Any, Workflow],
) -> dict[tuple[str, str | None], Workflow]:
    items = workflows.values() if isinstance(workflows, Mapping) else workflows
    if isinstance(items, (str, bytes, Workflow)):
        raise InvalidWorkflow("workflows must be a list or dict of Workflow objects")
    table: dict[tuple[str, str | None], Workflow] = {}
    pending = list(items)
    while pending:
        workflow = pending.pop()
        if not isinstance(workflow, Workflow):
            raise InvalidWorkflow(
                f"workflows must be Workflow objects, got {type(workflow).__name__}"
            )
        known = table.get(workflow.key)
        if known is not None and known is not workflow and known.steps != workflow.steps:
            raise InvalidWorkflow(
                f"two different workflows are named {workflow.name!r} version {workflow.version!r}"
            )
        if known is None:
            table[workflow.key] = workflow
            # A Map's child workflow is served too: its children must run somewhere.
            pending.extend(step.workflow for step in workflow.steps if isinstance(step, Map))
    if not table:
        raise InvalidWorkflow("a worker needs at least one Workflow to serve")
    return table


class _Watch:
    """Which runs to claim now, from what the claim index shows over time (no I/O).

    For each run another owner holds it remembers the version seen, when (monotonic)
    that version was first seen, and the owner's lease once a load told it. A run is
    loaded only to learn its lease (once) and when that lease may have passed, not on
    every poll: watching a thousand busy runs costs no reads.
    """

    def __init__(self) -> None:
        # run_id -> [version seen, monotonic time first seen at that version, lease]
        self.seen: dict[str, list[Any]] = {}
        self.unserved: set[tuple[str | None, str | None]] = set()

    def pick(self, infos: list[RunInfo], busy: set[str], now: float) -> list[RunInfo]:
        """Return the runs worth loading to claim, in the index's order."""
        picked: list[RunInfo] = []
        present = set()
        for info in infos:
            present.add(info.run_id)
            if info.run_id in busy:
                continue
            if info.owner is None:
                picked.append(info)
                continue
            seen = self.seen.get(info.run_id)
            if seen is None:
                self.seen[info.run_id] = [info.version, now, None]
                picked.append(info)  # loaded once, to learn the owner's lease
                continue
            if seen[0] != info.version:
                seen[0], seen[1] = info.version, now
                continue
            if seen[2] is None or now - seen[1] >= seen[2]:
                picked.append(info)
        for run_id in list(self.seen):
            if run_id not in present:
                del self.seen[run_id]
        return picked

    def expired(self, cp: Checkpoint, now: float) -> bool:
        """Return whether ``cp``'s owner let its whole lease pass unrenewed, by our clock."""
        lease = cp.lease or _lease.DEFAULT_LEASE
        seen = self.seen.get(cp.run_id)
        if seen is None or seen[0] != cp.version:
            self.seen[cp.run_id] = [cp.version, now, lease]
            return False
        seen[2] = lease
        return bool(now - seen[1] >= lease)


class Worker:
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
        poll: Seconds between looks at the store when idle. Default 1.
        grace: Seconds ``stop`` lets steps in flight finish. Default 30.
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
    ) -> None:
        if not isinstance(store, Store):
            raise InvalidWorkflow(f"store must be a stepstone Store, got {type(store).__name__}")
        if (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or not 1 <= concurrency <= 10_000
        ):
            raise InvalidWorkflow(
                f"concurrency must be an int from 1 to 10000, got {concurrency!r}"
            )
        for name, value in (("poll", poll), ("grace", grace)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 86_400
            ):
                raise InvalidWorkflow(f"{name} must be seconds from 0 to 86400, got {value!r}")
        self.store = store
        self.workflows = _index(workflows)
        self.concurrency = concurrency
        self.lease = _lease.check_lease(lease)
        self.poll = float(poll)
        self.grace = float(grace)
        self.owner = _lease.new_owner("worker")
        self._watch = _Watch()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._plans: dict[str, Plan] = {}
        self._lock = threading.Lock()
        self._async_wake: tuple[Any, Any] | None = None
        self.completed = 0

    def __repr__(self) -> str:
        return f"Worker(owner={self.owner!r}, concurrency={self.concurrency}, lease={self.lease:g})"

    # --- control ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; runs in flight give their lease back at their next step boundary.

        Thread-safe and idempotent; may be called from a signal handler. ``serve`` and
        ``aserve`` return once the runs in flight have handed over, or after ``grace``.
        """
        self._stopping.set()
        self._wake.set()
        with self._lock:
            for plan in self._plans.values():
                plan.stop_requested = True
            waker = self._async_wake
        if waker is not None:
            loop, event = waker
            # RuntimeError: the loop is closed, aserve has returned already.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stopping.is_set()

    def _busy(self) -> set[str]:
        with self._lock:
            return set(self._plans)

    # --- the claim, shared by both loops ------------------------------------------------

    def _plan_for(self, cp: Checkpoint, asynchronous: bool) -> Plan | None:
        """Return the plan to drive ``cp`` by, or None if this worker must leave it."""
        workflow = self.workflows.get((cp.workflow or "", cp.workflow_version))
        if workflow is None:
            key = (cp.workflow, cp.workflow_version)
            if key not in self._watch.unserved:
                self._watch.unserved.add(key)
                logger.warning(
                    "run %r: workflow %r version %r is not served by this worker; left for "
                    "a worker that serves it",
                    cp.run_id,
                    cp.workflow,
                    cp.workflow_version,
                )
            return None
        plan = make_plan(
            cp.run_id,
            workflow,
            self.store,
            input=None,
            lease=self.lease,
            owner=self.owner,
            asynchronous=asynchronous,
        )
        if cp.status == "waiting" and not _ready(plan, cp):
            return None
        return plan

    def _claimable(self, cp: Checkpoint | None, now: float) -> Checkpoint | None:
        """Return the record to claim from, or None if ``cp`` needs nothing from us now."""
        if cp is None or cp.status not in ("queued", "running", "waiting"):
            return None
        if cp.status == "queued" and cp.cancel_requested:
            return None
        if cp.owner is None:
            return cp
        if cp.owner == self.owner and cp.run_id in self._busy():
            return None
        if not self._watch.expired(cp, now):
            return None
        logger.warning(
            "run %r: owner %r did not renew its %gs lease; taking it over",
            cp.run_id,
            cp.owner,
            cp.lease or _lease.DEFAULT_LEASE,
        )
        return _lease.released(cp)

    def _claim_record(self, cp: Checkpoint) -> Checkpoint:
        return _lease.claimed(cp, self.owner, self.lease)

    def _finished(self, run_id: str, outcome: str) -> None:
        with self._lock:
            self._plans.pop(run_id, None)
            self.completed += 1
        logger.info("run %r: %s", run_id, outcome)
        self._wake.set()

    @staticmethod
    def _outcome(exc: BaseException | None) -> str:
        if exc is None:
            return "done"
        if isinstance(exc, Suspended):
            return f"waiting for {exc.waiting_for}"
        if isinstance(exc, RunCancelled):
            return "cancelled"
        if isinstance(exc, Interrupted):
            return "handed over"
        if isinstance(exc, StepFailed):
            return f"failed at step {exc.step_index} ({exc.step_name!r})"
        if isinstance(exc, ConflictError):
            return f"given up: {exc}"
        return f"stopped: {type(exc).__name__}: {exc}"

    # --- serve: threads -----------------------------------------------------------------

    def serve(self) -> None:
        """Serve until ``stop`` is called, driving runs in up to ``concurrency`` threads."""
        for workflow in self.workflows.values():
            for step in workflow.steps:
                if getattr(step, "is_async", False):
                    raise InvalidWorkflow(
                        f"workflow {workflow.name!r} has the async step {step.name!r}: "
                        "serve it with `await worker.aserve()`, not worker.serve()"
                    )
        # Imported here: a process that only starts runs or calls the CLI never pays for it.
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        logger.info("%r: serving %d workflows", self, len(self.workflows))
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="stepstone-worker")
        futures: set[Future[None]] = set()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                free = self.concurrency - len(self._busy())
                if free > 0:
                    for plan in self._claim_some(free):
                        futures.add(pool.submit(self._drive, plan))
                futures = {f for f in futures if not f.done()}
                self._wake.wait(self.poll)
            self._drain(futures)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        logger.info("%r: stopped", self)

    def _drain(self, futures: set[Future[None]]) -> None:
        deadline = time.monotonic() + self.grace
        for future in futures:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(Exception):
                future.result(timeout=left)
        stuck = self._busy()
        if stuck:
            logger.warning(
                "%r: %d runs still in a step after the %gs grace; their leases expire by "
                "themselves",
                self,
                len(stuck),
                self.grace,
            )

    def _claim_some(self, free: int) -> list[Plan]:
        try:
            infos = self.store.claimable(utcnow(), _CLAIM_BATCH)
        except StoreError as exc:
            logger.warning("%r: cannot read the claim index: %s", self, exc)
            return []
        plans: list[Plan] = []
        for info in self._watch.pick(infos, self._busy(), time.monotonic()):
            if len(plans) >= free or self._stopping.is_set():
                break
            try:
                # The time *before* the read: the version it returns was current at some
                # moment after this, so a lease counted from here is never too short.
                began = time.monotonic()
                cp = self._claimable(self.store.load(info.run_id), began)
                if cp is None:
                    continue
                plan = self._plan_for(cp, asynchronous=False)
                if plan is None:
                    continue
                claimed = self.store.save(self._claim_record(cp))
            except ConflictError:
                continue  # another worker won this claim
            except StepstoneError as exc:
                logger.warning("run %r: not claimed: %s", info.run_id, exc)
                continue
            self._adopt(plan, claimed)
            plans.append(plan)
        return plans

    def _adopt(self, plan: Plan, claimed: Checkpoint) -> None:
        plan.preclaimed = plan.current = claimed
        plan.written_at = time.monotonic()
        with self._lock:
            self._plans[plan.run_id] = plan
            if self._stopping.is_set():
                plan.stop_requested = True

    def _drive(self, plan: Plan) -> None:
        error: BaseException | None = None
        try:
            drive(plan, self.store)
        except StepstoneError as exc:
            error = exc
        except Exception as exc:  # a bug or a store outside the tree: logged, not fatal
            logger.exception("run %r: unexpected error", plan.run_id)
            error = exc
        except BaseException as exc:  # a step raised KeyboardInterrupt, SystemExit...
            logger.exception("run %r: stopped by %s", plan.run_id, type(exc).__name__)
            error = exc
        finally:
            # Always: a run this worker no longer drives is claimable again, its slot free.
            self._finished(plan.run_id, self._outcome(error))

    # --- aserve: tasks ------------------------------------------------------------------

    async def aserve(self) -> None:
        """Serve until ``stop`` is called, driving runs as up to ``concurrency`` tasks.

        Cancelling the task that awaits ``aserve`` stops at once: each run's step in
        flight is cancelled and its lease given back.
        """
        import asyncio  # noqa: PLC0415

        logger.info("%r: serving %d workflows (async)", self, len(self.workflows))
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        with self._lock:
            self._async_wake = (loop, wake)
        try:
            while not self._stopping.is_set():
                wake.clear()
                free = self.concurrency - len(self._busy())
                if free > 0:
                    for plan in await self._aclaim_some(free):
                        task = asyncio.create_task(self._adrive(plan, wake))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self.poll)
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=self.grace)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=10)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                # Let each cancelled run give its lease back before the loop goes away.
                await asyncio.wait(tasks, timeout=10)
            with self._lock:
                self._async_wake = None
        logger.info("%r: stopped", self)

    async def _aclaim_some(self, free: int) -> list[Plan]:
        try:
            infos = await self.store.aclaimable(utcnow(), _CLAIM_BATCH)
        except StoreError as exc:
            logger.warning("%r: cannot read the claim index: %s", self, exc)
            return []
        plans: list[Plan] = []
        for info in self._watch.pick(infos, self._busy(), time.monotonic()):
            if len(plans) >= free or self._stopping.is_set():
                break
            try:
                began = time.monotonic()
                cp = self._claimable(await self.store.aload(info.run_id), began)
                if cp is None:
                    continue
                plan = self._plan_for(cp, asynchronous=True)
                if plan is None:
                    continue
                claimed = await self.store.asave(self._claim_record(cp))
            except ConflictError:
                continue
            except StepstoneError as exc:
                logger.warning("run %r: not claimed: %s", info.run_id, exc)
                continue
            self._adopt(plan, claimed)
            plans.append(plan)
        return plans

    async def _adrive(self, plan: Plan, wake: Any) -> None:
        import asyncio  # noqa: PLC0415

        error: BaseException | None = None
        try:
            await adrive(plan, self.store)
        except StepstoneError as exc:
            error = exc
        except Exception as exc:
            logger.exception("run %r: unexpected error", plan.run_id)
            error = exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # aserve is stopping this run
            logger.exception("run %r: a step raised CancelledError", plan.run_id)
        except BaseException as exc:
            logger.exception("run %r: stopped by %s", plan.run_id, type(exc).__name__)
            error = exc
        finally:
            wake.set()
            self._finished(plan.run_id, self._outcome(error))
