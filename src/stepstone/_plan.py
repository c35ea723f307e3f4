"""One execution of a run: its immutable inputs and the state its driver owns (``Plan``).

``_checks.make_plan`` builds one from the arguments of ``run``/``arun`` (or a worker's
claim); the core reads it, the drivers keep its execution state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from . import _clock, _lease
from ._checkpoint import Checkpoint

__all__ = ["Plan", "to_release"]

State = dict[str, Any]


class Plan:
    """One execution of a run: what to run, as whom, and what the driver must track.

    Two kinds of attribute. The run's inputs (``run_id`` to ``on``) are fixed when the
    plan is made (``Final``: the type checker refuses a write to them); the execution
    state below them belongs to the driver executing the run (and to a worker that
    claimed the run for it). One object rather than two: the core reads the inputs on
    every step, and an attribute read through a second object costs each step that.
    """

    __slots__ = (
        "append_only",
        "budget",
        "current",
        "deadline",
        "deadline_at",
        "deadline_mono",
        "flow",
        "history",
        "input",
        "lease",
        "names",
        "on",
        "on_deadline",
        "owner",
        "preclaimed",
        "renewal",
        "run_id",
        "steps",
        "stop_requested",
        "streamed",
        "total",
        "workflow",
        "written_at",
    )

    def __init__(
        self,
        run_id: str,
        steps: list[Any],
        *,
        input: State | None,
        workflow: tuple[str, str | None] | None,
        owner: str,
        lease: float,
        on: bool,
        preclaimed: Checkpoint | None = None,
        history: bool = False,
        budget: Any = None,
        flow: dict[str, Any] | None = None,
    ) -> None:
        # --- the run's inputs, fixed -------------------------------------------------
        self.run_id: Final = run_id
        self.steps: Final = steps
        self.names: Final = tuple(step.name for step in steps)
        self.total: Final = len(steps)
        self.input: Final = input
        self.workflow: Final = workflow
        #: A new run keeps every save (``Workflow(history=True)``).
        self.history: Final = history
        #: A new run's flow-control keys, from its workflow's ``limits`` (``_flow._runs``).
        self.flow: Final = flow
        self.owner: Final = owner
        self.lease: Final = lease
        #: Whether spans are recorded (an OpenTelemetry SDK is configured).
        self.on: Final = on
        #: The spend budget declared for the run (``_budget.Budget``), if any.
        self.budget: Final = budget
        #: Top-level keys whose lists the steps only append to (``_append_only``).
        self.append_only: frozenset[str] = frozenset()
        # --- the execution state, owned by the driver ----------------------------------
        #: The record a worker claimed for this execution (None: the core claims it).
        self.preclaimed: Checkpoint | None = preclaimed
        #: The latest record this execution owns (None when it owns nothing): what a
        #: driver releases if the run is interrupted, and what renewals start from.
        self.current: Checkpoint | None = preclaimed
        #: Monotonic time of this execution's last write (any write renews the lease).
        self.written_at = _clock.monotonic()
        #: The driver's renewal bookkeeping for this execution.
        self.renewal: Any = None
        #: Set by a stopping worker: give the run back at the next step boundary.
        self.stop_requested = False
        #: Streams (issue 34): the token of the last step call's attempt if it stored
        #: events (set by the driver after each call), recorded by the step's commit.
        self.streamed: str | None = None
        # --- issue 33 (``_deadline``) ----------------------------------------------------
        #: The workflow's deadline (seconds from the first claim) and what happens then.
        self.deadline: float | None = None
        self.on_deadline = "fail"
        #: When this run reaches its deadline (None: it has none), once claimed: on the
        #: store's clock, and as this process's monotonic time (``set_deadline``).
        self.deadline_at: datetime | None = None
        self.deadline_mono: float | None = None

    def set_deadline(self, at: datetime | None, now: datetime) -> None:
        """Note the run's deadline ``at``, read when the store's time was ``now``."""
        self.deadline_at = at
        self.deadline_mono = None if at is None else _clock.monotonic() + (at - now).total_seconds()

    def deadline_passed(self) -> bool:
        """Whether the run's deadline has fallen (never without one)."""
        return self.deadline_mono is not None and _clock.monotonic() >= self.deadline_mono

    def late(self) -> Exception:
        """Return the ``DeadlineExceeded`` a step running past the run's deadline raises."""
        from ._deadline import DeadlineExceeded  # noqa: PLC0415 - only once a deadline fell

        assert self.deadline_at is not None
        return DeadlineExceeded(self.run_id, self.deadline_at)


def to_release(plan: Plan) -> Checkpoint | None:
    """Return the record that gives the run's lease back after an interruption, if any.

    Clears ``plan.current``: the driver saves the result once, and whether that save
    lands or not the run holds nothing any more (an unsaved lease expires by itself).
    """
    current = plan.current
    if current is None or current.owner != plan.owner:
        return None
    plan.current = None
    return _lease.released(_lease.as_stored(current))
