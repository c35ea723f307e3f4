"""``stepstone schedules ...`` and the deadline in ``runs show`` (issue 33)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from cli_support import cli, store_url
from fresh_stores import fresh_config
from stepstone import Step, Workflow, open_store, start


@pytest.fixture
def kind() -> str:
    """The store's backend: SQLite, unless a test runs on more (it parametrizes ``kind``)."""
    return "sqlite"


@pytest.fixture
def flows(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, ...]:
    """A module of workflows the CLI imports, and a store of ``kind`` (SQLite: beside it)."""
    module = f"flows_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from stepstone import Step, Workflow\n"
        "WORKFLOWS = [Workflow('digest', [Step('build', lambda s: {'ok': True})])]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    url = fresh_config(kind, request, tmp_path)
    with open_store(url):  # made, so that listing it is not "no such store"
        pass
    return ("--workflows", f"{module}:WORKFLOWS", "--store", url)


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_schedules_add_list_show_pause_resume_backfill_delete(
    tmp_path: Path, flows: tuple[str, ...]
) -> None:
    """Every action works and prints what it did; --json gives the stored fields."""
    store = flows[-2:]
    added = cli(
        "schedules",
        "add",
        "daily",
        "--cron",
        "0 7 * * *",
        "--tz",
        "Europe/Berlin",
        "--workflow",
        "digest",
        *flows,
        cwd=tmp_path,
    )
    assert added.returncode == 0, added.stderr
    assert "schedule 'daily': '0 7 * * *' ('Europe/Berlin')" in added.stdout
    listed = cli("schedules", "list", *store)
    assert listed.returncode == 0 and "daily" in listed.stdout and "Europe/Berlin" in listed.stdout
    shown = cli("--json", "schedules", "show", "daily", *store)
    assert json.loads(shown.stdout)["cron"] == "0 7 * * *"
    assert cli("schedules", "pause", "daily", *store).stdout.strip() == "schedule 'daily': paused"
    assert json.loads(cli("--json", "schedules", "list", *store).stdout)[0]["paused"] is True
    assert cli("schedules", "resume", "daily", *store).returncode == 0
    filled = cli(
        "--json",
        "schedules",
        "backfill",
        "daily",
        "--start",
        "2030-01-01",
        "--end",
        "2030-01-02T23:00",
        "--workflows",
        flows[1],
        *store,
        cwd=tmp_path,
    )
    assert filled.returncode == 0, filled.stderr
    assert json.loads(filled.stdout)["run_ids"] == [
        "sched/daily/2030-01-01T06:00:00Z",
        "sched/daily/2030-01-02T06:00:00Z",
    ]
    runs = cli("runs", "list", *store)
    assert "~schedules" not in runs.stdout  # stepstone's own record, not a run
    assert "~schedules" in cli("runs", "list", "--kind", "schedules", *store).stdout
    pruned = cli("runs", "prune", "--older-than", "0s", "--yes", *store)
    assert pruned.returncode == 0, pruned.stderr
    assert cli("schedules", "delete", "daily", *store).returncode == 0
    assert cli("schedules", "list", *store).stdout.strip() == "no schedules"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--cron", "0 7 * *"), 2, "five are allowed"),
        (("--cron", "0 25 * * *"), 2, "is not valid"),
        (("--cron", "0 7 * * *", "--tz", "Mars/Base"), 2, "not a known IANA time zone"),
        (("--cron", "0 7 * * *", "--workflow", "nope"), 2, "has no workflow 'nope'"),
        (("--cron", "0 7 * * *", "--overlap", "queue"), 2, "invalid choice"),
        (("--cron", "0 7 * * *", "--input", "[1]"), 2, "must be a JSON object"),
    ],
)
def test_schedules_add_refuses_bad_input(
    tmp_path: Path, flows: tuple[str, ...], args: tuple[str, ...], code: int, message: str
) -> None:
    """A bad cron, zone, workflow, policy or input: one line naming it, nothing stored."""
    named = ("--workflow", "digest") if "--workflow" not in args else ()
    bad = cli("schedules", "add", "x", *named, *args, *flows, cwd=tmp_path)
    assert (bad.returncode, bad.stdout) == (code, ""), bad.stderr
    assert message in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    assert cli("schedules", "list", *flows[-2:]).stdout.strip() == "no schedules"


def test_schedules_name_clash_and_missing(tmp_path: Path, flows: tuple[str, ...]) -> None:
    """Another spec under a taken name is refused unless --replace; a missing name exits 1."""
    base = ("schedules", "add", "n", "--workflow", "digest", *flows)
    assert cli(*base, "--cron", "0 7 * * *", cwd=tmp_path).returncode == 0
    clash = cli(*base, "--cron", "0 8 * * *", cwd=tmp_path)
    assert clash.returncode == 1 and "exists with another cron" in clash.stderr
    assert cli(*base, "--cron", "0 8 * * *", "--replace", cwd=tmp_path).returncode == 0
    missing = cli("schedules", "show", "other", *flows[-2:])
    assert missing.returncode == 1 and "no schedule is named 'other'" in missing.stderr


def test_runs_show_prints_the_deadline(tmp_path: Path) -> None:
    """runs show names a queued run's deadline length, and --json carries its timing."""
    url = store_url("sqlite", tmp_path)
    with open_store(url) as store:
        flow = Workflow("w", [Step("s", lambda s: {})])
        start(store, flow, "r", deadline=timedelta(hours=2))
    shown = cli("runs", "show", "r", "--store", url)
    assert "7200s from the first claim, then fail" in shown.stdout
    data = json.loads(cli("--json", "runs", "show", "r", "--store", url).stdout)
    assert data["timing"] == {"deadline": 7200.0, "on_deadline": "fail"}
