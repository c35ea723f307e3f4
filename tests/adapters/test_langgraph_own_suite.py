"""LangGraph's own graph tests, run on StepstoneSaver beside LangGraph's InMemorySaver.

The ``langgraph`` sdist on PyPI ships its ``tests/``. This module fetches the sdist of
the installed version (``pip download --no-binary :all:``, cached in pytest's cache
directory), unpacks its tests, puts ``langgraph_suite_conftest.py`` in place of their
conftest (theirs needs Docker services and more saver packages) and runs the files
below in a pytest subprocess, each test once per checkpointer: ``memory`` (LangGraph's
``InMemorySaver``), ``stepstone_memory`` and ``stepstone_sqlite``. Tests that take no
checkpointer are left out. Every test that passes on ``InMemorySaver`` must pass on
both of ours, apart from ``EXPECTED_DIFFERENCES``.

Numbers at langgraph 1.2.24 (tests that take a checkpointer, each run once per
checkpointer; passed on each of ours / on InMemorySaver): before the saver followed
what its writer read, 614 / 646 (32 differences, all a write refused as a concurrent
writer's: a subgraph's replay and resume, resuming or replaying a checkpoint the thread
had moved past, forks by invoke under ``durability="exit"``); now 646 / 646, no
expected differences, the timing-sensitive tests (``TIMING_SENSITIVE``). About four
minutes on two busy cores.

Without the network or the test dependencies (``syrupy``, ``pytest-mock``: the ``dev``
group), the test is skipped loudly; under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections import defaultdict
from importlib import metadata, util
from pathlib import Path
from typing import NoReturn

import pytest

# LangGraph's test files about interrupts, time travel, subgraphs, Send and state
# history (test_pregel*.py hold the Send and state-history tests), forks and replays of
# delta channels, and every other file whose tests take a checkpointer.
SUITE_FILES = [
    "test_time_travel.py",
    "test_time_travel_async.py",
    "test_interrupt_state.py",
    "test_interruption.py",
    "test_strict_resume.py",
    "test_subgraph_persistence.py",
    "test_subgraph_persistence_async.py",
    "test_pregel.py",
    "test_pregel_async.py",
    "test_large_cases.py",
    "test_large_cases_async.py",
    "test_checkpoint_migration.py",
    "test_delta_channel_exit_mode.py",
    "test_delta_channel_fork.py",
    "test_delta_channel_parallel_order.py",
    "test_delta_channel_subgraph.py",
    "test_delta_channel_to_plain.py",
    "test_delta_channel_update_state.py",
    "test_pydantic.py",
]
OURS = ("stepstone_memory", "stepstone_sqlite")
# Tests (ids with the checkpointer replaced by "CP") that pass on InMemorySaver and are
# known not to on ours, each with why. Kept short; an entry that starts passing fails
# the test, so the list cannot go stale.
EXPECTED_DIFFERENCES: dict[str, str] = {}
# Tests whose outcome races a short sleep against the saver's write: they pass or fail
# on any saver slower than InMemorySaver's dict, by machine load. Either outcome is
# accepted; they still run, so an error other than the race shows in the output.
TIMING_SENSITIVE = {
    # mapper(1) sleeps 10 ms and expects submapper(0)'s streamed output to come first.
    "tests/test_pregel_async.py::test_imp_nested",
    # Wall-clock: the node's first chunk must arrive within ~0.05 s of the call (after the
    # input checkpoint's save), which a loaded 2-core machine misses on any saver.
    "tests/test_pregel.py::test_stream_buffering_single_node",
    "tests/test_pregel_async.py::test_stream_buffering_single_node",
}
# The whole run, generously: a few minutes on two busy cores.
SUITE_TIMEOUT = 1200.0


def _unavailable(reason: str) -> NoReturn:
    """Skip loudly, or fail under CI, where LangGraph's own tests must run."""
    message = f"LANGGRAPH'S OWN TESTS NOT RUN on StepstoneSaver: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: they must run)")
    pytest.skip(message)


