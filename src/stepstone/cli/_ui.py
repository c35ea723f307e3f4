"""``stepstone ui``: serve the dashboard (``stepstone.ui``) for a store.

Binds 127.0.0.1 by default. Any other address needs a token (``--token`` or
``$STEPSTONE_UI_TOKEN``), which every request must then carry; the token is never
printed. Needs the ``ui`` extra.
"""

from __future__ import annotations

import argparse
import os

from .._redact import redact_url
from ._commands import Commands
from ._common import (
    EXIT_OK,
    UsageError,
    bounded_int,
    opened,
    require_store,
    store_config,
    without_creating,
)
from ._output import PROG, REDACT, emit_json, out, safe

__all__ = ["TOKEN_ENV", "add_parsers"]

TOKEN_ENV = "STEPSTONE_UI_TOKEN"
#: Addresses served without a token: this machine only.
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
_MIN_TOKEN = 16


def add_parsers(commands: Commands) -> None:
    """Add ``ui`` to the top-level ``commands``."""
    ui = commands.add("ui", _ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ui.add_argument(
        "--port", type=bounded_int(0, 65535, "port"), default=8080, help="port (default 8080)"
    )
    ui.add_argument(
        "--token",
        default=None,
        help=f"a secret every request must carry (default ${TOKEN_ENV}); required off loopback",
    )
    ui.add_argument(
        "--read-only", action="store_true", help="show no actions and refuse every write"
    )
    ui.add_argument(
        "--poll",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often pages look for changes (default 1)",
    )


def _ui(args: argparse.Namespace) -> int:
    """serve a dashboard to see and steer the runs of a store

    Serve the dashboard: runs by status, each run's steps, failure, lease, signals and
    state, and actions (signal, cancel, retry, delete), each a compare-and-swap on the
    version the page showed. Binds 127.0.0.1 unless --host says otherwise; any other
    address needs --token or $STEPSTONE_UI_TOKEN. Needs the ui extra: pip install
    'stepstone[ui]'.
    """
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is not None and len(token) < _MIN_TOKEN:
        raise UsageError(f"the token must be at least {_MIN_TOKEN} characters long")
    host: str = args.host
    if host not in _LOOPBACK and token is None:
        raise UsageError(
            f"--host {host!r} is not loopback: other machines could reach the dashboard, so "
            f"it needs a token (--token, or ${TOKEN_ENV}); or bind 127.0.0.1"
        )
    if not 0.1 <= args.poll <= 3600:
        raise UsageError("--poll must be from 0.1 to 3600 seconds")
    try:
        import uvicorn  # noqa: PLC0415

        from ..ui import create_app  # noqa: PLC0415
    except ImportError as exc:
        raise UsageError(
            f"the dashboard needs the ui extra ({exc.name} is missing): pip install 'stepstone[ui]'"
        ) from None
    config = store_config(args)
    require_store(config)  # the dashboard reads runs: a typo in a path must not create a store
    if (checked := without_creating(config)) != config:
        with opened(checked):
            pass  # nor a typo in a SQL table's name: refused before serving, nothing created
    app = create_app(config, token=token, read_only=args.read_only, poll=args.poll)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{args.port}/"
    if args.json:
        emit_json({"event": "serving", "url": url, "token_required": token is not None})
    else:
        out(f"{PROG} ui: serving {REDACT(safe(redact_url(config)))} at {url}")
        if token is not None:
            out(f"open {url}?token=YOUR_TOKEN once; the browser keeps it in a cookie")
        out("Ctrl-C to stop")
    uvicorn.run(app, host=host, port=args.port, log_level="warning", access_log=False)
    return EXIT_OK
