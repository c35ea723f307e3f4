"""The test tiers (tests/tiers.py): what --tier=fast and --tier=rest select, and the guards."""

from __future__ import annotations

import pytest

# The tiers' hooks, wired as tests/conftest.py wires them, for a suite made up here.
CONFTEST = """
import pytest
from tiers import _fast_tier_guards, add_options, enforce_limit, modify_items, printable


def pytest_addoption(parser):
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    modify_items(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    enforce_limit(item, report)
    printable(report)
    return report
"""

SUITE = """
import subprocess
import time

import pytest


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite", "postgresql", "mysql", "cosmos"])
def test_store(kind):
    pass


class TestMySQLStore:
    def test_saves(self):
        pass


def test_cosmos_ttl():
    pass


@pytest.mark.process
def test_marked_spawn():
    pass


@pytest.mark.crash
def test_kill():
    pass


@pytest.mark.slow
def test_slow():
    pass


@pytest.mark.server
def test_password_on_a_server():
    pass


def test_plain():
    pass


def test_unmarked_spawn():
    subprocess.run(["true"], check=False)


def test_sleepy():
    time.sleep(0.3)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A made-up suite with one test of each kind the tiers sort."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_the_fast_tier_runs_in_process_tests_on_memory_file_and_sqlite(
    suite: pytest.Pytester,
) -> None:
    """--tier=fast deselects server backends, marked tests, and fails an unmarked spawn."""
    result = suite.runpytest("--tier=fast", "--fast-limit=0", "-p", "no:cacheprovider")
    # Kept: store[memory|file|sqlite], plain, sleepy, unmarked_spawn (which fails).
    result.assert_outcomes(passed=5, failed=1, errors=1, deselected=9)
    result.stdout.fnmatch_lines(["*test_unmarked_spawn spawns a process*@pytest.mark.process*"])


def test_the_rest_is_exactly_what_the_fast_tier_leaves_out(suite: pytest.Pytester) -> None:
    """--tier=rest selects the servers', the marked and the named-backend tests, nothing else."""
    result = suite.runpytest("--tier=rest", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9, deselected=6)


def test_a_fast_test_over_the_limit_fails_asking_to_be_marked_slow(
    suite: pytest.Pytester,
) -> None:
    """Under --tier=fast a call longer than --fast-limit fails, naming the test and the marker."""
    result = suite.runpytest("--tier=fast", "--fast-limit=0.1", "-k", "sleepy")
    result.assert_outcomes(failed=1, deselected=14)
    result.stdout.fnmatch_lines(["*test_sleepy took * over the fast tier's 0.1 s*slow*"])


def test_backends_deselects_the_other_backends_in_any_tier(suite: pytest.Pytester) -> None:
    """--backends=sqlite,postgresql keeps those backends' tests and the backend-free ones."""
    result = suite.runpytest("--backends=sqlite,postgresql", "-k", "store or saves or ttl")
    result.assert_outcomes(passed=2, deselected=13)
