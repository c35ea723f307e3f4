"""Helpers shared by the benchmark scripts in this folder (not part of stepstone).

The measuring itself (the file and sqlite floors, interleaved repeats, statistics) lives
in ``stepstone._bench`` so that ``stepstone bench`` and these scripts measure the same way.
What only the scripts need stays here: the structured ``records`` workload, the SQL
servers and their raw-driver floor (given to ``bench_store`` as ``floor=floor_for``), and
the agent benchmark the adapter scripts share (``AgentBench``: each script supplies only
how to build its agent).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import operator
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Stores live here: on the real disk (tmpfs would make every fsync free).
TMP = HERE / ".tmp"


_COLLECTED = re.compile(r"Collected : (\d+)")


def callgrind_count(
    argv: Sequence[str], env: Mapping[str, str] | None = None, python: str = sys.executable
) -> int:
    """Instructions callgrind counts for ``python argv...`` (``PYTHONHASHSEED=0``), the
    whole process; ``SystemExit`` naming the command when it fails or prints no count.

    ``env``: the child's environment (default: this process's); ``python``: the
    interpreter (default: this one).
    """
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**(os.environ if env is None else env), "PYTHONHASHSEED": "0"},
    )
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind gave no count for {list(argv)}: {done.stderr[-800:]}")
    return int(found.group(1))


def callgrind_dumps(
    argv: Sequence[str], env: Mapping[str, str], directory: Path, *, named: bool = False
) -> tuple[list[tuple[Path, int]], str]:
    """Run ``python argv...`` under callgrind, its dumps in ``directory``; return each
    ``operator.call``'s dump and instructions (every thread counted), and its stdout.

    Callgrind dumps its counters as that call is entered and as it returns (nothing on a
    measured path calls it); only the dumps taken at a return are kept, each all the
    threads' work during one call: imports, opening and warm-ups are never counted.
    ``named``: every dump spells its functions' names out (``callgrind_self_costs`` reads
    them); by default a later dump names a function by a number an earlier one defined.
    """
    out = directory / "cg.out"
    spelled = ["--compress-strings=no", "--compress-pos=no"] if named else []
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=_operator_call",
            "--dump-after=_operator_call",
            *spelled,
            f"--callgrind-out-file={out}",
            sys.executable,
            *argv,
        ],
        check=True,
        capture_output=True,
        text=True,
        env={**env, "PYTHONHASHSEED": "0"},
    )
    calls = []
    for dump in sorted(
        (p for p in directory.iterdir() if re.fullmatch(r"cg\.out\.\d+", p.name)),
        key=lambda p: int(p.name.rsplit(".", 1)[1]),
    ):
        text = dump.read_text(encoding="utf-8", errors="replace")
        if "Trigger: --dump-after" not in text:
            continue  # outside the counted calls
        match = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
        assert match is not None, f"no totals in {dump.name}"
        calls.append((dump, int(match.group(1))))
    return calls, proc.stdout


def callgrind_self_costs(dump: Path, limit: int = 15) -> list[tuple[int, str]]:
    """The top functions of a dump (``callgrind_dumps(named=True)``) by their own instructions.

    Read here, not by ``callgrind_annotate``: on a dump taken at ``--dump-after`` it
    charges everything to the outermost frame (``__libc_start_main``, 100%). A
    function's own cost is each cost line under its ``fn=``, except the line after a
    ``calls=``, which is the inclusive cost of that call. ``'N`` (a recursion level)
    is folded into the function. Names are ``object:function`` (the shared object's
    file name), since CPython's and the extensions' unnamed functions are addresses.
    """
    costs: dict[str, int] = {}
    obj = function = ""
    after_call = False
    with dump.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if line.startswith("ob="):
                obj = line[3:].strip().rsplit("/", 1)[-1]
            elif line.startswith("fn="):
                function = f"{obj}:{line[3:].strip().split(chr(39), 1)[0]}"
            elif line.startswith("calls="):
                after_call = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if after_call:
                    after_call = False
                    continue
                fields = line.split()
                if len(fields) >= 2 and function:
                    costs[function] = costs.get(function, 0) + int(fields[1])
    return sorted(((cost, name) for name, cost in costs.items()), reverse=True)[:limit]


def callgrind_calls(argv: Sequence[str], env: Mapping[str, str]) -> list[int]:
    """Instructions of each ``operator.call`` in ``python argv...`` (``callgrind_dumps``)."""
    with tempfile.TemporaryDirectory() as tmp:
        calls, _ = callgrind_dumps(argv, env, Path(tmp))
    return [count for _, count in calls]


def parse_args(description: str, extra: Sequence[str] = ()) -> argparse.Namespace:
    """Parse the options every script takes: --quick, --json, --repeats, --no-sql, --cosmos."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per figure")
    parser.add_argument(
        "--no-sql", action="store_true", help="skip the PostgreSQL and MySQL/MariaDB stores"
    )
    if "cosmos" in extra:
        parser.add_argument(
            "--cosmos", action="store_true", help="also measure Cosmos DB (emulator)"
        )
    if "no-cosmos" in extra:
        parser.add_argument("--no-cosmos", action="store_true", help="skip Cosmos DB")
    return parser.parse_args()


