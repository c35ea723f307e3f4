"""Streams served (issue 34): the SSE endpoint, the dashboard's tail, ``runs tail``, retention.

The endpoint is driven through Starlette's ``TestClient`` on memory and SQLite stores;
the command through ``stepstone.cli.main`` with its output captured.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from fresh_stores import fresh_config
from stepstone import Step, StepContext, open_store, run, stream
from stepstone._stream._events import block_id, block_record
from stepstone.cli import main
from stepstone.testing import FakeClock
from stepstone.ui import create_app, stream_endpoint


def talk(state: dict[str, Any], ctx: StepContext) -> None:
    for i in range(3):
        ctx.emit("tokens", f"t{i}")
    ctx.emit("progress", {"pct": 100})


@pytest.fixture(params=["memory", "sqlite"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store with one finished, streaming run ``r``."""
    if request.param == "memory":
        config = f"memory://sse-{uuid.uuid4().hex}"
    else:
        config = f"sqlite:///{tmp_path / 'runs.db'}"
    return config


def _messages(body: str) -> list[dict[str, str]]:
    out = []
    for chunk in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if fields:
            out.append(fields)
    return out


def test_sse_endpoint_in_a_users_app_resumes_after_last_event_id(config: str) -> None:
    """A user's Starlette route serves the stream; Last-Event-ID resumes after that event."""
    with open_store(config) as store:
        run("r", [Step("talk", talk)], store)
        app = Starlette(routes=[Route("/runs/{run_id:path}/events", stream_endpoint(store))])
        with TestClient(app) as client:
            whole = client.get("/runs/r/events")
            assert whole.headers["content-type"].startswith("text/event-stream")
            messages = [m for m in _messages(whole.text) if "id" in m]
            data = [json.loads(m["data"])["data"] for m in messages]
            assert data == ["t0", "t1", "t2", {"pct": 100}]
            assert _messages(whole.text)[-1]["event"] == "end"
            rest = client.get("/runs/r/events", headers={"Last-Event-ID": messages[1]["id"]})
            assert [json.loads(m["data"])["data"] for m in _messages(rest.text) if "id" in m] == [
                "t2",
                {"pct": 100},
            ]
            topic = client.get("/runs/r/events?topic=progress")
            assert len([m for m in _messages(topic.text) if "id" in m]) == 1
            assert client.get("/runs/missing/events").status_code == 404
            assert client.get("/runs/r/events?after=x").status_code == 400


def test_dashboard_mounts_the_stream_and_the_run_page_tails_it(config: str) -> None:
    """``stepstone ui`` serves /run/stream, and the run page points its tail at it."""
    with open_store(config) as store:
        run("r", [Step("talk", talk)], store)
        app = create_app(config)
        if config.startswith("memory"):
            app.state.dashboard._store = store  # the same in-process store
        with TestClient(app, base_url="http://127.0.0.1") as client:
            page = client.get("/runs/r")
            assert 'data-stream="/run/stream?run_id=r"' in page.text
            assert "/static/stream.js" in page.text
            body = client.get("/run/stream?run_id=r").text
            assert len([m for m in _messages(body) if "id" in m]) == 4
            assert client.get("/static/stream.js").status_code == 200


def test_runs_tail_prints_events_and_json_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runs tail`` prints each event; --json one object a line; --topic filters."""
    config = f"sqlite:///{tmp_path / 'runs.db'}"
    with open_store(config) as store:
        run("r", [Step("talk", talk)], store)
    assert main(["runs", "tail", "r", "--store", config]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "0.0 [tokens] step 0: t0"
    assert lines[-1] == '0.3 [progress] step 0: {"pct": 100}'
    assert main(["runs", "tail", "r", "--store", config, "--json", "--topic", "tokens"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["data"] for row in rows] == ["t0", "t1", "t2"]
    assert main(["runs", "tail", "r", "--store", config, "--after", "0.2"]) == 0
    assert capsys.readouterr().out.splitlines() == ['0.3 [progress] step 0: {"pct": 100}']


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_runs_list_hides_blocks_and_delete_removes_them(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Blocks stay out of ``runs list`` (unless --kind stream); ``runs delete`` removes them."""
    config = fresh_config(kind, request, tmp_path)
    with open_store(config) as store:
        run("r", [Step("talk", talk)], store)
    assert main(["runs", "list", "--store", config, "--json"]) == 0
    assert [row["run_id"] for row in json.loads(capsys.readouterr().out)] == ["r"]
    assert main(["runs", "list", "--store", config, "--json", "--kind", "stream"]) == 0
    assert [row["run_id"] for row in json.loads(capsys.readouterr().out)] == ["stream:r/0"]
    assert main(["runs", "delete", "r", "--store", config]) == 0
    with open_store(config) as store:
        assert store.load(block_id("r", 0)) is None


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_prune_deletes_streams_with_their_runs_only(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``prune`` deletes a finished run's stream with it, and never a block on its own."""
    config = fresh_config(kind, request, tmp_path)
    with open_store(config) as store:
        run("old", [Step("talk", talk)], store)
        # The stream of a run still starting (no record yet): its block must stay.
        store.save(block_record("active", 0, 0, [["0", 1, "token000000", 0, "t", "1"]]))
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert main(["runs", "prune", "--store", config, "--older-than", later]) == 0
    assert "deleted 1 run" in capsys.readouterr().out
    with open_store(config) as store:
        assert store.load("old") is None
        assert store.load(block_id("old", 0)) is None
        assert store.load(block_id("active", 0)) is not None


def test_prune_deletes_the_streams_of_runs_gone_a_day(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream whose run is gone (a ttl took the run only) goes with ``prune`` once a day
    old; a younger one may be a run's still starting, and stays."""
    config = fresh_config("sqlite", request, tmp_path)
    with FakeClock(datetime(2026, 12, 1, tzinfo=UTC)) as clock:
        with open_store(config) as store:
            run("gone", [Step("talk", talk)], store)
            assert store.delete("gone")  # the run alone, as its ttl would
            clock.advance(timedelta(days=2))
            store.save(block_record("starting", 0, 0, [["0", 1, "token000000", 0, "t", "1"]]))
        later = (clock.now() + timedelta(hours=1)).isoformat()
        args = ["runs", "prune", "--store", config, "--older-than", later, "--json"]
        assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["orphaned_streams_deleted"] == 1
    with open_store(config) as store:
        assert store.load(block_id("gone", 0)) is None
        assert store.load(block_id("starting", 0)) is not None


def test_migrate_copies_streams(tmp_path: Path) -> None:
    """``migrate`` copies a run's stream with it: the copy reads the same events."""
    from stepstone._migrate import migrate

    with (
        open_store(f"sqlite:///{tmp_path / 'a.db'}") as src,
        open_store(f"file://{tmp_path / 'b'}") as dst,
    ):
        run("r", [Step("talk", talk)], src)
        report = migrate(src, dst)
        assert report.failed == 0 and report.conflicts == 0
        assert list(stream(dst, "r")) == list(stream(src, "r"))
        assert len(list(stream(dst, "r"))) == 4
