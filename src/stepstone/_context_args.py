"""The checks of a workflow context's arguments (ctx.step, ctx.map, ctx.wait_for,
ctx.charge): what a call names, takes and holds, refused with a clear error before
anything is journaled."""

from __future__ import annotations

from typing import Any

from ._budget import check_fields, check_tokens, check_usd
from ._errors import InvalidCharge, InvalidWorkflow
from ._flow._call import check_tokens as check_estimate
from ._flow._limit import Limit, check_limits
from ._journal import json_value
from ._steps import (
    RetryPolicy,
    Workflow,
    check_name,
)
from ._suspend import _seconds

State = dict[str, Any]
#: What ``ctx.wait_for`` got when no ``default`` was given.
MISSING: Any = object()
#: Names of the context's own calls start with this; a step's name may not.
RESERVED = "@"


def _check_step_name(name: object, what: str) -> str:
    checked = check_name(name)
    if checked.startswith(RESERVED):
        raise InvalidWorkflow(
            f"{what}: a step's name may not start with {RESERVED!r} (the context's own "
            f"calls are journaled under such names), got {checked!r}"
        )
    return checked


def _limits(limits: object, tokens: object, what: str) -> list[Any] | None:
    """Return what a call with ``limits`` takes (``_flow._hook.Wanted``), None if nothing."""
    if not limits and tokens is None:
        return None
    checked = check_limits(limits, what)
    estimate = 0.0 if tokens is None else check_estimate(tokens, what)
    return [(e.key, estimate, e) if isinstance(e, Limit) else (e, estimate, None) for e in checked]


def _check_retry(retry: object, what: str) -> RetryPolicy | None:
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise InvalidWorkflow(f"{what}: retry must be a RetryPolicy or None")
    return retry


def _map_args(
    name: object, workflow: object, inputs: object, what: str
) -> tuple[Workflow, list[State]]:
    check_name(name)
    if not isinstance(workflow, Workflow):
        raise InvalidWorkflow(f"{what}: workflow must be a Workflow, got {workflow!r}")
    if not isinstance(inputs, list) or not all(isinstance(item, dict) for item in inputs):
        raise InvalidWorkflow(f"{what}: inputs must be a list of dicts (each a child's input)")
    checked = json_value(inputs, "", f"{what} inputs", -1)
    return workflow, checked


def _wait_args(signal: object, timeout: object, default: Any) -> tuple[str, float | None, Any]:
    if not isinstance(signal, str) or not signal or len(signal) > 200:
        raise InvalidWorkflow(
            f"ctx.wait_for(): signal must be a name of 1-200 characters, got {signal!r}"
        )
    seconds = None if timeout is None else _seconds(timeout, f"ctx.wait_for({signal!r}) timeout")
    if default is not MISSING:
        default = json_value(default, "", f"ctx.wait_for({signal!r}) default", -1)
    return signal, seconds, default


def _charge_args(
    usd: object, tokens: object, ref: object, unknown: dict[str, Any]
) -> dict[str, Any]:
    """Check a code workflow's charge before it takes a place in the journal."""
    what = "ctx.charge()"
    check_fields(unknown, what)
    if ref is not None and (not isinstance(ref, str) or not ref or len(ref) > 500):
        raise InvalidCharge(f"{what}: ref must be a str of 1-500 characters, got {ref!r}")
    return {"usd": check_usd(usd, what), "tokens": check_tokens(tokens, what), "ref": ref}


def _reserve_args(usd: object, tokens: object, unknown: dict[str, Any]) -> dict[str, Any]:
    """Check a code workflow's reservation before it takes a place in the journal."""
    what = "ctx.reserve()"
    if "ref" in unknown:
        raise InvalidCharge(f"{what}: a reservation has usd= and tokens= only (no ref=)")
    check_fields(unknown, what)
    return {"usd": check_usd(usd, what), "tokens": check_tokens(tokens, what)}
