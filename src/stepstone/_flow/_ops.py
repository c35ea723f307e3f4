"""Limit records on the Store: read, declare, acquire, release, settle, block.

Each operation is a generator of ``Load``/``Save`` effects (the core's, ``_effects``),
so the runner performs them inside a run with its own sync or async driver, and the
public functions (``set_limit``, ``get_limit``, ``list_limits`` and their ``a`` twins)
drive the same generators on a store. Every change is one compare-and-swap on the
record ``~limit/<key>``; a lost race loads and decides again. No backend needs code
of its own.

**Fencing.** A slot is held by ``(run_id, epoch)``: the run's lease epoch at the time
it acquired. An acquirer that finds the key full loads its holders and reclaims every
slot whose run no longer holds that lease: the run is gone, finished or parked (no
owner), was claimed again (another epoch: its owner died and a worker took it over),
or its owner is a process on this machine that no longer exists. So a holder killed
between acquiring and releasing never leaks its slot past its lease.

**Clock.** Rates and blocks are judged on the store's clock (``_store_time``, the
``Now`` effect): the server's on PostgreSQL, MySQL and Cosmos DB, the host's on memory,
file and SQLite, so processes whose own clocks are skewed never compare them. Times stored in
the record (TATs, ``blocked_until``, a waiter's arrival) are on that clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Generator, Iterator
from typing import Any

from .. import _hooks, _lease
from .._checkpoint import DUE_NOW, Checkpoint, evolve
from .._effects import Announce, Effect, Load, Save, Together
from .._errors import ConfigError, ConflictError, StoreError
from .._observe import logger
from .._store_time import Now, slack
from . import _bucket
from ._limit import PREFIX, Limit, check_key, record_id

__all__ = [
    "acquire",
    "replace_pending",
    "block",
    "find",
    "holder_is_stale",
    "keys_of",
    "read",
    "release",
    "settle",
    "write_limit",
]

_TRIES = 50
_TURN_WAIT = 2.0
Gen = Generator[Effect, Any, Any]


def _span() -> Generator[Effect, Any, tuple[float, float]]:
    """The store's time (POSIX seconds) and how far off it may be: at most one round trip."""
    at = yield Now()
    return float(at.timestamp()), slack(at)


def _now() -> Generator[Effect, Any, float]:
    """The store's time (POSIX seconds): at most one round trip, usually none."""
    return (yield from _span())[0]


def read(cp: Checkpoint) -> Limit:
    """Return the ``Limit`` record ``cp`` declares."""
    key = cp.run_id[len(PREFIX) :]
    return Limit.from_config(key, cp.state.get("config", {}), cp.updated_at)


def _new_record(limit: Limit) -> Checkpoint:
    # total_steps=0: the record reads as a finished run, so no worker ever claims it.
    return Checkpoint(
        run_id=record_id(limit.key), step=-1, total_steps=0, state=_bucket.fresh(limit)
    )


def find(key: str, declared: Limit | None = None) -> Generator[Effect, Any, Checkpoint]:
    """Return the record of ``key``, creating it from ``declared`` if there is none.

    A key ``name:value`` with neither is created from the record of ``name`` (its
    template), so ``start(keys={"tenant": "acme"})`` gives each tenant its own limit.

    A stored record wins over ``declared``: limits changed at run time (``stepstone
    limits set``) are not undone by the code that declared them.

    Raises:
        ConfigError: no record and nothing declared (an unknown key).
    """
    for _ in range(_TRIES):
        cp: Checkpoint | None = yield Load(record_id(key))
        if cp is not None:
            return cp
        record = None
        if declared is None and ":" in key:
            # A dynamic key (``tenant:acme``) is limited as its template (``tenant``) is,
            # and follows it when ``set_limit`` changes the template.
            name = key.partition(":")[0]
            template: Checkpoint | None = yield Load(record_id(name))
            if template is not None:
                declared = Limit.from_config(key, template.state.get("config", {}), None)
                record = _new_record(declared)
                record = evolve(record, state={**record.state, "template": name})
        if declared is None:
            raise ConfigError(
                f"unknown limit key {key!r}: no limit is stored under it; declare it with "
                f"stepstone.set_limit(store, Limit({key!r}, ...)), `stepstone limits set`, "
                "or pass a Limit instead of its key"
            )
        try:
            created: Checkpoint = yield Save(
                record or _new_record(declared), f"limit {key}", owned=False
            )
        except ConflictError:
            continue
        return created
    raise ConflictError(f"limit {key!r}: could not create its record", record_id(key))