def settings(
    args: argparse.Namespace, full: tuple[int, float], quick: tuple[int, float]
) -> tuple[int, float]:
    """Return (repeats, seconds per timed batch) for the chosen mode."""
    repeats, target_s = quick if args.quick else full
    return (args.repeats or repeats), target_s


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """Yield a fresh directory under benchmarks/.tmp, removed afterwards whatever happens."""
    TMP.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=TMP))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fig(d: dict[str, Any] | None, unit: str = "us") -> str:
    """Format a ``Stats.to_json`` figure as 'median [min-max]'."""
    if d is None:
        return "-"
    if unit == "x":
        return f"{d['median']:.2f}x [{d['min']:.2f}-{d['max']:.2f}]"
    return f"{_num(d['median'])} [{_num(d['min'])}-{_num(d['max'])}]"


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return a plain-text table, columns padded to fit."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    """Print the JSON payload (--json) or the human-readable text."""
    if args.json:
        print(json.dumps(payload))
    else:
        print(text)


def progress(args: argparse.Namespace, message: str) -> None:
    """Tell a person what is being measured (stderr, so --json output stays clean)."""
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def cosmos_config(
    database: str = "benchdb", container: str = "runs"
) -> Iterator[tuple[str | None, str]]:
    """Yield (config string, description) for a Cosmos store, or (None, why not).

    ``STEPSTONE_BENCH_COSMOS`` (a full config string, key in ``AZURE_COSMOS_KEY``) wins;
    otherwise the test helper ``tests/cosmos_emulator.py`` starts an emulator.
    """
    given = os.environ.get("STEPSTONE_BENCH_COSMOS")
    if given:
        yield given, "STEPSTONE_BENCH_COSMOS"
        return
    try:
        import stepstone.stores.cosmos  # noqa: F401
    except ImportError as exc:
        yield None, f"no cosmos store in this stepstone ({exc})"
        return
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from cosmos_emulator import cosmos_emulator
    except ImportError as exc:
        yield None, f"tests/cosmos_emulator.py not importable ({exc})"
        return
    with contextlib.ExitStack() as stack:
        try:
            emu = stack.enter_context(cosmos_emulator())
        except Exception as exc:  # noqa: BLE001 - no emulator, whatever the cause: skip, saying why
            yield None, f"emulator not available ({type(exc).__name__}: {exc})"
            return
        old_key = os.environ.get("AZURE_COSMOS_KEY")
        os.environ["AZURE_COSMOS_KEY"] = emu.key
        stack.callback(_restore_env, "AZURE_COSMOS_KEY", old_key)
        # The emulator's certificate is self-signed: do not verify it, and do not warn
        # once per request that we do not.
        warnings.filterwarnings("ignore", message="Unverified HTTPS request")
        protocol = "http" if emu.endpoint.startswith("http:") else "https"
        config = (
            f"cosmos://{emu.host}:{emu.port}/{database}/{container}"
            f"?protocol={protocol}&verify=false&create=true"
        )
        yield config, f"{emu.kind} emulator ({emu.mode}) at {emu.endpoint}"


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


# --- PostgreSQL and MySQL/MariaDB (SQLServerStore) ----------------------------------------

#: kind -> (environment variable overriding the server URL, default URL). The URL names
#: a database and no table; each benchmark adds ``?table=`` with a fresh table it drops.
SQL_SERVERS: dict[str, tuple[str, str]] = {
    "postgresql": ("STEPSTONE_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    "mysql": ("STEPSTONE_BENCH_MYSQL", "mysql://root@127.0.0.1:3306/test"),
}
SQL_KINDS = tuple(SQL_SERVERS)
#: Every table the benchmarks create starts with this (find leftovers of a killed run).
SQL_TABLE_PREFIX = "stepstone_bench_"
# table name -> server URL it was created on, for the floor (see floor_for).
_SQL_BASES: dict[str, str] = {}


def sql_base(kind: str) -> str:
    """The server URL (no table) for ``kind``: the environment's, else the loopback one."""
    env, default = SQL_SERVERS[kind]
    return os.environ.get(env) or default


