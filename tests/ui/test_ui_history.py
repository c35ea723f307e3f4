"""The run page's history without a browser: saves, a diff, rerun and fork from a step.

Requests go through Starlette's ``TestClient`` to ``create_app`` on a fresh store
(memory, file, SQLite, PostgreSQL); what the pages say is checked in the HTML, what the
actions did in the store.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import stepstone
from stepstone import RetryPolicy, Step, StepFailed, Store, Workflow, open_store
from stepstone._checkpoint import evolve, utcnow
from stepstone.ui import create_app

LOOPBACK = "http://127.0.0.1"
State = dict[str, Any]

#: Whether the charge step fails (it does until a test fixes the state or this flag).
DECLINE = {"on": True}


def _fetch(state: State) -> State:
    return {"order": "A-7", "amount": 42, "note": "<script>alert(1)</script>"}


def _charge(state: State) -> State:
    if state.get("amount", 0) > 40 and DECLINE["on"]:
        raise RuntimeError("card <b>declined</b> over 40")
    return {"charged": state["amount"]}


def _receipt(state: State) -> State:
    return {"receipt": f"R-{state['charged']}"}


PAY = Workflow(
    "pay",
    [
        Step("fetch", _fetch),
        Step("charge", _charge, retry=RetryPolicy(max_attempts=1)),
        Step("receipt", _receipt),
    ],
    history=True,
)


@pytest.fixture(params=["memory", "file", "sqlite", "postgresql"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store per test (a fresh table on PostgreSQL, as test_contract.py)."""
    if request.param == "postgresql":
        from fresh_stores import POSTGRES_URL, fresh_table

        return fresh_table(request, POSTGRES_URL)
    return {
        "memory": f"memory://ui-{uuid.uuid4().hex}",
        "file": f"file://{tmp_path}/runs",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
    }[request.param]


@pytest.fixture
def store(config: str) -> Iterator[Store]:
    """The test's own handle on the store the dashboard serves."""
    with open_store(config) as opened:
        yield opened


def _failed_run(store: Store, run_id: str = "pay-1") -> None:
    """A run with history that failed at step 1 (charge) after saving step 0."""
    DECLINE["on"] = True
    with pytest.raises(StepFailed):
        stepstone.run(run_id, PAY, store)


def _client(config: str, **kwargs: Any) -> TestClient:
    return TestClient(create_app(config, **kwargs), base_url=LOOPBACK)


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def _version(page: str) -> str:
    found = re.search(r'name="version" value="([^"]*)"', page)
    assert found is not None, "no version field on the page"
    return found.group(1)


def test_run_page_lists_the_saves_and_the_failure(config: str, store: Store) -> None:
    """A run keeping history shows each save's time, attempt, size, changes and failure."""
    _failed_run(store)
    with _client(config) as client:
        page = client.get("/runs/pay-1")
    assert page.status_code == 200
    text = page.text
    saves = stepstone.history(store, "pay-1")
    assert text.count('<tr class="save ') == len(saves) >= 2
    assert "which this run does not keep" not in text
    assert 'id="history"' in text and "fetch" in text
    # The failing step and its error, escaped: stored HTML is shown as text.
    assert "step 1 (charge) failed on attempt 1: RuntimeError" in text
    assert "card &lt;b&gt;declined&lt;/b&gt; over 40" in text
    assert "<b>declined</b>" not in text
    assert f"{saves[-1].size} B" in text
    assert 'data-action="rerun"' in text and 'data-action="fork"' in text


