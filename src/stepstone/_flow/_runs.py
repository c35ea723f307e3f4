"""A run's own limit keys: recorded by ``start``, held from its claim to its end.

``Workflow(limits=[...])`` declares keys every run of the workflow holds while it
executes; ``start(..., keys={"tenant": "acme"})`` adds the run's own, named
``tenant:acme`` and limited as the limit ``tenant`` says (each value its own record,
created from that template on first use); ``priority=`` orders the run among the
waiters of its keys. ``start`` records all three in the run's ``flow`` field and
checks every key exists, refusing at once (``LimitReached``) a run whose key is full
and says ``policy="reject"``.

The worker's claim is followed by taking the keys (``take``): a key that is full parks
the run ``waiting`` on ``limit:<key>``, holding no thread, until a release hands it the
slot. A run's slots lapse when it gives its lease back (it ended, failed, was cancelled,
suspended or died): the next acquirer that finds the key full reclaims them. ``end``
writes a release only to hand a slot to a run waiting for it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from .._checkpoint import Checkpoint, evolve
from .._effects import Effect, Load
from .._errors import ConfigError
from . import _ops
from ._hook import Park, park, resumed
from ._limit import MAX_KEY_LENGTH, Limit, LimitReached, check_key

__all__ = ["check_max_concurrency", "check_start", "end", "run_flow", "take", "with_flow"]

Gen = Generator[Effect, Any, Any]
MAX_PRIORITY = 1_000_000
_BAD = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def run_flow(
    declared: Sequence[Limit | str], keys: object, priority: object
) -> dict[str, Any] | None:
    """Return the ``flow`` field for a run of a workflow declaring ``declared``.

    Raises:
        ConfigError: ``keys`` is not a mapping of str to str, or ``priority`` is not an
            int from -1,000,000 to 1,000,000.
    """
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"start: priority must be an int, got {priority!r}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigError(
            f"start: priority must be from {-MAX_PRIORITY} to {MAX_PRIORITY}, got {priority}"
        )
    if keys is None:
        keys = {}
    if not isinstance(keys, Mapping):
        raise ConfigError(f"start: keys must be a dict of str to str, got {keys!r}")
    templates = {e.key: e for e in declared if isinstance(e, Limit)}
    names: list[str] = [e.key if isinstance(e, Limit) else e for e in declared]
    limits = {key: limit.config() for key, limit in templates.items()}
    for name, value in keys.items():
        check_key(name, "start: keys")
        if not isinstance(value, str) or not value:
            raise ConfigError(f"start: keys[{name!r}] must be a non-empty str, got {value!r}")
        key = check_key(f"{name}:{value}", "start: keys")
        if key not in names:
            names.append(key)
        if name in templates:
            limits[key] = templates[name].config()
    if not names and priority == 0:
        return None
    return {"keys": names, "limits": limits, "priority": priority}


def check_max_concurrency(name: str, value: object) -> int | None:
    """Return a ``Map``'s ``max_concurrency`` if it is None or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"Map {name!r}: max_concurrency must be an int >= 1 or None, got {value!r}"
        )
    return value


def map_key(parent: str, name: str) -> str:
    """Return the key a ``Map``'s children hold: ``map/<parent>/<name>`` (hashed if long)."""
    key = f"map/{parent}/{name}"
    if len(key) <= MAX_KEY_LENGTH and not _BAD.search(key):
        return key
    digest = hashlib.sha256(f"{parent}\x00{name}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"map/{digest[:32]}"


def with_flow(child: Checkpoint, step: Any) -> Checkpoint:
    """Return a new child of ``Map`` ``step`` holding its workflow's keys and the Map's own."""
    declared: Sequence[Limit | str] = step.workflow.limits
    if step.max_concurrency is not None and child.parent is not None:
        key = map_key(child.parent, step.name)
        declared = [*declared, Limit(key, concurrency=step.max_concurrency)]
    flow = run_flow(declared, None, 0)
    return child if flow is None else evolve(child, flow=flow)


def _declared(flow: dict[str, Any], key: str) -> Limit | None:
    config = flow.get("limits", {}).get(key)
    return None if config is None else Limit.from_config(key, config, None)


def check_start(flow: dict[str, Any] | None, run_id: str) -> Generator[Effect, Any, list[str]]:
    """Check a new run's keys and apply their policies; return the runs to cancel.

    ``reject``: refuse the run if the key is full now. ``cancel_running``: the key's
    live holders are returned, to be cancelled (they stop at their next step boundary,
    and the new run waits for their slots). ``replace_pending`` (debounce): the runs
    started with the key that have not taken it yet are returned, to be cancelled, and
    ``run_id`` is recorded as the key's one pending run.

    Raises:
        ConfigError: a key with no record, no template record and nothing declared.
        LimitReached: a key whose policy is ``reject`` has no free slot.
    """
    victims: list[str] = []
    if flow is None:
        return victims
    for key in flow["keys"]:
        cp = yield from _ops.find(key, _declared(flow, key))
        limit = _ops.read(cp)
        if limit.policy == "replace_pending":
            victims += yield from _ops.replace_pending(key, run_id)
        elif limit.policy in ("reject", "cancel_running") and limit.concurrency is not None:
            live = yield from _live_holders(cp.state.get("holders", {}))
            if limit.policy == "cancel_running":
                victims += live
            elif len(live) >= limit.concurrency:
                raise LimitReached(key, f"{len(live)} of {limit.concurrency} slots held")
    return [victim for victim in dict.fromkeys(victims) if victim != run_id]


def _live_holders(holders: dict[str, list[Any]]) -> Generator[Effect, Any, list[str]]:
    """Return the holders whose runs still hold their slots (kept slots count as held)."""
    live = []
    for holder, held in holders.items():
        got = yield Load(holder)  # one at a time: ``start``'s drivers load and save only
        if not isinstance(held[0], int) or not _ops.holder_is_stale(got, held[0]):
            live.append(holder)
    return live


def priority_of(cp: Checkpoint) -> int:
    """Return the run's priority (0 unless ``start`` gave one)."""
    return int(cp.flow.get("priority", 0)) if cp.flow else 0


def take(
    plan: Any, cp: Checkpoint, write: Callable[..., Gen]
) -> Generator[Effect, Any, Checkpoint]:
    """Take the run's own keys after its claim, or park it on the first that is full.

    Called once per execution (``_core.execute``); a slot already held at this epoch
    is granted again without a charge.

    Raises:
        Suspended: the run was parked (saved waiting on ``limit:<key>``, lease given back).
    """
    flow = cp.flow
    if not flow or not flow.get("keys"):
        return cp
    if resumed(cp):
        cp = yield from write(
            plan, cp, evolve(cp, waiting_for=None, wake_at=None), "limit taken up"
        )
    taken: list[str] = []
    for key in flow["keys"]:
        _, decision = yield from _ops.acquire(
            key, cp.run_id, cp.epoch, 0, _declared(flow, key), priority_of(cp)
        )
        if decision.granted:
            taken.append(key)
            continue
        for each in taken:
            yield from _ops.release(each, cp.run_id, cp.epoch)
        yield from park(plan, cp, Park(key, decision.retry_at), cp.attempt, write)
    return cp


def end(cp: Checkpoint) -> Gen:
    """Give back the run's own keys (it ended, failed or was cancelled); best effort."""
    flow = cp.flow
    if not flow or not flow.get("keys"):
        return
    for key in flow["keys"]:
        # The run gave its lease back first: its slots have lapsed; a release is written
        # only to hand a slot to a waiter (best effort: a waiter also polls).
        yield from _ops.release(key, cp.run_id, cp.epoch, lapsed=True)
