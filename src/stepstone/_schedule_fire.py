"""Firing schedules' due slots: the worker's look at ``~schedules``, and ``backfill``.

The protocol (advance, start by slot run id, settle) is described in ``_schedule``.
``fire_due`` is a generator of effects like the worker's claim loop, so the threaded
and the async worker share it; ``SchedulePoller`` is the few lines of state a worker
keeps between looks (when to look next).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Mapping
from datetime import datetime, timedelta
from typing import Any

from . import _clock, _cron, _hooks
from ._checkpoint import ACTIVE_STATUSES, Checkpoint
from ._control import _async, _start, _sync, cancel_op
from ._effects import Effect, Load, Save
from ._errors import ConfigError, ConflictError, RunNotActive, StoreError
from ._observe import logger
from ._schedule import (
    RECORD,
    ScheduleNotFound,
    _record,
    check_name,
    past_slots,
    slot_run_id,
    table_of,
)
from ._steps import Workflow
from ._store import Store
from ._store_time import Now, earliest

__all__ = ["MAX_CATCHUP", "SchedulePoller", "abackfill", "backfill", "fire_due"]

#: Slots of one schedule started by one look under ``catchup="all"``; the rest are
#: started by the next looks (each look is two saves and one start per slot).
MAX_CATCHUP = 1_000
_MAX_TRIES = 100
Op = Generator[Effect, Any, Any]
Served = Mapping[tuple[str, str | None], Workflow]


def _served(spec: dict[str, Any], served: Served) -> Workflow | None:
    return served.get((spec.get("workflow") or "", spec.get("version")))


def _advance(spec: dict[str, Any], now: datetime) -> bool:
    """Move a due schedule's ``next_fire`` past ``now``, listing its slots as pending."""
    due = _cron.parse_slot(spec["next_fire"])
    if spec.get("paused") or due > now:
        return False
    tz = _cron.check_tz(spec["tz"])
    expr = spec["cron"]
    if spec["catchup"] == "all":
        slots = [due, *_cron.slots_between(expr, tz, due, now, MAX_CATCHUP - 1)]
    else:
        latest = _cron.latest_slot(expr, tz, due - timedelta(microseconds=1), now)
        slots = [latest if latest is not None else due]
    spec["pending"] = [*spec.get("pending", []), *(_cron.slot_id(s) for s in slots)]
    spec["skipped"] = int(spec.get("skipped", 0))
    if spec["catchup"] == "latest":
        # Slots passed over for the latest one: counted, never started.
        spec["skipped"] += _missed(expr, tz, due, slots[-1])
    spec["last_fired"] = _cron.slot_id(slots[-1])
    spec["next_fire"] = _cron.slot_id(_cron.next_slot(expr, tz, max(slots[-1], now)))
    if spec["catchup"] == "all" and len(slots) == MAX_CATCHUP:
        spec["next_fire"] = _cron.slot_id(_cron.next_slot(expr, tz, slots[-1]))
    return True


def _missed(expr: str, tz: Any, first: datetime, latest: datetime) -> int:
    # The slots in [first, latest): those in (first, latest] count the same.
    return 0 if latest <= first else len(_cron.slots_between(expr, tz, first, latest, 10_000))


def fire_due(served: Served, now: datetime | None = None) -> Op:
    """Fire the due slots of the schedules of workflows in ``served``.

    Returns the earliest ``next_fire`` among those schedules (None if none), for the
    worker to wake at. Safe to run in any number of workers at once.
    """
    if now is None:
        # The store's clock (``_store_time``), never this host's: a worker whose clock
        # is ahead must not find a slot due before the others do; nor a coarse clock's
        # reading (Cosmos DB's) one due before the server's time has reached it.
        now = earliest((yield Now()))
    for _ in range(_MAX_TRIES):
        cp = yield Load(RECORD)
        if cp is None:
            return None
        table = table_of(cp)
        advanced = False
        for spec in table.values():
            if _served(spec, served) is not None:
                advanced = _advance(spec, now) or advanced
        if advanced:
            try:
                cp = yield Save(_record(cp, table), "schedules fired", owned=False)
            except ConflictError:
                continue  # another worker advanced them: look again
            _hooks.fire("schedule.advanced")  # the crash tests kill here: slots pending
        break
    else:
        raise ConflictError(f"{RECORD}: {_MAX_TRIES} other writers got in first", RECORD)
    soonest: datetime | None = None
    for name, spec in table.items():
        workflow = _served(spec, served)
        if workflow is None:
            continue
        if spec.get("pending") or spec.get("buffered"):
            yield from _settle(name, workflow, spec)
        if not spec.get("paused"):
            due = _cron.parse_slot(spec["next_fire"])
            soonest = due if soonest is None or due < soonest else soonest
    return soonest


def _active(cp: Checkpoint | None) -> bool:
    return cp is not None and cp.status in ACTIVE_STATUSES


