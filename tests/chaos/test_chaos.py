"""The chaos harness at CI size, the bad-input fuzzers, and the README's results table.

The harness itself lives in ``tools/chaos`` (repository tooling, not in the wheel;
``conftest.py`` puts ``tools`` on the path; ``scripts/chaos`` runs it at any size). Here:
each durable backend gets generated workflows killed by SIGKILL at every kill point and
resumed, in both modes (children driven by ``run`` and by ``arun``), concurrent workers
killed mid-race, and bystander runs checked; then hypothesis throws bad run_ids, states
and config strings at every backend.
Backends: file, sqlite, cosmos (the session's emulator), postgresql and mysql (loopback
servers, a fresh table per test, dropped after); a backend whose server is missing calls
``backend_unavailable`` (a skip locally, a failure under CI).
Sizes: ``STEPSTONE_CHAOS_DEATHS`` (deaths per backend, default 100, split between the
two modes; the slower backends get a fraction, see ``DEATHS_SHARE``) and
``STEPSTONE_CHAOS_EXAMPLES`` (hypothesis examples per fuzzer, default 60).
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import chaos
from stepstone import (
    Checkpoint,
    CheckpointTooLarge,
    InvalidRunId,
    InvalidState,
    Step,
    StepFailed,
    StepstoneError,
    check_run_id,
    open_store,
    register_store,
    run,
)
from stepstone.testing import backend_unavailable

pytestmark = [
    pytest.mark.crash,
    pytest.mark.timeout(600),  # a campaign: longer than the suite's 120 s per test
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

REPO = Path(__file__).resolve().parents[2]
DEATHS = int(os.environ.get("STEPSTONE_CHAOS_DEATHS", "100"))
EXAMPLES = int(os.environ.get("STEPSTONE_CHAOS_EXAMPLES", "60"))
BACKENDS = list(chaos.BACKENDS)
#: Fraction of DEATHS per backend (both modes together), so that tests/chaos stays within
#: its CI budget (~2 minutes on 2 cores): Cosmos costs ~0.5-1 s per death (the SDK and the
#: emulator), the others ~0.05-0.2 s; the next process takes a killed child's run over at
#: once (its owner was a process on this machine that is gone).
DEATHS_SHARE = {"file": 1.0, "sqlite": 1.0, "cosmos": 0.25, "postgresql": 0.5, "mysql": 0.5}
#: Fewest deaths per backend and mode: enough for seed 1 to reach every kill point and a
#: concurrent case (every fifth case is one).
MIN_DEATHS = 20
#: The children's lease where a test compares two runs death for death: long enough that
#: no step on a loaded machine outlasts a third of it, which would add a renewal save
#: (and a store kill point firing) to one run and not the other.
STEADY_LEASE = 0.3
#: Hypothesis examples per fuzzer, as a fraction of EXAMPLES (Cosmos: ~50 ms per request).
EXAMPLES_SHARE = {"cosmos": 0.5}


def _cosmos_config(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    try:
        import azure.cosmos  # noqa: F401
    except ImportError:
        backend_unavailable("azure-cosmos is not installed, so the Cosmos chaos run is NOT run")
    try:
        import stepstone.stores.cosmos  # noqa: F401
    except ImportError as exc:
        backend_unavailable(f"stepstone.stores.cosmos cannot be imported ({exc})")
    emu = request.getfixturevalue("emulator")  # skips loudly (fails under CI) if none
    monkeypatch.setenv("AZURE_COSMOS_KEY", emu.key)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    protocol = "&protocol=http" if emu.endpoint.startswith("http://") else ""
    container = f"chaos-{uuid.uuid4().hex[:10]}"
    return f"cosmos://{emu.host}:{emu.port}/chaos/{container}?verify=false{protocol}&create=true"


def _sql_config(request: pytest.FixtureRequest, name: str) -> str:
    """A fresh table on the loopback server, dropped after the test; unavailable: skip."""
    try:
        chaos.check_sql_server(name)
    except Exception as exc:  # noqa: BLE001 - a server that fails in any way is unavailable: skip, loudly
        backend_unavailable(f"{chaos.sql_server(name)}: {type(exc).__name__}: {exc}")
    table = chaos.new_table_name()
    request.addfinalizer(lambda: chaos.drop_sql_tables(name, [table]))
    return chaos.sql_config(name, table)


@pytest.fixture(params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    """(backend name, config string of a fresh store)."""
    name = request.param
    if name == "file":
        return name, f"file://{tmp_path}/runs"
    if name == "sqlite":
        return name, f"sqlite:///{tmp_path}/runs.db"
    if name in chaos.SQL_SERVERS:
        return name, _sql_config(request, name)
    return name, _cosmos_config(request, monkeypatch)


@pytest.fixture(params=chaos.MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """How each child drives its run: ``run`` (sync) or ``arun`` (async)."""
    if request.param == "async":
        import stepstone

        if not hasattr(stepstone, "arun"):
            pytest.skip("stepstone.arun does not exist yet: the async mode cannot run")
    return str(request.param)


def _options(backend: tuple[str, str], tmp_path: Path, **kw: Any) -> chaos.Options:
    name, config = backend
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return chaos.Options(name, config, str(work), **kw)


# -- the chaos run ------------------------------------------------------------------------


def test_chaos_deaths_resume_exactly(backend: tuple[str, str], mode: str, tmp_path: Path) -> None:
    """Generated workflows, killed at every point again and again, finish exactly."""
    opts = _options(backend, tmp_path, mode=mode)
    share = DEATHS_SHARE.get(backend[0], 1.0) / len(chaos.MODES)
    deaths = max(MIN_DEATHS, int(DEATHS * share))
    stats = chaos.run_shard(opts, iter(range(10**9)), deaths_target=deaths)
    print(  # the CI log's figures (pytest -rP shows them)
        f"chaos {backend[0]} {mode}: {sum(stats.deaths.values())} deaths, "
        f"{stats.processes} processes, {dict(stats.scenarios)}, {stats.conflicts} conflicts, "
        f"{len(stats.violations)} violations, {stats.seconds:.1f} s"
    )
    assert not stats.violations, "\n".join(stats.violations)
    assert sum(stats.deaths.values()) >= deaths
    assert stats.scenarios["single"] and stats.scenarios["concurrent"]
    points = [*chaos.RUNNER_POINTS, *chaos.kill_points(backend[0])]
    missed = [p for p in points if not stats.deaths[p]]
    assert not missed, f"kill points never reached: {missed} ({dict(stats.deaths)})"


def test_long_states_die_at_the_piece_kill_points(backend: tuple[str, str], tmp_path: Path) -> None:
    """Every case long (a growing transcript in pieces): killed inside pieces saves, exact."""
    pieces = chaos.piece_kill_points(backend[0])
    assert pieces, f"{backend[0]} declares no piece_kill_points: its long saves are never killed"
    opts = _options(backend, tmp_path, long=True)
    share = DEATHS_SHARE.get(backend[0], 1.0)
    # Twice the floor: a case reaches each piece point at most once or twice.
    deaths = max(2 * MIN_DEATHS, int(DEATHS * share / 2))
    stats = chaos.run_shard(opts, iter(range(10**9)), deaths_target=deaths)
    print(
        f"chaos {backend[0]} long: {sum(stats.deaths.values())} deaths, {dict(stats.deaths)}, "
        f"{len(stats.violations)} violations, {stats.seconds:.1f} s"
    )
    assert not stats.violations, "\n".join(stats.violations)
    missed = [p for p in pieces if not stats.deaths[p]]
    assert not missed, f"piece kill points never reached: {missed} ({dict(stats.deaths)})"


def test_big_states_near_the_limit(backend: tuple[str, str], tmp_path: Path) -> None:
    """A few cases with states near the backend's limit (``scripts/chaos --big`` for more)."""
    if backend[0] != "cosmos":
        pytest.skip("limits of 12 MiB+ (mysql) to 64 MiB+: scripts/chaos --big, not CI")
    opts = _options(backend, tmp_path, big=True, max_deaths=3)
    stats = chaos.run_shard(opts, [0, 1, 2, 3])
    assert not stats.violations, "\n".join(stats.violations)


