"""The benchmark's workload: a state of a chosen size, the steps, their plain twin.

Shared by ``stepstone bench`` (``_bench.py``) and the repository's ``benchmarks/``
scripts, so that both measure the same work.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._checkpoint import Checkpoint
from ._runner import Step

__all__ = [
    "BENCH_PREFIX",
    "STEPS",
    "bench_checkpoint",
    "make_steps",
    "plain_of",
    "state_of_size",
]

#: Every run the benchmarks create has a run_id starting with this.
BENCH_PREFIX = "__stepstone_bench__/"
#: Steps per benchmark run.
STEPS = 10


def state_of_size(nbytes: int) -> dict[str, Any]:
    """Return a JSON state of about ``nbytes`` encoded bytes: one long string and metadata.

    The same state ``benchmarks/peers/peers.py`` gives every peer library, so figures
    compare across libraries.
    """
    state: dict[str, Any] = {
        "payload": "",
        "meta": {"user": "u-123", "tags": ["a", "b", "c"], "n": 1},
    }
    state["payload"] = "x" * max(0, nbytes - _json_len(state))
    return state


def _json_len(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def make_steps(payload: Mapping[str, Any], count: int = STEPS) -> list[Step]:
    """Return ``count`` steps: the first adds ``payload`` (the ~1 KB), each adds one key."""

    def first(state: dict[str, Any]) -> dict[str, Any]:
        return {"payload": payload, "k0": 0}

    def make(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        key = f"k{i}"

        def step(state: dict[str, Any]) -> dict[str, Any]:
            return {key: i}

        return step

    return [Step("s0", first)] + [Step(f"s{i}", make(i)) for i in range(1, count)]


def plain_of(steps: Sequence[Step]) -> Callable[[], dict[str, Any]]:
    """Return a function doing what ``run`` does minus durability: call, merge updates."""
    fns = [step.fn for step in steps]

    def plain() -> dict[str, Any]:
        state: dict[str, Any] = {}
        for fn in fns:
            update = fn(state)
            if update:
                state.update(update)
        return state

    return plain


def bench_checkpoint(run_id: str, state: dict[str, Any], version: str | None) -> Checkpoint:
    return Checkpoint(
        run_id=run_id,
        step=STEPS - 1,
        state=state,
        version=version,
        step_names=tuple(f"s{i}" for i in range(STEPS)),
        total_steps=STEPS,
    )
