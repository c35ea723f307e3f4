"""Schedules: stored cron specs whose slots any worker fires, each exactly once.

A schedule is an entry of one record, ``~schedules`` (a finished run of no steps, so
no worker claims it and every backend stores it like any run): the cron expression,
its time zone, the workflow, the input, the overlap and catch-up policies, and where
firing stands (``next_fire``, the ``pending`` slots, the last run started).

Firing is two compare-and-swap writes and an idempotent start, so that it needs no
scheduler process and no lock (``_schedule_fire``):

1. a worker that finds ``next_fire`` due advances it and lists the slots it covers as
   ``pending``, in one save: two workers racing on it conflict, one wins;
2. it starts each pending slot's run, ``sched/<name>/<slot UTC>``: ``start`` of an
   existing run id is a no-op, so a slot started twice (a crash between 2 and 3, a
   frozen worker waking up) is one run;
3. it removes the slots from ``pending`` (and records the last run), in a second save.

A crash anywhere leaves the slots in ``pending``; the next worker to look repeats 2
and 3. So each slot fires exactly once however many workers look, crash or freeze, and
whatever their clocks say: a skewed clock can only fire a slot early or late, never
twice, as its run id is its slot's.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from . import _cron
from ._checkpoint import Checkpoint, evolve
from ._codec import encode_state
from ._control import _async, _sync
from ._effects import Effect, Load, Save
from ._errors import ConfigError, ConflictError, ScheduleExists, ScheduleNotFound
from ._steps import Workflow
from ._store import Store
from ._store_time import Now

__all__ = [
    "CATCHUP",
    "OVERLAP",
    "RECORD",
    "ScheduleExists",
    "ScheduleInfo",
    "ScheduleNotFound",
    "adelete_schedule",
    "aschedule",
    "aschedules",
    "delete_schedule",
    "pause_schedule",
    "resume_schedule",
    "schedule",
    "schedules",
    "slot_run_id",
    "table_of",
]

#: The run id of the record holding every schedule. ``~`` sorts it after the runs.
RECORD = _cron.RECORD
OVERLAP = ("skip", "buffer_one", "allow", "cancel_previous")
CATCHUP = ("latest", "all")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_MAX_TRIES = 100

Overlap = Literal["skip", "buffer_one", "allow", "cancel_previous"]
Catchup = Literal["latest", "all"]
Op = Generator[Effect, Any, Any]


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as stored: its spec and where firing stands."""

    name: str
    cron: str
    tz: str
    workflow: str
    workflow_version: str | None
    input: dict[str, Any]
    overlap: str
    catchup: str
    paused: bool
    next_fire: datetime
    last_fired: datetime | None
    last_run: str | None
    pending: tuple[str, ...]
    buffered: str | None
    fired: int
    skipped: int

    @classmethod
    def of(cls, name: str, spec: dict[str, Any]) -> ScheduleInfo:
        """Return the schedule ``name`` from its stored ``spec``."""
        last = spec.get("last_fired")
        return cls(
            name=name,
            cron=spec["cron"],
            tz=spec["tz"],
            workflow=spec["workflow"],
            workflow_version=spec.get("version"),
            input=copy.deepcopy(spec.get("input") or {}),
            overlap=spec["overlap"],
            catchup=spec["catchup"],
            paused=bool(spec.get("paused")),
            next_fire=_cron.parse_slot(spec["next_fire"]),
            last_fired=None if last is None else _cron.parse_slot(last),
            last_run=spec.get("last_run"),
            pending=tuple(spec.get("pending") or ()),
            buffered=spec.get("buffered"),
            fired=int(spec.get("fired", 0)),
            skipped=int(spec.get("skipped", 0)),
        )


def slot_run_id(name: str, slot: datetime) -> str:
    """Return the run id of schedule ``name``'s slot at ``slot``: ``sched/NAME/2026-...Z``."""
    return f"sched/{name}/{_cron.slot_id(slot)}"


