"""The run page's history in headless Chromium: the saves, a diff, a rerun from a step.

Served with uvicorn on a fresh store (SQLite and PostgreSQL, the ``store_config``
fixture); screenshots go to the test's temporary directory, never into the checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

import stepstone
from stepstone import RetryPolicy, Step, StepFailed, Store, Workflow
from stepstone.ui import create_app
from ui_support import serving

State = dict[str, Any]


def _fetch(state: State) -> State:
    return {"order": "A-7", "amount": 42}


def _charge(state: State) -> State:
    if state["amount"] > 40:
        raise RuntimeError("card <b>declined</b> over 40")
    return {"charged": state["amount"]}


PAY = Workflow(
    "pay-history",
    [
        Step("fetch", _fetch),
        Step("charge", _charge, retry=RetryPolicy(max_attempts=1)),
        Step("receipt", lambda s: {"receipt": f"R-{s['charged']}"}),
    ],
    history=True,
)


def test_history_diff_and_rerun_from_a_step(
    store: Store, store_config: str, page: Any, tmp_path: Path
) -> None:
    """An operator sees a failed run's saves and a diff, then reruns it with a patch."""
    with pytest.raises(StepFailed):
        stepstone.run("pay-1", PAY, store)
    saves = stepstone.history(store, "pay-1")
    after_fetch = next(i for i, e in enumerate(saves) if e.step == 0)
    with serving(create_app(store_config, poll=0.2)) as url:
        page.goto(f"{url}/runs")
        page.locator("tr.run td.id a").click()
        assert page.url == f"{url}/runs/pay-1"
        expect(page.locator("tr.save")).to_have_count(len(saves))
        expect(page.locator(".save-failure")).to_contain_text(
            "step 1 (charge) failed on attempt 1: RuntimeError: card <b>declined</b> over 40"
        )
        page.locator(f"tr.save[data-save='{after_fetch}'] a.diff-link").click()
        expect(page.locator("#diff h2")).to_have_text(
            f"Diff: save {after_fetch - 1} \u2192 save {after_fetch}"
        )
        expect(page.locator("#diff tr.d-added", has_text="amount")).to_contain_text("42")
        page.screenshot(path=str(tmp_path / "run-history.png"), full_page=True)

        # The newest save of each step offers a rerun after it (from step 0 and from
        # step 1); the patch is typed on the confirmation page.
        expect(page.locator("[data-rerun-from]")).to_have_count(2)
        page.locator(f"tr.save[data-save='{len(saves) - 1}'] [data-rerun-from='1']").click()
        expect(page.locator("h1")).to_have_text("Rerun pay-1 from step 1?")
        page.locator("#confirm-patch").fill('{"amount": 30}')
        assert store.load("pay-1").status == "failed", "rerun before it was confirmed"  # type: ignore[union-attr]
        page.locator("[data-confirm=rerun]").click()
        expect(page.locator(".message.ok")).to_contain_text("Rewound the run")
        assert page.url == f"{url}/runs/pay-1?done=rerun"
        expect(page.locator("#run-state")).to_contain_text('"amount": 30')
    cp = store.load("pay-1")
    assert cp is not None and cp.step == 0 and cp.failure is None
    assert stepstone.run("pay-1", PAY, store)["receipt"] == "R-30"
