"""The context a code workflow's function gets (``ctx``), and its link to the core.

One ``_Session`` per execution of the function: the context's calls look in the
journal first (a replay costs nothing), and send what the journal cannot answer to the
core (``_code.CodeStep``) as requests, waiting for the answer (``_Reply``). A plain
``def`` workflow runs in a thread of its own and waits on an event; an ``async def``
one runs as a task on the run's event loop and awaits a future. The core answers
every request after its save landed, so a call returns only once it is journaled.
"""

from __future__ import annotations

import contextvars
import inspect
import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._checkpoint import utcnow
from ._codec import copy_containers
from ._errors import InvalidWorkflow, StepstoneError, WorkflowChanged, safe_text
from ._journal import answer_of, entry_failed, entry_ok, json_value
from ._observe import logger
from ._steps import RetryPolicy, check_name
from ._suspend import _seconds

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "MISSING",
    "RESERVED",
    "AsyncWorkflowContext",
    "CallFailed",
    "Reply",
    "Session",
    "Stop",
    "Waiter",
    "WorkflowContext",
    "close",
    "failure",
]

State = dict[str, Any]
MISSING: Any = object()
#: Names of the context's own calls start with this; a step's name may not.
RESERVED = "@"


class CallFailed(StepstoneError):
    """A journaled call failed for good (its retries spent), or a wait timed out.

    Raised in the workflow function at the call, the first time and on every replay
    alike (the journal keeps the error's type and message; the first time the original
    exception is ``__cause__``). ``call`` is the call's journal name (``"charge#2"``),
    ``seq`` its position in call order, ``error_type`` the exception's class name.
    """

    def __init__(
        self, run_id: str, call: str, seq: int, error_type: str, message: str, attempt: int
    ) -> None:
        super().__init__(
            f"run {run_id!r}: call {seq} ({call!r}) failed after {attempt} attempt(s): "
            f"{error_type}: {message}"
        )
        self.run_id = run_id
        self.call = call
        self.seq = seq
        self.error_type = error_type
        self.message = message
        self.attempt = attempt


class Stop(BaseException):
    """Unwinds the workflow function: the run waits, or this execution of it ended.

    A ``BaseException``, so that a function's ``except Exception`` does not swallow it.
    """


#: The journal name of the call whose function is running (a step inside a step is refused).
_inside: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "stepstone_code_call", default=None
)


# --- replies: how an answer gets back to the function ----------------------------------


class _Reply:
    """An answer awaited by a thread (a plain ``def`` workflow's)."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.event.is_set()

    def ok(self, value: Any) -> None:
        if not self.event.is_set():
            self.value = value
            self.event.set()

    def fail(self, error: BaseException) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()

    def get(self) -> Any:
        self.event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class _AReply:
    """An answer awaited by a task on the run's event loop (an ``async def`` workflow's)."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        import asyncio  # noqa: PLC0415 - only async workflows need it (~40 ms to import)

        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def done(self) -> bool:
        return self.future.done()

    def ok(self, value: Any) -> None:
        if not self.future.done():
            self.future.set_result(value)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


Reply = _Reply | _AReply


# --- the session: one execution of the function ----------------------------------------


