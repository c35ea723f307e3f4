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
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.datastructures import URL, FormData
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._checkpoint import STATUSES, Checkpoint, RunStatus
from .._errors import InvalidRunId, RunNotActive, RunNotFound, StepstoneError, StoreError
from .._observe import logger
from .._redact import Redactor, redact_url
from .._registry import open_store
from .._store import RunInfo, Store, page_key
from . import _actions, _views

__all__ = ["LOOPBACK_HOSTS", "TOKEN_COOKIE", "create_app"]

#: Host names a dashboard without a token answers to.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
TOKEN_COOKIE = "stepstone_ui"
PAGE_SIZE = 50
#: Largest form post accepted (a signal payload is the only big field).
MAX_BODY = 4 * 1024 * 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]

#: What a successful action says on the page it redirects to (fixed texts: a link cannot
#: make the page say something else).
_DONE = {
    "cancelled": "Cancelled the run.",
    "cancel-requested": "Cancel requested: the run stops at its next step boundary.",
    "signal": "Signal sent.",
    "signal-again": "This signal had been received before; nothing to do.",
    "retried": "Queued the run again: a worker retries its failed step.",
    "deleted": "Deleted the run.",
}


def _host_name(header: str) -> str:
    host = header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class _Guard:
    """Checks the host and the token of every request; adds the security headers."""

    def __init__(self, app: ASGIApp, token: str | None, render: Callable[..., str]) -> None:
        self.app = app
        self.token = token
        self.cookie = None if token is None else _cookie_value(token)
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)

    def _refusal(self, request: Request) -> Response | None:
        if self.token is None:
            host = _host_name(request.headers.get("host", ""))
            if host not in LOOPBACK_HOSTS:
                return self._page(
                    421,
                    "Unknown host",
                    "This dashboard has no token, so it answers only to loopback names "
                    "(127.0.0.1, localhost, ::1).",
                )
            return None
        given = request.query_params.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return self._page(401, "Wrong token", "The token in the link is not this one.")
            # Keep it in a cookie and drop it from the address bar (and from history).
            clean = request.url.remove_query_params("token")
            response = RedirectResponse(str(clean), status_code=303)
            response.set_cookie(
                TOKEN_COOKIE,
                self.cookie or "",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
            return response
        bearer = request.headers.get("authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(
            bearer[7:].encode(), self.token.encode()
        ):
            return None
        cookie = request.cookies.get(TOKEN_COOKIE, "")
        if self.cookie is not None and hmac.compare_digest(cookie.encode(), self.cookie.encode()):
            return None
        return self._page(
            401,
            "Token required",
            "This dashboard needs its token: open it once as /?token=YOUR_TOKEN (the token "
            "given to stepstone ui with --token or $STEPSTONE_UI_TOKEN).",
        )

    def _page(self, status: int, title: str, text: str) -> Response:
        return HTMLResponse(self.render("message.html", title=title, text=text), status)


def _cookie_value(token: str) -> str:
    # The cookie holds a digest of the token, not the token itself.
    return hashlib.sha256(b"stepstone-ui-cookie\0" + token.encode()).hexdigest()


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


def _guarded(
    dash: Dashboard, endpoint: Callable[[Request], Response]
) -> Callable[[Request], Response]:
    def guarded(request: Request) -> Response:
        try:
            return endpoint(request)
        except Exception as exc:
            return dash.failure(exc)

    return guarded


def _live_error(dash: Dashboard, request: Request, exc: Exception, live_id: str) -> Response:
    """Return a live part saying the store failed; it keeps polling, and re-renders in
    full once the store answers (its version ``error`` matches nothing)."""
    href = str(request.url.include_query_params(v="error"))
    href = href[href.index(request.url.path) :]
    text = f"{type(exc).__name__}: {dash.redactor(str(exc))}"
    return dash.page("_live_error.html", text=text, live_id=live_id, href=href)


# --- the runs list ------------------------------------------------------------------


class _Filter:
    """The list's filter and page, from the query string."""

    def __init__(self, request: Request) -> None:
        params = request.query_params
        status = params.get("status", "")
        self.status: RunStatus | None = status if status in STATUSES else None
        self.prefix = params.get("q", "")[:1024]
        self.after: tuple[datetime, str] | None = None
        cursor = params.get("after", "")
        stamp, sep, run_id = cursor.partition("|")
        if sep:
            try:
                parsed = datetime.fromisoformat(stamp)
            except ValueError:
                parsed = None
            if parsed is not None:
                self.after = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC), run_id)
        self.cursor = cursor if self.after is not None else ""

    def query(self, **changes: str) -> str:
        """Return the query string of this filter with ``changes`` applied."""
        values = {"status": self.status or "", "q": self.prefix, "after": self.cursor}
        values.update(changes)
        return urlencode({k: v for k, v in values.items() if v})


