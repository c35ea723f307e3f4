"""The ``stepstone`` command against real stores.

Most commands run in this process through ``stepstone.cli.main(argv)`` (so coverage sees
them), against sqlite:, file:, the Cosmos DB emulator, PostgreSQL and MySQL; a few run
as real processes (``python -m stepstone``) to pin exit codes, tracebacks, signals and
secrets end to end. Remote stores get a fresh container or table per test; without a
server those tests are skipped loudly (and fail under CI).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import pytest

from cli_support import KEY_ENV, cli, secrets_to_hide, store_url
from fresh_stores import FLUSHED_COMMITS, SERVERS, fresh_table
from stepstone import Checkpoint, Step, StepFailed, open_store, run
from stepstone._migrate import differences, migrate
from stepstone.cli import main, parse_age, redact
from stepstone.testing import backend_unavailable

pytestmark = [
    pytest.mark.timeout(60),
    # verify=false against the emulator's self-signed certificate, in this process.
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

LOCAL_KINDS = ["sqlite", "file"]
SQL_KINDS = ["postgresql", "mysql"]
KINDS = [*LOCAL_KINDS, "cosmos", *SQL_KINDS]
COSMOS_DATABASE = "clitest"
QUIET_TLS = "ignore:Unverified HTTPS request"  # urllib3.exceptions.InsecureRequestWarning


class Cosmos:
    """The session's emulator, an SDK client on it, and the containers tests made."""

    def __init__(self, emulator: Any) -> None:
        self.emulator = emulator
        self.key: str = emulator.key
        self.client = emulator.client()
        self.created: list[tuple[str, str | None]] = []  # (database, container or None)

    def config(self, container: str, database: str = COSMOS_DATABASE, create: bool = True) -> str:
        """Return a config string for ``database/container``; remember it for cleanup."""
        self.created.append((database, None if database != COSMOS_DATABASE else container))
        emu = self.emulator
        protocol = "&protocol=http" if emu.endpoint.startswith("http://") else ""
        options = f"verify=false{protocol}{'&create=true' if create else ''}"
        return f"cosmos://{emu.host}:{emu.port}/{database}/{container}?{options}"

    def item(self, container: str, run_id: str) -> dict[str, Any]:
        """Return the raw item of ``run_id``, read through the azure-cosmos SDK."""
        from stepstone.stores.cosmos import item_id

        proxy = self.client.get_database_client(COSMOS_DATABASE).get_container_client(container)
        doc_id = item_id(run_id)
        return dict(proxy.read_item(doc_id, partition_key=doc_id))

    def cleanup(self) -> None:
        """Delete what the tests created (the emulator may be a shared, external one)."""
        from azure.cosmos.exceptions import CosmosHttpResponseError

        for database, container in self.created:
            db = self.client.get_database_client(database)
            try:
                if container is None:
                    self.client.delete_database(database)
                else:
                    db.delete_container(container)
            except CosmosHttpResponseError as exc:
                if exc.status_code != 404:
                    raise


@pytest.fixture(scope="session")
def cosmos(emulator: Any) -> Iterator[Cosmos]:
    """The Cosmos emulator of the session, with a client to read raw items and clean up."""
    try:
        import azure.cosmos  # noqa: F401
    except ImportError as exc:
        backend_unavailable(f"azure-cosmos, so the CLI is NOT tested on Cosmos: {exc}")
    handle = Cosmos(emulator)
    yield handle
    handle.cleanup()


@pytest.fixture
def cosmos_env(cosmos: Cosmos, monkeypatch: pytest.MonkeyPatch) -> Cosmos:
    """The emulator, with its key in AZURE_COSMOS_KEY for this process and the CLI's."""
    monkeypatch.setenv(KEY_ENV, cosmos.key)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    # verify=false makes urllib3 warn on every request, on the CLI's stderr; see
    # test_cosmos_verify_false_keeps_stderr_clean. Silenced here so the other tests can
    # check stderr line by line.
    monkeypatch.setenv("PYTHONWARNINGS", QUIET_TLS)
    return cosmos


NewStore = Callable[..., str]


@pytest.fixture
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> NewStore:
    """A factory: ``new_store(kind, name)`` returns the config string of a fresh store."""

    def make(kind: str, name: str = "store") -> str:
        if kind in LOCAL_KINDS:
            config = store_url(kind, tmp_path, name)
            open_store(config).close()  # created, as `stepstone init` would: commands need it
            return config
        if kind == "cosmos":
            handle: Cosmos = request.getfixturevalue("cosmos_env")
            return handle.config(f"{name}-{uuid.uuid4().hex[:12]}")
        config = fresh_table(request, SERVERS[kind])
        open_store(config).close()  # its tables created, as `stepstone init` would
        return config

    return make


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, new_store: NewStore) -> str:
    """A fresh store of each durable kind."""
    return new_store(request.param)