class Session:
    """What the function's context and the core share during one execution.

    Requests go from the function to the core through a queue; the core answers each
    through its reply. ``status`` is ``open`` while the core listens, ``returned`` after
    the function returned, ``stopped`` after the execution ended otherwise (the run
    waits, failed, or its driver gave up): a call then unwinds the function (``Stop``).
    """

    def __init__(
        self,
        run_id: str,
        name: str,
        recorded: dict[int, dict[str, Any]],
        fn: Callable[..., Any],
        input: State,
        asynchronous: bool,
    ) -> None:
        self.run_id = run_id
        self.name = name
        self.recorded = recorded
        self.fn = fn
        self.input = input
        self.asynchronous = asynchronous
        self.seq = 0
        self.counts: dict[str, int] = {}
        self.status = "open"
        self.fatal: WorkflowChanged | None = None
        self.lock = threading.Lock()
        self.outstanding: list[Reply] = []
        self.requests: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.arequests: asyncio.Queue[tuple[Any, ...]] | None = None
        self.loop: Any = None
        self.thread: threading.Thread | None = None
        self.task: asyncio.Task[None] | None = None
        self.ctx: WorkflowContext | AsyncWorkflowContext = (
            AsyncWorkflowContext(self) if asynchronous else WorkflowContext(self)
        )

    # -- the function's side -----------------------------------------------------------

    def begin(self, name: str, what: str) -> tuple[int, str]:
        """Check that a call may be made now; return its position and journal name."""
        if self.status == "returned":
            raise InvalidWorkflow(
                f"{what} called after workflow {self.name!r} returned (run {self.run_id!r}): "
                "a context is used only while its function runs"
            )
        if self.status != "open":
            raise Stop
        if self.fatal is not None:
            raise self.fatal
        inside = _inside.get()
        if inside is not None:
            raise InvalidWorkflow(
                f"{what} called inside the function of call {inside!r} (run "
                f"{self.run_id!r}): a step's function cannot make journaled calls; make "
                "them from the workflow function"
            )
        if not self.asynchronous and threading.current_thread() is not self.thread:
            raise InvalidWorkflow(
                f"{what} called from a thread workflow {self.name!r} did not start (run "
                f"{self.run_id!r}): call the context from the workflow function's own thread"
            )
        seq = self.seq
        self.seq += 1
        count = self.counts.get(name, 0) + 1
        self.counts[name] = count
        return seq, f"{name}#{count}"

    def replay(self, seq: int, call: str) -> dict[str, Any] | None:
        """Return the journal's entry for call ``seq``, or None; refuse another name there."""
        entry = self.recorded.get(seq)
        if entry is None or entry["call"] == call:
            return entry
        why = WorkflowChanged(
            f"run {self.run_id!r} of workflow {self.name!r}: call {seq} is {call!r} now, "
            f"but the journal recorded {entry['call']!r} at that position; the function's "
            "calls changed under a started run. Restore the code it was started with, or "
            "start new runs under a new version",
            self.run_id,
            seq,
        )
        self.fatal = why
        self.post(("end", "raise", why))
        raise why

    def post(self, request: tuple[Any, ...], reply: Reply | None = None) -> None:
        """Hand ``request`` to the core; fail ``reply`` at once if the core stopped listening."""
        with self.lock:
            if self.status == "open":
                if reply is not None:
                    self.outstanding.append(reply)
                if self.arequests is None:
                    self.requests.put(request)
                elif self.asynchronous:
                    self.arequests.put_nowait(request)  # from a task on the loop itself
                else:
                    # From the function's thread to the loop the core waits on.
                    self.loop.call_soon_threadsafe(self.arequests.put_nowait, request)
                return
        if reply is not None:
            reply.fail(Stop())

    def ask(self, request: tuple[Any, ...]) -> Any:
        """Post ``request`` and wait for its answer (a plain ``def`` workflow's thread)."""
        reply = _Reply()
        self.post((*request, reply), reply)
        return reply.get()

    async def aask(self, request: tuple[Any, ...]) -> Any:
        """Post ``request`` and await its answer (an ``async def`` workflow's task)."""
        reply = _AReply()
        self.post((*request, reply), reply)
        return await reply.future

    def main(self) -> None:
        """The thread of a plain ``def`` workflow: run the function, report how it ended."""
        try:
            value = self.fn(self.ctx, self.input)
        except Stop:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the core, which decides
            self.post(("end", "raise", exc))
            return
        self.post(("end", "return", value))

    async def amain(self) -> None:
        """The task of an ``async def`` workflow: run the function, report how it ended."""
        try:
            value = await self.fn(self.ctx, self.input)
        except Stop:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the core, which decides
            self.post(("end", "raise", exc))
            return
        self.post(("end", "return", value))

    # -- the core's side ---------------------------------------------------------------

    def next_requests(self, state: State) -> list[tuple[Any, ...]]:
        """Wait for the function's next requests (called by the driver, like a step)."""
        self.start_thread()
        batch = [self.requests.get()]
        while True:
            try:
                batch.append(self.requests.get_nowait())
            except queue.Empty:
                return batch

    async def anext_requests(self, state: State) -> list[tuple[Any, ...]]:
        """``next_requests`` for an ``async def`` workflow, on the run's event loop."""
        import asyncio  # noqa: PLC0415 - see _AReply

        if self.arequests is None:
            self.loop = asyncio.get_running_loop()
            self.arequests = asyncio.Queue()
        if not self.asynchronous:
            # A plain def under arun: its thread posts to this loop, and no thread of the
            # loop's executor is held waiting (a worker's many runs would exhaust it).
            self.start_thread()
        elif self.task is None:
            self.task = self.loop.create_task(self.amain())
        batch = [await self.arequests.get()]
        while not self.arequests.empty():
            batch.append(self.arequests.get_nowait())
        return batch

    def start_thread(self) -> None:
        """Start a plain ``def`` workflow's thread, once, in a copy of the caller's context."""
        if self.thread is None:
            self.thread = threading.Thread(
                target=contextvars.copy_context().run,
                args=(self.main,),
                name=f"stepstone-code-{self.name}",
                daemon=True,
            )
            self.thread.start()

    def answered(self, reply: Reply) -> None:
        with self.lock:
            if reply in self.outstanding:
                self.outstanding.remove(reply)

    def stop(self, status: str) -> None:
        """Stop listening: unwind every call waiting for an answer, and any made later."""
        with self.lock:
            if self.status == "open":
                self.status = status
            pending, self.outstanding = self.outstanding, []
        for reply in pending:
            reply.fail(Stop())
        task = self.task
        if task is not None and not task.done() and status != "returned":
            task.cancel()


