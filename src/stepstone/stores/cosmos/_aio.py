"""The async part: one ``azure.cosmos.aio`` client per event loop, and closing it.

aiohttp sessions belong to the loop that made them, so the store keeps one client per
loop it serves. Each is closed on its own loop: by ``aclose`` there, or when the loop
shuts down. For that a client holds a *keeper*, an async generator left suspended on
its loop: ``asyncio.run`` (any loop that calls ``shutdown_asyncgens``) closes it before
closing the loop, and its ``finally`` closes the client, so a loop that ends while the
store stays open leaves no "Unclosed client session" behind. Imported on first async
use only where it matters: sync users need neither aiohttp nor the aio SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from azure.core.pipeline.transport import AsyncHttpTransport

from ..._errors import ConfigError
from ._config import Settings
from ._meter import AsyncWire, Meter

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential
    from azure.cosmos.aio import ContainerProxy as AsyncContainerProxy
    from azure.cosmos.aio import CosmosClient as AsyncCosmosClient

__all__ = [
    "AioClient",
    "aclose_client",
    "aclose_quietly",
    "close_elsewhere",
    "keep_until_loop_ends",
    "new_async_client",
]


@dataclass
class AioClient:
    """The aio client of one event loop (aiohttp sessions belong to the loop)."""

    loop: asyncio.AbstractEventLoop
    client: AsyncCosmosClient
    container: AsyncContainerProxy
    credential: AsyncTokenCredential | None
    #: Closes the client when the loop shuts down (``keep_until_loop_ends``).
    keeper: AsyncGenerator[None, None] | None = None


def _credential(
    settings: Settings,
    credential: str | TokenCredential | None,
    async_credential: AsyncTokenCredential | None,
) -> tuple[Any, AsyncTokenCredential | None]:
    """The credential for an aio client, and the one the store must close after."""
    if isinstance(credential, str) or credential is None:
        return credential, None
    if async_credential is not None:
        return async_credential, None
    if settings.auth != "entra":
        raise ConfigError("the async methods need an AsyncTokenCredential: pass async_credential=")
    try:
        from azure.identity.aio import (  # noqa: PLC0415 - only Entra ID users need it
            DefaultAzureCredential as AsyncDefaultAzureCredential,
        )
    except ImportError as exc:  # pragma: no cover - azure-identity is in the extra
        raise ConfigError(
            "auth=entra needs azure-identity: pip install 'stepstone[cosmos]'"
        ) from exc
    owned = AsyncDefaultAzureCredential()
    return owned, owned


def new_async_client(
    settings: Settings,
    meter: Meter,
    credential: str | TokenCredential | None,
    async_credential: AsyncTokenCredential | None,
    transport: AsyncHttpTransport[Any, Any] | None,
    client_kwargs: dict[str, Any],
) -> tuple[AsyncCosmosClient, AsyncTokenCredential | None]:
    """A new aio client on a metered aiohttp transport, and the credential it owns."""
    try:
        # Imported on first async use: sync users need neither aiohttp nor aio.
        from azure.core.pipeline.transport import AioHttpTransport  # noqa: PLC0415
        from azure.cosmos.aio import CosmosClient as AioClient  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            "CosmosStore's async methods need aiohttp: pip install 'stepstone[cosmos]'"
        ) from exc
    inner = transport or AioHttpTransport(**settings.transport_config())
    key, owned = _credential(settings, credential, async_credential)
    client = AioClient(
        settings.endpoint,
        key,
        transport=AsyncWire(inner, meter),
        **client_kwargs,
    )
    return client, owned


async def aclose_quietly(client: Any, credential: Any) -> None:
    """Close an aio client and its credential, whatever closing them raises."""
    with contextlib.suppress(Exception):
        await client.close()
    if credential is not None:
        with contextlib.suppress(Exception):
            await credential.close()


async def _keeper(
    aio: AioClient, forget: Callable[[AioClient], None]
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        forget(aio)
        await aclose_quietly(aio.client, aio.credential)


async def keep_until_loop_ends(aio: AioClient, forget: Callable[[AioClient], None]) -> None:
    """Have ``aio`` closed (and ``forget`` called with it) when its loop shuts down.

    Call on ``aio.loop``. The keeper's first step registers it with the loop (its async
    generator hooks); the loop's ``shutdown_asyncgens``, or the keeper being collected,
    runs its ``finally`` on that loop.
    """
    keeper = _keeper(aio, forget)
    await anext(keeper)
    aio.keeper = keeper


async def aclose_client(aio: AioClient) -> None:
    """Close ``aio`` now, from a coroutine on its loop (its keeper first, if it has one)."""
    keeper, aio.keeper = aio.keeper, None
    if keeper is not None:
        with contextlib.suppress(Exception):
            await keeper.aclose()  # its finally closes the client
        return
    await aclose_quietly(aio.client, aio.credential)


def close_elsewhere(aio: AioClient) -> None:
    """Close an aio client from sync code: on its loop if that loop still runs."""
    loop = aio.loop
    if loop.is_closed():
        return  # its sessions died with the loop
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    closing = aclose_client(aio)
    if running is loop:
        # close() called from a coroutine on that loop: it cannot wait for itself.
        loop.create_task(closing)
    elif loop.is_running():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(closing, loop).result(timeout=5)
    else:
        with contextlib.suppress(Exception):
            loop.run_until_complete(closing)
