"""The test tiers, the markers that sort tests into them, and the guards that keep them honest.

``--tier=fast`` is what an engineer runs after every change (``scripts/test --fast``): every
in-process test on memory, file and SQLite. Tests on server backends (PostgreSQL, MySQL,
Cosmos; or marked ``server``), tests marked ``process``, ``crash`` or ``slow`` and the
connection-path variants' process tests are deselected, not skipped. Under it, autouse
guards fail a test that spawns a process or reaches a database server, and a test whose
call phase passes ``--fast-limit`` seconds (2) fails, naming itself and asking to be marked
``slow``. ``--tier=rest`` selects exactly the tests ``--tier=fast`` leaves out, so the two
partition the suite and CI runs each test once. ``--backends=memory,file,sqlite`` deselects
the other backends' tests on its own.

The xdist groups (``--dist loadgroup``) keep the Cosmos emulator's tests on one worker (one
emulator per session) and the browser's tests with their module-scoped Chromium; the worker
side of the grouping is done here (``suffix_groups``), as xdist 3.8 under pytest 9 does not.
"""

from __future__ import annotations

import multiprocessing.process
import os
import re
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _pytest.nodeid import coerce_node_id

ALL_BACKENDS = ("memory", "file", "sqlite", "postgresql", "mysql", "cosmos")
FAST_BACKENDS = ("memory", "file", "sqlite")
#: Words in a test's parameters, class, name or module that tie it to a server backend.
_WORDS = {
    "postgresql": {"postgresql", "postgres", "pg", "psycopg"},
    "mysql": {"mysql", "mariadb", "pymysql", "aiomysql"},
    "cosmos": {"cosmos", "emulator"},
}
#: Fixtures that bring up or reach a server.
_FIXTURES = {"emulator": "cosmos", "cosmos": "cosmos", "cosmos_env": "cosmos"}
#: Server ports a fast-tier test must not reach (PostgreSQL, MariaDB, the Cosmos emulator).
_SERVER_PORTS = {5432: "postgresql", 3306: "mysql", 8081: "cosmos"}
#: Tests that spawn processes without saying so: the shipped contract's process tests (the
#: package cannot carry our ``process`` marker; users register only ``crash``).
_SPAWNING_MODULES = {"stepstone.testing._contract_processes"}
#: The shipped contract's tests over the fast tier's limit (marked slow here, as above).
_SLOW_CONTRACT = {"test_async_many_runs_in_one_loop"}
#: Their timeout (seconds): ~90 s measured on an engine-backed PostgresStore under load.
CONTRACT_SLOW_TIMEOUT = 300


def add_options(parser: pytest.Parser) -> None:
    """Register ``--tier``, ``--backends`` and ``--fast-limit``."""
    group = parser.getgroup("stepstone tiers")
    group.addoption(
        "--tier",
        choices=("fast", "rest", "all"),
        default="all",
        help="fast: in-process tests on memory, file and SQLite, guarded; rest: the others",
    )
    group.addoption(
        "--backends",
        default=None,
        help="comma-separated backends to keep (memory,file,sqlite,postgresql,mysql,cosmos); "
        "tests on any other backend are deselected (--tier=fast implies memory,file,sqlite)",
    )
    group.addoption(
        "--fast-limit",
        type=float,
        default=2.0,
        help="under --tier=fast, fail a test whose call phase takes longer (seconds; 0: none)",
    )


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if w}


def backends_of(item: pytest.Item) -> set[str]:
    """Which backends a test runs on, from its parameters, names and fixtures."""
    found: set[str] = set()
    callspec = getattr(item, "callspec", None)
    words: set[str] = set()
    if callspec is not None:
        words |= _words(callspec.id)
        words |= {v.lower() for v in callspec.params.values() if isinstance(v, str)}
    words |= _words(getattr(item, "originalname", item.name))
    words |= _words(item.path.stem)
    found |= {b for b in FAST_BACKENDS if b in words}
    found |= {b for b, aliases in _WORDS.items() if words & aliases}
    # Class names are CamelCase (TestMySQLStore): look for the longer names inside them.
    cls = getattr(item, "cls", None)
    if cls is not None:
        name = cls.__name__.lower()
        found |= {
            b for b, aliases in _WORDS.items() if any(a in name for a in aliases if len(a) > 4)
        }
    found |= {_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in _FIXTURES}
    if item.get_closest_marker("server"):
        found.add("server")
    return found