def _cursor(info: RunInfo) -> str:
    stamp, run_id = page_key(info)
    return f"{stamp.isoformat()}|{run_id}"


def _list_digest(counts: dict[str, int], infos: list[RunInfo]) -> str:
    data = json.dumps([counts, [(i.run_id, i.version, i.status) for i in infos]])
    return hashlib.sha256(data.encode()).hexdigest()[:20]


def _list_data(dash: Dashboard, flt: _Filter) -> tuple[dict[str, int], list[RunInfo], bool]:
    store = dash.store()
    counts = store.count_by_status(flt.prefix)
    limit = dash.page_size + 1
    infos = store.list_page(flt.status, prefix=flt.prefix, after=flt.after, limit=limit)
    more = len(infos) > dash.page_size
    return counts, infos[: dash.page_size], more


def _list_context(
    dash: Dashboard, flt: _Filter, counts: dict[str, int], infos: list[RunInfo], more: bool
) -> dict[str, Any]:
    store = dash.store()
    now = datetime.now(UTC)
    rows = []
    for info in infos:
        # The listing fields carry no workflow or wait; one point read per row of a page.
        try:
            cp = store.load(info.run_id)
        except StoreError:
            cp = None
        kind, name = _views.display_name(info.run_id)
        total = info.total_steps
        rows.append(
            {
                "info": info,
                "kind": kind,
                "name": name,
                "href": "/run?" + urlencode({"id": info.run_id}),
                "workflow": None if cp is None else cp.workflow,
                "workflow_version": None if cp is None else cp.workflow_version,
                "waiting_for": None if cp is None else cp.waiting_for,
                "progress": f"{info.step + 1}/{'?' if total is None else total}",
                "updated": _views.when(info.updated_at),
                "age": _views.ago(info.updated_at, now),
                "owner": info.owner,
            }
        )
    status_links = [
        (s, counts.get(s, 0), "/runs?" + flt.query(status=s, after=""), s == flt.status)
        for s in STATUSES
    ]
    bulk = []
    if not dash.read_only and flt.status is not None and infos:
        bulk = [a for a, allowed in _actions.BULK_ACTIONS.items() if flt.status in allowed]
    return {
        "flt": flt,
        "rows": rows,
        "counts": counts,
        "total": sum(counts.values()),
        "status_links": status_links,
        "all_href": "/runs?" + flt.query(status="", after=""),
        "next_href": ("/runs?" + flt.query(after=_cursor(infos[-1]))) if more else None,
        "first_href": ("/runs?" + flt.query(after="")) if flt.after is not None else None,
        "live_href": "/runs/live?"
        + flt.query()
        + ("&" if flt.query() else "")
        + urlencode({"v": _list_digest(counts, infos)}),
        "bulk": bulk,
    }


def _runs(dash: Dashboard, request: Request) -> Response:
    flt = _Filter(request)
    counts, infos, more = _list_data(dash, flt)
    done = request.query_params.get("done", "")
    return dash.page(
        "runs.html",
        **_list_context(dash, flt, counts, infos, more),
        done=_DONE.get(done),
    )


def _runs_live(dash: Dashboard, request: Request) -> Response:
    flt = _Filter(request)
    try:
        counts, infos, more = _list_data(dash, flt)
    except StoreError as exc:
        return _live_error(dash, request, exc, "runs-live")
    if _list_digest(counts, infos) == request.query_params.get("v"):
        return Response(status_code=204)
    return dash.page("_runs_live.html", **_list_context(dash, flt, counts, infos, more))


# --- one run ------------------------------------------------------------------------


