"""Power cuts: after one, every run of a file store loads, resumes and is indexed.

A FUSE file system (``tools/powercut/powercut_fs.py``) holds what was not fsynced and
drops it on command: directory changes not made durable by a directory fsync survive
only as a random prefix, file data not fsynced survives whole, not at all, or torn. Each
trial runs a process that saves (``tools/powercut/workload.py save``), kills it with
SIGKILL after a random number of saves, cuts the power, then opens the store from its
config string in a fresh process that loads, resumes and looks up every run.

- ``durability=full``: nothing a returned call did is lost.
- ``durability=none``: a run may come back at any checkpoint it ever had, or absent,
  but never unreadable, never stuck, never missing from the index while active.
- The old ``none`` (no fsync at all) fails the same trial: the check is not vacuous.

Needs Linux, ``/dev/fuse``, ``fusermount3`` (Debian ``fuse3``) and ``mfusepy``; without
them the tests skip loudly, and fail in CI (``STEPSTONE_REQUIRE_BACKENDS=1``).
``STEPSTONE_POWER_CUTS`` sets the cuts per mode (default 12).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stepstone.testing import backend_unavailable

# A campaign: longer than the suite's 120 s per test.
pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(600)]

TOOLS = Path(__file__).resolve().parents[3] / "tools" / "powercut"
CUTS = int(os.environ.get("STEPSTONE_POWER_CUTS", "12"))


def _fuse_missing() -> str | None:
    if not sys.platform.startswith("linux"):
        return "FUSE power cuts run on Linux only"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install -y fuse3)"
    found = subprocess.run(
        [sys.executable, "-c", "import mfusepy"],
        capture_output=True,
        env=_env(FUSE_LIBRARY_NAME="fuse3"),
        timeout=60,
        check=False,
    )
    if found.returncode != 0:  # not installed, or libfuse3 missing (OSError at import)
        lines = found.stderr.decode(errors="replace").strip().splitlines() or ["?"]
        hint = "pip install mfusepy; apt-get install -y fuse3"
        return f"mfusepy cannot load libfuse3 ({hint}): {lines[-1]}"
    return None


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Path]:
    """A fresh power-cut file system, unmounted afterwards."""
    missing = _fuse_missing()
    if missing is not None:
        backend_unavailable(f"FUSE, so the power-cut tests do NOT run: {missing}")
    point = tmp_path / "mnt"
    point.mkdir()
    log_path = tmp_path / "fs.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(TOOLS / "powercut_fs.py"), str(point)],
            stdout=log,
            stderr=subprocess.STDOUT,
            # mfusepy prefers libfuse 2 where both are installed; the model needs 3.
            env=_env(FUSE_LIBRARY_NAME="fuse3"),
        )
    deadline = time.monotonic() + 30
    while not os.path.ismount(point):
        if proc.poll() is not None:
            backend_unavailable(
                f"FUSE, so the power-cut tests do NOT run: mounting failed: "
                f"{log_path.read_text(errors='replace')[-2000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("mounting the power-cut file system hung for 30 s")
        time.sleep(0.05)
    try:
        yield point
    finally:
        subprocess.run(["fusermount3", "-u", str(point)], check=False, timeout=60)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the power-cut file system did not exit within 60 s of unmounting")


@dataclass
class Tally:
    """What the trials of one mode found."""

    cuts: int = 0
    acked: int = 0
    rolled_back_runs: int = 0
    rolled_back_events: int = 0
    vanished_runs: int = 0
    failures: list[str] = field(default_factory=list)
    #: After the last trial every run is deleted and orphans collected (``workload.py
    #: sweep``): the orphans that collected, and the pieces still there (must be 0).
    orphans: int = 0
    pieces_left: int = -1


def _events(proc: subprocess.Popen[bytes], want: int, deadline: float) -> list[str]:
    """Read the saver's lines until ``want`` calls have returned (or it died)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = b""
    done = 0
    while done < want:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            pytest.fail(f"the saving process hung: {done} of {want} saves in 120 s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
        done = sum(1 for line in buffer.split(b"\n") if line and not line.startswith(b"begin"))
    return buffer.decode().split("\n")


def _durable_dir(path: Path) -> None:
    """Create ``path`` and make its entry durable, as an operator's mkdir on a real disk."""
    path.mkdir(mode=0o700)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _trials(mount: Path, durability: str, cuts: int, seed: int, env: dict[str, str]) -> Tally:  # noqa: C901 - one branch per power-cut outcome, read top to bottom
    """Run ``cuts`` save-kill-cut-check trials on one store; return what they found."""
    store_dir = mount / f"store-{durability}"
    _durable_dir(store_dir)
    config = f"file://{store_dir}?durability={durability}"
    rng = random.Random(seed)
    tally = Tally()
    # What each run holds after the last check: its counter, or None when absent.
    state: dict[str, int | None] = {}
    ever_saved: dict[str, set[int]] = {}
    for trial in range(cuts):
        saver = subprocess.Popen(
            [
                sys.executable,
                str(TOOLS / "workload.py"),
                "save",
                config,
                str(rng.randrange(1 << 30)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        lines = _events(saver, rng.randint(1, 30), time.monotonic() + 120)
        saver.send_signal(signal.SIGKILL)  # the power goes: the process dies first
        try:
            rest, err = saver.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the killed saving process did not exit within 60 s")
        lines = "\n".join(lines).split("\n") + rest.decode().split("\n")
        if saver.returncode != -signal.SIGKILL:
            # It resumes every run at start: a run left unloadable by the last cut ends it.
            tally.failures.append(
                f"cut {trial}: the saving process died ({saver.returncode}): {err.decode()[-2000:]}"
            )
            break
        # What each run may hold: after its last returned call, or after the call in flight.
        allowed: dict[str, set[int | None]] = {}
        last: dict[str, int | None] = dict(state)
        in_flight: dict[str, int | None] = {}
        for line in filter(None, lines):
            words = line.split(" ")
            if words[0] == "begin":
                kind, run_id, counter = words[1], words[2], int(words[3])
                in_flight = {run_id: None if kind == "delete" else counter}
                if kind == "save":
                    ever_saved.setdefault(run_id, set()).add(counter)
                continue
            kind, run_id, counter = words[0], words[1], int(words[2])
            last[run_id] = None if kind == "delete" else counter
            in_flight = {}
            tally.acked += 1
        for run_id, value in last.items():
            allowed[run_id] = {value}
        for run_id, value in in_flight.items():
            allowed.setdefault(run_id, {state.get(run_id)}).add(value)
        (mount / ".control").write_text(f"cut {rng.randrange(1 << 30)}\n")
        tally.cuts += 1
        fresh = (trial + 1) * 1_000_000
        checked = subprocess.run(
            [sys.executable, str(TOOLS / "workload.py"), "check", config, str(fresh)],
            capture_output=True,
            timeout=120,
            env=env,
            check=False,
        )
        if checked.returncode != 0:
            tally.failures.append(
                f"cut {trial}: the check crashed: {checked.stderr.decode()[-3000:]}"
            )
            break
        report = json.loads(checked.stdout)
        for run_id, loaded in report["runs"].items():
            if isinstance(loaded, dict):
                tally.failures.append(f"cut {trial}: {run_id} cannot be loaded: {loaded['error']}")
                continue
            resumed = report["resumed"][run_id]
            if resumed is not True:
                tally.failures.append(f"cut {trial}: {run_id} cannot be resumed: {resumed}")
            expected = allowed.get(run_id, {state.get(run_id)})
            if durability == "full":
                if loaded not in expected:
                    tally.failures.append(
                        f"cut {trial}: {run_id} holds {loaded}, expected one of {expected}"
                    )
            elif loaded is not None and loaded not in ever_saved.get(run_id, set()) | {
                state.get(run_id)
            }:
                tally.failures.append(f"cut {trial}: {run_id} holds {loaded}, never saved")
            if loaded not in expected:
                newest = max((v for v in expected if v is not None), default=None)
                if loaded is None:
                    tally.vanished_runs += 1
                else:
                    tally.rolled_back_runs += 1
                    if newest is not None:
                        tally.rolled_back_events += newest - loaded
            state[run_id] = fresh if loaded is None else loaded
            ever_saved.setdefault(run_id, set()).add(state[run_id])  # type: ignore[arg-type]
        if report["unindexed"]:
            tally.failures.append(
                f"cut {trial}: active runs missing from the index: {report['unindexed']}"
            )
        if report["errors"]:
            tally.failures.append(f"cut {trial}: listing failed: {report['errors']}")
        present = sorted(
            run_id for run_id, value in report["runs"].items() if not isinstance(value, dict)
        )
        if report.get("listed") is not None and sorted(report["listed"]) != present:
            tally.failures.append(f"cut {trial}: list_runs shows {report['listed']}, not {present}")
    if not tally.failures:
        swept = subprocess.run(
            [sys.executable, str(TOOLS / "workload.py"), "sweep", config],
            capture_output=True,
            timeout=120,
            env=env,
            check=False,
        )
        if swept.returncode != 0:
            tally.failures.append(f"the final sweep crashed: {swept.stderr.decode()[-3000:]}")
        else:
            found = json.loads(swept.stdout)
            tally.orphans, tally.pieces_left = found["orphans"], found["left"]
    print(f"durability={durability}: {tally}")
    return tally


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def test_full_durability_loses_nothing_acknowledged(mount: Path) -> None:
    """With durability=full, every call that returned before a power cut survives it."""
    tally = _trials(mount, "full", CUTS, 1, _env())
    assert tally.cuts == CUTS
    assert tally.acked > 0
    assert tally.failures == []
    assert tally.rolled_back_runs == tally.vanished_runs == 0
    assert tally.pieces_left == 0, "pieces left after every run was deleted and collected"


def test_none_durability_always_resumes(mount: Path) -> None:
    """With durability=none a power cut may roll runs back, but every run loads and resumes."""
    tally = _trials(mount, "none", CUTS, 2, _env())
    assert tally.cuts == CUTS
    assert tally.acked > 0
    assert tally.failures == []
    assert tally.pieces_left == 0, "pieces left after every run was deleted and collected"


def test_the_trial_catches_a_store_that_never_fsyncs(mount: Path) -> None:
    """The old durability=none (no fsync at all) leaves runs unreadable: the trial sees it."""
    tally = _trials(mount, "none", max(CUTS, 12), 3, _env(POWERCUT_NO_FSYNC="1"))
    assert tally.failures, "a store that never fsyncs survived every power cut: the trial is blind"
