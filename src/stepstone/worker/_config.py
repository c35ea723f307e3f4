"""A worker's configuration: its defaults, the checks of its arguments, its workflow table.

No I/O and no state: ``Worker.__init__`` calls these, and the claim loop reads the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .. import _upgrade
from .._bounds import MAX_RUNS
from .._errors import InvalidWorkflow
from .._steps import Workflow, workflow_label
from .._store import Store
from .._suspend import Map

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_GRACE",
    "DEFAULT_POLL",
    "WorkflowTable",
    "check_async_steps",
    "check_numbers",
    "index",
]

DEFAULT_CONCURRENCY = 8
#: Seconds between looks at the claim index when there is nothing to do and nothing
#: rings: the fallback for wake-ups that are lost or never sent.
DEFAULT_POLL = 1.0
#: Seconds a stopping worker lets steps in flight finish before it gives up on them.
DEFAULT_GRACE = 30.0

#: (workflow name, version) -> the workflow that runs it (an older version: its upgrade).
WorkflowTable = dict[tuple[str, str | None], Workflow]


def check_numbers(store: object, concurrency: object, poll: object, grace: object) -> None:
    """Refuse a worker's arguments that are not a store, a slot count and seconds.

    Raises:
        InvalidWorkflow: an argument is out of range or of the wrong type, named.
    """
    if not isinstance(store, Store):
        raise InvalidWorkflow(f"store must be a stepstone Store, got {type(store).__name__}")
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= 10_000
    ):
        raise InvalidWorkflow(f"concurrency must be an int from 1 to 10000, got {concurrency!r}")
    for name, value in (("poll", poll), ("grace", grace)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value <= 86_400
        ):
            raise InvalidWorkflow(f"{name} must be seconds from 0 to 86400, got {value!r}")


def check_max_runs(max_runs: object) -> int | None:
    """Return ``max_runs`` (None or a whole number of executions), or refuse it.

    Raises:
        InvalidWorkflow: not None nor an int from 1 to ``MAX_RUNS``, named.
    """
    if max_runs is None:
        return None
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or not 1 <= max_runs <= MAX_RUNS:
        raise InvalidWorkflow(
            f"max_runs must be None (no limit) or an int from 1 to {MAX_RUNS}, got {max_runs!r}"
        )
    return max_runs


def index(workflows: Iterable[Workflow] | Mapping[Any, Workflow]) -> WorkflowTable:
    """Return the table of what a worker serves: ``workflows``, their Maps' children, upgrades.

    Raises:
        InvalidWorkflow: not a list or dict of workflows, none, or two different ones
            under one (name, version).
    """
    items = workflows.values() if isinstance(workflows, Mapping) else workflows
    if isinstance(items, (str, bytes, Workflow)):
        raise InvalidWorkflow("workflows must be a list or dict of Workflow objects")
    table: WorkflowTable = {}
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
                "two different workflows are named "
                f"{workflow_label(workflow.name, workflow.version)}"
            )
        if known is None:
            table[workflow.key] = workflow
            # A Map's child workflow is served too: its children must run somewhere.
            pending.extend(step.workflow for step in workflow.steps if isinstance(step, Map))
    if not table:
        raise InvalidWorkflow("a worker needs at least one Workflow to serve")
    # Plus the older versions they upgrade: (name, "2") -> version 3, upgrading from 2.
    return _upgrade.routes(table)


def check_async_steps(table: WorkflowTable) -> None:
    """Refuse to ``serve`` (threads) a workflow with an ``async def`` step.

    Raises:
        InvalidWorkflow: naming the workflow and its async step.
    """
    for workflow in table.values():
        for step in workflow.steps:
            # A Step, or a code workflow's step (``_code.CodeStep``), of an async def.
            if getattr(step, "is_async", False) is True:
                raise InvalidWorkflow(
                    f"workflow {workflow.name!r} has the async step {step.name!r}: "
                    "serve it with `await worker.aserve()`, not worker.serve()"
                )
