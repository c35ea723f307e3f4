"""The checks made before anything runs: arguments, workflow, names and input.

``make_plan`` checks the arguments of ``run``/``arun`` (and of a worker's claim) and
builds the ``Plan``; ``check_names``, ``check_workflow`` and ``check_input`` refuse to
resume a run with other steps, another workflow or another input than it was started
with. Each raises a precise error (which position, which path) and changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from . import _clock, _lease
from ._budget import check_budget
from ._checkpoint import Checkpoint, check_run_id
from ._codec import encode_state
from ._errors import InputMismatch, InvalidWorkflow, WorkflowChanged
from ._flow._runs import run_flow
from ._observe import tracing
from ._plan import Plan
from ._steps import Workflow, check_steps, workflow_label
from ._store import Store

__all__ = [
    "Steps",
    "check_clock",
    "check_input",
    "check_names",
    "check_workflow",
    "first_difference",
    "make_plan",
    "renamed_at",
]

State = dict[str, Any]
Steps = Sequence[Any] | Workflow


def check_clock(clock: object) -> _clock.Clock | None:
    """Return a call's ``clock=`` argument: None (the installed clock) or a ``Clock``.

    Raises:
        InvalidWorkflow: it is neither, naming the methods a clock needs.
    """
    if clock is None or isinstance(clock, _clock.Clock):
        return clock
    raise InvalidWorkflow(
        "clock must be None (the installed clock) or a stepstone.testing.Clock (now, "
        f"monotonic, sleep, asleep, wait, await_event), got {type(clock).__name__}"
    )


def make_plan(
    run_id: str,
    steps: Steps,
    store: Store,
    *,
    input: State | None,
    lease: float | timedelta | None,
    owner: str | None = None,
    preclaimed: Checkpoint | None = None,
    asynchronous: bool,
    budget: Any = None,
) -> Plan:
    """Check the arguments of ``run``/``arun`` up front and return the core's ``Plan``."""
    check_run_id(run_id)
    if not isinstance(store, Store):
        raise InvalidWorkflow(f"store must be a stepstone Store, got {type(store).__name__}")
    workflow = (steps.name, steps.version) if isinstance(steps, Workflow) else None
    items = check_steps(steps)
    if not asynchronous:
        for item in items:
            # A Step, or a code workflow's step (``_code.CodeStep``), of an async def.
            if getattr(item, "is_async", False) is True:
                raise InvalidWorkflow(
                    f"step {item.name!r} is async (async def); run it with "
                    "`await stepstone.arun(...)`, not stepstone.run"
                )
    if input is not None:
        # Validated (and copied) here: a bad input is refused before anything is stored.
        input = encode_state(input)[1]
    seconds = _lease.DEFAULT_LEASE if lease is None else _lease.check_lease(lease)
    plan = Plan(
        run_id,
        items,
        input=input,
        workflow=workflow,
        owner=owner or _lease.new_owner(),
        lease=seconds,
        on=tracing(),
        preclaimed=preclaimed,
        history=isinstance(steps, Workflow) and steps.history,
        # Spend budgets (``_budget``): the run's own, else its workflow's.
        budget=check_budget(budget) or (steps.budget if isinstance(steps, Workflow) else None),
        flow=run_flow(steps.limits, None, 0) if isinstance(steps, Workflow) else None,
    )
    if isinstance(steps, Workflow):  # issue 33: the workflow's deadline (``_deadline``)
        plan.deadline, plan.on_deadline = steps.deadline, steps.on_deadline
        plan.append_only = steps.append_only
    return plan


def renamed_at(names: tuple[str, ...], done: tuple[str, ...]) -> tuple[int, str, str] | None:
    """Where the completed steps ``done`` stop being the first of ``names``, or None.

    Returns the position, the step completed there, and what ``names`` has there
    (``"step 'x'"``, or ``"no step"`` past its end).
    """
    if names[: len(done)] == done:
        return None
    for position, recorded in enumerate(done):
        now = names[position] if position < len(names) else None
        if now != recorded:
            return position, recorded, "no step" if now is None else f"step {now!r}"
    return None  # pragma: no cover - a prefix that differs differs at some position


def check_names(run_id: str, names: tuple[str, ...], done: tuple[str, ...]) -> None:
    """Refuse to resume when the completed steps are not the first steps passed now."""
    renamed = renamed_at(names, done)
    if renamed is not None:
        position, recorded, shown = renamed
        raise WorkflowChanged(
            f"run {run_id!r}: workflow changed at position {position}: the checkpoint "
            f"completed step {recorded!r} there, the steps passed now have {shown}. "
            "Only appending steps at the end is allowed; use a new run_id for a "
            "different workflow",
            run_id,
            position,
        )


def check_workflow(run_id: str, cp: Checkpoint, workflow: tuple[str, str | None] | None) -> None:
    """Refuse to run a run recorded under one workflow with another workflow's steps."""
    if cp.workflow is None:
        return
    if workflow is None:
        raise WorkflowChanged(
            f"run {run_id!r} was started from workflow "
            f"{workflow_label(cp.workflow, cp.workflow_version)}; run it with that Workflow, "
            "not a bare list of steps",
            run_id,
            -1,
        )
    if (cp.workflow, cp.workflow_version) != workflow:
        raise WorkflowChanged(
            f"run {run_id!r} was started from workflow "
            f"{workflow_label(cp.workflow, cp.workflow_version)}, not "
            f"{workflow_label(*workflow)}; a run only ever runs with the workflow it was "
            "started from",
            run_id,
            -1,
        )


def first_difference(recorded: object, given: object, path: str = "input") -> str | None:
    """Return the path of the first difference between two JSON values, or None."""
    if isinstance(recorded, dict) and isinstance(given, dict):
        for key in sorted(set(recorded) | set(given)):
            where = f"{path}[{key!r}]"
            if key not in recorded:
                return f"{where} (not in the recorded input)"
            if key not in given:
                return f"{where} (missing from the input given)"
            found = first_difference(recorded[key], given[key], where)
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(given, list):
        if len(recorded) != len(given):
            return f"{path} (length {len(recorded)} recorded, {len(given)} given)"
        for index, (a, b) in enumerate(zip(recorded, given, strict=True)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if type(recorded) is not type(given) or recorded != given:
        return f"{path} (recorded {_short(recorded)}, given {_short(given)})"
    return None


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def check_input(run_id: str, cp: Checkpoint, given: State | None) -> None:
    """Refuse to resume with an input other than the recorded one (None uses the record)."""
    if given is None:
        return
    recorded = cp.input if cp.input is not None else {}
    difference = first_difference(recorded, given)
    if difference is not None:
        raise InputMismatch(
            f"run {run_id!r} was started with another input: first difference at "
            f"{difference}; nothing was run. Resume with input=None (or the same input), "
            "or use a new run_id",
            run_id,
            difference.partition(" ")[0],
        )
