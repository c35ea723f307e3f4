"""What stepstone adds per model call and per tool call of an OpenAI Agents SDK agent.

    python benchmarks/bench_openai_agents.py [--n N] [--repeats R] [--store URL]
        [--callgrind] [--json]

The agent runs on a fake ``Model`` (no network; a model call costs only the SDK's own
work), once with the SDK's ``Runner.run`` and once with ``StepstoneRunner.run`` (model
calls and tool calls journaled). Two workloads, each at T=1 and T=4 tool calls:

- ``seq``: one tool call per model response, so T+1 model calls and T tool calls;
- ``batch``: all T tool calls in the first response, so 2 model calls and T tools.

The cost of one more tool call is the slope of ``batch`` from T=1 to T=4; the cost of one
more model call is the slope of ``seq`` minus that. Taking slopes cancels what does not
grow with T (imports, the stepstone run's own claim and final save). Overhead is the
durable figure minus the plain one. The method (and ``--callgrind``) is
``bench_adapters.py``'s, for pydantic-ai.
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


def _agent(workload: str, tools: int) -> Any:
    from agents import Agent, Model, ModelProvider, ModelResponse, RunConfig, Usage, function_tool
    from agents.testing import assistant_message, function_call

    class Fake(Model):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            given = kwargs["input"] if "input" in kwargs else args[1]
            items = given if isinstance(given, list) else []
            done = sum(
                1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
            )
            if done >= tools:
                out = [assistant_message("ok")]
            elif workload == "batch":
                out = [function_call("lookup", {"x": i}, call_id=f"c{i}") for i in range(tools)]
            else:
                out = [function_call("lookup", {"x": done}, call_id=f"c{done}")]
            return ModelResponse(output=out, usage=Usage(requests=1), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    class Provider(ModelProvider):
        def get_model(self, model_name: str | None) -> Model:
            return Fake()

    @function_tool
    def lookup(x: int) -> str:
        """Look x up."""
        return f"value {x}"

    agent = Agent(name="bench", model="fake", tools=[lookup])
    return agent, RunConfig(model_provider=Provider(), tracing_disabled=True)


async def _runs(
    variant: str, workload: str, tools: int, n: int, store_url: str, warmup: int = WARMUP
) -> float:
    """Run the agent ``n`` times (after a warm-up); return the seconds the ``n`` took."""
    from agents import Runner

    from stepstone import open_store
    from stepstone.adapters.openai_agents import StepstoneRunner

    agent, config = _agent(workload, tools)
    store = open_store(store_url)
    try:
        started = 0.0
        for i in range(warmup + n):
            if i == warmup:
                started = time.perf_counter()
            if variant == "durable":
                run_id = f"bench-{uuid.uuid4().hex}"
                await StepstoneRunner.run(store, run_id, agent, "q", run_config=config)
            else:
                await Runner.run(agent, "q", run_config=config)
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
        result[f"{variant}_model_call"] = both - tool
    for unit in ("tool_call", "model_call"):
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
    for name in ("model_call", "tool_call"):
        plain, durable = figures[f"plain_{name}"], figures[f"durable_{name}"]
        print(
            f"  {name:<14} plain {plain:>12,.0f}  durable {durable:>12,.0f}  "
            f"overhead {durable - plain:>12,.0f} ({(durable / plain - 1) * 100:+.0f}%)"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
