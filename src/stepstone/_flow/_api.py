"""The public functions on limit records: ``set_limit``, ``get_limit``, ``list_limits``.

Each drives a ``_flow._ops`` generator on a store, sync or async (the same rule once);
``limit_usage`` also shows who holds a key, who waits for it, and until when it is
blocked.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from .._effects import Announce, Effect, Load, Save, Together, astep_through, step_through
from .._store_time import Now, astore_now, store_now
from .._wake import aannounce, announce
from . import _bucket, _ops
from ._limit import Limit, check_key, record_id

if TYPE_CHECKING:
    from .._store import Store

__all__ = [
    "LimitUsage",
    "aget_limit",
    "alimit_usage",
    "alist_limits",
    "aset_limit",
    "get_limit",
    "limit_usage",
    "list_limits",
    "set_limit",
]


class LimitUsage(NamedTuple):
    """A limit and what is happening on it now."""

    limit: Limit
    #: run_id -> the lease epoch its slot was taken at (-1: kept for a woken waiter).
    holders: dict[str, int]
    #: Runs parked on the key, first woken first.
    waiters: list[str]
    #: Until when a rate-limit answer blocks the key (None: not blocked).
    blocked_until: datetime | None
    #: Slots still recorded whose run has given its lease back (or died): free to the
    #: next acquirer that finds the key full.
    lapsed: tuple[str, ...] = ()


def _perform(store: Store, effect: Effect) -> Any:
    if isinstance(effect, Load):
        return store.load(effect.run_id)
    if isinstance(effect, Save):
        return store.save(effect.cp)
    if isinstance(effect, Together):
        return [_perform_caught(store, each) for each in effect.effects]
    if isinstance(effect, Announce):
        announce(store)
        return None
    if isinstance(effect, Now):
        return store_now(store)
    raise TypeError(f"unexpected effect {effect!r}")  # pragma: no cover


def _perform_caught(store: Store, effect: Effect) -> Any:
    try:
        return _perform(store, effect)
    except Exception as exc:  # noqa: BLE001 - handed back, as the drivers do
        return exc


async def _aperform(store: Store, effect: Effect) -> Any:
    if isinstance(effect, Load):
        return await store.aload(effect.run_id)
    if isinstance(effect, Save):
        return await store.asave(effect.cp)
    if isinstance(effect, Together):
        results = []
        for each in effect.effects:
            try:
                results.append(await _aperform(store, each))
            except Exception as exc:  # noqa: BLE001 - handed back, as the drivers do
                results.append(exc)
        return results
    if isinstance(effect, Announce):
        await aannounce(store)
        return None
    if isinstance(effect, Now):
        return await astore_now(store)
    raise TypeError(f"unexpected effect {effect!r}")  # pragma: no cover


def drive(store: Store, gen: Generator[Effect, Any, Any]) -> Any:
    """Perform ``gen``'s effects on ``store``; return its result."""
    return step_through(gen, lambda effect: _perform(store, effect))


async def adrive(store: Store, gen: Generator[Effect, Any, Any]) -> Any:
    """``drive`` for the async methods of ``store``."""
    return await astep_through(gen, lambda effect: _aperform(store, effect))


def _check_limit(limit: object) -> Limit:
    if not isinstance(limit, Limit):
        from .._errors import ConfigError  # noqa: PLC0415 - error path only

        raise ConfigError(f"set_limit: limit must be a stepstone.Limit, got {limit!r}")
    return limit


def set_limit(store: Store, limit: Limit) -> Limit:
    """Store ``limit`` (create its record, or change its values; holders are kept).

    The keys made from it as a template (``start(keys={"tenant": ...})`` makes
    ``tenant:acme`` from ``tenant``) change with it, unless they were set themselves.

    Raises:
        ConfigError: ``limit`` is not a ``Limit``.
        StoreError: the store failed.
    """
    saved: Limit = drive(store, _ops.write_limit(_check_limit(limit)))
    for key in _ops.keys_of(store.list_runs()):
        if key.startswith(f"{limit.key}:"):
            cp = store.load(record_id(key))
            if cp is not None and cp.state.get("template") == limit.key:
                derived = replace(limit, key=key, updated_at=None)
                drive(store, _ops.write_limit(derived, template=limit.key))
    return saved


async def aset_limit(store: Store, limit: Limit) -> Limit:
    """``set_limit`` for async callers."""
    saved: Limit = await adrive(store, _ops.write_limit(_check_limit(limit)))
    keys = _ops.keys_of(iter([run_id async for run_id in store.alist_runs()]))
    for key in keys:
        if key.startswith(f"{limit.key}:"):
            cp = await store.aload(record_id(key))
            if cp is not None and cp.state.get("template") == limit.key:
                derived = replace(limit, key=key, updated_at=None)
                await adrive(store, _ops.write_limit(derived, template=limit.key))
    return saved


def get_limit(store: Store, key: str) -> Limit | None:
    """Return the limit stored under ``key``, or None."""
    cp = store.load(record_id(check_key(key, "get_limit")))
    return None if cp is None else _ops.read(cp)


async def aget_limit(store: Store, key: str) -> Limit | None:
    """``get_limit`` for async callers."""
    cp = await store.aload(record_id(check_key(key, "get_limit")))
    return None if cp is None else _ops.read(cp)


def _usage(cp: Any) -> LimitUsage:
    state = cp.state
    blocked = state.get("blocked_until")
    return LimitUsage(
        _ops.read(cp),
        {
            run_id: -1 if _bucket.is_reserved(held) else int(held[0])
            for run_id, held in state.get("holders", {}).items()
        },
        [str(waiter[0]) for waiter in state.get("waiters", [])],
        None if blocked is None else datetime.fromtimestamp(blocked, UTC),
    )


def _live(usage: LimitUsage, runs: dict[str, Any]) -> LimitUsage:
    """Return ``usage`` without the slots that lapsed (their run gave its lease back)."""
    holders = {
        run_id: epoch
        for run_id, epoch in usage.holders.items()
        if epoch < 0 or not _ops.holder_is_stale(runs.get(run_id), epoch)
    }
    lapsed = tuple(sorted(set(usage.holders) - set(holders)))
    return usage._replace(holders=holders, lapsed=lapsed)


def limit_usage(store: Store, key: str) -> LimitUsage | None:
    """Return ``key``'s limit with its live holders, waiters and block, or None."""
    cp = store.load(record_id(check_key(key, "limit_usage")))
    if cp is None:
        return None
    usage = _usage(cp)
    return _live(usage, {run_id: store.load(run_id) for run_id in usage.holders})


async def alimit_usage(store: Store, key: str) -> LimitUsage | None:
    """``limit_usage`` for async callers."""
    cp = await store.aload(record_id(check_key(key, "limit_usage")))
    if cp is None:
        return None
    usage = _usage(cp)
    return _live(usage, {run_id: await store.aload(run_id) for run_id in usage.holders})


def list_limits(store: Store) -> list[Limit]:
    """Return every limit stored, sorted by key."""
    found = []
    for key in _ops.keys_of(store.list_runs()):
        limit = get_limit(store, key)
        if limit is not None:
            found.append(limit)
    return found


async def alist_limits(store: Store) -> list[Limit]:
    """``list_limits`` for async callers."""
    keys = _ops.keys_of(iter([run_id async for run_id in store.alist_runs()]))
    found = []
    for key in keys:
        limit = await aget_limit(store, key)
        if limit is not None:
            found.append(limit)
    return found
