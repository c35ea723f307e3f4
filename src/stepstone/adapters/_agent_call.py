"""The call an agent step makes to run its agent: one rule for the sync and the async runner.

An agent framework's run is a coroutine. Under ``stepstone.run`` (no event loop) the step
runs it with ``asyncio.run`` on a loop of its own, where the journal may block on the
store's sync methods; under ``stepstone.arun`` it is awaited, and the journal awaits the
store's async methods. ``in_sync_run`` says which, ``call_agent`` makes the call.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Generator, Mapping
from typing import TYPE_CHECKING, Any

from .._effects import Call, Effect
from .._errors import InvalidWorkflow
from .._steps import Step, StepContext, idempotency_key

if TYPE_CHECKING:
    from .._checkpoint import Checkpoint
    from .._core import Plan

__all__ = ["call_agent", "check_options", "find", "in_sync_run"]

Outcome = dict[str, Any]


def in_sync_run() -> bool:
    """Return whether the step runs under the sync runner (no running event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


def call_agent(
    name: str,
    what: str,
    plan: Plan,
    cp: Checkpoint,
    index: int,
    state: dict[str, Any],
    sync: bool,
    body: Callable[[], Coroutine[Any, Any, Outcome]],
) -> Generator[Effect, Any, Outcome]:
    """Run ``body`` as step ``index``, ``name``, of the run; ``what`` names it in errors."""
    key = idempotency_key(plan.run_id, index, name)
    ctx = StepContext(plan.run_id, index, name, max(cp.attempt, 1), key)
    if sync:

        def call_sync(state: dict[str, Any], ctx: StepContext) -> Outcome:
            return asyncio.run(body())

        step = Step(name, call_sync)
    else:

        async def call_async(state: dict[str, Any], ctx: StepContext) -> Outcome:
            return await body()

        step = Step(name, call_async)
    outcome: Outcome = yield Call(step, state, ctx, cp)
    if inspect.iscoroutine(outcome):
        outcome.close()
        raise InvalidWorkflow(
            f"{what}: stepstone.run (sync) was called from inside a running event loop; "
            "there, use `await stepstone.arun(...)`"
        )
    return outcome


def check_options(function: str, options: Mapping[str, object], allowed: frozenset[str]) -> None:
    """Refuse a keyword ``function`` does not take, as Python does for a spelled-out one.

    The sync and async entry points share one ``TypedDict`` of keywords (``Unpack``), so
    the type checker sees each keyword; this is the same check at run time.
    """
    for name in options:
        if name not in allowed:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


def find(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``error`` or the first exception of ``kind`` in its exception groups (an agent
    framework's task groups wrap what a unit raised)."""
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = find(inner, kind)
            if found is not None:
                return found
    return None
