"""What must hold after every death and at the end of a case (any failure is a violation).

- the checkpoint loads (never torn or unreadable), its completed steps are a prefix of
  the workflow, its state equals the crash-free state after that step, and progress
  never goes backwards;
- a kill inside a save leaves the old or the new checkpoint, as the backend declares in
  ``Store.kill_points``;
- the final state equals the crash-free run's final state;
- each step's side effect (an fsynced line in an effects file) happened at least once
  and at most ``1 + deaths that hit that step's window`` times; no process ran a step
  that was already completed when it started; retried attempts are numbered strictly
  increasing across deaths (the attempt count is durable);
- the stored checkpoints of other runs (bystanders, and every run finished earlier in
  the shard) are unchanged; for the file store their raw bytes too.

Each check appends a sentence to ``violations``; none raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stepstone._checkpoint import Checkpoint
from stepstone._store import Store

from .child import read_lines
from .workload import Workflow, digest, payload

__all__ = [
    "BYSTANDER_IDS",
    "check_checkpoint",
    "check_concurrent_end",
    "check_final",
    "check_save_kill",
    "load_checked",
    "seed_bystanders",
    "snapshot",
]

BYSTANDER_IDS = ("bystander", "Bystander", "bystander/ü", "by/" + "z" * 400)


def _raw_bytes(store: Store, run_id: str) -> bytes | None:
    """SHA-256 of the stored bytes of a run where the backend makes them cheap to get."""
    from stepstone.stores.file import FileStore, encode_name  # noqa: PLC0415

    if isinstance(store, FileStore):
        path = os.path.join(store.path, encode_name(run_id) + ".json")
        with contextlib.suppress(FileNotFoundError):
            # A digest, not the bytes: the driver forks thousands of times, keep it small.
            return hashlib.sha256(Path(path).read_bytes()).digest()
    return None


def snapshot(store: Store, run_id: str) -> tuple[Any, ...]:
    """What must not change about a run another case never touches."""
    cp = store.load(run_id)
    if cp is None:
        return (None,)
    return (
        cp.version,
        cp.step,
        cp.step_names,
        digest(cp.state),
        cp.updated_at,
        _raw_bytes(store, run_id),
    )


def seed_bystanders(store: Store, seed: int, shard: int = 0) -> dict[str, tuple[Any, ...]]:
    """Create the bystander runs (varied sizes and ids) and return their snapshots."""
    snaps = {}
    for n, base in enumerate(BYSTANDER_IDS):
        run_id = f"{base}#{shard}"
        if store.load(run_id) is None:
            state = {"who": run_id, "blob": payload(f"by{seed}{n}", 10 ** (n + 1)), "n": n}
            store.save(
                Checkpoint(run_id=run_id, step=0, state=state, step_names=("only",), total_steps=2)
            )
        snaps[run_id] = snapshot(store, run_id)
    return snaps


def check_checkpoint(
    violations: list[str], wf: Workflow, expected: list[dict[str, Any]], cp: Any, where: str
) -> None:
    """The checkpoint is a prefix of the workflow holding the crash-free state."""
    if cp is None:
        return
    k = cp.step
    if not -1 <= k < len(wf.steps):
        violations.append(f"{where}: checkpoint step {k} outside the workflow")
        return
    if cp.step_names != wf.names[: k + 1]:
        violations.append(f"{where}: step_names {cp.step_names!r} not a prefix of the workflow")
    want = expected[k] if k >= 0 else {}
    if cp.state != want:
        violations.append(
            f"{where}: state after step {k} differs from the crash-free state "
            f"(digest {digest(cp.state)} != {digest(want)}; keys {sorted(cp.state)[:8]})"
        )


def load_checked(violations: list[str], store: Store, run_id: str, where: str) -> Any:
    """Load the run's checkpoint; one that does not load is a violation (returns None)."""
    try:
        return store.load(run_id)
    except Exception as exc:  # noqa: BLE001 - whatever load raises is a violation, reported
        violations.append(f"{where}: checkpoint does not load: {type(exc).__name__}: {exc}")
        return None


def check_save_kill(
    violations: list[str],
    points: Mapping[str, bool],
    note: dict[str, Any],
    step: int,
    where: str,
) -> None:
    """A death inside a save left the checkpoint the backend's ``kill_points`` promise."""
    visible = points.get(note["point"])
    if visible is None or note["phase"] != "step_save":
        return
    want = note["step"] if visible else note["step"] - 1
    if step != want:
        violations.append(
            f"{where}: killed at {note['point']} while saving step {note['step']}: the "
            f"checkpoint should be at step {want} ({'new' if visible else 'old'}), it is at {step}"
        )


def check_final(
    violations: list[str],
    wf: Workflow,
    effects: str,
    starts: dict[int, int],
    ends: dict[int, int],
    died: dict[int, dict[str, Any]],
    hits: Counter[int],
) -> None:
    """Side effects at least once, at most once more per death in their window; no replays."""
    ok: Counter[int] = Counter()
    attempts: dict[int, list[int]] = {}
    per_proc: dict[int, list[int]] = {}
    for line in read_lines(effects):
        proc_s, _run, index_s, attempt_s, outcome = line.split()
        proc, index, attempt = int(proc_s), int(index_s), int(attempt_s)
        if index <= starts.get(proc, -1):
            violations.append(
                f"process {proc} ran step {index}, completed before it started (at {starts[proc]})"
            )
        attempts.setdefault(index, []).append(attempt)
        if outcome == "ok":
            ok[index] += 1
            per_proc.setdefault(proc, []).append(index)
    for proc, indexes in per_proc.items():
        if len(set(indexes)) != len(indexes):
            violations.append(f"process {proc} ran a step to success twice: {indexes}")
        lost = [i for i in indexes if i > ends.get(proc, -1)]
        if proc not in died and lost:
            violations.append(f"process {proc} ended normally but steps {lost} are not saved")
        if proc in died and len(lost) > 1:
            violations.append(f"process {proc} died with more than one unsaved step: {lost}")
    for spec in wf.steps:
        i = spec.index
        if ok[i] < 1:
            violations.append(f"step {i} ({spec.name!r}): side effect never happened")
        if ok[i] > 1 + hits[i]:
            violations.append(
                f"step {i} ({spec.name!r}): side effect happened {ok[i]} times, allowed "
                f"1 + {hits[i]} deaths in its window"
            )
        seen = attempts.get(i, [])
        if spec.max_attempts is not None and seen != sorted(set(seen)):
            violations.append(
                f"step {i} ({spec.name!r}): attempt numbers repeat or go back across deaths: {seen}"
            )


def check_concurrent_end(
    violations: list[str],
    store: Store,
    wfs: list[Workflow],
    expected: list[list[dict[str, Any]]],
    effects: str,
) -> None:
    """Every raced run finished with the crash-free state, every step's effect happened."""
    ok: Counter[tuple[int, int]] = Counter()
    for line in read_lines(effects):
        _proc, run_key, index, _attempt, outcome = line.split()
        if outcome == "ok":
            ok[(int(run_key), int(index))] += 1
    for j, wf in enumerate(wfs):
        cp = load_checked(violations, store, wf.run_id, "at the end")
        if cp is None or cp.step != len(wf.steps) - 1 or cp.state != expected[j][-1]:
            violations.append(
                f"run {j} ({wf.run_id!r}) did not finish exactly: step "
                f"{None if cp is None else cp.step} of {len(wf.steps)}"
            )
        for spec in wf.steps:
            if ok[(j, spec.index)] < 1:
                violations.append(f"run {j} step {spec.index}: side effect never happened")
