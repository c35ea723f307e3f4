"""The ``stepstone`` command, run as a real process against real sqlite: and file: stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from stepstone import Checkpoint, Step, StepFailed, open_store, run
from stepstone._migrate import differences, migrate
from stepstone.cli import parse_age, redact

pytestmark = pytest.mark.timeout(60)

KINDS = ["sqlite", "file"]


def store_url(kind: str, base: Path, name: str = "store") -> str:
    """Return a config string of ``kind`` for a store under ``base``."""
    if kind == "sqlite":
        return f"sqlite:///{base}/{name}.db"  # base is absolute: sqlite:////abs/x.db
    return f"file:{base}/{name}"


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each durable kind."""
    return store_url(request.param, tmp_path)


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """Run ``python -m stepstone ARGS`` and return the completed process (text output)."""
    full_env = {k: v for k, v in os.environ.items() if k != "STEPSTONE_STORE"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "stepstone", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=30,
        check=False,
    )


def steps(n: int = 2) -> list[Step]:
    """Return ``n`` steps that each record their name in the state."""
    return [Step(f"s{i}", lambda state, i=i: {f"s{i}": i}) for i in range(n)]


def boom(state: dict[str, Any]) -> None:
    """A step that always fails."""
    raise ValueError("card declined: insufficient funds")


def make_done(url: str, *run_ids: str, pause: float = 0.0) -> None:
    """Run a 2-step workflow to completion under each run id, ``pause`` seconds apart."""
    with open_store(url) as store:
        for run_id in run_ids:
            run(run_id, steps(2), store)
            time.sleep(pause)


def make_failed(url: str, run_id: str) -> None:
    """Run a workflow whose second step raises, leaving a failure record."""
    with open_store(url) as store, pytest.raises(StepFailed):
        run(run_id, [Step("fetch", lambda s: {"order": 7}), Step("charge", boom)], store)


def make_running(url: str, run_id: str) -> None:
    """Save a run that completed 1 of 3 steps and has no failure: status running."""
    with open_store(url) as store:
        store.save(
            Checkpoint(run_id=run_id, step=0, state={"a": 1}, step_names=("a",), total_steps=3)
        )


def ids(url: str) -> list[str]:
    """Return the run ids in a store, sorted, read in-process through the store API."""
    with open_store(url) as store:
        return sorted(store.list_runs())


def updated(url: str, run_id: str) -> datetime:
    """Return a run's ``updated_at``, read in-process."""
    with open_store(url) as store:
        cp = store.load(run_id)
    assert cp is not None and cp.updated_at is not None
    return cp.updated_at


def same_content(src: str, dst: str, created: bool = True) -> None:
    """Check that both stores hold the same runs with the same content (and created_at)."""
    assert ids(src) == ids(dst)
    with open_store(src) as a, open_store(dst) as b:
        for run_id in ids(src):
            one, two = a.load(run_id), b.load(run_id)
            assert one is not None and two is not None
            assert differences(one, two) == [], run_id
            assert one.created_at == two.created_at or not created


