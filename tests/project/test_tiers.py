"""The test tiers (tests/tiers.py): what --tier=fast and --tier=rest select, and the guards."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

# The tiers' hooks, wired as tests/conftest.py wires them, for a suite made up here.
CONFTEST = """
import pytest
from tiers import (
    _fast_tier_guards,
    add_options,
    enforce_limit,
    modify_items,
    printable,
    suffix_groups,
    tell_worker_loadgroup,
)


def pytest_addoption(parser):
    add_options(parser)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    modify_items(config, items)
    yield
    suffix_groups(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    tell_worker_loadgroup(node)


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


# What an xdist worker of a --dist loadgroup run is told by the controller (tiers.LOADGROUP),
# beside an xdist that suffixes the ids itself (as it would once issue 1386 is fixed).
AS_A_LOADGROUP_WORKER = """
class FixedXdist:
    def pytest_collection_modifyitems(self, config, items):
        suffix_groups(config, items)


def pytest_configure(config):
    config.workerinput = {"workerid": "gw0", "stepstone_loadgroup": %r}
    config.pluginmanager.register(FixedXdist())
"""


@pytest.mark.parametrize("loadgroup", [True, False])
def test_a_loadgroup_worker_ends_grouped_ids_with_their_group(
    suite: pytest.Pytester, loadgroup: bool
) -> None:
    """On a loadgroup worker the emulator's tests' ids end with @cosmos (what xdist groups by).

    Without the suffix xdist 3.8 under pytest 9 spreads the group (pytest-xdist issue 1386);
    under any other --dist the ids are left alone.
    """
    suite.makeconftest(CONFTEST + AS_A_LOADGROUP_WORKER % loadgroup)
    result = suite.runpytest("--collect-only", "-q", "-k", "store or ttl")
    ids = [line for line in result.stdout.lines if line.startswith("test_suite.py::")]
    grouped = sorted(i for i in ids if i.endswith("@cosmos"))
    if loadgroup:
        assert grouped == [
            "test_suite.py::test_cosmos_ttl@cosmos",
            "test_suite.py::test_store[cosmos]@cosmos",
        ], ids
        # Once: a second pass (an xdist that suffixes too) does not double it.
        assert not [i for i in ids if "@cosmos@" in i], ids
    else:
        assert not grouped, ids
    assert len(ids) == 8, ids


# Grouped and ungrouped tests interleaved, each writing down which worker ran it.
GROUPED_SUITE = """
import os

import pytest

IDS = [(kind, n) for n in range(4) for kind in ("cosmos", "plain")]


@pytest.mark.parametrize(("kind", "n"), IDS, ids=[f"{k}-{n}" for k, n in IDS])
def test_store(kind, n, tmp_path_factory):
    with open(os.environ["RAN_ON"], "a") as ran_on:
        ran_on.write(f"{kind} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


@pytest.mark.process
@pytest.mark.timeout(300)
def test_a_groups_tests_share_one_worker_under_xdist_loadgroup(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On two xdist workers with --dist loadgroup, every Cosmos test runs on the same worker.

    (Its name keeps clear of the words that tie a test to a backend: it would be grouped.)
    """
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_grouped=GROUPED_SUITE)
    ran_on = pytester.path / "ran_on.txt"
    monkeypatch.setenv("RAN_ON", str(ran_on))
    # The workers import tiers.py from here, as this process does.
    tests = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, *(p for p in sys.path if p)]))
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", timeout=240
    )
    result.assert_outcomes(passed=8)
    workers: dict[str, set[str]] = {"cosmos": set(), "plain": set()}
    for line in ran_on.read_text().splitlines():
        kind, worker = line.split()
        workers[kind].add(worker)
    assert len(workers["cosmos"]) == 1, f"the Cosmos tests ran on {workers['cosmos']}"
    shown = set(re.findall(r"test_store\[cosmos-\d\]@cosmos", result.stdout.str()))
    assert len(shown) == 4, result.stdout.str()