def test_list_links_to_the_path_url_and_the_query_form_still_serves(
    config: str, store: Store
) -> None:
    """The list links ``/runs/<id>`` (a slash encoded; ``live`` and ``bulk``, the list's
    own paths, keep ``/run?id=``), and ``/run?id=`` still serves."""
    _failed_run(store, "team/pay 1")
    for run_id in ("live", "bulk"):
        stepstone.run(run_id, Workflow("plain", [Step("a", lambda s: {"a": 1})]), store)
    with _client(config) as client:
        listing = client.get("/runs").text
        assert 'href="/runs/team%2Fpay%201"' in listing
        assert 'href="/run?id=live"' in listing and 'href="/run?id=bulk"' in listing
        assert 'class="run-id">run id <code>live</code>' in client.get("/run?id=live").text
        assert 'id="history"' in client.get("/runs/team%2Fpay%201").text
        assert 'id="history"' in client.get("/run?id=team%2Fpay%201").text
        assert client.get("/runs/nobody").status_code == 404


def test_diff_between_two_saves_shows_what_changed(config: str, store: Store) -> None:
    """``?a=&b=`` shows the keys a save added or changed, values escaped."""
    _failed_run(store)
    saves = stepstone.history(store, "pay-1")
    after_fetch = next(i for i, e in enumerate(saves) if e.step == 0)
    with _client(config) as client:
        text = client.get(f"/runs/pay-1?a=0&b={after_fetch}").text
        assert f"Diff: save 0 &rarr; save {after_fetch}" in text
        assert '<tr class="d-added"><td><code>amount</code>' in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
        assert "<script>alert" not in text
        missing = client.get("/runs/pay-1?a=0&b=999").text
        assert "there is no save 999" in missing


def test_waiting_step_is_named_by_what_it_waits_for(config: str, store: Store) -> None:
    """A run waiting on a ``WaitFor`` names the step by its signal, not "(next step)"."""
    flow = Workflow(
        "approve",
        [Step("draft", lambda s: {"d": 1}), stepstone.WaitFor("approval", "approval")],
        history=True,
    )
    with pytest.raises(stepstone.Suspended):
        stepstone.run("ap-1", flow, store)
    with _client(config) as client:
        text = client.get("/runs/ap-1").text
    assert "(next step)" not in text
    assert re.search(r'<span class="sname">approval</span> <span class="skind">waiting', text)


