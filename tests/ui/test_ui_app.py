"""The dashboard's server without a browser: safety checks, paging, errors, the command.

Requests go through Starlette's ``TestClient`` (httpx) to ``create_app`` on a fresh
store; what the pages say is checked in the HTML, what the actions did in the store.
"""

from __future__ import annotations

import importlib.resources
import re
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import stepstone
from stepstone import Checkpoint, Store, open_store, start
from stepstone.cli import main
from stepstone.ui import create_app
from stepstone.ui._views import display_name, timeline, visible
from ui_support import APPROVAL, PAYMENT, wait_until

LOOPBACK = "http://127.0.0.1"


@pytest.fixture(params=["memory", "file", "sqlite", "postgresql", "mysql"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store per test (a fresh table on the SQL servers, as test_contract.py)."""
    if request.param in ("postgresql", "mysql"):
        from fresh_stores import SERVERS, fresh_table

        server = SERVERS
        return fresh_table(request, server[request.param])
    return {
        "memory": f"memory://ui-{uuid.uuid4().hex}",
        "file": f"file://{tmp_path}/runs",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
    }[request.param]


@pytest.fixture(params=["memory", "sqlite"])
def local(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh local store, for checks that do not depend on the backend."""
    if request.param == "memory":
        return f"memory://ui-{uuid.uuid4().hex}"
    return f"sqlite:///{tmp_path}/runs.db"


@pytest.fixture
def local_store(local: str) -> Iterator[Store]:
    """The test's own handle on the local store."""
    with open_store(local) as opened:
        yield opened


@pytest.fixture
def store(config: str) -> Iterator[Store]:
    """The test's own handle on the store."""
    with open_store(config) as opened:
        yield opened


def _client(config: str, **options: object) -> TestClient:
    return TestClient(create_app(config, **options), base_url=LOOPBACK)  # type: ignore[arg-type]


def _form(html: str) -> dict[str, str]:
    """Return the hidden fields of the first action form of a run page."""
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html)[:4])


def _waiting(store: Store, run_id: str) -> None:
    start(store, APPROVAL, run_id)
    with pytest.raises(stepstone.Suspended):
        stepstone.run(run_id, APPROVAL, store)


def test_only_loopback_host_names_are_answered_without_a_token(local: str) -> None:
    """A DNS-rebinding page (Host: evil.example) gets nothing from a loopback dashboard."""
    with _client(local) as client:
        assert client.get("/runs").status_code == 200
        assert client.get("/runs", headers={"host": "localhost:8080"}).status_code == 200
        refused = client.get("/runs", headers={"host": "evil.example"})
        assert refused.status_code == 421
        assert "Unknown host" in refused.text
        assert (
            client.get("/static/htmx.min.js", headers={"host": "evil.example"}).status_code == 421
        )


def test_a_token_is_checked_on_every_request(local: str) -> None:
    """With a token, a request without it (page, live part, asset, post) is refused."""
    token = "a-token-of-enough-length"
    with _client(local, token=token) as client:
        for path in ("/runs", "/run?id=x", "/runs/live", "/static/style.css"):
            assert client.get(path).status_code == 401, path
        assert client.post("/run/action", data={"action": "cancel"}).status_code == 401
        bearer = {"authorization": f"Bearer {token}"}
        assert client.get("/runs", headers=bearer).status_code == 200
        login = client.get(f"/runs?token={token}", follow_redirects=False)
        assert login.status_code == 303 and "token" not in login.headers["location"]
        assert token not in login.headers["set-cookie"], "the cookie holds the raw token"
        assert client.get("/runs").status_code == 200, "the cookie did not carry the token"


