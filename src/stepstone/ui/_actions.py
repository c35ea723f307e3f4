"""The dashboard's actions, each a compare-and-swap on the version the page showed.

``cancel``, ``signal`` and ``raise_budget`` (the signal ``budget.raise``) are the
runtime's own operations (``stepstone._control``), driven here with every load of the
run checked against the version the operator saw: if the run changed since the page was
rendered, the action raises ``RunChanged`` and writes nothing, instead of being applied
to a run the operator has not seen. ``retry`` and ``delete`` are one compare-and-swap each.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable
from typing import Any

from .._budget import RAISE_SIGNAL
from .._checkpoint import Checkpoint, evolve
from .._control import Op, cancel_op, performer, signal_op
from .._core import Effect, Load, Save, step_through
from .._effects import Announce
from .._errors import ConflictError, RunNotActive, RunNotFound, StepstoneError
from .._store import RunInfo, Store, page_key
from .._stream._retention import delete_stream

__all__ = [
    "BULK_ACTIONS",
    "MAX_BULK",
    "BulkResult",
    "RunChanged",
    "bulk",
    "bulk_targets",
    "cancel",
    "changed",
    "delete",
    "pinned",
    "raise_budget",
    "retry",
    "signal",
]

#: At most this many runs are acted on by one bulk action.
MAX_BULK = 10_000

#: Bulk actions, and the statuses a run may have for each.
BULK_ACTIONS: dict[str, tuple[str, ...]] = {
    "cancel": ("queued", "running", "waiting", "failed"),
    "retry": ("failed",),
}


class RunChanged(ConflictError):
    """The run changed after the page showed it; the action was not applied."""


def changed(run_id: str) -> RunChanged:
    """The error of an action refused because the run is no longer as the page showed it."""
    return RunChanged(
        f"the run changed since this page showed it (run {run_id!r}); nothing was done. "
        "The page now shows it as it is: check it and act again",
        run_id,
    )


def pinned(perform: Callable[[Effect], Any], run_id: str, version: str) -> Callable[[Effect], Any]:
    """Wrap ``perform`` so that a load of ``run_id`` not at ``version`` raises ``changed``."""

    def perform_pinned(effect: Effect) -> Any:
        found = perform(effect)
        if (
            isinstance(effect, Load)
            and effect.run_id == run_id
            and (found is None or found.version != version)
        ):
            raise changed(run_id)
        return found

    return perform_pinned


def _pinned(gen: Op, store: Store, run_id: str, version: str) -> Any:
    """Drive a control operation, refusing it if ``run_id`` is not at ``version``."""
    return step_through(gen, pinned(performer(store), run_id, version))


def cancel(store: Store, run_id: str, version: str) -> str:
    """Cancel the run as ``stepstone.cancel`` does, if it is still at ``version``.

    Returns:
        What happened, for the page.

    Raises:
        RunChanged: the run is not at ``version`` any more.
        RunNotActive: the run is done or cancelled.
    """
    info: RunInfo = _pinned(cancel_op(run_id), store, run_id, version)
    if info.status == "cancelled":
        return "cancelled the run"
    return "cancel requested: the run stops at its next step boundary"


def signal(store: Store, run_id: str, version: str, name: str, payload_text: str, sid: str) -> str:
    """Send the signal ``name`` with the JSON ``payload_text``, if the run is at ``version``.

    ``sid`` is the signal id the page generated, so sending the same form twice stores
    the signal once.

    Raises:
        ValueError: the payload is not JSON (the message says so).
        RunChanged: the run is not at ``version`` any more.
        RunNotActive: the run is done or cancelled.
    """
    try:
        payload = json.loads(payload_text) if payload_text.strip() else None
    except (ValueError, RecursionError) as exc:
        raise ValueError(
            f'the payload is not JSON ({exc}); e.g. {{"ok": true}}, or leave it empty for null'
        ) from None
    sent: bool = _pinned(signal_op(run_id, name, payload, sid), store, run_id, version)
    if not sent:
        return f"signal {name!r} with this id was received before; nothing to do"
    return f"sent signal {name!r}"


def raise_budget(
    store: Store, run_id: str, version: str, usd_text: str, tokens_text: str, sid: str
) -> str:
    """Raise the run's spend budget by ``usd_text`` dollars and/or ``tokens_text`` tokens
    (the signal ``budget.raise``), if the run is at ``version``; ``sid`` as ``signal``'s.

    Raises:
        ValueError: neither amount is given, or one is not a number > 0 (the message says
            what is allowed); nothing is sent.
        RunChanged: the run is not at ``version`` any more.
        RunNotActive: the run is done or cancelled.
    """
    payload: dict[str, Any] = {}
    if usd_text.strip():
        try:
            usd = float(usd_text)
        except ValueError:
            usd = -1.0
        if not math.isfinite(usd) or usd <= 0:
            raise ValueError(f"dollars to add must be a number > 0, e.g. 10; got {usd_text!r}")
        payload["usd"] = usd
    if tokens_text.strip():
        text = tokens_text.strip()
        if not text.isdigit() or int(text) <= 0:
            raise ValueError(f"tokens to add must be a whole number > 0; got {tokens_text!r}")
        payload["tokens"] = int(text)
    if not payload:
        raise ValueError("give the dollars or the tokens (or both) to add to the budget")
    sent: bool = _pinned(signal_op(run_id, RAISE_SIGNAL, payload, sid), store, run_id, version)
    if not sent:
        return "this raise was received before; nothing to do"
    return "raised the budget"


def _retry(run_id: str) -> Op:
    cp: Checkpoint | None = yield Load(run_id)
    if cp is None:
        raise RunNotFound(f"run {run_id!r} does not exist; nothing to retry", run_id)
    if cp.status != "failed":
        raise RunNotActive(
            f"run {run_id!r} is {cp.status}; only failed runs can be retried", run_id, cp.status
        )
    if cp.workflow is None:
        raise RunNotActive(
            f"run {run_id!r} was started by calling run() directly, not by start(), so no "
            "worker knows its workflow: call run() again to retry it",
            run_id,
            cp.status,
        )
    # Queued again with a fresh attempt budget: a worker claims it and runs the failed
    # step again. The failure stays on record until that step succeeds.
    saved: Checkpoint = yield Save(evolve(cp, queued=True, attempt=0), "retry")
    yield Announce()  # a worker claims it now, not at its next poll
    return saved


def retry(store: Store, run_id: str, version: str) -> str:
    """Queue a failed run again for a worker to retry its failed step, if at ``version``.

    Raises:
        RunChanged: the run is not at ``version`` any more.
        RunNotActive: the run has not failed, or no worker could run it.
    """
    try:
        _pinned(_retry(run_id), store, run_id, version)
    except ConflictError as exc:
        if isinstance(exc, RunChanged):
            raise
        raise changed(run_id) from exc
    return "queued the run again: a worker retries its failed step"


def delete(store: Store, run_id: str, version: str) -> str:
    """Delete the run if it is still at ``version``.

    Raises:
        RunChanged: the run is not at ``version`` any more.
        RunNotFound: the run is gone already.
    """
    try:
        deleted = store.delete(run_id, expected_version=version)
    except ConflictError as exc:
        raise changed(run_id) from exc
    if not deleted:
        raise RunNotFound(f"run {run_id!r} does not exist any more; nothing to delete", run_id)
    delete_stream(store, run_id)  # its stream goes with it (issue 34)
    return "deleted the run"


def bulk_targets(store: Store, status: str, prefix: str) -> list[RunInfo]:
    """Return the runs a bulk action on the filter (``status``, ``prefix``) would touch."""
    found: list[RunInfo] = []
    after = None
    while len(found) <= MAX_BULK:
        page = store.list_page(status, prefix=prefix, after=after, limit=500)  # type: ignore[arg-type]
        found.extend(page)
        if len(page) < 500:
            break
        after = page_key(page[-1])
    return heapq.nlargest(MAX_BULK + 1, found, key=page_key)


class BulkResult:
    """What a bulk action did: runs acted on, and the ones left (changed or not active)."""

    def __init__(self) -> None:
        self.done = 0
        self.changed = 0
        self.refused: list[str] = []

    def summary(self, verb: str) -> str:
        """Return one sentence for the page."""
        text = f"{verb} {self.done} run(s)"
        if self.changed:
            text += f"; {self.changed} changed meanwhile and were left as they are"
        if self.refused:
            text += f"; {len(self.refused)} refused ({self.refused[0]})"
        return text


def bulk(store: Store, action: str, targets: list[RunInfo]) -> BulkResult:
    """Apply ``action`` to each target by compare-and-swap on the version it was listed at."""
    act: Callable[[Store, str, str], str] = {"cancel": cancel, "retry": retry}[action]
    result = BulkResult()
    for info in targets:
        try:
            version = info.version
            if version is None:  # a backend whose listing carries no version
                cp = store.load(info.run_id)
                if cp is None or cp.version is None or RunInfo.of(cp).status != info.status:
                    result.changed += 1
                    continue
                version = cp.version
            act(store, info.run_id, version)
        except RunChanged:
            result.changed += 1
        except StepstoneError as exc:
            if isinstance(exc, (RunNotActive, RunNotFound)):
                result.changed += 1
            else:
                result.refused.append(f"{type(exc).__name__}: {exc}")
        else:
            result.done += 1
    return result
