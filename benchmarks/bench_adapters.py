"""What stepstone adds per model call and per tool call of a pydantic-ai agent.

    python benchmarks/bench_adapters.py [--n N] [--repeats R] [--store URL] [--callgrind] [--json]

The agent runs on pydantic-ai's ``FunctionModel`` (no network; a model call costs only
pydantic-ai's own work), once without durability and once with ``StepstoneDurability``
inside ``adurable_agent_run``. Two workloads, each at T=1 and T=4 tool calls:

- ``seq``: one tool call per model response, so T+1 model requests and T tool calls;
- ``batch``: all T tool calls in the first response, so 2 model requests and T tools.

The cost of one more tool call is the slope of ``batch`` from T=1 to T=4; the cost of one
more model request is the slope of ``seq`` minus that. Taking slopes cancels what does
not grow with T (imports, the stepstone run's own claim and final save). Overhead is the
durable figure minus the plain one.

``--callgrind`` counts instructions (valgrind's callgrind, user space: Python, libc, the
store's driver), which do not move with the machine's load: one process under callgrind
counts only what runs inside ``operator.call`` around each configuration's N agent runs
(after its warm-up), one dump per configuration. Without it, wall-clock medians over
repeats, in process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

WARMUP = 5
WORKLOADS = ("seq", "batch")
VARIANTS = ("plain", "durable")
LOW, HIGH = 1, 4


def _agent(workload: str, tools: int, durable: bool) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from stepstone.adapters.pydantic_ai import StepstoneDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done >= tools:
            return ModelResponse(parts=[TextPart("ok")])
        if workload == "batch":
            calls = [ToolCallPart("lookup", {"x": i}, tool_call_id=f"c{i}") for i in range(tools)]
            return ModelResponse(parts=calls)
        return ModelResponse(parts=[ToolCallPart("lookup", {"x": done}, tool_call_id=f"c{done}")])

    capabilities = [StepstoneDurability()] if durable else []
    agent: Agent[None, str] = Agent(FunctionModel(model), name="bench", capabilities=capabilities)

    @agent.tool_plain
    def lookup(x: int) -> str:
        return f"value {x}"

    return agent


async def _runs(
    variant: str, workload: str, tools: int, n: int, store_url: str, warmup: int = WARMUP
) -> float:
    """Run the agent ``n`` times (after a warm-up); return the seconds the ``n`` took."""
    from stepstone import open_store
    from stepstone.adapters.pydantic_ai import adurable_agent_run

    agent = _agent(workload, tools, variant == "durable")
    store = open_store(store_url)
    try:
        started = 0.0
        for i in range(warmup + n):
            if i == warmup:
                started = time.perf_counter()
            if variant == "durable":
                await adurable_agent_run(store, f"bench-{uuid.uuid4().hex}", agent, "q")
            else:
                await agent.run("q")
        return time.perf_counter() - started
    finally:
        store.close()


def _callgrind_all(n: int, store_url: str) -> dict[tuple[str, str, int], float]:
    """Count the instructions of each configuration's ``n`` agent runs, in one process.

    Collection is off except inside ``operator.call`` (C ``_operator_call``, which nothing
    on the measured path calls), and callgrind dumps and zeroes its counters each time
    that call returns: one dump per configuration, imports and warm-ups never counted.
    """
    keys = _keys()
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
                __file__,
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


def _keys() -> list[tuple[str, str, int]]:
    return [(v, w, t) for v in VARIANTS for w in WORKLOADS for t in (LOW, HIGH)]


def _child(n: int, store_url: str) -> None:
    """Under callgrind: warm each configuration up, then measure it inside operator.call."""
    import operator

    for variant, workload, tools in _keys():
        asyncio.run(_runs(variant, workload, tools, WARMUP, store_url, warmup=0))
        operator.call(_measured, variant, workload, tools, n, store_url)


def _measured(variant: str, workload: str, tools: int, n: int, store_url: str) -> None:
    asyncio.run(_runs(variant, workload, tools, n, store_url, warmup=0))


def _figures(cost: dict[tuple[str, str, int], float]) -> dict[str, float]:
    """Per-unit figures from the cost of one agent run at each (variant, workload, T)."""
    span = HIGH - LOW
    result: dict[str, float] = {}
    for variant in VARIANTS:
        tool = (cost[variant, "batch", HIGH] - cost[variant, "batch", LOW]) / span
        both = (cost[variant, "seq", HIGH] - cost[variant, "seq", LOW]) / span
        result[f"{variant}_tool_call"] = tool
        result[f"{variant}_model_request"] = both - tool
    for unit in ("tool_call", "model_request"):
        result[f"overhead_{unit}"] = result[f"durable_{unit}"] - result[f"plain_{unit}"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="agent runs per figure")
    parser.add_argument("--repeats", type=int, default=5, help="wall-clock repeats")
    parser.add_argument("--store", default="memory://", help="store config (default memory://)")
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--op", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.op:  # the callgrind child
        _child(int(args.op[0]), args.op[1])
        return
    n = args.n or (20 if args.callgrind else 50)
    if args.callgrind:
        cost = _callgrind_all(n, args.store)
    else:
        cost = {}
        for key in _keys():
            seconds = [asyncio.run(_runs(*key, n, args.store)) for _ in range(args.repeats)]
            cost[key] = statistics.median(seconds) / n * 1e6  # us per agent run
    figures = _figures(cost)
    unit = "instructions" if args.callgrind else "us"
    if args.json:
        print(json.dumps({"unit": unit, "n": n, "store": args.store, **figures}, indent=2))
        return
    print(f"per unit, {unit} ({args.store}, {n} agent runs per figure):")
    for name in ("model_request", "tool_call"):
        plain, durable = figures[f"plain_{name}"], figures[f"durable_{name}"]
        print(
            f"  {name:<14} plain {plain:>12,.0f}  durable {durable:>12,.0f}  "
            f"overhead {durable - plain:>12,.0f} ({(durable / plain - 1) * 100:+.0f}%)"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