def write_limit(limit: Limit, *, template: str | None = None) -> Generator[Effect, Any, Limit]:
    """Store ``limit``'s values on its record (created if absent), keeping its holders.

    ``template``: the change comes from that template key (the record follows it); a
    change made to the key itself detaches it from its template.
    """
    for _ in range(_TRIES):
        cp: Checkpoint | None = yield Load(record_id(limit.key))
        if cp is None:
            target = _new_record(limit)
        else:
            state = {**cp.state, "config": limit.config()}
            if template is None:
                state.pop("template", None)
            target = evolve(cp, state=state)
        try:
            saved: Checkpoint = yield Save(target, f"limit {limit.key}", owned=False)
        except ConflictError:
            continue
        if cp is not None and len(cp.state.get("waiters", [])) > 0:
            # A raised limit may let parked runs go now.
            for waiter in cp.state["waiters"]:
                yield from _wake(str(waiter[0]), limit.key)
        return read(saved)
    raise ConflictError(f"limit {limit.key!r}: {_TRIES} writers raced", record_id(limit.key))


def holder_is_stale(cp: Checkpoint | None, epoch: int) -> bool:
    """Return whether a slot taken at ``epoch`` by the run ``cp`` is no longer held."""
    return (
        cp is None
        or cp.epoch != epoch
        or cp.owner is None
        or cp.status not in ("running", "waiting")
        or _lease.dead_here(cp.owner)
    )


def acquire(
    key: str,
    run_id: str,
    epoch: int,
    tokens: float,
    declared: Limit | None = None,
    priority: int = 0,
) -> Generator[Effect, Any, tuple[Limit, _bucket.Decision]]:
    """Take one slot, one request and ``tokens`` tokens of ``key`` for ``run_id``, or say when.

    One compare-and-swap when granted; when the key is full, the holders are loaded
    once (together) to reclaim the slots of dead ones.
    """
    checked: set[str] = set()
    stale: set[tuple[str, Any]] = set()
    with _turn(key):
        return (yield from _acquire(key, run_id, epoch, tokens, declared, priority, checked, stale))


def _acquire(
    key: str,
    run_id: str,
    epoch: int,
    tokens: float,
    declared: Limit | None,
    priority: int,
    checked: set[str],
    stale: set[tuple[str, Any]],
) -> Generator[Effect, Any, tuple[Limit, _bucket.Decision]]:
    for _ in range(_TRIES):
        cp = yield from find(key, declared)
        limit = read(cp)
        holders: dict[str, list[Any]] = cp.state.get("holders", {})
        full = limit.concurrency is not None and len(holders) >= limit.concurrency
        unchecked = (
            [
                h
                for h, v in holders.items()
                if h != run_id and h not in checked and not _bucket.is_reserved(v)
            ]
            if full
            else []
        )
        if unchecked:
            found = yield Together([Load(h) for h in unchecked])
            for holder, got in zip(unchecked, found, strict=True):
                checked.add(holder)
                if isinstance(got, BaseException):
                    continue  # unknown: count it as live
                held = holders[holder]
                if not _bucket.is_reserved(held) and holder_is_stale(got, held[0]):
                    stale.add((holder, held[0]))  # that slot, not a later one of the run
        now, off = yield from _span()
        state, decision = _bucket.decide(
            cp.state, limit, run_id, epoch, tokens, now, stale, priority, slack=off
        )
        if state is None:
            return limit, decision
        try:
            yield Save(evolve(cp, state=state), f"acquire {key}", owned=False)
        except ConflictError:
            continue
        if stale:
            logger.info("limit %r: reclaimed %d slots of dead holders", key, len(stale))
        if decision.granted:
            _hooks.fire("flow.acquired")  # a kill here: the slot is held by a dead run
        return limit, decision
    raise ConflictError(f"limit {key!r}: {_TRIES} acquirers raced", record_id(key))


def release(
    key: str, run_id: str, epoch: int, *, lapsed: bool = False
) -> Generator[Effect, Any, None]:
    """Give back ``run_id``'s slot of ``key`` and wake the first run waiting for it.

    Best effort: a release that cannot be written is logged; the slot lapses anyway
    once the run gives its lease back. ``lapsed``: the run has given its lease back
    already, so its slot is free to whoever finds the key full; it is written back only
    when a run waits for it (to hand it over), saving a write per run otherwise.
    """
    try:
        with _turn(key):
            woken = yield from _release(key, run_id, epoch, lapsed)
        if woken is not None:
            yield from _wake(woken, key)
    except StoreError as exc:
        logger.warning(
            "limit %r: could not release run %r's slot: %s (it lapses)", key, run_id, exc
        )