def sql_connect(kind: str, base: str, timeout: int = 3) -> Any:
    """A raw DBAPI connection (psycopg / PyMySQL) to ``base``, in autocommit mode.

    Same settings as SQLServerStore's own connections where they matter for cost:
    autocommit (each statement its own transaction) and, on PostgreSQL, no server-side
    prepare (one round trip per statement).
    """
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(base)
    password = (
        unquote(parts.password) if parts.password else os.environ.get("STEPSTONE_SQL_PASSWORD")
    )
    if kind == "postgresql":
        import psycopg

        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": timeout}
        if password and not parts.password:
            kwargs["password"] = password
        conninfo = parts._replace(scheme="postgresql", query="").geturl()
        conn = psycopg.connect(conninfo, **kwargs)
        conn.prepare_threshold = None
        return conn
    import pymysql

    return pymysql.connect(
        host=parts.hostname or "localhost",
        port=parts.port or 3306,
        user=unquote(parts.username or ""),
        password=password or "",
        database=parts.path.lstrip("/"),
        autocommit=True,
        charset="utf8mb4",
        collation="utf8mb4_bin",
        connect_timeout=timeout,
        client_flag=0,
    )


def _where(base: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(base)
    return f"{parts.hostname}:{parts.port or ''}{parts.path}"


@contextlib.contextmanager
def sql_config(kind: str, purpose: str) -> Iterator[tuple[str | None, str]]:
    """Yield (store config naming a fresh table, description), or (None, why not).

    The tables (``<table>``, ``<table>_meta``, the floor's ``<table>_floor``) are dropped
    afterwards whatever happens. The server is ``STEPSTONE_BENCH_POSTGRES`` /
    ``STEPSTONE_BENCH_MYSQL`` if set, else the loopback one (see ``SQL_SERVERS``).
    """
    base = sql_base(kind)
    table = f"{SQL_TABLE_PREFIX}{purpose}_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        conn = sql_connect(kind, base)
    except ImportError as exc:
        extra = "postgres" if kind == "postgresql" else "mysql"
        yield None, f"driver not installed ({exc}); pip install 'stepstone[{extra}]'"
        return
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server skips it, saying why
        detail = " ".join(str(exc).split())
        yield None, f"no server at {_where(base)} ({type(exc).__name__}: {detail})"
        return
    _SQL_BASES[table] = base
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT version()")
            version = str(cursor.fetchone()[0]).split(" on ")[0].split(",")[0]
        sep = "&" if "?" in base else "?"
        yield f"{base}{sep}table={table}", f"{version} at {_where(base)}"
    finally:
        _SQL_BASES.pop(table, None)
        with contextlib.suppress(Exception), conn.cursor() as cursor:
            tables = f"{table}, {table}_meta, {table}_pieces, {table}_floor"
            cursor.execute(f"DROP TABLE IF EXISTS {tables}")
        with contextlib.suppress(Exception):
            conn.close()


class SQLFloor:
    """Raw driver, autocommit: one upsert of the same JSON text, a new version each time.

    PostgreSQL: ``INSERT ... ON CONFLICT (id) DO UPDATE``; MySQL/MariaDB: ``INSERT ...
    ON DUPLICATE KEY UPDATE``, into ``<store table>_floor`` (TEXT / LONGTEXT utf8mb4_bin,
    as the store's document column) in the same database, over a separate connection
    with the store's connection settings. One statement, one round trip, one commit.
    """

    def __init__(self, kind: str, base: str, table: str, text: str) -> None:
        self.kind = kind
        self.table = f"{table}_floor"
        self._text = text
        self._version = 0
        self._conn = sql_connect(kind, base)
        self._cursor = self._conn.cursor()
        if kind == "postgresql":
            self.label = "psycopg INSERT ... ON CONFLICT DO UPDATE, autocommit"
            self._cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} "
                "(id TEXT PRIMARY KEY, version INTEGER NOT NULL, doc TEXT NOT NULL)"
            )
            self._sql = (
                f"INSERT INTO {self.table} (id, version, doc) VALUES ('r', %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET version = excluded.version, doc = excluded.doc"
            )
        else:
            self.label = "pymysql INSERT ... ON DUPLICATE KEY UPDATE, autocommit"
            self._cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} (id VARCHAR(16) PRIMARY KEY, "
                "version INTEGER NOT NULL, doc LONGTEXT NOT NULL) ENGINE=InnoDB "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
            self._sql = (
                f"INSERT INTO {self.table} (id, version, doc) VALUES ('r', %s, %s) "
                "ON DUPLICATE KEY UPDATE version = VALUES(version), doc = VALUES(doc)"
            )
        self.op()

    def op(self) -> None:
        """Upsert the text under one key with a new version number (autocommit)."""
        self._version += 1
        self._cursor.execute(self._sql, (self._version, self._text))

    def close(self) -> None:
        """Drop the floor's table and close its connection."""
        with contextlib.suppress(Exception):
            self._cursor.execute(f"DROP TABLE IF EXISTS {self.table}")
        with contextlib.suppress(Exception):
            self._conn.close()


def floor_for(store: Any, state: Any) -> Any:
    """The floor of ``store`` for ``bench_store(..., floor=floor_for)``: SQL ones included.

    ``stepstone bench`` has no floor for postgresql:// and mysql:// stores; here a store
    opened on a table made by ``sql_config`` gets ``SQLFloor`` (measured interleaved, the
    ratios per round, as for sqlite), and every other store the built-in floor.
    """
    from stepstone import _bench
    from stepstone._codec import encode_state

    base = _SQL_BASES.get(str(getattr(store, "table", "")))
    kind = str(store.scheme)  # the instance's: one SQL class may serve both schemes
    if kind in SQL_KINDS and base is not None:
        text, _ = encode_state(dict(state))
        return SQLFloor(kind, base, store.table, text)
    return _bench.floor_for(store, state)


def state_of_size(nbytes: int, shape: str = "text") -> dict[str, Any]:
    """Return a JSON state of about ``nbytes`` encoded bytes, of one of two shapes.

    ``text`` is ``stepstone._bench.state_of_size`` (one long string: the I/O view, the
    state every peer gets). ``records`` is a list of small records with ints, floats,
    strings and booleans: JSON encoding and decoding cost grow with its size the way a
    real structured state's do (several times the cost of the same bytes of text).
    """
    from stepstone import _bench

    if shape == "text":
        return _bench.state_of_size(nbytes)
    if shape != "records":
        raise ValueError(f"shape must be 'text' or 'records', got {shape!r}")
    items: list[dict[str, Any]] = []
    state: dict[str, Any] = {"meta": {"user": "u-123", "tags": ["a", "b", "c"], "n": 1}}
    state["items"] = items
    size = _json_len(state)
    i = 0
    while True:
        item = {"id": i, "name": f"item-{i:06d}", "price": i * 1.25, "ok": i % 3 == 0}
        item_size = _json_len(item) + 1
        if size + item_size > nbytes:
            break
        items.append(item)
        size += item_size
        i += 1
    state["payload"] = ""
    state["payload"] = "x" * max(0, nbytes - _json_len(state))
    return state


def _json_len(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":")))


