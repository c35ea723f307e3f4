"""Process bodies for the contract suite's concurrency tests (importable under spawn)."""

from __future__ import annotations

from typing import Any

from .._checkpoint import Checkpoint
from .._errors import ConflictError
from .._registry import open_store
from .._runner import Step, run


def race_one_run(
    config: str, run_id: str, rounds: int, worker: int, barrier: Any, results: Any
) -> None:
    """Each round: everyone loads, then everyone tries to save on top of what it loaded."""
    with open_store(config) as store:
        for round_no in range(rounds):
            barrier.wait()
            cp = store.load(run_id)
            assert cp is not None
            barrier.wait()
            wins = [*cp.state["wins"], worker]
            try:
                store.save(
                    Checkpoint(
                        run_id=run_id,
                        step=cp.step + 1,
                        state={"wins": wins},
                        version=cp.version,
                        step_names=(*cp.step_names, f"round{round_no}"),
                        created_at=cp.created_at,
                    )
                )
            except ConflictError:
                results.put((round_no, worker, False))
            else:
                results.put((round_no, worker, True))


def _add(name: str, value: int) -> Step:
    return Step(name, lambda state: {name: value})


def run_many(config: str, prefix: str, count: int) -> None:
    """Run ``count`` three-step workflows, one run_id each, to completion."""
    steps = [_add("a", 1), _add("b", 2), _add("c", 3)]
    with open_store(config) as store:
        for index in range(count):
            run(f"{prefix}-{index}", steps, store)
