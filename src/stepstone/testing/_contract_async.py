"""``AsyncContract``: the tests only the async form has (things in flight at once).

Many runs in one loop on one store, cancellation inside a step and inside a save, a
sync-only third-party store under ``arun``, where plain and async steps run, and a
check that a save held up inside the store never blocks the event loop. The hold is
injected at the backend's kill points (``kill_point``) or, for a backend without
any, by wrapping its ``save``; nothing here measures time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any, ClassVar, Self

import pytest

from .._checkpoint import Checkpoint
from .._errors import InvalidWorkflow
from .._registry import open_store
from .._runner import Step, StepContext
from .._store import RunInfo, Store
from . import _barrier
from ._base import ContractBase
from ._ops import Ops
from ._points import KillPoint, kill_point

__all__ = ["AsyncContract"]

State = dict[str, Any]


class SaveGate:
    """Call ``inside(point)`` once, inside the first save the store makes after ``arm()``.

    "Inside" is the first of the backend's kill points that fires (in whatever thread
    the save runs: a worker thread for a thread-backed ``asave``, the loop thread for a
    native async driver). A backend without kill points gets its ``save`` wrapped on the
    instance instead, which the default, thread-backed ``asave`` calls (and so do
    backends whose ``asave`` calls ``save``); a backend whose ``asave`` bypasses ``save``
    and declares no kill points cannot be held, and the tests using the gate skip.
    """

    WRAPPED: ClassVar[str] = "Store.save (wrapped)"

    def __init__(
        self, store: Store, points: Collection[str], inside: Callable[[str], None]
    ) -> None:
        self.store = store
        self.points = frozenset(points)
        self.inside = inside
        self.fired: str | None = None
        self._armed = False
        self._lock = threading.Lock()
        self._point: KillPoint | None = None

    def arm(self) -> None:
        """Act at the next save."""
        self._armed = True

    def _take(self, point: str) -> bool:
        with self._lock:
            if not self._armed:
                return False
            self._armed = False
            self.fired = point
            return True

    def _at(self, point: str) -> None:
        if self._take(point):
            self.inside(point)

    def __enter__(self) -> Self:
        if self.points:
            self._point = kill_point(self.points, self._at)  # removed on exit
        else:
            real = self.store.save

            def save(checkpoint: Checkpoint) -> Checkpoint:
                if self._take(self.WRAPPED):
                    self.inside(self.WRAPPED)
                return real(checkpoint)

            self.store.save = save  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._point is not None:
            self._point.remove()
        else:
            del self.store.save


class Ticker:
    """A task counting its turns on the loop: proof that the loop kept running."""

    def __init__(self) -> None:
        self.ticks = 0
        self._goal: int | None = None
        self._reached = asyncio.Event()

    async def run(self) -> None:
        """Take a turn every millisecond until cancelled."""
        while True:
            self.ticks += 1
            if self._goal is not None and self.ticks >= self._goal:
                self._reached.set()
            await asyncio.sleep(0.001)

    async def progress(self, what: str) -> None:
        """Wait for three more turns; fail saying ``what`` did not happen in time."""
        self._goal = self.ticks + 3
        await _barrier.within(self._reached.wait(), what)


def _trail_step(index: int) -> Step:
    async def fn(state: State, ctx: StepContext) -> State:
        await asyncio.sleep(0)
        return {"trail": [*state.get("trail", []), index], "run": ctx.run_id}

    return Step(f"s{index}", fn)


class AsyncContract(ContractBase):
    """The async-only contract tests; ``StoreContract`` includes them."""

    @pytest.fixture
    def aops(self, store: Store) -> Iterator[Ops]:
        """The store in the async form, on one event loop for the whole test."""
        ops = Ops("async", store)
        try:
            yield ops
        finally:
            ops.close()

    @asynccontextmanager
    async def _fresh(self, store: Store, store_config: str) -> AsyncIterator[Store]:
        """A store of its own for one event loop: reopened if durable, else the shared one."""
        if not self.is_durable(store):
            yield store
            return
        async with open_store(store_config) as fresh:
            yield fresh

    def test_async_many_runs_in_one_loop(self, aops: Ops) -> None:
        """Hundreds of concurrent arun calls of 10 awaiting steps on one store end exactly."""
        from .._runner import arun  # noqa: PLC0415

        count = self.concurrent_runs
        steps = [_trail_step(i) for i in range(10)]
        store = aops.store

        async def main() -> dict[str, State]:
            tasks = {
                asyncio.create_task(arun(f"c-{n}", steps, store)): f"c-{n}" for n in range(count)
            }
            done, pending = await asyncio.wait(tasks, timeout=_barrier.PROCESS_TIMEOUT * 2)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=_barrier.WAIT_TIMEOUT)
                hung = sorted(tasks[t] for t in pending)
                raise AssertionError(f"{len(hung)} of {count} runs hung, e.g. {hung[:5]}")
            failed = [(tasks[t], t.exception()) for t in done if t.exception() is not None]
            if failed:
                raise AssertionError(f"{len(failed)} of {count} runs failed: {failed[:3]}")
            return {tasks[t]: t.result() for t in done}

        finals = aops.aio(main())
        assert len(finals) == count
        for run_id, final in finals.items():
            assert final == {"trail": list(range(10)), "run": run_id}, run_id
        infos: dict[str, RunInfo] = {i.run_id: i for i in aops.list_info()}
        assert set(infos) == set(finals)
        assert {(i.status, i.step) for i in infos.values()} == {("done", 9)}
        for run_id in list(finals)[:: max(1, count // 50)]:
            loaded = aops.load(run_id)
            assert loaded is not None and loaded.state == finals[run_id], run_id

    def test_async_cancel_inside_a_step(self, aops: Ops) -> None:
        """Cancelling arun in a step saves nothing for it, raises CancelledError; it resumes."""
        from .._runner import arun  # noqa: PLC0415

        store = aops.store
        log: list[str] = []

        async def a(state: State) -> State:
            log.append("a")
            return {"a": 1}

        async def main() -> tuple[Checkpoint | None, Checkpoint | None, State]:
            started = asyncio.Event()

            async def b_hangs(state: State) -> State:
                log.append("b")
                started.set()
                await asyncio.Event().wait()  # a model call that never answers
                return {"b": "never"}

            async def b(state: State) -> State:
                log.append("b2")
                return {"b": 2}

            steps = [Step("a", a), Step("b", b_hangs), Step("c", lambda s: {"c": 3})]
            task = asyncio.create_task(arun("r", steps, store))
            await _barrier.within(started.wait(), "step b to start")
            before = await store.aload("r")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await _barrier.within(task, "the cancelled arun to end")
            after = await store.aload("r")
            final = await arun(
                "r", [Step("a", a), Step("b", b), Step("c", lambda s: {"c": 3})], store
            )
            return before, after, final

        before, after, final = aops.aio(main())
        assert before is not None and after is not None
        assert (after.step, after.state, after.step_names) == (0, {"a": 1}, ("a",))
        assert (after.failure, after.attempt) == (None, before.attempt)
        assert after.owner is None, "the cancelled run gave its lease back"
        assert final == {"a": 1, "b": 2, "c": 3}
        assert log == ["a", "b", "b2"]

    def test_async_cancel_inside_a_save(self, store: Store, store_config: str) -> None:
        """Cancelled inside b's save, arun raises CancelledError; the checkpoint is old or new."""
        points = self.kill_points(store)
        for point in sorted(points) or [SaveGate.WRAPPED]:
            self._cancel_in_save_at(store, store_config, point, hooked=bool(points))

    def _cancel_in_save_at(self, store: Store, store_config: str, point: str, hooked: bool) -> None:
        from .._runner import arun  # noqa: PLC0415

        run_id = f"cancel-{point}"
        effects: list[str] = []

        def a(state: State) -> State:
            effects.append("a")
            return {"a": 1}

        async def cancel_in_save() -> str | None:
            loop = asyncio.get_running_loop()
            loop_thread = threading.get_ident()
            task: asyncio.Task[State] | None = None

            def inside(_: str) -> None:
                assert task is not None
                if threading.get_ident() == loop_thread:
                    task.cancel()  # delivered at the save's next await
                else:
                    loop.call_soon_threadsafe(task.cancel)

            async with self._fresh(store, store_config) as s:
                gate = SaveGate(s, [point] if hooked else [], inside)

                async def b(state: State) -> State:
                    effects.append("b")
                    gate.arm()  # b's checkpoint is the next save
                    return {"b": 2}

                with gate:
                    task = asyncio.create_task(arun(run_id, [Step("a", a), Step("b", b)], s))
                    with pytest.raises(asyncio.CancelledError):
                        await _barrier.within(task, f"arun cancelled inside its save at {point}")
                return gate.fired

        # asyncio.run returns only once every worker thread it lent has finished, so a
        # save still running in a thread when the task was cancelled has landed by then.
        fired = asyncio.run(cancel_in_save())
        if fired is None and not hooked:
            pytest.skip(f"{type(store).__name__}: no kill points, and asave does not call save")
        assert fired == point, f"the save of step b never reached {point}"

        async def resume() -> tuple[Checkpoint | None, State]:
            async with self._fresh(store, store_config) as s:
                seen = await s.aload(run_id)

                async def b(state: State) -> State:
                    effects.append("b")
                    return {"b": 2}

                return seen, await arun(run_id, [Step("a", a), Step("b", b)], s)

        seen, final = asyncio.run(resume())
        assert seen is not None, point
        assert (seen.step, seen.state) in ((0, {"a": 1}), (1, {"a": 1, "b": 2})), (point, seen)
        assert seen.step_names == ("a", "b")[: seen.step + 1], point
        assert final == {"a": 1, "b": 2}, point
        assert effects == (["a", "b"] if seen.step == 1 else ["a", "b", "b"]), point

    def test_async_sync_only_third_party_store(self, aops: Ops) -> None:
        """A Store subclass with only the sync methods works under arun, its I/O off the loop."""
        from .._runner import arun  # noqa: PLC0415

        inner = aops.store
        calls: list[tuple[str, int]] = []

        class SyncOnly(Store):
            """A minimal third-party backend: the five sync methods, nothing async."""

            scheme = "sync-only-test"

            @classmethod
            def from_config(cls, config: str) -> Self:
                raise NotImplementedError

            def load(self, run_id: str) -> Checkpoint | None:
                calls.append(("load", threading.get_ident()))
                return inner.load(run_id)

            def save(self, checkpoint: Checkpoint) -> Checkpoint:
                calls.append(("save", threading.get_ident()))
                return inner.save(checkpoint)

            def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
                calls.append(("delete", threading.get_ident()))
                return inner.delete(run_id, expected_version=expected_version)

            def list_runs(self) -> Iterator[str]:
                calls.append(("list_runs", threading.get_ident()))
                return inner.list_runs()

            def close(self) -> None:
                calls.append(("close", threading.get_ident()))

        third = SyncOnly()

        async def double(state: State) -> State:
            await asyncio.sleep(0)
            return {"b": state["a"] * 2}

        async def main() -> tuple[int, State, list[str], list[RunInfo], bool]:
            loop_thread = threading.get_ident()
            async with third:
                final = await arun("r", [Step("a", lambda s: {"a": 21}), Step("b", double)], third)
                ids = [run_id async for run_id in third.alist_runs()]
                infos = [info async for info in third.alist_info()]
                loaded = await third.aload("r")
                assert loaded is not None
                deleted = await third.adelete("r", expected_version=loaded.version)
            return loop_thread, final, ids, infos, deleted

        loop_thread, final, ids, infos, deleted = aops.aio(main())
        assert final == {"a": 21, "b": 42}
        assert ids == ["r"] and [(i.run_id, i.status) for i in infos] == [("r", "done")]
        assert deleted and aops.load("r") is None
        assert {name for name, _ in calls} >= {"load", "save", "delete", "list_runs", "close"}
        on_loop = [name for name, thread in calls if thread == loop_thread]
        assert on_loop == [], f"sync store methods ran on the event loop thread: {on_loop}"

    def test_async_plain_step_runs_in_a_worker_thread(self, aops: Ops) -> None:
        """Under arun a plain step runs in a worker thread and an async step on the loop."""
        from .._runner import arun  # noqa: PLC0415

        threads: dict[str, int] = {}

        def plain(state: State) -> State:
            threads["plain"] = threading.get_ident()
            return {"plain": True}

        async def awaited(state: State) -> State:
            threads["async"] = threading.get_ident()
            return {"async": True}

        async def main() -> State:
            threads["loop"] = threading.get_ident()
            return await arun("r", [Step("plain", plain), Step("async", awaited)], aops.store)

        assert aops.aio(main()) == {"plain": True, "async": True}
        assert threads["plain"] != threads["loop"], "a plain step blocked the event loop thread"
        assert threads["async"] == threads["loop"]

    def test_async_step_under_run_is_refused(self, store: Store) -> None:
        """run refuses a workflow with an async step up front, naming arun; nothing runs."""
        from .._runner import run  # noqa: PLC0415

        ran: list[str] = []

        def first(state: State) -> State:
            ran.append("first")
            return {"a": 1}

        async def second(state: State) -> State:
            ran.append("second")
            return {"b": 2}

        with pytest.raises(InvalidWorkflow, match="arun") as info:
            run("r", [Step("first", first), Step("second", second)], store)
        assert "second" in str(info.value)
        assert ran == []
        assert store.load("r") is None

    def test_async_loop_runs_while_a_save_is_held(self, aops: Ops, store_config: str) -> None:
        """While a save is held inside the store, other tasks on the loop keep making progress."""
        from .._runner import arun  # noqa: PLC0415

        store = aops.store
        points = self.kill_points(store)
        release = threading.Event()
        seen: dict[str, Any] = {}

        async def main() -> State | None:
            loop = asyncio.get_running_loop()
            loop_thread = threading.get_ident()
            held = asyncio.Event()

            def inside(point: str) -> None:
                seen["on_loop"] = threading.get_ident() == loop_thread
                if seen["on_loop"]:
                    return  # a native driver: it cannot be held from a sync hook
                loop.call_soon_threadsafe(held.set)
                release.wait(_barrier.WAIT_TIMEOUT)

            ticker = Ticker()

            gate = SaveGate(store, points, inside)

            async def a(state: State) -> State:
                gate.arm()  # a's checkpoint is the next save: hold it
                return {"a": 1}

            with gate:
                tick = asyncio.create_task(ticker.run())
                steps = [Step("a", a), Step("b", lambda state: {"b": 2})]
                running = asyncio.create_task(arun("r", steps, store))
                try:
                    what = "the save of step a to be held or the run to end"
                    if not await _barrier.set_first(held, running, what):
                        await running  # surfaces the run's own error, if it failed
                        return None
                    await ticker.progress(
                        f"another task's progress while a save was held at {gate.fired} "
                        "(stepstone blocked the event loop)"
                    )
                    assert not running.done(), "the held save finished before it was released"
                    seen["ticks_while_held"] = True
                    release.set()
                    return await _barrier.within(running, "the run after its save was released")
                finally:
                    release.set()
                    tick.cancel()

        final = aops.aio(main())
        if final is None:
            if "on_loop" not in seen and not points:
                pytest.skip(f"{type(store).__name__}: no kill points, and asave does not call save")
            if "on_loop" not in seen:
                raise AssertionError(f"no save reached a kill point among {sorted(points)}")
            if not type(store).native_async:
                raise AssertionError(
                    f"{type(store).__name__}.asave ran its save on the event loop thread, "
                    "though the store does not declare native_async"
                )
            hold = self.hold_saves(aops.store, store_config)
            if hold is None:
                pytest.skip(
                    f"{type(store).__name__} saves natively on the loop: a sync hook cannot "
                    "hold its driver, and the test class defines no hold_saves"
                )
            self._held_in_the_server(aops, points, hold)
            return
        assert seen.get("ticks_while_held") is True
        assert final == {"a": 1, "b": 2}

    # A native async backend's save cannot be held from a sync hook on the loop thread;
    # the test class may hold it in the server instead (a table lock, say).

    def hold_saves(
        self, store: Store, store_config: str
    ) -> AbstractContextManager[Callable[[], None]] | None:
        """Return a context in which the store's saves wait in the server until release().

        Entering takes the hold (loads must still be answered); the value is the release
        function. The default, None, skips the held-save test for native async backends;
        a backend's test class overrides it (tests/stores/test_contract.py does for SQL).
        """
        return None

    def _held_in_the_server(
        self, aops: Ops, points: Collection[str], hold: AbstractContextManager[Callable[[], None]]
    ) -> None:
        from .._runner import arun  # noqa: PLC0415

        store = aops.store
        # The run exists, so arun's first write is an update the server lock holds back.
        aops.save(Checkpoint(run_id="held", total_steps=2))
        steps = [Step("a", lambda s: {"a": 1}), Step("b", lambda s: {"b": 2})]

        async def main(release: Callable[[], None]) -> State:
            loop = asyncio.get_running_loop()
            sent = asyncio.Event()

            def inside(_: str) -> None:
                loop.call_soon_threadsafe(sent.set)

            gate = SaveGate(store, points, inside)
            ticker = Ticker()

            gate.arm()  # the claim is the first save
            with gate:
                tick = asyncio.create_task(ticker.run())
                running = asyncio.create_task(arun("held", steps, store))
                try:
                    sending = await _barrier.set_first(
                        sent, running, "the first save of the run to be sent"
                    )
                    assert sending, f"the run ended before its save was sent: {running!r}"
                    await ticker.progress(
                        f"another task's progress while a save waited in the server at "
                        f"{gate.fired} (stepstone blocked the event loop)"
                    )
                    if running.done():
                        outcome = running.exception() or "it finished"
                        raise AssertionError(
                            "the run ended while its save should have been waiting in the "
                            f"server; the loop was blocked until then? ({outcome!r})"
                        )
                    release()
                    return await _barrier.within(running, "the run after the server let go")
                finally:
                    tick.cancel()

        with hold as release:
            try:
                final = aops.aio(main(release))
            finally:
                release()
        assert final == {"a": 1, "b": 2}
