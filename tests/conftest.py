"""Shared test setup: the tiers (tiers.py), skip reasons printed, CI failing on skipped backends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

# The contract suite lives in the package: have pytest rewrite its asserts so that a
# failure shows the values compared, as it does for test files.
pytest.register_assert_rewrite("stepstone.testing")

from stepstone.testing import backend_unavailable  # noqa: E402

# pytester: tests/project/test_tiers.py runs made-up suites through the tiers' hooks.
pytest_plugins = ("pytester",)

from tiers import (  # noqa: E402
    WAITED,
    _fast_tier_guards,  # noqa: F401
    add_options,
    enforce_limit,
    modify_items,
    printable,
    runqueue_wait,
    suffix_groups,
    tell_worker_loadgroup,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The tier options: ``--tier``, ``--backends``, ``--fast-limit``."""
    add_options(parser)


# A wrapper: the tiers and groups are set before every other plugin's hook (xdist's
# included), the groups' id suffixes after them all (last, so an xdist that adds the
# suffix itself is seen and not doubled).
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    """Select the tier and the backends; group the emulator's and the browser's tests."""
    modify_items(config, items)
    yield
    suffix_groups(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(xdist, controller side) Tell each worker whether the run is ``--dist loadgroup``."""
    tell_worker_loadgroup(node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Note how long the call waited for a CPU (the fast tier's limit leaves that out)."""
    config = item.config
    if config.getoption("tier") != "fast" or not config.getoption("fast_limit"):
        return (yield)  # no limit to apply: no reads of every thread's schedstat
    start = runqueue_wait()
    try:
        return (yield)
    finally:
        item.stash[WAITED] = runqueue_wait() - start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Fail a fast-tier test that takes longer than the tier allows; keep reports sendable."""
    report: pytest.TestReport = yield
    enforce_limit(item, report)
    printable(report)
    return report


def pytest_configure(config: pytest.Config) -> None:
    """Under CI every backend must run: a skip of a backend becomes a failure."""
    if os.environ.get("CI") == "true":
        os.environ.setdefault("STEPSTONE_REQUIRE_BACKENDS", "1")


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """Say where the time went by file; repeat backend skips at the end, where nobody can
    miss them."""
    spent: dict[str, list[float]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                file = spent.setdefault(report.nodeid.partition("::")[0], [0.0, 0])
                file[0] += report.duration
                file[1] += report.when == "call"
    if spent:
        # --durations names single tests; a file of many quick ones is where a tier's
        # minutes often go (all its tests' setup, call and teardown, on every worker).
        total = sum(seconds for seconds, _ in spent.values())
        terminalreporter.write_sep("=", f"files by test time (all workers: {total:.0f} s)")
        for name, (seconds, count) in sorted(spent.items(), key=lambda kv: -kv[1][0])[:15]:
            terminalreporter.write_line(f"{seconds:8.1f} s {count:5d} tests  {name}")
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = {str(r.longrepr[2]) for r in skipped if "BACKEND UNAVAILABLE" in str(r.longrepr)}
    for reason in sorted(reasons):
        terminalreporter.write_line(f"!!! {reason}", red=True, bold=True)


@pytest.fixture(autouse=True)
def _no_event_loop_left_running(request: pytest.FixtureRequest) -> None:
    """Fail at once, naming the cause, when a test starts inside a leaked running loop.

    A loop left "running" in the main thread (Playwright's sync API while open, a loop
    whose run was cut) makes every later ``asyncio.run`` fail with a message that names
    none of it; hundreds of tests then fail far from the cause. The browser tests run
    inside Playwright's loop on purpose.
    """
    if "chromium" in request.fixturenames:
        return
    leaked = asyncio.events._get_running_loop()
    if leaked is not None:
        pytest.fail(
            f"an event loop ({leaked!r}) is left running in the main thread by an earlier "
            "test or fixture (Playwright's sync API open past its module?); this test "
            "cannot call asyncio.run",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def emulator() -> Iterator[Any]:
    """A Cosmos emulator for the whole session: testcontainers, or a process off CI."""
    from cosmos_emulator import CosmosEmulatorError, cosmos_emulator

    try:
        with cosmos_emulator() as emu:
            yield emu
    except CosmosEmulatorError as exc:
        backend_unavailable(f"Cosmos emulator, so CosmosStore is NOT tested: {exc}")