def _run_context(dash: Dashboard, cp: Checkpoint) -> dict[str, Any]:
    now = datetime.now(UTC)
    kind, name = _views.display_name(cp.run_id)
    status = cp.status
    signal_name = ""
    if cp.waiting_for is not None and cp.waiting_for.startswith("signal "):
        signal_name = cp.waiting_for.removeprefix("signal ")
    actions = not dash.read_only
    return {
        "cp": cp,
        "kind": kind,
        "name": name,
        "status": status,
        "steps": _views.timeline(cp, now),
        "signals": _views.signal_rows(cp),
        "lease": _views.lease_text(cp, now),
        "state_json": _views.pretty_json(cp.state, cp.state_json),
        "input_json": None if cp.input is None else _views.pretty_json(cp.input),
        "parent_href": None if cp.parent is None else "/run?" + urlencode({"id": cp.parent}),
        "children": [(c, "/run?" + urlencode({"id": c})) for c in cp.children],
        "id_query": urlencode({"id": cp.run_id}),
        "live_href": "/run/live?" + urlencode({"id": cp.run_id, "v": cp.version or ""}),
        "can_signal": actions and status in ("queued", "running", "waiting", "failed"),
        "signal_name": signal_name,
        "signal_id": secrets.token_hex(16),
        "can_cancel": actions
        and status in ("queued", "running", "waiting", "failed")
        and not cp.cancel_requested,
        "can_retry": actions and status == "failed" and cp.workflow is not None,
        "can_delete": actions,
        # Rerun from a step and fork need the run's history, which checkpoints do not
        # keep yet: the actions are not offered.
        "has_history": False,
        "updated": _views.when(cp.updated_at),
        "created": _views.when(cp.created_at),
        "age": _views.ago(cp.updated_at, now),
    }


def _run_id(request: Request) -> str:
    return request.query_params.get("id", "")


def _run(dash: Dashboard, request: Request) -> Response:
    run_id = _run_id(request)
    cp = dash.store().load(run_id)
    if cp is None:
        return dash.page(
            "message.html", 404, title="No such run", text=f"There is no run {run_id!r}."
        )
    done = request.query_params.get("done", "")
    return dash.page("run.html", **_run_context(dash, cp), done=_DONE.get(done))


def _run_live(dash: Dashboard, request: Request) -> Response:
    run_id = _run_id(request)
    shown = request.query_params.get("v")
    try:
        # The cheap look first: most polls find the run as the page shows it.
        if shown and dash.store().version_of(run_id) == shown:
            return Response(status_code=204)
        cp = dash.store().load(run_id)
    except StoreError as exc:
        return _live_error(dash, request, exc, "run-live")
    if cp is None:
        return dash.page("_run_gone.html", run_id=run_id)
    if cp.version == shown:
        return Response(status_code=204)
    return dash.page("_run_live.html", **_run_context(dash, cp))


# --- actions ------------------------------------------------------------------------


def _refuse_write(dash: Dashboard, request: Request, form: FormData) -> Response | None:
    """Return a refusal unless the post may write: not read-only, same origin, CSRF ok."""
    if dash.read_only:
        return dash.page(
            "message.html", 403, title="Read-only", text="This dashboard is read-only."
        )
    origin = request.headers.get("origin")
    fetch_site = request.headers.get("sec-fetch-site")
    same = origin is None or URL(origin).netloc == request.headers.get("host", "")
    if not same or fetch_site not in (None, "same-origin", "none"):
        return dash.page(
            "message.html", 403, title="Refused", text="A form from another site was refused."
        )
    given = form.get("csrf")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), dash.csrf.encode()):
        return dash.page(
            "message.html",
            403,
            title="Refused",
            text="The form is from an earlier start of the dashboard: reload the page and retry.",
        )
    return None


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _act(dash: Dashboard, request: Request, form: FormData) -> Response:
    refusal = _refuse_write(dash, request, form)
    if refusal is not None:
        return refusal
    store = dash.store()
    run_id, version, action = _field(form, "id"), _field(form, "version"), _field(form, "action")
    back = "/run?" + urlencode({"id": run_id})
    try:
        if action == "cancel":
            text = _actions.cancel(store, run_id, version)
            done = "cancelled" if text == "cancelled the run" else "cancel-requested"
        elif action == "signal":
            text = _actions.signal(
                store,
                run_id,
                version,
                _field(form, "name"),
                _field(form, "payload"),
                _field(form, "sid") or secrets.token_hex(16),
            )
            done = "signal-again" if "received before" in text else "signal"
        elif action == "retry":
            _actions.retry(store, run_id, version)
            done = "retried"
        elif action == "delete":
            if _field(form, "confirm") != "yes":
                raise ValueError("tick the box to confirm the delete")
            _actions.delete(store, run_id, version)
            return RedirectResponse("/runs?done=deleted", status_code=303)
        else:
            raise ValueError(f"unknown action {action!r}")
    except (_actions.RunChanged, RunNotActive, RunNotFound, ValueError, StepstoneError) as exc:
        if isinstance(exc, StoreError) and not isinstance(exc, _actions.RunChanged):
            raise
        status = 409 if isinstance(exc, (_actions.RunChanged, RunNotActive)) else 400
        title = "The run changed" if isinstance(exc, _actions.RunChanged) else "Not done"
        cp = store.load(run_id)
        if cp is None:
            return dash.page("message.html", 404, title=title, text=str(exc))
        return dash.page("run.html", status, **_run_context(dash, cp), error=(title, str(exc)))
    return RedirectResponse(f"{back}&{urlencode({'done': done})}", status_code=303)


