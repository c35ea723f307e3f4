"""The runs list costs what its rows show: no run is loaded, no state read from pieces.

A row shows a run's status, progress, workflow and what it waits for; every backend's
``list_page`` reports those from the run's metadata. These tests render the list (and
its live re-render) with runs whose states are kept in pieces, counting the loads and
the state assemblies made meanwhile: both must stay at zero, whatever the state's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fresh_stores import BACKENDS, fresh_config
from stepstone import Checkpoint, Store, _statelog, open_store
from stepstone.ui import create_app

#: Past ``_statelog.INLINE_MAX``: the state is kept in pieces.
_BIG = 4 * _statelog.INLINE_MAX


@pytest.fixture(params=BACKENDS)
def config(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh store's config on each backend, holding three runs with large states."""
    config = fresh_config(str(request.param), request, tmp_path)
    with open_store(config) as store:
        for i in range(3):
            store.save(
                Checkpoint(
                    f"big-{i}",
                    state={"blob": "x" * _BIG, "n": i},
                    total_steps=3,
                    workflow="refund-approval",
                    workflow_version="7",
                    waiting_for=f"signal approval-{i}",
                )
            )
        store.save(Checkpoint("small", total_steps=2, workflow="payment"))
        yield config


class _Reads:
    """Counts the loads of a store class and the states assembled from pieces."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store_class: type[Store]) -> None:
        self.loads = 0
        self.assembled = 0
        monkeypatch.setattr(store_class, "load", self._counting(store_class.load, "loads"))
        for name in ("assemble", "checkpoint_with_pieces"):
            monkeypatch.setattr(
                _statelog, name, self._counting(getattr(_statelog, name), "assembled")
            )

    def _counting(self, call: Callable[..., Any], counter: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            setattr(self, counter, getattr(self, counter) + 1)
            return call(*args, **kwargs)

        return counted


def test_the_runs_list_loads_no_run_and_reads_no_state(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rendering the runs list and its live part loads no run and assembles no state,
    and still shows each row's workflow, version and what it waits for."""
    with open_store(config) as probe:
        store_class = type(probe)
    app = create_app(config)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        reads = _Reads(monkeypatch, store_class)
        page = client.get("/runs")
        live = client.get("/runs/live?v=stale")
        waiting = client.get("/runs?status=waiting")
    assert page.status_code == live.status_code == waiting.status_code == 200
    assert (reads.loads, reads.assembled) == (0, 0), "the list read the runs' states"
    for body in (page.text, live.text, waiting.text):
        assert "refund-approval" in body
        assert "v7" in body
        for i in range(3):
            assert f"signal approval-{i}" in body
    assert "payment" in page.text
    assert "payment" not in waiting.text