def test_writes_need_the_csrf_token_and_the_same_origin(local: str, local_store: Store) -> None:
    """A post without the page's CSRF token, or from another site, changes nothing."""
    store = local_store
    _waiting(store, "r1")
    with _client(local) as client:
        fields = _form(client.get("/run?id=r1").text)
        assert fields["action"] == "signal" or "csrf" in fields
        csrf, version = fields["csrf"], fields["version"]
        base = {"id": "r1", "version": version, "action": "cancel"}
        assert client.post("/run/action", data=base).status_code == 403
        assert client.post("/run/action", data={**base, "csrf": "forged"}).status_code == 403
        cross = {"origin": "http://evil.example"}
        assert (
            client.post("/run/action", data={**base, "csrf": csrf}, headers=cross).status_code
            == 403
        )
        site = {"sec-fetch-site": "cross-site"}
        assert (
            client.post("/run/action", data={**base, "csrf": csrf}, headers=site).status_code == 403
        )
        assert store.load("r1").status == "waiting"  # type: ignore[union-attr]
        done = client.post("/run/action", data={**base, "csrf": csrf}, follow_redirects=False)
        assert done.status_code == 303
    assert store.load("r1").status == "cancelled"  # type: ignore[union-attr]


def test_read_only_shows_no_action_and_refuses_posts(local: str, local_store: Store) -> None:
    """--read-only: no forms on the pages, and a forged post is refused."""
    store = local_store
    _waiting(store, "r1")
    with _client(local, read_only=True) as client:
        page = client.get("/run?id=r1").text
        assert '<form method="post"' not in page and "read-only" in page
        version = store.load("r1").version  # type: ignore[union-attr]
        refused = client.post(
            "/run/action", data={"id": "r1", "version": version or "", "action": "cancel"}
        )
        assert refused.status_code == 403
        bulk = client.post("/runs/bulk", data={"action": "cancel", "status": "waiting"})
        assert bulk.status_code == 403
    assert store.load("r1").status == "waiting"  # type: ignore[union-attr]


@pytest.mark.server
def test_a_store_error_is_a_message_and_the_server_keeps_serving(tmp_path: Path) -> None:
    """A store that cannot be reached gives a 503 page with the error, no traceback, no secret."""
    config = "postgresql://ops:s3cretpassw0rd@127.0.0.1:1/nowhere?connect_timeout=1"
    with _client(config) as client:
        for _ in range(2):  # and again: the failure is not cached, nothing is stuck
            page = client.get("/runs")
            assert page.status_code == 503
            assert "The store failed" in page.text or "could not be used" in page.text
            assert "Traceback" not in page.text and "s3cretpassw0rd" not in page.text
        assert "***" in page.text, "the store URL is not shown redacted"
        assert client.get("/static/style.css").status_code == 200


def test_paging_walks_every_run_once_newest_first(config: str, store: Store) -> None:
    """Pages of 7 over 30 runs: each run on exactly one page, in updated_at order."""
    for i in range(30):
        store.save(Checkpoint(run_id=f"p-{i:02d}", total_steps=1))
    seen: list[str] = []
    with _client(config, page_size=7) as client:
        url: str | None = "/runs"
        while url is not None:
            html = client.get(url).text
            seen += re.findall(r'data-run-id="([^"]+)"', html)
            found = re.search(r'<a href="([^"]+)" rel="next">', html)
            url = None if found is None else found[1].replace("&amp;", "&")
    assert sorted(seen) == [f"p-{i:02d}" for i in range(30)], "a run was shown twice or never"
    infos = {i.run_id: i for i in store.list_info()}
    keys = [(infos[r].updated_at, r) for r in seen]
    assert keys == sorted(keys, reverse=True)


def test_counts_status_filter_and_prefix(config: str, store: Store) -> None:
    """The counts and the status filter agree with the store; the prefix narrows both."""
    _waiting(store, "order-1")
    _waiting(store, "order-2")
    start(store, APPROVAL, "other-1")
    with _client(config) as client:
        page = client.get("/runs?status=waiting").text
        assert set(re.findall(r'data-run-id="([^"]+)"', page)) == {"order-1", "order-2"}
        assert re.search(r'data-status="queued">queued <b>1</b>', page)
        narrowed = client.get("/runs?q=other").text
        assert re.findall(r'data-run-id="([^"]+)"', narrowed) == ["other-1"]
        assert re.search(r'data-status="waiting">waiting <b>0</b>', narrowed)


