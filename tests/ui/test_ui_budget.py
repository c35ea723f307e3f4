"""The dashboard's run page shows a run's spend, with a badge when it is over budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from stepstone import Budget, Step, StepContext, Suspended, open_store, run
from stepstone.ui import create_app


def _spend(state: dict[str, Any], ctx: StepContext) -> None:
    ctx.charge(usd=3, tokens=5, ref=f"resp-{ctx.run_id}-{ctx.step_name}")


def test_the_run_page_shows_spend_and_the_over_budget_badge(tmp_path: Path) -> None:
    """A paused run's page says its spend and 'over budget'; a run without a ledger says none."""
    config = f"sqlite:///{tmp_path}/runs.db"
    with open_store(config) as store:
        with pytest.raises(Suspended):
            run("paused", [Step("a", _spend), Step("b", _spend)], store, budget=Budget(usd=2))
        run("plain", [Step("x", lambda state: None)], store)
    client = TestClient(create_app(config), base_url="http://127.0.0.1")
    page = client.get("/run?id=paused").text
    assert "$3 of $2, 5 tokens, OVER BUDGET" in page and "over budget</span>" in page
    assert "budget.raise" in page  # the signal form is filled in to raise it
    assert 'id="spend"' not in client.get("/run?id=plain").text
