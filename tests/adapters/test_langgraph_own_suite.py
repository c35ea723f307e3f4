"""LangGraph's own graph tests, run on StepstoneSaver beside LangGraph's InMemorySaver.

The ``langgraph`` sdist on PyPI ships its ``tests/``. This module fetches the sdist of
the installed version (``pip download --no-binary :all:``, cached in pytest's cache
directory), unpacks its tests, puts ``langgraph_suite_conftest.py`` in place of their
conftest (theirs needs Docker services and more saver packages) and runs the files
below in a pytest subprocess, each test once on each of ours (``stepstone_memory``,
``stepstone_sqlite``); a test that does not pass on one of them runs again, in a second
subprocess, on LangGraph's ``InMemorySaver`` (``memory``), the reference. Tests that take
no checkpointer are left out. Every test that passes on ``InMemorySaver`` must pass on
both of ours, apart from ``EXPECTED_DIFFERENCES``. (Until 2026-12-07 every test ran on all
three savers: the reference's third of the time bought nothing when ours all pass.)

Numbers at langgraph 1.2.24 (tests that take a checkpointer, each run once per
checkpointer; passed on each of ours / on InMemorySaver): before the saver followed
what its writer read, 614 / 646 (32 differences, all a write refused as a concurrent
writer's: a subgraph's replay and resume, resuming or replaying a checkpoint the thread
had moved past, forks by invoke under ``durability="exit"``); now 646 / 646, no
expected differences, the timing-sensitive tests (``TIMING_SENSITIVE``). In four shards
(``SHARDS``), each its own test and its own pytest subprocess, so that xdist spreads them
over its workers. On all three savers the shards took 492 s of a loaded CI run's worker
time (2026-12-07, two CPU hogs beside it); on ours, with the reference only for what
failed, 197 s one after the other in one process on the same loaded machine.

Without the network or the test dependencies (``syrupy``, ``pytest-mock``: the ``dev``
group), the test is skipped loudly; under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import NoReturn

import pytest

# LangGraph's test files about interrupts, time travel, subgraphs, Send and state
# history (test_pregel*.py hold the Send and state-history tests), forks and replays of
# delta channels, and every other file whose tests take a checkpointer, in shards balanced
# by time, a file's sync and async variants apart: each shard's files with the number of
# its tests (ids with "CP" for the checkpointer) that must pass on InMemorySaver, about
# 80% of what passed at langgraph 1.2.24 (so that a suite which stopped collecting shows).
# Measured there, on the three savers, on a busy 2-core machine: seconds; passed.
SHARDS: dict[str, tuple[int, list[str]]] = {
    # 114 s; 126.
    "pregel_async": (100, ["test_pregel_async.py"]),
    # 58 + 10 s; 124 + 43.
    "pregel_sync": (130, ["test_pregel.py", "test_time_travel_async.py"]),
    # 38 + 13 s; 111 + 9 + 17 + 16 + 3 + 3 + 1.
    "forks": (
        125,
        [
            "test_delta_channel_fork.py",
            "test_large_cases_async.py",
            "test_subgraph_persistence_async.py",
            "test_interruption.py",
            "test_delta_channel_to_plain.py",
            "test_delta_channel_update_state.py",
            "test_pydantic.py",
        ],
    ),
    # 13 + 10 + 18 s; 18 + 51 + 25 + 8 + 21 + 29 + 17 + 19 + 5.
    "time_travel": (
        150,
        [
            "test_large_cases.py",
            "test_time_travel.py",
            "test_delta_channel_subgraph.py",
            "test_checkpoint_migration.py",
            "test_delta_channel_exit_mode.py",
            "test_interrupt_state.py",
            "test_subgraph_persistence.py",
            "test_strict_resume.py",
            "test_delta_channel_parallel_order.py",
        ],
    ),
}
SUITE_FILES = [name for _, files in SHARDS.values() for name in files]
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
# A shard's run, generously: two minutes at most on two busy cores.
SHARD_TIMEOUT = 480.0


def _unavailable(reason: str) -> NoReturn:
    """Skip loudly, or fail under CI, where LangGraph's own tests must run."""
    message = f"LANGGRAPH'S OWN TESTS NOT RUN on StepstoneSaver: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: they must run)")
    pytest.skip(message)


