"""A LangGraph checkpointer on any stepstone store (``pip install stepstone[langgraph]``).

::

    from stepstone.adapters.langgraph import StepstoneSaver

    with StepstoneSaver.from_config("postgresql://app@db/agents") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "chat-42"}})

What is stored, one stepstone record per item (so no record grows with a thread's
history; a long checkpoint is kept in pieces, under Cosmos DB's 2 MB item limit):

- ``{prefix}/{thread}/{ns}/{checkpoint_id}``: one LangGraph checkpoint: its parent id,
  its metadata (as JSON when it is JSON, else serialized), the checkpoint's fields, and
  each channel value serialized by the saver's ``serde`` (LangGraph's
  ``JsonPlusSerializer``: msgpack) as ``[type, "b64", text]``: the bytes in base64.
  (Stores of earlier releases also hold ``[type, "text", text]``, the bytes as a string
  of one character per byte; they still load.)
- ``{prefix}/{thread}/{ns}/{checkpoint_id}/writes``: the pending writes of that
  checkpoint, one entry per ``(task_id, idx)``.
- ``{prefix}/{thread}/{ns}``: the head of the namespace: the latest checkpoint id, and
  the owner lease when the saver is given an ``owner``.

Thread ids, namespaces and checkpoint ids are percent-encoded in the keys. Each record
is a finished stepstone run (status ``done``, workflow ``langgraph``), so workers never
claim them and ``stepstone runs`` lists them under those names.

Write ownership, which LangGraph's own savers do not have: a checkpoint id is written
once (a second ``put`` of the same id with other content raises ``CheckpointConflict``),
and what a ``put`` may do follows what its writer read. A writer that loaded the
namespace's latest checkpoint (an ``invoke`` on a thread, its first ``source="input"``
checkpoint included), or continues from its own last ``put``, must extend the head:
if another process advanced the thread meanwhile, the write is refused with
``CheckpointConflict`` instead of landing beside the other writer's as if alone. A
writer that asked for a checkpoint by id (time travel: ``invoke`` or
``Command(resume=...)`` with a past ``checkpoint_id``, ``update_state`` on a past
config, a subgraph replaying from its own checkpoint) may branch from it, and the loop
then continues from that branch. The saver tells the two apart by the ids it hands out:
``get_tuple`` with an id, ``list`` and every ``parent_config`` give an ``AddressedId``
(a ``str``), which LangGraph carries into the config of the ``put`` built on it.
A ``put`` with no parent (a new thread) is not checked. With ``owner=`` (opt-in), each
thread namespace is leased to one owner: a write by anyone else while the lease is live
raises ``ThreadOwned``; after ``lease`` seconds without a write the next writer takes
over.

Streams: ``stream_graph(graph, input, config)`` inside a stepstone step runs the graph
with the stream modes ``custom`` and ``messages`` and emits them to the run's stream
(``_stream``).

Spend: ``StepstoneSaver(store, budget=Budget(...), prices=Prices(...))`` charges the
usage of the graph's AI messages to the thread's ledger, by message id, with the commit
of each checkpoint, and raises ``ThreadOverBudget`` at the limit (``_usage``).

Pickle: the default serializer never pickles, and a stored value of type ``pickle`` is
refused on load with ``UnsafeCheckpoint`` unless the saver is built with
``allow_pickle=True``.
"""

from .._extra import require

require(
    "langgraph",
    "LangGraph",
    "langgraph",
    "langchain_core.runnables",
    "langgraph.checkpoint.base",
    name_missing=True,
)

from ._codec import WORKFLOW as WORKFLOW  # the records' workflow name, as before
from ._errors import CheckpointConflict, ThreadOwned, UnsafeCheckpoint
from ._saver import StepstoneSaver
from ._stream import astream_graph, stream_graph
from ._usage import ThreadOverBudget

__all__ = [
    "CheckpointConflict",
    "StepstoneSaver",
    "ThreadOverBudget",
    "ThreadOwned",
    "UnsafeCheckpoint",
    "astream_graph",
    "stream_graph",
]
