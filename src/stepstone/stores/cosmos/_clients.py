"""The clients of a ``CosmosStore``: one sync client, one aio client per event loop.

A mixin of ``CosmosStore`` (``_store.py``): opening is one rule (``_connect``, the
database and container checked or created) driven by both drivers, under a lock per
kind of caller. ``CosmosStore`` supplies the state (``__init__``), ``_translate`` and
the drivers ``_run`` and ``_arun``.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from azure.core.pipeline.transport import AsyncHttpTransport
from azure.cosmos import CosmosClient

from ._aio import (
    AioClient,
    aclose_client,
    aclose_quietly,
    keep_until_loop_ends,
    new_async_client,
)
from ._config import Settings
from ._effects import Enter, Steps, sdk_call
from ._errors import Call, closed_error
from ._meter import Meter, Wire
from ._setup import check_partition_key, create_resources, read_container

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential
    from azure.cosmos import ContainerProxy

__all__ = ["CosmosClients"]

T = TypeVar("T")


class CosmosClients:
    """The opening side of ``CosmosStore``: its clients and its container, built once."""

    settings: Settings
    endpoint: str
    _credential: str | TokenCredential | None
    _async_credential: AsyncTokenCredential | None
    _async_transport: AsyncHttpTransport[Any, Any] | None
    _meter: Meter
    _wire: Wire
    _client: CosmosClient | None
    _container: ContainerProxy | None
    _open_lock: threading.Lock
    _aios: dict[asyncio.AbstractEventLoop, AioClient]
    _aio_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock]
    _closed: bool

    # -- opening: one rule (``_connect``), a lock per kind of caller ----------------------

    def _connect(self, client: Any) -> Steps[Any]:
        """Check (or create) the database and the container; return the container."""
        settings = self.settings
        with self._translate(Call("connect")):
            yield Enter(client)  # the aio client's account read (the sync one has made it)
            database = client.get_database_client(settings.database)
            container = database.get_container_client(settings.container)
            if settings.create:
                yield from create_resources(settings, client)
            # Reads the container's properties, which the SDK caches for every later
            # item call, so this is the request the SDK would make anyway.
            properties = yield from read_container(settings, container, database)
        check_partition_key(settings, properties)
        return container

    def _client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the sync and the aio ``CosmosClient`` alike."""
        return self.settings.client_kwargs()

    def _sync_client(self, call: Call) -> CosmosClient:
        """The sync client, built once (its constructor reads the account)."""
        if self._client is None:
            with self._translate(call), sdk_call(self._meter):
                self._client = CosmosClient(
                    self.endpoint,
                    cast(Any, self._credential),
                    transport=self._wire,
                    **self._client_kwargs(),
                )
        return self._client

    def _ensure_open(self) -> ContainerProxy:
        """Build the client once, and check (or create) the database and container."""
        container = self._container
        if container is not None:
            return container
        with self._open_lock:
            if self._container is None:
                self._refuse_closed()
                client = self._sync_client(Call("connect"))
                self._container = self._run(self._connect(client))
            return self._container

    def _refuse_closed(self) -> None:
        if self._closed:
            raise closed_error(repr(self))

    def _loop_lock(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        with self._open_lock:
            lock = self._aio_locks.get(loop)
            if lock is None:
                lock = self._aio_locks[loop] = asyncio.Lock()
            return lock

    async def _aensure_open(self) -> Any:
        """``_ensure_open`` for the running event loop's aio client."""
        loop = asyncio.get_running_loop()
        aio = self._aios.get(loop)
        if aio is not None:
            return aio.container
        async with self._loop_lock(loop):
            aio = self._aios.get(loop)
            if aio is None:
                self._refuse_closed()
                # Each loop its own client, closed on that loop (``_aio``); clients of
                # other loops, running or not, are left to theirs.
                aio = await self._new_aio(loop)
                with self._open_lock:
                    closed = self._closed
                    if not closed:
                        self._aios[loop] = aio
                if closed:
                    await aclose_client(aio)
                    self._refuse_closed()
            return aio.container

    def _forget(self, aio: AioClient) -> None:
        """Drop ``aio`` (its loop is shutting down, or it is being closed)."""
        with self._open_lock:
            if self._aios.get(aio.loop) is aio:
                del self._aios[aio.loop]
                self._aio_locks.pop(aio.loop, None)

    async def _new_aio(self, loop: asyncio.AbstractEventLoop) -> AioClient:
        """A new aio client for ``loop``, its container checked; closed if that fails."""
        client, owned = new_async_client(
            self.settings,
            self._meter,
            self._credential,
            self._async_credential,
            self._async_transport,
            self._client_kwargs(),
        )
        try:
            container = await self._arun(self._connect(client))
        except BaseException:
            await aclose_quietly(client, owned)
            raise
        aio = AioClient(loop, client, container, owned)
        await keep_until_loop_ends(aio, self._forget)
        return aio

    # -- what ``CosmosStore`` supplies -----------------------------------------------

    def _translate(self, call: Call) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _run(self, steps: Steps[T]) -> T:
        raise NotImplementedError

    async def _arun(self, steps: Steps[T]) -> T:
        raise NotImplementedError
