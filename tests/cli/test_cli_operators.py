"""An operator's first hour with the ``stepstone`` command (issue 35): safe prune
defaults, no store created by a typo, ``runs retry``, repeated signal ids, honest
status and JSON errors.

Commands run through ``stepstone.cli.main(argv)`` on durable stores (SQLite, file, and
PostgreSQL where compare-and-swap across connections matters), or as real processes
where a terminal or an installation is what is tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import stepstone
from cli_support import cli, store_url
from fresh_stores import POSTGRES_URL
from stepstone import (
    Checkpoint,
    InvalidWorkflow,
    RunNotActive,
    Step,
    WaitFor,
    Worker,
    Workflow,
    WorkflowChanged,
    asignal,
    open_store,
    start,
)
from stepstone._checkpoint import Failure, evolve, utcnow
from stepstone.testing import backend_unavailable
from waiting import status_of, until

pytestmark = pytest.mark.timeout(120)

LOCAL_KINDS = ["sqlite", "file"]
POSTGRES = POSTGRES_URL
WAIT_TIMEOUT = 60.0
SRC = str(Path(stepstone.__file__).resolve().parents[1])


def postgres_url(request: pytest.FixtureRequest) -> str:
    """Return a config string naming a new PostgreSQL table, dropped after the test."""
    table = f"t_ops_{uuid.uuid4().hex[:16]}"
    try:
        import psycopg

        conn: Any = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=3)
    except Exception as exc:  # noqa: BLE001 - any failure to connect: no server
        backend_unavailable(f"{POSTGRES}: {type(exc).__name__}: {exc}")

    def drop() -> None:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")
        conn.close()

    request.addfinalizer(drop)
    return f"{POSTGRES}?table={table}"


@pytest.fixture(params=LOCAL_KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An existing, empty local store of each kind."""
    config = store_url(request.param, tmp_path)
    open_store(config).close()
    return config


