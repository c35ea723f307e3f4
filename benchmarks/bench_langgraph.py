"""StepstoneSaver against LangGraph's own SqliteSaver on a 100-superstep chat.

    bash benchmarks/peers/setup.sh        # LangGraph's SqliteSaver lives in the peers venv
    PYTHONPATH=src benchmarks/.venv-peers/bin/python benchmarks/bench_langgraph.py \
        [--steps 100] [--delta] [--json] [--no-callgrind]

The graph: one ``model`` node that appends an ``AIMessage`` of ~2 KB to the ``messages``
channel (``add_messages``) per superstep, run for ``--steps`` supersteps with
``durability="sync"`` (a checkpoint per superstep, written before the next begins).
With ``--delta`` the channel is LangGraph's ``DeltaChannel`` (a checkpoint stores a
sentinel, the state is rebuilt from ancestors' writes) instead of the full list.
Both savers serialize with LangGraph's ``JsonPlusSerializer``; each writes to a SQLite
file in a fresh directory (stepstone: ``sqlite:///...``, WAL, ``synchronous=full``;
SqliteSaver: its defaults, WAL).

Figures per checkpoint:

- instructions (valgrind's callgrind, user space, machine-independent): the process
  run with ``--steps`` and with 1 superstep, difference divided by ``steps - 1``; the
  same for the graph without a checkpointer is subtracted, so what is left is the
  saver's own cost (serializing, encoding, SQLite);
- bytes written: what the process handed to ``write()`` (``wchar`` in /proc/self/io)
  during the run, divided by the supersteps: database, WAL and journal together.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

MESSAGE = "lorem ipsum dolor sit amet " * 76  # ~2 KB per turn


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _add_batch(state: Any, writes: Sequence[Any]) -> Any:
    """``add_messages`` over a batch of writes: the reducer ``DeltaChannel`` takes."""
    for write in writes:
        state = add_messages(state, write)
    return state


class DeltaChat(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(_add_batch)]


def _wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def run_once(mode: str, steps: int, directory: str, delta: bool = False) -> dict[str, Any]:
    """Run the chat for ``steps`` supersteps with the saver ``mode``; return what it cost."""

    # Unannotated, so the node reads the graph's own schema (Chat or DeltaChat).
    def model(state):  # type: ignore[no-untyped-def]
        return {"messages": [AIMessage(f"turn {len(state['messages'])}: {MESSAGE}")]}

    builder: Any = StateGraph(DeltaChat if delta else Chat)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    builder.add_conditional_edges(
        "model", lambda s: "model" if len(s["messages"]) < steps else "__end__"
    )
    saver: Any = None
    closer: Any = None
    if mode == "stepstone":
        from stepstone.adapters.langgraph import StepstoneSaver

        saver = StepstoneSaver.from_config(f"sqlite:///{directory}/stepstone.db?synchronous=full")
        closer = saver.close
    elif mode == "sqlitesaver":
        import sqlite3

        # langgraph-checkpoint-sqlite is the peers' venv's, not stepstone's own.
        from langgraph.checkpoint.sqlite import SqliteSaver  # type: ignore[import-not-found, unused-ignore]

        conn = sqlite3.connect(f"{directory}/langgraph.db", check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        closer = conn.close
    elif mode != "none":
        raise SystemExit(f"unknown mode {mode!r}; modes: stepstone, sqlitesaver, none")
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "chat"}, "recursion_limit": steps + 10}
    before = _wchar()
    # (LangGraph 1.2 fails on durability="sync" without a checkpointer.)
    durability: Any = "sync" if saver is not None else "async"
    final = graph.invoke({"messages": []}, config, durability=durability)
    written = _wchar() - before
    assert len(final["messages"]) == steps, len(final["messages"])
    if closer is not None:
        closer()
    return {"mode": mode, "steps": steps, "bytes_written": written}


def _instructions(mode: str, steps: int, delta: bool) -> int:
    """Instructions of a whole process running ``mode`` for ``steps`` supersteps."""
    with tempfile.TemporaryDirectory() as directory:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                __file__,
                "--once",
                mode,
                "--steps",
                str(steps),
                "--dir",
                directory,
                *(["--delta"] if delta else []),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    for line in out.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split("Collected :")[1])
    raise RuntimeError(f"no callgrind total for {mode}: {out.stderr[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--delta", action="store_true", help="LangGraph's DeltaChannel")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--once", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(json.dumps(run_once(args.once, args.steps, args.dir, args.delta)))
        return
    results: dict[str, dict[str, Any]] = {}
    for mode in ("stepstone", "sqlitesaver"):
        directory = tempfile.mkdtemp()
        try:
            results[mode] = run_once(mode, args.steps, directory, args.delta)
        finally:
            shutil.rmtree(directory)
        results[mode]["bytes_per_checkpoint"] = results[mode]["bytes_written"] // args.steps
    if not args.no_callgrind and shutil.which("valgrind"):
        base = {s: _instructions("none", s, args.delta) for s in (1, args.steps)}
        for mode in ("stepstone", "sqlitesaver"):
            total = {s: _instructions(mode, s, args.delta) for s in (1, args.steps)}
            own = (total[args.steps] - total[1]) - (base[args.steps] - base[1])
            results[mode]["instructions_per_checkpoint"] = own // (args.steps - 1)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    channel = "DeltaChannel" if args.delta else "full messages channel"
    print(f"{args.steps}-superstep chat, ~2 KB per turn, {channel}, durability='sync', SQLite:")
    for mode, r in results.items():
        ins = r.get("instructions_per_checkpoint")
        ins_text = f"{ins / 1e6:8.2f} M instructions" if ins is not None else "(no callgrind)"
        print(
            f"  {mode:12s} {ins_text}  "
            f"{r['bytes_per_checkpoint'] / 1024:8.1f} KiB written per checkpoint"
        )


if __name__ == "__main__":
    main()
