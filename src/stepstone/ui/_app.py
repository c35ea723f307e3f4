"""The dashboard's web application: Starlette routes over the ``Store`` interface.

Pages are rendered on the server (Jinja2, autoescaped); the vendored htmx file polls a
cheap version query and swaps a page's live part only when the run (or the page of runs)
changed. Endpoints are plain functions: Starlette runs them in its thread pool, where
the store's sync methods may block.

Safety, on every request: the Host header must name loopback unless a token is set (so
a DNS-rebinding page cannot reach a loopback dashboard); with a token, the request must
carry it (the ``?token=`` of the first visit, then an HttpOnly same-site cookie, or an
``Authorization: Bearer`` header). Writes are form posts with a per-server CSRF token
and a same-origin check; ``read_only`` refuses them all. Responses forbid inline
script (Content-Security-Policy), framing and caching.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ._dashboard import Dashboard, guarded_endpoint
from ._guard import LOOPBACK_HOSTS, MAX_BODY, PAGE_SIZE, TOKEN_COOKIE, Guard
from ._limits_view import limits_page
from ._pages import run_live, run_page, runs_live, runs_page
from ._posts import post_action, post_bulk
from ._schedules_view import schedules_page
from ._sse import stream_endpoint

__all__ = ["LOOPBACK_HOSTS", "TOKEN_COOKIE", "create_app"]


def create_app(
    config: str,
    *,
    token: str | None = None,
    read_only: bool = False,
    poll: float = 1.0,
    page_size: int = PAGE_SIZE,
) -> Starlette:
    """Return the dashboard for the store ``config`` as an ASGI application.

    Args:
        config: The store config string; it is opened on the first request and shown
            redacted.
        token: If set, every request must carry it; if None, the application answers only
            to loopback host names (serve it on loopback only).
        read_only: Show no actions and refuse every write.
        poll: Seconds between the pages' looks for changes.
        page_size: Runs per page of the list.
    """
    dash = Dashboard(config, read_only=read_only, poll=poll, page_size=page_size)

    def sync(fn: Callable[[Dashboard, Request], Response]) -> Callable[[Request], Response]:
        return guarded_endpoint(dash, lambda request: fn(dash, request))

    def posted(
        fn: Callable[[Dashboard, Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await fn(dash, request)

        return endpoint

    routes = [
        Route("/", lambda request: RedirectResponse("/runs", status_code=303)),
        Route("/runs", sync(runs_page)),
        Route("/limits", sync(limits_page)),  # flow control (issue 37)
        Route("/runs/live", sync(runs_live)),
        Route("/runs/bulk", posted(post_bulk), methods=["POST"]),
        # After the list's own paths: a run page is ``/runs/<id>`` (``run_href``).
        Route("/runs/{run_id:path}", sync(run_page)),
        Route("/run", sync(run_page)),
        Route("/run/live", sync(run_live)),
        Route("/run/action", posted(post_action), methods=["POST"]),
        # Streams (issue 34): the run page tails its events from here.
        Route("/run/stream", stream_endpoint(dash.store)),
        Route("/schedules", sync(schedules_page)),  # issue 33
        Mount("/static", StaticFiles(packages=[("stepstone.ui", "static")]), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            dash.close()

    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, token=token, render=dash.render)],
        lifespan=lifespan,
        max_body_size=MAX_BODY,
    )
    app.state.dashboard = dash
    return app
