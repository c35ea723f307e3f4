#!/usr/bin/env python3
"""Per-step checkpoint overhead of peer durable-execution libraries.

Same workload for every peer: a workflow of 10 trivial steps, each adding one
small key to a state that starts at ~1 KB of JSON-able data. One new
thread/app/workflow id per run.

    per-step overhead = (time per run with the peer - time per run of 10 plain
                         function calls doing the same dict update) / 10

Configs per peer:
  default  - the peer's own defaults (whatever journal mode / synchronous /
             durability mode it picks; the effective pragmas are reported).
  matched  - SQLite journal_mode=WAL + synchronous=FULL, set on the connection
             the peer actually uses, and the peer told to persist each step
             before the next one starts (only LangGraph needs a flag for that:
             durability="sync").
  nopersist - (LangGraph and Burr only, context row) the same graph with no
             checkpointer/persister: the framework's own orchestration cost.

Every (system, config) runs in its own subprocess (DBOS is a process-wide
singleton, and this keeps imports/caches from leaking between peers).

Run with the peers venv:  benchmarks/.venv-peers/bin/python benchmarks/peers/peers.py
  --quick      ~20 s total
  --json       machine-readable lines only
  --verify     also count SQL statements / commits / fsyncs per step (strace)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any, TypedDict

#: A workflow's state: JSON-able data.
State = dict[str, Any]
#: Called with each SQL statement a peer's connection runs (the trace mode), or None.
TraceCallback = Callable[[str], None] | None
#: What a peer's set-up returns: run(run_id), verify(run_id), notes, close().
Setup = tuple[
    Callable[[str], None], Callable[[str], dict[str, Any]], dict[str, Any], Callable[[], None]
]

N_STEPS = 10
HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_DIR = os.path.dirname(HERE)

SYSTEMS = {
    "langgraph": ["default", "matched", "nopersist"],
    "burr": ["default", "matched", "nopersist"],
    "dbos": ["default", "matched"],
    # not a peer: the floor for "json.dumps(state) + 1 upsert + 1 commit per step"
    "raw-sqlite": ["default", "matched"],
}


def initial_state() -> State:
    # ~1 KB once JSON-encoded.
    return {
        "payload": "x" * 1000,
        "meta": {"user": "u-123", "tags": ["a", "b", "c"], "n": 1},
    }


def key(i: int) -> str:
    return f"k{i}"


# --------------------------------------------------------------------------
# plain baseline: 10 plain function calls doing the same state update
# --------------------------------------------------------------------------


def _make_plain(i: int) -> Callable[[State], State]:
    k = key(i)

    def f(state: State) -> State:
        s = dict(state)
        s[k] = i
        return s

    return f


PLAIN_FNS = [_make_plain(i) for i in range(N_STEPS)]


def plain_run(state: State) -> State:
    for f in PLAIN_FNS:
        state = f(state)
    return state


def measure_plain(target_s: float) -> float:
    """Seconds per run of 10 plain calls (min over 5 batches; it is tiny)."""
    init = initial_state()
    n = 2000
    best = float("inf")
    deadline = time.perf_counter() + max(0.05, target_s)
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            plain_run(init)
        best = min(best, (time.perf_counter() - t0) / n)
        if time.perf_counter() > deadline:
            break
    return best


# --------------------------------------------------------------------------
# pragma helpers
# --------------------------------------------------------------------------


def set_matched_pragmas(conn: sqlite3.Connection) -> None:
    # journal_mode=WAL is persistent in the file; synchronous is per connection.
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode.lower() == "wal", mode
    conn.execute("PRAGMA synchronous=FULL")


def read_pragmas(conn: sqlite3.Connection) -> dict[str, Any]:
    sync_names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    jm = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sy = conn.execute("PRAGMA synchronous").fetchone()[0]
    return {"journal_mode": jm, "synchronous": sync_names.get(sy, sy)}


# --------------------------------------------------------------------------
# peers. Each factory returns (run(run_id), verify(run_id) -> dict, info dict,
# close()).
# --------------------------------------------------------------------------


def setup_langgraph(config: str, dbdir: str, trace_cb: TraceCallback = None) -> Setup:
    # The peers' venv has langgraph-checkpoint-sqlite; stepstone's own venv need not.
    from langgraph.checkpoint.sqlite import SqliteSaver  # type: ignore[import-not-found, unused-ignore]
    from langgraph.graph import END, START, StateGraph

    fields: dict[str, type] = {"payload": str, "meta": dict}
    fields.update({key(i): int for i in range(N_STEPS)})
    # Built at run time from N_STEPS, so the static checker cannot see its keys.
    make_typed_dict: Any = TypedDict
    S = make_typed_dict("S", fields, total=False)

    def make_node(i: int) -> Callable[[State], State]:
        k = key(i)

        def node(state: State) -> State:
            return {k: i}  # LangGraph merges the update into the state

        return node

    b: Any = StateGraph(S)
    for i in range(N_STEPS):
        b.add_node(f"s{i}", make_node(i))
    b.add_edge(START, "s0")
    for i in range(N_STEPS - 1):
        b.add_edge(f"s{i}", f"s{i + 1}")
    b.add_edge(f"s{N_STEPS - 1}", END)

    info: dict[str, Any] = {}
    if config == "nopersist":
        bare = b.compile()
        init = initial_state()

        def run_bare(rid: str) -> None:
            out = bare.invoke(init)
            assert out[key(N_STEPS - 1)] == N_STEPS - 1

        return run_bare, (lambda rid: {"checkpointer": None}), info, (lambda: None)

    path = os.path.join(dbdir, "langgraph.sqlite")
    conn = sqlite3.connect(path, check_same_thread=False)
    if trace_cb:
        conn.set_trace_callback(trace_cb)
    saver = SqliteSaver(conn)
    saver.setup()  # SqliteSaver.setup() itself runs PRAGMA journal_mode=WAL
    if config == "matched":
        set_matched_pragmas(conn)
        durability = "sync"
    else:
        durability = None  # library default ("async")
    info["pragmas"] = read_pragmas(conn)
    info["durability"] = durability or "async (default)"
    graph = b.compile(checkpointer=saver)
    init = initial_state()

    def run(rid: str) -> None:
        cfg = {"configurable": {"thread_id": rid}}
        if durability:
            out = graph.invoke(init, cfg, durability=durability)
        else:
            out = graph.invoke(init, cfg)
        assert out[key(N_STEPS - 1)] == N_STEPS - 1

    def verify(rid: str) -> dict[str, Any]:
        c2 = sqlite3.connect(path)
        n_ck = c2.execute("SELECT count(*) FROM checkpoints WHERE thread_id=?", (rid,)).fetchone()[
            0
        ]
        n_wr = c2.execute("SELECT count(*) FROM writes WHERE thread_id=?", (rid,)).fetchone()[0]
        sizes = [
            r[0]
            for r in c2.execute(
                "SELECT length(checkpoint) FROM checkpoints WHERE thread_id=?", (rid,)
            )
        ]
        c2.close()
        # latest state, read back through the library
        st = graph.get_state({"configurable": {"thread_id": rid}})
        ok = st.values.get(key(N_STEPS - 1)) == N_STEPS - 1 and len(st.values["payload"]) == 1000
        return {
            "checkpoint_rows": n_ck,
            "write_rows": n_wr,
            "checkpoint_blob_bytes_max": max(sizes) if sizes else 0,
            "state_readback_ok": ok,
            "ok": ok and n_ck >= N_STEPS,
        }

    return run, verify, info, conn.close


def setup_burr(config: str, dbdir: str, trace_cb: TraceCallback = None) -> Setup:
    # Burr is installed in the peers' venv only.
    from burr.core import (  # type: ignore[import-not-found, unused-ignore]
        ApplicationBuilder,
        action,
    )
    from burr.core import State as BurrState  # type: ignore[import-not-found, unused-ignore]
    from burr.core.graph import GraphBuilder  # type: ignore[import-not-found, unused-ignore]
    from burr.core.persistence import (  # type: ignore[import-not-found, unused-ignore]
        SQLitePersister,
    )

    def make_action(i: int) -> Any:
        k = key(i)

        @action(reads=[], writes=[k])  # type: ignore[untyped-decorator, unused-ignore]
        def step(state: BurrState) -> BurrState:
            return state.update(**{k: i})

        return step

    gb = GraphBuilder().with_actions(**{f"s{i}": make_action(i) for i in range(N_STEPS)})
    gb = gb.with_transitions(*[(f"s{i}", f"s{i + 1}") for i in range(N_STEPS - 1)])
    graph = gb.build()
    init = initial_state()
    info: dict[str, Any] = {}
    last = f"s{N_STEPS - 1}"

    persister = None
    path = os.path.join(dbdir, "burr.sqlite")
    if config != "nopersist":
        conn = sqlite3.connect(path)
        if trace_cb:
            conn.set_trace_callback(trace_cb)
        if config == "matched":
            set_matched_pragmas(conn)
        # Pass our own connection so the pragmas are on the connection Burr uses.
        persister = SQLitePersister(db_path=path, table_name="burr_state", connection=conn)
        persister.initialize()
        info["pragmas"] = read_pragmas(conn)

    def run(rid: str) -> None:
        ab = (
            ApplicationBuilder()
            .with_graph(graph)
            .with_entrypoint("s0")
            .with_state(**init)
            .with_identifiers(app_id=rid)
        )
        if persister is not None:
            ab = ab.with_state_persister(persister)
        app = ab.build()
        _, _, state = app.run(halt_after=[last])
        assert state[key(N_STEPS - 1)] == N_STEPS - 1

    def verify(rid: str) -> dict[str, Any]:
        if persister is None:
            return {"persister": None}
        c2 = sqlite3.connect(path)
        rows = c2.execute(
            "SELECT sequence_id, position, length(state) FROM burr_state"
            " WHERE app_id=? ORDER BY sequence_id",
            (rid,),
        ).fetchall()
        c2.close()
        loaded = persister.load("", rid)
        ok = (
            len(rows) == N_STEPS
            and loaded is not None
            and loaded["state"][key(N_STEPS - 1)] == N_STEPS - 1
            and loaded["position"] == last
        )
        return {
            "state_rows": len(rows),
            "positions": [*[r[1] for r in rows][:3], "..."],
            "state_json_bytes_max": max(r[2] for r in rows) if rows else 0,
            "state_readback_ok": ok,
            "ok": ok,
        }

    def close() -> None:
        if persister is not None:
            persister.connection.close()

    return run, verify, info, close


def setup_dbos(config: str, dbdir: str, trace_cb: TraceCallback = None) -> Setup:
    import logging

    import sqlalchemy as sa
    from sqlalchemy import event

    path = os.path.join(dbdir, "dbos.sqlite")

    # Process-wide listener: runs on every new DBAPI connection of every engine,
    # i.e. on the connections of the engine DBOS creates for its system DB.
    @event.listens_for(sa.engine.Engine, "connect")
    def _on_connect(dbapi_conn: Any, rec: Any) -> None:
        if not isinstance(dbapi_conn, sqlite3.Connection):
            return
        if config == "matched":
            set_matched_pragmas(dbapi_conn)
        if trace_cb:
            dbapi_conn.set_trace_callback(trace_cb)

    # DBOS is installed in the peers' venv only.
    from dbos import DBOS, SetWorkflowID  # type: ignore[import-not-found, unused-ignore]

    logging.getLogger("dbos").setLevel(logging.WARNING)

    def make_step(i: int) -> Any:
        k = key(i)

        @DBOS.step(name=f"s{i}")  # type: ignore[untyped-decorator, unused-ignore]
        def step(state: State) -> State:
            s = dict(state)
            s[k] = i
            return s  # DBOS records the step's return value

        return step

    steps = [make_step(i) for i in range(N_STEPS)]

    @DBOS.workflow(name="peers_wf")  # type: ignore[untyped-decorator, unused-ignore]
    def wf(state: State) -> State:
        for st in steps:
            state = st(state)
        return state

    DBOS(
        config={
            "name": "peers-bench",
            "system_database_url": f"sqlite:///{path}",
            "run_admin_server": False,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    from dbos import _dbos as dbos_mod

    # The only way to the connection DBOS opened, to report the pragmas it runs with.
    engine = dbos_mod._dbos_global_instance._sys_db.engine  # noqa: SLF001
    with engine.connect() as c:
        raw = c.connection.driver_connection
        info = {"pragmas": read_pragmas(raw)}
    init = initial_state()

    def run(rid: str) -> None:
        with SetWorkflowID(rid):
            out = wf(init)
        assert out[key(N_STEPS - 1)] == N_STEPS - 1

    def verify(rid: str) -> dict[str, Any]:
        c2 = sqlite3.connect(path)
        n_ops = c2.execute(
            "SELECT count(*) FROM operation_outputs WHERE workflow_uuid=?", (rid,)
        ).fetchone()[0]
        names = [
            r[0]
            for r in c2.execute(
                "SELECT function_name FROM operation_outputs"
                " WHERE workflow_uuid=? ORDER BY function_id",
                (rid,),
            )
        ]
        out_max = c2.execute(
            "SELECT max(length(output)) FROM operation_outputs WHERE workflow_uuid=?", (rid,)
        ).fetchone()[0]
        status = c2.execute(
            "SELECT status FROM workflow_status WHERE workflow_uuid=?", (rid,)
        ).fetchone()
        c2.close()
        steps_info = DBOS.list_workflow_steps(rid)
        ok = (
            n_ops == N_STEPS
            and status is not None
            and status[0] == "SUCCESS"
            and len(steps_info) == N_STEPS
        )
        return {
            "operation_output_rows": n_ops,
            "step_names": [*names[:3], "..."],
            "output_bytes_max": out_max,
            "workflow_status": status[0] if status else None,
            "ok": ok,
        }

    def close() -> None:
        DBOS.destroy(destroy_registry=True)

    return run, verify, info, close


def setup_raw_sqlite(config: str, dbdir: str, trace_cb: TraceCallback = None) -> Setup:
    """Reference floor, not a peer: per step, json.dumps the whole state and
    INSERT OR REPLACE it into one row keyed by run id, then COMMIT (1 commit/step)."""
    path = os.path.join(dbdir, "raw.sqlite")
    conn = sqlite3.connect(path)
    if trace_cb:
        conn.set_trace_callback(trace_cb)
    if config == "matched":
        set_matched_pragmas(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, step INTEGER, state TEXT)")
    conn.commit()
    info = {"pragmas": read_pragmas(conn)}
    init = initial_state()

    def run(rid: str) -> None:
        state = init
        for i, f in enumerate(PLAIN_FNS):
            state = f(state)
            conn.execute(
                "INSERT OR REPLACE INTO runs VALUES (?, ?, ?)", (rid, i, json.dumps(state))
            )
            conn.commit()

    def verify(rid: str) -> dict[str, Any]:
        row = conn.execute("SELECT step, state FROM runs WHERE id=?", (rid,)).fetchone()
        ok = (
            row is not None
            and row[0] == N_STEPS - 1
            and json.loads(row[1])[key(N_STEPS - 1)] == N_STEPS - 1
        )
        return {"ok": ok}

    return run, verify, info, conn.close


SETUP: dict[str, Callable[[str, str, TraceCallback], Setup]] = {
    "langgraph": setup_langgraph,
    "burr": setup_burr,
    "dbos": setup_dbos,
    "raw-sqlite": setup_raw_sqlite,
}


def peer_version(system: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    pkgs = {
        "langgraph": ["langgraph", "langgraph-checkpoint-sqlite"],
        "burr": ["apache-burr"],
        "dbos": ["dbos"],
        "raw-sqlite": [],
    }[system]
    out = []
    for p in pkgs:
        try:
            out.append(f"{p}=={version(p)}")
        except PackageNotFoundError:
            out.append(f"{p}==?")
    return ", ".join(out)


# --------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------

MARK_START = "/__peers_bench_mark_start__"
MARK_END = "/__peers_bench_mark_end__"


def worker(args: argparse.Namespace) -> None:
    dbdir = tempfile.mkdtemp(prefix=f"{args.system}-{args.config}-", dir=args.tmpdir)
    counts: dict[str, int] = {}

    def trace_cb(sql: str) -> None:
        verb = sql.strip().split(None, 1)[0].upper() if sql.strip() else "?"
        counts[verb] = counts.get(verb, 0) + 1

    try:
        run, verify, info, close = SETUP[args.system](
            args.config, dbdir, trace_cb if args.mode == "trace" else None
        )
        try:
            # verification run
            rid = f"verify-{uuid.uuid4()}"
            run(rid)
            ver = verify(rid)
            # warm-up + calibration
            # (estimate from the second half of the warm-up: first runs are slower)
            t0 = time.perf_counter()
            times: list[float] = []
            while len(times) < 6 or (time.perf_counter() - t0 < 0.3 and len(times) < 400):
                t1 = time.perf_counter()
                run(f"warm-{uuid.uuid4()}")
                times.append(time.perf_counter() - t1)
            per_run_est = statistics.median(times[len(times) // 2 :])

            if args.mode == "trace":
                counts.clear()
                n = args.trace_runs
                os.access(MARK_START, os.F_OK)
                for _ in range(n):
                    run(f"trace-{uuid.uuid4()}")
                os.access(MARK_END, os.F_OK)
                res = {
                    "system": args.system,
                    "config": args.config,
                    "runs": n,
                    "statements_per_step": {
                        k: round(v / (n * N_STEPS), 2) for k, v in sorted(counts.items())
                    },
                }
                print("RESULT " + json.dumps(res), flush=True)
                return

            runs = max(10, int(args.target_s / per_run_est))
            plain = measure_plain(min(0.2, args.target_s))
            ready = {
                "system": args.system,
                "config": args.config,
                "runs_per_repeat": runs,
                "plain_per_run_s": plain,
                "versions": peer_version(args.system),
                "sqlite": sqlite3.sqlite_version,
                **info,
                "verify": ver,
            }
            print("READY " + json.dumps(ready), flush=True)
            # Serve repeats on demand so the parent can interleave all configs.
            for line in sys.stdin:
                if line.strip() != "run":
                    break
                t0 = time.perf_counter()
                for _ in range(runs):
                    run(str(uuid.uuid4()))
                print(f"REP {(time.perf_counter() - t0) / runs!r}", flush=True)
        finally:
            close()
    finally:
        shutil.rmtree(dbdir, ignore_errors=True)


# --------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------


def fstype_of(path: str) -> tuple[str, str]:
    path = os.path.realpath(path)
    best = ("", "?")
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            mnt, fst = parts[1], parts[2]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, fst)
    return best


def pick_tmpdir(explicit: str | None) -> str:
    if explicit:
        os.makedirs(explicit, exist_ok=True)
        return explicit
    base = tempfile.gettempdir()
    _, fst = fstype_of(base)
    same_dev = os.stat(base).st_dev == os.stat(BENCH_DIR).st_dev
    if fst in ("tmpfs", "ramfs") or not same_dev:
        d = os.path.join(BENCH_DIR, ".tmp")
        os.makedirs(d, exist_ok=True)
        return d
    return base


def run_worker(
    system: str,
    config: str,
    args: argparse.Namespace,
    tmpdir: str,
    mode: str = "bench",
    strace_out: str | None = None,
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        system,
        config,
        "--tmpdir",
        tmpdir,
        "--mode",
        mode,
        "--repeats",
        str(args.repeats),
        "--target-s",
        str(args.target_s),
        "--trace-runs",
        str(args.trace_runs),
    ]
    if strace_out:
        cmd = [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,access,faccessat,faccessat2",
            "-o",
            strace_out,
            *cmd,
        ]
    # No check: a failed worker's output is the result, an error the report shows.
    p = subprocess.run(  # noqa: PLW1510
        cmd, capture_output=True, text=True, env=worker_env(), timeout=600
    )
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            found: dict[str, Any] = json.loads(line[7:])
            return found
    return {"system": system, "config": config, "error": (p.stderr or p.stdout)[-2000:]}


class Worker:
    """A long-lived bench worker: set up once, then one repeat per `run` command."""

    def __init__(self, system: str, config: str, args: argparse.Namespace, tmpdir: str) -> None:
        self.system, self.config = system, config
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            system,
            config,
            "--tmpdir",
            tmpdir,
            "--mode",
            "bench",
            "--target-s",
            str(args.target_s),
        ]
        # Open for the worker's life; closed in close().
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.p = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=worker_env(),
        )
        self.ready = self._expect("READY ")
        self.per_run: list[float] = []

    def _expect(self, prefix: str) -> Any:
        assert self.p.stdout is not None  # opened as a pipe above
        while True:
            line = self.p.stdout.readline()
            if not line:
                self.stderr.seek(0)
                raise RuntimeError(self.stderr.read()[-2000:] or "worker exited")
            if line.startswith(prefix):
                return json.loads(line[len(prefix) :])

    def repeat(self) -> None:
        assert self.p.stdin is not None  # opened as a pipe above
        self.p.stdin.write("run\n")
        self.p.stdin.flush()
        self.per_run.append(float(self._expect("REP ")))

    def close(self) -> None:
        try:
            assert self.p.stdin is not None  # opened as a pipe above
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            self.p.wait(timeout=60)
        except Exception:  # noqa: BLE001 - a worker that will not quit is killed
            self.p.kill()
            self.p.wait()
        finally:
            self.stderr.close()

    def result(self) -> dict[str, Any]:
        r = dict(self.ready)
        plain = r.pop("plain_per_run_s")
        per_step_us = sorted((pr - plain) / N_STEPS * 1e6 for pr in self.per_run)
        q = (
            statistics.quantiles(per_step_us, n=4, method="inclusive")
            if len(per_step_us) >= 2
            else [per_step_us[0]] * 3
        )
        return {
            "system": self.system,
            "config": self.config,
            "per_step_us_median": round(statistics.median(per_step_us), 1),
            "per_step_us_min": round(per_step_us[0], 1),
            "per_step_us_max": round(per_step_us[-1], 1),
            "repeats": len(per_step_us),
            "per_step_us_iqr": [round(q[0], 1), round(q[2], 1)],
            "per_run_us_median": round(statistics.median(self.per_run) * 1e6, 1),
            "plain_per_run_us": round(plain * 1e6, 2),
            **r,
        }


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("LANGSMITH_TRACING", "false")
    return env


def count_fsyncs(strace_out: str) -> int | None:
    inside = False
    n = 0
    seen_end = False
    with open(strace_out) as f:
        for line in f:
            if MARK_START in line:
                inside = True
            elif MARK_END in line:
                inside, seen_end = False, True
            elif inside and ("fsync(" in line or "fdatasync(" in line):
                n += 1
    return n if seen_end else None


Pair = tuple[str, str]


def parse_args() -> argparse.Namespace:
    """The command line, with --repeats and --target-s filled in from --quick."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="~20 s: 3 repeats x ~0.15 s (default: 5 x ~1.5 s)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON line per config")
    ap.add_argument(
        "--verify",
        action="store_true",
        help="also count SQL statements and (with strace) fsyncs per step",
    )
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma list: " + ",".join(SYSTEMS))
    ap.add_argument("--configs", default="default,matched,nopersist")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--target-s", type=float, default=None, help="seconds per repeat")
    ap.add_argument("--trace-runs", type=int, default=20)
    ap.add_argument("--tmpdir", default=None)
    # internal
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "CONFIG"))
    ap.add_argument("--mode", default="bench", choices=["bench", "trace"])
    args = ap.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.target_s is None:
        args.target_s = 0.15 if args.quick else 1.5
    return args


