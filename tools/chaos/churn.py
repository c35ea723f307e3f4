"""Churn cases and the campaign's final sweep: long states deleted and started again.

A *churn* case (``Options.churn``: every 5th case, ``case % 5 == 2``) is a chain of child
processes, each doing a seeded list of operations on a few run ids: saves of long
states (over 8 KiB, each save appending to a transcript, so they are kept in pieces and
write new bases now and then), deletes of the same ids, runs started again under them,
and ``collect_orphans(0)``. Each child dies by SIGKILL at a planned occurrence of a kill
point inside a piece write (``pieces.piece``, ``pieces.written``), a collection after a
new base (``pieces.collect``), a delete (``pieces.deleting``), ``collect_orphans``
(``pieces.collecting``) or any of the backend's save points. Every operation is logged
(fsynced) as begun before it starts and as acknowledged when it returned, so after
each death the driver knows, for every id, the acknowledged outcome and the one in
flight: the stored run must load (never ``CorruptCheckpoint``) and hold one of them.

The *final sweep* (``final_sweep``), at the end of a shard: ``collect_orphans(0)`` with
every run still there must leave every run loading as before; then every run is
deleted, ``collect_orphans(0)`` runs again, and no piece may be left under any run id
the shard used (``pieces_left``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Iterable
from typing import Any

from stepstone import _hooks
from stepstone._checkpoint import Checkpoint
from stepstone._registry import open_store
from stepstone._store import Store

from .backends import cleanup_kill_points, save_kill_points
from .child import append_line, read_lines
from .workload import digest, payload

__all__ = ["CHURN_EVERY", "churn_ids", "churn_main", "check_churn", "final_sweep", "plan_churn"]

#: ``case % CHURN_EVERY == 2`` is a churn case when ``Options.churn`` is set.
CHURN_EVERY = 5
#: Operations one churn child does (if it is not killed first).
OPS = 24
#: A churn state starts above 8 KiB (``_statelog.INLINE_MAX``), so it is kept in pieces.
SEED_SIZE = 12 * 1024


#: Kill points after which pieces no document names may be left (a first save's, or a
#: deleted run's): the next process's collection has something to delete.
_LEAVES_ORPHANS = ("pieces.piece", "pieces.written", "pieces.deleting")


def churn_ids(seed: int, case: int) -> list[str]:
    """The run ids a churn case deletes and starts again (three, shaped like real ids)."""
    return [f"churn/{seed}-{case}/{n}" for n in range(3)]


def plan_churn(rng: random.Random, backend: str) -> dict[str, Any]:
    """A kill plan for a churn child: a piece, clean-up or save point and an occurrence."""
    # The clean-up points three times over: only some operations reach them.
    points = [*cleanup_kill_points(backend)] * 3 + [*save_kill_points(backend)]
    return {"point": rng.choice(points), "nth": rng.randint(1, 4)}


def _next_state(prev: dict[str, Any] | None, key: str, n: int) -> dict[str, Any]:
    """A new life's first state, or ``prev`` with one more transcript entry (an append)."""
    if prev is None:
        life = f"{key}:{time.time_ns()}"
        return {"life": life, "n": 0, "transcript": [payload(life, SEED_SIZE)]}
    entry = {"n": n, "text": payload(f"{prev['life']}:{n}", 512 + (n * 997) % 4096)}
    return {**prev, "n": n, "transcript": [*prev["transcript"], entry]}


class _Killer:
    def __init__(self, kill: dict[str, Any] | None) -> None:
        self.kill = kill
        self.count = 0

    def __call__(self, point: str) -> None:
        if self.kill is not None and point == self.kill["point"]:
            self.count += 1
            if self.count == self.kill["nth"]:
                import os  # noqa: PLC0415
                import signal  # noqa: PLC0415

                os.kill(os.getpid(), signal.SIGKILL)


