"""The async runner: ``arun``, the contract of ``run`` for async steps and async stores.

The same core as ``run`` (``_core.execute``), driven with awaits: ``async def`` steps
are awaited, plain ones run in a worker thread, and each step's lease is renewed from a
timer on the event loop. Kept apart from ``_runner`` so that ``import stepstone`` and
sync users never import asyncio.

What a step costs beyond ``run``'s is kept to what asynchrony needs (issue 20: at most
1.3x ``run``'s instructions per step on the memory store, ``benchmarks/bench_arun.py``):
a save runs in a shielded task only when it can suspend (a save cut short by our
cancellation must still land whole), and a step gets a renewal timer only once it
suspends (before that the loop cannot run a timer anyway).
"""

from __future__ import annotations

import asyncio
import inspect
import types
from collections.abc import Coroutine, Generator
from datetime import timedelta
from typing import Any, TypeVar

from . import _clock
from ._budget import Budget
from ._checkpoint import Checkpoint
from ._checks import Steps, check_clock, make_plan
from ._core import execute, renew
from ._effects import Announce, Call, Effect, Load, Pause, Renewing, Save, Together, astep_through
from ._errors import ConflictError
from ._meter import current_store
from ._observe import logger
from ._plan import Plan, to_release
from ._store import Store
from ._store_time import Now, astore_now
from ._stream import _hooks as _stream
from ._timeouts import applies, atimed_call
from ._wake import aannounce

__all__ = ["adrive", "arenew_once", "arun"]

State = dict[str, Any]
T = TypeVar("T")


async def arun(
    run_id: str,
    steps: Steps,
    store: Store,
    *,
    input: State | None = None,
    lease: float | timedelta | None = None,
    clock: _clock.Clock | None = None,
    budget: Budget | None = None,
) -> State:
    """Await the run: the contract of ``run``, for async steps and async stores.

    ``async def`` steps are awaited in the caller's task; plain steps run in a worker
    thread so that a blocking call cannot stall the event loop. Cancelling the task
    that awaits ``arun`` cancels the step in flight: nothing is saved for it, a save
    already in flight lands whole (old or new checkpoint, never torn), the lease is
    given back and ``CancelledError`` propagates; a later ``run``/``arun`` resumes
    from the last checkpoint. ``clock``: as in ``run``, the clock this call reads.

    Raises:
        StepstoneError: the errors of ``run``.
        asyncio.CancelledError: the task was cancelled.
    """
    with _clock.using(check_clock(clock)):
        plan = make_plan(
            run_id, steps, store, input=input, lease=lease, asynchronous=True, budget=budget
        )
        return await adrive(plan, store)


async def adrive(plan: Plan, store: Store) -> State:
    """Perform the core's effects with awaits until the run ends."""
    current_store.set(store)  # for ctx.reserve() inside the steps (``_budget``)
    try:
        result: State = await astep_through(
            execute(plan), lambda effect: _aperform(effect, plan, store)
        )
        return result
    except BaseException as exc:
        # As in ``drive``: after a conflict the record is not ours to give back.
        if not isinstance(exc, ConflictError):
            await _landed(_arelease(plan, store))
        raise