def bench_all(
    pairs: list[Pair], args: argparse.Namespace, tmpdir: str
) -> dict[Pair, dict[str, Any]]:
    """Every (system, config)'s result, its repeats interleaved with the others'."""
    # 1. start every worker (one at a time: setup + verify + warm-up + calibration)
    workers: list[Worker] = []
    results: dict[Pair, dict[str, Any]] = {}
    for system, config in pairs:
        try:
            workers.append(Worker(system, config, args, tmpdir))
        except Exception as e:  # noqa: BLE001 - report and go on with the others
            results[(system, config)] = {"system": system, "config": config, "error": str(e)}
    # 2. repeats interleaved round-robin, so a burst of outside load is spread
    #    over all configs instead of landing on one
    try:
        for _ in range(args.repeats):
            for w in workers:
                w.repeat()
    finally:
        for w in workers:
            w.close()
    for w in workers:
        results[(w.system, w.config)] = w.result()
    return results


def verify_all(results: dict[Pair, dict[str, Any]], args: argparse.Namespace, tmpdir: str) -> None:
    """Add statements and fsyncs per step to each result (separate short processes)."""
    have_strace = shutil.which("strace") is not None
    for (system, config), r in results.items():
        if config == "nopersist" or "error" in r:
            continue
        t = run_worker(system, config, args, tmpdir, mode="trace")
        r["statements_per_step"] = t.get("statements_per_step", t.get("error"))
        if have_strace:
            so = os.path.join(tmpdir, f"strace-{system}-{config}-{os.getpid()}.txt")
            try:
                run_worker(system, config, args, tmpdir, mode="trace", strace_out=so)
                nf = count_fsyncs(so)
                r["fsyncs_per_step"] = (
                    None if nf is None else round(nf / (args.trace_runs * N_STEPS), 2)
                )
            finally:
                if os.path.exists(so):
                    os.remove(so)


