"""The fleet's workflows, their step functions, and the final state each run must reach.

Six kinds of run, chosen by the run's number: ``plain`` (steps only), ``signal`` (two
``WaitFor`` on the same signal name: the first consumes the first signal received, the
second the next one), ``sleep`` (a ``Sleep`` of a fraction of a second), ``map`` (a
``Map`` over three children of two steps), ``mixed`` (a ``WaitFor``, a ``Sleep`` and a
``Map``) and ``code`` (``mixed`` written as a ``@workflow`` function: ``ctx.step``,
``ctx.wait_for``, ``ctx.sleep``, ``ctx.map``; its result is ``mixed``'s final state).
Every step is ``effect``: it computes its update as a pure function of the state
(``update_of``), so the final state of every run is known from its input and the signals
it was sent (``expected_state``), then records its side effect, one JSON line appended
with ``O_APPEND`` to its process's log, then sleeps a little so that faults land inside
steps too.

Each side-effect line holds what the step saw in the store when it began: the record's
owner, epoch and saved step (``stored``), with monotonic times around that load. The
invariants use them to prove that no fenced owner's write landed (epochs and saved steps
never go back in time) and to count repeated executions of a step.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from stepstone import Map, Sleep, Step, StepContext, WaitFor, Workflow, current_call, workflow
from stepstone._journal import JOURNAL_KEY
from stepstone._store import Store

__all__ = [
    "CODE_KINDS",
    "CODE_MAP",
    "KINDS",
    "SIGNAL",
    "WORKFLOWS",
    "Process",
    "expected_state",
    "kind_of",
    "update_of",
]

#: The signal name every ``WaitFor`` of the fleet waits for.
SIGNAL = "approve"
#: Seconds a ``Sleep`` of the fleet sleeps.
NAP = 0.3
#: Children per ``Map``.
KIDS = 3
_MOD = 2**61 - 1


class Process:
    """What a worker process tells its steps: the store, its owner name and its log."""

    store: Store | None = None
    owner: str | None = None
    log_fd: int | None = None
    #: Seconds a step sleeps after its side effect: (least, most), picked per step.
    step_seconds: tuple[float, float] = (0.03, 0.15)


def _hash(*parts: object) -> int:
    digest = hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def update_of(state: dict[str, Any], index: int) -> dict[str, Any]:
    """Return step ``index``'s update of ``state``: pure, so the final state is known.

    ``acc`` chains every step's index into one number, so a step applied twice, skipped
    or applied to a stale state shows in the final state.
    """
    acc = int(state.get("acc", 0))
    return {
        f"v{index}": _hash(state.get("seed"), index) % 1000,
        "acc": (acc * 31 + index + 1) % _MOD,
        "trail": [*state.get("trail", []), index],
    }


def effect(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """A fleet step: compute the update, record the side effect, take a little time."""
    return _effect(state, ctx.run_id, ctx.step_index, ctx.attempt)


def code_effect(state: dict[str, Any], index: int) -> dict[str, Any]:
    """``effect`` as a code workflow's call (``ctx.step``): step ``index`` of the run."""
    call = current_call()
    assert call is not None, "code_effect runs inside a ctx.step"
    return _effect(state, call.run_id, index, call.attempt)


def _saved(cp: Any) -> int:
    """How far a record got: its saved step, or a code run's journaled calls."""
    journal = cp.state.get(JOURNAL_KEY) if isinstance(cp.state, dict) else None
    return len(journal) if isinstance(journal, list) else int(cp.step)


