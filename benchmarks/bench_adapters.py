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

import sys
import uuid
from pathlib import Path
from typing import Any

from _common import AgentBench, OneRun


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


def _one_run(variant: str, workload: str, tools: int) -> OneRun:
    """One agent run of the configuration: plain ``agent.run`` or ``adurable_agent_run``."""
    from stepstone.adapters.pydantic_ai import adurable_agent_run

    agent = _agent(workload, tools, variant == "durable")
    if variant == "durable":
        return lambda store: adurable_agent_run(store, f"bench-{uuid.uuid4().hex}", agent, "q")
    return lambda store: agent.run("q")


BENCH = AgentBench(_one_run, __file__, "model_request")

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    BENCH.main(__doc__.splitlines()[0])