def notes_of(r: dict[str, Any]) -> list[str]:
    """The notes column of a result's row: pragmas, durability, verification, counts."""
    notes = []
    if "pragmas" in r:
        notes.append(f"{r['pragmas']['journal_mode']}/{r['pragmas']['synchronous']}")
    if "durability" in r:
        notes.append(f"durability={r['durability']}")
    shown = ("checkpoint_rows", "write_rows", "state_rows", "operation_output_rows", "ok")
    v = {k: val for k, val in r["verify"].items() if k in shown}
    if v:
        notes.append("verify " + ",".join(f"{k}={val}" for k, val in v.items()))
    if "statements_per_step" in r:
        notes.append(f"stmts/step={r['statements_per_step']}")
    if "fsyncs_per_step" in r:
        notes.append(f"fsyncs/step={r['fsyncs_per_step']}")
    return notes


def report(
    pairs: list[Pair],
    results: dict[Pair, dict[str, Any]],
    args: argparse.Namespace,
    loads: tuple[float, float],
) -> bool:
    """Print a row (or a JSON line) per result; return whether every one verified."""
    all_ok = True
    for key_ in pairs:
        r = results[key_]
        system, config = key_
        if "error" in r:
            all_ok = False
            print(json.dumps(r) if args.json else f"{system:<10} {config:<10} ERROR: {r['error']}")
            continue
        if not r["verify"].get("ok", True):
            all_ok = False
        r["loadavg_1m"] = [round(loads[0], 2), round(loads[1], 2)]
        if args.json:
            print(json.dumps(r), flush=True)
            continue
        iqr = f"[{r['per_step_us_iqr'][0]:.0f}, {r['per_step_us_iqr'][1]:.0f}]"
        print(
            f"{system:<10} {config:<10} {r['per_step_us_median']:>9.1f} "
            f"{r['per_step_us_min']:>9.1f} "
            f"{r['per_step_us_max']:>9.1f} {iqr:>17} {r['per_run_us_median']:>10.0f} "
            f"{r['runs_per_repeat']:>5}  {'; '.join(notes_of(r))}",
            flush=True,
        )
    return all_ok