def listed(url: str, *args: str) -> list[dict[str, Any]]:
    """Return ``runs list --json ARGS`` parsed."""
    proc = cli("runs", "list", "--store", url, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    result: list[dict[str, Any]] = json.loads(proc.stdout)
    return result


def shown(url: str, run_id: str) -> dict[str, Any]:
    """Return ``runs show RUN_ID --json`` parsed."""
    proc = cli("runs", "show", run_id, "--store", url, "--json")
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def assert_one_error_line(stderr: str) -> None:
    """Check that stderr is exactly one ``stepstone: error:`` line and no traceback."""
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("stepstone: error: ")


# --- runs list ---------------------------------------------------------------------------


def test_list_table_is_newest_first(url: str) -> None:
    """The table lists runs by last update, newest first, with their step progress."""
    make_done(url, "first", "second", "third", pause=0.01)
    proc = cli("runs", "list", "--store", url)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["RUN_ID", "STATUS", "STEPS", "UPDATED", "AGE"]
    assert [line.split()[0] for line in lines[1:]] == ["third", "second", "first"]
    assert all(line.split()[1:3] == ["done", "2/2"] for line in lines[1:])
    # Aligned: every column starts at the same offset on every line.
    assert len({line.index(line.split()[1]) for line in lines}) == 1


def test_list_filters_by_status_and_limit(url: str) -> None:
    """--status keeps one status, --limit keeps the newest N, --json is one array."""
    make_done(url, "d1", pause=0.01)
    make_failed(url, "f1")
    time.sleep(0.01)
    make_running(url, "r1")
    assert [r["run_id"] for r in listed(url)] == ["r1", "f1", "d1"]
    failed = listed(url, "--status", "failed")
    assert [(r["run_id"], r["status"], r["completed_steps"], r["total_steps"]) for r in failed] == [
        ("f1", "failed", 1, 2)
    ]
    assert [r["run_id"] for r in listed(url, "--status", "running")] == ["r1"]
    assert [r["run_id"] for r in listed(url, "--limit", "2")] == ["r1", "f1"]


def test_list_filters_by_age(url: str) -> None:
    """--older-than and --newer-than take durations or a timestamp and split runs by update."""
    make_done(url, "old")
    time.sleep(0.05)
    make_done(url, "new")
    old, new = updated(url, "old"), updated(url, "new")
    assert old < new
    cutoff = (old + (new - old) / 2).isoformat()
    assert [r["run_id"] for r in listed(url, "--older-than", cutoff)] == ["old"]
    assert [r["run_id"] for r in listed(url, "--newer-than", cutoff)] == ["new"]
    assert listed(url, "--older-than", "1h") == []
    assert [r["run_id"] for r in listed(url, "--newer-than", "1h")] == ["new", "old"]


def test_list_empty_store(url: str) -> None:
    """An empty store lists as 'no runs' and as an empty JSON array."""
    proc = cli("runs", "list", "--store", url)
    assert (proc.returncode, proc.stdout.strip()) == (0, "no runs")
    assert listed(url) == []


def test_list_skips_a_corrupt_run(tmp_path: Path) -> None:
    """A corrupt checkpoint file is skipped with a warning instead of ending the listing."""
    url = store_url("file", tmp_path)
    make_done(url, "good")
    (tmp_path / "store" / "zzz.json").write_text("not json")
    proc = cli("runs", "list", "--store", url)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:]] == ["good"]
    assert "stepstone: warning: skipping run 'zzz'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_store_comes_from_environment(tmp_path: Path) -> None:
    """Without --store the command uses STEPSTONE_STORE."""
    url = store_url("sqlite", tmp_path)
    make_done(url, "from-env")
    proc = cli("runs", "list", "--json", env={"STEPSTONE_STORE": url}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["run_id"] for r in json.loads(proc.stdout)] == ["from-env"]


# --- runs show ---------------------------------------------------------------------------


def test_show_failed_run(url: str) -> None:
    """show prints status, steps, the failure record and the state pretty-printed."""
    make_failed(url, "order-1")
    proc = cli("runs", "show", "order-1", "--store", url)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "status:    failed" in out
    assert "1 of 2 steps completed" in out
    assert "completed: fetch" in out
    assert "step:     1 (charge)" in out
    assert "error:    ValueError" in out
    assert "message:  card declined: insufficient funds" in out
    assert "attempt:  1" in out
    assert 'state:\n{\n  "order": 7\n}' in out

    data = shown(url, "order-1")
    assert data["status"] == "failed"
    assert data["step_names"] == ["fetch"]
    assert data["total_steps"] == 2
    assert data["state"] == {"order": 7}
    failure = data["failure"]
    assert (failure["step_name"], failure["error_type"], failure["attempt"]) == (
        "charge",
        "ValueError",
        1,
    )
    assert datetime.fromisoformat(failure["at"]) <= datetime.fromisoformat(data["updated_at"])
    assert datetime.fromisoformat(data["created_at"]) <= datetime.fromisoformat(failure["at"])


def test_show_missing_run(url: str) -> None:
    """show of an unknown run is one error line naming the run and store, exit 1."""
    proc = cli("runs", "show", "nope", "--store", url)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr)
    assert f"no run 'nope' in {url}" in proc.stderr


# --- runs delete -------------------------------------------------------------------------


