"""The generated workflow: steps, states and run ids, all derived from ``(seed, case)``.

Nothing here touches a store or a process: the driver computes the crash-free states
from these functions alone, and every child builds the same workflow from the same seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from typing import Any

__all__ = [
    "DEFAULT_BUDGET",
    "StepSpec",
    "Workflow",
    "digest",
    "expected_states",
    "make_workflow",
    "payload",
    "step_output",
]

#: Largest state a default (CI) run generates; ``--big`` goes near each backend's limit.
DEFAULT_BUDGET = 256 * 1024
#: A long-state case (``Workflow.grow``): its first step writes a transcript this long,
#: above ``stepstone._statelog.INLINE_MAX`` many times over, so every save of the run keeps
#: its state in pieces and reaches the backend's ``piece_kill_points``...
LONG_SEED = 40 * 1024
#: ... and every step appends an entry of up to this many characters to it (a log piece,
#: and every few steps a new base, which collects the old pieces).
LONG_GROW = 6 * 1024
SLOTS = 3  # state keys the big payloads rotate through, so the state stays within budget


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One generated step: its name, payload size and slot, and how it fails."""

    index: int
    name: str
    size: int
    slot: int
    fail: int  # attempts that raise (attempt number <= fail)
    max_attempts: int | None  # None: no retry policy (a failure ends the process's run)


@dataclasses.dataclass(frozen=True)
class Workflow:
    """A generated workflow: its steps and the lengths it is run with, growing."""

    key: str
    steps: tuple[StepSpec, ...]
    stages: tuple[int, ...]  # step counts passed to run(); the last is len(steps)
    run_id: str
    #: Characters each step appends to the ``transcript`` list (0: no transcript).
    grow: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)


_NAME_WORDS = ("fetch", "parse", "embed", "rank", "store", "notify", "ü-norm", "日本", "x y")
_RUN_ID_SHAPES = ("chaos/{k}", "Chaos {k}", "../chaos-{k}", "é-{k}-日本", "{k}?x=1#y", "{long}")


def make_workflow(
    seed: int,
    case: int,
    budget: int = DEFAULT_BUDGET,
    max_deaths: int = 8,
    long: bool | None = None,
) -> Workflow:
    """Return the workflow of ``(seed, case)``: the same one in every process, every time.

    ``long``: the run also keeps a growing transcript (``Workflow.grow``), a long state
    saved in pieces; None: half the cases, chosen by their own seeded draw (so the steps
    of a case are the same either way), True: every case, False: none.
    """
    rng = random.Random(f"stepstone-chaos:{seed}:{case}:workflow")
    count = rng.randint(1, 12)
    slot_size = max(1, int(budget * 0.9) // SLOTS - 64)
    big_step = rng.randrange(count) if rng.random() < 0.3 else -1
    steps = []
    for index in range(count):
        if index == big_step:
            size = rng.randint(slot_size // 2, slot_size)
        else:
            size = int(math.exp(rng.uniform(0, math.log(slot_size + 1)))) - 1
        kind = rng.random()
        if kind < 0.25:  # retried with zero delay; the budget covers every planned death
            fail = rng.randint(1, 3)
            policy: int | None = fail + 1 + max_deaths
        elif kind < 0.35:  # retried, never fails: attempts are still counted durably
            fail, policy = 0, 1 + max_deaths
        elif kind < 0.40:  # no retry: StepFailed, and the next process's run() tries again
            fail, policy = 1, None
        else:
            fail, policy = 0, None
        name = f"s{index}-{rng.choice(_NAME_WORDS)}"
        steps.append(StepSpec(index, name, size, rng.randrange(SLOTS), fail, policy))
    stages = sorted({rng.randint(1, count) for _ in range(rng.randint(0, 2))} | {count})
    shape = rng.choice(_RUN_ID_SHAPES)
    run_id = shape.format(k=f"{seed}-{case}", long=f"{seed}-{case}-" + "L" * 600)
    if long is None:
        long = random.Random(f"stepstone-chaos:{seed}:{case}:long").random() < 0.5
    grow = random.Random(f"stepstone-chaos:{seed}:{case}:grow").randint(512, LONG_GROW)
    return Workflow(f"{seed}:{case}", tuple(steps), tuple(stages), run_id, grow if long else 0)


def payload(key: str, size: int) -> str:
    """Return a deterministic string of ``size`` characters (non-ASCII at the front)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return ("é🚀" + digest * (size // 64 + 1))[:size]


def step_output(wf: Workflow, index: int, state: dict[str, Any]) -> dict[str, Any]:
    """The step's update: depends on the incoming state, so a wrong input shows in the output."""
    spec = wf.steps[index]
    acc = state.get("acc", 7)
    if not isinstance(acc, int):
        acc = -999_999  # a state the step never produced: the result will not match
    # Mostly above 2**53 on purpose: Cosmos DB keeps JSON numbers as doubles, and a store
    # that let it round them would change the state across a resume (found here; fixed
    # in 39a5ecd, test_regressions.py: test_cosmos_rounds_integers_beyond_2_53_silently).
    acc = (acc * 1_000_003 + (index + 1) * 7919 + len(state)) % (2**61 - 1)
    out: dict[str, Any] = {
        "acc": acc,
        "last": spec.name,
        f"n{index}": [index, spec.size],
        f"slot{spec.slot}": payload(f"{wf.key}:{index}", spec.size),
    }
    if wf.grow:
        # A new list whose head is the incoming one: an append, as a chat step does.
        transcript = state.get("transcript")
        if not isinstance(transcript, list):
            transcript = [payload(f"{wf.key}:seed", LONG_SEED)]
        size = wf.grow // 2 + (index * 997) % (wf.grow // 2 + 1)
        out["transcript"] = [
            *transcript,
            {"step": index, "text": payload(f"{wf.key}:t{index}", size)},
        ]
    return out


def expected_states(wf: Workflow) -> list[dict[str, Any]]:
    """Return the crash-free state after each step, computed without the runner or a store."""
    states: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    for index in range(len(wf.steps)):
        state = json.loads(json.dumps({**state, **step_output(wf, index, state)}))
        states.append(state)
    return states


def digest(state: Any) -> str:
    """Return a short digest of a JSON value (key order ignored)."""
    text = json.dumps(state, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