def test_the_live_query_answers_204_until_the_run_changes(config: str, store: Store) -> None:
    """The live part is re-sent only when the version differs from the page's."""
    _waiting(store, "r1")
    version = store.load("r1").version  # type: ignore[union-attr]
    with _client(config) as client:
        assert client.get(f"/run/live?id=r1&v={version}").status_code == 204
        stepstone.signal(store, "r1", "approval", {"ok": True})
        changed = client.get(f"/run/live?id=r1&v={version}")
        assert changed.status_code == 200 and "approval" in changed.text
        digest = re.search(r'hx-get="/runs/live\?v=([0-9a-f]+)"', client.get("/runs").text)
        assert digest is not None
        assert client.get(f"/runs/live?v={digest[1]}").status_code == 204
        store.delete("r1")
        assert client.get(f"/runs/live?v={digest[1]}").status_code == 200


def test_bulk_refuses_a_count_that_changed_since_the_confirmation(
    config: str, store: Store
) -> None:
    """Confirming "cancel 2" when 3 match now cancels nothing and asks again."""
    _waiting(store, "w-1")
    _waiting(store, "w-2")
    with _client(config) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/run?id=w-1").text)
        assert csrf is not None
        form = {"csrf": csrf[1], "action": "cancel", "status": "waiting", "q": ""}
        ask = client.post("/runs/bulk", data=form)
        assert 'class="bulk-count">2<' in ask.text
        _waiting(store, "w-3")
        stale = client.post("/runs/bulk", data={**form, "confirm": "2"})
        assert stale.status_code == 409 and "3 match now" in stale.text
        assert {store.load(f"w-{i}").status for i in (1, 2, 3)} == {"waiting"}  # type: ignore[union-attr]
        done = client.post("/runs/bulk", data={**form, "confirm": "3"})
        assert "Cancelled 3 run(s)" in done.text
    assert {store.load(f"w-{i}").status for i in (1, 2, 3)} == {"cancelled"}  # type: ignore[union-attr]


def test_retry_is_offered_only_for_failed_runs_a_worker_can_run(
    local: str, local_store: Store
) -> None:
    """A failed run of a Workflow gets a Retry button; a bare step list's run is refused."""
    store = local_store
    import ui_support

    ui_support.FAIL_TIMES["left"] = 2
    start(store, PAYMENT, "queued-then-failed")
    with pytest.raises(stepstone.StepFailed):
        stepstone.run("queued-then-failed", PAYMENT, store)
    with pytest.raises(stepstone.StepFailed):
        stepstone.run("direct", [stepstone.Step("s", ui_support.flaky)], store)
    with _client(local) as client:
        assert 'data-action="retry"' in client.get("/run?id=queued-then-failed").text
        page = client.get("/run?id=direct").text
        assert 'data-action="retry"' not in page
        fields = _form(page)
        refused = client.post("/run/action", data={**fields, "id": "direct", "action": "retry"})
        assert refused.status_code == 409 and "call run() again" in refused.text
    assert store.load("direct").status == "failed"  # type: ignore[union-attr]


def test_adapter_records_get_their_kind_and_short_name() -> None:
    """Ids the framework adapters write are named by kind; other ids are left whole."""
    lg = "langgraph/chat%2F42/"
    assert display_name(lg + "/1ef") == ("LangGraph checkpoint", "chat/42 / (root namespace) / 1ef")
    assert display_name(lg) == ("LangGraph thread", "chat/42 / (root namespace)")
    assert display_name(lg + "/1ef/writes")[0] == "LangGraph pending writes"
    assert display_name("maf/review/ck%201") == ("Agent Framework checkpoint", "review / ck 1")
    assert display_name("order-7/agent/pydantic-ai-journal") == (
        "pydantic-ai journal",
        "order-7/agent",
    )
    assert display_name("langgraph:t-1") == ("LangGraph", "t-1")
    assert display_name("openai-agents:session:chat-1") == (
        "OpenAI Agents session",
        "session:chat-1",
    )
    assert display_name("openai-agents:r/agent/k1") == ("OpenAI Agents journal", "r/agent/k1")
    for plain in ("order:42", "langgraph", "langgraph/", "mafia/1", "/pydantic-ai-journal"):
        assert display_name(plain) == (None, plain)


def test_visible_escapes_controls_and_cuts_long_text() -> None:
    """Terminal escapes and bidi overrides are shown escaped; a long text says it was cut."""
    assert visible("a\x1b[31m\u202eb\nc") == "a\\x1b[31m\\u202eb\nc"
    shown = visible("y" * 50, limit=10)
    assert shown.startswith("y" * 10) and "40 more characters" in shown


