"""A long chat run: instructions, growth and bytes written as the state grows (issue 19).

    .venv/bin/python benchmarks/bench_long_run.py [--n 25,50,100,200,400]
        [--stores memory,file,sqlite[,postgresql,mysql]] [--src DIR] [--profile N] [--json]
        [--usage] [--append-only]

The workload: a workflow of ``n`` steps run by ``stepstone.run``; each step appends one
message of ~2 KB (``{"role": "assistant", "content": "turn i: lorem ipsum ..."}``, the
turn ``bench_langgraph.py`` gives LangGraph) to ``state["messages"]``, so the state after
step ``i`` holds ``i`` messages and every save is of a larger state. ``--usage`` gives
each message two numbers too (``"usage": {"input_tokens": i, "output_tokens": 2 * i}``,
as model APIs report them), the case where a save checks each stored number's type
(``_statediff._same_json``).

Figures, per store (``memory://``, ``file://`` at its default durability, ``sqlite://``
with ``synchronous=full``; ``postgresql://`` and ``mysql://`` on the local servers, a
table of their own, when named in ``--stores``):

- instructions of the whole run of ``n`` steps (valgrind's callgrind, user space), of
  every thread (the SQLite group committer's, a listener's): one process per store,
  dumping callgrind's counters when ``operator.call`` (which nothing on the measured
  path calls) is entered and when it returns; only the dumps taken at a return are
  kept, each the instructions of all threads during one call, so imports, the store's
  opening and a warm-up run are never counted. (``--toggle-collect`` would count only
  the thread that calls ``operator.call``.) PYTHONHASHSEED=0;
- the growth exponent ``k`` of instructions ~ n^k, a least-squares fit of log(instructions)
  on log(n) over every ``n`` measured;
- state bytes per step: what the saves handed the store (the state's text in the
  document, or the pieces: ``stepstone._statelog``), divided by ``n``, against the JSON
  size of one step's update (the message it appended), measured in a second, uncounted
  run of each ``n``;
- bytes written per step: what the process handed to ``write()`` during the run (``wchar``
  in /proc/self/io: the store's files, WAL and journal, pages and metadata included),
  divided by ``n``, against the same update.

``--append-only``: the run's workflow declares ``append_only=["messages"]`` (the explicit
trade of ``stepstone._append_only``: a save compares only the transcript's last 16 stored
items), so the figures show what the per-item comparison costs.

``--src DIR`` puts ``DIR`` first on the measured processes' ``PYTHONPATH`` (a ``git
archive REV src`` of an earlier tree, for a before/after). ``--profile N`` prints the top
C functions of an ``N``-step run by their own instructions
(``_common.callgrind_self_costs``), per store, instead of the figures above.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import os
import tempfile
from pathlib import Path
from typing import Any

from _common import callgrind_dumps, callgrind_self_costs

MESSAGE = "lorem ipsum dolor sit amet " * 76  # ~2 KB per turn, as bench_langgraph.py
STORES = ("memory", "file", "sqlite")
WARMUP_STEPS = 5


#: ``--usage``: each message carries its token counts (set in the measured process too).
USAGE = False
#: ``--append-only``: the workflow declares ``append_only=["messages"]`` (ditto).
APPEND_ONLY = False


def _message(i: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": f"turn {i}: {MESSAGE}"}
    if USAGE:
        message["usage"] = {"input_tokens": i, "output_tokens": 2 * i}
    return message


def _steps(n: int) -> list[Any]:
    from stepstone import Step

    def turn(state: dict[str, Any]) -> dict[str, Any]:
        messages: list[Any] = state["messages"]
        return {"messages": [*messages, _message(len(messages))]}

    return [Step(f"turn-{i}", turn) for i in range(n)]


def _config(store: str, directory: str) -> str:
    # The servers' stores get a table of their own per measurement (the directory's name
    # is unique), so runs of earlier measurements are never in the way.
    table = "bench_long_" + Path(directory).parent.name.replace("-", "_").replace(".", "_")
    servers = {
        "postgresql": os.environ.get(
            "STEPSTONE_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
        ),
        "mysql": os.environ.get("STEPSTONE_BENCH_MYSQL", "mysql://root@127.0.0.1:3306/test"),
    }
    if store in servers:
        return f"{servers[store]}?table={table[:40]}"
    return {
        "memory": "memory://",
        "file": f"file://{directory}/runs",
        "sqlite": f"sqlite:///{directory}/runs.db?synchronous=full",
    }[store]


def _wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def one_run(store: Any, run_id: str, n: int) -> dict[str, Any]:
    """Run the chat for ``n`` steps on ``store``; return bytes written and encoded."""
    from stepstone import run

    steps: Any = _steps(n)
    if APPEND_ONLY:
        from stepstone import Workflow

        steps = Workflow(f"chat-{n}", steps, append_only=["messages"])
    before = _wchar()
    final = run(run_id, steps, store, input={"messages": []})
    written = _wchar() - before
    assert len(final["messages"]) == n, len(final["messages"])
    one = len(json.dumps(_message(n), ensure_ascii=False, separators=(",", ":")))
    return {"n": n, "bytes_written": written, "bytes_encoded": 0, "update_bytes": one}


def _child(store_name: str, ns: list[int], directory: str) -> None:
    """Under callgrind: a warm-up run, then each ``n`` inside ``operator.call``."""
    from stepstone import open_store

    store = open_store(_config(store_name, directory))
    try:
        one_run(store, "warm-up", WARMUP_STEPS)
        results = [operator.call(one_run, store, f"chat-{n}", n) for n in ns]
        # Outside the counted calls: what the saves handed the store (document state
        # text plus pieces), measured by ``stepstone.testing.StateMeter``.
        for result, n in zip(results, ns, strict=True):
            result["bytes_encoded"] = _stored_bytes(store, f"chat-again-{n}", n)
    finally:
        store.close()
    print(json.dumps(results))


def _stored_bytes(store: Any, run_id: str, n: int) -> int:
    """Run the chat again, summing the state bytes its saves hand the store."""
    from stepstone.testing import StateMeter

    with StateMeter() as meter:
        one_run(store, run_id, n)
    return meter.bytes


def _callgrind(store: str, ns: list[int], src: str | None, profile: bool) -> tuple[list[int], Any]:
    """Return the instructions of each run of ``ns`` on ``store``, and the child's output."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    with tempfile.TemporaryDirectory(dir=_tmp()) as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        argv = [__file__, "--child", store, "--n", ",".join(map(str, ns)), "--dir", str(data)]
        argv += ["--usage"] if USAGE else []
        argv += ["--append-only"] if APPEND_ONLY else []
        calls, stdout = callgrind_dumps(argv, env, Path(tmp), named=profile)
        counts = [count for _, count in calls]
        assert len(counts) == len(ns), f"{len(counts)} callgrind dumps for {len(ns)} runs"
        top = callgrind_self_costs(calls[-1][0]) if profile else None
        return counts, (json.loads(stdout.strip().splitlines()[-1]), top)


