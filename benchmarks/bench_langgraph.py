"""StepstoneSaver against LangGraph's own SqliteSaver on a 100-superstep chat.

    bash benchmarks/peers/setup.sh        # LangGraph's SqliteSaver lives in the peers venv
    PYTHONPATH=src benchmarks/.venv-peers/bin/python benchmarks/bench_langgraph.py \
        [--steps 100] [--delta] [--json] [--no-callgrind] [--saver-only]

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
  during the run, divided by the supersteps: database, WAL and journal together;
- with ``--saver-only``, also the saver's calls alone: the ``put``/``put_writes`` calls
  of one run are recorded (outside valgrind), then replayed on a fresh saver of each kind
  under callgrind, the first superstep's and all of them, the difference divided by
  ``steps - 1``. Nothing of LangGraph's loop is counted (its copies of channels, its
  checkpoint building), only what each saver does with the same calls: the figure to
  compare a saver change with, since the whole-graph one subtracts two large totals.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from _common import callgrind_count
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


def _open_saver(mode: str, directory: str) -> tuple[Any, Any]:
    """A saver of ``mode`` on a new SQLite file in ``directory``, and what closes it."""
    if mode == "stepstone":
        from stepstone.adapters.langgraph import StepstoneSaver

        saver = StepstoneSaver.from_config(f"sqlite:///{directory}/stepstone.db?synchronous=full")
        return saver, saver.close
    if mode == "sqlitesaver":
        import sqlite3

        # langgraph-checkpoint-sqlite is the peers' venv's, not stepstone's own.
        from langgraph.checkpoint.sqlite import SqliteSaver  # type: ignore[import-not-found, unused-ignore]

        conn = sqlite3.connect(f"{directory}/langgraph.db", check_same_thread=False)
        peer = SqliteSaver(conn)
        peer.setup()
        return peer, conn.close
    raise SystemExit(f"unknown mode {mode!r}; modes: stepstone, sqlitesaver, none")


def _recorded_calls(steps: int, delta: bool) -> list[tuple[str, tuple[Any, ...]]]:
    """The ``put``/``put_writes`` calls a run of the chat makes, as a saver receives them.

    Configs keep only their ``configurable`` ids (the rest holds the run's callbacks,
    which neither saver reads for these calls and which cannot be pickled).
    """
    import copy

    from stepstone.adapters.langgraph import StepstoneSaver

    calls: list[tuple[str, tuple[Any, ...]]] = []

    def ids(config: Any) -> Any:
        conf = config["configurable"]
        keep = ("thread_id", "checkpoint_ns", "checkpoint_id")
        return {
            "configurable": {k: conf[k] for k in keep if k in conf},
            "metadata": dict(config.get("metadata") or {}),
        }

    class Recording(StepstoneSaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            args = (ids(config), checkpoint, metadata, new_versions)
            calls.append(("put", copy.deepcopy(args)))
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            calls.append(("put_writes", copy.deepcopy((ids(config), writes, task_id, task_path))))
            super().put_writes(config, writes, task_id, task_path)

    with tempfile.TemporaryDirectory() as directory:
        run_once("recording", steps, directory, delta, saver_class=Recording)
    return calls


def _replay(mode: str, path: str, supersteps: int, directory: str) -> None:
    """Replay the recorded calls of the first ``supersteps`` supersteps on a new saver."""
    with open(path, "rb") as file:
        calls = pickle.load(file)  # a file this script wrote a moment ago
    saver, closer = _open_saver(mode, directory)
    puts = 0
    for name, args in calls:
        if name == "put":
            puts += 1
            # The input checkpoint is put 0; superstep k's writes follow put k.
            if puts > supersteps + 1:
                break
        getattr(saver, name)(*args)
    closer()


def _replay_instructions(mode: str, path: str, supersteps: int) -> int:
    """Instructions of a process replaying ``supersteps`` supersteps' calls on ``mode``."""
    with tempfile.TemporaryDirectory() as directory:
        replay = ["--replay", mode, "--calls", path, "--steps", str(supersteps)]
        return callgrind_count([__file__, *replay, "--dir", directory])


def saver_only(steps: int, delta: bool, modes: Sequence[str]) -> dict[str, int]:
    """Instructions per checkpoint of each saver alone, on the same recorded calls."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "calls.pickle")
        with open(path, "wb") as file:
            pickle.dump(_recorded_calls(steps, delta), file)
        found = {}
        for mode in modes:
            one, all_ = (_replay_instructions(mode, path, s) for s in (1, steps))
            found[mode] = (all_ - one) // (steps - 1)
    return found


def run_once(
    mode: str, steps: int, directory: str, delta: bool = False, saver_class: Any = None
) -> dict[str, Any]:
    """Run the chat for ``steps`` supersteps with the saver ``mode``; return what it cost.

    ``saver_class``: with mode ``recording``, a ``StepstoneSaver`` subclass to run with.
    """

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
    if mode == "recording":
        saver = saver_class.from_config(f"sqlite:///{directory}/recording.db")
        closer = saver.close
    elif mode != "none":
        saver, closer = _open_saver(mode, directory)
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
        return callgrind_count(
            [__file__, "--once", mode, "--steps", str(steps), "--dir", directory]
            + (["--delta"] if delta else [])
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--delta", action="store_true", help="LangGraph's DeltaChannel")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument(
        "--saver-only", action="store_true", help="also each saver alone, on replayed calls"
    )
    parser.add_argument(
        "--modes", default="stepstone,sqlitesaver", help="savers to run (stepstone,sqlitesaver)"
    )
    parser.add_argument("--once", help=argparse.SUPPRESS)
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    parser.add_argument("--calls", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(json.dumps(run_once(args.once, args.steps, args.dir, args.delta)))
        return
    if args.replay:
        _replay(args.replay, args.calls, args.steps, args.dir)
        return
    modes = args.modes.split(",")
    results: dict[str, dict[str, Any]] = {}
    for mode in modes:
        directory = tempfile.mkdtemp()
        try:
            results[mode] = run_once(mode, args.steps, directory, args.delta)
        finally:
            shutil.rmtree(directory)
        results[mode]["bytes_per_checkpoint"] = results[mode]["bytes_written"] // args.steps
    if not args.no_callgrind and shutil.which("valgrind"):
        base = {s: _instructions("none", s, args.delta) for s in (1, args.steps)}
        for mode in modes:
            total = {s: _instructions(mode, s, args.delta) for s in (1, args.steps)}
            own = (total[args.steps] - total[1]) - (base[args.steps] - base[1])
            results[mode]["instructions_per_checkpoint"] = own // (args.steps - 1)
        if args.saver_only:
            alone = saver_only(args.steps, args.delta, modes)
            for mode, count in alone.items():
                results[mode]["saver_instructions_per_checkpoint"] = count
    if args.json:
        print(json.dumps(results, indent=2))
        return
    channel = "DeltaChannel" if args.delta else "full messages channel"
    print(f"{args.steps}-superstep chat, ~2 KB per turn, {channel}, durability='sync', SQLite:")
    for mode, r in results.items():
        ins = r.get("instructions_per_checkpoint")
        ins_text = f"{ins / 1e6:8.2f} M instructions" if ins is not None else "(no callgrind)"
        own_count = r.get("saver_instructions_per_checkpoint")
        alone_text = "" if own_count is None else f"  (the saver alone: {own_count / 1e6:.2f} M)"
        print(
            f"  {mode:12s} {ins_text}  "
            f"{r['bytes_per_checkpoint'] / 1024:8.1f} KiB written per checkpoint{alone_text}"
        )


if __name__ == "__main__":
    main()
