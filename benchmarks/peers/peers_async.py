"""LangGraph's async savers on bench_async.py's workload, driven over stdin/stdout.

Runs in benchmarks/.venv-peers (never stepstone's venv). ``benchmarks/bench_async.py``
starts one of these per saver and sends it one JSON command per line, interleaving them
with its own measurements round by round; each reply is one JSON line.

    benchmarks/.venv-peers/bin/python benchmarks/peers/peers_async.py --saver sqlite --path X.db
    benchmarks/.venv-peers/bin/python benchmarks/peers/peers_async.py --saver postgres --dsn URL

Savers, at the durability stepstone's stores have by default:
- ``sqlite``: ``AsyncSqliteSaver`` on one ``aiosqlite`` connection; ``setup()`` sets
  ``journal_mode=WAL``, we add ``synchronous=FULL`` (one fsync per commit).
- ``postgres``: ``AsyncPostgresSaver`` on a ``psycopg_pool.AsyncConnectionPool`` of 16
  connections (stepstone's async pool size), autocommit, in a schema of its own that is
  dropped on exit; the server's ``synchronous_commit`` (default ``on``).
Every graph runs with ``durability="sync"``: step n's checkpoint is written before step
n+1 starts, as stepstone does (LangGraph's default, ``"async"``, writes it meanwhile).

Commands: ``{"op": "overhead", "n": N}`` -> seconds per run of N sequential runs and of
N plain runs; ``{"op": "throughput", "n": N, "warm": S, "window": S}`` -> steps/s with N
concurrent runs and the ``aput`` latencies; ``{"op": "quit"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from typing import Any, TypedDict

N_STEPS = 10
INIT = {"payload": "x" * 1000, "meta": {"user": "u-123", "tags": ["a", "b", "c"], "n": 1}}


def key(i: int) -> str:
    return f"k{i}"


class Counter:
    """Step invocations (the throughput count)."""

    def __init__(self) -> None:
        self.steps = 0


COUNT = Counter()


def build_graph() -> Any:
    from langgraph.graph import END, START, StateGraph

    fields: dict[str, Any] = {"payload": str, "meta": dict}
    fields.update({key(i): int for i in range(N_STEPS)})
    S = TypedDict("S", fields, total=False)  # type: ignore[misc]

    def make_node(i: int) -> Any:
        k = key(i)

        async def node(state: Any) -> dict[str, int]:
            COUNT.steps += 1
            return {k: i}

        return node

    b = StateGraph(S)
    for i in range(N_STEPS):
        b.add_node(f"s{i}", make_node(i))
    b.add_edge(START, "s0")
    for i in range(N_STEPS - 1):
        b.add_edge(f"s{i}", f"s{i + 1}")
    b.add_edge(f"s{N_STEPS - 1}", END)
    return b


def _make_plain(i: int) -> Any:
    k = key(i)

    async def f(state: dict[str, Any]) -> dict[str, int]:
        return {k: i}

    return f


PLAIN_FNS = [_make_plain(i) for i in range(N_STEPS)]


async def plain_run() -> dict[str, Any]:
    """The 10 async step functions awaited plainly, merging their updates."""
    state = dict(INIT)
    for f in PLAIN_FNS:
        state.update(await f(state))
    return state


class Saver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.latencies: list[float] = []
        self.recording = False
        self.info: dict[str, Any] = {}

    async def open(self) -> None:
        a = self.args
        if a.saver == "sqlite":
            # These are the peers' venv's (benchmarks/peers/requirements.txt), not stepstone's.
            import aiosqlite  # type: ignore[import-not-found, unused-ignore]
            from langgraph.checkpoint.sqlite.aio import (  # type: ignore[import-not-found, unused-ignore]
                AsyncSqliteSaver,
            )

            self.conn = await aiosqlite.connect(a.path)
            self.saver = AsyncSqliteSaver(self.conn)
            await self.saver.setup()  # sets journal_mode=WAL
            await self.conn.execute("PRAGMA synchronous=FULL")
            cur = await self.conn.execute("PRAGMA journal_mode")
            jm = (await cur.fetchone())[0]
            cur = await self.conn.execute("PRAGMA synchronous")
            sy = (await cur.fetchone())[0]
            self.info = {"journal_mode": jm, "synchronous": {2: "FULL"}.get(sy, sy)}
        else:
            import psycopg
            from langgraph.checkpoint.postgres.aio import (  # type: ignore[import-not-found, unused-ignore]
                AsyncPostgresSaver,
            )
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool  # type: ignore[import-not-found, unused-ignore]

            self.schema = f"stepstone_bench_lg_{uuid.uuid4().hex[:8]}"
            async with await psycopg.AsyncConnection.connect(a.dsn, autocommit=True) as c:
                await c.execute(f"CREATE SCHEMA {self.schema}")
                cur = await c.execute("SELECT current_setting('synchronous_commit')")
                row = await cur.fetchone()
                assert row is not None  # current_setting always answers one row
                self.info = {"synchronous_commit": row[0]}
            self.pool = AsyncConnectionPool(
                a.dsn,
                min_size=1,
                max_size=16,
                open=False,
                kwargs={
                    "autocommit": True,
                    "prepare_threshold": 0,
                    "row_factory": dict_row,
                    "options": f"-c search_path={self.schema}",
                },
            )
            await self.pool.open()
            self.saver = AsyncPostgresSaver(self.pool)
            await self.saver.setup()
        orig = self.saver.aput

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = await orig(*args, **kwargs)
            if self.recording:
                self.latencies.append(time.perf_counter() - t0)
            return result

        self.saver.aput = timed  # type: ignore[method-assign, unused-ignore]
        self.graph = build_graph().compile(checkpointer=self.saver)
        out = await self.run_one()
        state = await self.graph.aget_state({"configurable": {"thread_id": out}})
        assert state.values[key(N_STEPS - 1)] == N_STEPS - 1, state.values

    async def run_one(self) -> str:
        rid = uuid.uuid4().hex
        out = await self.graph.ainvoke(
            dict(INIT), {"configurable": {"thread_id": rid}}, durability="sync"
        )
        assert out[key(N_STEPS - 1)] == N_STEPS - 1
        return rid

    async def close(self) -> None:
        if self.args.saver == "sqlite":
            await self.conn.close()
        else:
            import psycopg

            await self.pool.close()
            async with await psycopg.AsyncConnection.connect(self.args.dsn, autocommit=True) as c:
                await c.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")

    async def overhead(self, n: int) -> dict[str, float]:
        t0 = time.perf_counter()
        for _ in range(n):
            await self.run_one()
        run = (time.perf_counter() - t0) / n
        m = max(n * 100, 1000)
        t0 = time.perf_counter()
        for _ in range(m):
            await plain_run()
        plain = (time.perf_counter() - t0) / m
        return {"run_s": run, "plain_s": plain}

    async def throughput(self, n: int, warm: float, window: float) -> dict[str, Any]:
        stop = False

        async def worker() -> None:
            while not stop:
                await self.run_one()

        start = COUNT.steps
        tasks = [asyncio.ensure_future(worker()) for _ in range(n)]
        # Warm up until every run is past its start (at least n steps done), so the
        # window sees the steady state, not 1,000 runs all loading at once.
        t_warm = time.perf_counter()
        await asyncio.sleep(warm)
        # A poll, not an Event: the counter is bumped by every step of every run.
        while COUNT.steps - start < n and time.perf_counter() - t_warm < 30:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        self.latencies = []
        self.recording = True
        c0, t0 = COUNT.steps, time.perf_counter()
        await asyncio.sleep(window)
        steps, elapsed = COUNT.steps - c0, time.perf_counter() - t0
        self.recording, stop = False, True
        lat = self.latencies
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        errors = [t.exception() for t in tasks if not t.cancelled() and t.exception()]
        if errors:
            raise errors[0]  # type: ignore[misc]
        return {"steps_per_s": steps / elapsed, "save_latencies_s": sorted(lat)}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--saver", choices=("sqlite", "postgres"), required=True)
    p.add_argument("--path")
    p.add_argument("--dsn")
    args = p.parse_args()
    saver = Saver(args)
    try:
        await saver.open()
    except Exception as exc:  # noqa: BLE001 - the parent skips this peer, saying why
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    from importlib.metadata import version

    dist = "langgraph-checkpoint-" + ("sqlite" if args.saver == "sqlite" else "postgres")
    saver.info["versions"] = f"langgraph {version('langgraph')}, {dist} {version(dist)}"
    print(json.dumps({"ready": saver.info}), flush=True)
    try:
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "overhead":
                reply = await saver.overhead(cmd["n"])
            else:
                reply = await saver.throughput(cmd["n"], cmd["warm"], cmd["window"])
            print(json.dumps(reply), flush=True)
    finally:
        await saver.close()


if __name__ == "__main__":
    asyncio.run(main())