def test_timeline_from_a_failed_checkpoint() -> None:
    """Completed steps, the failed one with its error, and the count not reached."""
    from datetime import UTC, datetime

    failure = stepstone.Failure(1, "charge", "RuntimeError", "503", 3, datetime.now(UTC))
    cp = Checkpoint(run_id="r", step=0, step_names=("fetch",), total_steps=4, failure=failure)
    rows = timeline(cp, datetime.now(UTC))
    assert [(r.index, r.name, r.kind) for r in rows] == [
        (0, "fetch", "done"),
        (1, "charge", "failed"),
        (2, "", "not reached"),
    ]
    assert "attempt 3" in rows[1].detail and "RuntimeError" in rows[1].detail


def test_templates_and_assets_ship_inside_the_package() -> None:
    """The wheel's package data: templates and the vendored htmx load via importlib.resources."""
    root = importlib.resources.files("stepstone.ui")
    for name in ("base.html", "runs.html", "run.html", "_run_live.html", "confirm.html"):
        assert (root / "templates" / name).is_file(), name
    htmx = (root / "static" / "htmx.min.js").read_text()
    assert htmx.startswith("var htmx=") and len(htmx) > 40_000
    assert (root / "static" / "htmx.LICENSE").read_text().startswith("Zero-Clause BSD")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    # hatch ships every file under a listed package directory, .py or not, unless a
    # build setting excludes or narrows it.
    build = pyproject["tool"]["hatch"]["build"]
    wheel = build["targets"]["wheel"]
    assert wheel["packages"] == ["src/stepstone"]
    for settings in (build, wheel):
        assert not {"exclude", "only-include", "only-packages"} & set(settings), settings


def test_the_command_refuses_a_public_address_without_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stepstone ui --host 0.0.0.0 without a token exits 2 and says why."""
    monkeypatch.delenv("STEPSTONE_UI_TOKEN", raising=False)
    assert main(["ui", "--store", "memory://x", "--host", "0.0.0.0"]) == 2
    assert "needs a token" in capsys.readouterr().err
    assert main(["ui", "--store", "memory://x", "--host", "0.0.0.0", "--token", "short"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err


def test_the_demo_leaves_runs_for_the_dashboard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """demo --approval --manual leaves a waiting and a failed run and names the ui command."""
    import json

    config = f"sqlite:///{tmp_path}/demo.db"
    assert main(["demo", "--approval", "--manual", "--json", "--store", config]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ui"].endswith(f"ui --store {config}")
    with open_store(config) as store:
        assert store.load(report["run_id"]).status == "waiting"  # type: ignore[union-attr]
        assert store.load(report["failed_run_id"]).status == "failed"  # type: ignore[union-attr]
    with _client(config) as client:
        page = client.get("/runs").text
        assert 'data-status="waiting">waiting <b>1</b>' in page
        assert 'data-status="failed">failed <b>1</b>' in page


def test_the_prefix_is_literal_and_case_sensitive(config: str, store: Store) -> None:
    """A prefix holding LIKE wildcards matches only itself, case and all."""
    for run_id in ("a_b-1", "axb-1", "A_b-2", "a%b-3", "a!_b-4"):
        store.save(Checkpoint(run_id=run_id, total_steps=0))  # done: no steps to run
    assert [i.run_id for i in store.list_page(prefix="a_b")] == ["a_b-1"]
    assert [i.run_id for i in store.list_page(prefix="a%")] == ["a%b-3"]
    assert [i.run_id for i in store.list_page(prefix="a!_")] == ["a!_b-4"]
    assert store.count_by_status("A_")["done"] == 1
    assert store.count_by_status()["done"] == 5
    assert len(store.list_page("done", prefix="a", limit=2)) == 2
    assert store.list_page("waiting") == []


def test_version_of_is_the_stored_version(config: str, store: Store) -> None:
    """The live pages' cheap look agrees with load, and says None for a missing run."""
    saved = store.save(Checkpoint(run_id="v-1", total_steps=2))
    assert store.version_of("v-1") == saved.version
    assert store.version_of("missing") is None
    with _client(config) as client:
        assert client.get("/run?id=").status_code == 400
        assert client.get("/run/live?id=missing&v=x").status_code == 200


