"""The dashboard's run page shows a run's spend, with a badge when it is over budget."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from stepstone import Budget, Step, StepContext, Suspended, open_store, run, spend_of
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


def _form(page: str, action: str) -> dict[str, str]:
    """The hidden fields of the page's form for ``action``."""
    start = page.index(f'name="action" value="{action}"')
    form = page[page.rindex("<form", 0, start) : page.index("</form>", start)]
    return dict(re.findall(r'<input type="hidden" name="([a-z]+)" value="([^"]*)"', form))


def test_the_raise_budget_button_raises_once_and_the_run_resumes(tmp_path: Path) -> None:
    """The form adds $5: the signal budget.raise, pinned to the version, sent once."""
    config = f"sqlite:///{tmp_path}/runs.db"
    steps = [Step("a", _spend), Step("b", _spend)]
    with open_store(config) as store:
        with pytest.raises(Suspended):
            run("paused", steps, store, budget=Budget(usd=2))
        run("plain", [Step("x", lambda state: None)], store)
        client = TestClient(create_app(config), base_url="http://127.0.0.1")
        assert 'value="raise_budget"' not in client.get("/run?id=plain").text  # no budget
        form = _form(client.get("/run?id=paused").text, "raise_budget")
        for bad, said in (({"usd": "-1"}, "number &gt; 0"), ({}, "give the dollars")):
            refused = client.post("/run/action", data={**form, **bad})
            assert refused.status_code == 400 and said in refused.text
        assert spend_of(store.load("paused")).limit_usd == 2.0  # type: ignore[arg-type]
        sent = client.post("/run/action", data={**form, "usd": "5"}, follow_redirects=False)
        assert sent.status_code == 303 and sent.headers["location"].endswith("done=budget")
        form["version"] = store.load("paused").version or ""  # type: ignore[union-attr]
        again = client.post("/run/action", data={**form, "usd": "5"}, follow_redirects=False)
        assert again.headers["location"].endswith("done=budget-again")
        assert spend_of(store.load("paused")).limit_usd == 7.0  # type: ignore[arg-type]
        run("paused", steps, store)
        assert store.load("paused").status == "done"  # type: ignore[union-attr]


def test_the_raise_budget_button_needs_the_csrf_token(tmp_path: Path) -> None:
    """A post without the page's token is refused; nothing is sent."""
    config = f"sqlite:///{tmp_path}/runs.db"
    with open_store(config) as store:
        with pytest.raises(Suspended):
            run("paused", [Step("a", _spend), Step("b", _spend)], store, budget=Budget(usd=2))
        client = TestClient(create_app(config), base_url="http://127.0.0.1")
        form = _form(client.get("/run?id=paused").text, "raise_budget")
        refused = client.post("/run/action", data={**form, "csrf": "forged", "usd": "5"})
        assert refused.status_code == 403
        assert spend_of(store.load("paused")).limit_usd == 2.0  # type: ignore[arg-type]
