"""The context a code workflow's function gets (``ctx``): its journaled calls.

Each call looks in the journal first (``Session.replay``): a journaled call returns
its recorded answer at once. Otherwise it runs (``ctx.step``, ``ctx.submit``) or asks
the core (``ctx.sleep``, ``ctx.wait_for``), and returns once its entry is saved.
"""

from __future__ import annotations

import contextvars
import random as randomlib
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Any

from . import _timeouts
from ._checkpoint import utcnow
from ._code_calls import Do, JournaledCall, Op, adrive, arun_call, drive, failure, run_call
from ._code_calls import answer as _answer
from ._context_args import (
    MISSING,
    RESERVED,
    _charge_args,
    _check_retry,
    _check_step_name,
    _limits,
    _map_args,
    _reserve_args,
    _wait_args,
)
from ._effects import State
from ._flow._limit import Limit
from ._journal import answer_of, entry_ok
from ._session import POOL_THREADS, CallFailed, Session, inside
from ._steps import (
    RetryPolicy,
    Workflow,
)
from ._stream._events import EmitOutsideStep
from ._stream._writer import emit as _stream_emit
from ._suspend import _seconds

__all__ = [
    "MISSING",
    "POOL_THREADS",
    "RESERVED",
    "AsyncWorkflowContext",
    "WorkflowContext",
    "failure",
]


# --- the contexts ------------------------------------------------------------------------


def _emit(topic: str, data: Any) -> None:
    if inside.get() is None:
        raise EmitOutsideStep(
            "ctx.emit() outside a ctx.step call: a code workflow emits inside the function "
            "a ctx.step (or ctx.submit) call runs; code between calls re-runs on resume, "
            "and would emit its events again"
        )
    _stream_emit(topic, data)


# Each journaled call is written once, as a generator of ``Do`` effects: the journal's
# answer on a replay, else the request posted to the core and its answer. ``drive`` asks
# from a plain workflow's thread, ``adrive`` from an ``async def`` workflow's task.


def _asking(session: Session, key: str, what: str, kind: str, *args: Any) -> Op:
    """The answer to the call ``what``: the journal's, else the core's to ``kind``."""
    seq, call = session.begin(f"{RESERVED}{key}", what)
    entry = session.replay(seq, call)
    if entry is None:
        return (yield Do("ask", session, (kind, seq, call, *args)))
    return _answer(session, entry)


def _making(session: Session, key: str, make: Callable[[], Any]) -> Op:
    """``ctx.<key>()``'s value: the journal's, else ``make()``'s, journaled first."""
    seq, call = session.begin(f"{RESERVED}{key}", f"ctx.{key}()")
    entry = session.replay(seq, call)
    if entry is None:
        entry = entry_ok(seq, call, 1, make())
        yield Do("ask", session, ("save", entry))
    return answer_of(entry)


def _call(
    session: Session,
    kind: str,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    retry: object,
    timeout: object,
    idle_timeout: object,
    limits: object = (),
    tokens: object = None,
) -> tuple[JournaledCall, dict[str, Any] | None]:
    """Check a ``ctx.step``/``ctx.submit`` call; return it and its journal entry, if any.

    Every argument is checked before the journal is read: a bad call fails on a
    replay as it did on its first run.
    """
    what = f"ctx.{kind}({name!r})"
    seq, call = session.begin(_check_step_name(name, what), what)
    policy = _check_retry(retry, what)
    limit = _timeouts.check_timeout(what, "timeout", timeout)
    want = _limits(limits, tokens, what)
    idle = _timeouts.check_timeout(what, "idle_timeout", idle_timeout)
    checked = JournaledCall(seq, call, what, fn, args, policy, limit, idle, want)
    return checked, session.replay(seq, call)