def _tmp() -> str:
    # On the real disk, beside the other benchmarks' stores (tmpfs makes fsync free).
    path = Path(__file__).resolve().parent / ".tmp"
    path.mkdir(exist_ok=True)
    return str(path)


def growth(ns: list[int], counts: list[int]) -> float:
    """The least-squares slope of log(count) on log(n): counts ~ n^slope."""
    xs = [math.log(n) for n in ns]
    ys = [math.log(c) for c in counts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="25,50,100,200,400", help="step counts, comma-separated")
    parser.add_argument(
        "--stores", default=",".join(STORES), help="memory,file,sqlite,postgresql,mysql"
    )
    parser.add_argument("--src", help="a stepstone src dir to measure instead of the installed")
    parser.add_argument("--profile", type=int, help="top functions of one N-step run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--usage", action="store_true", help="messages carry token counts")
    parser.add_argument(
        "--append-only", action="store_true", help='the workflow declares append_only=["messages"]'
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ns = [int(v) for v in args.n.split(",")]
    global USAGE, APPEND_ONLY  # noqa: PLW0603 - read in this process and the measured one
    USAGE = args.usage
    APPEND_ONLY = args.append_only
    if args.child:
        _child(args.child, ns, args.dir)
        return
    stores = args.stores.split(",")
    if args.profile:
        report: dict[str, Any] = {}
        for store in stores:
            counts, (_, top) = _callgrind(store, [args.profile], args.src, profile=True)
            report[store] = {"instructions": counts[0], "top": top}
        if args.json:
            print(json.dumps({"profile_steps": args.profile, "stores": report}, indent=2))
            return
        for store, r in report.items():
            print(f"{store}: {args.profile}-step run, {r['instructions']:,} instructions; top:")
            for own, name in r["top"]:
                print(f"  {own:>14,} {own / r['instructions']:6.1%}  {name[:110]}")
        return
    results: dict[str, Any] = {}
    for store in stores:
        counts, (runs, _) = _callgrind(store, ns, args.src, profile=False)
        results[store] = {
            "instructions": dict(zip(map(str, ns), counts, strict=True)),
            "growth": growth(ns, counts) if len(ns) > 1 else None,
            "bytes_per_step": {str(r["n"]): r["bytes_written"] / r["n"] for r in runs},
            "encoded_per_step": {str(r["n"]): r["bytes_encoded"] / r["n"] for r in runs},
            "update_bytes": runs[0]["update_bytes"],
        }
    if args.json:
        print(json.dumps({"src": args.src or "installed", "stores": results}, indent=2))
        return
    usage = (", with token counts" if USAGE else "") + (", append_only" if APPEND_ONLY else "")
    print(f"chat run, ~2 KB appended per step{usage}; src: {args.src or 'installed stepstone'}")
    header = "".join(f"{'n=' + str(n):>14}" for n in ns)
    print(f"  instructions per run{header}   growth")
    for store, r in results.items():
        cells = "".join(f"{r['instructions'][str(n)]:>14,}" for n in ns)
        grown = "" if r["growth"] is None else f"   n^{r['growth']:.2f}"
        print(f"  {store:<20}{cells}{grown}")
    print(
        "  state bytes handed to the store per step / update "
        f"({results[stores[0]]['update_bytes']:,} B)"
    )
    for store, r in results.items():
        cells = "".join(f"{r['encoded_per_step'][str(n)] / r['update_bytes']:>13.1f}x" for n in ns)
        print(f"  {store:<20}{cells}")
    print("  bytes the process wrote per step (files, WAL, journal) / update")
    for store, r in results.items():
        if store in ("memory", "postgresql", "mysql"):
            continue  # nothing written by this process (the server writes)
        cells = "".join(f"{r['bytes_per_step'][str(n)] / r['update_bytes']:>13.1f}x" for n in ns)
        print(f"  {store:<20}{cells}")


if __name__ == "__main__":
    main()