def cli_process(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m stepstone ARGS`` as a real process and return it (text output)."""
    full_env = {k: v for k, v in os.environ.items() if k != "STEPSTONE_STORE"}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "stepstone", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=30,
        check=False,
    )
    # No command may ever print a credential it was given, whatever it did.
    for secret in secrets_to_hide(full_env):
        assert secret not in proc.stdout + proc.stderr, f"credential printed by {args}"
    return proc


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
    header = ["RUN_ID", "STATUS", "STEPS", "WORKFLOW", "OWNER", "DUE", "UPDATED", "AGE"]
    assert lines[0].split() == header
    assert [line.split()[0] for line in lines[1:]] == ["third", "second", "first"]
    assert all(line.split()[1:4] == ["done", "2/2", "-"] for line in lines[1:])
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
    # The file store lists from its own index of documents and logs the skip, as the SQL
    # stores do: one warning line on stderr, whatever its level's spelling.
    assert "skipping run 'zzz'" in proc.stderr
    assert proc.stderr.lower().startswith("stepstone: warning: ")
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
    # The output's fields, in order; its time in the CLI's form (UTC, Z), as every time.
    assert list(failure) == ["step_index", "step_name", "error_type", "message", "attempt", "at"]
    assert failure["at"].endswith("Z")
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
    assert "no run 'nope' in " in proc.stderr
    assert url.rpartition("@")[2] in proc.stderr  # the store; user info is printed as ***


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


@pytest.mark.parametrize("url", [k for k in KINDS if k != "cosmos"], indirect=True)
def test_prune_ttl_needs_native_ttl(url: str) -> None:
    """--ttl on a store without expire() is a one-line usage error and deletes nothing."""
    make_done(url, "keep")
    proc = cli("runs", "prune", "--older-than", "0s", "--ttl", "--store", url)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert "no native TTL" in proc.stderr
    assert ids(url) == ["keep"]


# --- migrate -----------------------------------------------------------------------------

DIRECTIONS = [
    ("sqlite", "file"),
    ("file", "sqlite"),
    ("sqlite", "cosmos"),
    ("cosmos", "sqlite"),
    ("sqlite", "postgresql"),
    ("postgresql", "sqlite"),
]
# Killing a migration midway matters for the destination: one of each kind.
CRASH_DIRECTIONS = [
    ("sqlite", "file"),
    ("file", "sqlite"),
    ("sqlite", "cosmos"),
    ("sqlite", "postgresql"),
]


@pytest.mark.parametrize(("src_kind", "dst_kind"), DIRECTIONS)
def test_migrate_copies_then_skips(new_store: NewStore, src_kind: str, dst_kind: str) -> None:
    """migrate copies every run with its content, and a second run skips them all."""
    src, dst = new_store(src_kind, "src"), new_store(dst_kind, "dst")
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
def test_migrate_conflict_then_force(new_store: NewStore, src_kind: str, dst_kind: str) -> None:
    """A differing destination run is a conflict (exit 1, untouched) until --force."""
    src, dst = new_store(src_kind, "src"), new_store(dst_kind, "dst")
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
@pytest.mark.parametrize(("src_kind", "dst_kind"), CRASH_DIRECTIONS)
def test_migrate_interrupted_then_rerun(new_store: NewStore, src_kind: str, dst_kind: str) -> None:
    """A migration killed with SIGKILL midway completes when run again, skipping what landed."""
    src, dst = new_store(src_kind, "src"), new_store(dst_kind, "dst")
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
    proc = cli("doctor", "--store", url, env=FLUSHED_COMMITS)
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


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_doctor_fails_on_unwritable_directory(unwritable: Path, kind: str) -> None:
    """doctor reports FAIL and exits 1 when the store's directory cannot be written."""
    url = f"sqlite:///{unwritable}/x.db" if kind == "sqlite" else f"file:{unwritable}/runs"
    proc = cli("doctor", "--store", url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any(line.startswith("FAIL ") for line in proc.stdout.splitlines()), proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


# --- Cosmos DB specifics -----------------------------------------------------------------


def container_of(config: str) -> str:
    """Return the container name of a cosmos:// config string."""
    return urlsplit(config).path.rsplit("/", 1)[1]


def closed_port() -> int:
    """Return a port on 127.0.0.1 that nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cosmos_prune_ttl_sets_the_item_ttl(cosmos_env: Cosmos, new_store: NewStore) -> None:
    """prune --ttl writes Cosmos' native ttl on exactly the matching items and deletes none."""
    url = new_store("cosmos")
    container = container_of(url)
    make_done(url, "done1", "done2")
    make_failed(url, "failed1")

    dry = cli("runs", "prune", "--older-than", "0s", "--ttl", "--dry-run", "--store", url)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: would expire 3 runs" in dry.stdout
    assert all("ttl" not in cosmos_env.item(container, r) for r in ("done1", "done2", "failed1"))

    proc = cli("runs", "prune", "--older-than", "0s", "--ttl", "--status", "done", "--store", url)
    assert proc.returncode == 0, proc.stderr
    assert "set a 1s TTL on 2 done runs" in proc.stdout
    assert [cosmos_env.item(container, r).get("ttl") for r in ("done1", "done2", "failed1")] == [
        1,
        1,
        None,
    ]

    args = ["--older-than", "0s", "--ttl", "2h", "--status", "failed", "--store", url]
    hours = cli("runs", "prune", *args)
    assert hours.returncode == 0, hours.stderr
    assert "set a 7200s TTL on 1 failed run" in hours.stdout
    item = cosmos_env.item(container, "failed1")
    assert item["ttl"] == 7200
    assert item["run_id"] == "failed1" and item["failure"] is not None  # the rest is kept
    assert shown(url, "failed1")["state"] == {"order": 7}


def test_cosmos_init_creates_database_and_container(cosmos_env: Cosmos) -> None:
    """init creates the missing database and container that a store without create=true needs."""
    url = cosmos_env.config("runs", database=f"clitest-init-{uuid.uuid4().hex[:8]}", create=False)
    before = cli("runs", "list", "--store", url)
    assert before.returncode == 1
    assert_one_error_line(before.stderr)
    assert "does not exist" in before.stderr and "stepstone init" in before.stderr

    proc = cli("init", "--store", url)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    assert lines[0].startswith("database 'clitest-init-") and lines[0].endswith(": created")
    assert lines[1].startswith("container 'runs': created (partition key /id")

    again = cli("init", "--store", url)
    assert again.returncode == 0, again.stderr
    assert [line.rsplit(": ", 1)[1] for line in again.stdout.splitlines()] == [
        "already exists",
        "already exists",
    ]
    database = urlsplit(url).path.split("/")[1]
    props = cosmos_env.client.get_database_client(database).get_container_client("runs").read()
    assert props["partitionKey"]["paths"] == ["/id"]
    assert props.get("defaultTtl") == -1
    make_done(url, "after-init")
    assert [r["run_id"] for r in listed(url)] == ["after-init"]


def test_cosmos_doctor_checks_the_partition_key(cosmos_env: Cosmos, new_store: NewStore) -> None:
    """doctor reports the /id partition key and TTL ok, and fails a container keyed otherwise."""
    url = new_store("cosmos")
    proc = cli("doctor", "--store", url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "ok    partition key is /id" in lines
    assert "ok    TTL enabled (defaultTtl set): defaultTtl=-1" in lines

    from azure.cosmos import PartitionKey

    name = f"wrongkey-{uuid.uuid4().hex[:12]}"
    wrong = cosmos_env.config(name, create=False)
    cosmos_env.client.create_database_if_not_exists(COSMOS_DATABASE).create_container(
        name, partition_key=PartitionKey(path="/pk")
    )
    bad = cli("doctor", "--store", wrong)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1, bad.stdout
    assert "partitioned by ['/pk']" in failed[0]
    assert "Traceback" not in bad.stdout + bad.stderr


def test_cosmos_unreachable_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor on a closed port is one FAIL line and exit 1; runs list one error line, exit 1."""
    monkeypatch.setenv(KEY_ENV, "bm90LWEtcmVhbC1rZXktYnV0LWxvbmctZW5vdWdoLXRvLWdyZXA=")
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    url = f"cosmos://127.0.0.1:{closed_port()}/{COSMOS_DATABASE}/runs?verify=false"
    start = time.monotonic()
    proc = cli("doctor", "--store", url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr == ""
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1, proc.stdout
    assert "cannot connect" in failed[0]
    assert proc.stdout.splitlines()[-1] == "0 checks passed, 1 failed"

    listing = cli("runs", "list", "--store", url)
    assert listing.returncode == 1
    assert_one_error_line(listing.stderr)
    assert "cannot connect" in listing.stderr
    assert time.monotonic() - start < 20  # a refused connection is not retried for long


def test_cosmos_verify_false_keeps_stderr_clean(cosmos_env: Cosmos, new_store: NewStore) -> None:
    """With verify=false (the emulator setting) a successful command writes nothing to stderr."""
    url = new_store("cosmos")
    make_done(url, "a")
    proc = cli_process("runs", "show", "a", "--store", url, env={"PYTHONWARNINGS": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    missing = cli_process("runs", "show", "nope", "--store", url, env={"PYTHONWARNINGS": ""})
    assert missing.returncode == 1
    assert_one_error_line(missing.stderr)


@pytest.mark.server
def test_user_name_in_config_does_not_corrupt_output(new_store: NewStore) -> None:
    """A user name in a SQL config string is no secret: ids, states and the URL stay intact."""
    url = new_store("postgresql")  # postgresql://postgres@...
    with open_store(url) as store:
        store.save(Checkpoint(run_id="postgres-1", state={"db": "postgres"}, total_steps=1))
    assert [r["run_id"] for r in listed(url)] == ["postgres-1"]
    data = shown(url, "postgres-1")
    assert (data["run_id"], data["state"]) == ("postgres-1", {"db": "postgres"})
    missing = cli("runs", "show", "nope", "--store", url)
    assert "in postgresql://postgres@127.0.0.1:5432/test?table=" in missing.stderr


def test_cosmos_key_never_printed(cosmos_env: Cosmos, new_store: NewStore) -> None:
    """The account key shows up in no output, with --verbose tracebacks or pasted in the URL."""
    url = new_store("cosmos")
    key = cosmos_env.key
    make_failed(url, "f1")
    pasted = f"{url}&key={quote(key, safe='')}"
    unreachable = f"cosmos://127.0.0.1:{closed_port()}/{COSMOS_DATABASE}/x?verify=false"
    missing = cosmos_env.config(f"missing-{uuid.uuid4().hex[:8]}", create=False)
    outputs = []
    for args in (
        ["--verbose", "runs", "show", "f1", "--json"],
        ["--verbose", "runs", "show", "nope"],
        ["--verbose", "doctor"],
        ["--verbose", "runs", "list", "--store", pasted],
        ["--verbose", "doctor", "--store", unreachable],
        ["--verbose", "runs", "list", "--store", missing],
    ):
        full = [*args, "--store", url] if "--store" not in args else args
        proc = cli_process(*full)
        outputs.append((proc.returncode, proc.stdout + proc.stderr))
    text = "\n".join(output for _, output in outputs)
    assert key not in text and quote(key, safe="") not in text
    assert key[:16] not in text and quote(key, safe="")[:16] not in text
    assert [code for code, _ in outputs] == [0, 1, 0, 2, 1, 1]  # each path really ran
    assert "option 'key' would put a secret" in outputs[3][1]
    assert all("Traceback" in outputs[i][1] for i in (1, 3, 5))  # --verbose tracebacks
    assert "FAIL  open the container" in outputs[4][1]


# --- demo --------------------------------------------------------------------------------


@pytest.mark.crash
def test_demo_default_store_twice(tmp_path: Path) -> None:
    """demo crashes a child, resumes skipping the done step, and can run twice in one store."""
    first = cli_process("demo", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert "killed by SIGKILL" in out
    assert "step 'fetch_order'   SKIPPED" in out
    assert "skipped 'fetch_order'" in out
    assert '"receipt": "sent"' in out
    assert (tmp_path / "stepstone.db").exists()

    second = cli_process("demo", cwd=tmp_path)
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


@pytest.mark.process
def test_bad_store_is_one_line_exit_2(tmp_path: Path) -> None:
    """An unknown scheme is one error line and exit 2; --verbose adds the traceback."""
    proc = cli_process("--store", "bogus://x", "runs", "list", cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert "unknown store scheme 'bogus'" in proc.stderr

    verbose = cli_process("--verbose", "--store", "bogus://x", "runs", "list", cwd=tmp_path)
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


@pytest.mark.process
def test_store_failure_is_exit_1(tmp_path: Path) -> None:
    """A store that cannot be opened is an operational error: one line, exit 1."""
    proc = cli_process("runs", "list", "--store", f"sqlite:///{tmp_path}/missing-dir/x.db")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr)


@pytest.mark.process
def test_secrets_never_printed() -> None:
    """Passwords and key-like query values in a config string never reach the output."""
    config = "memory://alice:hunter2@x/?key=s3cr3tk3y"
    for extra in ([], ["--verbose"]):
        proc = cli_process(*extra, "runs", "list", "--store", config)
        assert proc.returncode == 2
        output = proc.stdout + proc.stderr
        assert "hunter2" not in output
        assert "s3cr3tk3y" not in output
        assert "***" in output
    assert redact("sqlite:///x.db?busy_timeout=5") == "sqlite:///x.db?busy_timeout=5"
    assert redact("cosmos://h/db/c?token=abc&x=1") == "cosmos://h/db/c?token=***&x=1"


@pytest.mark.process
def test_version() -> None:
    """--version prints the package version."""
    proc = cli_process("--version")
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


# --- escaping stored text ----------------------------------------------------------------

HOSTILE_TEXT = "red \x1b[31mALERT\x1b[0m \x9b2J bidi \u202egnp.exe\x07 bell"


def make_hostile(url: str, run_id: str = "evil") -> None:
    """Save a failed run whose failure, step names and state hold terminal escapes."""
    from stepstone import Failure

    failure = Failure(
        1,
        f"charge{HOSTILE_TEXT}",
        f"Err{HOSTILE_TEXT}",
        HOSTILE_TEXT,
        1,
        datetime.now().astimezone(),
    )
    with open_store(url) as store:
        store.save(
            Checkpoint(
                run_id=run_id,
                step=0,
                state={"note": HOSTILE_TEXT, HOSTILE_TEXT: 1},
                step_names=(f"fetch{HOSTILE_TEXT}",),
                total_steps=2,
                failure=failure,
                owner=f"worker{HOSTILE_TEXT}",
            )
        )


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_show_and_list_escape_control_characters(tmp_path: Path, kind: str) -> None:
    """runs show/list print stored escape sequences as \\x1b text, never raw; JSON keeps them."""
    url = store_url(kind, tmp_path)
    make_hostile(url)
    for args in (("runs", "show", "evil"), ("runs", "list"), ("runs", "list", "--json")):
        proc = cli(*args, "--store", url)
        assert proc.returncode == 0, proc.stderr
        for raw in ("\x1b", "\x9b", "\u202e", "\x07"):
            assert raw not in proc.stdout, (args, raw)
    text = cli("runs", "show", "evil", "--store", url).stdout
    assert "\\x1b[31mALERT" in text and "\\x9b2J" in text and "\\u202e" in text
    data = shown(url, "evil")
    assert data["failure"]["message"] == HOSTILE_TEXT  # JSON escapes, and loses nothing
    assert data["state"]["note"] == HOSTILE_TEXT
    assert listed(url)[0]["owner"] == f"worker{HOSTILE_TEXT}"


# --- --json everywhere -------------------------------------------------------------------


def test_every_printing_command_offers_json(tmp_path: Path) -> None:
    """Each command that prints gives one JSON document with --json, before or after it."""
    url, other = store_url("sqlite", tmp_path), store_url("file", tmp_path)
    make_done(url, "a", "b")
    commands = [
        ["runs", "list"],
        ["runs", "show", "a"],
        ["runs", "prune", "--older-than", "30d", "--dry-run"],
        ["runs", "prune", "--older-than", "0s", "--status", "failed"],
        ["runs", "delete", "b"],
        ["runs", "delete", "b", "--missing-ok"],
        ["init"],
        ["doctor"],
    ]
    for args in commands:
        for where in ("after", "before"):
            full = (
                [*args, "--store", url, "--json"]
                if where == "after"
                else ["--json", "--store", url, *args]
            )
            if where == "before" and args[:2] == ["runs", "delete"]:
                continue  # deleting twice is covered by --missing-ok
            proc = cli(*full)
            assert proc.returncode == 0, (full, proc.stderr)
            json.loads(proc.stdout)
    migrated = cli("migrate", "--from", url, "--to", other, "--json")
    assert migrated.returncode == 0, migrated.stderr
    report = json.loads(migrated.stdout)
    assert (report["copied"], report["complete"]) == (1, True)
    doctor = json.loads(cli("doctor", "--store", url, "--json").stdout)
    assert doctor["ok"] is True and all(c["ok"] for c in doctor["checks"])


# --- bad values are usage errors ---------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "list", "--older-than", "99999999999999999d"],
        ["runs", "list", "--newer-than", "999999999w"],
        ["runs", "prune", "--older-than", "1d", "--ttl", "99999999999w"],
        ["runs", "list", "--limit", "-3"],
        ["runs", "list", "--store", "postgresql://u@127.0.0.1:99999/db"],
        ["runs", "list", "--store", "cosmos://127.0.0.1:-1/db/c"],
        ["runs", "signal", "r", "approve", "--data", "{not json"],
        ["runs", "signal", "r", "approve", "--data", "[" * 100000],
        ["worker", "--workflows", "m:W", "--lease", "-1"],
        ["worker", "--workflows", "m:W", "--lease", "1e400"],
        ["worker", "--workflows", "m:W", "--lease", "99999999"],
        ["worker", "--workflows", "m:W", "--grace", "nan"],
        ["worker", "--workflows", "m:W", "--concurrency", "0"],
        ["worker", "--workflows", "m:W", "--concurrency", "99999999999999999999"],
        ["worker", "--workflows", "no_such_module_here:W"],
        ["worker", "--workflows", "nocolon"],
        ["runs", "show", "bad\x1bid"],
    ],
)
def test_bad_values_are_one_line_usage_errors(tmp_path: Path, args: list[str]) -> None:
    """Huge durations, bad ports, negative numbers and bad JSON exit 2 with one line."""
    url = store_url("sqlite", tmp_path)
    open_store(url).close()  # there: the value is what is wrong, not a missing store
    full = args if "--store" in args else [*args, "--store", url]
    proc = cli(*full)
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    assert_one_error_line(proc.stderr)
    assert "\x1b" not in proc.stderr


# --- prune is compare-and-swap -----------------------------------------------------------


def test_prune_keeps_a_run_that_advanced_after_it_was_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """prune deletes with the version it read: a run a worker saved meanwhile is kept."""
    from stepstone.stores.memory import MemoryStore

    url = f"memory://prune-{uuid.uuid4().hex}"
    held = open_store(url)  # keeps the named memory store alive across CLI opens
    held.save(Checkpoint(run_id="old", state={"n": 1}, total_steps=3, step=0, step_names=("a",)))
    held.save(Checkpoint(run_id="gone", state={}, total_steps=1))
    original = MemoryStore.delete

    def delete(self: Any, run_id: str, *, expected_version: str | None = None) -> bool:
        if run_id == "old":  # a worker advances the run between prune's read and delete
            cp = self.load(run_id)
            self.save(Checkpoint(**{**_fields(cp), "state": {"n": 2}}))
        return original(self, run_id, expected_version=expected_version)

    monkeypatch.setattr(MemoryStore, "delete", delete)
    proc = cli(
        "runs",
        "prune",
        "--older-than",
        "0s",
        "--status",
        "running",
        "--yes",
        "--store",
        url,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["run_ids"] == ["gone"]
    assert report["kept_because_changed"] == ["old"]
    kept = held.load("old")
    assert kept is not None and kept.state == {"n": 2}
    held.close()


def _fields(cp: Any) -> dict[str, Any]:
    """Return a checkpoint's constructor fields (its version included)."""
    import dataclasses

    return {f.name: getattr(cp, f.name) for f in dataclasses.fields(cp) if f.init}


# --- runtime commands: cancel, signal, worker --------------------------------------------


class FakeRuntime:
    """Stands in for stepstone.cancel/signal/Worker and records how the CLI called them."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def cancel(self, store: Any, run_id: str) -> Any:
        self.calls.append(("cancel", store.scheme, run_id))
        return type("Info", (), {"status": "cancelled"})()

    def signal(self, store: Any, run_id: str, name: str, payload: Any, *, signal_id: Any) -> None:
        self.calls.append(("signal", run_id, name, payload, signal_id))


def test_cancel_and_signal_call_the_runtime_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runs cancel/signal call stepstone.cancel/signal with the store, id, name, payload, id."""
    import stepstone

    fake = FakeRuntime()
    monkeypatch.setattr(stepstone, "cancel", fake.cancel, raising=False)
    monkeypatch.setattr(stepstone, "signal", fake.signal, raising=False)
    url = store_url("sqlite", tmp_path)
    open_store(url).close()
    cancel = cli("runs", "cancel", "r1", "--store", url)
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == "cancelled run 'r1'"
    sent = cli(
        "runs",
        "signal",
        "r1",
        "approval",
        "--data",
        '{"ok": true}',
        "--id",
        "s-1",
        "--store",
        url,
        "--json",
    )
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["signal"] == "approval"
    default = cli("runs", "signal", "r1", "ping", "--store", url)
    assert default.returncode == 0, default.stderr
    assert fake.calls == [
        ("cancel", "sqlite", "r1"),
        ("signal", "r1", "approval", {"ok": True}, "s-1"),
        ("signal", "r1", "ping", None, None),
    ]


class FakeWorker:
    """Stands in for stepstone.Worker: records its arguments; serve() returns at once."""

    made: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, store: Any, workflows: list[Any], **options: Any) -> None:
        FakeWorker.made.append((store.scheme, workflows, options))

    def serve(self) -> None:
        """Return at once, as after a stop()."""

    def stop(self) -> None:
        """Nothing to stop."""

    def abandon(self, timeout: float) -> list[str]:
        """No run is left in a step."""
        return []


class FakeWorkflow:
    """Stands in for stepstone.Workflow."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_worker_command_is_a_thin_wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """worker loads MODULE:ATTR (list or dict), opens the store and calls Worker(...).serve()."""
    import stepstone

    monkeypatch.setattr(stepstone, "Worker", FakeWorker, raising=False)
    monkeypatch.setattr(stepstone, "Workflow", FakeWorkflow, raising=False)
    module = f"flows_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "import stepstone\n"
        "LIST = [stepstone.Workflow('a'), stepstone.Workflow('b')]\n"
        "DICT = {'a': LIST[0]}\n"
        "NOT = 'a string'\n"
        "WRONG = [object()]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    url = store_url("sqlite", tmp_path)
    FakeWorker.made.clear()
    proc = cli(
        "worker",
        "--store",
        url,
        "--workflows",
        f"{module}:LIST",
        "--concurrency",
        "4",
        "--lease",
        "30",
        "--grace",
        "5m",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "serving a, b" in proc.stdout and "stopped" in proc.stdout
    scheme, workflows, options = FakeWorker.made[0]
    assert (scheme, [w.name for w in workflows]) == ("sqlite", ["a", "b"])
    assert options == {"concurrency": 4, "lease": 30.0, "grace": 300.0}
    defaults = cli("worker", "--store", url, "--workflows", f"{module}:DICT", cwd=tmp_path)
    assert defaults.returncode == 0, defaults.stderr
    assert FakeWorker.made[1][2] == {}  # the Worker's own defaults
    for attr, message in (
        ("NOT", "expected a non-empty list"),
        ("WRONG", "not a stepstone.Workflow"),
        ("MISSING", "has no 'MISSING'"),
    ):
        bad = cli("worker", "--store", url, "--workflows", f"{module}:{attr}", cwd=tmp_path)
        assert bad.returncode == 2, bad.stderr
        assert message in bad.stderr


_FAKE_WORKER_PROCESS = """
import sys, threading
import stepstone

class Workflow:
    name = "w"

class Worker:
    def __init__(self, store, workflows, **options):
        self.stopped = threading.Event()
    def serve(self):
        print("IN SERVE", flush=True)
        self.stopped.wait(60)
        if sys.argv[1] == "stubborn":  # a step in flight that does not finish
            threading.Event().wait(60)
    def stop(self):
        self.stopped.set()
    def abandon(self, timeout):
        return []

stepstone.Worker = Worker
stepstone.Workflow = Workflow
WORKFLOWS = [Workflow()]
sys.modules["fakeflows"] = sys.modules[__name__]
from stepstone.cli import main
sys.exit(main(["worker", "--store", sys.argv[2], "--workflows", "fakeflows:WORKFLOWS"]))
"""


@pytest.mark.crash
@pytest.mark.parametrize(("mode", "signals", "code"), [("graceful", 1, 0), ("stubborn", 2, 143)])
def test_worker_signals(tmp_path: Path, mode: str, signals: int, code: int) -> None:
    """SIGTERM calls worker.stop() and the command exits 0; a second signal exits at once."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _FAKE_WORKER_PROCESS, mode, store_url("sqlite", tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # Wait for serve() to run: the handlers are installed by then. A hang here is
        # bounded by this module's 60 s pytest timeout.
        lines: list[str] = []
        while not lines or "IN SERVE" not in lines[-1]:
            lines.append(proc.stdout.readline())
            assert lines[-1], f"the worker exited before serving: {lines}"
        assert proc.stderr is not None
        proc.send_signal(signal.SIGTERM)
        # The handler's line: the first signal was handled. Other lines may come first (a
        # coverage warning of the measured child): a second signal sent before the first
        # is handled would merge with it (standard signals do not queue) and never come.
        first = ""
        while "SIGTERM: stopping" not in first:
            first = proc.stderr.readline()
            assert first, "the worker exited before handling SIGTERM"
        if signals > 1:
            proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=30)
    finally:
        proc.kill()
        stdout, stderr = proc.communicate(timeout=30)
    assert returncode == code, first + stderr
    assert "SIGTERM: stopping" in first
    if signals > 1:
        assert "second signal: exiting at once" in stderr


needs_runtime = pytest.mark.skipif(
    not all(hasattr(__import__("stepstone"), n) for n in ("Workflow", "start", "cancel", "signal")),
    reason="RUNTIME API MISSING: stepstone.Workflow/start/cancel/signal not there yet",
)


@needs_runtime
def test_cancel_and_signal_against_the_real_runtime(tmp_path: Path) -> None:
    """On a queued run, signal is accepted and cancel leaves it cancelled; then signal fails."""
    import stepstone

    url = store_url("sqlite", tmp_path)
    flow = stepstone.Workflow("flow", steps(2))
    with open_store(url) as store:
        stepstone.start(store, flow, "q1")
    sent = cli("runs", "signal", "q1", "approval", "--data", "1", "--id", "x", "--store", url)
    assert sent.returncode == 0, sent.stderr
    again = cli("runs", "signal", "q1", "approval", "--data", "1", "--id", "x", "--store", url)
    assert again.returncode == 0, again.stderr  # a repeated id: already delivered, a no-op
    assert "already delivered (id 'x')" in again.stdout
    listed_queued = listed(url, "--status", "queued")
    assert [r["run_id"] for r in listed_queued] == ["q1"]
    cancel = cli("runs", "cancel", "q1", "--store", url)
    assert cancel.returncode == 0, cancel.stderr
    assert shown(url, "q1")["status"] == "cancelled"
    late = cli("runs", "signal", "q1", "approval", "--store", url)
    assert late.returncode == 1
    assert_one_error_line(late.stderr)
    finished = cli("runs", "cancel", "q1", "--store", url)
    assert finished.returncode == 1


# --- lease and waiting in list and show --------------------------------------------------


def test_show_and_list_report_lease_and_waiting(tmp_path: Path) -> None:
    """show says whether a lease is live or expired and what a waiting run waits for."""
    from datetime import UTC, timedelta

    url = store_url("sqlite", tmp_path)
    now = datetime.now(UTC)
    with open_store(url) as store:
        store.save(
            Checkpoint(
                run_id="live",
                step=0,
                step_names=("a",),
                total_steps=3,
                owner="host-1:42",
                lease=60.0,
                renewed_at=now,
                epoch=1,
            )
        )
        store.save(
            Checkpoint(
                run_id="dead",
                step=0,
                step_names=("a",),
                total_steps=3,
                owner="host-2:7",
                lease=30.0,
                renewed_at=now - timedelta(hours=1),
            )
        )
        store.save(
            Checkpoint(
                run_id="wait",
                step=0,
                step_names=("a",),
                total_steps=3,
                waiting_for="signal approval",
                wake_at=now + timedelta(hours=2),
            )
        )
    live = cli("runs", "show", "live", "--store", url).stdout
    assert "live: held by host-1:42" in live
    dead = cli("runs", "show", "dead", "--store", url).stdout
    assert "EXPIRED" in dead and "host-2:7" in dead
    wait = cli("runs", "show", "wait", "--store", url).stdout
    assert "status:      waiting" in wait
    assert "waiting for: signal approval, until" in wait
    assert shown(url, "live")["lease_live"] is True
    assert shown(url, "dead")["lease_live"] is False
    rows = {
        line.split()[0]: line
        for line in cli("runs", "list", "--store", url).stdout.splitlines()[1:]
    }
    assert "host-1:42" in rows["live"] and "lease " in rows["live"]
    assert "lease expired" in rows["dead"]
    assert "in 1h" in rows["wait"] or "in 2h" in rows["wait"]
    assert [(r["run_id"], r["waiting_for"]) for r in listed(url, "--status", "waiting")] == [
        ("wait", "signal approval")
    ]
    assert "signal approval" in rows["wait"]


# --- migrate keeps the runtime fields ----------------------------------------------------


def test_migrate_copies_runtime_fields_but_not_the_lease() -> None:
    """migrate copies input, workflow, signals and suspension, keeps created_at, drops the owner."""
    from datetime import UTC, timedelta

    from stepstone._checkpoint import Signal

    src, dst = open_store("memory://"), open_store("memory://")
    created = datetime(2020, 1, 1, tzinfo=UTC)
    src.save(
        Checkpoint(
            run_id="r",
            step=0,
            state={"a": 1},
            step_names=("a",),
            total_steps=3,
            input={"doc": 1},
            workflow="flow",
            workflow_version="2",
            waiting_for="signal ok",
            wake_at=created + timedelta(days=1),
            owner="w1",
            lease=30.0,
            renewed_at=created,
            signals=(Signal("ok", "s1", {"x": 1}, created),),
            created_at=created,
        )
    )
    report = migrate(src, dst)
    assert (report.copied, report.complete) == (1, True)
    a, b = src.load("r"), dst.load("r")
    assert a is not None and b is not None
    assert differences(a, b) == []
    assert (b.workflow, b.input, b.waiting_for, b.signals[0].payload) == (
        "flow",
        {"doc": 1},
        "signal ok",
        {"x": 1},
    )
    assert b.owner is None and b.lease is None
    assert b.created_at == created
    assert migrate(src, dst).skipped == 1


# --- secrets: hostile passwords through the CLI ------------------------------------------

HOSTILE = ["p@ss/w:rd%x", "s3cr:et%41%zz-long", "pässwörd€:long", "hunter2@evil.example"]


@pytest.mark.server
@pytest.mark.parametrize("password", HOSTILE)
def test_hostile_password_never_printed_by_doctor_or_logs(password: str) -> None:
    """doctor, runs list and --verbose logs never print a password with @ / : % or unicode."""
    port = closed_port()
    forms = {password, quote(password, safe=""), password.replace("%", "%25")}
    for secret in (password, quote(password, safe="")):
        for config in (
            f"postgresql://postgres:{secret}@127.0.0.1:{port}/test?connect_timeout=2",
            f"mysql://root:{secret}@127.0.0.1:{port}/test?connect_timeout=2",
            f"memory://alice:{secret}@x/",
        ):
            for args in (
                ["doctor"],
                ["--verbose", "doctor"],
                ["--verbose", "runs", "list"],
                ["doctor", "--json"],
            ):
                proc = cli(*args, "--store", config)
                assert proc.returncode in (0, 1, 2), (config, args, proc.stderr)
                text = proc.stdout + proc.stderr
                for leaked in forms:
                    assert leaked not in text, (config, args, text)


@pytest.mark.process
def test_hostile_password_never_printed_by_a_real_process() -> None:
    """As a real process (tracebacks, logging, warnings): the password never shows."""
    password = "p@ss/w:rd%-unique-42"
    for config in (
        f"postgresql://postgres:{quote(password, safe='')}@127.0.0.1:{closed_port()}/test",
        f"postgresql://postgres:{password}@127.0.0.1:{closed_port()}/test",
    ):
        proc = cli_process("--verbose", "doctor", "--store", config)
        assert proc.returncode in (1, 2), proc.stderr
        text = proc.stdout + proc.stderr
        assert password not in text and quote(password, safe="") not in text
        assert "***" in text


# --- first contact: the demo's closing hint ----------------------------------------------


def test_demo_hint_names_a_command_that_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without stepstone on PATH, the hint names the venv's script (relative when below)."""
    from stepstone.cli import _demo_bench

    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")
    script = venv / "stepstone"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _demo_bench.command_name() == ".venv/bin/stepstone"
    monkeypatch.setenv("PATH", str(venv))
    assert _demo_bench.command_name() == "stepstone"


@pytest.mark.crash
def test_demo_json_reports_the_resumed_run(tmp_path: Path) -> None:
    """demo --json prints one JSON object: the run, what the killed process did, the resume."""
    proc = cli("demo", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "done"
    assert report["first"]["killed_during"] == "reserve_stock"
    assert report["second"]["skipped"] == ["fetch_order"]
    assert report["state"]["receipt"] == "sent"
    command = report["inspect"].split()[0]
    assert shutil.which(command) is not None or Path(command).exists()


@needs_runtime
def test_demo_approval_waits_then_sends(tmp_path: Path) -> None:
    """demo --approval suspends the run for a signal, approves it and finishes it."""
    url = store_url("sqlite", tmp_path)
    proc = cli("demo", "--approval", "--store", url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "waiting for: signal approval" in proc.stdout
    assert "runs signal approval-" in proc.stdout
    done = [r for r in listed(url) if r["run_id"].startswith("approval-")]
    assert [r["status"] for r in done] == ["done"]
    assert shown(url, done[0]["run_id"])["state"]["sent"] is True


@needs_runtime
@pytest.mark.crash
def test_worker_command_finishes_an_approved_run_and_stops_on_sigterm(tmp_path: Path) -> None:
    """A real `stepstone worker` resumes a signalled run, then exits 0 on SIGTERM."""
    url = store_url("sqlite", tmp_path)
    manual = cli("demo", "--approval", "--manual", "--json", "--store", url)
    assert manual.returncode == 0, manual.stderr
    run_id = json.loads(manual.stdout)["run_id"]
    assert shown(url, run_id)["status"] == "waiting"
    sent = cli("runs", "signal", run_id, "approval", "--data", '{"ok": true}', "--store", url)
    assert sent.returncode == 0, sent.stderr
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepstone",
            "worker",
            "--store",
            url,
            "--lease",
            "2",
            "--workflows",
            "stepstone._demo:WORKFLOWS",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while shown(url, run_id)["status"] != "done":
            assert worker.poll() is None, "the worker exited early"
            assert time.monotonic() < deadline, "the worker did not finish the run in 30 s"
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        returncode = worker.wait(timeout=30)
    finally:
        worker.kill()
        stdout, stderr = worker.communicate(timeout=30)
    assert returncode == 0, stderr
    assert "stopped" in stdout
    assert shown(url, run_id)["state"]["sent"] is True


def test_bench_options_reach_the_benchmark() -> None:
    """bench passes its own options (--help here) through to the benchmark's parser."""
    proc = cli("bench", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "stepstone bench" in proc.stdout and "--quick" in proc.stdout


def test_certificate_errors_say_what_to_do() -> None:
    """A store error about an unverified certificate gains the verify=false hint."""
    from stepstone import StoreUnavailable
    from stepstone.cli import _classify

    code, message = _classify(
        StoreUnavailable("cannot connect: [SSL: CERTIFICATE_VERIFY_FAILED] self-signed certificate")
    )
    assert code == 1
    assert "verify=false" in message and "REQUESTS_CA_BUNDLE" in message


def test_runs_list_names_each_adapters_records() -> None:
    """``runs list`` tells each adapter's records from the runner's by their id."""
    from stepstone.cli._runs import _kind

    assert _kind("langgraph/t/ns/1") == "langgraph"
    assert _kind("maf/wf/c1") == "maf"
    assert _kind("openai-agents:r/0/model:1") == "openai-agents"
    assert _kind("r/agent/pydantic-ai-journal") == "pydantic-ai"
    assert _kind("openai-agents") == "run"  # a plain run that merely has that name


@needs_runtime
def test_runs_start_queues_a_run_and_explains_what_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runs start: queued as stepstone.start does; bad JSON, unknown workflow, an
    existing or bad run id are one clear line each."""
    module = f"startflows_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from stepstone import Step, Workflow\n"
        "WORKFLOWS = [Workflow('w', [Step('a', lambda s: {'a': 1})]),\n"
        "             Workflow('v', [Step('a', lambda s: {})], version='1'),\n"
        "             Workflow('v', [Step('b', lambda s: {})], version='2')]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    url = store_url("sqlite", tmp_path)
    flows = ("--workflows", f"{module}:WORKFLOWS", "--store", url)
    queued = cli("runs", "start", "w", "r1", "--input", '{"n": 1}', *flows, cwd=tmp_path)
    assert queued.returncode == 0, queued.stderr
    assert "queued run 'r1' of workflow 'w'" in queued.stdout
    assert shown(url, "r1")["status"] == "queued"
    as_json = cli("runs", "start", "w", "r2", "--json", *flows, cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {
        "run_id": "r2",
        "workflow": "w",
        "version": None,
        "status": "queued",
    }
    picked = cli("runs", "start", "v", "r3", "--workflow-version", "2", *flows, cwd=tmp_path)
    assert picked.returncode == 0, picked.stderr
    for args, code, message in (
        (("w", "r1"), 1, "run 'r1' exists already (status queued)"),
        (("w", "r4", "--input", "{nope"), 2, "--input is not JSON"),
        (("w", "r4", "--input", "[1]"), 2, "--input must be a JSON object, got a list"),
        (("nope", "r4"), 2, "has no workflow 'nope'; it has 'v', 'w'"),
        (("v", "r4"), 2, "say which with --workflow-version"),
        (("w", ""), 2, "run_id must be"),
    ):
        bad = cli("runs", "start", *args, *flows, cwd=tmp_path)
        assert (bad.returncode, bad.stdout) == (code, ""), (args, bad.stderr)
        assert message in bad.stderr and bad.stderr.count("\n") == 1, (args, bad.stderr)


def test_bench_masks_every_secret_of_the_store_url() -> None:
    """bench names the store it could not open with the key and password masked."""
    key = "bench-secret-key-0123456789abcdef"
    proc = cli("bench", "--store", f"cosmos://127.0.0.1:1/db/c?key={key}&verify=false")
    assert proc.returncode == 2, proc.stderr
    assert "cannot open store" in proc.stderr
    assert key not in proc.stderr + proc.stdout
    assert "key=***" in proc.stderr


def test_command_help_is_the_handler_docstring_and_names_the_real_constants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command's --help is its handler's docstring (``cli._commands``); the ui's and the
    demo's spell a constant out, which must stay the constant's value."""
    from stepstone._registry import DEFAULT_STORE
    from stepstone.cli import _demo_bench, _ui

    for command, handler, constant in (
        ("ui", _ui._ui, f"${_ui.TOKEN_ENV}"),
        ("demo", _demo_bench._demo, DEFAULT_STORE),
    ):
        assert handler.__doc__ is not None and constant in handler.__doc__, command
        assert main([command, "--help"]) == 0
        shown = " ".join(capsys.readouterr().out.split())  # argparse rewraps the text
        assert constant in shown, command
