"""What every capability workload shares: the process context, the logs, the verdict.

A workload (``flow``, ``sched``, ``spend``) is a ``Load``: the workflows its workers
serve, the kill points its campaign arms, how the parent prepares the store, how a
worker process prepares itself (a hook that logs at a point, a fast clock), when the
campaign is over and which invariants must hold afterwards. Its steps log what they
did through ``Ctx.log`` (one JSON line per call, appended whole by one ``write``).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepstone import Workflow
from stepstone._store import Store

__all__ = ["Ctx", "Load", "Verdict", "read_deaths", "read_logs"]


class Ctx:
    """What a worker process tells its steps: the store and the log writer."""

    store: Store | None = None
    log: Callable[[dict[str, Any]], None] = staticmethod(lambda record: None)


@dataclass
class Verdict:
    """What a campaign's check found: failed invariants, and the figures to report."""

    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def expect(self, ok: bool, message: str) -> None:
        """Record ``message`` as a failure unless ``ok``."""
        if not ok:
            self.failures.append(message)


class Load:
    """A capability workload (the base says what each one provides)."""

    name = ""
    #: The points the campaign kills worker processes at.
    points: tuple[str, ...] = ()
    #: Runs each worker drives at once.
    concurrency = 2
    #: Seconds the kill phase lasts when the load ends by time, not by its runs (None).
    duration: float | None = None

    def workflows(self) -> list[Workflow]:
        """Return the workflows the workers serve."""
        raise NotImplementedError

    def setup(self, store: Store, size: int) -> dict[str, Any]:
        """Prepare the store in the parent; return what the check needs (JSON)."""
        raise NotImplementedError

    def prepare(self, spec: dict[str, Any]) -> Callable[[str], None] | None:
        """Prepare a worker process; return its hook at the runtime's points, if any."""
        return None

    def drain(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Return the spec entries of the last, fault-free workers (after ``duration``)."""
        return {}

    def done(self, store: Store, meta: dict[str, Any]) -> bool:
        """Whether the campaign's work is all done."""
        raise NotImplementedError

    def check(
        self,
        store: Store,
        meta: dict[str, Any],
        records: list[dict[str, Any]],
        deaths: dict[int, float],
    ) -> Verdict:
        """Check the invariants from the store, the workers' logs and their deaths."""
        raise NotImplementedError


def read_logs(logdir: str) -> list[dict[str, Any]]:
    """Return every worker's log lines (whole lines only: a kill never tears one)."""
    records: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(logdir, "log-*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            records.extend(json.loads(line) for line in fh if line.endswith("\n"))
    return records


def read_deaths(logdir: str) -> dict[int, float]:
    """Return ``{pid: wall time}`` of every worker that killed itself at a point."""
    deaths = {}
    for path in glob.glob(os.path.join(logdir, "died-*.json")):
        pid = int(os.path.basename(path)[len("died-") : -len(".json")])
        with open(path, encoding="utf-8") as fh:
            deaths[pid] = float(json.load(fh)["t"])
    return deaths