@pytest.mark.parametrize("case", [0, 1, 3])
def test_spawned_interpreters_agree(case: int, mode: str, tmp_path: Path) -> None:
    """The same case in fresh ``python -m chaos`` children dies at the same points as forked."""
    forked = chaos.run_shard(
        _options(("file", f"file://{tmp_path}/a"), tmp_path, mode=mode, lease=STEADY_LEASE),
        [case],
    )
    (tmp_path / "s").mkdir()
    spawned = chaos.run_shard(
        chaos.Options(
            "file",
            f"file://{tmp_path}/b",
            str(tmp_path / "s"),
            spawn=True,
            mode=mode,
            lease=STEADY_LEASE,
        ),
        [case],
    )
    assert not forked.violations and not spawned.violations, forked.violations + spawned.violations
    assert forked.deaths == spawned.deaths
    assert forked.processes == spawned.processes


def test_case_is_reproducible(mode: str, tmp_path: Path) -> None:
    """A case replays the same deaths at the same points: the repro line means something."""
    runs = []
    for n in range(2):
        work = tmp_path / str(n)
        work.mkdir()
        opts = chaos.Options(
            "sqlite", f"sqlite:///{work}/r.db", str(work), mode=mode, lease=STEADY_LEASE
        )
        runs.append(chaos.run_shard(opts, [7, 12, 13]))
    assert runs[0].deaths == runs[1].deaths and runs[0].processes == runs[1].processes
    assert sum(runs[0].deaths.values()) > 0


