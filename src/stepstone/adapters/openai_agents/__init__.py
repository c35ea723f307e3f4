"""OpenAI Agents SDK runs on stepstone (``pip install 'stepstone[openai-agents]'``).

Three pieces, each on the SDK's public hooks only (``ModelProvider``/``Model``,
``FunctionTool``, ``RunState``, the ``Session`` protocol):

* ``StepstoneRunner.run(store, run_id, agent, input)`` (and ``run_sync``): the SDK's
  ``Runner.run`` as a durable stepstone run, in the shape of DBOS's ``DBOSRunner``. The
  run config's model provider is wrapped (``StepstoneModelProvider``) so that every
  ``Model.get_response`` is a journaled unit, and the starting agent's function tools are
  wrapped too (``durable_tool``). ``AgentRunStep`` is the same as one step of a stepstone
  ``Workflow`` that workers serve.
* Durable approvals: a run whose tools need approval is saved ``waiting`` (its
  ``RunState`` in the store) and answered by a stepstone signal (``approve``/``reject``,
  or ``stepstone runs signal RUN approval --data '{"call_id": "c1", "approved": true}'``),
  days later, from any process; the next ``StepstoneRunner.run`` or a worker resumes it.
* ``StepstoneSession``: the SDK's conversation memory in any stepstone store, every change
  a compare-and-swap, so two concurrent turns never interleave or lose items.

The journal. Each journaled unit is an entry of the run's own journal (``_journaled``:
``stepstone.journal``, ``runs show``, ``rerun`` at an entry), ``{seq, call, attempt,
at, result, step}``, appended by the run's lease-fenced compare-and-swap, so a stale
owner writes nothing and every replay reads the first value. ``call`` is
``get_response`` (``get_response#2``, ... by encounter); inside a durable tool call
``tool:TOOL:CALL_ID/get_response``; ``tool:TOOL:CALL_ID`` for a durable tool's output;
``pause#K`` (the ``RunState`` at the K-th approval pause) and ``resume#K`` (the decisions
it was resumed with); ``session.get_items`` for a session read inside the run. Model
responses are stored as the SDK's ``ModelResponse`` in pydantic's JSON mode (by alias),
RunStates as the SDK's own JSON. The release before kept each entry in a record of its
own, ``openai-agents:RUN_ID/STEP/NAME`` (``journal_record_id``): those are moved into the
run's journal, in their save order, and deleted on the step's next execution.

Records (kept at status ``done``: no worker ever claims them), each id under the prefix
``openai-agents:`` (longer than 1,024 characters: the rest becomes its SHA-256):

* ``openai-agents:session:SESSION_ID``: a session's head (its newest items, the list of
  its pages, the ids of the last writes applied), and
  ``openai-agents:session-page:SEQ-RANDOM:SESSION_ID``: older items, written once, never
  changed, deleted once no head refers to them.

How a run survives a crash. The agent runs again from its start (or from the RunState of
its last approval pause); each model call and durable tool call found in the journal
returns its recorded result instead of running, so finished model calls are never paid
twice and the one in flight at the crash runs at most once more. Names are counted per
scope, and a durable tool's scope is its call id (the SDK runs tool calls concurrently):
replays line up whatever the scheduling. Two units in flight at once in one scope (a tool
that gathers two sub-agents, say) are refused with ``ConcurrentUnits``. Tools not wrapped
run again on resume.

A second process resuming a run another one executes gets ``stepstone.RunOwned`` (the
run's lease, itself a compare-and-swap), so a restored ``RunState`` is never resumed
twice at once, as the SDK's documentation requires.
"""

from __future__ import annotations

from .._extra import require

require("openai_agents", "the OpenAI Agents SDK", "openai-agents", "agents")

from ._approvals import aapprove, apending_approvals, approve, areject, pending_approvals, reject
from ._journal import APPROVAL_SIGNAL as APPROVAL_SIGNAL  # module constants, as before
from ._journal import FORMAT as FORMAT
from ._journal import PREFIX, ConcurrentUnits, journal_record_id
from ._models import StepstoneModel, StepstoneModelProvider, durable_tool
from ._session import StepstoneSession
from ._step import AgentRunStep, StepstoneRunner

__all__ = [
    "PREFIX",
    "AgentRunStep",
    "ConcurrentUnits",
    "StepstoneModel",
    "StepstoneModelProvider",
    "StepstoneRunner",
    "StepstoneSession",
    "aapprove",
    "apending_approvals",
    "approve",
    "areject",
    "durable_tool",
    "journal_record_id",
    "pending_approvals",
    "reject",
]
