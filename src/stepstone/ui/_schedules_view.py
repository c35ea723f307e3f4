"""The dashboard's schedules page (issue 33): every schedule of the store, read-only.

Reads the schedules' record through the ``Store`` interface (``stepstone.schedules``),
as the CLI's ``schedules list`` does; changing a schedule is the CLI's or the API's.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .._schedule import schedules
from ._dashboard import Dashboard
from ._pages import run_href

__all__ = ["schedules_page"]


def schedules_page(dash: Dashboard, request: Request) -> Response:
    """Render ``/schedules``: name, cron, zone, workflow, next slot, counts, last run."""
    found = schedules(dash.store())
    rows = [
        {
            "info": info,
            "last_href": None if info.last_run is None else run_href(info.last_run),
        }
        for info in found
    ]
    return dash.page("schedules.html", rows=rows)
