"""The dashboard's limits page (issue 37): each key, its holders and waiters; no records in runs."""

from __future__ import annotations

import contextlib
from pathlib import Path

from starlette.testclient import TestClient

from stepstone import Limit, Step, Suspended, open_store, run, set_limit
from stepstone.ui import create_app

LOOPBACK = "http://127.0.0.1"


def test_limits_page_shows_holders_and_waiters(tmp_path: Path) -> None:
    """/limits lists each key with who holds it and who waits; /runs leaves the records out."""
    config = f"sqlite:///{tmp_path}/runs.db"
    pages: dict[str, str] = {}
    with open_store(config) as store:
        set_limit(store, Limit("gpu", concurrency=1, rpm=60))

        def hold(state: dict[str, object]) -> None:
            with contextlib.suppress(Suspended):
                run("waiter", [Step("w", lambda s: None, limits=["gpu"])], store)
            with TestClient(create_app(config), base_url=LOOPBACK) as client:
                pages["limits"] = client.get("/limits").text
                pages["runs"] = client.get("/runs").text

        run("holder", [Step("h", hold, limits=["gpu"])], store)
    limits = pages["limits"]
    assert "gpu" in limits and "concurrency 1, 60 requests/60s, queue" in limits
    assert 'href="/runs/holder"' in limits and 'href="/runs/waiter"' in limits
    assert "~limit/" not in pages["runs"] and "waiter" in pages["runs"]
    # Two runs (the holder, running; the waiter); the limit record is not counted.
    assert 'data-status="any">all <b>2</b>' in pages["runs"]
