"""Moving a run onto a newer version of its workflow: ``upgrade``, and the worker's rule.

``Workflow("report", steps, version="3", upgrades={"2": fn})`` declares that a run
recorded under version "2" may go on under version "3", its state replaced by
``fn(state)``. The move happens at a step boundary (after the run's last completed
step, which is all a stored record ever is) and is one compare-and-swap of the run's
record: a crash leaves the old run or the upgraded one, never a mix.

The rules (``upgraded``, no I/O):

- Same workflow name, and a version the new workflow names in ``upgrades``.
- The steps the run completed must be the first steps of the new version, by name and
  in order. A completed step that was renamed or removed is refused
  (``WorkflowChanged`` naming it): a step's name is the record of what was done, and a
  rename cannot be told from another step. Keep the old name (the function may
  change). Steps after the boundary may be anything.
- The step at the boundary (the one the run is at) goes on as it stands when the new
  version has a step there that waits for the same thing: a ``WaitFor`` on the signal
  the run waits for, a ``Sleep`` (its recorded wake-up stays), the ``Map`` whose
  children the run holds. Otherwise the new version's step there starts afresh: what
  the run waited for, its due time and its attempt count are cleared. Children in
  flight that the new version's step would not collect are refused.
- ``fn`` gets a copy of the state and returns the new state, a JSON dict. If it raises
  (or returns something else) nothing is written.
- A code workflow (``@workflow(..., upgrades=...)``) is one step, so its boundary is
  the call its run waits at: the wait goes on (its due time stays), and on resume the
  new function must make the calls its journal recorded, in order (``WorkflowChanged``
  parks the run otherwise). ``fn`` may change the journaled results, not which calls
  were made. A run waiting for a ``ctx.map``'s children is refused until they end.
- Nothing else changes: input, signals, consumed counts, the failure record, the
  epoch and the run's times stay as they were.

Where it is applied:

- A worker serving the new version claims a run of the old version (``Worker``'s
  table maps the old (name, version) to the new workflow, ``routes``): the upgraded
  record *is* the claim. A run whose upgrade is refused (or whose ``fn`` raises) is
  left untouched, logged, and not looked at again for a minute (``worker._watch.RECHECK``),
  so a worker still serving the old version can finish it.
- ``upgrade``/``aupgrade``: one run, explicitly (``stepstone runs upgrade``), for runs
  not due yet (a worker only loads a waiting run once it is due).
- ``run``/``arun`` do not upgrade: they refuse a run of another version
  (``WorkflowChanged``); an upgrade rewrites stored state, so it is asked for by name.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from . import _hooks
from ._acquire import watch_lease
from ._checkpoint import Checkpoint, evolve
from ._checks import renamed_at
from ._code import CodeStep
from ._codec import encode_state, pristine
from ._control import _async, _sync
from ._effects import Effect, Load, Save
from ._errors import (
    ConflictError,
    InvalidState,
    InvalidWorkflow,
    RunNotActive,
    RunNotFound,
    WorkflowChanged,
    safe_text,
)
from ._journal import JOURNAL_KEY, journal_of, recorded_calls
from ._observe import logger
from ._steps import Workflow
from ._store import Store
from ._suspend import Map, Sleep, WaitFor, child_run_id

__all__ = ["aupgrade", "routes", "upgrade", "upgrade_op", "upgraded"]

State = dict[str, Any]
Key = tuple[str, str | None]

# Each retry means another writer (a signal, a worker's claim) changed the record
# between our load and our save.
_MAX_TRIES = 100


def routes(table: Mapping[Key, Workflow]) -> dict[Key, Workflow]:
    """Return ``table`` (served (name, version) -> workflow) plus the versions they upgrade.

    A version served as itself stays served as itself: a worker given both version 2
    and version 3 (upgrading from 2) runs version 2's runs as version 2.

    Raises:
        InvalidWorkflow: two served workflows declare an upgrade from one version.
    """
    served = dict(table)
    for workflow in table.values():
        for old in workflow.upgrades:
            key = (workflow.name, old)
            if key in table:
                continue
            known = served.get(key)
            if known is not None and known is not workflow:
                raise InvalidWorkflow(
                    f"workflows {workflow.name!r} version {known.version!r} and version "
                    f"{workflow.version!r} both upgrade runs of version {old!r}; serve one "
                    "of them, or drop one's upgrade from that version"
                )
            served[key] = workflow
    return served


def _refused(cp: Checkpoint, workflow: Workflow, why: str, position: int) -> WorkflowChanged:
    return WorkflowChanged(
        f"run {cp.run_id!r} cannot be upgraded from workflow {cp.workflow!r} version "
        f"{cp.workflow_version!r} to version {workflow.version!r}: {why}; the run was left "
        "as it was",
        cp.run_id,
        position,
    )


def _check_steps(cp: Checkpoint, workflow: Workflow) -> None:
    """Refuse unless the steps ``cp`` completed are the first steps of ``workflow``."""
    names = tuple(step.name for step in workflow.steps)
    done = cp.step_names
    renamed = renamed_at(names, done)
    if renamed is not None:
        position, recorded, there = renamed
        raise _refused(
            cp,
            workflow,
            f"it completed step {recorded!r} at position {position}, where version "
            f"{workflow.version!r} has {there}. The steps a run completed must be the "
            f"first steps of the new version, in order ({', '.join(map(repr, done))}); "
            "a renamed or removed completed step is refused: keep its old name (its "
            "function may change), or leave the run to a worker serving version "
            f"{cp.workflow_version!r}",
            position,
        )


def _goes_on(cp: Checkpoint, step: Any) -> bool:
    """Return whether ``step`` (the new version's, at the boundary) continues ``cp``'s wait."""
    if cp.children:
        return isinstance(step, Map) and cp.children[0] == child_run_id(cp.run_id, step.name, 0)
    waiting_for = cp.waiting_for
    if waiting_for is None:
        # Between two attempts (given back, or failed): the attempts counted are this
        # step's if the saved failure names it.
        return cp.failure is not None and cp.failure.step_name == step.name
    if isinstance(step, WaitFor):
        return waiting_for == f"signal {step.signal}"
    if isinstance(step, Sleep):
        return waiting_for == "timer"
    return False


def upgraded(cp: Checkpoint, workflow: Workflow) -> Checkpoint:
    """Return ``cp`` moved onto ``workflow`` (which upgrades its version), not yet saved.

    Raises:
        WorkflowChanged: ``workflow`` does not upgrade ``cp``'s workflow and version, the
            steps ``cp`` completed are not its first steps (the message names the step),
            the run holds children ``workflow`` would not collect, or ``fn`` raised (it
            is the ``__cause__``).
        InvalidState: ``fn`` returned a state that is not JSON (the path is named).
    """
    if cp.workflow != workflow.name or cp.workflow_version not in workflow.upgrades:
        declared = ", ".join(repr(v) for v in workflow.upgrades) or "no version"
        raise _refused(
            cp,
            workflow,
            f"workflow {workflow.name!r} version {workflow.version!r} upgrades runs of "
            f"{declared} only",
            -1,
        )
    _check_steps(cp, workflow)
    position = cp.step + 1
    step = workflow.steps[position] if position < len(workflow.steps) else None
    code = isinstance(step, CodeStep)
    # A code workflow's function resumes from the top: its journal answers each call
    # before the one it waits at, and that wait keeps its recorded due time.
    goes_on = code or (step is not None and _goes_on(cp, step))
    if cp.children and code:
        raise _refused(
            cp,
            workflow,
            f"it waits for {len(cp.children)} child runs of a ctx.map call, which the new "
            "function might not make at that position. Upgrade it once that call is "
            "journaled",
            position,
        )
    if cp.children and not goes_on:
        raise _refused(
            cp,
            workflow,
            f"it is at a Map step with {len(cp.children)} child runs in flight, and version "
            f"{workflow.version!r} has no Map of that name at position {position} to collect "
            "them. Upgrade it once that step has completed",
            position,
        )
    fn = workflow.upgrades[cp.workflow_version]
    try:
        state = fn(pristine(cp))
    except Exception as exc:
        raise _refused(
            cp,
            workflow,
            f"the upgrade function raised {type(exc).__name__}: {safe_text(exc, 500)}",
            position,
        ) from exc
    if not isinstance(state, dict):
        raise _refused(
            cp,
            workflow,
            f"the upgrade function returned a {type(state).__name__}; it must return the "
            "new state, a dict",
            position,
        )
    try:
        state = encode_state(state)[1]
    except InvalidState as exc:
        raise InvalidState(
            f"run {cp.run_id!r}: the upgrade to version {workflow.version!r} returned a "
            f"state that is not JSON: {exc}; the run was left as it was",
            exc.path,
        ) from exc
    if code:
        _check_journal(cp, workflow, state, position)
    _hooks.fire("upgrade.transformed")  # fn returned; nothing of the upgrade is written yet
    moved = evolve(
        cp,
        workflow_version=workflow.version,
        state=state,
        state_json=None,  # the stored text is the old state's
        total_steps=len(workflow.steps),
    )
    if goes_on:
        return moved
    # The new version's step at the boundary starts afresh: what the old one waited
    # for (its signal, its deadline) and its attempts are not this step's.
    return evolve(moved, waiting_for=None, wake_at=None, attempt=0)


def _check_journal(cp: Checkpoint, workflow: Workflow, state: State, position: int) -> None:
    """Refuse an upgraded code run's state unless it keeps the journal's calls as they were.

    The function may change what a journaled call returned (its results are the
    state's), but not which calls were made: a dropped entry would run a paid call again.
    """
    try:
        before = [(e["seq"], e["call"]) for e in journal_of(pristine(cp))]
        after = [
            (e["seq"], e["call"]) for e in recorded_calls(cp.run_id, journal_of(state)).values()
        ]
    except InvalidWorkflow as exc:
        raise _refused(cp, workflow, f"the upgrade function returned {exc}", position) from None
    if sorted(after) != sorted(before):
        raise _refused(
            cp,
            workflow,
            f"the upgrade function changed the journaled calls under {JOURNAL_KEY!r} "
            f"({len(before)} calls before, {len(after)} after); it may change their "
            "results, not which calls were made",
            position,
        )


def _advice(workflow: Workflow) -> str:
    """What ``RunOwned`` tells the caller of ``upgrade`` whose run an owner executes."""
    return (
        "try again once it waits or is given back, or let a worker serving version "
        f"{workflow.version!r} upgrade it when it claims it"
    )


def upgrade_op(run_id: str, workflow: Workflow) -> Generator[Effect, Any, Checkpoint]:
    """``upgrade`` as a generator of ``Load``/``Save`` effects (a compare-and-swap loop)."""
    if not isinstance(workflow, Workflow):
        raise InvalidWorkflow(f"upgrade needs a Workflow, got {type(workflow).__name__}")
    for _ in range(_MAX_TRIES):
        cp: Checkpoint | None = yield Load(run_id)
        if cp is None:
            raise RunNotFound(f"run {run_id!r} does not exist; nothing was upgraded", run_id)
        if (cp.workflow, cp.workflow_version) == workflow.key:
            return cp  # upgraded already (by a worker, or an earlier call)
        status = cp.status
        if status in ("done", "cancelled"):
            raise RunNotActive(
                f"run {run_id!r} is {status}: there is nothing left to upgrade (queued, "
                "waiting, failed and given-back runs can be)",
                run_id,
                status,
            )
        if cp.owner is not None:
            # Only a live lease blocks, as for rerun: an owner that wrote nothing for a
            # whole lease (by our clock), or is known dead on this machine, is taken
            # over. The upgrade's compare-and-swap then fences it: its next write
            # conflicts, and the run is claimable at once.
            cp = yield from watch_lease(run_id, cp, _advice(workflow))
            if cp.owner is not None or cp.status in ("done", "cancelled"):
                continue  # it finished meanwhile: read it again, and say so
        new = upgraded(cp, workflow)
        try:
            saved: Checkpoint = yield Save(new, "upgrade", owned=False)
        except ConflictError:
            continue
        logger.info(
            "run %r: upgraded from workflow %r version %r to version %r after step %d",
            run_id,
            workflow.name,
            cp.workflow_version,
            workflow.version,
            cp.step,
        )
        return saved
    raise ConflictError(f"run {run_id!r}: {_MAX_TRIES} other writers got in first", run_id)


def upgrade(store: Store, run_id: str, workflow: Workflow) -> Checkpoint:
    """Move one run of an older version onto ``workflow``, by its declared ``upgrades``.

    The run must be at rest (queued, waiting, failed or given back): the upgraded
    record is saved by compare-and-swap on the version read, so a run that moves
    meanwhile is read again. A run whose owner died is taken over first, as ``rerun``
    does: at once if the owner was a process of this machine that no longer exists,
    else once it has written nothing for a whole lease (this call waits that long). A
    run of ``workflow``'s version already is returned as it is. Workers upgrade the runs
    they claim by themselves; this is for runs that are not due yet (a waiting run is
    loaded by a worker only when it is due).

    Returns:
        The stored record, now of ``workflow``'s version.

    Raises:
        RunNotFound: no such run.
        RunNotActive: the run is done or cancelled.
        RunOwned: someone executes the run now (its record changed while this call
            watched its lease); it is upgraded between executions.
        WorkflowChanged: ``workflow`` does not upgrade the run's version, or the steps
            the run completed are not its first steps (the message names the step), or
            the upgrade function raised (its ``__cause__``). Nothing was written.
        InvalidState: the upgrade function returned a state that is not JSON.
        StoreError: the store failed.
    """
    result: Checkpoint = _sync(upgrade_op(run_id, workflow), store)
    return result


async def aupgrade(store: Store, run_id: str, workflow: Workflow) -> Checkpoint:
    """Async ``upgrade``."""
    result: Checkpoint = await _async(upgrade_op(run_id, workflow), store)
    return result