def _suite_dir(request: pytest.FixtureRequest, version: str) -> Path:
    """The unpacked ``tests/`` of langgraph ``version``'s sdist, fetched once and cached.

    Two xdist workers (two shards) may fetch it at once: each downloads and unpacks into a
    directory of its own and renames that into place; the loser of the rename keeps the
    winner's copy, which is complete (a rename is atomic) and may be in use already.
    """
    cache = getattr(request.config, "cache", None)
    root = (
        Path(cache.mkdir("langgraph-sdist"))
        if cache is not None
        else request.getfixturevalue("tmp_path_factory").mktemp("langgraph-sdist")
    )
    suite = root / f"langgraph-{version}"
    if not (suite / "tests" / "__init__.py").exists():
        download = root / f"download-{os.getpid()}"
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
        shutil.rmtree(download, ignore_errors=True)
        if suite.exists() and not (suite / "tests" / "__init__.py").exists():
            # A broken copy (renamed aside first: another worker may be doing the same).
            with contextlib.suppress(OSError):
                suite.rename(partial / "broken")
        try:
            (partial / f"langgraph-{version}").rename(suite)
        except OSError:
            # Another worker's copy is in place (a rename onto a directory that is not
            # empty fails): keep it, as that worker may be running tests in it already.
            if not (suite / "tests" / "__init__.py").exists():
                raise
        shutil.rmtree(partial, ignore_errors=True)
    # Ours, always fresh: their conftest needs Docker services and other saver packages.
    # Replaced whole (never rewritten in place) only when it differs: another shard's
    # pytest may be importing it.
    ours = Path(__file__).with_name("langgraph_suite_conftest.py").read_bytes()
    conftest = suite / "tests" / "conftest.py"
    if not conftest.exists() or conftest.read_bytes() != ours:
        fresh = conftest.with_name(f"conftest-{os.getpid()}.tmp")
        fresh.write_bytes(ours)
        fresh.replace(conftest)
    return suite


@dataclass
class _SuiteRun:
    """One pytest subprocess over LangGraph's files: what each test did on each saver."""

    # {test id with "CP" for the checkpointer: {checkpointer: outcome}}; a test's first
    # phase that did not pass (setup, call, teardown) is its outcome.
    outcomes: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    # {test id with "CP": the node ids it ran as}, to run the same tests on another saver.
    nodes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    tail: str = ""

    def record(self, test: str, saver: str, outcome: str, node: str) -> None:
        """One phase's outcome of ``test`` on ``saver``."""
        if self.outcomes[test].get(saver) in (None, "passed"):
            self.outcomes[test][saver] = outcome
        self.nodes[test].add(node)


def _as_test(node: str, saver: str) -> str:
    """A node id with its checkpointer's name replaced by ``CP``."""
    return re.sub(rf"\b{re.escape(saver)}\b", "CP", node, count=1)


def _run_suite(suite: Path, report: Path, savers: tuple[str, ...], args: list[str]) -> _SuiteRun:
    """Run LangGraph's tests named by ``args`` (files or node ids) on ``savers``, in a
    pytest subprocess in the unpacked sdist ``suite``; ``report`` is its outcomes file."""
    env = {
        **os.environ,
        "STEPSTONE_LG_REPORT": str(report),
        "STEPSTONE_LG_SAVER_TESTS_ONLY": "1",
        "STEPSTONE_LG_CHECKPOINTERS": ",".join(savers),
        # What this process imports (our src, the test dependencies), the child too.
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "--rootdir", str(suite)]
    command += ["-p", "no:cacheprovider", "-p", "no:playwright", "-p", "no:randomly", *args]
    try:
        done = subprocess.run(
            command,
            cwd=suite,
            env=env,
            capture_output=True,
            text=True,
            timeout=SHARD_TIMEOUT,
            check=False,  # the report, not the exit code, says what differs
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"LangGraph's tests on {savers} did not finish in {SHARD_TIMEOUT} s")
    run = _SuiteRun(tail="\n".join(done.stdout.splitlines()[-40:]))
    assert report.exists(), f"the suite reported nothing on {savers}; its output ends:\n{run.tail}"
    for line in report.read_text().splitlines():
        entry = json.loads(line)
        saver = entry["checkpointer"]
        if saver is not None:
            node = entry["nodeid"]
            run.record(_as_test(node, saver), saver, entry["outcome"], node)
    return run