@pytest.fixture(params=[*LOCAL_KINDS, "postgresql"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An existing, empty store: each local kind and PostgreSQL."""
    if request.param == "postgresql":
        config = postgres_url(request)
    else:
        config = store_url(request.param, tmp_path)
    open_store(config).close()
    return config


def load(url: str, run_id: str) -> Checkpoint:
    """Return the run's checkpoint; fail if it is missing."""
    with open_store(url) as store:
        cp = store.load(run_id)
    assert cp is not None, f"run {run_id!r} is missing"
    return cp


def ids(url: str) -> list[str]:
    """Return the run ids in a store, sorted."""
    with open_store(url) as store:
        return sorted(store.list_runs())


def ok(_state: dict[str, Any]) -> dict[str, Any]:
    """A step that succeeds."""
    return {"ok": True}


def boom(_state: dict[str, Any]) -> dict[str, Any]:
    """A step that fails."""
    raise RuntimeError("card declined")


FLOW = Workflow("orders", [Step("fetch", ok), Step("charge", ok)])
APPROVAL = Workflow("approve", [Step("fetch", ok), WaitFor("wait", "approval")])


def seed(url: str, run_id: str, status: str) -> None:
    """Save a run of ``orders`` with ``status`` (queued, waiting, running, failed, done,
    cancelled), as a worker or an operator would have left it."""
    with open_store(url) as store:
        if status in ("queued", "cancelled"):
            stepstone.start(store, FLOW, run_id)
            if status == "cancelled":
                stepstone.cancel(store, run_id)
            return
        if status == "waiting":
            stepstone.start(store, APPROVAL, run_id)
            cp = store.load(run_id)
            assert cp is not None
            store.save(
                evolve(cp, queued=False, step=0, step_names=("fetch",), waiting_for="signal x")
            )
            return
        stepstone.start(store, FLOW, run_id)
        cp = store.load(run_id)
        assert cp is not None
        if status == "done":
            new = evolve(cp, queued=False, step=1, step_names=("fetch", "charge"))
        elif status == "failed":
            failure = Failure(1, "charge", "RuntimeError", "card declined", 1, utcnow())
            new = evolve(cp, queued=False, step=0, step_names=("fetch",), failure=failure)
        else:
            assert status == "running", status
            new = evolve(cp, queued=False, step=0, step_names=("fetch",))
        store.save(new)
    assert load(url, run_id).status == status


# --- 1: prune spares active runs ---------------------------------------------------------


def test_prune_deletes_only_finished_runs_by_default(any_url: str) -> None:
    """Without --status, prune deletes done, failed and cancelled runs and keeps active ones."""
    for status in ("queued", "waiting", "running", "failed", "done", "cancelled"):
        seed(any_url, status, status)
    proc = cli("runs", "prune", "--older-than", "0s", "--store", any_url)
    assert proc.returncode == 0, proc.stderr
    assert "deleted 3 runs (done, failed or cancelled)" in proc.stdout
    assert ids(any_url) == ["queued", "running", "waiting"]


def test_prune_of_active_runs_needs_yes_without_a_terminal(url: str) -> None:
    """--status naming an active status is refused off a terminal unless --yes is given."""
    seed(url, "q", "queued")
    seed(url, "w", "waiting")
    refused = cli("runs", "prune", "--older-than", "0s", "--status", "waiting", "--store", url)
    assert refused.returncode == 2, refused.stdout
    assert "add --yes" in refused.stderr and "1 waiting" in refused.stderr
    assert ids(url) == ["q", "w"]
    dry = cli(
        "runs", "prune", "--older-than", "0s", "--status", "waiting", "--dry-run", "--store", url
    )
    assert dry.returncode == 0, dry.stderr
    assert "would delete 'w'" in dry.stdout
    done = cli(
        "runs",
        "prune",
        "--older-than",
        "0s",
        "--status",
        "waiting",
        "--status",
        "queued",
        "--yes",
        "--store",
        url,
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["run_ids"]) == ["q", "w"]
    assert ids(url) == []


@pytest.mark.slow
@pytest.mark.parametrize(("answer", "kept"), [("n\n", ["w"]), ("y\n", [])])
def test_prune_of_active_runs_asks_on_a_terminal(
    tmp_path: Path, answer: str, kept: list[str]
) -> None:
    """On a terminal, prune asks before deleting active runs and deletes only on 'y'."""
    import pty

    url = store_url("sqlite", tmp_path)
    open_store(url).close()
    seed(url, "w", "waiting")
    leader, follower = pty.openpty()
    try:
        os.write(leader, answer.encode())
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "stepstone",
                "runs",
                "prune",
                "--older-than",
                "0s",
                "--status",
                "waiting",
                "--store",
                url,
            ],
            stdin=follower,
            capture_output=True,
            text=True,
            timeout=WAIT_TIMEOUT,
            env={**os.environ, "PYTHONPATH": SRC},
            check=False,
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert "1 waiting active run(s) as well? [y/N]" in proc.stderr
    assert proc.returncode == (1 if kept else 0), proc.stderr
    assert ids(url) == kept


# --- 2: a typo in a store path creates nothing ---------------------------------------------

READ_ONLY = [
    ["runs", "list"],
    ["runs", "show", "r"],
    ["runs", "history", "r"],
    ["runs", "prune", "--older-than", "1d"],
    ["runs", "retry", "r"],
    ["runs", "signal", "r", "go"],
    ["doctor"],
    ["ui", "--port", "1"],
]


def _tree(base: Path) -> list[str]:
    """Return every path under ``base`` (symlinks not followed), sorted."""
    return sorted(str(p.relative_to(base)) for p in base.rglob("*"))


@pytest.mark.parametrize("kind", LOCAL_KINDS)
@pytest.mark.parametrize("command", READ_ONLY, ids=lambda c: "-".join(c[:2]))
def test_a_missing_store_is_reported_and_not_created(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    """A command on a store path that does not exist says 'no store at' and creates nothing."""
    url = store_url(kind, tmp_path, "typo")
    proc = cli(*command, "--store", url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    shown = proc.stdout + proc.stderr
    assert "no store at" in shown and "does not exist" in shown
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_a_dangling_symlink_is_not_followed_into_a_new_store(tmp_path: Path, kind: str) -> None:
    """A store path that is a symlink to nowhere is reported as such; its target is not made."""
    link = tmp_path / ("link.db" if kind == "sqlite" else "link")
    target = tmp_path / "nowhere"
    link.symlink_to(target)
    url = f"sqlite:///{link}" if kind == "sqlite" else f"file:{link}"
    proc = cli("runs", "list", "--store", url)
    assert proc.returncode == 1
    assert "is a symlink to a path that does not exist" in proc.stderr
    assert not target.exists() and _tree(tmp_path) == ["link.db" if kind == "sqlite" else "link"]


def test_a_directory_where_a_sqlite_file_belongs_is_refused(tmp_path: Path) -> None:
    """A SQLite path naming a directory is 'no store', not an error deep in the driver."""
    (tmp_path / "runs.db").mkdir()
    proc = cli("runs", "list", "--store", f"sqlite:///{tmp_path}/runs.db", "--json")
    assert proc.returncode == 1
    error = json.loads(proc.stdout)["error"]
    assert "is a directory, not a SQLite database file" in error["message"]
    assert _tree(tmp_path) == ["runs.db"]


def test_a_file_where_a_store_directory_belongs_is_refused(tmp_path: Path) -> None:
    """A file: path naming a regular file is 'no store', and the file is left alone."""
    (tmp_path / "runs").write_text("notes")
    proc = cli("doctor", "--store", f"file:{tmp_path}/runs")
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "is not a directory" in proc.stdout
    assert (tmp_path / "runs").read_text() == "notes"


def test_runs_start_names_the_store_it_wrote_to(tmp_path: Path) -> None:
    """runs start prints which store it used, with the password masked."""
    module = tmp_path / "ops_flows.py"
    module.write_text(
        "from stepstone import Step, Workflow\nFLOWS = [Workflow('w', [Step('a', lambda s: {})])]\n"
    )
    url = store_url("sqlite", tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        proc = cli("runs", "start", "w", "r1", "--workflows", "ops_flows:FLOWS", "--store", url)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ops_flows", None)
    assert proc.returncode == 0, proc.stderr
    assert f"in {url}" in proc.stdout and "version None" not in proc.stdout
    assert load(url, "r1").status == "queued"


@pytest.mark.slow
def test_the_worker_names_the_store_it_serves(tmp_path: Path) -> None:
    """A real `stepstone worker` process says on start which store it serves."""
    import signal

    (tmp_path / "ops_worker_flows.py").write_text(
        "from stepstone import Step, Workflow\nFLOWS = [Workflow('w', [Step('a', lambda s: {})])]\n"
    )
    url = store_url("sqlite", tmp_path)
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepstone",
            "worker",
            "--workflows",
            "ops_worker_flows:FLOWS",
            "--store",
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert f"serving w from {url}" in first, first
    finally:
        # Killed, not interrupted: what is checked is the first line. A SIGINT here once
        # left the worker running past 60 s (an idle fresh-clone run on 2026-12-06):
        # a worker's Ctrl-C is a defect of its own, to be pinned by a test of its own.
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=WAIT_TIMEOUT)


# --- 3: runs retry -------------------------------------------------------------------------

FLAKY = {"fail": True}


def charge(_state: dict[str, Any]) -> dict[str, Any]:
    """Fail while FLAKY says so, then succeed."""
    if FLAKY["fail"]:
        raise RuntimeError("card declined")
    return {"charged": True}


RETRIED = Workflow("retried", [Step("fetch", ok), Step("charge", charge)])


@contextlib.contextmanager
def serving(url: str, workflows: list[Workflow]) -> Iterator[Any]:
    """Run a Worker on ``url`` in a thread for the length of a ``with`` block."""
    store = open_store(url)
    worker = Worker(store, workflows, poll=0.02, lease=30)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        yield store
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
        assert not thread.is_alive(), "the worker did not stop"
        store.close()


def test_retry_queues_a_failed_run_that_a_worker_then_finishes(any_url: str) -> None:
    """runs retry queues a failed run again and a worker runs it to done from its checkpoint."""
    FLAKY["fail"] = True
    with serving(any_url, [RETRIED]) as store:
        stepstone.start(store, RETRIED, "o1")
        until("the run to fail", lambda: status_of(store, "o1") == "failed")
        FLAKY["fail"] = False
        version = load(any_url, "o1").version
        assert version is not None
        proc = cli("runs", "retry", "o1", "--version", version, "--store", any_url, "--json")
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert (report["run_id"], report["step"]) == ("o1", 0)
        assert report["status"] in ("queued", "running", "done")  # a worker may be quick
        until("the retried run to finish", lambda: status_of(store, "o1") == "done")
    done = load(any_url, "o1")
    assert done.state == {"ok": True, "charged": True} and done.step_names == ("fetch", "charge")


def test_retry_is_compare_and_swap_on_the_version_shown(any_url: str) -> None:
    """A --version the run is no longer at changes nothing and exits 1 saying so."""
    seed(any_url, "f1", "failed")
    before = load(any_url, "f1")
    proc = cli("runs", "retry", "f1", "--version", "not-this-one", "--store", any_url)
    assert proc.returncode == 1
    assert "ConflictError" in proc.stderr and "nothing was done" in proc.stderr
    after = load(any_url, "f1")
    assert (after.status, after.version) == ("failed", before.version)
    text = cli("runs", "retry", "f1", "--store", any_url)
    assert text.returncode == 0, text.stderr
    assert "queued run 'f1' again" in text.stdout
    assert load(any_url, "f1").status == "queued"


@pytest.mark.parametrize("status", ["queued", "waiting", "running", "done"])
def test_retry_refuses_a_run_that_is_not_failed_or_cancelled(url: str, status: str) -> None:
    """Retrying a queued, waiting, running or done run is refused and changes nothing."""
    seed(url, "r", status)
    before = load(url, "r").version
    proc = cli("runs", "retry", "r", "--store", url, "--json")
    assert proc.returncode == 1
    error = json.loads(proc.stdout)["error"]
    assert error["type"] == "RunNotActive" and f"is {status}" in error["message"]
    assert load(url, "r").version == before


def test_retry_requeues_cancelled_and_parked_runs(url: str) -> None:
    """A cancelled run and one a worker parked as WorkflowChanged are queued again."""
    seed(url, "c", "cancelled")
    seed(url, "p", "failed")
    with open_store(url) as store:
        cp = store.load("p")
        assert cp is not None and cp.failure is not None
        parked = Failure(1, "charge", WorkflowChanged.__name__, "renamed. Parked", 0, utcnow())
        store.save(evolve(cp, failure=parked))
        infos = [stepstone.retry(store, "c"), asyncio.run(stepstone.aretry(store, "p"))]
    assert [(i.run_id, i.status) for i in infos] == [("c", "queued"), ("p", "queued")]
    assert not load(url, "c").cancelled and not load(url, "c").cancel_requested


def test_retry_api_refuses_a_done_run_and_an_old_version(url: str) -> None:
    """stepstone.retry refuses a done run, a stale version, and a run no worker can run."""
    seed(url, "d", "done")
    seed(url, "f", "failed")
    with open_store(url) as store:
        with pytest.raises(RunNotActive, match="only failed"):
            stepstone.retry(store, "d")
        with pytest.raises(stepstone.ConflictError, match="changed since it was read"):
            asyncio.run(stepstone.aretry(store, "f", expected_version="stale"))
        cp = store.load("f")
        assert cp is not None and cp.status == "failed"
        with pytest.raises(stepstone.StepFailed):
            stepstone.run("direct", [Step("fetch", ok), Step("charge", boom)], store)
        with pytest.raises(RunNotActive, match=r"call run\(\) again"):
            stepstone.retry(store, "direct")


# --- 4: a repeated signal id after the run finished -----------------------------------------


def test_a_repeated_signal_id_to_a_finished_run_is_a_no_op(url: str) -> None:
    """A repeated --id exits 0 'already delivered' after the run finished; a new id is an error."""
    seed(url, "r", "queued")
    first = cli("runs", "signal", "r", "go", "--id", "hook-1", "--store", url, "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["status"] == "queued"  # not null
    with open_store(url) as store:
        cp = store.load("r")
        assert cp is not None
        store.save(evolve(cp, queued=False, step=1, step_names=("fetch", "charge")))
    again = cli("runs", "signal", "r", "go", "--id", "hook-1", "--store", url, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["delivered"] is False
    text = cli("runs", "signal", "r", "go", "--id", "hook-1", "--store", url)
    assert (text.returncode, text.stdout.startswith("already delivered")) == (0, True)
    fresh = cli("runs", "signal", "r", "go", "--id", "hook-2", "--store", url)
    assert fresh.returncode == 1 and "RunNotActive" in fresh.stderr
    with open_store(url) as store:
        assert stepstone.signal(store, "r", "go", signal_id="hook-1") is False
        assert asyncio.run(stepstone.asignal(store, "r", "go", signal_id="hook-1")) is False
        with pytest.raises(RunNotActive):
            stepstone.signal(store, "r", "go", signal_id="hook-3")


def test_runs_signal_reports_a_repeated_id(tmp_path: Path) -> None:
    """A repeated --id prints 'already delivered', exits 0 and says delivered false."""
    config = f"sqlite:///{tmp_path}/runs.db"
    flow = Workflow("w", [WaitFor("approve", "go")])
    with open_store(config) as opened:
        start(opened, flow, "r1")
    base = ("runs", "signal", "r1", "go", "--store", config, "--id", "mail-42")
    code, out, err = cli(*base, "--data", "1")
    assert (code, out.strip()) == (0, "sent signal 'go' to run 'r1' (status queued)"), err
    code, out, err = cli(*base, "--data", "2")
    assert code == 0, err
    assert out.strip() == "already delivered (id 'mail-42'): run 'r1' has it; nothing was recorded"
    code, out, err = cli(*base, "--data", "3", "--json")
    assert code == 0 and json.loads(out)["delivered"] is False, err
    code, out, err = cli("runs", "signal", "r1", "go", "--store", config, "--json")
    assert code == 0 and json.loads(out)["delivered"] is True, err
    with open_store(config) as opened:
        cp = opened.load("r1")
        assert cp is not None and [s.payload for s in cp.signals] == [1, None]
        assert asyncio.run(asignal(opened, "r1", "go", 4, signal_id="mail-42")) is False
    code, out, _ = cli("runs", "signal", "--help")
    assert code == 0 and "already delivered (id ID)" in out and "exits 0" in out


# --- 6: status and attempts that read right -------------------------------------------------


def test_show_tells_a_lost_owner_and_the_step_in_flight(url: str) -> None:
    """A running run whose lease expired reads 'owner lost', with the step in flight."""
    seed(url, "r", "running")
    with open_store(url) as store:
        cp = store.load("r")
        assert cp is not None
        store.save(
            evolve(
                cp,
                owner="host:1234",
                epoch=1,
                lease=30.0,
                renewed_at=utcnow() - timedelta(seconds=100),
                attempt=2,
            )
        )
    proc = cli("runs", "show", "r", "--store", url)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split(":", 1)[0]: line for line in proc.stdout.splitlines()}
    assert "owner lost, lease expired 1m ago: a worker will take it over" in lines["status"]
    assert "step 1" in lines["in flight"]
    assert lines["attempt"].split(":", 1)[1].strip() == "2 running"
    shown = json.loads(cli("runs", "show", "r", "--store", url, "--json").stdout)
    assert (shown["owner_lost"], shown["attempt"], shown["in_flight"]["step_index"]) == (
        True,
        2,
        1,
    )


def test_show_gives_the_failed_attempt_not_zero(url: str) -> None:
    """A failed run's attempt line is the attempt that failed, as its failure says."""
    seed(url, "f", "failed")
    proc = cli("runs", "show", "f", "--store", url)
    lines = {line.split(":", 1)[0]: line for line in proc.stdout.splitlines()}
    assert lines["attempt"].split(":", 1)[1].strip() == "1 (failed; see failure)"
    assert "in flight" not in lines


def test_list_shows_the_workflow_and_filters_by_prefix_and_kind(url: str) -> None:
    """runs list has a WORKFLOW column, --prefix keeps matching ids, --kind hides adapters."""
    seed(url, "order-1", "queued")
    seed(url, "refund-1", "done")
    with open_store(url) as store:
        store.save(Checkpoint(run_id="langgraph/thread-1/", state={}, total_steps=None))
    table = cli("runs", "list", "--store", url).stdout.splitlines()
    assert table[0].split()[:5] == ["RUN_ID", "KIND", "STATUS", "STEPS", "WORKFLOW"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["order-1"][4] == "orders" and rows["langgraph/thread-1/"][4] == "-"
    prefixed = json.loads(cli("runs", "list", "--prefix", "order", "--store", url, "--json").stdout)
    assert [(r["run_id"], r["workflow"]) for r in prefixed] == [("order-1", "orders")]
    runs_only = json.loads(cli("runs", "list", "--kind", "run", "--store", url, "--json").stdout)
    assert sorted(r["run_id"] for r in runs_only) == ["order-1", "refund-1"]
    adapters = json.loads(
        cli("runs", "list", "--kind", "langgraph", "--store", url, "--json").stdout
    )
    assert [r["run_id"] for r in adapters] == ["langgraph/thread-1/"]


# --- 8: adapters' installs -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("stepstone.adapters.langgraph", "langchain_core", "langgraph"),
        ("stepstone.adapters.agent_framework", "agent_framework", "agent-framework"),
    ],
)
def test_a_missing_framework_names_the_extra_to_install(
    module: str, blocked: str, extra: str
) -> None:
    """Importing an adapter without its framework is an ImportError naming the extra."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=WAIT_TIMEOUT,
        env={**os.environ, "PYTHONPATH": SRC},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"pip install 'stepstone[{extra}]'" in proc.stdout


def test_the_langgraph_extra_installs_langgraph() -> None:
    """The langgraph extra installs LangGraph and langchain-core, not only the checkpoint API."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    names = {req.split(">")[0].split("=")[0].split("<")[0] for req in extras["langgraph"]}
    assert {"langgraph", "langgraph-checkpoint", "langchain-core"} <= names


# --- 9: JSON errors, names and versions ------------------------------------------------------


def test_errors_under_json_are_json(url: str) -> None:
    """Under --json an operational error and a usage error are JSON objects on stdout."""
    missing = cli("runs", "show", "nope", "--store", url, "--json")
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["error"]["exit_status"] == 1
    assert missing.stderr.startswith("stepstone: error: no run 'nope'")
    usage = cli("runs", "list", "--limit", "0", "--store", url, "--json")
    assert usage.returncode == 2
    error = json.loads(usage.stdout)["error"]
    assert (error["type"], error["exit_status"]) == ("UsageError", 2)


def test_duplicate_step_names_are_refused() -> None:
    """A workflow with two steps of one name is refused with InvalidWorkflow naming it."""
    with pytest.raises(InvalidWorkflow, match="two steps are named 'charge'"):
        Workflow("w", [Step("charge", ok), Step("fetch", ok), Step("charge", ok)])


def test_messages_never_say_version_none(url: str) -> None:
    """A run of an unversioned workflow is described as unversioned, not 'version None'."""
    with open_store(url) as store:
        stepstone.start(store, FLOW, "r")
        with pytest.raises(WorkflowChanged) as caught:
            stepstone.start(store, Workflow("other", [Step("a", ok)], version="2"), "r")
    assert "version None" not in str(caught.value)
    assert "'orders' (unversioned)" in str(caught.value)
    assert "'other' version '2'" in str(caught.value)
