"""Figure 6: requests per save and per load: Cosmos DB (emulator), PostgreSQL, MySQL.

Cosmos DB: HTTP requests, counted with the store's own counter ``requests_sent`` when
the CosmosStore has one, else by wrapping azure-core's HTTP transports (every request
the SDK sends, retries included). Skipped, with the reason, when no emulator can be
started (Docker or node needed; see tests/cosmos_emulator.py) or the cosmos store is
not there. ``STEPSTONE_BENCH_COSMOS`` (a full config string, key in
``AZURE_COSMOS_KEY``) points it at an already running emulator or account instead.

PostgreSQL and MySQL/MariaDB: SQL statements (one round trip each), counted by
``SQLServerStore.requests_sent``, on a fresh table on the loopback servers
(``STEPSTONE_BENCH_POSTGRES`` / ``STEPSTONE_BENCH_MYSQL`` override the URL), dropped
afterwards; skipped, with the reason, when a server cannot be reached.

    .venv/bin/python benchmarks/bench_requests.py [--quick] [--json] [--no-cosmos] [--no-sql]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from _common import SQL_KINDS, cosmos_config, emit, parse_args, progress, sql_config, table

from stepstone import Checkpoint, Store, open_store, run
from stepstone._bench import BENCH_PREFIX, STEPS, machine_info, make_steps, state_of_size


class Counter:
    """Counts requests: the store's ``requests_sent`` if it has one, else azure-core's."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.method = "store.requests_sent" if hasattr(store, "requests_sent") else "transport"
        self._sent = 0

    def total(self) -> int:
        if self.method == "store.requests_sent":
            return int(self.store.requests_sent)  # type: ignore[attr-defined]
        return self._sent

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        if self.method != "transport":
            yield
            return
        from azure.core.pipeline import transport

        classes = [
            getattr(transport, name)
            for name in ("RequestsTransport", "AioHttpTransport")
            if hasattr(transport, name)
        ]
        originals = {cls: cls.send for cls in classes}

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def send(this: Any, request: Any, **kwargs: Any) -> Any:
                self._sent += 1
                return original(this, request, **kwargs)

            return send

        try:
            for cls in classes:
                cls.send = wrap(originals[cls])
            yield
        finally:
            for cls, original in originals.items():
                cls.send = original


def count(counter: Counter, fn: Callable[[], object], times: int) -> tuple[float, float]:
    """Return (requests per call, milliseconds per call) over ``times`` calls."""
    before = counter.total()
    t0 = time.perf_counter()
    for _ in range(times):
        fn()
    ms = (time.perf_counter() - t0) / times * 1e3
    return (counter.total() - before) / times, ms


def measure(config: str, times: int) -> list[dict[str, Any]]:
    store = open_store(config)
    counter = Counter(store)
    rows: list[dict[str, Any]] = []
    prefix = f"{BENCH_PREFIX}requests/{time.time_ns()}"
    names = tuple(f"s{i}" for i in range(STEPS))
    state = {"payload": state_of_size(1024)}
    made: list[str] = []

    def add(what: str, fn: Callable[[], object], n: int = times) -> None:
        per, ms = count(counter, fn, n)
        rows.append({"operation": what, "requests": round(per, 2), "ms": round(ms, 2), "n": n})

    try:
        with counter.patched():
            store.load(f"{prefix}/warmup")  # connection, metadata caches
            ids = iter(range(10**9))

            def first_save() -> None:
                run_id = f"{prefix}/new-{next(ids)}"
                made.append(run_id)
                store.save(Checkpoint(run_id=run_id, state=state, step_names=(), total_steps=STEPS))

            add("save (new run)", first_save)
            box = [store.load(made[0])]

            def update() -> None:
                cp = box[0]
                assert cp is not None
                box[0] = store.save(
                    Checkpoint(
                        run_id=cp.run_id,
                        step=STEPS - 1,
                        state=state,
                        version=cp.version,
                        step_names=names,
                        total_steps=STEPS,
                    )
                )

            add("save (update)", update)
            add("load (hit)", lambda: store.load(made[0]))
            add("load (miss)", lambda: store.load(f"{prefix}/absent"))
            steps = make_steps(state_of_size(1024))

            def one_run() -> None:
                run_id = f"{prefix}/run-{next(ids)}"
                made.append(run_id)
                run(run_id, steps, store)

            add(f"run of {STEPS} steps", one_run, max(2, times // 5))
            doomed = list(made)

            def delete() -> None:
                store.delete(doomed.pop())

            add("delete", delete, min(times, len(doomed)))
    finally:
        for run_id in made:
            with contextlib.suppress(Exception):
                store.delete(run_id)
        store.close()
    for r in rows:
        r["counted_by"] = counter.method
    return rows


def main() -> None:
    args = parse_args(__doc__ or "", extra=("no-cosmos",))
    times = 5 if args.quick else 20
    machine = machine_info()
    rows: list[dict[str, Any]] = []
    via: dict[str, str] = {}
    skipped: list[str] = []

    def measured(backend: str, config: str, why: str) -> None:
        progress(args, f"requests: {backend} via {why} ...")
        via[backend] = why
        rows.extend({"backend": backend} | r for r in measure(config, times))

    if args.no_cosmos:
        skipped.append("cosmos skipped: --no-cosmos")
    else:
        with cosmos_config() as (config, why):
            if config is None:
                skipped.append(f"cosmos skipped: {why}")
                progress(args, skipped[-1])
            else:
                measured("cosmos", config, why)
    if args.no_sql:
        skipped.append("postgresql, mysql skipped: --no-sql")
    else:
        for kind in SQL_KINDS:
            with sql_config(kind, "requests") as (config, why):
                if config is None:
                    skipped.append(f"{kind} skipped: {why}")
                    progress(args, skipped[-1])
                else:
                    measured(kind, config, why)
    backends = list(via)
    operations = list(dict.fromkeys(r["operation"] for r in rows))
    by = {(r["backend"], r["operation"]): r for r in rows}
    lines = [
        "Figure 6: requests per operation (Cosmos DB: HTTP requests; PostgreSQL, MySQL: "
        "SQL statements, one round trip each), requests per call (ms per call)",
        "",
    ]
    if backends:
        lines.append(
            table(
                ["operation", *backends],
                [
                    [op]
                    + [
                        f"{by[b, op]['requests']:.2f} ({by[b, op]['ms']:.2f} ms)"
                        if (b, op) in by
                        else "-"
                        for b in backends
                    ]
                    for op in operations
                ],
            )
        )
        lines.append("")
        lines += [
            f"{b}: {via[b]}, counted by {by[b, operations[0]]['counted_by']}" for b in backends
        ]
    else:
        lines.append("Figure 6 skipped: no backend available")
    lines += skipped
    emit(
        args,
        {
            "figure": "requests",
            "machine": machine,
            "via": via,
            "results": rows,
            "skipped": skipped,
        },
        "\n".join(lines),
    )


if __name__ == "__main__":
    main()