def _compare(
    suite: Path, tmp_path: Path, args: list[str]
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]], str]:
    """Run LangGraph's tests ``args`` on ours, and what did not pass there on the reference.

    Returns every test's outcomes by saver, the differences (a test that passed on
    ``InMemorySaver`` and not on one of ours, timing-sensitive ones left out) and the tail
    of our run's output.
    """
    ours = _run_suite(suite, tmp_path / "ours.jsonl", OURS, args)
    outcomes = ours.outcomes
    # InMemorySaver, the reference, runs only what did not pass on one of ours: a test that
    # fails there too is not a difference. (Run on all three, it took a third of the time.)
    misses = {t for t, by in outcomes.items() if any(by.get(o) != "passed" for o in OURS)}
    if misses:
        # Our names are unlike any other parameter's, so the reference's node id is ours
        # with the name replaced; its outcome goes back under our test id.
        back = {
            re.sub(rf"\b{o}\b", "memory", node, count=1): test
            for test in misses
            for node in ours.nodes[test]
            for o in OURS
            if re.search(rf"\b{o}\b", node)
        }
        reference = _run_suite(suite, tmp_path / "memory.jsonl", ("memory",), sorted(back))
        ran_there = {node for nodes in reference.nodes.values() for node in nodes}
        assert ran_there == set(back), f"not run on InMemorySaver: {sorted(set(back) - ran_there)}"
        for test, nodes in reference.nodes.items():
            for node in nodes:
                outcomes[back[node]]["memory"] = reference.outcomes[test]["memory"]
    timed = {t for t in outcomes if t.split("[")[0] in TIMING_SENSITIVE}
    differences = {
        test: by for test in misses - timed if (by := outcomes[test]).get("memory") == "passed"
    }
    return outcomes, differences, ours.tail


def _file(test: str) -> str:
    """The file of a test id (``tests/test_pregel.py::test_x[CP]``): ``test_pregel.py``."""
    return test.partition("::")[0].removeprefix("tests/")


def test_the_shards_hold_each_file_once_and_every_listed_test_is_in_one() -> None:
    """No file runs twice or never; each expected difference and timing entry has a shard."""
    assert len(SUITE_FILES) == len(set(SUITE_FILES)), sorted(SUITE_FILES)
    assert all(name.startswith("test_") for name in SUITE_FILES), SUITE_FILES
    strays = [t for t in (*EXPECTED_DIFFERENCES, *TIMING_SENSITIVE) if _file(t) not in SUITE_FILES]
    assert not strays, f"entries for files in no shard (add the file or drop them): {strays}"


@pytest.mark.slow
@pytest.mark.timeout(600)  # a shard of LangGraph's files, three savers: 1-2 min on 2 cores
@pytest.mark.parametrize("shard", list(SHARDS))
def test_langgraph_own_graph_tests_pass_on_our_saver(
    request: pytest.FixtureRequest, tmp_path: Path, shard: str
) -> None:
    """Every LangGraph graph test that passes on InMemorySaver passes on StepstoneSaver."""
    floor, files = SHARDS[shard]
    missing = [name for name in ("syrupy", "pytest_mock") if util.find_spec(name) is None]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed (pip install --group dev)")
    version = metadata.version("langgraph")
    suite = _suite_dir(request, version)
    outcomes, differences, tail = _compare(suite, tmp_path, [f"tests/{name}" for name in files])
    counted = {o: sum(by.get(o) == "passed" for by in outcomes.values()) for o in OURS}
    assert min(counted.values()) > floor, (
        f"too few tests passed on our savers in shard {shard} ({counted}, not over {floor}):"
        f"\n{tail}"
    )
    unexpected = {t: by for t, by in differences.items() if t not in EXPECTED_DIFFERENCES}
    assert not unexpected, (
        f"{len(unexpected)} of LangGraph's tests pass on InMemorySaver and not on ours: "
        f"{json.dumps(unexpected, indent=1, sort_keys=True)}\nthe suite's output ends:\n{tail}"
    )
    # The lists cannot go stale: this shard checks the entries for its files.
    mine = {t for t in EXPECTED_DIFFERENCES if _file(t) in files}
    stale = sorted(mine - set(differences))
    assert not stale, f"expected differences that no longer differ (remove them): {stale}"
    ran = {t.split("[")[0] for t in outcomes}
    gone = sorted(t for t in TIMING_SENSITIVE if _file(t) in files and t not in ran)
    assert not gone, f"timing-sensitive tests that no longer run (remove them): {gone}"
    print(f"LangGraph {version}'s tests ({shard}) passed, per checkpointer: {counted}")


