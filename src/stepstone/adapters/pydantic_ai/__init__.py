"""Durable pydantic-ai agents on stepstone (``pip install 'stepstone[pydantic-ai]'``).

Attach ``StepstoneDurability()`` to an ``Agent`` and run the agent inside a stepstone
run: with the one-call helper ``durable_agent_run`` / ``adurable_agent_run``, or as an
``AgentStep(name, agent, prompt, store=store)`` among the steps of ``run``/``arun`` or of
a ``Workflow`` served by workers. Built on pydantic-ai's public durable engine API
(``pydantic_ai.durable_exec``, ``pydantic_ai.external_events``) only.

How a run survives a crash. Every model request (streaming or not), tool call, toolset
discovery and event-stream-handler call is one durable unit, named by pydantic-ai's
``JournalOperationNamer`` and numbered per name in one agent run
(``support__model.request#1``, ``support__function_toolset__<agent>.call_tool:lookup#2``).
When a unit's body returns, its JSON result (pydantic models in their JSON mode) is an
entry of the run's own journal, as a code workflow's call is (``adapters._journaled``):
appended by the core's compare-and-swap of the run's record, fenced by its lease, so
``stepstone.journal``, ``runs show`` and ``rerun`` at an entry work on it. On resume the
agent runs again from its start and every unit found in the journal returns its recorded
result instead of running: finished model requests and tool calls are never paid twice;
the one in flight at the crash runs at most once more. The release before kept the
journal in a record of its own (``journal_run_id``): the step's next execution moves it
into the run's journal.

Ordering. Tool calls run one at a time, in the order of the recorded model response
(the engine spec's ``sequential_tools_in_durable_context``: pydantic-ai forces its
``sequential`` mode inside a stepstone run, overriding a ``parallel`` one). An encounter
counter must mean the same call on every replay, which a counter taken by concurrently
scheduled calls would not; anything that still starts a second unit while one runs (a
tool starting ``asyncio.gather`` of durable work) is refused with ``ConcurrentUnits``.

Durable waits. Inside a stepstone run, pydantic-ai's ``wait_for_external_event`` (and so
``RequestInput``) waits for the stepstone *signal* named after the wait: the run is
saved ``waiting`` (``waiting_for: signal NAME``, ``wake_at`` the recorded timeout), no
process is held, ``stepstone.signal(store, RUN_ID, NAME, payload)`` or ``stepstone runs
signal RUN_ID NAME --data ...`` answers it, and any process resumes the agent where it
stopped. The token ``ask`` receives names the run and the signal (``parse_token``).

Streams. ``StepstoneDurability(event_stream_handler=emit_events)`` sends the agent's
events to the run's stream (``stepstone.stream``): text to ``"tokens"``, tool calls and
results to ``"tool"``; each unit's events are shown once its journal entry lands, and a
replayed unit emits nothing again (``_streaming``).

Fencing. Each entry is a save of the run's record fenced by its owner's lease: a stale
owner (its lease taken over) gets ``LeaseLost`` on its next journal write.
"""

from __future__ import annotations

from .._extra import require

require("pydantic_ai", "pydantic-ai", "pydantic-ai", "pydantic_ai")

from ._capability import StepstoneDurability
from ._journal import JOURNAL_FORMAT, ConcurrentUnits, journal_run_id, parse_token
from ._step import AgentStep, adurable_agent_run, durable_agent_run, read_journal
from ._streaming import emit_events

__all__ = [
    "AgentStep",
    "ConcurrentUnits",
    "JOURNAL_FORMAT",
    "StepstoneDurability",
    "adurable_agent_run",
    "durable_agent_run",
    "emit_events",
    "journal_run_id",
    "parse_token",
    "read_journal",
]
