"""Shared test setup: print skip reasons, and make CI fail on any skipped backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# The contract suite lives in the package: have pytest rewrite its asserts so that a
# failure shows the values compared, as it does for test files.
pytest.register_assert_rewrite("stepstone.testing")

from stepstone.testing import backend_unavailable  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Under CI every backend must run: a skip of a backend becomes a failure."""
    if os.environ.get("CI") == "true":
        os.environ.setdefault("STEPSTONE_REQUIRE_BACKENDS", "1")


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """Repeat backend skips at the end, where nobody can miss them."""
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = {str(r.longrepr[2]) for r in skipped if "BACKEND UNAVAILABLE" in str(r.longrepr)}
    for reason in sorted(reasons):
        terminalreporter.write_line(f"!!! {reason}", red=True, bold=True)


@pytest.fixture(scope="session")
def emulator() -> Iterator[Any]:
    """A Cosmos emulator for the whole session: testcontainers, or a process off CI."""
    from cosmos_emulator import CosmosEmulatorError, cosmos_emulator

    try:
        with cosmos_emulator() as emu:
            yield emu
    except CosmosEmulatorError as exc:
        backend_unavailable(f"Cosmos emulator, so CosmosStore is NOT tested: {exc}")
