"""One execution of a code workflow's function, and how it talks to the core.

A ``Session`` per execution: the context's calls (``_context``) look in the journal
first (a replay costs nothing), and send what the journal cannot answer to the core
(``_code.CodeStep``) as requests, waiting for the answer (a reply). A plain ``def``
workflow runs in a thread of its own and waits on an event; an ``async def`` one runs
as a task on the run's event loop and awaits a future. The core answers every request
after its save landed, so a call returns only once it is journaled.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ._errors import InvalidWorkflow, StepstoneError, WorkflowChanged
from ._steps import StepContext, idempotency_key

if TYPE_CHECKING:
    import asyncio

    from ._flow._call import FlowCall

__all__ = [
    "POOL_THREADS",
    "CallFailed",
    "Reply",
    "Session",
    "Stop",
    "Waiter",
    "close",
    "current_call",
    "inside",
]

State = dict[str, Any]
#: How many ``ctx.submit`` calls of one run of a plain workflow run at once.
POOL_THREADS = 8


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


#: The call whose function is running here (a step inside a step is refused): its run,
#: position, journal name and attempt. ``current_call`` makes its ``StepContext`` only
#: when asked (the key is a hash: not worth paying for on every call).
inside: contextvars.ContextVar[tuple[str, int, str, int] | None] = contextvars.ContextVar(
    "stepstone_code_call", default=None
)


def current_call() -> StepContext | None:
    """Return the journaled call whose function is running here, or None.

    Called from inside the function of a code workflow's ``ctx.step`` (or
    ``ctx.submit``): its run, position in call order (``step_index``), journal name
    (``step_name``, ``"charge#2"``), attempt and ``idempotency_key``, the same on every
    attempt and resume of that call. Pass the key to a payment or model API so that a
    call repeated after a crash is a no-op.
    """
    running = inside.get()
    if running is None:
        return None
    run_id, seq, call, attempt = running
    return StepContext(run_id, seq, call, attempt, idempotency_key(run_id, seq, call))


# --- replies: how an answer gets back to the function ----------------------------------


class _Reply:
    """An answer awaited by a thread (a plain ``def`` workflow's).

    The waiter blocks on a lock taken when the reply is made and released by the
    answer: half the cost of an ``Event`` (whose ``wait`` makes a lock of its own and
    takes a condition's), paid on every call of a plain workflow. Only the core's
    thread answers (``ok``/``fail``), once: a lock may be released by another thread.
    """

    __slots__ = ("error", "lock", "settled", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.settled = False
        self.value: Any = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.settled

    def ok(self, value: Any) -> None:
        if not self.settled:
            self.settled = True
            self.value = value
            self.lock.release()

    def fail(self, error: BaseException) -> None:
        if not self.settled:
            self.settled = True
            self.error = error
            self.lock.release()

    def get(self) -> Any:
        self.lock.acquire()
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


@dataclass(eq=False, repr=False)
class Session:
    """What the function's context and the core share during one execution.

    Requests go from the function to the core through a queue; the core answers each
    through its reply. ``status`` is ``open`` while the core listens, ``returned`` after
    the function returned, ``stopped`` after the execution ended otherwise (the run
    waits, failed, or its driver gave up): a call then unwinds the function (``Stop``).
    Compared and hashed by identity (``eq=False``), as a plain object is.
    """

    run_id: str
    name: str
    recorded: dict[int, dict[str, Any]]
    fn: Callable[..., Any]
    input: State
    asynchronous: bool
    seq: int = field(default=0, init=False)
    counts: dict[str, int] = field(default_factory=dict, init=False)
    status: str = field(default="open", init=False)
    fatal: WorkflowChanged | None = field(default=None, init=False)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    outstanding: list[Reply] = field(default_factory=list, init=False)
    requests: queue.SimpleQueue[tuple[Any, ...]] = field(
        default_factory=queue.SimpleQueue, init=False
    )
    arequests: asyncio.Queue[tuple[Any, ...]] | None = field(default=None, init=False)
    loop: Any = field(default=None, init=False)
    executor: ThreadPoolExecutor | None = field(default=None, init=False)
    thread: threading.Thread | None = field(default=None, init=False)
    task: asyncio.Task[None] | None = field(default=None, init=False)
    #: The function's context (``_context``), set by whoever makes the session.
    ctx: Any = field(default=None, init=False)
    #: The run has a spend budget: each ``ctx.step`` asks the core first (``_budget``).
    budgeted: bool = field(default=False, init=False)
    #: A ``ctx.reserve`` made for the next ``ctx.step`` (its check leaves it out).
    reserved: str | None = field(default=None, init=False)
    #: When the run's deadline falls (issue 33), or None: checked before each call.
    deadline_at: datetime | None = field(default=None, init=False)
    #: ``deadline_at`` as this process's monotonic time (``Plan.set_deadline``).
    deadline_mono: float | None = field(default=None, init=False)
    #: Flow control: the keys each call in flight holds, by its seq (``_code``).
    held: dict[int, FlowCall] = field(default_factory=dict, init=False)

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
        running = inside.get()
        if running is not None:
            raise InvalidWorkflow(
                f"{what} called inside the function of call {running[2]!r} (run "
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
        except BaseException as exc:  # noqa: BLE001 - reported to the core, which decides
            self._raised(exc)
            return
        self.post(("end", "return", value))

    async def amain(self) -> None:
        """The task of an ``async def`` workflow: run the function, report how it ended."""
        try:
            value = await self.fn(self.ctx, self.input)
        except BaseException as exc:  # noqa: BLE001 - reported to the core, which decides
            self._raised(exc)
            return
        self.post(("end", "return", value))

    def _raised(self, exc: BaseException) -> None:
        """Report that the function raised ``exc``; a ``Stop`` is the core's own: not reported."""
        if not isinstance(exc, Stop):
            self.post(("end", "raise", exc))

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

    def pool(self) -> ThreadPoolExecutor:
        """The threads of a plain workflow's ``ctx.submit`` calls, made on first use."""
        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(
                    POOL_THREADS, thread_name_prefix=f"stepstone-code-{self.name}"
                )
            return self.executor

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

    def answer(self, reply: Reply, value: Any) -> None:
        """Answer a call with ``value`` (``answered`` first: ``stop`` no longer unwinds it)."""
        self.answered(reply)
        reply.ok(value)

    def stop(self, status: str) -> None:
        """Stop listening: unwind every call waiting for an answer, and any made later."""
        with self.lock:
            if self.status == "open":
                self.status = status
            pending, self.outstanding = self.outstanding, []
        for reply in pending:
            reply.fail(Stop())
        if self.executor is not None:
            # Calls not started never start; running ones end at their journal save.
            self.executor.shutdown(wait=False, cancel_futures=True)
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


def close(awaitable: object) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()
