"""The run page of a code workflow's run (issue 31): its journaled calls, and rerun or
fork at one of them, through Starlette's ``TestClient`` on memory and SQLite stores.
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
from stepstone import Store, Suspended, open_store
from stepstone.ui import create_app

LOOPBACK = "http://127.0.0.1"
State = dict[str, Any]


@stepstone.workflow("ui-loop")
def loop(ctx: Any, input: State) -> Any:
    """A draft, two revisions, then a wait."""
    ctx.step("draft", str.lower, "<b>d</b>")
    for i in range(2):
        ctx.step("revise", str.upper, f"r{i}")
    return ctx.wait_for("go")


@pytest.fixture(params=["memory", "sqlite"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store per test."""
    if request.param == "memory":
        return f"memory://ui-code-{uuid.uuid4().hex}"
    return f"sqlite:///{tmp_path}/runs.db"


@pytest.fixture
def store(config: str) -> Iterator[Store]:
    """The test's own handle on the store the dashboard serves, holding waiting run ``c``."""
    with open_store(config) as opened:
        with pytest.raises(Suspended):
            stepstone.run("c", loop, opened)
        yield opened


def _field(page: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found is not None, f"no {name} field on the page"
    return found.group(1)


def test_run_page_lists_the_calls(config: str, store: Store) -> None:
    """The page has a Calls table: one row per journaled call, with rerun and fork buttons."""
    with TestClient(create_app(config), base_url=LOOPBACK) as client:
        page = client.get("/runs/c").text
    assert re.findall(r'data-call="([^"]+)"', page) == ["draft#1", "revise#1", "revise#2"]
    assert 'data-rerun-call="revise#1"' in page and 'data-fork-call="draft#1"' in page
    assert "<b>d</b>" not in page  # the state is shown escaped


def test_rerun_and_fork_at_a_call_ask_first_then_act(config: str, store: Store) -> None:
    """Rerun from ``revise#2`` and fork at ``draft#1`` each confirm, then cut the journal."""
    with TestClient(create_app(config), base_url=LOOPBACK) as client:
        page = client.get("/runs/c").text
        form = {
            "csrf": _field(page, "csrf"),
            "id": "c",
            "version": _field(page, "version"),
            "action": "rerun",
            "step": "revise#2",
            "patch": "",
        }
        asked = client.post("/run/action", data=form)
        assert asked.status_code == 200 and "from call revise#2?" in asked.text
        done = client.post("/run/action", data={**form, "confirm": "yes"}, follow_redirects=False)
        assert done.status_code == 303, done.text
        rewound = store.load("c")
        assert rewound is not None
        fork = {**form, "action": "fork", "step": "draft#1", "new_id": "c2", "confirm": "yes"}
        fork["version"] = rewound.version or ""
        forked = client.post("/run/action", data=fork, follow_redirects=False)
        assert forked.headers["location"] == "/runs/c2?done=forked", forked.text
    assert [e.call for e in stepstone.journal(store, "c")] == ["draft#1", "revise#1"]
    assert [e.call for e in stepstone.journal(store, "c2")] == ["draft#1"]


def test_read_only_lists_the_calls_without_rerun_or_fork(config: str, store: Store) -> None:
    """Under read-only the Calls table shows, its rerun and fork buttons do not."""
    with TestClient(create_app(config, read_only=True), base_url=LOOPBACK) as client:
        page = client.get("/runs/c").text
    assert 'data-call="revise#2"' in page
    assert "data-rerun-call" not in page and "data-fork-call" not in page
