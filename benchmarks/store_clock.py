"""One clock per store (``_store_time``): what reading the store's clock costs.

    python benchmarks/store_clock.py [--n 2000] [--backends memory,sqlite,postgresql,mysql]

Per backend: a reading from the kept one (what an acquisition or a schedule look
pays, microseconds), and a fresh reading of the server's clock (``Store.server_now``,
one round trip, paid once a minute per process), with its round trip's half (the
error bound of the readings kept). ``docs/flow-control.md`` quotes a run of it.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from stepstone import open_store
from stepstone._store_time import forget, store_now

SERVERS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


def _config(kind: str, table: str) -> str:
    if kind == "memory":
        return f"memory://clock-{table}"
    if kind == "sqlite":
        return f"sqlite:////tmp/clock-{table}.db"
    return f"{SERVERS[kind]}?table={table}"


def _drop(kind: str, table: str) -> None:
    names = ", ".join(f"{table}{suffix}" for suffix in ("", "_meta", "_pieces"))
    if kind == "postgresql":
        import psycopg

        with psycopg.connect(SERVERS[kind], autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {names}")
    elif kind == "mysql":
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", user="root", database="test")
        with conn.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {names}")
        conn.close()
    elif kind == "sqlite":
        import os

        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(f"/tmp/clock-{table}.db{suffix}"):
                os.remove(f"/tmp/clock-{table}.db{suffix}")


def measure(kind: str, n: int) -> tuple[float, float]:
    """Return (µs per kept reading, µs per fresh reading) on a new store of ``kind``."""
    table = f"t_{uuid.uuid4().hex}"
    try:
        with open_store(_config(kind, table)) as store:
            store.load("warm-up")
            store_now(store)
            began = time.perf_counter()
            for _ in range(n):
                store_now(store)
            kept = (time.perf_counter() - began) / n * 1e6
            fresh = []
            for _ in range(max(1, n // 20)):
                forget(store)
                began = time.perf_counter()
                store_now(store)
                fresh.append(time.perf_counter() - began)
            return kept, statistics.median(fresh) * 1e6
    finally:
        _drop(kind, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--backends", default="memory,sqlite,postgresql,mysql")
    args = parser.parse_args()
    for kind in args.backends.split(","):
        kept, fresh = measure(kind, args.n)
        if kind in SERVERS:
            what = (
                f"fresh reading {fresh:6.1f} us (a kept one is off by at most {fresh / 2:.0f} us)"
            )
        else:
            what = "no server: the host's clock, never off"
        print(f"{kind:>10}: kept reading {kept:5.2f} us; {what}")


if __name__ == "__main__":
    main()
