"""The pages: the runs list and one run, each with the live part its page polls."""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response

from .._budget import SPEND_KEY
from .._checkpoint import STATUSES, Checkpoint, RunStatus
from .._deadline import describe
from .._errors import StepstoneError, StoreError
from .._reserved import is_reserved, run_counts
from .._store import RunInfo, page_key
from ..cli._budget import spend_text
from ..cli._output import age
from . import _actions, _history_view, _views
from ._dashboard import DONE, Dashboard, live_error

#: Path segments under ``/runs/`` that are not run pages.
_NOT_RUN_PATHS = frozenset({"live", "bulk", ".", ".."})


def run_href(run_id: str) -> str:
    """Return the path of a run's page, ``/runs/<id>`` (the id percent-encoded whole).

    A run whose id is one of the list's own paths (``live``, ``bulk``) or a dot segment
    (which browsers fold) keeps the query form, ``/run?id=``.
    """
    if run_id in _NOT_RUN_PATHS:
        return "/run?" + urlencode({"id": run_id})
    return "/runs/" + quote(run_id, safe="")


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
    # Stepstone's own records (stream blocks, schedules, limits, budgets) are not runs.
    counts = run_counts(store, flt.prefix)
    limit = dash.page_size + 1
    infos = store.list_page(flt.status, prefix=flt.prefix, after=flt.after, limit=limit)
    more = len(infos) > dash.page_size
    infos = [i for i in infos if not is_reserved(i.run_id)]
    return counts, infos[: dash.page_size], more