def _contract_slow(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    module = getattr(function, "__module__", "") or ""
    return module.startswith("stepstone.testing") and item.name.split("[")[0] in _SLOW_CONTRACT


def spawns(item: pytest.Item) -> bool:
    """Whether a test is known to spawn processes (marked, or a crash test, or the contract's)."""
    if item.get_closest_marker("process") or item.get_closest_marker("crash"):
        return True
    # A browser test starts Chromium (the ``chromium`` fixture), marked or not.
    if "chromium" in getattr(item, "fixturenames", ()):
        return True
    function = getattr(item, "function", None)
    return getattr(function, "__module__", None) in _SPAWNING_MODULES


def is_fast(item: pytest.Item) -> bool:
    """Whether a test belongs to the fast tier."""
    if spawns(item) or item.get_closest_marker("slow") or _contract_slow(item):
        return False
    return not backends_of(item) - set(FAST_BACKENDS)


def modify_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Select the tier, deselect other backends, group tests for xdist, mark spawners."""
    tier = config.getoption("tier")
    allowed = config.getoption("backends")
    keep_backends = set(allowed.split(",")) if allowed else set(ALL_BACKENDS)
    unknown = keep_backends - set(ALL_BACKENDS)
    if unknown:
        raise pytest.UsageError(
            f"--backends: unknown {sorted(unknown)}; known: {', '.join(ALL_BACKENDS)}"
        )
    # A test marked ``server`` reaches some server: kept while any server backend is.
    if keep_backends - set(FAST_BACKENDS):
        keep_backends.add("server")
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if spawns(item) and not item.get_closest_marker("process"):
            item.add_marker(pytest.mark.process)
        backends = backends_of(item)
        # A connection-path variant (a store on a user's SQLAlchemy Engine) runs the contract's
        # process and crash tests once, on the backend itself (test_contract.py).
        variant_spawn = item.get_closest_marker("variant") is not None and spawns(item)
        if tier == "fast":
            keep = is_fast(item) and not backends - keep_backends
        elif tier == "rest":
            keep = not is_fast(item) and not backends - keep_backends and not variant_spawn
        else:
            keep = not backends - keep_backends and not variant_spawn
        (kept if keep else dropped).append(item)
        # The contract's load tests take minutes on a busy machine: a timeout of their own.
        if _contract_slow(item) and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(CONTRACT_SLOW_TIMEOUT))
        if "cosmos" in backends:
            item.add_marker(pytest.mark.xdist_group("cosmos"))
        elif "chromium" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("browser"))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# -- the xdist groups ---------------------------------------------------------------------

#: The worker input key that tells a worker the run is ``--dist loadgroup``.
LOADGROUP = "stepstone_loadgroup"


def tell_worker_loadgroup(node: Any) -> None:
    """On the controller, tell a starting xdist worker whether the run is ``--dist loadgroup``.

    xdist's worker decides whether to suffix its ids with the group from its own ``dist``
    option, which is "no" on a worker (pytest-xdist issue 1386): the controller says instead.
    """
    node.workerinput[LOADGROUP] = node.config.getoption("dist") == "loadgroup"


def suffix_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a ``--dist loadgroup`` worker, end each grouped test's id with ``@<group>``.

    The loadgroup scheduler sends the tests whose ids end with the same ``@<group>`` to one
    worker; the suffix is xdist's job, but xdist 3.8 under pytest 9 skips it (it asks the
    worker's own ``dist`` option, see ``tell_worker_loadgroup``) and sets ``_nodeid``, which
    pytest 9 no longer reads (the id lives in ``_id``): pytest-xdist issue 1386. An id that
    already ends with its suffix (an xdist that does it again) is left alone.
    """
    if not getattr(config, "workerinput", {}).get(LOADGROUP):
        return
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        suffix = f"@{'_'.join(sorted(names))}"
        if names and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(f"{item.nodeid}{suffix}")


# -- the fast tier's guards ---------------------------------------------------------------


class SpawnRefused(RuntimeError):
    """A fast-tier test tried to start a process."""


class ServerRefused(RuntimeError):
    """A fast-tier test tried to reach a database server."""


def _refuse(what: str, seen: list[str], error: type[RuntimeError]) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        # Popen._execute_child(self, args, ...): the command says most.
        shown = args[1:2] if what == "subprocess.Popen" else args[:1]
        detail = f"{what}({', '.join(repr(a)[:100] for a in shown)})"
        seen.append(detail)
        raise error(f"the fast tier refuses {detail}")

    return refuse


def _warm_up() -> None:
    """Run, outside the guard, what spawns a process once per interpreter on its own.

    The inotify wrapper finds libc with ``ctypes.util.find_library``, which runs
    ``ldconfig -p`` the first time (then cached): an interpreter's one-off, not the test's.
    """
    from stepstone.stores import _inotify

    _inotify._libc()


@pytest.fixture(autouse=True)
def _fast_tier_guards(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under ``--tier=fast``, fail a test that spawns a process or reaches a server.

    The fast tier is in-process by definition: a spawn (``subprocess``, ``multiprocessing``,
    ``os.fork``) or a connection to PostgreSQL, MySQL or the Cosmos emulator means the test
    belongs to a slower tier, so it fails here, saying which marker to add.
    """
    if request.config.getoption("tier") != "fast":
        yield
        return
    _warm_up()
    spawned: list[str] = []
    reached: list[str] = []
    patch = pytest.MonkeyPatch()
    patch.setattr(
        subprocess.Popen, "_execute_child", _refuse("subprocess.Popen", spawned, SpawnRefused)
    )
    patch.setattr(
        multiprocessing.process.BaseProcess,
        "start",
        _refuse("multiprocessing.Process.start", spawned, SpawnRefused),
    )
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            patch.setattr(os, name, _refuse(f"os.{name}", spawned, SpawnRefused))
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def _server(address: Any) -> str | None:
        if isinstance(address, tuple) and len(address) >= 2:
            return _SERVER_PORTS.get(address[1])
        return None

    def connect(sock: socket.socket, address: Any) -> None:
        if (server := _server(address)) is not None:
            reached.append(f"{server} at {address!r}")
            raise ServerRefused(f"the fast tier refuses a connection to {server} ({address!r})")
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        if (server := _server(address)) is not None:
            reached.append(f"{server} at {address!r}")
            raise ServerRefused(f"the fast tier refuses a connection to {server} ({address!r})")
        return real_connect_ex(sock, address)

    patch.setattr(socket.socket, "connect", connect)
    patch.setattr(socket.socket, "connect_ex", connect_ex)
    # psycopg connects through libpq, beneath Python's sockets.
    try:
        import psycopg
    except ImportError:
        pass
    else:
        for cls in (psycopg.Connection, psycopg.AsyncConnection):
            patch.setattr(cls, "connect", _refuse("psycopg.connect", reached, ServerRefused))
    try:
        yield
    finally:
        patch.undo()
    if spawned:
        pytest.fail(
            f"{request.node.nodeid} spawns a process ({spawned[0]}) but has no "
            "@pytest.mark.process: mark it (the fast tier runs in-process tests only)",
            pytrace=False,
        )
    if reached:
        pytest.fail(
            f"{request.node.nodeid} reaches a server ({reached[0]}), so it is not a "
            "memory/file/SQLite test: mark it @pytest.mark.server (or parametrize it by backend)",
            pytrace=False,
        )


#: Seconds the test process's threads waited for a CPU during a test's call phase.
WAITED = pytest.StashKey[float]()


def runqueue_wait() -> float:
    """Seconds this process's live threads have spent ready to run but not running (Linux).

    The fast tier's limit is about the test, not about the machine: on a busy machine a
    test's wall time stretches by the time its threads waited for a CPU, so that wait is
    taken off (0 where ``/proc`` has no ``schedstat``: the limit is then plain wall time).
    """
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def enforce_limit(item: pytest.Item, report: pytest.TestReport) -> None:
    """Under ``--tier=fast``, fail a passed test whose call phase took over the limit."""
    config = item.config
    limit = config.getoption("fast_limit")
    if config.getoption("tier") != "fast" or not limit or report.when != "call":
        return
    waited = max(0.0, item.stash.get(WAITED, 0.0))
    if report.passed and report.duration - waited > limit:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {report.duration:.2f} s ({waited:.2f} s of it waiting for "
            f"a CPU), over the fast tier's {limit:g} s: mark it @pytest.mark.slow (or make "
            "it faster)"
        )


def _clean(text: str) -> str:
    # A lone surrogate (a file name's undecodable byte) prints as \udcff instead.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def printable(report: pytest.TestReport) -> None:
    """Make a report's text encodable as UTF-8, which xdist needs to send it.

    A test about undecodable file names captures them in its output or its failure; xdist's
    transport then dies on the lone surrogate and takes the whole worker (and run) with it.
    """
    report.sections = [(title, _clean(text)) for title, text in report.sections]
    longrepr = report.longrepr
    if isinstance(longrepr, str):
        report.longrepr = _clean(longrepr)
    elif isinstance(longrepr, tuple):
        report.longrepr = tuple(_clean(v) if isinstance(v, str) else v for v in longrepr)  # type: ignore[assignment]
    elif longrepr is not None:
        text = str(longrepr)
        if _clean(text) != text:
            report.longrepr = _clean(text)
