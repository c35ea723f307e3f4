"""Counting requests at the transport: what each store call really sends.

Both transports sit below every SDK retry loop, so they see each attempt that goes out;
the meter also fires the save's ``cosmos.request_sent`` kill point.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any, Final, Self

from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.transport import AsyncHttpTransport, HttpTransport

from ... import _hooks

__all__ = ["AsyncWire", "Meter", "Wire"]

# Which store call the current thread or task is inside: (meter, caller, kind). A
# context variable, not a thread-local, so that tasks sharing a thread keep theirs apart.
_CALL: Final[contextvars.ContextVar[tuple[object, object, str] | None]] = contextvars.ContextVar(
    "stepstone_cosmos_call", default=None
)


def _caller() -> object:
    """The current asyncio task, or the current thread when no loop runs here."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task if task is not None else threading.get_ident()


class Meter:
    """Counts the requests both transports send, and fires the save's kill hook.

    Sitting below every SDK retry loop, the transports see each attempt that actually
    goes out, so ``requests_sent`` is a measurement, not an estimate. A request sent by
    the thread or task that is inside a store call counts in ``requests_sent``; one the
    SDK sends from its own background threads or tasks (endpoint refresh, health checks)
    in ``background_requests``: a task the SDK spawns inherits the context variable but
    is another task, which is why the caller is recorded beside it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests_sent = 0
        self.background_requests = 0

    @contextlib.contextmanager
    def calling(self, saving: bool = False) -> Iterator[None]:
        """Mark the current thread or task as inside a store call (``saving``: a save)."""
        token = _CALL.set((self, _caller(), "save" if saving else "call"))
        try:
            yield
        finally:
            _CALL.reset(token)

    def kind(self) -> str | None:
        """``save``, ``call`` or None (a background request) for the current sender."""
        mark = _CALL.get()
        if mark is None or mark[0] is not self or mark[1] != _caller():
            return None
        return mark[2]

    @contextlib.contextmanager
    def sending(self, request: Any) -> Iterator[None]:
        """Count the request a transport sends in the block (one that never left: not)."""
        kind = self.kind()
        try:
            yield
        except ServiceRequestError:
            raise  # no connection was made: nothing was sent
        except BaseException:
            self.sent(kind, request, answered=False)  # sent, no (whole) answer
            raise
        self.sent(kind, request, answered=True)

    def sent(self, kind: str | None, request: Any, answered: bool) -> None:
        """Count one request that went out; after a save's answered write, fire the hook."""
        with self._lock:
            if kind is None:
                self.background_requests += 1
            else:
                self.requests_sent += 1
        if answered and kind == "save" and request.method in ("POST", "PUT"):
            # The write reached the server and was answered; CosmosStore has not seen the
            # answer yet. A kill here must leave the NEW checkpoint visible.
            _hooks.fire("cosmos.request_sent")


class Wire(HttpTransport[Any, Any]):
    """The sync HTTP transport under the SDK, metered (see ``Meter``)."""

    def __init__(self, inner: HttpTransport[Any, Any], meter: Meter) -> None:
        self._inner = inner
        self._meter = meter

    def send(self, request: Any, **kwargs: Any) -> Any:
        with self._meter.sending(request):
            return self._inner.send(request, **kwargs)

    def open(self) -> None:
        self._inner.open()

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> Self:
        self._inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self._inner.__exit__(*args)


class AsyncWire(AsyncHttpTransport[Any, Any]):
    """The async (aiohttp) transport under the aio SDK, metered like ``Wire``."""

    def __init__(self, inner: AsyncHttpTransport[Any, Any], meter: Meter) -> None:
        self._inner = inner
        self._meter = meter

    async def send(self, request: Any, **kwargs: Any) -> Any:
        # azure-cosmos 4.x's aio request passes connection_cert=(None, None) whenever an
        # SSLConfiguration is set, which aiohttp's transport reads as a client
        # certificate to load, and fails; no client certificate is what it means.
        if kwargs.get("connection_cert") == (None, None):
            kwargs["connection_cert"] = None
        with self._meter.sending(request):
            return await self._inner.send(request, **kwargs)

    async def open(self) -> None:
        await self._inner.open()

    async def close(self) -> None:
        await self._inner.close()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self._inner.__aexit__(*args)
