"""A Microsoft Agent Framework ``CheckpointStorage`` on any stepstone store.

Pass it where an Agent Framework (MAF) workflow takes checkpoint storage, opened from a
config string or on an open ``Store``::

    from stepstone.adapters.agent_framework import StepstoneCheckpointStorage

    storage = StepstoneCheckpointStorage("postgresql://app@db/agents")
    workflow = WorkflowBuilder(start_executor=start, checkpoint_storage=storage).build()
    ...
    latest = await storage.get_latest(workflow_name=workflow.name)
    await workflow.run(checkpoint_id=latest.checkpoint_id)  # resume after a crash

Implements MAF 1.23's ``CheckpointStorage`` protocol (async ``save``, ``load``,
``list_checkpoints``, ``delete``, ``get_latest``, ``list_checkpoint_ids``) through the
public ``Store`` API only, so every backend works unchanged, on its native async path
where it has one. What it does that MAF's own storages do not:

- **Write-once, by compare-and-swap.** A checkpoint is saved with "nothing may be stored
  yet" (``version=None``). Saving an id again with the same content is a no-op (a retry);
  with other content it raises ``ConflictError`` and stores nothing. MAF's file and
  Cosmos storages overwrite blindly, so two processes writing one id lose one silently.
- **JSON only, by default.** A checkpoint is stored as plain JSON. Agent Framework's
  own types are written in their own JSON forms: ``WorkflowMessage`` field by field,
  pending ``request_info`` events (human in the loop) as ``WorkflowEvent.to_dict`` writes
  them (request and response types by name, resolved on load among the declared types,
  then among modules already imported), chat ``Message``s and other
  ``SerializationMixin`` types by their ``to_dict``, its dataclasses
  (``AgentExecutorResponse``) field by field and its enums by value. What MAF's own
  storages load back loads back equal here too: plain values where MAF puts its types,
  the standard value types its restricted unpickler allows (tuple, set, bytes, datetime,
  UUID, Decimal, ...), and the application's declared types (``allowed_checkpoint_types``
  or MAF's ``register_checkpoint_type``: dataclasses, enums, NamedTuples, pydantic
  models), each tagged ``{"__stepstone_maf_type__": "module:qualname", ...}``; a stored
  tag is only ever resolved to one of those types. Any other value is refused at
  ``save`` with ``InvalidState`` naming its path, e.g.
  ``checkpoint['messages']['upper'][0]['data']``, and ``save`` decodes what it is about
  to store, so it never accepts a checkpoint that ``load`` would refuse. MAF's storages
  pickle such values to base64; opt in to exactly that with ``encoding="maf"``, and only
  then does ``load`` ever unpickle, through MAF's restricted unpickler and
  ``allowed_checkpoint_types``. A record written with ``encoding="maf"`` is refused by a
  storage opened without it.

Record ids (the scheme the CLI, the dashboard and the other adapters match on): each
checkpoint is one stepstone record (a long one kept in pieces, so no backend's item
limit applies, Cosmos' 2 MB included), with no index record beside it::

    maf/<workflow name>/<checkpoint id>

each part after ``maf`` percent-encoded (``urllib.parse.quote(part, safe="")``), so the
id splits on ``/`` into exactly three parts; the same shape as the LangGraph adapter's
``langgraph/<thread>/<ns>/<checkpoint id>``. The record's ``workflow`` is ``"maf"`` (the
LangGraph adapter's is ``"langgraph"``), its ``state`` is ``{"format": "stepstone.maf/1",
"encoding": "json" | "maf", "checkpoint": {...}}``, its ``created_at`` and
``updated_at`` are the checkpoint's own ``timestamp`` (so ``stepstone runs prune
--older-than`` ages checkpoints by when MAF made them, and listings need no load), and
it is saved with status ``done`` (``total_steps=0``), so stepstone workers never claim it.

Costs: ``save`` is one conditional write. ``list_checkpoint_ids`` and ``get_latest``
read the store's run index (``list_info``: ids and times, no payloads) and load only
what they return. ``load`` and ``delete`` by checkpoint id alone read the index of ids
once, unless this storage object saved or listed that id already.

Spend budgets: ``usage_charge(response, prices)`` turns an agent's ``AgentResponse``
usage into ``ctx.charge``'s arguments, for a step that calls an agent.

Limits: MAF's runner logs a failed checkpoint save as a warning and carries on; this
storage cannot change that, so it also logs each failure at ERROR level on the
``stepstone`` logger and keeps the last one in ``last_error``.
"""

from __future__ import annotations

from .._extra import require

require("agent_framework", "Microsoft Agent Framework", "agent-framework", "agent_framework")

from ._encoding import TYPE_KEY
from ._records import (
    FORMAT,
    PREFIX,
    WORKFLOW,
    AgentFrameworkCheckpointError,
    CheckpointNotFound,
    parse_record_id,
    record_id,
)
from ._storage import StepstoneCheckpointStorage
from ._usage import usage_charge

__all__ = [
    "FORMAT",
    "PREFIX",
    "TYPE_KEY",
    "WORKFLOW",
    "AgentFrameworkCheckpointError",
    "CheckpointNotFound",
    "StepstoneCheckpointStorage",
    "parse_record_id",
    "record_id",
    "usage_charge",
]