# --- agents under an adapter (bench_adapters.py, bench_openai_agents.py) ------------------

#: Agent runs before the measured ones, in each configuration.
AGENT_WARMUP = 5
#: ``seq``: one tool call per model response; ``batch``: all of them in the first one.
AGENT_WORKLOADS = ("seq", "batch")
AGENT_VARIANTS = ("plain", "durable")
#: The two tool counts whose difference gives the slopes.
AGENT_LOW, AGENT_HIGH = 1, 4

#: The figure of one configuration: (variant, workload, tool calls).
AgentKey = tuple[str, str, int]
#: One agent run on a store, as an adapter script builds it.
OneRun = Callable[[Any], Awaitable[object]]
#: Builds the one agent run of (variant, workload, tool calls).
AgentFactory = Callable[[str, str, int], OneRun]


@dataclass(frozen=True)
class AgentBench:
    """An adapter's agent benchmark: what differs between the adapter scripts.

    ``factory`` builds one agent run of a configuration, ``script`` is the script's file
    (run again under callgrind), ``model_unit`` names the per-model figure in the output
    (``model_request`` for pydantic-ai, ``model_call`` for the OpenAI Agents SDK).
    """

    factory: AgentFactory
    script: str
    model_unit: str

    async def runs(
        self, key: AgentKey, n: int, store_url: str, warmup: int = AGENT_WARMUP
    ) -> float:
        """Run the agent ``n`` times (after a warm-up); return the seconds the ``n`` took."""
        from stepstone import open_store

        one = self.factory(*key)
        store = open_store(store_url)
        try:
            started = 0.0
            for i in range(warmup + n):
                if i == warmup:
                    started = time.perf_counter()
                await one(store)
            return time.perf_counter() - started
        finally:
            store.close()

    def callgrind_all(self, n: int, store_url: str) -> dict[AgentKey, float]:
        """Count the instructions of each configuration's ``n`` agent runs, in one process.

        Collection is off except inside ``operator.call`` (C ``_operator_call``, which
        nothing on the measured path calls), and callgrind dumps and zeroes its counters
        each time that call returns: one dump per configuration, imports and warm-ups
        never counted.
        """
        keys = agent_keys()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "cg.out"
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--collect-atstart=no",
                    "--toggle-collect=_operator_call",
                    "--dump-after=_operator_call",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    self.script,
                    "--op",
                    str(n),
                    store_url,
                ],
                check=True,
                capture_output=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )
            dumps = sorted(
                (p for p in Path(tmp).iterdir() if re.fullmatch(r"cg\.out\.\d+", p.name)),
                key=lambda p: int(p.name.rsplit(".", 1)[1]),
            )
            counts = []
            for dump in dumps:
                text = dump.read_text(encoding="utf-8", errors="replace")
                match = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
                assert match is not None, f"no totals in {dump.name}"
                counts.append(int(match.group(1)))
        assert len(counts) == len(keys), f"{len(counts)} callgrind dumps for {len(keys)} figures"
        return {key: count / n for key, count in zip(keys, counts, strict=True)}

    def callgrind_child(self, n: int, store_url: str) -> None:
        """Under callgrind: warm each configuration up, then measure it inside operator.call."""
        for key in agent_keys():
            asyncio.run(self.runs(key, AGENT_WARMUP, store_url, warmup=0))
            operator.call(self._measured, key, n, store_url)

    def _measured(self, key: AgentKey, n: int, store_url: str) -> None:
        asyncio.run(self.runs(key, n, store_url, warmup=0))

    def figures(self, cost: Mapping[AgentKey, float]) -> dict[str, float]:
        """Per-unit figures from the cost of one agent run at each (variant, workload, T)."""
        span = AGENT_HIGH - AGENT_LOW
        model = self.model_unit
        result: dict[str, float] = {}
        for variant in AGENT_VARIANTS:
            tool = (cost[variant, "batch", AGENT_HIGH] - cost[variant, "batch", AGENT_LOW]) / span
            both = (cost[variant, "seq", AGENT_HIGH] - cost[variant, "seq", AGENT_LOW]) / span
            result[f"{variant}_tool_call"] = tool
            result[f"{variant}_{model}"] = both - tool
        for unit in ("tool_call", model):
            result[f"overhead_{unit}"] = result[f"durable_{unit}"] - result[f"plain_{unit}"]
        return result

    def main(self, description: str) -> None:
        """The adapter script's command line: measure, then print the figures."""
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--n", type=int, default=None, help="agent runs per figure")
        parser.add_argument("--repeats", type=int, default=5, help="wall-clock repeats")
        parser.add_argument("--store", default="memory://", help="store config (default memory://)")
        parser.add_argument("--callgrind", action="store_true", help="count instructions")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--op", nargs=2, help=argparse.SUPPRESS)
        args = parser.parse_args()
        if args.op:  # the callgrind child
            self.callgrind_child(int(args.op[0]), args.op[1])
            return
        n: int = args.n or (20 if args.callgrind else 50)
        if args.callgrind:
            cost = self.callgrind_all(n, args.store)
        else:
            cost = {}
            for key in agent_keys():
                seconds = [asyncio.run(self.runs(key, n, args.store)) for _ in range(args.repeats)]
                cost[key] = statistics.median(seconds) / n * 1e6  # us per agent run
        figures = self.figures(cost)
        unit = "instructions" if args.callgrind else "us"
        if args.json:
            print(json.dumps({"unit": unit, "n": n, "store": args.store, **figures}, indent=2))
            return
        print(f"per unit, {unit} ({args.store}, {n} agent runs per figure):")
        for name in (self.model_unit, "tool_call"):
            plain, durable = figures[f"plain_{name}"], figures[f"durable_{name}"]
            print(
                f"  {name:<14} plain {plain:>12,.0f}  durable {durable:>12,.0f}  "
                f"overhead {durable - plain:>12,.0f} ({(durable / plain - 1) * 100:+.0f}%)"
            )


def agent_keys() -> list[AgentKey]:
    """Every configuration, in the order the callgrind child measures them."""
    return [
        (v, w, t) for v in AGENT_VARIANTS for w in AGENT_WORKLOADS for t in (AGENT_LOW, AGENT_HIGH)
    ]
