"""The dashboard end to end: headless Chromium clicking through a served app.

Each test serves ``stepstone.ui.create_app`` with uvicorn on a fresh store (SQLite and
PostgreSQL), with a real ``Worker`` in this process where runs must move, and checks
what an operator sees and what the store then holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

import stepstone
from stepstone import Store, start
from stepstone.ui import create_app
from ui_support import (
    APPROVAL,
    FAIL_TIMES,
    PAYMENT,
    serving,
    wait_until,
    working,
)
from waiting import status_of

# Chromium and its Playwright driver are processes.
pytestmark = pytest.mark.process

TOKEN = "t0ken-for-the-browser-test-0123456789"


def _seed(store: Store) -> None:
    """A waiting approval, a failed payment, a finished approval, a queued one."""
    FAIL_TIMES["left"] = 1
    start(store, APPROVAL, "refund-1042", {"customer": "Ana", "amount": 42.5})
    start(store, PAYMENT, "payment-7", {"order": "A-7"})
    with working(store):
        wait_until(lambda: status_of(store, "refund-1042") == "waiting", "refund-1042 to wait")
        wait_until(lambda: status_of(store, "payment-7") == "failed", "payment-7 to fail")
        start(store, APPROVAL, "refund-1041", {"customer": "Bo", "amount": 10})
        wait_until(lambda: status_of(store, "refund-1041") == "waiting", "refund-1041 to wait")
        stepstone.signal(store, "refund-1041", "approval", {"ok": True})
        wait_until(lambda: status_of(store, "refund-1041") == "done", "refund-1041 to finish")


def test_approve_a_waiting_run_and_watch_it_finish_live(
    store: Store, store_config: str, page: Any, screenshots: Path
) -> None:
    """Filtering to waiting runs, opening one and approving it finishes it without a reload."""
    _seed(store)
    with serving(create_app(store_config, poll=0.2)) as url, working(store):
        page.goto(f"{url}/runs")
        expect(page.locator(".counts [data-status=waiting] b")).to_have_text("1")
        expect(page.locator(".counts [data-status=failed] b")).to_have_text("1")
        if store_config.startswith("sqlite"):
            page.screenshot(path=str(screenshots / "runs.png"), full_page=True)
        page.locator(".counts [data-status=waiting]").click()
        expect(page.locator("tr.run")).to_have_count(1)
        # A run that starts waiting now appears in the filtered list by itself.
        page.evaluate("window.__sameDocument = true")
        start(store, APPROVAL, "refund-1043")
        expect(page.locator("tr.run")).to_have_count(2)
        expect(page.locator(".counts [data-status=waiting] b")).to_have_text("2")
        assert page.evaluate("window.__sameDocument") is True, "the list reloaded"
        page.locator("tr.run[data-run-id=refund-1043]").wait_for()
        page.locator("tr.run[data-run-id=refund-1042] td.id a").click()
        expect(page.locator("#run-status")).to_have_text("waiting")
        expect(page.locator("#waiting-for")).to_contain_text("signal approval")
        expect(page.locator("#run-input")).to_contain_text('"customer": "Ana"')
        if store_config.startswith("sqlite"):
            page.screenshot(path=str(screenshots / "run.png"), full_page=True)
        page.locator("#signal-payload").fill('{"ok": true, "by": "lead"}')
        # The run changes while the operator types: the page follows, the text stays.
        before = page.locator("#run-live").get_attribute("data-version")
        stepstone.signal(store, "refund-1042", "note", "seen by the lead")
        expect(page.locator("#run-live")).not_to_have_attribute("data-version", before or "")
        expect(page.locator(".signals tr.pending")).to_have_count(1)
        expect(page.locator("#signal-payload")).to_have_value('{"ok": true, "by": "lead"}')
        page.locator("[data-action=signal]").click()
        expect(page.locator(".message.ok")).to_have_text("Signal sent.")
        page.evaluate("window.__sameDocument = true")
        # The worker resumes the run; the page's live part shows it finish by itself.
        expect(page.locator("#run-status")).to_have_text("done")
        assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
        expect(page.locator("#run-state")).to_contain_text('"sent": true')
        expect(page.locator(".signals tr.consumed")).to_have_count(1)
        expect(page.locator(".signals tr.pending")).to_have_count(1)  # the note: no WaitFor
    cp = store.load("refund-1042")
    assert cp is not None and cp.status == "done" and cp.state["approval"]["by"] == "lead"
    assert status_of(store, "refund-1043") == "waiting"


def test_cancel_retry_and_bulk_cancel(store: Store, store_config: str, page: Any) -> None:
    """Cancel stops a waiting run, retry finishes a failed one, bulk cancel asks first."""
    _seed(store)
    for i in range(3):
        start(store, APPROVAL, f"bulk-{i}")
    with serving(create_app(store_config, poll=0.2)) as url, working(store):
        wait_until(
            lambda: all(status_of(store, f"bulk-{i}") == "waiting" for i in range(3)),
            "the bulk runs to wait",
        )
        page.goto(f"{url}/run?id=refund-1042")
        page.locator("[data-action=cancel]").click()
        expect(page.locator(".message.ok")).to_have_text("Cancelled the run.")
        expect(page.locator("#run-status")).to_have_text("cancelled")
        assert status_of(store, "refund-1042") == "cancelled"

        page.goto(f"{url}/runs?status=failed")
        page.locator("tr.run td.id a").click()
        expect(page.locator(".failure .error-text")).to_contain_text(
            "the payment service answered 503 <b>Service Unavailable</b>"
        )
        page.locator("[data-action=retry]").click()
        expect(page.locator(".message.ok")).to_contain_text("Queued the run again")
        expect(page.locator("#run-status")).to_have_text("done")
        assert status_of(store, "payment-7") == "done"

        page.goto(f"{url}/runs?status=waiting")
        expect(page.locator("tr.run")).to_have_count(3)
        page.locator("[data-bulk=cancel]").click()
        expect(page.locator(".bulk-count")).to_have_text("3")
        page.locator("[data-confirm=cancel]").click()
        expect(page.locator(".message.ok .text")).to_have_text("Cancelled 3 run(s).")
    assert [status_of(store, f"bulk-{i}") for i in range(3)] == ["cancelled"] * 3


def test_a_stale_action_is_refused(store: Store, store_config: str, page: Any) -> None:
    """An action on a version the run has left writes nothing and says the run changed."""
    _seed(store)
    with serving(create_app(store_config, poll=0.2)) as url:
        # Hold the page's live updates back, and change the run behind its back.
        page.route("**/run/live**", lambda route: route.abort())
        page.goto(f"{url}/run?id=refund-1042")
        shown = page.locator("#run-live").get_attribute("data-version")
        stepstone.signal(store, "refund-1042", "note", {"from": "elsewhere"})
        cp = store.load("refund-1042")
        assert cp is not None and cp.version != shown
        page.locator("[data-action=cancel]").click()
        expect(page.locator(".message.error h2")).to_have_text("The run changed")
        assert status_of(store, "refund-1042") == "waiting", "a stale cancel was applied"
        # The refusal shows the run as it is now; acting on that version works.
        expect(page.locator("#run-live")).to_have_attribute("data-version", cp.version or "")
        page.locator("[data-action=cancel]").click()
        expect(page.locator(".message.ok")).to_have_text("Cancelled the run.")
    assert status_of(store, "refund-1042") == "cancelled"


HOSTILE = "<script>window.__xss=1</script>\"'><img src=x onerror=window.__xss=1>&amp;"


def test_hostile_stored_text_is_inert(store: Store, store_config: str, page: Any) -> None:
    """Stored markup, attribute breakers, controls and a 1 MB string are shown as text."""
    run_id = f"evil-{HOSTILE}/?#%"
    big = "x" * 1_000_000
    start(
        store,
        APPROVAL,
        run_id,
        {"html": HOSTILE, "controls": "\x1b[31mred\u202etxt\x9b", "big": big},
    )
    bad = stepstone.Workflow("bad", [stepstone.Step("explode", _explode)])
    with pytest.raises(stepstone.StepFailed):
        stepstone.run(f"fail-{HOSTILE}", bad, store)
    with working(store):
        wait_until(lambda: status_of(store, run_id) == "waiting", "the hostile run to wait")
    stepstone.signal(store, run_id, "approval", {"note": HOSTILE}, signal_id=HOSTILE)
    with serving(create_app(store_config)) as url:
        page.goto(f"{url}/runs")
        expect(page.locator("tr.run")).to_have_count(2)
        ids = page.evaluate("[...document.querySelectorAll('tr.run')].map(r => r.dataset.runId)")
        assert run_id in ids, "the attribute did not keep the id as stored"
        page.get_by_role("link", name=f"evil-{HOSTILE}/?#%").click()
        expect(page.locator(".run-id code")).to_have_text(run_id)
        expect(page.locator("#run-state")).to_contain_text("<script>window.__xss=1</script>")
        expect(page.locator("#run-state")).to_contain_text("\\u001b[31mred\\u202etxt\\x9b")
        expect(page.locator("#run-state")).to_contain_text("more characters not shown")
        expect(page.locator(".signals")).to_contain_text(HOSTILE)
        page.goto(f"{url}/runs?status=failed")
        page.locator("tr.run td.id a").click()
        expect(page.locator(".failure .error-text")).to_have_text(f"boom {HOSTILE}")
        assert page.evaluate("typeof window.__xss") == "undefined", "stored script ran"
        assert page.locator("img").count() == 0, "stored markup became an element"


def _explode(state: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"boom {HOSTILE}")


def test_the_token_is_enforced_off_loopback(sqlite_config: str, page: Any) -> None:
    """Served on 127.0.0.2 with a token, pages need it; the cookie from ?token= carries it."""
    with stepstone.open_store(sqlite_config) as store:
        start(store, APPROVAL, "refund-1")
    with serving(create_app(sqlite_config, token=TOKEN), host="127.0.0.2") as url:
        response = page.goto(f"{url}/runs")
        assert response is not None and response.status == 401
        expect(page.locator("h1")).to_have_text("Token required")
        assert "refund-1" not in page.content()
        response = page.goto(f"{url}/static/htmx.min.js")
        assert response is not None and response.status == 401, "a static file was served"
        response = page.goto(f"{url}/runs?token=wrong-{TOKEN}")
        assert response is not None and response.status == 401
        page.goto(f"{url}/runs?token={TOKEN}")
        assert "token" not in page.url, "the token stayed in the address bar"
        expect(page.locator("tr.run td.id a")).to_have_text("refund-1")
        page.locator("tr.run td.id a").click()
        expect(page.locator("#run-status")).to_have_text("queued")
        page.locator("[data-action=cancel]").click()
        expect(page.locator(".message.ok")).to_have_text("Cancelled the run.")
