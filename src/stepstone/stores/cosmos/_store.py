"""``CosmosStore``: the Store methods, each one rule driven sync and async.

Every method that talks to the service is a generator of effects (``_effects``) in
this class (``_load``, ``_save``, ``_delete``, ``_list``, ``_claimable``, ``_connect``);
the public method and its ``a``-prefixed twin only pick the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from azure.core import MatchConditions
from azure.core.pipeline.transport import AsyncHttpTransport, HttpTransport, RequestsTransport
from azure.cosmos import CosmosClient
from azure.cosmos.exceptions import CosmosResourceNotFoundError

from ... import _statelog
from ..._checkpoint import Checkpoint, RunStatus, check_run_id
from ..._errors import StoreError
from ..._observe import logger
from ..._reserved import is_reserved
from ..._store import RunInfo
from .._common import Unanswered
from ._admin import Admin
from ._aio import (
    AioClient,
    aclose_client,
    close_elsewhere,
)
from ._clients import CosmosClients
from ._clock import CosmosClock
from ._config import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    Settings,
    parse_config,
)
from ._effects import (
    OPEN,
    Effect,
    Gather,
    Query,
    Steps,
    adrive,
    aperform,
    drive,
)
from ._effects import perform as perform_sync
from ._errors import OWNER_MISSING, Call, closed_error, error_for
from ._meter import Meter, Wire
from ._pieces import CosmosPieces, _Ctx
from ._wire import (
    LIST_QUERY,
    Plan,
    claim_queries,
    claimed,
    decode,
    encode,
    infos,
    item_id,
    saved,
    source,
)
from ._wire import plan as plan_save

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential
    from azure.cosmos import ContainerProxy

__all__ = ["CosmosStore"]

T = TypeVar("T")

#: How many times a load reads a long state's item and pieces before it calls a piece
#: that stays missing corrupt (back-off 50, 100, 200, 400 ms between reads).
_READ_AGAIN = 5


# A run in one of these has its stream's blocks given its ttl (``_expire_stream``).
_AT_REST = frozenset({"done", "failed", "cancelled"})


class CosmosStore(CosmosClock, CosmosClients, CosmosPieces, Admin):
    """Checkpoints as items of an Azure Cosmos DB (NoSQL API) container partitioned by /id.

    Open it with ``open_store("cosmos://...")`` or build it directly; the clients connect
    lazily, on the first call that needs the server. Thread-safe: one sync client is
    shared; the async methods use one aio client per event loop.

    Counters for tests and benchmarks: ``requests_sent`` (HTTP requests made by store
    calls, sync and async, SDK retries included) and ``background_requests`` (the SDK's
    own).
    """

    scheme: ClassVar[str] = "cosmos"
    durability_levels: ClassVar[tuple[str, ...]] = ()
    kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"cosmos.before_request": False, "cosmos.request_sent": True}
    )
    holds_pieces: ClassVar[bool] = True
    piece_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.piece": False, "pieces.written": False, "pieces.collect": True}
    )
    cleanup_kill_points: ClassVar[Mapping[str, bool]] = MappingProxyType(
        {"pieces.deleting": True, "pieces.collecting": True}
    )
    supports_ttl: ClassVar[bool] = True
    counts_requests: ClassVar[bool] = True
    native_async: ClassVar[bool] = True
    claims_by_kind: ClassVar[bool] = True
    _pieces_reads: ClassVar[int] = _READ_AGAIN
    _pieces_lagging: ClassVar[bool] = True
    # No push wake-ups (listen: None, workers back off): the change feed is a paid poll.

    def __init__(
        self,
        endpoint: str,
        database: str,
        container: str,
        *,
        credential: str | TokenCredential | None = None,
        async_credential: AsyncTokenCredential | None = None,
        auth: str = "key",
        verify: bool = True,
        create: bool = False,
        consistency: str | None = None,
        retries: int = DEFAULT_RETRIES,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        ttl: int | None = None,
        transport: HttpTransport[Any, Any] | None = None,
        async_transport: AsyncHttpTransport[Any, Any] | None = None,
    ) -> None:
        """Describe the store; nothing is sent until the first call.

        Args:
            endpoint: ``https://ACCOUNT.documents.azure.com:443/``.
            credential: the account key, or an azure-identity ``TokenCredential``.
            async_credential: the ``AsyncTokenCredential`` the async methods use when
                ``credential`` is a (sync) ``TokenCredential``; with ``auth="entra"``
                and none given, azure-identity's async ``DefaultAzureCredential``.
            auth: what ``credential`` is, for messages (``key``, ``entra``,
                ``connection-string``).
            timeout: seconds for a whole store call, retries included.
            connect_timeout: seconds to open a connection.
            read_timeout: seconds to wait for each answer.
            transport: an azure-core transport to send through (tests stub it).
            async_transport: the same for the async methods (default: aiohttp).

        Raises:
            ConfigError: a bad name, consistency level, timeout or ttl.
        """
        self.settings = Settings(
            endpoint if endpoint.endswith("/") else endpoint + "/",
            database,
            container,
            auth=auth,
            verify=verify,
            create=create,
            consistency=consistency,
            retries=retries,
            timeout=timeout,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            ttl=ttl,
        )
        self.endpoint = self.settings.endpoint
        self.database_name = database
        self.container_name = container
        self.auth = auth
        self._credential = credential
        self._async_credential = async_credential
        self._secret = credential if isinstance(credential, str) else None
        self._meter = Meter()
        # Saves whose answer was lost, for their retry (``stores._common.Unanswered``).
        self._unanswered = Unanswered()
        self._wire = Wire(
            transport
            if transport is not None
            else RequestsTransport(**self.settings.transport_config()),
            self._meter,
        )
        self._async_transport = async_transport
        self._client: CosmosClient | None = None
        self._container: ContainerProxy | None = None
        self._open_lock = threading.Lock()
        # One aio client per event loop (see ``_aio``), and the lock it is made under.
        self._aios: dict[asyncio.AbstractEventLoop, AioClient] = {}
        self._aio_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._closed = False

    @classmethod
    def from_config(cls, config: str) -> Self:
        """Open ``cosmos://HOST[:PORT]/DATABASE/CONTAINER[?OPTIONS]``; see the package doc.

        Credentials never come from the string: ``AZURE_COSMOS_KEY``,
        ``AZURE_COSMOS_CONNECTION_STRING`` or Entra ID (DefaultAzureCredential).

        Raises:
            ConfigError: the string is malformed, has an unknown option or a secret.
            StorePermissionError: ``auth=key`` or ``auth=connection-string`` without
                the environment variable it needs.
        """
        s, credential = parse_config(config)
        return cls(s.endpoint, s.database, s.container, credential=credential, **s.options())

    def __repr__(self) -> str:
        # Endpoint, names and auth kind only: never the credential.
        return (
            f"CosmosStore(endpoint={self.endpoint!r}, database={self.database_name!r}, "
            f"container={self.container_name!r}, auth={self.auth!r})"
        )

    @property
    def requests_sent(self) -> int:
        """HTTP requests store calls have sent so far, sync and async (retries count)."""
        return self._meter.requests_sent

    @property
    def background_requests(self) -> int:
        """HTTP requests the SDK sent on its own threads or tasks (endpoint refresh)."""
        return self._meter.background_requests

    # -- the two drivers -------------------------------------------------------------

    def _perform(self, effect: Effect) -> Any:
        return perform_sync(effect, self._meter, self._ensure_open)

    async def _aperform(self, effect: Effect) -> Any:
        return await aperform(effect, self._meter, self._aensure_open)

    def _run(self, steps: Steps[T]) -> T:
        return drive(steps, self._perform)

    async def _arun(self, steps: Steps[T]) -> T:
        return await adrive(steps, self._aperform)

    # -- what every rule shares ------------------------------------------------------

    @contextlib.contextmanager
    def _translate(self, call: Call) -> Iterator[None]:
        """Map SDK and transport exceptions to stepstone's, in this one place.

        A plain context manager, so the rules share it across their ``yield``.
        """
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            if self._closed:
                # close() or aclose() ran while this call was in flight and pulled the
                # transport from under it (the SDK raises ValueError, aiohttp assertions):
                # that is the closed-store error, whatever the driver calls it.
                raise closed_error(repr(self), call) from exc
            error = error_for(exc, call, self.settings, self._secret)
            if error is None:
                raise
            raise error from exc

    @staticmethod
    def _item_missing(exc: CosmosResourceNotFoundError) -> None:
        """Re-raise a 404 that means the container is gone; return for a missing item."""
        if getattr(exc, "sub_status", None) == OWNER_MISSING:
            raise exc

    def _where(self) -> str:
        return f"{self.database_name}/{self.container_name}"

    def _source(self, doc_id: object) -> str:
        return source(doc_id, self._where())

    def _checkpoint(self, doc: Any, run_id: str) -> Checkpoint:
        """Return the checkpoint an item holds, refusing one that is not ``run_id``'s."""
        return decode(
            doc, run_id, self._source(doc.get("id") if isinstance(doc, Mapping) else None)
        )

    def _item(self, cp: Checkpoint, doc_id: str, state_text: str) -> tuple[dict[str, Any], int]:
        """Return the item for ``cp`` and its size in bytes as the SDK will send it."""
        return encode(cp, doc_id, state_text, self.settings.ttl)

    def _plan(self, checkpoint: Checkpoint) -> Plan:
        """Encode and check a save before any request (InvalidState, CheckpointTooLarge)."""
        return plan_save(self, checkpoint, self.settings.ttl)

    @staticmethod
    def _saved(plan: Plan, checkpoint: Checkpoint, result: Any) -> Checkpoint:
        return saved(plan, checkpoint, result)

    def _cas(self, version: str | None) -> dict[str, Any]:
        """Keyword arguments of a write that must find ``version`` (If-Match)."""
        if version is None:
            return {"timeout": self.settings.timeout}
        return {
            "etag": version,
            "match_condition": MatchConditions.IfNotModified,
            "timeout": self.settings.timeout,
        }

    # -- the rules -------------------------------------------------------------------

    def _read(self, container: Any, doc_id: str, run_id: str) -> Steps[Any]:
        """The run's item as the service answers it, or None."""
        with self._translate(Call("load", run_id)):
            try:
                return (yield self._on_item(container, "read_item", doc_id))
            except CosmosResourceNotFoundError as exc:
                self._item_missing(exc)
                return None

    def _load(self, run_id: str) -> Steps[Checkpoint | None]:
        doc_id = item_id(check_run_id(run_id))
        container = yield OPEN
        doc = yield from self._read(container, doc_id, run_id)
        if doc is None:
            return None
        # A piece missing means a newer save collected it (read the item again), or, on
        # an account whose reads may lag (Session or Eventual consistency, another
        # writer's session), that this replica has not seen it yet: the same item is
        # read again after a back-off (``_pieces_lagging``).
        ctx = _Ctx(container, doc_id, run_id)
        return (yield from self._pieces_load(ctx, doc, None))  # type: ignore[no-any-return]

    def collect_orphans(self, min_age: float = _statelog.ORPHAN_AGE) -> list[_statelog.Orphan]:
        """Delete orphaned piece items older than ``min_age`` (``Store.collect_orphans``).

        One cross-partition query over the piece items, then a point read per run found.

        Raises:
            StoreUnavailable: the service cannot be reached, throttles or times out.
            StorePermissionError: the credentials were refused or are missing.
        """
        return self._run(self._orphans(min_age))

    async def acollect_orphans(
        self, min_age: float = _statelog.ORPHAN_AGE
    ) -> list[_statelog.Orphan]:
        """Async ``collect_orphans``."""
        return await self._arun(self._orphans(min_age))

    def piece_keys(self, run_id: str) -> list[str]:
        """Every piece key stored for ``run_id``, sorted (one query)."""
        return self._run(self._keys(run_id))

    async def apiece_keys(self, run_id: str) -> list[str]:
        """Async ``piece_keys``."""
        return await self._arun(self._keys(run_id))

    def pieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The bytes of those of ``keys`` that are stored (one query)."""
        return self._run(self._pieces_named(run_id, keys))

    async def apieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Async ``pieces``."""
        return await self._arun(self._pieces_named(run_id, keys))

    def put_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> None:
        """Store ``pieces`` for ``run_id``; a key already stored is kept as it is."""
        self._run(self._put_pieces(run_id, pieces))

    async def aput_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> None:
        """Async ``put_pieces``."""
        await self._arun(self._put_pieces(run_id, pieces))

    def _query(self, query: str, parameters: list[dict[str, Any]] | None = None) -> Steps[Any]:
        container = yield OPEN
        with self._translate(Call("query")):
            return (yield Query(container, query, parameters, self.settings.timeout))

    def _list(self) -> Steps[list[RunInfo]]:
        return infos((yield from self._query(LIST_QUERY)), self._where())

    def _claimable(
        self, now: datetime, limit: int, status: RunStatus | None, skip: int
    ) -> Steps[list[RunInfo]]:
        queries = claim_queries(now, limit, status, skip)
        container = yield OPEN
        timeout = self.settings.timeout
        with self._translate(Call("query")):
            rows = yield Gather(tuple(Query(container, q, p, timeout) for q, p in queries))
        if status is not None:
            return infos(rows[0][skip:], self._where())
        return claimed(rows, limit, self._where())

    # -- the Store methods: each rule, driven sync or async ------------------------------

    def load(self, run_id: str) -> Checkpoint | None:
        """Return the run's checkpoint (one point read), or None.

        Raises:
            InvalidRunId: not a valid run id.
            CorruptCheckpoint: the item is not a stepstone checkpoint, or another run's.
            StoreUnavailable: the service cannot be reached, throttles or times out.
            StorePermissionError: the credentials were refused or are missing.
        """
        return self._run(self._load(run_id))

    async def aload(self, run_id: str) -> Checkpoint | None:
        """Async ``load``: one point read through the aio client; same errors."""
        return await self._arun(self._load(run_id))

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Store ``checkpoint`` with one create (no version) or If-Match replace.

        Raises:
            ConflictError: the stored version differs (409/412) or the run was deleted.
            InvalidState: the state does not round-trip through JSON; nothing was sent.
            CheckpointTooLarge: over 2 MB as an item; nothing was sent.
            StoreUnavailable: unreachable, throttled, timed out; a write whose answer was
                lost says it may or may not have been applied.
            StorePermissionError: the credentials were refused or are missing.
        """
        saved = self._run(self._save(checkpoint))
        if self._rests_with_ttl(saved):
            self._expire_stream(saved.run_id)
        return saved

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        """Async ``save``: one request; cancelling it leaves the old or the new item."""
        saved = await self._arun(self._save(checkpoint))
        if self._rests_with_ttl(saved):
            await asyncio.to_thread(self._expire_stream, saved.run_id)
        return saved

    def _rests_with_ttl(self, cp: Checkpoint) -> bool:
        """Whether ``cp`` puts a run to rest under the ``ttl`` option (its blocks wait)."""
        ttl = self.settings.ttl
        return ttl is not None and ttl > 0 and cp.status in _AT_REST and not is_reserved(cp.run_id)

    def _expire_stream(self, run_id: str) -> None:
        """Give the blocks of a run that came to rest its ttl (they were written with -1).

        One point read when the run has no stream. A failure leaves the blocks at -1:
        the run's save stands, and ``prune`` removes them once the run is gone.
        """
        from ..._stream._retention import expire_stream  # noqa: PLC0415 - streams import stores

        try:
            expire_stream(self, run_id, self.settings.ttl)
        except StoreError as exc:
            logger.warning(
                "%s: the stream of run %r keeps no ttl (%s); prune removes it with the run",
                self._where(),
                run_id,
                type(exc).__name__,
            )

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Delete the run's item (one request, If-Match with ``expected_version``).

        Raises:
            InvalidRunId: not a valid run id.
            ConflictError: ``expected_version`` is no longer the stored one (412);
                nothing was deleted.
            StoreUnavailable: the service cannot be reached, throttles or times out.
            StorePermissionError: the credentials were refused or are missing.
        """
        return self._run(self._delete(run_id, expected_version))

    async def adelete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        """Async ``delete``; same contract, same errors."""
        return await self._arun(self._delete(run_id, expected_version))

    def list_runs(self) -> Iterator[str]:
        """Yield every run_id (a query, one request per page; malformed items skipped).

        Raises:
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        return iter([info.run_id for info in self._run(self._list())])

    async def alist_runs(self) -> AsyncIterator[str]:
        """Async ``list_runs``."""
        for info in await self._arun(self._list()):
            yield info.run_id

    def list_info(self) -> Iterator[RunInfo]:
        """One query for every run's listing fields, without reading the states.

        A hand-edited or foreign item is logged and skipped; the others are listed.

        Raises:
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        return iter(self._run(self._list()))

    async def alist_info(self) -> AsyncIterator[RunInfo]:
        """Async ``list_info``."""
        for info in await self._arun(self._list()):
            yield info

    def claimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """Return running runs and due queued/waiting ones, from the (status, due_at) index.

        Three queries, one per active status, each an equality on ``status`` with
        ``due_at`` ordered (and bounded by ``now`` for the due kinds): served by the
        composite index, they read no finished run and no state. With ``status``, one
        page of that kind (``Store.claimable``).

        Raises:
            ValueError: ``now`` is naive, ``limit`` is not positive, ``status`` is not
                active or ``skip`` is negative.
            StoreUnavailable: the service cannot be reached, throttles or times out.
        """
        return self._run(self._claimable(now, limit, status, skip))

    async def aclaimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """Async ``claimable``: the same three indexed queries, run concurrently."""
        return await self._arun(self._claimable(now, limit, status, skip))

    def close(self) -> None:
        """Close the sync client, and the aio one where its loop allows; idempotent."""
        with self._open_lock:
            self._closed = True
            client, self._client = self._client, None
            self._container = None
            aios = list(self._aios.values())
            self._aios.clear()
            self._aio_locks.clear()
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        for aio in aios:
            close_elsewhere(aio)

    async def aclose(self) -> None:
        """Close the aio client of this loop (and the others, where possible), then sync."""
        with self._open_lock:
            aio = self._aios.pop(asyncio.get_running_loop(), None)
        if aio is not None:
            await aclose_client(aio)
        self.close()
