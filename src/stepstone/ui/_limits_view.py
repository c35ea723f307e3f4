"""The dashboard's limits page (flow control, issue 37): each key, who holds it, who waits.

Read through the ``Store`` interface only (``stepstone.list_limits``, ``limit_usage``),
so every backend shows it. Changing a limit is ``stepstone limits set``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .._flow import limit_usage, list_limits
from ._dashboard import Dashboard
from ._pages import run_href
from ._views import when

__all__ = ["limits_page"]


def limits_page(dash: Dashboard, request: Request) -> Response:
    """Render every limit with its live holders, its waiters and its block."""
    store = dash.store()
    rows: list[dict[str, Any]] = []
    for limit in list_limits(store):
        usage = limit_usage(store, limit.key)
        if usage is None:
            continue  # deleted meanwhile
        rows.append(
            {
                "key": limit.key,
                "limits": limit.describe(),
                "holders": [(run_id, run_href(run_id)) for run_id in usage.holders],
                "waiters": [(run_id, run_href(run_id)) for run_id in usage.waiters],
                "lapsed": len(usage.lapsed),
                "blocked_until": when(usage.blocked_until) if usage.blocked_until else None,
            }
        )
    return dash.page("limits.html", rows=rows)