def _settle(name: str, workflow: Workflow, spec: dict[str, Any]) -> Op:
    """Start (or skip, buffer, cancel for) ``name``'s pending slots; then record it.

    ``spec`` is as this look read or saved it: another worker may have settled some of
    its slots since, which only makes the starts below no-ops and the record theirs.
    """
    pending: list[str] = list(spec.get("pending") or ())
    last_run: str | None = spec.get("last_run")
    buffered: str | None = spec.get("buffered")
    started = skipped = 0
    for slot in pending:
        run_id = f"sched/{name}/{slot}"
        existing = yield Load(run_id)
        if existing is not None:
            started += 1  # started by a worker that died before recording it
        else:
            overlap = spec["overlap"]
            previous = None
            if overlap != "allow" and last_run is not None:
                previous = yield Load(last_run)
            busy = _active(previous)
            if busy and overlap == "skip":
                skipped += 1
                continue
            if busy and overlap == "buffer_one":
                if buffered is None:
                    buffered = slot
                else:
                    skipped += 1
                continue
            if busy and overlap == "cancel_previous" and last_run is not None:
                with contextlib.suppress(RunNotActive):  # it may have ended meanwhile
                    yield from cancel_op(last_run)
            yield from _start(workflow, run_id, _input(spec, name, slot))
            started += 1
            logger.info("schedule %r: fired slot %s as run %r", name, slot, run_id)
            _hooks.fire("schedule.started")  # the crash tests kill here: started, unrecorded
        last_run = run_id
    if buffered is not None and buffered not in pending:
        previous = None if last_run is None else (yield Load(last_run))
        if not _active(previous):
            run_id = f"sched/{name}/{buffered}"
            yield from _start(workflow, run_id, _input(spec, name, buffered))
            logger.info("schedule %r: fired buffered slot %s as run %r", name, buffered, run_id)
            started += 1
            last_run, buffered = run_id, None
    yield from _record_settled(
        name, pending, spec.get("buffered"), last_run, buffered, started, skipped
    )


def _input(spec: dict[str, Any], name: str, slot: str) -> dict[str, Any]:
    return {**(spec.get("input") or {}), "schedule": name, "slot": slot}


def _record_settled(
    name: str,
    pending: list[str],
    was_buffered: str | None,
    last_run: str | None,
    buffered: str | None,
    started: int,
    skipped: int,
) -> Op:
    for _ in range(_MAX_TRIES):
        cp = yield Load(RECORD)
        table = table_of(cp)
        spec = table.get(name)
        if spec is None:
            return
        now_pending = list(spec.get("pending") or ())
        if now_pending[: len(pending)] != pending or spec.get("buffered") != was_buffered:
            return  # another worker settled these slots first: its record stands
        spec["pending"] = now_pending[len(pending) :]
        spec["last_run"] = last_run
        spec["buffered"] = buffered
        spec["fired"] = int(spec.get("fired", 0)) + started
        spec["skipped"] = int(spec.get("skipped", 0)) + skipped
        try:
            yield Save(_record(cp, table), f"schedule {name} settled", owned=False)
        except ConflictError:
            continue
        return
    raise ConflictError(f"schedule {name!r}: {_MAX_TRIES} other writers got in first", RECORD)


def _backfill(name: str, workflow: Workflow, start: datetime, end: datetime) -> Op:
    check_name(name)
    if not isinstance(workflow, Workflow):
        raise ConfigError(f"backfill needs the schedule's Workflow, got {type(workflow).__name__}")
    for name_, value in (("start", start), ("end", end)):
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ConfigError(
                f"backfill needs a timezone-aware datetime as {name_}, got {value!r} "
                "(e.g. datetime(2030, 1, 1, tzinfo=UTC))"
            )
    cp = yield Load(RECORD)
    spec = table_of(cp).get(name)
    if spec is None:
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    if (spec["workflow"], spec.get("version")) != workflow.key:
        raise ConfigError(
            f"schedule {name!r} starts workflow {spec['workflow']!r} version "
            f"{spec.get('version')!r}, not {workflow.name!r} version {workflow.version!r}"
        )
    run_ids: list[str] = []
    for slot in past_slots(spec, start, end, MAX_CATCHUP * 10):
        run_id = slot_run_id(name, slot)
        yield from _start(workflow, run_id, _input(spec, name, _cron.slot_id(slot)))
        run_ids.append(run_id)
    return run_ids


def backfill(
    store: Store, name: str, workflow: Workflow, start: datetime, end: datetime
) -> list[str]:
    """Start ``name``'s slots in ``[start, end]`` that have no run yet; return their run ids.

    A slot whose run exists (fired, or backfilled before) is left as it is: backfilling
    twice, or over fired slots, starts nothing twice. Up to 10,000 slots per call (the
    oldest); call again from the last one for more. Overlap policies do not apply.

    Raises:
        ScheduleNotFound: no schedule has that name.
        ConfigError: naive datetimes, or ``workflow`` is not the schedule's.
    """
    result: list[str] = _sync(_backfill(name, workflow, start, end), store)
    return result


async def abackfill(
    store: Store, name: str, workflow: Workflow, start: datetime, end: datetime
) -> list[str]:
    """Async ``backfill``."""
    result: list[str] = await _async(_backfill(name, workflow, start, end), store)
    return result


class SchedulePoller:
    """A worker's look at the schedules: at most every ``every`` seconds, or when due."""

    __slots__ = ("every", "next_look")

    def __init__(self, every: float) -> None:
        self.every = max(0.05, every)
        # The first look one poll after the worker starts: its first look at the claim
        # index comes first (a worker started for a backlog starts on it at once).
        self.next_look = _clock.monotonic() + self.every

    def look(self, served: Served) -> Op:
        """Fire what is due if it is time to look; return the soonest slot to wake at."""
        began = _clock.monotonic()
        if began < self.next_look or not served:
            return None
        self.next_look = began + self.every
        try:
            soonest: datetime | None = yield from fire_due(served)
        except StoreError as exc:
            logger.warning("looking at the schedules failed: %s", exc)
            return None
        except Exception:  # noqa: BLE001 - as a failed claim: logged, the worker lives on
            logger.exception("looking at the schedules failed; trying again in %gs", self.every)
            return None
        if soonest is not None:
            at: datetime = yield Now()
            left = (soonest - at).total_seconds()
            self.next_look = min(self.next_look, began + max(0.0, left))
        return soonest
