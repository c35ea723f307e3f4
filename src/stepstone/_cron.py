"""A schedule's slots: cron expressions and time zones turned into UTC instants.

Parsing and stepping through a cron expression is ``cronsim``'s (the parser of
healthchecks.io, Debian cron's semantics); this module only checks the input, names
what is wrong, and turns cronsim's local times into UTC instants that strictly
increase. A slot is an instant: its run id is made from its UTC time, so two slots are
never the same instant, and one instant is never two slots.

Daylight-saving time, as Debian cron and cronsim do it (pinned by the tests):

- A fixed-time slot (``30 2 * * *``) that falls in the hour skipped on a spring-forward
  day fires once, at the first valid minute after it (03:00); on a fall-back day it
  fires once, at the first of the two 02:30s.
- A wildcard-minute or wildcard-hour slot (``*/20 * * * *``) fires at each real instant
  that matches: no minute of the skipped hour (it did not happen), both passes of the
  repeated hour (they are different instants).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from ._errors import ConfigError

__all__ = [
    "RECORD",
    "check_cron",
    "check_tz",
    "latest_slot",
    "next_slot",
    "parse_slot",
    "slot_id",
    "slots_between",
]

#: The run id of the record holding a store's schedules (``_schedule``); here, in a leaf
#: module, so that the CLI can tell it apart from runs without importing the runtime.
RECORD = "~schedules"
#: Iterations before giving up on finding a slot: a valid expression that never
#: matches (``0 0 30 2 *``, 30 February) would otherwise loop forever.
_MAX_STEPS = 100_000


def _cronsim() -> Any:
    try:
        import cronsim  # noqa: PLC0415 - only schedules need it
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ConfigError(
            "schedules need the cronsim package: pip install 'stepstone[schedules]'"
        ) from exc
    return cronsim


def check_cron(expr: object) -> str:
    """Return ``expr`` if it is a valid five-field cron expression, else raise ``ConfigError``."""
    if not isinstance(expr, str) or not expr.strip():
        raise ConfigError(
            f"cron must be a str of five fields (minute hour day-of-month month "
            f"day-of-week, e.g. '0 7 * * *'), got {expr!r}"
        )
    fields = expr.split()
    if len(fields) != 5:
        raise ConfigError(
            f"cron {expr!r} has {len(fields)} fields; five are allowed: minute hour "
            "day-of-month month day-of-week (e.g. '0 7 * * *', '*/15 * * * MON-FRI')"
        )
    cronsim = _cronsim()
    try:
        sim = cronsim.CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except cronsim.CronSimError as exc:
        raise ConfigError(
            f"cron {expr!r} is not valid: {exc}; allowed per field: numbers, ranges (1-5), "
            "steps (*/15), lists (1,3), names (MON, JAN), L and # in days"
        ) from None
    try:
        next(sim)
    except (StopIteration, cronsim.CronSimError):  # pragma: no cover - cronsim's own limit
        raise ConfigError(f"cron {expr!r} never matches a date") from None
    return " ".join(fields)


def check_tz(name: object) -> tzinfo:
    """Return the IANA time zone ``name`` (e.g. ``Europe/Berlin``), else raise ``ConfigError``."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415 - schedules only

    if not isinstance(name, str) or not name:
        raise ConfigError(f"tz must be an IANA time zone name such as 'UTC', got {name!r}")
    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"tz {name!r} is not a known IANA time zone; allowed: names such as 'UTC', "
            "'Europe/Berlin', 'America/New_York' (install tzdata where the system has none)"
        ) from None


def next_slot(expr: str, tz: tzinfo, after: datetime) -> datetime:
    """Return the first slot strictly after ``after`` (aware), in UTC.

    Raises:
        ConfigError: the expression matches no date within cronsim's reach.
    """
    sim = _cronsim().CronSim(expr, after.astimezone(tz))
    for _ in range(_MAX_STEPS):
        try:
            candidate: datetime = next(sim).astimezone(UTC)
        except StopIteration:
            break
        # A local time in the repeated hour may map before ``after``: never go back.
        if candidate > after:
            return candidate
    raise ConfigError(f"cron {expr!r} has no slot after {after.isoformat()}")


def latest_slot(expr: str, tz: tzinfo, after: datetime, until: datetime) -> datetime | None:
    """Return the latest slot in ``(after, until]``, or None if there is none."""
    sim = _cronsim().CronSim(expr, (until + timedelta(seconds=1)).astimezone(tz), reverse=True)
    for _ in range(_MAX_STEPS):
        try:
            candidate: datetime = next(sim).astimezone(UTC)
        except StopIteration:
            return None
        if candidate <= after:
            return None
        if candidate <= until:
            return candidate
    return None


def slots_between(
    expr: str, tz: tzinfo, after: datetime, until: datetime, limit: int
) -> list[datetime]:
    """Return the slots in ``(after, until]``, oldest first, at most ``limit`` of them."""
    slots: list[datetime] = []
    cursor = after
    while len(slots) < limit:
        slot = next_slot(expr, tz, cursor)
        if slot > until:
            break
        slots.append(slot)
        cursor = slot
    return slots


def slot_id(slot: datetime) -> str:
    """Return the slot's instant as it appears in run ids: ``2026-03-29T01:00:00Z``."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_slot(text: str) -> datetime:
    """Return the instant ``slot_id`` wrote."""
    if not text.endswith("Z"):
        raise ValueError(f"not a slot time: {text!r}")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)
