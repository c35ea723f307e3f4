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
durable figure minus the plain one. The method and ``--callgrind`` are
``bench_adapters.py``'s, for pydantic-ai: both are ``_common.AgentBench``.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from _common import AgentBench, OneRun


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


def _one_run(variant: str, workload: str, tools: int) -> OneRun:
    """One agent run of the configuration: the SDK's ``Runner.run`` or ``StepstoneRunner.run``."""
    from agents import Runner

    from stepstone.adapters.openai_agents import StepstoneRunner

    agent, config = _agent(workload, tools)
    if variant == "durable":
        return lambda store: StepstoneRunner.run(
            store, f"bench-{uuid.uuid4().hex}", agent, "q", run_config=config
        )
    return lambda store: Runner.run(agent, "q", run_config=config)


BENCH = AgentBench(_one_run, __file__, "model_call")

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    BENCH.main(__doc__.splitlines()[0])