def _suite_dir(request: pytest.FixtureRequest, version: str) -> Path:
    """The unpacked ``tests/`` of langgraph ``version``'s sdist, fetched once and cached."""
    cache = getattr(request.config, "cache", None)
    root = (
        Path(cache.mkdir("langgraph-sdist"))
        if cache is not None
        else request.getfixturevalue("tmp_path_factory").mktemp("langgraph-sdist")
    )
    suite = root / f"langgraph-{version}"
    if not (suite / "tests" / "__init__.py").exists():
        download = root / "download"
        pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check"]
        # Offline, pip's default retries would take minutes to give up.
        pip += ["--retries", "1", "--timeout", "30", "--no-binary", ":all:", "--no-deps"]
        try:
            fetched = subprocess.run(
                [*pip, f"langgraph=={version}", "-d", str(download)],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        except subprocess.TimeoutExpired:
            _unavailable(f"pip download of the langgraph {version} sdist took over 600 s")
        sdists = sorted(download.glob(f"langgraph-{version}.tar.gz"))
        if fetched.returncode != 0 or not sdists:
            _unavailable(
                f"pip download of the langgraph {version} sdist failed: "
                f"{fetched.stderr.strip()[-500:]}"
            )
        partial = root / f"partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(sdists[0]) as sdist:
            members = [m for m in sdist.getmembers() if m.name.split("/")[1:2] == ["tests"]]
            # The "data" filter refuses links and paths that leave the directory.
            sdist.extractall(partial, members=members, filter="data")
        shutil.rmtree(suite, ignore_errors=True)
        (partial / f"langgraph-{version}").rename(suite)
        shutil.rmtree(partial, ignore_errors=True)
    # Ours, always fresh: their conftest needs Docker services and other saver packages.
    shutil.copy(
        Path(__file__).with_name("langgraph_suite_conftest.py"), suite / "tests" / "conftest.py"
    )
    return suite


def _outcomes(report: Path) -> dict[str, dict[str, str]]:
    """``{test id with "CP" for the checkpointer: {checkpointer: outcome}}``."""
    outcomes: dict[str, dict[str, str]] = defaultdict(dict)
    for line in report.read_text().splitlines():
        entry = json.loads(line)
        saver = entry["checkpointer"]
        if saver is None:
            continue
        test = re.sub(rf"\b{re.escape(saver)}\b", "CP", entry["nodeid"], count=1)
        if outcomes[test].get(saver) in (None, "passed"):
            outcomes[test][saver] = entry["outcome"]
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(900)  # LangGraph's own 19 files, twice over: 3-4 min on 2 cores
def test_langgraph_own_graph_tests_pass_on_our_saver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Every LangGraph graph test that passes on InMemorySaver passes on StepstoneSaver."""
    missing = [name for name in ("syrupy", "pytest_mock") if util.find_spec(name) is None]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed (pip install --group dev)")
    version = metadata.version("langgraph")
    suite = _suite_dir(request, version)
    report = tmp_path / "report.jsonl"
    env = {
        **os.environ,
        "STEPSTONE_LG_REPORT": str(report),
        "STEPSTONE_LG_SAVER_TESTS_ONLY": "1",
        # What this process imports (our src, the test dependencies), the child too.
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "--rootdir", str(suite)]
    command += ["-p", "no:cacheprovider", "-p", "no:playwright", "-p", "no:randomly"]
    command += [f"tests/{name}" for name in SUITE_FILES]
    try:
        run = subprocess.run(
            command,
            cwd=suite,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT,
            check=False,  # the report, not the exit code, says what differs
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"LangGraph's own tests did not finish in {SUITE_TIMEOUT} s")
    tail = "\n".join(run.stdout.splitlines()[-40:])
    assert report.exists(), f"the suite reported nothing; its output ends:\n{tail}"
    outcomes = _outcomes(report)
    reference = {t for t, by in outcomes.items() if by.get("memory") == "passed"}
    assert len(reference) > 500, f"too few tests ran on InMemorySaver ({len(reference)}):\n{tail}"
    reference = {t for t in reference if t.split("[")[0] not in TIMING_SENSITIVE}
    differences = {
        test: by
        for test in reference
        if any((by := outcomes[test]).get(o) != "passed" for o in OURS)
    }
    unexpected = {t: by for t, by in differences.items() if t not in EXPECTED_DIFFERENCES}
    assert not unexpected, (
        f"{len(unexpected)} of LangGraph's tests pass on InMemorySaver and not on ours: "
        f"{json.dumps(unexpected, indent=1, sort_keys=True)}\nthe suite's output ends:\n{tail}"
    )
    stale = sorted(set(EXPECTED_DIFFERENCES) - set(differences))
    assert not stale, f"expected differences that no longer differ (remove them): {stale}"
    passed = {o: sum(by.get(o) == "passed" for by in outcomes.values()) for o in (*OURS, "memory")}
    print(f"LangGraph {version}'s tests passed, per checkpointer: {passed}")