class Waiter:
    """What the core ``Call``s to wait for the function's requests (a ``Callee``)."""

    __slots__ = ("fn", "is_async", "name")

    def __init__(self, name: str, fn: Callable[..., Any], is_async: bool) -> None:
        self.name = name
        self.fn = fn
        self.is_async = is_async


# --- the contexts ------------------------------------------------------------------------


def _check_step_name(name: object, what: str) -> str:
    checked = check_name(name)
    if checked.startswith(RESERVED):
        raise InvalidWorkflow(
            f"{what}: a step's name may not start with {RESERVED!r} (the context's own "
            f"calls are journaled under such names), got {checked!r}"
        )
    return checked


def _check_retry(retry: object, what: str) -> RetryPolicy | None:
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise InvalidWorkflow(f"{what}: retry must be a RetryPolicy or None")
    return retry


def _should_retry(policy: RetryPolicy | None, attempt: int, error: BaseException) -> bool:
    if policy is None or attempt >= policy.max_attempts:
        return False
    try:
        return bool(policy.should_retry(error))
    except Exception:  # noqa: BLE001 - user code: a broken predicate means no retry
        logger.exception("the retry_on predicate raised; not retrying")
        return False


def failure(session: Session, entry: dict[str, Any]) -> CallFailed:
    error = entry["error"]
    return CallFailed(
        session.run_id,
        entry["call"],
        entry["seq"],
        str(error.get("type", "Exception")),
        str(error.get("message", "")),
        int(entry.get("attempt", 1)),
    )


def _answer(session: Session, entry: dict[str, Any]) -> Any:
    """The value a journaled call returns (a copy: the journal's own stays untouched)."""
    if "error" in entry:
        raise failure(session, entry)
    return copy_containers(answer_of(entry))


