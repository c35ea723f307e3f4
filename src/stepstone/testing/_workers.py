"""Bodies for the suite's concurrent workers: threads, tasks and spawned processes.

Each racing body exists once per form (sync, async) and is shared by the thread, task
and process variants; every barrier wait has a deadline naming the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .._checkpoint import Checkpoint
from .._errors import ConflictError
from .._registry import open_store
from .._runner import Step
from .._store import Store
from . import _barrier

Result = tuple[int, int, bool]


def _next(current: Checkpoint | None, worker: int, round_no: int) -> Checkpoint:
    """The checkpoint ``worker`` tries to put on top of ``current`` in round ``round_no``."""
    assert current is not None, f"racer {worker}: the race run vanished in round {round_no}"
    return Checkpoint(
        run_id=current.run_id,
        step=current.step + 1,
        state={"wins": [*current.state["wins"], worker]},
        version=current.version,
        step_names=(*current.step_names, f"round{round_no}"),
        created_at=current.created_at,
    )


def race_rounds(
    store: Store, run_id: str, rounds: int, worker: int, barrier: Any, put: Callable[[Result], Any]
) -> None:
    """Each round: everyone loads, then everyone tries to save on top of what it loaded."""
    who = f"racer {worker}"
    for round_no in range(rounds):
        _barrier.wait(barrier, who)
        current = store.load(run_id)
        _barrier.wait(barrier, who)
        try:
            store.save(_next(current, worker, round_no))
        except ConflictError:
            put((round_no, worker, False))
        else:
            put((round_no, worker, True))


async def arace_rounds(
    store: Store,
    run_id: str,
    rounds: int,
    worker: int,
    wait: Callable[[], Awaitable[Any]],
    put: Callable[[Result], Any],
) -> None:
    """``race_rounds`` with ``aload``/``asave``; ``wait`` is the barrier."""
    for round_no in range(rounds):
        await wait()
        current = await store.aload(run_id)
        await wait()
        try:
            await store.asave(_next(current, worker, round_no))
        except ConflictError:
            put((round_no, worker, False))
        else:
            put((round_no, worker, True))


async def race_tasks(store: Store, run_id: str, rounds: int, workers: int) -> list[Result]:
    """Race ``workers`` tasks on one store in one loop; return every round's outcome."""
    barrier = asyncio.Barrier(workers)
    results: list[Result] = []

    def waiter(worker: int) -> Callable[[], Awaitable[Any]]:
        return lambda: _barrier.within(barrier.wait(), f"racer task {worker} at the barrier")

    await _barrier.within(
        asyncio.gather(
            *(
                arace_rounds(store, run_id, rounds, w, waiter(w), results.append)
                for w in range(workers)
            )
        ),
        f"{workers} racing tasks",
        _barrier.PROCESS_TIMEOUT,
    )
    return results


def race_one_run(
    config: str,
    run_id: str,
    rounds: int,
    worker: int,
    barrier: Any,
    results: Any,
    mode: str = "sync",
) -> None:
    """A racing process (or thread with its own store): ``race_rounds`` in ``mode``."""
    store = open_store(config)
    if mode == "sync":
        with store:
            race_rounds(store, run_id, rounds, worker, barrier, results.put)
        return

    async def main() -> None:
        async with store:

            async def wait() -> None:
                await asyncio.to_thread(_barrier.wait, barrier, f"racer process {worker}")

            await arace_rounds(store, run_id, rounds, worker, wait, results.put)

    asyncio.run(main())


def _add(name: str, value: int) -> Step:
    return Step(name, lambda state: {name: value})


def _aadd(name: str, value: int) -> Step:
    async def fn(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {name: value}

    return Step(name, fn)


def run_many(config: str, prefix: str, count: int, mode: str = "sync") -> None:
    """Run ``count`` three-step workflows, one run_id each, to completion."""
    store = open_store(config)
    if mode == "sync":
        from .._runner import run  # noqa: PLC0415

        with store:
            for index in range(count):
                run(f"{prefix}-{index}", [_add("a", 1), _add("b", 2), _add("c", 3)], store)
        return
    from .._runner import arun  # noqa: PLC0415

    async def main() -> None:
        async with store:
            steps = [_aadd("a", 1), _add("b", 2), _aadd("c", 3)]
            for index in range(count):
                await arun(f"{prefix}-{index}", steps, store)

    asyncio.run(main())