def _release(key: str, run_id: str, epoch: int, lapsed: bool) -> Generator[Effect, Any, str | None]:
    for _ in range(_TRIES):
        cp: Checkpoint | None = yield Load(record_id(key))
        if cp is None:
            return None
        if lapsed and not cp.state.get("waiters"):
            return None
        now = yield from _now()
        state, woken = _bucket.release(cp.state, run_id, epoch, now)
        if state is None:
            return None
        try:
            yield Save(evolve(cp, state=state), f"release {key}", owned=False)
        except ConflictError:
            continue
        _hooks.fire("flow.released")  # a kill here: the slot is handed, the waiter asleep
        return woken
    return None


#: One lock per key in this process: threads of one process take turns on a key's
#: record instead of racing each other's compare-and-swap (a lost race costs a load and
#: a failed write). Other processes still race; the compare-and-swap decides.
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _turn(key: str) -> Iterator[None]:
    """Hold this process's turn on ``key`` if it comes soon; go on without it otherwise.

    On an event loop the turn is taken only if free (blocking would stall the loop, and
    the holder may be a coroutine on it); a thread waits at most ``_TURN_WAIT``.
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    try:
        asyncio.get_running_loop()
        got = lock.acquire(blocking=False)
    except RuntimeError:
        got = lock.acquire(timeout=_TURN_WAIT)
    try:
        yield
    finally:
        if got:
            lock.release()


def replace_pending(key: str, run_id: str) -> Generator[Effect, Any, list[str]]:
    """Make ``run_id`` the one run of ``key`` waiting to start; return those it replaces.

    The replaced are the runs recorded as pending (started, not yet holding the key)
    and those parked waiting for it; they are dropped from the record here, and the
    caller cancels them.
    """
    with _turn(key):
        for _ in range(_TRIES):
            cp: Checkpoint | None = yield Load(record_id(key))
            if cp is None:
                return []
            replaced = [p for p in cp.state.get("pending", []) if p != run_id]
            replaced += [w[0] for w in cp.state.get("waiters", []) if w[0] != run_id]
            state = {**cp.state, "pending": [run_id], "waiters": []}
            try:
                yield Save(evolve(cp, state=state), f"replace pending of {key}", owned=False)
            except ConflictError:
                continue
            return replaced
    raise ConflictError(f"limit {key!r}: {_TRIES} writers raced", record_id(key))


def _wake(run_id: str, key: str) -> Generator[Effect, Any, None]:
    """Make a run parked on ``key`` due now, and tell the workers (it also polls)."""
    for _ in range(3):
        try:
            cp: Checkpoint | None = yield Load(run_id)
            # Parked on the key, or still running and maybe about to park (its own save
            # re-bases on this one and keeps the earlier due time, ``_lease.rebase``).
            parked = cp is not None and cp.owner is None and cp.waiting_for == f"limit:{key}"
            if cp is None or not (parked or (cp.owner is not None and cp.status == "running")):
                return
            yield Save(evolve(cp, wake_at=DUE_NOW), f"wake for limit {key}", owned=False)
        except ConflictError:
            continue
        except StoreError:
            return
        yield Announce()
        return


def settle(key: str, estimate: float, actual: float) -> Generator[Effect, Any, None]:
    """Charge ``actual - estimate`` more tokens to ``key`` (or refund them)."""
    for _ in range(_TRIES):
        cp: Checkpoint | None = yield Load(record_id(key))
        if cp is None:
            return
        now = yield from _now()
        state = _bucket.settle(cp.state, read(cp), estimate, actual, now)
        if state is None:
            return
        try:
            yield Save(evolve(cp, state=state), f"settle {key}", owned=False)
        except ConflictError:
            continue
        return


def block(key: str, seconds: float) -> Generator[Effect, Any, float | None]:
    """Block ``key`` for every run for ``seconds``; return until when (None: no record)."""
    # From the latest the store's time may be: a coarse clock never shortens a block.
    now, off = yield from _span()
    until = now + off + seconds
    for _ in range(_TRIES):
        cp: Checkpoint | None = yield Load(record_id(key))
        if cp is None:
            return None
        state = _bucket.block(cp.state, until)
        if state is None:
            return float(cp.state["blocked_until"])
        try:
            yield Save(evolve(cp, state=state), f"block {key}", owned=False)
        except ConflictError:
            continue
        return until
    return until


def keys_of(run_ids: Iterator[str]) -> list[str]:
    """Return the limit keys among ``run_ids``, sorted."""
    return sorted(r[len(PREFIX) :] for r in run_ids if r.startswith(PREFIX))


def check_keys(keys: object) -> None:
    """Check a list of keys given by a caller."""
    if isinstance(keys, str):
        raise ConfigError("keys must be a list of str, not one str")
    for key in keys:  # type: ignore[attr-defined]
        check_key(key, "limits")
