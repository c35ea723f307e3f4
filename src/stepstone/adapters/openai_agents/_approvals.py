"""Durable approvals: stepstone signals that answer a waiting run's tool calls."""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

from ..._checkpoint import utcnow
from ..._control import asignal, signal
from ..._errors import InvalidWorkflow
from ..._observe import logger
from ..._store import Store
from .._agent_call import check_options
from .._drive import Load, Rule, adrive, drive
from .._journaled import step_entries
from ._journal import APPROVAL_SIGNAL, legacy_entries


def _approval_payload(
    call_id: str | None, approved: bool, always: bool, message: str | None
) -> dict[str, Any]:
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise InvalidWorkflow(f"call_id must be a non-empty str or None (all), got {call_id!r}")
    if message is not None and not isinstance(message, str):
        raise InvalidWorkflow("message must be a str or None")
    return {"call_id": call_id, "approved": approved, "always": always, "message": message}


class ApproveOptions(TypedDict, total=False):
    """The keywords of ``approve`` / ``aapprove``.

    ``always`` decides that tool for the rest of the run (the SDK's ``always_approve``);
    ``signal_name`` is the run's approval signal (default ``"approval"``).
    """

    always: bool
    signal_name: str


class RejectOptions(ApproveOptions, total=False):
    """The keywords of ``reject`` / ``areject``: ``message`` goes to the model."""

    message: str | None


def _decision(
    function: str, call_id: str | None, approved: bool, options: ApproveOptions | RejectOptions
) -> tuple[str, dict[str, Any]]:
    """The signal name and payload of one decision, the keywords checked."""
    allowed = (ApproveOptions if approved else RejectOptions).__optional_keys__
    check_options(function, options, allowed)
    given: dict[str, Any] = dict(options)
    payload = _approval_payload(call_id, approved, given.get("always", False), given.get("message"))
    return given.get("signal_name", APPROVAL_SIGNAL), payload


def approve(
    store: Store, run_id: str, call_id: str | None = None, **options: Unpack[ApproveOptions]
) -> bool:
    """Approve the tool call ``call_id`` (None: every pending one) of a waiting agent run.

    The approval is a stepstone signal: stored in the run by compare-and-swap, taken by
    whichever process resumes the run next (a worker, or ``StepstoneRunner.run``).
    ``always`` approves that tool for the rest of the run (the SDK's ``always_approve``).
    """
    return signal(store, run_id, *_decision("approve", call_id, True, options))


def reject(
    store: Store, run_id: str, call_id: str | None = None, **options: Unpack[RejectOptions]
) -> bool:
    """Reject the tool call ``call_id`` (None: every pending one); ``message`` goes to the model."""
    return signal(store, run_id, *_decision("reject", call_id, False, options))


async def aapprove(
    store: Store, run_id: str, call_id: str | None = None, **options: Unpack[ApproveOptions]
) -> bool:
    """Async ``approve``."""
    return await asignal(store, run_id, *_decision("aapprove", call_id, True, options))


async def areject(
    store: Store, run_id: str, call_id: str | None = None, **options: Unpack[RejectOptions]
) -> bool:
    """Async ``reject``."""
    return await asignal(store, run_id, *_decision("areject", call_id, False, options))


def decide(pending: list[dict[str, Any]], payloads: list[Any]) -> dict[str, dict[str, Any]]:
    """Return the decision per pending call id that ``payloads`` make (the first one wins)."""
    ids = [p["call_id"] for p in pending]
    decisions: dict[str, dict[str, Any]] = {}
    for payload in payloads:
        if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
            # Ignored rather than failing the run at every resume, and said so.
            logger.warning(
                "an approval signal's payload is not {'call_id': str | None, 'approved': "
                "bool, ...}; ignored: %.200r",
                payload,
            )
            continue
        target = payload.get("call_id")
        for call_id in ids if target is None else [target]:
            if call_id in ids and call_id not in decisions:
                decisions[call_id] = {
                    "approved": payload["approved"],
                    "always": payload.get("always") is True,
                    "message": payload.get("message")
                    if isinstance(payload.get("message"), str)
                    else None,
                }
    return decisions


def interruptions(result: Any) -> list[dict[str, Any]]:
    return [
        {
            "call_id": item.call_id or "",  # "" for an approval without one: null decides it
            "tool": item.name,
            "arguments": item.arguments,
            "agent": getattr(item.agent, "name", None),
        }
        for item in result.interruptions
    ]


def latest_pause(entries: dict[str, Any]) -> tuple[int, Any]:
    """``(K, entry)`` of the newest ``pause#K`` of a step's ``entries``, or ``(0, None)``."""
    k, entry = 0, None
    while f"pause#{k + 1}" in entries:
        k += 1
        entry = entries[f"pause#{k}"]
    return k, entry


def _pending(run_id: str, step_name: str) -> Rule[list[dict[str, Any]]]:
    cp = yield Load(run_id)
    if cp is None or cp.status != "waiting":
        return []
    entries = {e["call"]: e["result"] for e in step_entries(cp, step_name) if "result" in e}
    if not entries:
        # A run the release before journaled, not resumed since: its records, as they are.
        created = (cp.created_at or utcnow()).isoformat()
        legacy = yield from legacy_entries(run_id, step_name, created)
        entries = {key: value for _, _, key, value in legacy if key is not None}
    k, pause = latest_pause(entries)
    if pause is None or f"resume#{k}" in entries:
        return []
    return list(pause["interruptions"])


def pending_approvals(store: Store, run_id: str, step_name: str = "agent") -> list[dict[str, Any]]:
    """Return the tool calls a waiting agent run waits on: call_id, tool, arguments, agent.

    Empty when the run is not waiting for an approval.
    """
    return drive(store, _pending(run_id, step_name))


async def apending_approvals(
    store: Store, run_id: str, step_name: str = "agent"
) -> list[dict[str, Any]]:
    """Async ``pending_approvals``."""
    return await adrive(store, _pending(run_id, step_name))
