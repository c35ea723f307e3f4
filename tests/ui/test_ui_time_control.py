"""The dashboard's time control (issue 33): the schedules page and a run's deadline."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import stepstone
from stepstone import Step, Store, Workflow, open_store, start
from stepstone.ui import create_app

LOOPBACK = "http://127.0.0.1"
FLOW = Workflow("digest", [Step("send", lambda s: {})])


@pytest.fixture(params=["memory", "sqlite"])
def local(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh local store."""
    if request.param == "memory":
        return f"memory://ui-{uuid.uuid4().hex}"
    return f"sqlite:///{tmp_path}/runs.db"


@pytest.fixture
def store(local: str) -> Iterator[Store]:
    """The test's own handle on the store."""
    with open_store(local) as opened:
        yield opened


def _client(config: str) -> TestClient:
    return TestClient(create_app(config), base_url=LOOPBACK)


def test_schedules_page_lists_every_schedule_escaped(local: str, store: Store) -> None:
    """/schedules shows each schedule's cron, zone, workflow and next slot; empty says so."""
    with _client(local) as client:
        empty = client.get("/schedules")
        assert empty.status_code == 200 and "No schedules" in empty.text
        stepstone.schedule(store, "nightly", cron="0 7 * * *", tz="Europe/Berlin", workflow=FLOW)
        stepstone.schedule(
            store, "hourly", cron="0 * * * *", workflow=FLOW, paused=True, input={"x": "<b>"}
        )
        page = client.get("/schedules")
    assert page.status_code == 200
    assert "nightly" in page.text and "Europe/Berlin" in page.text and "0 7 * * *" in page.text
    assert "paused" in page.text and "<b>" not in page.text
    assert 'href="/schedules"' in page.text  # linked from every page's header


def test_run_page_shows_the_deadline(local: str, store: Store) -> None:
    """A run started with a deadline shows it on its page."""
    start(store, FLOW, "r1", deadline=timedelta(minutes=5))
    with _client(local) as client:
        page = client.get("/runs/r1")
    assert page.status_code == 200
    assert "Deadline" in page.text and "300s from the first claim, then fail" in page.text