def main() -> None:
    args = parse_args()
    if args.worker:
        args.system, args.config = args.worker
        worker(args)
        return

    tmpdir = pick_tmpdir(args.tmpdir)
    mnt, fst = fstype_of(tmpdir)
    if not args.json:
        print(
            f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
            f"db dir {tmpdir} ({fst} on {mnt}), {os.cpu_count()} cpus, "
            f"{args.repeats} repeats x ~{args.target_s}s, {N_STEPS} steps/run"
        )
        print(
            f"{'system':<10} {'config':<10} {'median':>9} {'min':>9} {'max':>9} "
            f"{'IQR':>17} {'per run':>10} {'runs':>5}  pragmas / notes"
        )
    wanted = set(args.configs.split(","))
    pairs = [(sy, c) for sy in args.systems.split(",") for c in SYSTEMS[sy] if c in wanted]
    load_start = os.getloadavg()
    results = bench_all(pairs, args, tmpdir)
    load_end = os.getloadavg()
    # optional: statements and fsyncs per step (separate short processes)
    if args.verify:
        verify_all(results, args, tmpdir)
    all_ok = report(pairs, results, args, (load_start[0], load_end[0]))
    if not args.json:
        print(
            "per-step overhead in microseconds = (per-run time - plain 10 calls) / 10; "
            "per run = median microseconds per whole run; repeats interleaved round-robin"
        )
        busy = max(load_start[0], load_end[0])
        warning = (
            f"  WARNING: other load on this {os.cpu_count()}-cpu machine; numbers are "
            "inflated, trust min more than median"
        )
        print(
            f"1-min load average at start/end: {load_start[0]:.2f}/{load_end[0]:.2f}"
            + (warning if busy > 0.75 * (os.cpu_count() or 1) else "")
        )
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
