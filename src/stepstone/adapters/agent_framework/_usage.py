"""Spend-budget charges from an Agent Framework agent's usage (``usage_charge``).

An Agent Framework agent called inside a stepstone step (``await agent.run(...)``)
answers with an ``AgentResponse`` whose ``usage_details`` count its tokens. This module
turns that into the keyword arguments of ``ctx.charge``: the tokens always, dollars
through the ``Prices`` given, the response's id as the ref (so a resumed step that got
the same response does not count it twice)::

    response = await agent.run(prompt)
    ctx.charge(**usage_charge(response, prices=PRICES))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._budget import Prices
from ..._errors import InvalidCharge

__all__ = ["usage_charge"]


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidCharge(f"usage_charge: usage {key} must be an int >= 0, got {value!r}")
    return value


def usage_charge(
    response: Any, prices: Prices | None = None, *, ref: str | None = None
) -> dict[str, Any]:
    """Return ``ctx.charge``'s arguments for an Agent Framework response's usage.

    ``response``: an ``AgentResponse`` (or ``ChatResponse``, or anything with
    ``usage_details``), or a ``UsageDetails`` mapping itself. Tokens are its input plus
    output token counts; dollars are ``prices.cost(input, output)`` (0 without
    ``prices``). ``ref`` defaults to the response's ``response_id``.

    Raises:
        InvalidCharge: ``response`` holds no usage, a count is not an int >= 0, or
            ``prices`` is not a ``stepstone.Prices``.
    """
    if prices is not None and not isinstance(prices, Prices):
        raise InvalidCharge(f"usage_charge: prices must be a stepstone.Prices, got {prices!r}")
    usage = response if isinstance(response, Mapping) else getattr(response, "usage_details", None)
    if usage is None and hasattr(response, "usage_details"):
        usage = {}  # the response reported no usage (a fake model, a cached answer)
    if not isinstance(usage, Mapping):
        raise InvalidCharge(
            "usage_charge: response must be an Agent Framework AgentResponse or "
            f"ChatResponse (with usage_details) or a UsageDetails mapping, got {response!r}"
        )
    inputs = _count(usage, "input_token_count")
    outputs = _count(usage, "output_token_count")
    if ref is None and not isinstance(response, Mapping):
        found = getattr(response, "response_id", None)
        ref = found if isinstance(found, str) and found else None
    usd = 0.0 if prices is None else prices.cost(inputs, outputs)
    charge: dict[str, Any] = {"usd": usd, "tokens": inputs + outputs, "ref": ref}
    return charge