class WorkflowContext:
    """The context of a plain ``def`` workflow: journaled calls, answered once.

    Every method is a call in the journal's order: on a resumed run the journal
    answers it without running anything, so the function must make the same calls in
    the same order each time (``WorkflowChanged`` otherwise).
    """

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def run_id(self) -> str:
        """The run this execution belongs to."""
        return self._session.run_id

    def step(
        self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None
    ) -> Any:
        """Call ``fn(*args)`` once for this run; return its JSON result, journaled.

        The result (or the final failure, after ``retry``'s attempts) is saved in the run
        before this returns; on resume the journal returns it and ``fn`` is not called.
        Repeated names are numbered in call order (``revise#1``, ``revise#2``).

        Raises:
            CallFailed: ``fn`` failed for good (now or, journaled, on an earlier run).
            InvalidState: ``fn`` returned a value that is not JSON; nothing was journaled.
            WorkflowChanged: the journal recorded another call at this position.
        """
        session = self._session
        what = f"ctx.step({name!r})"
        seq, call = session.begin(_check_step_name(name, what), what)
        policy = _check_retry(retry, what)
        entry = session.replay(seq, call)
        if entry is not None:
            return _answer(session, entry)
        attempt = 0
        while True:
            attempt += 1
            token = _inside.set(call)
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    close(result)
                    raise InvalidWorkflow(
                        f"{what}: the function returned an awaitable; await it in an "
                        "`async def` workflow, or pass a plain function"
                    )
            except Exception as exc:
                if _should_retry(policy, attempt, exc):
                    assert policy is not None
                    time.sleep(policy.delay(attempt))
                    continue
                failed = entry_failed(seq, call, attempt, type(exc).__qualname__, safe_text(exc))
                session.ask(("save", failed))
                raise failure(session, failed) from exc
            finally:
                _inside.reset(token)
            value = json_value(result, session.run_id, call, seq)
            session.ask(("save", entry_ok(seq, call, attempt, value)))
            return copy_containers(value)

    def now(self) -> datetime:
        """Return the current time (UTC), journaled: a replay returns the same time."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}now", "ctx.now()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, utcnow().isoformat())
            session.ask(("save", entry))
        return datetime.fromisoformat(answer_of(entry))

    def uuid(self) -> str:
        """Return a random UUID (as text), journaled: a replay returns the same one."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}uuid", "ctx.uuid()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, str(uuidlib.uuid4()))
            session.ask(("save", entry))
        return str(answer_of(entry))

    def sleep(self, duration: float | timedelta) -> datetime:
        """Sleep durably: the run is saved waiting (no process held) until ``duration`` passed.

        Returns the time it was due (UTC). The due time is fixed when the sleep first
        begins, so restarts never move it.
        """
        session = self._session
        seconds = _seconds(duration, "ctx.sleep() duration")
        seq, call = session.begin(f"{RESERVED}sleep", "ctx.sleep()")
        entry = session.replay(seq, call)
        if entry is None:
            return datetime.fromisoformat(session.ask(("sleep", seq, call, seconds)))
        return datetime.fromisoformat(_answer(session, entry))

    def wait_for(
        self, signal: str, *, timeout: float | timedelta | None = None, default: Any = MISSING
    ) -> Any:
        """Wait durably for the signal ``signal``; return its payload.

        The run is saved waiting (no process held) until ``stepstone.signal`` sends it.
        With ``timeout``, ``default`` is returned when it passes; without a default the
        call fails (``CallFailed``, type ``WaitTimeout``).
        """
        session = self._session
        args = _wait_args(signal, timeout, default)
        seq, call = session.begin(f"{RESERVED}wait:{signal}", f"ctx.wait_for({signal!r})")
        entry = session.replay(seq, call)
        if entry is None:
            return session.ask(("wait", seq, call, *args))
        return _answer(session, entry)


