"""Driver for benchmarks/callgrind.sh: do one kind of operation N times after a warm-up.

    python benchmarks/_callgrind_driver.py MODE N DIR

Modes: ``memory``, ``sqlite`` (``?synchronous=full``), ``file`` (fsync per save): N saves
of the ~1 KB checkpoint over its previous version (a new ``Checkpoint`` each time, as
``stepstone bench`` does); ``sqlite-floor`` / ``file-floor``: N operations of the floor
``stepstone bench`` compares with (raw sqlite3 upsert + commit; write + fsync + rename +
fsync(dir)); ``run-memory``: N 10-step ``run`` calls on the memory store (new run id
each); ``plain``: the same 10 step functions called N times without stepstone;
``build``: only the ``Checkpoint`` each save mode builds before calling ``save``
(subtract it for ``store.save`` alone); ``emit`` / ``emit-none``: a step emitting N
token events to the memory store / the same loop without them (issue 34).
callgrind.sh runs each mode with N and 2N and divides the difference by N, so start-up,
imports and the warm-up cancel out.
"""

from __future__ import annotations

import sys
from typing import Any

from stepstone import open_store, run
from stepstone._bench_workload import bench_checkpoint, make_steps, plain_of, state_of_size
from stepstone._codec import encode_state

WARMUP = 50


def main() -> None:
    mode, n, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    payload = state_of_size(1024)
    steps = make_steps(payload)
    plain = plain_of(steps)
    full_state: dict[str, Any] = plain()
    if mode in ("memory", "sqlite", "file"):
        config = {
            "memory": "memory://",
            "sqlite": f"sqlite:///{directory}/cg.db?synchronous=full",
            "file": f"file://{directory}/cg-file",
        }[mode]
        store = open_store(config)
        cp = store.save(bench_checkpoint("cg", full_state, None))
        for _ in range(WARMUP + n):
            cp = store.save(bench_checkpoint("cg", full_state, cp.version))
        store.close()
    elif mode in ("sqlite-floor", "file-floor"):
        from stepstone._bench import FileFloor, SQLiteFloor

        text, _ = encode_state(full_state)
        floor: Any = (
            SQLiteFloor(f"{directory}/floor.db", text, "full")
            if mode == "sqlite-floor"
            else FileFloor(directory, text.encode("utf-8"))
        )
        for _ in range(WARMUP + n):
            floor.op()
        floor.close()
    elif mode == "run-memory":
        store = open_store("memory://")
        for i in range(WARMUP + n):
            run(f"cg-{i}", steps, store)
    elif mode == "build":
        # What the save modes spend outside the store: building the Checkpoint to save.
        version = "0" * 32
        for _ in range(WARMUP + n):
            bench_checkpoint("cg", full_state, version)
    elif mode == "plain":
        for _ in range(WARMUP + n):
            plain()
    elif mode in ("emit", "emit-none"):
        # Issue 34: one step emitting N token events (emit-none: the same loop, no
        # emit), with its flushes to the memory store; the difference is one event.
        from stepstone import Step

        def talk(state: dict[str, Any], ctx: Any) -> None:
            for _ in range(WARMUP + n):
                if mode == "emit":
                    ctx.emit("tokens", "tok")

        run("cg-emit", [Step("talk", talk)], open_store("memory://"))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
