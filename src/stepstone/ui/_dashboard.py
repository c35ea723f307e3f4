"""The dashboard's state (its store, templates, redactor) and the responses every page shares."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from .._checkpoint import STATUSES
from .._errors import InvalidRunId, StepstoneError, StoreError
from .._observe import logger
from .._redact import Redactor, redact_url
from .._registry import open_store
from .._store import Store
from . import _views
from ._guard import PAGE_SIZE

DONE = {
    "cancelled": "Cancelled the run.",
    "cancel-requested": "Cancel requested: the run stops at its next step boundary.",
    "signal": "Signal sent.",
    "signal-again": "This signal had been received before; nothing to do.",
    "budget": "Budget raised.",
    "budget-again": "This raise had been received before; nothing to do.",
    "retried": "Queued the run again: a worker retries its failed step.",
    "deleted": "Deleted the run.",
    "rerun": "Rewound the run: it runs again from the chosen step.",
    "forked": "Forked: this is the new run, started from the chosen step.",
}


class Dashboard:
    """The state of one dashboard: its store (opened on first use), settings, templates."""

    def __init__(
        self, config: str, *, read_only: bool = False, poll: float = 1.0, page_size: int = PAGE_SIZE
    ) -> None:
        self.config = config
        self.read_only = read_only
        self.poll = poll
        self.page_size = page_size
        self.csrf = secrets.token_urlsafe(32)
        self.redactor = Redactor()
        self.redactor.add(config)
        self.shown_store = redact_url(config)
        self._store: Store | None = None
        self._lock = threading.Lock()
        self.env = Environment(
            loader=PackageLoader("stepstone.ui", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["visible"] = _views.visible
        self.env.filters["when"] = _views.when
        self.env.globals.update(
            store_url=self.shown_store,
            read_only=read_only,
            csrf=self.csrf,
            poll=poll,
            statuses=STATUSES,
        )

    def store(self) -> Store:
        """Return the store, opening it on first use (a store down at start-up is retried)."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.config)
            return self._store

    def close(self) -> None:
        """Close the store if it was opened."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    def render(self, template: str, /, **context: Any) -> str:
        """Render a template."""
        return self.env.get_template(template).render(**context)

    def page(self, template: str, status: int = 200, /, **context: Any) -> HTMLResponse:
        """Render a template as a response."""
        return HTMLResponse(self.render(template, **context), status)

    def failure(self, exc: BaseException) -> HTMLResponse:
        """Return the page for an error: a message, secrets masked, never a traceback."""
        if isinstance(exc, InvalidRunId):
            return self.page("message.html", 400, title="Not a run id", text=str(exc))
        if isinstance(exc, StoreError):
            logger.warning("dashboard: store error: %s", self.redactor(str(exc)))
            title, status = "The store failed", 503
        elif isinstance(exc, StepstoneError):
            title, status = "The store could not be used", 503
        else:
            logger.exception("dashboard: unexpected error")
            title, status = "Unexpected error", 500
        text = f"{type(exc).__name__}: {self.redactor(str(exc))}"
        return self.page(
            "message.html",
            status,
            title=title,
            text=text,
            hint="The dashboard keeps serving: reload when the store is back.",
        )


def guarded_endpoint(
    dash: Dashboard, endpoint: Callable[[Request], Response]
) -> Callable[[Request], Response]:
    def guarded(request: Request) -> Response:
        try:
            return endpoint(request)
        except Exception as exc:  # noqa: BLE001 - any failure is shown as a page, the server serves on
            return dash.failure(exc)

    return guarded


def live_error(dash: Dashboard, request: Request, exc: Exception, live_id: str) -> Response:
    """Return a live part saying the store failed; it keeps polling, and re-renders in
    full once the store answers (its version ``error`` matches nothing)."""
    href = str(request.url.include_query_params(v="error"))
    href = href[href.index(request.url.path) :]
    text = f"{type(exc).__name__}: {dash.redactor(str(exc))}"
    return dash.page("_live_error.html", text=text, live_id=live_id, href=href)