class AsyncWorkflowContext:
    """The context of an ``async def`` workflow: ``WorkflowContext``'s calls, awaited.

    A call's position in the journal is fixed when it is made, not when it is awaited,
    so ``asyncio.gather(ctx.step(...), ctx.step(...))`` numbers its calls in the order
    written; each is journaled as it completes.
    """

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def run_id(self) -> str:
        """The run this execution belongs to."""
        return self._session.run_id

    def step(
        self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None
    ) -> Awaitable[Any]:
        """Await ``fn(*args)`` once for this run (see ``WorkflowContext.step``).

        ``fn`` may be ``async def``; a plain function runs in a worker thread, so that a
        blocking call cannot stall the event loop.
        """
        session = self._session
        what = f"ctx.step({name!r})"
        seq, call = session.begin(_check_step_name(name, what), what)
        policy = _check_retry(retry, what)
        entry = session.replay(seq, call)
        return self._step(seq, call, entry, fn, args, policy)

    async def _step(
        self,
        seq: int,
        call: str,
        entry: dict[str, Any] | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        policy: RetryPolicy | None,
    ) -> Any:
        import asyncio  # noqa: PLC0415 - see _AReply

        session = self._session
        if entry is not None:
            return _answer(session, entry)
        attempt = 0
        while True:
            attempt += 1
            token = _inside.set(call)
            try:
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args)
                else:
                    result = await asyncio.to_thread(fn, *args)
                    if inspect.isawaitable(result):
                        result = await result
            except Exception as exc:
                if _should_retry(policy, attempt, exc):
                    assert policy is not None
                    await asyncio.sleep(policy.delay(attempt))
                    continue
                failed = entry_failed(seq, call, attempt, type(exc).__qualname__, safe_text(exc))
                await session.aask(("save", failed))
                raise failure(session, failed) from exc
            finally:
                _inside.reset(token)
            value = json_value(result, session.run_id, call, seq)
            await session.aask(("save", entry_ok(seq, call, attempt, value)))
            return copy_containers(value)

    async def now(self) -> datetime:
        """Return the current time (UTC), journaled (see ``WorkflowContext.now``)."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}now", "ctx.now()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, utcnow().isoformat())
            await session.aask(("save", entry))
        return datetime.fromisoformat(answer_of(entry))

    async def uuid(self) -> str:
        """Return a random UUID (as text), journaled (see ``WorkflowContext.uuid``)."""
        session = self._session
        seq, call = session.begin(f"{RESERVED}uuid", "ctx.uuid()")
        entry = session.replay(seq, call)
        if entry is None:
            entry = entry_ok(seq, call, 1, str(uuidlib.uuid4()))
            await session.aask(("save", entry))
        return str(answer_of(entry))

    async def sleep(self, duration: float | timedelta) -> datetime:
        """Sleep durably (see ``WorkflowContext.sleep``)."""
        session = self._session
        seconds = _seconds(duration, "ctx.sleep() duration")
        seq, call = session.begin(f"{RESERVED}sleep", "ctx.sleep()")
        entry = session.replay(seq, call)
        if entry is None:
            return datetime.fromisoformat(await session.aask(("sleep", seq, call, seconds)))
        return datetime.fromisoformat(_answer(session, entry))

    async def wait_for(
        self,
        signal: str,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - durable, not this await's
        default: Any = MISSING,
    ) -> Any:
        """Wait durably for the signal ``signal`` (see ``WorkflowContext.wait_for``)."""
        session = self._session
        args = _wait_args(signal, timeout, default)
        seq, call = session.begin(f"{RESERVED}wait:{signal}", f"ctx.wait_for({signal!r})")
        entry = session.replay(seq, call)
        if entry is None:
            return await session.aask(("wait", seq, call, *args))
        return _answer(session, entry)


def _wait_args(signal: object, timeout: object, default: Any) -> tuple[str, float | None, Any]:
    if not isinstance(signal, str) or not signal or len(signal) > 200:
        raise InvalidWorkflow(
            f"ctx.wait_for(): signal must be a name of 1-200 characters, got {signal!r}"
        )
    seconds = None if timeout is None else _seconds(timeout, f"ctx.wait_for({signal!r}) timeout")
    if default is not MISSING:
        default = json_value(default, "", f"ctx.wait_for({signal!r}) default", -1)
    return signal, seconds, default


def close(awaitable: object) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()