def test_modes_plan_the_same_deaths(tmp_path: Path) -> None:
    """A case dies at the same points under ``run`` and ``arun``: the modes are comparable."""
    import stepstone

    if not hasattr(stepstone, "arun"):
        pytest.skip("stepstone.arun does not exist yet: the async mode cannot run")
    runs = {}
    for mode in chaos.MODES:
        work = tmp_path / mode
        work.mkdir()
        opts = chaos.Options(
            "file", f"file://{work}/runs", str(work), mode=mode, lease=STEADY_LEASE
        )
        runs[mode] = chaos.run_shard(opts, [0, 1, 2, 3])
    assert not runs["sync"].violations and not runs["async"].violations
    assert runs["sync"].deaths == runs["async"].deaths
    assert runs["sync"].processes == runs["async"].processes


def test_harness_is_repository_tooling() -> None:
    """The chaos harness is not in the wheel: nothing under src/ is it or imports it."""
    import importlib.util

    assert importlib.util.find_spec("stepstone.testing._chaos") is None
    assert Path(chaos.__file__).resolve().parent == REPO / "tools" / "chaos"
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "src").rglob("*.py")
        if re.search(r"^\s*(from|import) (chaos|tools)\b", path.read_text(encoding="utf-8"), re.M)
    ]
    assert not offenders, f"src/ imports the chaos harness: {offenders}"


@pytest.mark.parametrize("name", BACKENDS)
def test_kill_points_come_from_the_store_class(name: str) -> None:
    """The harness kills at the save points each backend class declares, no list of its own."""
    from stepstone import StepstoneError
    from stepstone._registry import store_class

    try:
        cls = store_class(name)
    except StepstoneError as exc:  # an extra that is not installed
        backend_unavailable(f"{name}: {exc}")
    assert cls.durable
    assert chaos.kill_points(name) == cls.kill_points
    assert cls.kill_points, f"{cls.__name__} declares no kill points inside a save"


def test_a_hung_child_is_killed_and_reported() -> None:
    """A child that never exits is SIGKILLed after the timeout and reported as hung."""
    import time

    from chaos import child, harness

    def hang() -> tuple[int, dict[str, Any]]:
        time.sleep(600)
        return 0, {}

    pid, fd = harness._fork(hang)
    ex = harness._collect(pid, fd, timeout=0.5)
    assert ex.status == child.ERROR_EXIT and "hung" in ex.result["error"], ex
    with pytest.raises(ChildProcessError):  # reaped: nothing left running
        os.waitpid(pid, os.WNOHANG)