def check_name(name: object) -> str:
    """Return ``name`` if it can name a schedule, else raise ``ConfigError``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"a schedule name must be 1-100 characters of letters, digits, '_', '.' and '-', "
            f"starting with a letter or digit; got {name!r}"
        )
    return name


def table_of(cp: Checkpoint | None) -> dict[str, dict[str, Any]]:
    """Return the schedules stored in the record (a copy the caller may change)."""
    if cp is None:
        return {}
    table = cp.state.get("schedules")
    if not isinstance(table, dict):
        return {}
    # One level deep: every change replaces a spec's field, never mutates a value in it.
    return {name: dict(spec) for name, spec in table.items()}


def _record(base: Checkpoint | None, table: dict[str, dict[str, Any]]) -> Checkpoint:
    state = {"schedules": table}
    if base is None:
        return Checkpoint(run_id=RECORD, total_steps=0, state=state)
    return evolve(base, state=state)


def _spec(
    *,
    cron: object,
    tz: object,
    workflow: object,
    input: object,
    overlap: object,
    catchup: object,
    paused: object,
) -> dict[str, Any]:
    """Check every argument; return the stored spec (no firing fields yet)."""
    expr = _cron.check_cron(cron)
    _cron.check_tz(tz)
    if not isinstance(workflow, Workflow):
        raise ConfigError(
            f"workflow must be a stepstone.Workflow (the one workers serve), "
            f"got {type(workflow).__name__}"
        )
    if overlap not in OVERLAP:
        raise ConfigError(f"overlap must be one of {', '.join(OVERLAP)}; got {overlap!r}")
    if catchup not in CATCHUP:
        raise ConfigError(f"catchup must be one of {', '.join(CATCHUP)}; got {catchup!r}")
    if not isinstance(paused, bool):
        raise ConfigError(f"paused must be True or False, got {paused!r}")
    if input is not None and not isinstance(input, dict):
        raise ConfigError(
            f"input must be a JSON object (a dict) or None, got {type(input).__name__}"
        )
    given = encode_state(input or {})[1]  # InvalidState names the path of a non-JSON value
    return {
        "cron": expr,
        "tz": tz,
        "workflow": workflow.name,
        "version": workflow.version,
        "input": given,
        "overlap": overlap,
        "catchup": catchup,
        "paused": paused,
    }


_SPEC_KEYS = ("cron", "tz", "workflow", "version", "input", "overlap", "catchup")


def _next_fire(spec: dict[str, Any], now: datetime) -> str:
    """The slot id of the schedule's first slot after ``now`` (in its time zone)."""
    return _cron.slot_id(_cron.next_slot(spec["cron"], _cron.check_tz(spec["tz"]), now))


def _put(name: str, spec: dict[str, Any], replace: bool) -> Op:
    for _ in range(_MAX_TRIES):
        cp = yield Load(RECORD)
        now = yield Now()  # the store's clock, as the firing workers' (``_store_time``)
        table = table_of(cp)
        old = table.get(name)
        if old is not None:
            same = all(old.get(k) == spec[k] for k in _SPEC_KEYS)
            if same and old.get("paused") == spec["paused"]:
                return ScheduleInfo.of(name, old)
            if not replace:
                differs = [k for k in _SPEC_KEYS if old.get(k) != spec[k]] or ["paused"]
                raise ScheduleExists(
                    f"schedule {name!r} exists with another {', '.join(differs)}; pass "
                    "replace=True (CLI: --replace) to change it, or pick another name"
                )
            entry = {**old, **spec}
            if old.get("cron") != spec["cron"] or old.get("tz") != spec["tz"]:
                entry["next_fire"] = _next_fire(spec, now)
        else:
            entry = {
                **spec,
                "next_fire": _next_fire(spec, now),
                "last_fired": None,
                "last_run": None,
                "pending": [],
                "buffered": None,
                "fired": 0,
                "skipped": 0,
                "created_at": _cron.slot_id(now),
            }
        table[name] = entry
        try:
            yield Save(_record(cp, table), f"schedule {name}", owned=False)
        except ConflictError:
            continue
        return ScheduleInfo.of(name, entry)
    raise ConflictError(f"schedule {name!r}: {_MAX_TRIES} other writers got in first", RECORD)


def schedule(
    store: Store,
    name: str,
    *,
    cron: str,
    workflow: Workflow,
    tz: str = "UTC",
    input: dict[str, Any] | None = None,
    overlap: Overlap = "skip",
    catchup: Catchup = "latest",
    paused: bool = False,
    replace: bool = False,
) -> ScheduleInfo:
    """Store a schedule: every worker serving ``workflow`` fires its slots, each once.

    Each slot starts the run ``sched/<name>/<slot time, UTC>`` of ``workflow`` with
    ``{**input, "schedule": name, "slot": "<slot time, UTC>"}`` as its input. The first
    slot is the first after now; ``backfill`` starts past ones.

    Args:
        store: Where the schedule (and its runs) live.
        name: 1-100 letters, digits, ``_``, ``.``, ``-``.
        cron: Five fields: minute hour day-of-month month day-of-week.
        workflow: The ``Workflow`` to start (workers serving it fire the slots).
        tz: The IANA time zone the cron fields are read in. Default UTC.
        input: The runs' input, a JSON dict.
        overlap: While the previous slot's run is active (queued, running, waiting):
            ``skip`` the new slot, ``buffer_one`` (start it when the previous ends; later
            slots are skipped meanwhile), ``allow`` both, or ``cancel_previous``.
        catchup: Slots missed while no worker looked: start the ``latest`` only, or
            ``all`` of them (oldest first).
        paused: Store it paused (``resume_schedule`` starts it).
        replace: Change a schedule of that name instead of refusing.

    Returns:
        The schedule as stored. The same spec again is a no-op.

    Raises:
        ConfigError: a bad cron, time zone, name, policy or workflow; nothing stored.
        ScheduleExists: another spec holds the name and ``replace`` is False.
        InvalidState: ``input`` is not JSON.
    """
    spec = _spec(
        cron=cron,
        tz=tz,
        workflow=workflow,
        input=input,
        overlap=overlap,
        catchup=catchup,
        paused=paused,
    )
    result: ScheduleInfo = _sync(_put(check_name(name), spec, replace), store)
    return result


