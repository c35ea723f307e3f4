"""The dashboard's test fixtures: stores, Debian's Chromium and a page."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store, open_store
from stepstone.testing import backend_unavailable
from ui_support import CHROMIUM, CHROMIUM_ARGS, IMG_DIR


@pytest.fixture
def sqlite_config(tmp_path: Path) -> str:
    """A fresh SQLite store."""
    return f"sqlite:///{tmp_path}/runs.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_config(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A fresh store on each backend the browser tests cover (as in test_contract.py)."""
    if request.param == "sqlite":
        # A relative path, as an operator would type it (and as the screenshots show).
        monkeypatch.chdir(tmp_path)
        return "sqlite:///runs.db"
    from fresh_stores import POSTGRES_URL, fresh_table

    return fresh_table(request, POSTGRES_URL)


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where the browser tests save the README's screenshots: a temporary directory.

    ``STEPSTONE_REFRESH_DOCS_IMAGES=1`` asks for docs/img instead, to refresh the images
    the documentation shows; otherwise a test run leaves the checkout as it found it.
    """
    if os.environ.get("STEPSTONE_REFRESH_DOCS_IMAGES") == "1":
        return IMG_DIR
    return tmp_path


@pytest.fixture
def store(store_config: str) -> Iterator[Store]:
    """The test's own handle on the store the dashboard serves."""
    with open_store(store_config) as opened:
        yield opened


# Module scope, not session: Playwright's sync API runs an asyncio loop in the main
# thread while it is open, and every later test calling asyncio.run would fail.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (its own download is unreachable)."""
    if not os.path.exists(CHROMIUM):
        backend_unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=30_000)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A fresh browser context and page; a script error on any page fails the test."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.set_default_timeout(30_000)
    try:
        yield tab
    finally:
        context.close()
    assert not errors, f"script errors in the page: {errors}"