def test_repro_line_names_the_mode() -> None:
    """A violation's repro line reruns the case in the mode it failed in."""
    res = chaos.CaseResult("file", 3, 17, "single", mode="async")
    assert res.repro() == "scripts/chaos --backend file --seed 3 --case 17 --mode async"
    assert chaos.CaseResult("file", 3, 17, "single").repro().endswith("--case 17")


def test_harness_catches_a_store_that_loses_saves(mode: str, tmp_path: Path) -> None:
    """The checks are not vacuous: a store that acknowledges saves it drops is caught."""
    from stepstone.stores.file import FileStore

    class Lossy(FileStore):
        scheme = "chaoslossy"
        count = 0

        @classmethod
        def from_config(cls, config: str) -> Lossy:
            return cls(config.split("://", 1)[1])

        def save(self, checkpoint: Checkpoint) -> Checkpoint:
            Lossy.count += 1
            if checkpoint.step >= 1 and Lossy.count % 3 == 0 and checkpoint.version is not None:
                # Pretend: return what a save returns, store nothing.
                return checkpoint.stored(
                    dict(checkpoint.state),
                    "{}",
                    checkpoint.version,
                    checkpoint.updated_at or __import__("stepstone")._checkpoint.utcnow(),
                )
            return super().save(checkpoint)

        async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
            # Under arun too, whatever FileStore's own async path does.
            return self.save(checkpoint)

    register_store("chaoslossy", Lossy)
    # Its kill points are the file store's, inherited with the class attribute.
    assert chaos.kill_points("chaoslossy") == chaos.kill_points("file")
    opts = chaos.Options("chaoslossy", f"chaoslossy://{tmp_path}/runs", str(tmp_path), mode=mode)
    stats = chaos.run_shard(opts, range(12))
    assert stats.violations, "a store that drops saves went unnoticed"
    assert all("scripts/chaos --backend chaoslossy --seed 1 --case" in v for v in stats.violations)


# -- the fuzzers ----------------------------------------------------------------------------


@contextlib.contextmanager
def _opened(backend: tuple[str, str]) -> Iterator[Any]:
    with open_store(backend[1]) as store:
        yield store


def _snap_all(store: Any, ids: list[str]) -> list[tuple[Any, ...]]:
    return [chaos.snapshot(store, run_id) for run_id in ids]


class _Odd:
    def __repr__(self) -> str:
        return "<odd>"


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=50)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
non_json = st.sampled_from(
    [
        {1, 2},
        frozenset(),
        b"bytes",
        bytearray(b"x"),
        float("nan"),
        float("inf"),
        -float("inf"),
        (1, 2),
        (),
        _Odd(),
        object(),
        1 + 2j,
        range(3),
        "\ud800",
        "\udfff-lone-surrogate",
    ]
)
huge_int = st.integers(4400, 4500).map(lambda n: 10**n)  # over int->str's 4300 digits
any_value = st.recursive(
    json_leaf | non_json | huge_int,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=5) | st.integers() | st.none() | st.booleans(), inner, max_size=4
        )
        | st.tuples(inner, inner)
    ),
    max_leaves=12,
)
states = st.dictionaries(st.text(max_size=10), any_value, max_size=6) | any_value

run_ids = (
    st.text(max_size=40)
    | st.text(
        alphabet=st.characters(codec=None, categories=["Cc", "Cs", "Zs", "Lo", "So"]), max_size=12
    )
    | st.integers(1000, 1100).map(lambda n: "x" * n)
    | st.integers(1020, 1030).map(lambda n: "é" * n)
    | st.sampled_from(["..", ".", "/", "a/../b", "~x", "%2e%2e", "x.lock", ".tmp-x", "\x00"])
    | st.none()
    | st.integers()
    | st.binary(max_size=5)
)

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
    database=None,
)


def _fuzz_settings(backend: tuple[str, str]) -> settings:
    examples = max(10, int(EXAMPLES * EXAMPLES_SHARE.get(backend[0], 1.0)))
    return settings(FUZZ_SETTINGS, max_examples=examples)


def _fuzz_store(backend: tuple[str, str]) -> tuple[Any, list[str], list[tuple[Any, ...]]]:
    store = open_store(backend[1])
    ids = list(chaos.seed_bystanders(store, 99))
    return store, ids, _snap_all(store, ids)