def test_adapter_records_are_listed_by_kind(local: str, local_store: Store) -> None:
    """A LangGraph checkpoint record is listed and shown as one, its id decoded."""
    local_store.save(Checkpoint(run_id="langgraph/t%201//c1", total_steps=0, workflow="langgraph"))
    with _client(local) as client:
        listed = client.get("/runs").text
        assert '<span class="kind">LangGraph checkpoint</span>' in listed
        assert "t 1 / (root namespace) / c1</a>" in listed
        shown = client.get("/run?id=langgraph/t%25201//c1").text
        assert "<code>langgraph/t%201//c1</code>" in shown


@pytest.mark.process
def test_the_command_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    """A real `stepstone ui` process serves the pages with a token, never printing it."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    import httpx

    with socket.socket() as probe:  # a free port for the child (bound again at once)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = "cli-token-0123456789abcdef"
    config = f"sqlite:///{tmp_path}/cli.db"
    open_store(config).close()  # `ui` reads a store; it never creates one
    env = {**os.environ, "STEPSTONE_UI_TOKEN": token}
    argv = [sys.executable, "-m", "stepstone", "ui", "--store", config, "--port", str(port)]
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert f"at http://127.0.0.1:{port}/" in first, first
        url = f"http://127.0.0.1:{port}/runs"

        def answers() -> bool:
            assert child.poll() is None, "stepstone ui exited before serving"
            try:
                httpx.get(url, timeout=5)
            except httpx.ConnectError:
                return False  # the line is printed just before uvicorn binds
            return True

        wait_until(answers, "stepstone ui to accept connections")
        refused = httpx.get(url, timeout=5)
        assert refused.status_code == 401
        shown = httpx.get(url, headers={"authorization": f"Bearer {token}"}, timeout=5)
        assert shown.status_code == 200 and "No runs yet." in shown.text
    finally:
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert token not in first + out + err


def test_a_signal_form_is_pinned_and_sent_once(config: str, store: Store) -> None:
    """A signal from a stale page is refused; the same form sent twice delivers it once."""
    _waiting(store, "s-1")
    with _client(config) as client:
        page = client.get("/run?id=s-1").text
        sid = re.search(r'name="sid" value="([0-9a-f]+)"', page)
        assert sid is not None
        form = {**_form(page), "name": "approval", "payload": '{"ok": true}', "sid": sid[1]}
        stepstone.signal(store, "s-1", "note", None)  # the run moves on behind the page
        stale = client.post("/run/action", data=form)
        assert stale.status_code == 409 and "The run changed" in stale.text
        assert [s.name for s in store.load("s-1").signals] == ["note"]  # type: ignore[union-attr]
        form["version"] = store.load("s-1").version or ""  # type: ignore[union-attr]
        sent = client.post("/run/action", data=form, follow_redirects=False)
        assert sent.headers["location"].endswith("done=signal")
        bad = client.post("/run/action", data={**form, "payload": "{not json"})
        assert bad.status_code in (400, 409)
        form["version"] = store.load("s-1").version or ""  # type: ignore[union-attr]
        again = client.post("/run/action", data=form, follow_redirects=False)
        assert again.headers["location"].endswith("done=signal-again")
    assert [s.name for s in store.load("s-1").signals] == ["note", "approval"]  # type: ignore[union-attr]


def test_a_store_error_in_a_live_poll_is_a_banner_that_keeps_polling(
    local: str, local_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll that meets a store error shows it in place and polls on, re-rendering later."""
    _waiting(local_store, "r1")
    app = create_app(local)
    with TestClient(app, base_url=LOOPBACK) as client:
        assert client.get("/runs").status_code == 200
        served = app.state.dashboard.store()

        def down(*args: object, **kwargs: object) -> None:
            raise stepstone.StoreUnavailable("the database went away")

        monkeypatch.setattr(served, "count_by_status", down)
        monkeypatch.setattr(served, "version_of", down)
        for path in ("/runs/live?v=abc", "/run/live?id=r1&v=abc"):
            live = client.get(path)
            assert live.status_code == 200 and "the database went away" in live.text
            assert 'hx-trigger="every' in live.text and "v=error" in live.text
        monkeypatch.undo()
        assert 'data-run-id="r1"' in client.get("/runs/live?v=error").text
