"""The form posts: one run's action and the list's bulk actions, each a compare-and-swap."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import URL, FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .._errors import RunNotActive, RunNotFound, StepstoneError, StoreError
from .._store import Store
from . import _actions, _history_view
from ._dashboard import Dashboard
from ._pages import run_context, run_href

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


#: The actions that send a signal (``raise_budget``: the signal ``budget.raise``): the
#: function, the two form fields it reads, and the ``done`` the run page then shows
#: (``-again`` appended when that signal id was received before).
_SIGNALS: dict[str, tuple[Callable[[Store, str, str, str, str, str], str], str, str, str]] = {
    "signal": (_actions.signal, "name", "payload", "signal"),
    "raise_budget": (_actions.raise_budget, "usd", "tokens", "budget"),
}


def _act(dash: Dashboard, request: Request, form: FormData) -> Response:
    refusal = _refuse_write(dash, request, form)
    if refusal is not None:
        return refusal
    store = dash.store()
    run_id, version, action = _field(form, "id"), _field(form, "version"), _field(form, "action")
    back = run_href(run_id)
    try:
        if action == "cancel":
            text = _actions.cancel(store, run_id, version)
            done = "cancelled" if text == "cancelled the run" else "cancel-requested"
        elif action in _SIGNALS:
            send, first, second, done = _SIGNALS[action]
            sid = _field(form, "sid") or secrets.token_hex(16)
            text = send(store, run_id, version, _field(form, first), _field(form, second), sid)
            done = f"{done}-again" if "received before" in text else done
        elif action == "retry":
            _actions.retry(store, run_id, version)
            done = "retried"
        elif action == "delete":
            if _field(form, "confirm") != "yes":
                raise ValueError("tick the box to confirm the delete")
            _actions.delete(store, run_id, version)
            return RedirectResponse("/runs?done=deleted", status_code=303)
        elif action in ("rerun", "fork"):
            return _rewind(dash, form, run_id, version, action)
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
        return dash.page("run.html", status, **run_context(dash, cp), error=(title, str(exc)))
    return RedirectResponse(f"{back}{_sep(back)}{urlencode({'done': done})}", status_code=303)


def _sep(href: str) -> str:
    return "&" if "?" in href else "?"


def _step_field(form: FormData) -> int | str:
    """A step index, or a code workflow run's journaled call (``revise#2``)."""
    text = _field(form, "step")
    try:
        return int(text)
    except ValueError:
        if "#" in text:
            return text
        raise ValueError(
            f"the step is a step index (e.g. 1) or a journaled call (e.g. revise#2); got {text!r}"
        ) from None


def _rewind(dash: Dashboard, form: FormData, run_id: str, version: str, action: str) -> Response:
    """Rerun from a step or fork at one: a confirmation page first, then the action."""
    store = dash.store()
    step = _step_field(form)
    patch = _field(form, "patch")
    new_id = _field(form, "new_id").strip()
    confirmed = _field(form, "confirm") == "yes"
    if action == "rerun":
        _history_view.parse_patch(patch)  # a malformed patch is refused before confirming
    elif not new_id:
        if confirmed:
            raise ValueError("name the new run: fork needs a run id that does not exist yet")
        new_id = f"{run_id}-fork"  # a proposal, editable on the confirmation page
    if not confirmed:
        return dash.page(
            "confirm_rewind.html",
            action=action,
            run_id=run_id,
            version=version,
            step=step,
            patch=patch,
            new_id=new_id,
            back=run_href(run_id),
        )
    if action == "rerun":
        _history_view.rerun(store, run_id, version, step, patch)
        target, done = run_href(run_id), "rerun"
    else:
        _history_view.fork(store, run_id, version, step, new_id)
        target, done = run_href(new_id), "forked"
    return RedirectResponse(f"{target}{_sep(target)}{urlencode({'done': done})}", status_code=303)


async def _posted(
    dash: Dashboard, request: Request, handle: Callable[[Dashboard, Request, FormData], Response]
) -> Response:
    """Read the form, then ``handle`` it in the thread pool (the store's sync methods block)."""
    form = await request.form()
    try:
        response: Response = await run_in_threadpool(handle, dash, request, form)
    except Exception as exc:  # noqa: BLE001 - any failure is shown as a page, the server serves on
        return dash.failure(exc)
    return response


async def post_action(dash: Dashboard, request: Request) -> Response:
    """One run's action (``/run/action``)."""
    return await _posted(dash, request, _act)


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


async def post_bulk(dash: Dashboard, request: Request) -> Response:
    """The list's bulk action (``/runs/bulk``)."""
    return await _posted(dash, request, _bulk_sync)