_FAKE_TESTS = """
from langgraph.checkpoint.memory import InMemorySaver


def test_same(sync_checkpointer):
    pass


def test_reference_only(sync_checkpointer):
    assert isinstance(sync_checkpointer, InMemorySaver)


def test_not_on_sqlite(request, sync_checkpointer):
    assert request.node.callspec.params["sync_checkpointer"] != "stepstone_sqlite"


def test_with_cache(cache, sync_checkpointer):
    # Its ids name the cache "memory" first: test_with_cache[memory-stepstone_sqlite].
    assert isinstance(sync_checkpointer, InMemorySaver)


def test_fails_everywhere(sync_checkpointer):
    assert False


def test_takes_no_saver():
    pass
"""


@pytest.mark.process
def test_the_reference_runs_only_what_failed_on_ours_and_a_difference_shows(
    tmp_path: Path,
) -> None:
    """A fake suite: a test that passes only on InMemorySaver is a difference, one that
    fails on all three is not, and one that passes on ours never runs on the reference."""
    tests = tmp_path / "suite" / "tests"
    tests.mkdir(parents=True)
    (tests / "__init__.py").touch()
    (tests / "memory_assert.py").write_text(
        "from langgraph.checkpoint.memory import InMemorySaver\n\n\n"
        "class MemorySaverAssertImmutable(InMemorySaver):\n    pass\n"
    )
    shutil.copy(Path(__file__).with_name("langgraph_suite_conftest.py"), tests / "conftest.py")
    (tests / "test_fake.py").write_text(_FAKE_TESTS)
    outcomes, differences, tail = _compare(tests.parent, tmp_path, ["tests/test_fake.py"])
    fake = "tests/test_fake.py::"
    assert sorted(differences) == [
        f"{fake}test_not_on_sqlite[CP]",
        f"{fake}test_reference_only[CP]",
        f"{fake}test_with_cache[memory-CP]",
    ], tail
    assert differences[f"{fake}test_not_on_sqlite[CP]"] == {
        "stepstone_memory": "passed",
        "stepstone_sqlite": "failed",
        "memory": "passed",
    }
    # Failed on all three: run on the reference, and not a difference.
    assert outcomes[f"{fake}test_fails_everywhere[CP]"] == dict.fromkeys(
        ("stepstone_memory", "stepstone_sqlite", "memory"), "failed"
    )
    # Passed on ours: the reference never ran it; a test without a saver never ran at all.
    assert outcomes[f"{fake}test_same[CP]"] == dict.fromkeys(OURS, "passed")
    assert not any("test_takes_no_saver" in test for test in outcomes)


def test_a_worker_that_loses_the_unpack_race_keeps_the_winners_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two shards fetching the sdist at once: the second rename keeps the first's tree."""
    version = "0.0.1"
    suite = tmp_path / f"langgraph-{version}"

    def download(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        # This worker's sdist, with a marker the winner's copy does not have.
        target = Path(command[command.index("-d") + 1])
        target.mkdir(parents=True)
        tests = tmp_path / "sdist" / f"langgraph-{version}" / "tests"
        tests.mkdir(parents=True)
        (tests / "__init__.py").touch()
        (tests / "loser.txt").touch()
        with tarfile.open(target / f"langgraph-{version}.tar.gz", "w:gz") as sdist:
            sdist.add(tests.parent, arcname=tests.parent.name)
        # Meanwhile another worker put its complete copy in place.
        (suite / "tests").mkdir(parents=True)
        (suite / "tests" / "__init__.py").touch()
        (suite / "tests" / "winner.txt").touch()
        return subprocess.CompletedProcess(command, 0, "", "")

    class Cache:
        def mkdir(self, name: str) -> Path:
            return tmp_path

    class Request:
        config = type("Config", (), {"cache": Cache()})()

    monkeypatch.setattr(subprocess, "run", download)
    got = _suite_dir(Request(), version)  # type: ignore[arg-type]
    assert got == suite
    assert sorted(p.name for p in (suite / "tests").iterdir()) == [
        "__init__.py",
        "conftest.py",
        "winner.txt",
    ]
    # Nothing of the loser's left beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == [suite.name, "sdist"]