async def _action(dash: Dashboard, request: Request) -> Response:
    form = await request.form()
    from starlette.concurrency import run_in_threadpool  # noqa: PLC0415

    try:
        response: Response = await run_in_threadpool(_act, dash, request, form)
    except Exception as exc:
        return dash.failure(exc)
    return response


def _bulk_sync(dash: Dashboard, request: Request, form: FormData) -> Response:
    refusal = _refuse_write(dash, request, form)
    if refusal is not None:
        return refusal
    action = _field(form, "action")
    status = _field(form, "status")
    prefix = _field(form, "q")
    allowed = _actions.BULK_ACTIONS.get(action)
    if allowed is None or status not in allowed:
        return dash.page(
            "message.html",
            400,
            title="Not done",
            text=f"bulk {action!r} is not offered for runs with status {status!r}",
        )
    targets = _actions.bulk_targets(dash.store(), status, prefix)
    back = "/runs?" + urlencode({k: v for k, v in (("status", status), ("q", prefix)) if v})
    context: dict[str, Any] = {
        "action": action,
        "status": status,
        "prefix": prefix,
        "count": len(targets),
        "sample": [t.run_id for t in targets[:10]],
        "too_many": len(targets) > _actions.MAX_BULK,
        "max_bulk": _actions.MAX_BULK,
        "back": back,
    }
    confirmed = _field(form, "confirm")
    if not confirmed:
        return dash.page("confirm.html", **context)
    if confirmed != str(len(targets)) or context["too_many"]:
        return dash.page(
            "confirm.html",
            409,
            **context,
            error=f"the matching runs changed: {len(targets)} match now, you confirmed "
            f"{confirmed}. Check the count and confirm again.",
        )
    result = _actions.bulk(dash.store(), action, targets)
    verb = {"cancel": "Cancelled", "retry": "Queued again for a retry"}[action]
    return dash.page(
        "message.html", title="Done", text=result.summary(verb) + ".", back=back, ok=True
    )


async def _bulk(dash: Dashboard, request: Request) -> Response:
    form = await request.form()
    from starlette.concurrency import run_in_threadpool  # noqa: PLC0415

    try:
        response: Response = await run_in_threadpool(_bulk_sync, dash, request, form)
    except Exception as exc:
        return dash.failure(exc)
    return response


# --- the application ----------------------------------------------------------------


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
        return _guarded(dash, lambda request: fn(dash, request))

    def posted(
        fn: Callable[[Dashboard, Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await fn(dash, request)

        return endpoint

    routes = [
        Route("/", lambda request: RedirectResponse("/runs", status_code=303)),
        Route("/runs", sync(_runs)),
        Route("/runs/live", sync(_runs_live)),
        Route("/runs/bulk", posted(_bulk), methods=["POST"]),
        Route("/run", sync(_run)),
        Route("/run/live", sync(_run_live)),
        Route("/run/action", posted(_action), methods=["POST"]),
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
        middleware=[Middleware(_Guard, token=token, render=dash.render)],
        lifespan=lifespan,
        max_body_size=MAX_BODY,
    )
    app.state.dashboard = dash
    return app