def test_rerun_from_a_step_asks_first_then_rewinds_by_version(config: str, store: Store) -> None:
    """Rerun with a patch shows a confirmation, then rewinds the run at the version shown."""
    _failed_run(store)
    with _client(config) as client:
        page = client.get("/runs/pay-1").text
        form = {
            "csrf": _csrf(page),
            "id": "pay-1",
            "version": _version(page),
            "action": "rerun",
            "step": "1",
            "patch": '{"amount": 30}',
        }
        asked = client.post("/run/action", data=form)
        assert asked.status_code == 200 and 'data-confirm="rerun"' in asked.text
        assert store.load("pay-1").status == "failed"  # type: ignore[union-attr]
        done = client.post("/run/action", data={**form, "confirm": "yes"}, follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == "/runs/pay-1?done=rerun"
    cp = store.load("pay-1")
    assert cp is not None and cp.step == 0 and cp.failure is None and cp.state["amount"] == 30
    DECLINE["on"] = True  # the patched amount passes the charge step
    assert stepstone.run("pay-1", PAY, store)["receipt"] == "R-30"


def test_rerun_refused_when_the_run_changed(config: str, store: Store) -> None:
    """A rerun confirmed on an older version changes nothing and says the run changed."""
    _failed_run(store)
    with _client(config) as client:
        page = client.get("/runs/pay-1").text
        form = {
            "csrf": _csrf(page),
            "id": "pay-1",
            "version": _version(page),
            "action": "rerun",
            "step": "1",
            "patch": "",
            "confirm": "yes",
        }
        stepstone.signal(store, "pay-1", "note", "changed meanwhile")
        before = store.load("pay-1")
        refused = client.post("/run/action", data=form)
        assert refused.status_code == 409 and "The run changed" in refused.text
        assert before is not None
        bad = client.post("/run/action", data={**form, "version": before.version, "patch": "[1]"})
        assert bad.status_code == 400 and "JSON object" in bad.text
    after = store.load("pay-1")
    assert after is not None and before is not None and after.version == before.version


def test_fork_at_a_step_starts_a_new_run(config: str, store: Store) -> None:
    """Fork at step 0 asks first, then starts the new run there and leaves the old one."""
    _failed_run(store)
    with _client(config) as client:
        page = client.get("/runs/pay-1").text
        form = {
            "csrf": _csrf(page),
            "id": "pay-1",
            "version": _version(page),
            "action": "fork",
            "step": "0",
            "new_id": "pay-1-fork",
        }
        asked = client.post("/run/action", data=form)
        assert 'data-confirm="fork"' in asked.text and store.load("pay-1-fork") is None
        # A row's "fork here" names no run: the confirmation proposes one to edit.
        proposed = client.post("/run/action", data={**form, "new_id": ""}).text
        assert 'name="new_id" value="pay-1-fork"' in proposed
        done = client.post("/run/action", data={**form, "confirm": "yes"}, follow_redirects=False)
        assert done.headers["location"] == "/runs/pay-1-fork?done=forked"
        again = client.post("/run/action", data={**form, "confirm": "yes"})
        assert again.status_code == 400 and "already exists" in again.text
    forked = store.load("pay-1-fork")
    assert forked is not None and forked.step == 0 and forked.state["amount"] == 42
    assert store.load("pay-1").status == "failed"  # type: ignore[union-attr]


def test_read_only_shows_history_but_refuses_rerun(config: str, store: Store) -> None:
    """Under read-only the history shows, the actions do not, and a rerun post is refused."""
    _failed_run(store)
    with _client(config, read_only=True) as client:
        page = client.get("/runs/pay-1").text
        assert 'id="history"' in page and 'data-action="rerun"' not in page
        form = {"csrf": "x", "id": "pay-1", "version": "v", "action": "rerun", "step": "1"}
        refused = client.post("/run/action", data={**form, "confirm": "yes"})
        assert refused.status_code == 403
    assert store.load("pay-1").status == "failed"  # type: ignore[union-attr]


def test_run_without_history_says_so_and_offers_no_rerun(config: str, store: Store) -> None:
    """A run started without history keeps the note and offers neither rerun nor fork."""
    flow = Workflow("plain", [Step("a", lambda s: {"a": 1})])
    stepstone.run("plain-1", flow, store)
    with _client(config) as client:
        text = client.get("/runs/plain-1").text
    assert "which this run does not keep" in text
    assert 'id="history"' not in text and 'data-action="rerun"' not in text


def test_steps_not_reached_are_named_from_the_history(config: str, store: Store) -> None:
    """After a finished run is rerun from step 0, the steps not reached show their kept names."""
    DECLINE["on"] = False
    stepstone.run("pay-1", PAY, store)
    stepstone.rerun(store, "pay-1", 0)
    with _client(config) as client:
        text = client.get("/runs/pay-1").text
    for name in ("fetch", "charge", "receipt"):
        assert f'<span class="sname">{name}</span> <span class="skind">' in text
    assert "more step(s) not reached yet" not in text


def test_rerun_of_a_run_with_a_live_owner_is_refused_at_once(config: str, store: Store) -> None:
    """A rerun of a run another process owns is refused with advice, not after a lease."""
    _failed_run(store)
    failed = store.load("pay-1")
    assert failed is not None
    owned = store.save(
        evolve(failed, failure=None, owner="worker@elsewhere:1", lease=600.0, renewed_at=utcnow())
    )
    assert owned.status == "running"
    with _client(config) as client:
        page = client.get("/runs/pay-1").text
        form = {
            "csrf": _csrf(page),
            "id": "pay-1",
            "version": _version(page),
            "action": "rerun",
            "step": "1",
            "confirm": "yes",
        }
        refused = client.post("/run/action", data=form)
    assert refused.status_code == 400 and "cancel it first" in refused.text
    assert store.load("pay-1").version == owned.version  # type: ignore[union-attr]
