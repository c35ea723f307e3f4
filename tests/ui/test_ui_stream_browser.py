"""The dashboard's event tail in a real browser (issue 34): tokens arrive live, a reload resumes.

A step in this process emits a token, waits for the test, emits another; headless
Chromium on the run's page must show the first while the step still runs, the second
when it comes, and both again after a reload (the stream is read from its start).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from playwright.sync_api import expect

from stepstone import Step, StepContext, Store, run
from stepstone.ui import create_app
from ui_support import serving, wait_until

# Chromium and its Playwright driver are processes.
pytestmark = pytest.mark.process

WAIT = 30.0


def test_run_page_shows_tokens_live_and_after_a_reload(
    store: Store, store_config: str, page: Any
) -> None:
    """The run page lists each emitted event as it is flushed, and all of them after a reload."""
    release = threading.Event()

    def speak(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.emit("tokens", "hello")
        assert release.wait(WAIT), "the test never saw the first token"
        ctx.emit("tokens", "world")

    runner = threading.Thread(target=run, args=("chat", [Step("speak", speak)], store))
    runner.start()
    try:
        wait_until(lambda: store.load("chat") is not None, "the run to start")
        with serving(create_app(store_config, poll=0.2)) as url:
            page.goto(f"{url}/runs/chat")
            items = page.locator("ol.event-list li")
            expect(items).to_have_count(1)  # flushed within 100 ms, while the step waits
            expect(items.first).to_contain_text("hello")
            release.set()
            expect(items).to_have_count(2)
            expect(items.nth(1)).to_contain_text("world")
            runner.join(WAIT)
            assert not runner.is_alive(), "the run did not finish"
            page.reload()
            expect(items).to_have_count(2)
            expect(items.nth(0)).to_contain_text("[tokens] step 0: hello")
    finally:
        release.set()
        runner.join(WAIT)