def _effect(state: dict[str, Any], run_id: str, index: int, attempt: int) -> dict[str, Any]:
    update = update_of(state, index)
    store, fd = Process.store, Process.log_fd
    if store is not None and fd is not None:
        t0 = time.monotonic_ns()
        cp = store.load(run_id)
        t1 = time.monotonic_ns()
        line = {
            "run": run_id,
            "step": index,
            "attempt": attempt,
            "pid": os.getpid(),
            "owner": None if cp is None else cp.owner,
            "mine": cp is not None and cp.owner == Process.owner,
            "epoch": None if cp is None else cp.epoch,
            "stored": None if cp is None else _saved(cp),
            "t0": t0,
            "t1": t1,
        }
        # One write of one line to an O_APPEND descriptor: lines never interleave, and a
        # SIGKILL leaves whole lines only (a line is far below PIPE_BUF-sized writes).
        os.write(fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
    least, most = Process.step_seconds
    spread = _hash(run_id, index) % 1000 / 1000
    time.sleep(least + (most - least) * spread)
    return update


def kid_items(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``Map`` items: one child input per child, from the parent's seed."""
    return [{"seed": state["seed"], "kid": k} for k in range(KIDS)]


def _steps(*names: str) -> list[Any]:
    return [Step(name, effect) for name in names]


CHILD = Workflow("fleet-child", _steps("c0", "c1"))
WORKFLOWS: dict[str, Workflow] = {
    "plain": Workflow("fleet-plain", _steps("s0", "s1", "s2", "s3", "s4")),
    "signal": Workflow(
        "fleet-signal",
        [
            *_steps("s0", "s1"),
            WaitFor("first", SIGNAL),
            *_steps("s3"),
            WaitFor("second", SIGNAL),
            *_steps("s5"),
        ],
    ),
    "sleep": Workflow("fleet-sleep", [*_steps("s0"), Sleep("nap", duration=NAP), *_steps("s2")]),
    "map": Workflow("fleet-map", [*_steps("s0"), Map("kids", CHILD, kid_items), *_steps("s2")]),
    "mixed": Workflow(
        "fleet-mixed",
        [
            *_steps("s0"),
            WaitFor("first", SIGNAL),
            Sleep("nap", duration=NAP),
            Map("kids", CHILD, kid_items),
            *_steps("s4"),
        ],
    ),
}


@workflow("fleet-code")
def code_flow(ctx: Any, input: dict[str, Any]) -> dict[str, Any]:
    """``mixed`` as a code workflow: a call, a wait, a sleep, a map, a call.

    Its result is the state ``mixed`` ends with (the step indices are the list's), so
    the same expected state and side-effect rules check it.
    """
    state = dict(input)
    state.update(ctx.step("s0", code_effect, state, 0))
    state["first"] = ctx.wait_for(SIGNAL)
    state["nap"] = ctx.sleep(NAP).isoformat()
    state["kids"] = ctx.map("kids", CHILD, kid_items(state))
    state.update(ctx.step("s4", code_effect, state, 4))
    return state


WORKFLOWS["code"] = code_flow
#: The kinds that are code workflows, and the step list each one's result must equal.
CODE_KINDS = {"code": "mixed"}
#: ``ctx.map`` names its children by its journal name.
CODE_MAP = "@map:kids#1"
KINDS = tuple(WORKFLOWS)
#: Every workflow a fleet worker serves (the child one comes with the Maps).
SERVED = list(WORKFLOWS.values())


def kind_of(number: int, kinds: tuple[str, ...] = ()) -> str:
    """Return the kind of run number ``number`` (among ``kinds``, or all of them)."""
    among = kinds or KINDS
    return among[number % len(among)]


def waits_of(kind: str) -> int:
    """Return how many signals a run of ``kind`` consumes."""
    kind = CODE_KINDS.get(kind, kind)
    return sum(isinstance(step, WaitFor) for step in WORKFLOWS[kind].steps)


def _final(workflow: Workflow, state: dict[str, Any], payloads: list[Any]) -> dict[str, Any]:
    state = dict(state)
    consumed = 0
    for index, step in enumerate(workflow.steps):
        if isinstance(step, Step):
            state.update(update_of(state, index))
        elif isinstance(step, WaitFor):
            state[step.name] = payloads[consumed]
            consumed += 1
        elif isinstance(step, Sleep):
            state[step.name] = NAP_MARK
        elif isinstance(step, Map):
            state[step.name] = [_final(step.workflow, item, []) for item in step.items(state)]
    return state


#: Stands for a ``Sleep``'s merged wake-up time in an expected state (checked apart:
#: it is a time, not a function of the input).
NAP_MARK = "<wake time>"


def expected_state(kind: str, input: dict[str, Any], payloads: list[Any]) -> dict[str, Any]:
    """Return the exact final state of a run of ``kind`` from ``input``.

    ``payloads`` are the payloads of the signals it received, in arrival order (only the
    first ``waits_of(kind)`` are consumed). A ``Sleep``'s value is ``NAP_MARK``.
    """
    return _final(WORKFLOWS[CODE_KINDS.get(kind, kind)], input, payloads)