def _list_context(
    dash: Dashboard, flt: _Filter, counts: dict[str, int], infos: list[RunInfo], more: bool
) -> dict[str, Any]:
    now = datetime.now(UTC)
    rows = []
    for info in infos:
        # Everything a row shows comes from ``list_page``, never a load: a row must cost
        # the same whatever the size of the run's state.
        kind, name = _views.display_name(info.run_id)
        total = info.total_steps
        rows.append(
            {
                "info": info,
                "kind": kind,
                "name": name,
                "href": run_href(info.run_id),
                "workflow": info.workflow,
                "workflow_version": info.workflow_version,
                "waiting_for": info.waiting_for,
                "progress": f"{info.step + 1}/{'?' if total is None else total}",
                "updated": _views.when(info.updated_at),
                "age": age(info.updated_at, now),
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


def runs_page(dash: Dashboard, request: Request) -> Response:
    flt = _Filter(request)
    counts, infos, more = _list_data(dash, flt)
    done = request.query_params.get("done", "")
    return dash.page(
        "runs.html",
        **_list_context(dash, flt, counts, infos, more),
        done=DONE.get(done),
    )


def runs_live(dash: Dashboard, request: Request) -> Response:
    flt = _Filter(request)
    try:
        counts, infos, more = _list_data(dash, flt)
    except StoreError as exc:
        return live_error(dash, request, exc, "runs-live")
    if _list_digest(counts, infos) == request.query_params.get("v"):
        return Response(status_code=204)
    return dash.page("_runs_live.html", **_list_context(dash, flt, counts, infos, more))


# --- one run ------------------------------------------------------------------------


def _history_context(dash: Dashboard, cp: Checkpoint) -> dict[str, Any]:
    store = dash.store()
    if not _history_view.kept(store, cp):
        return {"history": None, "history_error": None}
    try:
        return {"history": _history_view.view(store, cp), "history_error": None}
    except StepstoneError as exc:
        # The page still shows the run; the history part says what failed.
        text = f"{type(exc).__name__}: {dash.redactor(str(exc))}"
        return {"history": None, "history_error": text}


def _budgeted(cp: Checkpoint) -> bool:
    """Whether the run's ledger holds a budget (then its page offers to raise it)."""
    ledger = cp.state.get(SPEND_KEY)
    return isinstance(ledger, dict) and isinstance(ledger.get("budget"), dict)


def run_context(dash: Dashboard, cp: Checkpoint) -> dict[str, Any]:
    now = datetime.now(UTC)
    hist = _history_context(dash, cp)
    names = hist["history"].names if hist["history"] is not None else ()
    kind, name = _views.display_name(cp.run_id)
    status = cp.status
    signal_name = ""
    if cp.waiting_for is not None and cp.waiting_for.startswith("signal "):
        signal_name = cp.waiting_for.removeprefix("signal ")
    actions = not dash.read_only
    return {
        "cp": cp,
        "spend": spend_text(cp),  # spend budgets (``cli/_budget``)
        "kind": kind,
        "name": name,
        "status": status,
        "steps": _views.timeline(cp, now, names),
        "calls": _views.journal_rows(cp),
        "signals": _views.signal_rows(cp),
        "lease": _views.lease_text(cp, now),
        "state_json": _views.pretty_json(cp.state, cp.state_json),
        "input_json": None if cp.input is None else _views.pretty_json(cp.input),
        "parent_href": None if cp.parent is None else run_href(cp.parent),
        "deadline": describe(cp.timing, now) if cp.timing else None,  # issue 33
        "children": [(c, run_href(c)) for c in cp.children],
        "href": run_href(cp.run_id),
        "id_query": urlencode({"id": cp.run_id}),
        "live_href": "/run/live?" + urlencode({"id": cp.run_id, "v": cp.version or ""}),
        "can_signal": actions and status in ("queued", "running", "waiting", "failed"),
        "signal_name": signal_name,
        "signal_id": secrets.token_hex(16),
        "can_raise_budget": actions
        and status in ("queued", "running", "waiting", "failed")
        and _budgeted(cp),
        "can_cancel": actions
        and status in ("queued", "running", "waiting", "failed")
        and not cp.cancel_requested,
        "can_retry": actions and status == "failed" and cp.workflow is not None,
        "can_delete": actions,
        **hist,
        "has_history": hist["history"] is not None,
        "can_rewind": actions and hist["history"] is not None,
        "updated": _views.when(cp.updated_at),
        "created": _views.when(cp.created_at),
        "age": age(cp.updated_at, now),
    }


def _run_id(request: Request) -> str:
    # ``/runs/<id>`` (Starlette decodes the path, so an id's ``%2F`` is its ``/``), or
    # the older ``/run?id=<id>``.
    path_id = request.path_params.get("run_id")
    return path_id if isinstance(path_id, str) else request.query_params.get("id", "")


def _diff_context(dash: Dashboard, request: Request, cp: Checkpoint) -> dict[str, Any]:
    """The diff the page was asked for (``?a=<save>&b=<save>``), if any."""
    params = request.query_params
    if "a" not in params or "b" not in params or not cp.history:
        return {}
    try:
        a, b = int(params["a"]), int(params["b"])
        rows = _history_view.diff(dash.store(), cp.run_id, a, b)
    except (ValueError, StepstoneError) as exc:
        if isinstance(exc, StoreError):
            raise
        return {"diff_error": str(exc)}
    return {"diff": rows, "diff_a": a, "diff_b": b}


def run_page(dash: Dashboard, request: Request) -> Response:
    run_id = _run_id(request)
    cp = dash.store().load(run_id)
    if cp is None:
        return dash.page(
            "message.html", 404, title="No such run", text=f"There is no run {run_id!r}."
        )
    done = request.query_params.get("done", "")
    return dash.page(
        "run.html", **run_context(dash, cp), **_diff_context(dash, request, cp), done=DONE.get(done)
    )


def run_live(dash: Dashboard, request: Request) -> Response:
    run_id = _run_id(request)
    shown = request.query_params.get("v")
    try:
        # The cheap look first: most polls find the run as the page shows it.
        if shown and dash.store().version_of(run_id) == shown:
            return Response(status_code=204)
        cp = dash.store().load(run_id)
    except StoreError as exc:
        return live_error(dash, request, exc, "run-live")
    if cp is None:
        return dash.page("_run_gone.html", run_id=run_id)
    if cp.version == shown:
        return Response(status_code=204)
    return dash.page("_run_live.html", **run_context(dash, cp))