def test_delete(url: str) -> None:
    """delete removes a run; deleting it again is exit 1 unless --missing-ok."""
    make_done(url, "a", "b")
    proc = cli("runs", "delete", "a", "--store", url)
    assert proc.returncode == 0, proc.stderr
    assert ids(url) == ["b"]
    again = cli("runs", "delete", "a", "--store", url)
    assert again.returncode == 1
    assert_one_error_line(again.stderr)
    assert cli("runs", "delete", "a", "--store", url, "--missing-ok").returncode == 0


# --- runs prune --------------------------------------------------------------------------


def test_prune_older_than_timestamp(url: str) -> None:
    """prune deletes exactly the runs updated before the cutoff; --dry-run deletes none."""
    make_done(url, "old1", "old2")
    time.sleep(0.05)
    make_done(url, "new")
    old2, new = updated(url, "old2"), updated(url, "new")
    cutoff = (old2 + (new - old2) / 2).isoformat()

    dry = cli("runs", "prune", "--older-than", cutoff, "--dry-run", "--store", url)
    assert dry.returncode == 0, dry.stderr
    assert "would delete 2 runs" in dry.stdout
    assert "'old1'" in dry.stdout
    assert "'new'" not in dry.stdout
    assert ids(url) == ["new", "old1", "old2"]

    proc = cli("runs", "prune", "--older-than", cutoff, "--store", url)
    assert proc.returncode == 0, proc.stderr
    assert "deleted 2 runs" in proc.stdout
    assert ids(url) == ["new"]


def test_prune_durations_and_status(url: str) -> None:
    """A duration is measured back from now; --status limits what is pruned."""
    make_done(url, "done1")
    make_failed(url, "failed1")
    none = cli("runs", "prune", "--older-than", "30d", "--store", url)
    assert none.returncode == 0, none.stderr
    assert "deleted 0 runs" in none.stdout
    failed = cli("runs", "prune", "--older-than", "0s", "--status", "failed", "--store", url)
    assert failed.returncode == 0, failed.stderr
    assert "deleted 1 failed run" in failed.stdout
    assert ids(url) == ["done1"]


def test_prune_ttl_needs_native_ttl(url: str) -> None:
    """--ttl on a store without expire() is a one-line usage error and deletes nothing."""
    make_done(url, "keep")
    proc = cli("runs", "prune", "--older-than", "0s", "--ttl", "--store", url)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert "no native TTL" in proc.stderr
    assert ids(url) == ["keep"]


# --- migrate -----------------------------------------------------------------------------

DIRECTIONS = [("sqlite", "file"), ("file", "sqlite")]


@pytest.mark.parametrize(("src_kind", "dst_kind"), DIRECTIONS)
def test_migrate_copies_then_skips(tmp_path: Path, src_kind: str, dst_kind: str) -> None:
    """migrate copies every run with its content, and a second run skips them all."""
    src, dst = store_url(src_kind, tmp_path, "src"), store_url(dst_kind, tmp_path, "dst")
    make_done(src, "d1", "d2")
    make_failed(src, "f1")
    make_running(src, "r1")
    proc = cli("migrate", "--from", src, "--to", dst)
    assert proc.returncode == 0, proc.stderr
    assert "copied 4, skipped 0, conflicts 0, failed 0" in proc.stdout
    same_content(src, dst)

    again = cli("migrate", "--from", src, "--to", dst)
    assert again.returncode == 0, again.stderr
    assert "copied 0, skipped 4, conflicts 0, failed 0" in again.stdout

    back = cli("migrate", "--from", dst, "--to", src)
    assert back.returncode == 0, back.stderr
    assert "copied 0, skipped 4" in back.stdout


