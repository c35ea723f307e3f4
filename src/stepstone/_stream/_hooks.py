"""The drivers' side of streams: an ``Attempt`` installed around each step call.

Called by ``_runner`` and ``_arunner`` around every ``Call`` effect, and by the code
workflow's ``ctx.step`` around each call's function. Kept apart from the writer so the
drivers import three small functions, and cheap: a step that never emits costs one
small object and a context-variable set and reset.
"""

from __future__ import annotations

from contextvars import Token
from typing import TYPE_CHECKING

from .._steps import Step
from ._writer import Attempt, current

if TYPE_CHECKING:
    from .._effects import Call
    from .._plan import Plan
    from .._store import Store

__all__ = ["abandon", "aend", "begin", "begin_call", "end"]

Scope = tuple[Attempt, Token[Attempt | None]]


def begin(store: Store, plan: Plan, effect: Call) -> Scope:
    """Install the attempt of the step ``effect`` calls; return what ``end`` needs."""
    base = effect.base
    ctx = effect.ctx
    number = getattr(ctx, "attempt", base.attempt + 1)
    # Only a step list's step emits itself; a code workflow's step emits from its
    # ``ctx.step`` calls, each under an attempt of its own (``begin_call``).
    attempt = Attempt(
        store, plan.run_id, str(base.step + 1), base.epoch, number, isinstance(effect.step, Step)
    )
    return attempt, current.set(attempt)


def end(scope: Scope) -> str | None:
    """Uninstall the attempt, store its events; return its token if it stored any."""
    attempt, token = scope
    current.reset(token)
    return attempt.close()


async def aend(scope: Scope) -> str | None:
    """``end``, awaited: the final flush runs in a thread (it may block on the store)."""
    attempt, token = scope
    current.reset(token)
    if attempt.writer is None:
        attempt.can_emit = False
        return None
    import asyncio  # noqa: PLC0415 - only for steps that emitted

    return await asyncio.to_thread(attempt.close)


def abandon(scope: Scope) -> None:
    """Uninstall the attempt of a failed call, storing what it can of its events."""
    attempt, token = scope
    current.reset(token)
    if attempt.writer is not None:
        attempt.abandon()
    attempt.can_emit = False


def begin_call(seq: int, number: int) -> Scope | None:
    """Install the attempt of a code workflow's call ``seq``; None outside any run."""
    step = current.get()
    if step is None:
        return None
    attempt = step.call(seq, number)
    return attempt, current.set(attempt)
