"""CosmosStore: one Azure Cosmos DB item per run, saved with ETag compare-and-swap.

Config string::

    cosmos://ACCOUNT-HOST[:PORT]/DATABASE/CONTAINER[?OPTIONS]

e.g. ``cosmos://myacct.documents.azure.com/stepstone/runs`` (Entra ID / managed identity)
or, against a local emulator with ``AZURE_COSMOS_KEY`` set,
``cosmos://127.0.0.1:8081/testdb/runs?verify=false&create=true``. The options are listed
in ``_config.OPTIONS`` and in ``backends/cosmos/README.md``.

Guarantees, and why they hold:

- **One request per load and per save**, sync or async. ``load`` is one point read
  (``read_item`` with the partition key, the cheapest Cosmos operation: 1 RU per KB).
  The first save is one ``create_item`` (Cosmos refuses a second item with the same id:
  409 -> ``ConflictError``); later saves are one ``replace_item`` with
  ``If-Match: <etag>`` (412 -> ``ConflictError``); ``delete`` with an expected version
  is one ``delete_item`` with ``If-Match``. Nothing is read before a write, so there is
  no window between check and write, and no query ever runs on the step path. The
  server's ``_etag`` is the version: opaque, and new on every write, including a run
  deleted and created again. The only extra requests are made once per client: the
  SDK's account read and one container read (which also checks the container exists
  and is partitioned by ``/id``). Both transports count what they send
  (``requests_sent``), so this is measured, not promised.
- **A cancelled or interrupted save leaves the item whole.** A save is a single HTTP
  request that Cosmos applies atomically: cancelling the task that awaits ``asave``
  leaves either the old or the new checkpoint, never a mix, and the client stays usable.
- **Finding work never reads finished runs.** Each item carries ``status``, ``due_at``
  (UTC text of fixed width, so it sorts as time does) and ``owner`` as top-level
  properties beside the state text. ``claimable`` queries them through the composite
  index (status, due_at) declared in ``CONTAINER_DEFINITION`` (and in
  ``backends/cosmos/container.json`` and ``main.bicep``), one equality query per active
  status, and selects only the listing fields, never the state.
- **Nothing is sent that Cosmos would refuse.** The state is validated and the item's
  size (its JSON exactly as the SDK serialises it) is checked against the 2 MB item limit
  before any request; an oversized checkpoint raises ``CheckpointTooLarge`` and the stored
  item is untouched.
- **Any run_id works, no two share an item.** Cosmos ids may not contain ``/ \\ # ?``
  and are at most 255 characters; see ``item_id``. The item keeps the original run_id and
  a load checks it, so a hash collision or a hand-copied item could never hand one run
  another's checkpoint (that run's load raises ``CorruptCheckpoint``; listings skip it).
- **Writes are never retried blindly.** A write whose connection dropped after it was
  sent may or may not have been applied; the SDK does not retry non-idempotent writes
  unless ``retry_write`` is set, and this store pins it off. Throttling (429) is retried
  by the SDK (bounded by ``retries``) because the server applied nothing; a connection
  that was never established is retried because nothing was sent. What is left is raised
  as ``StoreUnavailable`` with the HTTP status. Even a duplicate write could not corrupt a
  run: the ETag condition makes a replayed replace fail with 412.
- **A hung server is an error, not a hang.** ``connect_timeout`` (default 5 s) bounds
  opening a connection, ``read_timeout`` (default 30 s) waiting for each answer, and
  ``timeout`` (default 60 s) a whole store call with its retries; then the call raises
  ``StoreUnavailable``.
- **Closing under load is an error, not a crash.** A call in flight when ``close`` or
  ``aclose`` runs finishes or raises the closed-store ``StoreError`` (a write's message
  says it may or may not have been applied), whatever the driver raised.
- **Never creates infrastructure by surprise.** The database and container are created
  only by ``init()`` (``stepstone init``) or with ``create=true``; otherwise a missing one
  is a ``StoreError`` naming it.
- **Secrets stay out of URLs, reprs, logs and exceptions.** Keys come from the
  environment (``AZURE_COSMOS_KEY`` or ``AZURE_COSMOS_CONNECTION_STRING``) or Entra ID;
  a ``key=`` option is refused, and every message built from an SDK error is redacted.

The package, one concern a module: ``_config`` (the config string, its options and
credentials), ``_wire`` (item ids, the item layout both ways, the queries), ``_errors``
(the error table), ``_meter`` (counting requests at the transport), ``_effects`` (the SDK
calls a rule asks for, and the sync and async drivers), ``_setup`` (the container
definition and set-up), ``_aio`` (one aio client per event loop), ``_store`` (the Store
methods) and ``_admin`` (init, doctor, TTL, the dashboard's listing). Sync and async
share everything but the I/O: each rule is one generator of effects, which ``drive``
performs with plain calls and ``adrive`` awaits on ``azure.cosmos.aio``; the aio client
is built lazily, one per event loop, on an aiohttp transport that counts requests like
the sync one.
"""

from __future__ import annotations

from typing import Final

from ._config import CA_BUNDLE_ENV as CA_BUNDLE_ENV
from ._config import CONNECTION_STRING_ENV as CONNECTION_STRING_ENV
from ._config import KEY_ENV as KEY_ENV
from ._errors import EXCEPTION_RULES, STATUS_RULES, Call
from ._setup import CONTAINER_DEFINITION
from ._store import CosmosStore
from ._wire import CLAIM_DUE, CLAIM_RUNNING, LIST_QUERY, MAX_ITEM_BYTES, item_id
from ._wire import sortable_time as sortable_time

__all__ = ["CONTAINER_DEFINITION", "MAX_ITEM_BYTES", "CosmosStore", "item_id"]

# Importable from here as before, besides __all__: the credential variables' names and
# ``sortable_time`` (above), and the tables and queries the tests read.
_CLAIM_DUE: Final = CLAIM_DUE
_CLAIM_RUNNING: Final = CLAIM_RUNNING
_LIST_QUERY: Final = LIST_QUERY
_EXCEPTION_RULES: Final = EXCEPTION_RULES
_STATUS_RULES: Final = STATUS_RULES
_Call: Final = Call