@pytest.mark.parametrize(("src_kind", "dst_kind"), DIRECTIONS)
def test_migrate_conflict_then_force(tmp_path: Path, src_kind: str, dst_kind: str) -> None:
    """A differing destination run is a conflict (exit 1, untouched) until --force."""
    src, dst = store_url(src_kind, tmp_path, "src"), store_url(dst_kind, tmp_path, "dst")
    make_done(src, "same", "differs")
    make_done(dst, "same")
    with open_store(dst) as store:
        run("differs", [Step("other", lambda s: {"mine": True})], store)

    proc = cli("migrate", "--from", src, "--to", dst)
    assert proc.returncode == 1
    assert "copied 0, skipped 1, conflicts 1, failed 0" in proc.stdout
    assert "conflict: run 'differs'" in proc.stdout
    with open_store(dst) as store:
        assert getattr(store.load("differs"), "state", None) == {"mine": True}

    dry = cli("migrate", "--from", src, "--to", dst, "--force", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would have copied 1 (1 overwritten)" in dry.stdout
    with open_store(dst) as store:
        assert getattr(store.load("differs"), "state", None) == {"mine": True}

    forced = cli("migrate", "--from", src, "--to", dst, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "copied 1 (1 overwritten), skipped 1, conflicts 0" in forced.stdout
    same_content(src, dst, created=False)  # 'same' was created in each store on its own


_KILL_AFTER_SAVES = """
import os, signal, sys
from stepstone._registry import store_class
from stepstone.cli import main

cls = store_class(sys.argv[1])
original = cls.save
saves = 0

def save(self, checkpoint):
    global saves
    saved = original(self, checkpoint)
    saves += 1
    if saves == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    return saved

cls.save = save
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.crash
@pytest.mark.parametrize(("src_kind", "dst_kind"), DIRECTIONS)
def test_migrate_interrupted_then_rerun(tmp_path: Path, src_kind: str, dst_kind: str) -> None:
    """A migration killed with SIGKILL midway completes when run again, skipping what landed."""
    src, dst = store_url(src_kind, tmp_path, "src"), store_url(dst_kind, tmp_path, "dst")
    make_done(src, *(f"run-{i:02d}" for i in range(20)))
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILL_AFTER_SAVES,
            dst_kind,
            "7",
            "migrate",
            "--from",
            src,
            "--to",
            dst,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(ids(dst)) == 7

    proc = cli("migrate", "--from", src, "--to", dst, "--progress")
    assert proc.returncode == 0, proc.stderr
    assert "copied 13, skipped 7, conflicts 0, failed 0" in proc.stdout
    assert "20/20" in proc.stderr  # the progress bar
    same_content(src, dst)


def test_migrate_same_store_is_usage_error(tmp_path: Path) -> None:
    """Migrating a store onto itself is refused with exit 2."""
    url = store_url("sqlite", tmp_path)
    proc = cli("migrate", "--from", url, "--to", url)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)


def test_migrate_function_compares_json_content() -> None:
    """migrate() as a function: 1 and True differ in a state, and the report counts them."""
    src, dst = open_store("memory://"), open_store("memory://")
    src.save(Checkpoint(run_id="a", state={"n": 1}, total_steps=1))
    src.save(Checkpoint(run_id="b", state={"n": 1}, total_steps=1))
    dst.save(Checkpoint(run_id="a", state={"n": True}, total_steps=1))
    seen: list[tuple[int, int, str, str]] = []
    report = migrate(src, dst, progress=lambda *args: seen.append(args))
    assert (report.copied, report.skipped, report.conflicts, report.failed) == (1, 0, 1, 0)
    assert seen == [(1, 2, "a", "conflict"), (2, 2, "b", "copied")]
    a_src, a_dst = src.load("a"), dst.load("a")
    assert a_src is not None and a_dst is not None
    assert differences(a_src, a_dst) == ["state"]


# --- init, doctor ------------------------------------------------------------------------


def test_init(url: str) -> None:
    """init prints what the backend created or found and exits 0."""
    proc = cli("init", "--store", url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_doctor_ok(url: str) -> None:
    """doctor on a good store prints only ok lines and exits 0."""
    proc = cli("doctor", "--store", url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = [line for line in proc.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert len(checks) >= 3
    assert all(line.startswith("ok ") for line in checks)
    assert ids(url) == []  # the probe run was removed


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A directory nothing can be written in: read-only, or (as root) under a regular file."""
    if os.geteuid() == 0:  # root writes through permission bits
        blocker = tmp_path / "blocker"
        blocker.write_text("a file where a directory should be")
        yield blocker / "dir"
        return
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    yield directory
    directory.chmod(0o700)


@pytest.mark.parametrize("kind", KINDS)
def test_doctor_fails_on_unwritable_directory(unwritable: Path, kind: str) -> None:
    """doctor reports FAIL and exits 1 when the store's directory cannot be written."""
    url = f"sqlite:///{unwritable}/x.db" if kind == "sqlite" else f"file:{unwritable}/runs"
    proc = cli("doctor", "--store", url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any(line.startswith("FAIL ") for line in proc.stdout.splitlines()), proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


# --- demo --------------------------------------------------------------------------------


@pytest.mark.crash
def test_demo_default_store_twice(tmp_path: Path) -> None:
    """demo crashes a child, resumes skipping the done step, and can run twice in one store."""
    first = cli("demo", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert "killed by SIGKILL" in out
    assert "step 'fetch_order'   SKIPPED" in out
    assert "skipped 'fetch_order'" in out
    assert '"receipt": "sent"' in out
    assert (tmp_path / "stepstone.db").exists()

    second = cli("demo", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    with open_store(f"sqlite:///{tmp_path}/stepstone.db") as store:
        runs = list(store.list_info())
    assert len(runs) == 2
    assert all(r.status == "done" and r.run_id.startswith("demo-") for r in runs)


@pytest.mark.crash
def test_demo_file_store(tmp_path: Path) -> None:
    """demo --store runs against the given store."""
    url = store_url("file", tmp_path)
    proc = cli("demo", "--store", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SKIPPED" in proc.stdout
    with open_store(url) as store:
        assert [r.status for r in store.list_info()] == ["done"]
    assert not (tmp_path / "stepstone.db").exists()


# --- errors ------------------------------------------------------------------------------


def test_bad_store_is_one_line_exit_2(tmp_path: Path) -> None:
    """An unknown scheme is one error line and exit 2; --verbose adds the traceback."""
    proc = cli("--store", "bogus://x", "runs", "list", cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert "unknown store scheme 'bogus'" in proc.stderr

    verbose = cli("--verbose", "--store", "bogus://x", "runs", "list", cwd=tmp_path)
    assert verbose.returncode == 2
    assert "Traceback" in verbose.stderr
    assert "ConfigError" in verbose.stderr


def test_usage_errors_are_one_line_exit_2() -> None:
    """Bad options and bad ages are one error line each, exit 2."""
    for args in (
        ["runs", "list", "--older-than", "3x"],
        ["runs", "frobnicate"],
        ["runs", "prune"],
        ["runs", "list", "--limit", "0"],
        ["nosuchcommand"],
    ):
        proc = cli(*args)
        assert proc.returncode == 2, args
        assert_one_error_line(proc.stderr)


def test_store_failure_is_exit_1(tmp_path: Path) -> None:
    """A store that cannot be opened is an operational error: one line, exit 1."""
    proc = cli("runs", "list", "--store", f"sqlite:///{tmp_path}/missing-dir/x.db")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr)


def test_secrets_never_printed() -> None:
    """Passwords and key-like query values in a config string never reach the output."""
    config = "memory://alice:hunter2@x/?key=s3cr3tk3y"
    for extra in ([], ["--verbose"]):
        proc = cli(*extra, "runs", "list", "--store", config)
        assert proc.returncode == 2
        output = proc.stdout + proc.stderr
        assert "hunter2" not in output
        assert "s3cr3tk3y" not in output
        assert "***" in output
    assert redact("sqlite:///x.db?busy_timeout=5") == "sqlite:///x.db?busy_timeout=5"
    assert redact("cosmos://h/db/c?token=abc&x=1") == "cosmos://h/db/c?token=***&x=1"


def test_version() -> None:
    """--version prints the package version."""
    proc = cli("--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, "stepstone 0.1.0")


def test_parse_age() -> None:
    """Durations count back from now; timestamps are taken as is (UTC when naive)."""
    now = datetime.fromisoformat("2024-05-31T00:00:00+00:00")
    assert parse_age("30d", now) == datetime.fromisoformat("2024-05-01T00:00:00+00:00")
    assert parse_age("1h30m", now) == datetime.fromisoformat("2024-05-30T22:30:00+00:00")
    assert parse_age("2024-05-01", now) == datetime.fromisoformat("2024-05-01T00:00:00+00:00")
    for bad in ("", "30", "d", "1x"):
        with pytest.raises(ValueError, match="invalid age"):
            parse_age(bad, now)
