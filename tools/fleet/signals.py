"""The signals a fleet campaign sends: when, to which run, with which id; and one delivery."""

from __future__ import annotations

import random
import time
from typing import Any

from stepstone import signal as send_signal
from stepstone._errors import RunNotActive, StepstoneError
from stepstone._store import Store

from .workload import SIGNAL, waits_of

__all__ = ["deliver", "signal_plan"]


def signal_plan(
    rng: random.Random,
    kinds: dict[str, str],
    extra_rate: float,
    repeat_rate: float,
    window: float,
) -> list[tuple[float, str, str, dict[str, Any]]]:
    """(seconds after start, run_id, signal id, payload), sorted by time.

    Each run gets one signal per wait of its kind (one more at ``extra_rate``), each at
    a random time in ``[0, window]``, and sent a second time (another payload, the same
    id) at ``repeat_rate``.
    """
    events: list[tuple[float, str, str, dict[str, Any]]] = []
    for run_id, kind in kinds.items():
        count = waits_of(kind)
        if count == 0:
            continue
        if rng.random() < extra_rate:
            count += 1
        for j in range(count):
            sid = f"{run_id}#sig{j}"
            at = rng.uniform(0, window)
            events.append((at, run_id, sid, {"id": sid, "rep": 0}))
            if rng.random() < repeat_rate:
                again = rng.uniform(at, window)
                events.append((again, run_id, sid, {"id": sid, "rep": 1}))
    events.sort(key=lambda e: e[0])
    return events


def deliver(store: Store, run_id: str, sid: str, payload: Any) -> str:
    """Send one signal; return 'new', 'repeat', 'inactive' (run over) or 'error'."""
    for attempt in range(10):
        try:
            return "new" if send_signal(store, run_id, SIGNAL, payload, signal_id=sid) else "repeat"
        except RunNotActive:
            return "inactive"
        except StepstoneError:
            # Unknown whether it landed: the same id again is safe (a repeat is a no-op).
            time.sleep(0.05 * (attempt + 1))
    return "error"
