"""``Limit``: what a user declares for one flow-control key, validated; and its errors.

A limit is stored as a record (``_flow._ops``); the ``Limit`` object is both what code
declares (``Step(..., limits=[Limit(...)])``, ``set_limit``) and what ``get_limit``
reads back. Everything is checked here, once: a bad limit raises ``ConfigError``
naming the field and what is allowed, before anything is stored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._errors import ConfigError, StepstoneError
from .._flow_policy import POLICIES, Policy
from .._reserved import LIMIT_PREFIX

__all__ = [
    "POLICIES",
    "Limit",
    "LimitReached",
    "RateLimited",
    "check_key",
    "check_limits",
    "record_id",
]

#: Run id prefix of the limit records: ``~limit/<key>``. ``~`` keeps them apart from
#: user run ids in every listing that sorts, and the CLI hides them from ``runs list``.
#: Written once, in ``_reserved``, which the CLI reads without importing flow control.
PREFIX = LIMIT_PREFIX
MAX_KEY_LENGTH = 200
_BAD_KEY_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class LimitReached(StepstoneError):
    """A key with ``policy="reject"`` was full when a step asked for it."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"limit {key!r} is full ({why}) and its policy is 'reject'")
        self.key = key


class RateLimited(Exception):
    """Raise from a step when a provider answers "rate limited" (HTTP 429).

    The run parks until ``retry_after`` (seconds from now) without spending an attempt,
    and every key of the step (or only ``key``, if given) is blocked until then for every
    run in every process sharing the store: the fleet backs off together.
    """

    def __init__(self, retry_after: float, key: str | None = None) -> None:
        if (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, (int, float))
            or not math.isfinite(retry_after)
            or retry_after < 0
        ):
            raise ConfigError(
                f"RateLimited: retry_after must be a finite number of seconds >= 0, "
                f"got {retry_after!r}"
            )
        super().__init__(f"rate limited; retry after {retry_after:g}s")
        self.retry_after = float(retry_after)
        self.key = key


def check_key(key: object, what: str = "Limit") -> str:
    """Return ``key`` if it can name a limit (1 to 200 characters, no control characters)."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ConfigError(
            f"{what}: key must be a str of 1 to {MAX_KEY_LENGTH} characters, got {key!r}"
        )
    bad = _BAD_KEY_CHAR.search(key)
    if bad is not None:
        raise ConfigError(f"{what}: key {key!r} holds the control character {bad.group()!r}")
    return key


def record_id(key: str) -> str:
    """Return the run id of the record that holds limit ``key``."""
    return PREFIX + key


def _positive(name: str, value: object, *, integer: bool) -> Any:
    if value is None:
        return None
    kind = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        allowed = "an int" if integer else "a number"
        raise ConfigError(f"Limit: {name} must be {allowed} > 0 or None, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"Limit: {name} must be > 0 (None for no limit), got {value!r}")
    return value


#: The fields of a ``Limit`` its record stores (``config``), all but the key and time.
_STORED = ("concurrency", "rpm", "tpm", "requests", "tokens", "per", "policy")


def _rate(
    per_minute: float | None, count: float | None, per: float | None
) -> tuple[float, float] | None:
    """``(n, seconds)`` of a rate given per minute (``rpm``) or as ``count`` per ``per``."""
    if per_minute is not None:
        return (float(per_minute), 60.0)
    if count is not None and per is not None:
        return (float(count), float(per))
    return None


@dataclass(frozen=True, slots=True)
class Limit:
    """Flow control for one key: at most ``concurrency`` holders, and request/token rates.

    Args:
        key: The key steps name (``"openai"``, ``"tenant:acme"``).
        concurrency: Most steps holding the key at once, across every process.
        rpm: Requests per minute (each step start is one request).
        tpm: Tokens per minute (a step's ``tokens`` estimate, corrected by
            ``ctx.settle``).
        requests: Requests per ``per`` seconds (the general form of ``rpm``).
        tokens: Tokens per ``per`` seconds (the general form of ``tpm``).
        per: The window of ``requests`` and ``tokens``, in seconds.
        policy: ``"queue"`` (wait, the default), ``"reject"`` (fail with
            ``LimitReached``), ``"replace_pending"`` or ``"cancel_running"`` (for the
            keys of runs, at ``start``: see ``POLICIES``).

    Raises:
        ConfigError: a value <= 0, a rate with no window, two forms of one rate, or an
            unknown policy.
    """

    key: str
    concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None
    requests: float | None = None
    tokens: float | None = None
    per: float | None = None
    policy: Policy = "queue"
    #: When the record was last changed by ``set_limit`` (None when not read back).
    updated_at: datetime | None = None

    def __post_init__(self) -> None:
        check_key(self.key)
        _positive("concurrency", self.concurrency, integer=True)
        for name in ("rpm", "tpm", "requests", "tokens", "per"):
            _positive(name, getattr(self, name), integer=False)
        if self.rpm is not None and self.requests is not None:
            raise ConfigError("Limit: give rpm or requests (with per), not both")
        if self.tpm is not None and self.tokens is not None:
            raise ConfigError("Limit: give tpm or tokens (with per), not both")
        if (self.requests is not None or self.tokens is not None) and self.per is None:
            raise ConfigError(
                "Limit: a rate needs a window: requests= and tokens= count per per= "
                "seconds (or use rpm= / tpm=, per minute)"
            )
        if self.per is not None and self.requests is None and self.tokens is None:
            raise ConfigError("Limit: per= is the window of requests= or tokens=; give one")
        if self.policy not in POLICIES:
            raise ConfigError(
                f"Limit: policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
            )

    def request_rate(self) -> tuple[float, float] | None:
        """Return ``(n, seconds)``: at most ``n`` requests per window, or None."""
        return _rate(self.rpm, self.requests, self.per)

    def token_rate(self) -> tuple[float, float] | None:
        """Return ``(n, seconds)``: at most ``n`` tokens per window, or None."""
        return _rate(self.tpm, self.tokens, self.per)

    def config(self) -> dict[str, Any]:
        """Return the declared values as stored (JSON)."""
        return {name: getattr(self, name) for name in _STORED}

    @classmethod
    def from_config(cls, key: str, config: dict[str, Any], at: datetime | None) -> Limit:
        """Return the limit a record's ``config`` declares."""
        values = {name: config[name] for name in _STORED if config.get(name) is not None}
        return cls(key, **values, updated_at=at)

    def describe(self) -> str:
        """Return one line: ``concurrency 8, 500 requests/60s, 200000 tokens/60s, queue``."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        req = self.request_rate()
        if req is not None:
            parts.append(f"{req[0]:g} requests/{req[1]:g}s")
        tok = self.token_rate()
        if tok is not None:
            parts.append(f"{tok[0]:g} tokens/{tok[1]:g}s")
        parts.append(self.policy)
        return ", ".join(parts)


def check_limits(limits: object, what: str) -> tuple[Limit | str, ...]:
    """Return ``limits`` as a tuple if each is a ``Limit`` or a key, with no key twice."""
    if isinstance(limits, (str, Limit)) or not isinstance(limits, (list, tuple)):
        raise ConfigError(f"{what}: limits must be a list of Limit or key str, got {limits!r}")
    seen: set[str] = set()
    for entry in limits:
        if isinstance(entry, Limit):
            key = entry.key
        elif isinstance(entry, str):
            key = check_key(entry, what)
        else:
            raise ConfigError(f"{what}: each limit must be a Limit or a key str, got {entry!r}")
        if key in seen:
            raise ConfigError(f"{what}: limit {key!r} is named twice")
        seen.add(key)
    return tuple(limits)