class _Context:
    """What both contexts do alike: the run's id, ``emit`` and ``heartbeat`` (not awaited)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def run_id(self) -> str:
        """The run this execution belongs to."""
        return self._session.run_id

    def emit(self, topic: str, data: Any) -> None:
        """Append an event to the run's stream, from inside a ``ctx.step`` function.

        Raises:
            EmitOutsideStep: called outside the function of a ``ctx.step`` call.
            InvalidState: ``data`` is not JSON (the message names the path).
            EventTooLarge: the event is over ``MAX_EVENT_BYTES``.
        """
        _emit(topic, data)

    def heartbeat(self) -> None:
        """Show that the running ``ctx.step`` call is alive, from inside its function.

        Resets its ``idle_timeout``. In an attempt that timed out (or ran into the run's
        deadline) it raises ``StepTimeout``: the late call stops at its next heartbeat.
        Outside a call with a limit it does nothing.
        """
        _timeouts.heartbeat()


class WorkflowContext(_Context):
    """The context of a plain ``def`` workflow: journaled calls, answered once.

    Every method is a call in the journal's order: on a resumed run the journal
    answers it without running anything, so the function must make the same calls in
    the same order each time (``WorkflowChanged`` otherwise).
    """

    __slots__ = ()

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        limits: Sequence[Limit | str] = (),
        tokens: float | None = None,
        idle_timeout: float | timedelta | None = None,
    ) -> Any:
        """Call ``fn(*args)`` once for this run; return its JSON result, journaled.

        ``timeout``: seconds an attempt may take before it fails with ``StepTimeout``
        (``retry`` applies); the call then runs in a thread of its own (``_timeouts``).
        ``idle_timeout``: seconds it may go without calling ``ctx.heartbeat()``. Under a
        run deadline an attempt is given at most the time left (``DeadlineExceeded``).

        The result (or the final failure, after ``retry``'s attempts) is saved in the run
        before this returns; on resume the journal returns it and ``fn`` is not called.
        Repeated names are numbered in call order (``revise#1``, ``revise#2``).
        ``limits`` (flow control): keys the call holds, ``tokens`` estimated; a full key
        parks the run (saved waiting on ``limit:<key>``) until it can take it.

        Raises:
            CallFailed: ``fn`` failed for good (now or, journaled, on an earlier run).
            InvalidState: ``fn`` returned a value that is not JSON; nothing was journaled.
            WorkflowChanged: the journal recorded another call at this position.
        """
        session = self._session
        checked, entry = _call(
            session, "step", name, fn, args, retry, timeout, idle_timeout, limits, tokens
        )
        if entry is not None:
            return _answer(session, entry)
        return run_call(session, checked)

    def submit(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
    ) -> Future[Any]:
        """Start ``fn(*args)`` on the workflow's threads; return a future of its result.

        ``ctx.step``, in parallel: the call's position is fixed now, in call order, and
        its result is journaled when it completes, whatever the order. On resume a
        journaled call's future is done at once, and only the unfinished calls run.
        Up to ``POOL_THREADS`` calls of a run run at once; ``future.result()`` raises
        what ``ctx.step`` would; ``timeout`` and ``idle_timeout`` are ``ctx.step``'s.
        """
        session = self._session
        checked, entry = _call(session, "submit", name, fn, args, retry, timeout, idle_timeout)
        if entry is None:
            # In a copy of this context: the call's events go to this run's stream.
            return session.pool().submit(contextvars.copy_context().run, run_call, session, checked)
        done: Future[Any] = Future()
        try:
            done.set_result(_answer(session, entry))
        except CallFailed as exc:
            done.set_exception(exc)
        return done

    def _asked(self, key: str, what: str, kind: str, *args: Any) -> Any:
        return drive(_asking(self._session, key, what, kind, *args))

    def _made(self, key: str, make: Callable[[], Any]) -> Any:
        return drive(_making(self._session, key, make))

    def charge(
        self, *, usd: float = 0.0, tokens: int = 0, ref: str | None = None, **unknown: Any
    ) -> bool:
        """Record what the workflow spent (journaled, with the ledger, by one write).

        Call it after the ``ctx.step`` that spent, with the provider's response id as
        ``ref``: a replay answers it from the journal, and a run resumed between the
        step and the charge charges once. A ref the ledger holds counts nothing
        (returns False). Raises ``InvalidCharge`` on a bad amount; nothing recorded.
        """
        charge = _charge_args(usd, tokens, ref, unknown)
        return bool(self._asked("charge", "ctx.charge()", "charge", charge))

    def reserve(self, *, usd: float = 0.0, tokens: int = 0, **unknown: Any) -> str:
        """Reserve an estimate before an expensive ``ctx.step``; return its id (journaled).

        Saved at once with its journal entry (one write, refused if the lease moved on),
        settled by the next ``ctx.charge``; if the process dies before that charge, the
        reservation stays counted, as spent, unconfirmed. Past the run's limit (or its
        tree's pool's) the run pauses here until the budget is raised.
        """
        estimate = _reserve_args(usd, tokens, unknown)
        return str(self._asked("reserve", "ctx.reserve()", "reserve", estimate))

    def now(self) -> datetime:
        """Return the current time (UTC), journaled: a replay returns the same time."""
        return datetime.fromisoformat(self._made("now", _now_text))

    def uuid(self) -> str:
        """Return a random UUID (as text), journaled: a replay returns the same one."""
        return str(self._made("uuid", _uuid_text))

    def random(self) -> float:
        """Return a random float in [0, 1), journaled: a replay returns the same one."""
        return float(self._made("random", _draw))

    def sleep(self, duration: float | timedelta) -> datetime:
        """Sleep durably: the run is saved waiting (no process held) until ``duration`` passed.

        Returns the time it was due (UTC). The due time is fixed when the sleep first
        begins, so restarts never move it.
        """
        seconds = _seconds(duration, "ctx.sleep() duration")
        return datetime.fromisoformat(self._asked("sleep", "ctx.sleep()", "sleep", seconds))

    def wait_for(
        self, signal: str, *, timeout: float | timedelta | None = None, default: Any = MISSING
    ) -> Any:
        """Wait durably for the signal ``signal``; return its payload.

        The run is saved waiting (no process held) until ``stepstone.signal`` sends it.
        With ``timeout``, ``default`` is returned when it passes; without a default the
        call fails (``CallFailed``, type ``WaitTimeout``).
        """
        args = _wait_args(signal, timeout, default)
        return self._asked(f"wait:{signal}", f"ctx.wait_for({signal!r})", "wait", *args)

    def map(self, name: str, workflow: Workflow, inputs: list[State]) -> list[Any]:
        """Run one child run of ``workflow`` per input; return their results, in order.

        The children are ordinary queued runs (``PARENT/@map:NAME#K/INDEX``), run by
        workers (serve ``workflow`` too); this run waits for them as a ``Map`` step does
        (saved waiting, no process held). A child that is a code workflow gives its
        ``"result"``, any other its final state.

        Raises:
            CallFailed: a child failed or was cancelled (type ``ChildFailed``).
        """
        what = f"ctx.map({name!r})"
        args = _map_args(name, workflow, inputs, what)
        return list(self._asked(f"map:{name}", what, "map", *args))


class AsyncWorkflowContext(_Context):
    """The context of an ``async def`` workflow: ``WorkflowContext``'s calls, awaited.

    A call's position in the journal is fixed when it is made, not when it is awaited,
    so ``asyncio.gather(ctx.step(...), ctx.step(...))`` numbers its calls in the order
    written; each is journaled as it completes.
    """

    __slots__ = ()

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        limits: Sequence[Limit | str] = (),
        tokens: float | None = None,
        idle_timeout: float | timedelta | None = None,
    ) -> Awaitable[Any]:
        """Await ``fn(*args)`` once for this run (see ``WorkflowContext.step``).

        ``timeout``: an ``async def`` ``fn`` is cancelled after that many seconds, and
        the attempt fails with ``StepTimeout`` (``retry`` applies).

        ``fn`` may be ``async def``; a plain function runs in a worker thread, so that a
        blocking call cannot stall the event loop.
        """
        checked, entry = _call(
            self._session, "step", name, fn, args, retry, timeout, idle_timeout, limits, tokens
        )
        return self._step(checked, entry)

    async def _step(self, checked: JournaledCall, entry: dict[str, Any] | None) -> Any:
        if entry is not None:
            return _answer(self._session, entry)
        return await arun_call(self._session, checked)

    async def _asked(self, key: str, what: str, kind: str, *args: Any) -> Any:
        return await adrive(_asking(self._session, key, what, kind, *args))

    async def _made(self, key: str, make: Callable[[], Any]) -> Any:
        return await adrive(_making(self._session, key, make))

    async def charge(
        self, *, usd: float = 0.0, tokens: int = 0, ref: str | None = None, **unknown: Any
    ) -> bool:
        """Record what the workflow spent (see ``WorkflowContext.charge``)."""
        charge = _charge_args(usd, tokens, ref, unknown)
        return bool(await self._asked("charge", "ctx.charge()", "charge", charge))

    async def reserve(self, *, usd: float = 0.0, tokens: int = 0, **unknown: Any) -> str:
        """Reserve an estimate (see ``WorkflowContext.reserve``)."""
        estimate = _reserve_args(usd, tokens, unknown)
        return str(await self._asked("reserve", "ctx.reserve()", "reserve", estimate))

    async def now(self) -> datetime:
        """Return the current time (UTC), journaled (see ``WorkflowContext.now``)."""
        return datetime.fromisoformat(await self._made("now", _now_text))

    async def uuid(self) -> str:
        """Return a random UUID (as text), journaled (see ``WorkflowContext.uuid``)."""
        return str(await self._made("uuid", _uuid_text))

    async def random(self) -> float:
        """Return a random float in [0, 1), journaled (see ``WorkflowContext.random``)."""
        return float(await self._made("random", _draw))

    async def sleep(self, duration: float | timedelta) -> datetime:
        """Sleep durably (see ``WorkflowContext.sleep``)."""
        seconds = _seconds(duration, "ctx.sleep() duration")
        when = await self._asked("sleep", "ctx.sleep()", "sleep", seconds)
        return datetime.fromisoformat(when)

    async def wait_for(
        self,
        signal: str,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, not this await's
        default: Any = MISSING,
    ) -> Any:
        """Wait durably for the signal ``signal`` (see ``WorkflowContext.wait_for``)."""
        args = _wait_args(signal, timeout, default)
        what = f"ctx.wait_for({signal!r})"
        return await self._asked(f"wait:{signal}", what, "wait", *args)

    async def map(self, name: str, workflow: Workflow, inputs: list[State]) -> list[Any]:
        """Run child runs and await their results (see ``WorkflowContext.map``)."""
        what = f"ctx.map({name!r})"
        args = _map_args(name, workflow, inputs, what)
        return list(await self._asked(f"map:{name}", what, "map", *args))


#: Draws of ``ctx.random()``: seeded from the OS, not the ``random`` module's shared
#: generator, so a user's ``random.seed`` neither repeats nor reveals a run's draws.
_random = randomlib.SystemRandom()


def _draw() -> float:
    return _random.random()


def _now_text() -> str:
    return utcnow().isoformat()


def _uuid_text() -> str:
    return str(uuidlib.uuid4())