def test_fuzz_run_ids(backend: tuple[str, str]) -> None:
    """Any run_id: a documented error or a working run; other runs untouched."""
    store, ids, before = _fuzz_store(backend)

    @_fuzz_settings(backend)
    @given(run_id=run_ids)
    def check(run_id: Any) -> None:
        assume(run_id not in ids)
        valid = isinstance(run_id, str)
        try:
            check_run_id(run_id)
        except InvalidRunId:
            valid = False
        for action in (
            lambda: store.load(run_id),
            lambda: store.save(Checkpoint(run_id=run_id, state={"k": 1}, total_steps=1)),
            lambda: run(run_id, [Step("a", lambda s: {"a": 1})], store),
            lambda: store.delete(run_id),
        ):
            try:
                action()
            except StepstoneError as exc:
                assert not valid, f"valid run_id {run_id!r} refused: {exc!r}"
                assert isinstance(exc, InvalidRunId), f"{run_id!r}: {exc!r}"
        if valid:
            assert store.load(run_id) is None
        assert _snap_all(store, ids) == before, f"bystanders changed by run_id {run_id!r}"

    try:
        check()
    finally:
        store.close()


def test_fuzz_states(backend: tuple[str, str]) -> None:
    """Any state: saved exactly or InvalidState (nothing stored); other runs untouched."""
    store, ids, before = _fuzz_store(backend)
    counter = iter(range(10**9))

    @_fuzz_settings(backend)
    @given(state=states, via_runner=st.booleans())
    def check(state: Any, via_runner: bool) -> None:
        run_id = f"fuzz-state-{next(counter)}"
        try:
            if via_runner:
                result = run(run_id, [Step("a", lambda s: state)], store)
                want = {} if state is None else state  # None: a step with no updates
                assert isinstance(want, dict)
                stored = store.load(run_id)
                assert stored is not None and stored.state == result == want
            else:
                saved = store.save(Checkpoint(run_id=run_id, state=state))
                stored = store.load(run_id)
                assert stored is not None and stored.state == saved.state == state
        except (InvalidState, CheckpointTooLarge):
            cp = store.load(run_id)
            assert cp is None or not cp.step_names, f"a refused state left a checkpoint: {cp}"
        except StepFailed as exc:
            # The step returned a non-dict, or a dict that is not JSON: the runner records
            # the step's failure (never retried) and stores nothing of the state.
            assert via_runner, exc
            cp = store.load(run_id)
            assert cp is not None and cp.status == "failed" and not cp.step_names, cp
        assert _snap_all(store, ids) == before, "bystanders changed"

    try:
        check()
    finally:
        store.close()


def _mutate(text: str, ops: list[tuple[int, int, str]]) -> str:
    for kind, where, char in ops:
        pos = where % (len(text) + 1)
        if kind == 0:
            text = text[:pos] + char + text[pos:]
        elif kind == 1:
            text = text[:pos] + text[pos + 1 :]
        else:
            text = text[:pos] + char + text[pos + 1 :]
    return text


