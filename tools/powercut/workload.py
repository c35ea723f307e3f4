"""The two sides of a power-cut trial: a process that saves, and one that checks afterwards.

``python tools/powercut/workload.py save CONFIG SEED`` opens the store from its config
string and saves forever (until killed) to a handful of runs: steps of running runs,
runs finishing, finished runs deleted by compare-and-swap and started again. After each
call returns it prints one line, ``save RUN COUNTER`` or ``delete RUN COUNTER``, where
COUNTER numbers that run's events (it is also in the saved state), flushed at once;
before each call it prints the same line after ``begin``, so the parent knows which
call may have been in flight when the power went.

``python tools/powercut/workload.py check CONFIG FRESH`` opens the store from its config string
in a fresh process, as a restarted worker would, and prints one JSON object: for each
run, the counter of what it loads (or null if absent), or the error if it cannot be
loaded; whether each run could be resumed (a save on top of what was loaded, or a fresh
start, with counter FRESH, if nothing was); and which active runs the index (``claimable``) misses.

``python tools/powercut/workload.py sweep CONFIG`` deletes every run, collects the
orphans (``collect_orphans(0)``) and prints ``{"orphans": N, "left": M}``: M pieces are
still in the store's pieces directory (the campaign wants 0: no piece left unnamed).

With ``POWERCUT_NO_FSYNC=1`` the saving side never fsyncs at all (what
``durability=none`` did before it fsynced the data), to show the trial catches it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time
from datetime import timedelta

from stepstone import Checkpoint, open_store
from stepstone._checkpoint import utcnow
from stepstone._errors import StepstoneError

RUNS = ("run-0", "run-1", "Run/ü-2", "long-" + "x" * 300)
STEPS = 1000
#: The run whose state is long (``stepstone._statelog``): a transcript that starts at
#: LONG_SEED characters and grows by an entry per save, so its saves are kept in pieces
#: (a base, then log pieces, then new bases that collect the old ones) and the file
#: store's piece writes are cut by the power too.
LONG_RUN = RUNS[0]
LONG_SEED = 40 * 1024


def _long_state(cp: Checkpoint | None, step: int, c: int, rng: random.Random) -> dict[str, object]:
    """The long run's next state: the loaded transcript plus one entry (a fresh one at step 0)."""
    transcript: list[object] = ["t" * LONG_SEED]
    if cp is not None and step > 0 and isinstance(cp.state.get("transcript"), list):
        transcript = [*cp.state["transcript"], {"c": c, "text": "e" * rng.randrange(500, 4000)}]
    return {"c": c, "transcript": transcript}


def save(config: str, seed: int) -> None:
    """Save to RUNS until killed; print each event once its call returned."""
    if os.environ.get("POWERCUT_NO_FSYNC") == "1":

        def no_sync(fd: object) -> None:
            return None

        # On Linux, the rig's platform, the file store flushes through os.fsync alone:
        # the negative control (a store that never syncs must lose saves) switches it off.
        os.fsync = no_sync
    rng = random.Random(seed)
    store = open_store(config)
    counters = dict.fromkeys(RUNS, 0)
    current: dict[str, Checkpoint | None] = {}
    for run_id in RUNS:
        current[run_id] = store.load(run_id)
        loaded = current[run_id]
        if loaded is not None:
            counters[run_id] = int(loaded.state["c"])
    out = sys.stdout
    while True:
        run_id = rng.choice(RUNS)
        cp = current[run_id]
        counters[run_id] += 1
        c = counters[run_id]
        if cp is not None and cp.status == "done" and rng.random() < 0.5:
            out.write(f"begin delete {run_id} {c}\n")
            out.flush()
            store.delete(run_id, expected_version=cp.version)
            current[run_id] = None
            out.write(f"delete {run_id} {c}\n")
        else:
            step = -1 if cp is None or cp.status == "done" else cp.step + 1
            finish = step >= 0 and rng.random() < 0.15
            total = step + 1 if finish else STEPS
            state: dict[str, object] = {"c": c, "pad": "p" * rng.randrange(0, 9000)}
            if run_id == LONG_RUN:
                state = _long_state(cp, step, c, rng)
            names = tuple(f"s{n}" for n in range(step + 1))
            version = None if cp is None else cp.version
            out.write(f"begin save {run_id} {c}\n")
            out.flush()
            if cp is not None and run_id == LONG_RUN:
                # The loaded checkpoint carried on (as the runner does): only the change
                # is written, the pieces' kill points are reached.
                nxt = dataclasses.replace(
                    cp, step=step, state=state, step_names=names, total_steps=total
                )
            else:
                nxt = Checkpoint(
                    run_id,
                    step=step,
                    state=state,
                    version=version,
                    step_names=names,
                    total_steps=total,
                )
            current[run_id] = store.save(nxt)
            out.write(f"save {run_id} {c}\n")
        out.flush()


def check(config: str, fresh: int) -> None:
    """Load, resume and look up every run in a fresh process; print the findings."""
    report: dict[str, object] = {"runs": {}, "resumed": {}, "unindexed": [], "errors": []}
    runs: dict[str, object] = {}
    resumed: dict[str, object] = {}
    with open_store(config) as store:
        active = []
        for run_id in RUNS:
            try:
                cp = store.load(run_id)
            except StepstoneError as exc:
                runs[run_id] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            runs[run_id] = None if cp is None else cp.state["c"]
            if cp is not None and cp.status in ("queued", "running", "waiting"):
                active.append(run_id)
            try:
                # Resume: the next save must go on top of what was loaded (or start afresh).
                base = cp or Checkpoint(run_id, total_steps=STEPS)
                # The same counter (or a fresh one above all used), so the next trial's
                # counters stay unique.
                counter = fresh if cp is None else cp.state["c"]
                store.save(
                    Checkpoint(
                        run_id,
                        step=base.step,
                        state={"c": counter},
                        version=None if cp is None else cp.version,
                        step_names=base.step_names,
                        total_steps=STEPS,
                    )
                )
                resumed[run_id] = True
            except StepstoneError as exc:
                resumed[run_id] = f"{type(exc).__name__}: {exc}"
        try:
            claimable = {info.run_id for info in store.claimable(utcnow() + timedelta(days=1))}
            report["unindexed"] = [run_id for run_id in active if run_id not in claimable]
            listed = set(store.list_runs())
            report["listed"] = sorted(listed)
        except StepstoneError as exc:
            report["errors"] = [f"{type(exc).__name__}: {exc}"]
    report["runs"] = runs
    report["resumed"] = resumed
    print(json.dumps(report))


def sweep(config: str) -> None:
    """Delete every run, collect orphans, count the pieces left; print JSON."""
    with open_store(config) as store:
        for run_id in {*RUNS, *store.list_runs()}:
            store.delete(run_id)
        # An incarnation's age is counted in whole seconds: let the newest age past 0.
        time.sleep(1.1)
        orphans = len(store.collect_orphans(0))
        root = os.path.join(store.path, ".pieces")  # type: ignore[attr-defined]
        left = sum(len(files) for _, _, files in os.walk(root))
    print(json.dumps({"orphans": orphans, "left": left}))


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "sweep":
        sweep(sys.argv[2])
    else:
        check(sys.argv[2], int(sys.argv[3]))