async def _landed(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` to its end even if we are cancelled meanwhile, then re-raise that.

    A save is one request: once sent it lands or not, whatever happens to our task. We
    wait for its answer so that what the run holds (``Plan.current``) is what is stored.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # noqa: BLE001 - the task keeps it: task.result() raises it
            pass
    if cancelled:
        task.exception()  # retrieved: no "exception never retrieved" warning
        raise asyncio.CancelledError
    return task.result()


#: Per store class: the ``asave`` it runs, when that one never suspends; else None.
_QUIET_ASAVE: dict[type[Store], object] = {}


def _quiet_asave(cls: type[Store]) -> object:
    # The class that defines the asave this class runs must itself declare the flag: a
    # subclass that overrides asave (to await something) does not inherit the promise.
    for klass in cls.__mro__:
        own = vars(klass)
        if "asave" in own:
            return own["asave"] if own.get("asave_never_suspends") is True else None
    return None


def _never_suspends(store: Store) -> bool:
    """Whether ``store.asave`` is a coroutine that never suspends (the memory store's).

    Declared by the backend (``Store.asave_never_suspends``) in the class that defines
    that ``asave``: a cancellation, delivered only where a coroutine suspends, cannot
    land inside it. A subclass that overrides ``asave``, or a test that replaces it on
    the instance, gets the guarded path.
    """
    cls = type(store)
    quiet = _QUIET_ASAVE.get(cls, _QUIET_ASAVE)
    if quiet is _QUIET_ASAVE:
        quiet = _QUIET_ASAVE[cls] = _quiet_asave(cls)
    asave = store.asave
    return quiet is not None and isinstance(asave, types.MethodType) and asave.__func__ is quiet


async def _asave(effect: Save, plan: Plan, store: Store) -> Checkpoint:
    asave = store.asave
    if _never_suspends(store):
        # No task and no shield: nothing can interrupt it (see ``_never_suspends``).
        saved = await asave(effect.cp)
        if effect.owned:
            plan.current = saved if saved.owner == plan.owner else None
            plan.written_at = _clock.monotonic()
        return saved
    owned = effect.owned

    async def save() -> Checkpoint:
        saved = await asave(effect.cp)
        if owned:
            # As in ``_runner._perform``.
            plan.current = saved if saved.owner == plan.owner else None
            plan.written_at = _clock.monotonic()
        return saved

    return await _landed(save())


async def _acall(effect: Call, plan: Plan, store: Store) -> Any:
    """Call the step; renew the lease from a timer once it suspends (``_AsyncRenewal``)."""
    step = effect.step
    args = (effect.state,) if effect.ctx is None else (effect.state, effect.ctx)
    started = _clock.monotonic()
    renewal: _AsyncRenewal | None = None
    attempt = _stream.begin(store, plan, effect)  # streams (issue 34)
    try:
        try:
            if applies(plan, step):  # issue 33: a timeout, or the run's deadline
                renewal = _AsyncRenewal(plan, store)
                late, at = plan.late, plan.deadline_mono
                update = await atimed_call(step, effect.state, effect.ctx, at, late)
            elif step.is_async:
                steps = step.fn(*args).__await__()
                try:
                    # Up to its first suspension in our task. A step that returns before
                    # it (no I/O) gave the loop no chance to run a renewal: it needs no
                    # timer. One that suspends is awaited on, in this task, as ``await``
                    # would, with the timer due a third of the lease after it started.
                    yielded = steps.send(None)
                except StopIteration as returned:
                    update = returned.value
                else:
                    renewal = _AsyncRenewal(
                        plan, store, plan.lease / 3 - (_clock.monotonic() - started)
                    )
                    update = await _resumed(steps, yielded)
            else:
                renewal = _AsyncRenewal(plan, store)
                update = await asyncio.to_thread(_in_thread, step.fn, *args)
                if inspect.isawaitable(update):
                    # A plain callable returning a coroutine (``lambda s: client.call(s)``).
                    update = await update
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled: the run stops here, nothing saved
            # The step raised CancelledError itself, nobody cancelled us: a failure.
            raise RuntimeError(
                f"step {step.name!r} raised CancelledError without being cancelled"
            ) from exc
    except BaseException:
        _stream.abandon(attempt)
        raise
    finally:
        lost = await renewal.stop() if renewal is not None else None
    if lost is not None:
        _stream.abandon(attempt)
        raise lost
    plan.streamed = await _stream.aend(attempt)  # its events are stored before the commit
    return update


@types.coroutine
def _resumed(steps: Generator[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    """Go on awaiting ``steps``, which has just yielded ``yielded``: ``await``'s own protocol.

    What ``yield from`` does (PEP 380): what the task sends or throws goes to ``steps``,
    what ``steps`` yields goes to the task, so cancellation and the step's own errors
    reach the step exactly as if it had been awaited from the start.
    """
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - not handled: passed on to the step
            try:
                yielded = steps.throw(exc)
            except StopIteration as returned:
                result: T = returned.value
                return result
        else:
            try:
                yielded = steps.send(sent)
            except StopIteration as returned:
                result = returned.value
                return result


async def _aperform(effect: Effect, plan: Plan, store: Store) -> Any:
    kind = type(effect)
    if kind is Save:
        assert isinstance(effect, Save)
        return await _asave(effect, plan, store)
    if kind is Load:
        assert isinstance(effect, Load)
        return await store.aload(effect.run_id)
    if kind is Call:
        assert isinstance(effect, Call)
        return await _acall(effect, plan, store)
    if kind is Renewing:
        assert isinstance(effect, Renewing)
        holding = _AsyncRenewal(plan, store)
        try:
            result = await astep_through(effect.gen, lambda inner: _aperform(inner, plan, store))
        finally:
            lost = await holding.stop()
        if lost is not None:
            raise lost
        return result
    if kind is Announce:
        assert isinstance(effect, Announce)
        if effect.local:
            store.doorbell.ring()
        else:
            await aannounce(store)
        return None
    if kind is Together:
        assert isinstance(effect, Together)
        effects = effect.effects
        saves = [each.cp for each in effects if isinstance(each, Save)]
        if store.saves_together and len(saves) == len(effects) > 1:
            # A Map's children made in one transaction (SQLite: one commit, one fsync).
            return list(await store.asave_many(saves))
        return list(await asyncio.gather(*(_aone(each, store) for each in effects)))
    if kind is Now:
        return await astore_now(store)
    assert isinstance(effect, Pause)
    pausing = _AsyncRenewal(plan, store) if effect.base is not None else None
    try:
        await _clock.asleep(effect.seconds)
    finally:
        lost = await pausing.stop() if pausing is not None else None
    if lost is not None:
        raise lost
    return None


def _in_thread(fn: Any, *args: Any) -> Any:
    # StopIteration cannot cross into a future (asyncio would leave it unresolved, and
    # the run would hang): it becomes the step's error here, as PEP 479 does for
    # generators.
    try:
        return fn(*args)
    except StopIteration as exc:
        raise RuntimeError(f"the step raised StopIteration: {exc!r}") from exc


async def _arelease(plan: Plan, store: Store) -> None:
    """Async ``_runner._release``."""
    record = to_release(plan)
    if record is None:
        return
    try:
        await store.asave(record)
    except Exception as exc:  # noqa: BLE001 - any failure: the lease expires by itself
        logger.warning("run %r: could not give the lease back: %s", plan.run_id, exc)


async def arenew_once(plan: Plan, store: Store) -> BaseException | None:
    """Async ``_runner.renew_once``."""
    lost: BaseException | None = await astep_through(
        renew(plan), lambda e: _aperform(e, plan, store)
    )
    return lost


class _AsyncRenewal:
    """Renews a step's lease every third of it, from a timer; nothing if the step is short."""

    __slots__ = ("handle", "lost", "plan", "store", "task")

    def __init__(self, plan: Plan, store: Store, delay: float | None = None) -> None:
        self.plan = plan
        self.store = store
        self.lost: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        # On the clock seam, not the loop's own timer: a FakeClock moved by a test fires it.
        self.handle: _clock.Timer | None = _clock.call_later(
            plan.lease / 3 if delay is None else max(0.0, delay), self._tick
        )

    def _tick(self) -> None:
        self.handle = None
        self.task = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        lost = await arenew_once(self.plan, self.store)
        if lost is not None:
            self.lost = lost
            logger.error("run %r: %s", self.plan.run_id, lost)
            return
        self.handle = _clock.call_later(self.plan.lease / 3, self._tick)

    async def stop(self) -> BaseException | None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        task = self.task
        if task is not None and not task.done():
            # Let an in-flight renewal land: the run's next save builds on it.
            await _landed(_wait(task))
        if self.handle is not None:
            self.handle.cancel()
        return self.lost


async def _wait(task: asyncio.Task[None]) -> None:
    await task


async def _aone(effect: Load | Save, store: Store) -> Any:
    """One effect of a ``Together``: its result, or the exception it raised."""
    try:
        if isinstance(effect, Load):
            return await store.aload(effect.run_id)
        return await store.asave(effect.cp)
    except Exception as exc:  # noqa: BLE001 - handed back: the rule decides
        return exc