def test_fuzz_config_strings(
    backend: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any config string opens a store or raises a StepstoneError; nothing stored changes."""
    if backend[0] == "cosmos":
        pytest.skip("config fuzzing of cosmos:// is offline (below): no emulator needed")
    if backend[0] in chaos.SQL_SERVERS:
        # A mutated URL could name another table (created at open) or database on the
        # live server: postgresql:// and mysql:// are fuzzed offline, below.
        pytest.skip("config fuzzing of SQL URLs is offline (below): a closed port")
    monkeypatch.chdir(tmp_path)  # relative paths land here
    store, ids, before = _fuzz_store(backend)
    store.close()
    valid = [
        backend[1],
        f"file://{tmp_path}/fz",
        f"file:{tmp_path}/fz2?durability=none",
        f"sqlite:///{tmp_path}/fz.db?synchronous=normal&busy_timeout=10",
        f"sqlite:////{tmp_path}/fz.db",
        "memory://name",
        "cosmos://127.0.0.1:1/db/c?verify=false",
        f"file://{tmp_path}/runs.db",  # the sqlite bystander file as a directory
        f"sqlite:///{tmp_path}/runs",  # the file bystander directory as a database
        f"sqlite:///{tmp_path}/runs.db?synchronous=extra",
    ]
    noise = st.text(alphabet=st.characters(codec=None), max_size=4)

    @FUZZ_SETTINGS
    @given(
        config=st.text(max_size=60)
        | st.tuples(
            st.sampled_from(valid),
            st.lists(st.tuples(st.integers(0, 2), st.integers(0, 200), noise), max_size=4),
        ).map(lambda t: _mutate(t[0], t[1]))
        | st.tuples(st.sampled_from(valid), st.sampled_from(["?", "&", "#"]), noise).map(
            lambda t: t[0] + t[1] + t[2]
        )
    )
    def check(config: str) -> None:
        # Never let a mutation reach outside the test's directory: absolute paths must
        # stay under it, relative ones land in it (the working directory).
        rest = config.split(":", 1)[1] if ":" in config else ""
        assume(".." not in config and "%" not in config and "~" not in config)
        assume(not rest.startswith("/") or str(tmp_path).lstrip("/") in rest)
        assume("cosmos" not in config.lower() or "127.0.0.1:1/" in config)
        try:
            opened = open_store(config)
        except StepstoneError:
            return
        try:
            with contextlib.suppress(StepstoneError):
                if opened.scheme != "cosmos":
                    opened.load("probe")
        finally:
            opened.close()
        with open_store(backend[1]) as again:
            assert _snap_all(again, ids) == before, f"config {config!r} changed stored runs"

    check()


COSMOS_CONFIGS = st.text(max_size=40).map(lambda t: "cosmos://" + t) | st.tuples(
    st.sampled_from(
        [
            "cosmos://127.0.0.1:1/db/c?verify=false",
            "cosmos://127.0.0.1:1/db/c?verify=false&create=true&protocol=http",
            "cosmos://acct.documents.azure.com/db/c",
        ]
    ),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 80), st.text(max_size=3)), max_size=4),
).map(lambda t: _mutate(t[0], t[1]))


@FUZZ_SETTINGS
@given(config=COSMOS_CONFIGS)
def test_fuzz_cosmos_config_strings_offline(config: str) -> None:
    """cosmos:// config strings: a store (not yet connected) or a StepstoneError."""
    pytest.importorskip("azure.cosmos")
    assume("127.0.0.1:1" in config or "documents.azure.com" in config or "://" not in config[9:])
    os.environ.setdefault("AZURE_COSMOS_KEY", "c3RlcHN0b25lLWNoYW9zLWZha2Uta2V5LTEyMzQ1Njc4OTA=")
    try:
        opened = open_store(config)
    except StepstoneError:
        return
    opened.close()


SQL_CONFIGS = st.tuples(
    st.sampled_from(
        [
            "postgresql://postgres@127.0.0.1:1/test?table=t_fuzz&connect_timeout=1",
            "mysql://root@127.0.0.1:1/test?table=t_fuzz&connect_timeout=1",
            "postgresql+psycopg://u:p@127.0.0.1:1/db?connect_timeout=1",
            "mysql+pymysql://u@127.0.0.1:1/db?connect_timeout=1",
        ]
    ),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 80), st.text(max_size=3)), max_size=4),
).map(lambda t: _mutate(t[0], t[1]))


@FUZZ_SETTINGS
@given(config=SQL_CONFIGS)
def test_fuzz_sql_config_strings_offline(config: str) -> None:
    """postgresql:// and mysql:// config strings: a store or a StepstoneError, no hang."""
    # Only strings that still point at the closed port 1 of loopback (no server there).
    assume(re.search(r"@127\.0\.0\.1:1/[^@]*$", config) is not None)
    assume("connect_timeout=1" in config)
    try:
        opened = open_store(config)
    except StepstoneError:
        return
    try:
        with contextlib.suppress(StepstoneError):
            opened.load("probe")
    finally:
        opened.close()


# -- the README's table ---------------------------------------------------------------------