def churn_main(spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One churn child: ``OPS`` seeded operations, each logged as begun and acknowledged."""
    _hooks.install(_Killer(spec.get("kill")))
    if spec.get("mode") == "async":
        return asyncio.run(_achurn(spec))
    with open_store(spec["config"]) as store:
        for op, run_id in _ops(spec):
            _do(spec, op, run_id, store.load, store.save, store.delete, store.collect_orphans)
    return 0, {}


async def _achurn(spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with open_store(spec["config"]) as store:
        for op, run_id in _ops(spec):
            if op == "save":
                cp = await store.aload(run_id)
                new = _new_checkpoint(run_id, cp)
                _log(spec, "begin", run_id, digest(new.state))
                await store.asave(new)
                _log(spec, "ack", run_id, digest(new.state))
            elif op == "delete":
                _log(spec, "begin", run_id, None)
                await store.adelete(run_id)
                _log(spec, "ack", run_id, None)
            else:
                _age_past_zero()
                await store.acollect_orphans(0)
    return 0, {}


def _ops(spec: dict[str, Any]) -> Iterable[tuple[str, str]]:
    rng = random.Random(f"stepstone-chaos:{spec['seed']}:{spec['case']}:{spec['proc']}:churn")
    ids = churn_ids(spec["seed"], spec["case"])
    if spec["proc"] > 0:
        # A process started after a death first collects what the dead one left (the
        # pieces of a first save killed before its document), so deaths inside
        # ``collect_orphans`` happen; ``_collect`` lets those pieces age past 0 s.
        yield "collect", ""
    for _ in range(OPS):
        draw = rng.random()
        op = "save" if draw < 0.7 else "delete" if draw < 0.9 else "collect"
        yield op, rng.choice(ids)


def _new_checkpoint(run_id: str, cp: Checkpoint | None) -> Checkpoint:
    if cp is None:
        state = _next_state(None, run_id, 0)
        return Checkpoint(run_id=run_id, step=0, state=state, step_names=("churn",))
    state = _next_state(cp.state, run_id, int(cp.state["n"]) + 1)
    return dataclasses.replace(cp, state=state)


def _do(
    spec: dict[str, Any], op: str, run_id: str, load: Any, save: Any, delete: Any, gc: Any
) -> None:
    if op == "save":
        new = _new_checkpoint(run_id, load(run_id))
        _log(spec, "begin", run_id, digest(new.state))
        save(new)
        _log(spec, "ack", run_id, digest(new.state))
    elif op == "delete":
        _log(spec, "begin", run_id, None)
        delete(run_id)
        _log(spec, "ack", run_id, None)
    else:
        _age_past_zero()
        gc(0)


def _age_past_zero() -> None:
    """Wait for the clock's next whole second: an incarnation's age is counted in whole
    seconds, so the pieces a process killed just before left are then older than 0."""
    now = time.time()
    time.sleep(int(now) + 1 - now)


def _log(spec: dict[str, Any], what: str, run_id: str, state: str | None) -> None:
    append_line(spec["ops"], json.dumps([what, run_id, state]), spec.get("fsync", True))


def check_churn(
    violations: list[str], store: Store, ops_path: str, ids: list[str], where: str
) -> int:
    """Every id loads and holds its acknowledged outcome or the one in flight; return the
    number of acknowledged saves."""
    acked: dict[str, str | None] = dict.fromkeys(ids)
    # Every operation begun since the id's last acknowledgement: a killed one may have
    # landed (a delete killed after its document went), and later ones began after it.
    flying: dict[str, set[str | None]] = {}
    saves = 0
    for line in read_lines(ops_path):
        what, run_id, state = json.loads(line)
        if what == "begin":
            flying.setdefault(run_id, set()).add(state)
        else:
            acked[run_id] = state
            flying.pop(run_id, None)
            saves += state is not None
    for run_id in ids:
        allowed = {acked[run_id], *flying.get(run_id, ())}
        try:
            cp = store.load(run_id)
        except Exception as exc:  # noqa: BLE001 - whatever load raises is a violation, reported
            violations.append(
                f"{where}: churn run {run_id!r} does not load: {type(exc).__name__}: {exc}"
            )
            continue
        got = None if cp is None else digest(cp.state)
        if got not in allowed:
            flight = sorted(map(str, flying.get(run_id, ())))
            violations.append(
                f"{where}: churn run {run_id!r} holds {got}, acknowledged {acked[run_id]}, "
                f"in flight {flight}"
            )
    return saves


def final_sweep(violations: list[str], store: Store, run_ids: Iterable[str]) -> tuple[int, int]:
    """Collect orphans with every run there (none may change), delete every run, collect
    again: no piece may be left. Returns ``(orphans collected, pieces left)``."""
    ids = sorted(set(run_ids) | set(store.list_runs()))
    before: dict[str, str | None] = {}
    for run_id in ids:
        try:
            cp = store.load(run_id)
        except Exception as exc:  # noqa: BLE001 - reported as a violation
            violations.append(f"final sweep: {run_id!r} does not load: {type(exc).__name__}: {exc}")
            continue
        before[run_id] = None if cp is None else digest(cp.state)
    # An incarnation's age is counted in whole seconds: let the last one made age past 0.
    time.sleep(1.1)
    collected = len(store.collect_orphans(0))
    for run_id, want in before.items():
        try:
            cp = store.load(run_id)
        except Exception as exc:  # noqa: BLE001 - reported as a violation
            violations.append(
                f"final sweep: {run_id!r} no longer loads after collect_orphans(0): "
                f"{type(exc).__name__}: {exc}"
            )
            continue
        if (None if cp is None else digest(cp.state)) != want:
            violations.append(f"final sweep: collect_orphans(0) changed run {run_id!r}")
    for run_id in ids:
        store.delete(run_id)
    collected += len(store.collect_orphans(0))
    left = 0
    if type(store).holds_pieces:
        for run_id in ids:
            keys = store.piece_keys(run_id)
            if keys:
                left += len(keys)
                violations.append(
                    f"final sweep: {len(keys)} pieces left under {run_id!r} after every run was "
                    f"deleted and orphans collected: {keys[:3]}"
                )
    return collected, left


def run_churn(opts: Any, case: int, store: Store, watch: Any = None) -> Any:
    """Run churn case ``case``: children die at planned points, checked after each."""
    import functools  # noqa: PLC0415
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from .harness import CaseResult, run_child  # noqa: PLC0415 - the harness imports this module

    res = CaseResult(opts.backend, opts.seed, case, "churn", mode=opts.mode, lease=opts.lease)
    ids = churn_ids(opts.seed, case)
    res.run_ids = list(ids)
    rng = random.Random(f"stepstone-chaos:{opts.seed}:{case}:churn-kills")
    ops_path = os.path.join(opts.workdir, f"ops-{case}.log")
    if os.path.exists(ops_path):
        os.unlink(ops_path)
    deaths = 0
    kill: dict[str, Any] | None = None
    for proc in range(opts.max_deaths + 2):
        left_orphans = kill is not None and kill["point"] in _LEAVES_ORPHANS
        kill = None
        if deaths < opts.max_deaths and rng.random() < opts.kill_probability:
            kill = plan_churn(rng, opts.backend)
            # The last death may have left orphans: this process's first collection
            # deletes them, and dies between two of them half the time.
            collects = "pieces.collecting" in cleanup_kill_points(opts.backend)
            if left_orphans and collects and rng.random() < 0.5:
                kill = {"point": "pieces.collecting", "nth": 1}
        spec = {
            "config": opts.config,
            "seed": opts.seed,
            "case": case,
            "proc": proc,
            "ops": ops_path,
            "kill": kill,
            "fsync": opts.fsync_effects,
            "mode": opts.mode,
        }
        ex = run_child("churn", spec, opts.spawn, functools.partial(churn_main, spec))
        res.processes += 1
        where = f"after churn process {proc} ({'killed at ' + str(kill) if ex.signal else 'exit'})"
        if ex.signal is not None:
            if ex.signal != signal.SIGKILL or kill is None:
                res.violations.append(f"churn process {proc} died of signal {ex.signal} unplanned")
                break
            deaths += 1
            res.deaths[kill["point"]] += 1
        elif ex.status != 0:
            res.violations.append(
                f"churn process {proc} crashed: {ex.result.get('tb') or ex.result}"
            )
            break
        res.saves = check_churn(res.violations, store, ops_path, ids, where)
        if watch is not None:
            watch(res, where)
        if res.violations:
            break
    if not res.violations:
        os.unlink(ops_path)
    return res
