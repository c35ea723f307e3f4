"""Server-Sent Events of a run's stream (issue 34): an endpoint for any Starlette app.

``stream_endpoint(store)`` returns an ASGI endpoint that answers
``GET ...?run_id=RUN&topic=T`` (or a ``{run_id}`` path parameter) with
``text/event-stream``: one SSE message per event, its ``id`` the event id and its
``data`` the event as JSON (``StreamEvent.to_json``). A browser's ``EventSource`` that
reconnects sends the last id as ``Last-Event-ID`` and the stream resumes after it
(``?after=`` does the same by hand), so nothing is lost or repeated. When the run ends
an ``end`` event is sent, so the client can close instead of reconnecting. The
dashboard mounts it at ``/run/stream``; in your own app::

    from starlette.routing import Route
    from stepstone.ui import stream_endpoint

    routes = [Route("/runs/{run_id:path}/events", stream_endpoint(store))]
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from .._errors import ConfigError, RunNotFound
from .._store import Store
from .._stream import StreamEvent, astream
from .._stream._events import parse_id

__all__ = ["format_event", "stream_endpoint"]

_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def format_event(event: StreamEvent) -> str:
    """Return one SSE message for ``event`` (``id`` and one ``data`` line of JSON)."""
    # json.dumps escapes newlines inside strings, so the data is always one line.
    return f"id: {event.id}\ndata: {json.dumps(event.to_json(), ensure_ascii=False)}\n\n"


def stream_endpoint(
    store: Store | Callable[[], Store],
) -> Callable[[Request], Awaitable[Response]]:
    """Return an endpoint serving runs' streams as Server-Sent Events from ``store``.

    ``store`` may be a callable returning the store (opened lazily, as the dashboard
    does). The run is the ``run_id`` path parameter, else the ``run_id`` query
    parameter; ``topic`` filters; ``Last-Event-ID`` (or ``after``) resumes. A run that
    does not exist is a 404, an id that is not an event id a 400.
    """

    async def endpoint(request: Request) -> Response:
        run_id = request.path_params.get("run_id") or request.query_params.get("run_id")
        if not run_id:
            return PlainTextResponse("run_id is required", status_code=400)
        after = request.headers.get("last-event-id") or request.query_params.get("after")
        topic = request.query_params.get("topic") or None
        try:
            parse_id(after)
        except ConfigError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        target = store() if callable(store) else store
        events = astream(target, run_id, topic=topic, after=after)
        try:
            first = await anext(events, None)
        except RunNotFound as exc:
            return PlainTextResponse(str(exc), status_code=404)
        return StreamingResponse(
            _messages(first, events), media_type="text/event-stream", headers=_HEADERS
        )

    return endpoint


async def _messages(
    first: StreamEvent | None, events: AsyncIterator[StreamEvent]
) -> AsyncIterator[str]:
    # ``retry`` tells EventSource how soon to reconnect after a dropped connection.
    yield "retry: 1000\n\n"
    if first is not None:
        yield format_event(first)
        async for event in events:
            yield format_event(event)
    yield "event: end\ndata: {}\n\n"