async def aschedule(
    store: Store,
    name: str,
    *,
    cron: str,
    workflow: Workflow,
    tz: str = "UTC",
    input: dict[str, Any] | None = None,
    overlap: Overlap = "skip",
    catchup: Catchup = "latest",
    paused: bool = False,
    replace: bool = False,
) -> ScheduleInfo:
    """Async ``schedule``."""
    spec = _spec(
        cron=cron,
        tz=tz,
        workflow=workflow,
        input=input,
        overlap=overlap,
        catchup=catchup,
        paused=paused,
    )
    result: ScheduleInfo = await _async(_put(check_name(name), spec, replace), store)
    return result


def _list() -> Op:
    cp = yield Load(RECORD)
    return [ScheduleInfo.of(name, spec) for name, spec in sorted(table_of(cp).items())]


def schedules(store: Store) -> list[ScheduleInfo]:
    """Return every schedule of ``store``, by name."""
    result: list[ScheduleInfo] = _sync(_list(), store)
    return result


async def aschedules(store: Store) -> list[ScheduleInfo]:
    """Async ``schedules``."""
    result: list[ScheduleInfo] = await _async(_list(), store)
    return result


def _change(name: str, what: str) -> Op:
    check_name(name)
    for _ in range(_MAX_TRIES):
        cp = yield Load(RECORD)
        table = table_of(cp)
        spec = table.get(name)
        if spec is None:
            known = ", ".join(sorted(table)) or "none"
            raise ScheduleNotFound(f"no schedule is named {name!r} (schedules: {known})")
        if what == "delete":
            del table[name]
        elif what == "pause":
            spec["paused"] = True
        else:
            spec["paused"] = False
            now = yield Now()
            if _cron.parse_slot(spec["next_fire"]) <= now:
                # Slots that passed while paused are not due: the next one is.
                spec["next_fire"] = _next_fire(spec, now)
        try:
            yield Save(_record(cp, table), f"schedule {name} {what}", owned=False)
        except ConflictError:
            continue
        return ScheduleInfo.of(name, spec)
    raise ConflictError(f"schedule {name!r}: {_MAX_TRIES} other writers got in first", RECORD)


def pause_schedule(store: Store, name: str) -> ScheduleInfo:
    """Stop firing ``name``'s slots until ``resume_schedule``.

    Raises:
        ScheduleNotFound: no schedule has that name.
    """
    result: ScheduleInfo = _sync(_change(name, "pause"), store)
    return result


def resume_schedule(store: Store, name: str) -> ScheduleInfo:
    """Fire ``name``'s slots again, from the next one after now (none missed is fired).

    Raises:
        ScheduleNotFound: no schedule has that name.
    """
    result: ScheduleInfo = _sync(_change(name, "resume"), store)
    return result


def delete_schedule(store: Store, name: str) -> ScheduleInfo:
    """Delete the schedule ``name`` (the runs it started stay).

    Raises:
        ScheduleNotFound: no schedule has that name.
    """
    result: ScheduleInfo = _sync(_change(name, "delete"), store)
    return result


async def adelete_schedule(store: Store, name: str) -> ScheduleInfo:
    """Async ``delete_schedule``."""
    result: ScheduleInfo = await _async(_change(name, "delete"), store)
    return result


def past_slots(spec: dict[str, Any], start: datetime, end: datetime, limit: int) -> list[datetime]:
    """Return the schedule's slots in ``[start, end]``, at most ``limit``."""
    tz = _cron.check_tz(spec["tz"])
    return _cron.slots_between(spec["cron"], tz, start - timedelta(microseconds=1), end, limit)
