"""The dashboard's guard: an ASGI middleware every request passes first.

The Host header must name loopback unless a token is set (so a DNS-rebinding page
cannot reach a loopback dashboard); with a token, the request must carry it (the
``?token=`` of the first visit, then an HttpOnly same-site cookie, or an
``Authorization: Bearer`` header). Responses forbid inline script
(Content-Security-Policy), framing and caching.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

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

SECURITY_HEADERS = [
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


def _host_name(header: str) -> str:
    host = header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class Guard:
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
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
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