def test_results_table_has_the_harness_format() -> None:
    """RESULTS.md is what ``render_table`` writes: read back and rendered again, it is equal."""
    results = REPO / "tests" / "chaos" / "RESULTS.md"
    if not results.exists():
        pytest.skip("tests/chaos/RESULTS.md not written yet: run scripts/chaos")
    text = results.read_text(encoding="utf-8")
    assert re.search(r"^Command: `scripts/chaos.*`$", text, re.M)
    stats, command, seconds = chaos.parse_table(text)  # ValueError: not the format
    assert stats, "the table has no backend rows"
    assert {s.backend for s in stats} <= set(chaos.BACKENDS)
    assert {s.mode for s in stats} <= set(chaos.MODES)
    assert not any(s.violations for s in stats), "the committed results show violations"
    machine = text.rstrip("\n").rsplit("\n", 1)[-1]
    assert machine.startswith("Machine: ")
    assert chaos.render_table(stats, command, seconds, machine) == text


def test_table_has_a_row_per_backend_and_mode() -> None:
    """The table shows each backend in each mode, and every figure survives a round trip."""
    from collections import Counter

    stats = []
    for n, (backend, mode) in enumerate([("file", "sync"), ("file", "async"), ("mysql", "sync")]):
        s = chaos.Stats(backend, Counter(single=n + 1, concurrent=n), 10 + n, mode=mode)
        s.deaths.update({"runner.before_step": n + 2, "step.inside": 1})
        s.conflicts, s.seconds = 3 * n, 4.0 + n
        stats.append(s)
    stats[2].deaths["sql.request_sent"] = 5
    stats[1].violations.append("VIOLATION x")
    text = chaos.render_table(stats, "scripts/chaos --mode both", 9.0, "Machine: x")
    assert "| file | async | 2 | 1 | 11 | 4 | 3 | 1 | 5 | 0.8 |" in text
    assert "| kill point | file sync | file async | mysql sync | total |" in text
    assert "| `sql.request_sent` | 0 | 0 | 5 | 5 |" in text
    back, command, seconds = chaos.parse_table(text)
    assert (command, seconds) == ("scripts/chaos --mode both", 9.0)
    assert [(b.backend, b.mode, b.deaths, b.processes) for b in back] == [
        (s.backend, s.mode, s.deaths, s.processes) for s in stats
    ]
    assert chaos.render_table(back, command, seconds, "Machine: x") == text


def test_readme_chaos_table_matches_results() -> None:
    """The table in README.md between the chaos markers is RESULTS.md verbatim.

    Exact text equality of the block and the file, both whitespace-trimmed at the ends.
    To fix a mismatch: ``scripts/chaos --update-readme`` (rewrites only that block).
    """
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = chaos.readme_block(readme)  # ValueError: markers duplicated or out of order
    if block is None:
        pytest.skip("README.md has no <!-- chaos:begin --> / <!-- chaos:end --> markers yet")
    results = (REPO / "tests" / "chaos" / "RESULTS.md").read_text(encoding="utf-8").strip()
    assert block == results, (
        "README's chaos table differs from tests/chaos/RESULTS.md: run "
        "scripts/chaos --update-readme"
    )


def test_update_readme_rewrites_only_the_block(tmp_path: Path) -> None:
    """``scripts/chaos --update-readme`` replaces the text between the markers, nothing else."""
    readme = tmp_path / "README.md"
    results = tmp_path / "RESULTS.md"
    results.write_text("\n### Chaos run\n\n| a | b |\n\n", encoding="utf-8")
    before = "# x\n\ntext\n<!-- chaos:begin -->\nold\n  table\n<!-- chaos:end -->\nafter\n"
    readme.write_text(before, encoding="utf-8")
    assert chaos.update_readme(readme, results)
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# x\n\ntext\n<!-- chaos:begin -->\n")
    assert text.endswith("\n<!-- chaos:end -->\nafter\n")
    assert chaos.readme_block(text) == results.read_text(encoding="utf-8").strip()
    assert not chaos.update_readme(readme, results)  # idempotent
    readme.write_text(before + "<!-- chaos:begin -->\n", encoding="utf-8")
    with pytest.raises(ValueError, match="exactly one"):
        chaos.readme_block(readme.read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="before"):
        chaos.readme_block("<!-- chaos:end -->\n<!-- chaos:begin -->")
