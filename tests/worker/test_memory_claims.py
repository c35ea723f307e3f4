"""The memory store's claim index answers exactly as ``Store.claimable``'s scan does.

(And ``arun``'s short path on the memory store, at the end: issue 20's other target.)

``MemoryStore.claimable`` reads a (status, due_at) index kept on every save and delete
(``stores/_listing.py``); the default ``Store.claimable`` scans every run. Over random
saves, deletes and status changes, with due_at ties and ``DUE_NOW``, both give the same
runs in the same order, for every status, limit and skip, whether the index was built
before the writes or after them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepstone import RetryPolicy, Step, StepFailed, Store, arun
from stepstone._checkpoint import DUE_NOW, Checkpoint, Failure, Signal, keep_times
from stepstone._store import RunInfo
from stepstone.stores.memory import MemoryStore

BASE = datetime(2030, 1, 1, tzinfo=UTC)
#: Few distinct times, so that due_at ties are common; DUE_NOW is one of them.
TIMES = [DUE_NOW, *(BASE + timedelta(seconds=s) for s in range(4))]
NOWS = [DUE_NOW - timedelta(seconds=1), *TIMES, BASE + timedelta(days=1)]
KINDS = (
    "queued",
    "running",
    "running-leased",
    "waiting-timer",
    "waiting-forever",
    "waiting-owned",
    "waiting-signalled",
    "done",
    "failed",
    "cancelled",
)
IDS = [f"r{i}" for i in range(8)]


def _checkpoint(run_id: str, kind: str, at: int, version: str | None) -> Checkpoint:
    """A checkpoint of ``kind`` whose due_at (if any) is one of ``TIMES``."""
    when = TIMES[at]
    fields: dict[str, Any] = {"step": 0, "total_steps": 3, "updated_at": when}
    if kind == "queued":
        fields["queued"] = True
    elif kind == "running-leased":
        fields.update(owner="w", lease=0.0, renewed_at=when)
    elif kind.startswith("waiting"):
        fields.update(waiting_for="timer", wake_at=when)
        if kind == "waiting-forever":
            fields.update(waiting_for="signal go", wake_at=None)
        elif kind == "waiting-owned":
            fields["owner"] = "w"
        elif kind == "waiting-signalled":
            fields.update(waiting_for="signal go", signals=(Signal("go", "s1", None, BASE),))
    elif kind == "done":
        fields["step"] = 2
    elif kind == "failed":
        fields["failure"] = Failure(1, "s1", "ValueError", "no", 1, BASE)
    elif kind == "cancelled":
        fields["cancelled"] = True
    return Checkpoint(run_id, version=version, **fields)


def _row(info: RunInfo) -> tuple[Any, ...]:
    return (info.run_id, info.status, info.version, info.owner, info.due_at, info.updated_at)


@contextmanager
def _kept_times() -> Iterator[None]:
    """Saves keep the checkpoint's ``updated_at`` (a running run's due_at without lease)."""
    token = keep_times.set(True)
    try:
        yield
    finally:
        keep_times.reset(token)


def _check(store: MemoryStore) -> None:
    """Every page of the index equals the same page of the scan."""
    for now in NOWS:
        for status in (None, "running", "queued", "waiting"):
            for limit in (0, 1, 2, 3, 100):
                for skip in (0, 1, 3) if status is not None else (0,):
                    indexed = store.claimable(now, limit, status=status, skip=skip)
                    scanned = Store.claimable(store, now, limit, status=status, skip=skip)
                    assert [_row(i) for i in indexed] == [_row(i) for i in scanned], (
                        now,
                        status,
                        limit,
                        skip,
                    )


_op = st.tuples(
    st.sampled_from(("save", "save", "save", "delete", "delete-cas", "check")),
    st.sampled_from(IDS),
    st.sampled_from(KINDS),
    st.integers(0, len(TIMES) - 1),
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, max_size=40), built_first=st.booleans())
def test_index_matches_scan(ops: list[tuple[str, str, str, int]], built_first: bool) -> None:
    """After random saves, deletes and status changes the index answers as the scan does."""
    store = MemoryStore()
    if built_first:
        store.claimable(BASE, 1)  # the index exists before the writes: kept in step
    with _kept_times():
        for action, run_id, kind, at in ops:
            current = store.load(run_id)
            if action == "save":
                version = None if current is None else current.version
                store.save(_checkpoint(run_id, kind, at, version))
            elif action == "delete":
                store.delete(run_id)
            elif action == "delete-cas" and current is not None:
                store.delete(run_id, expected_version=current.version)
            elif action == "check":
                _check(store)
    _check(store)


def test_ties_come_out_in_arrival_order() -> None:
    """Runs due at the same time come out in the order they were first saved, as scanned."""
    store = MemoryStore()
    store.claimable(BASE, 1)
    with _kept_times():
        for run_id in ("c", "a", "b"):
            store.save(_checkpoint(run_id, "queued", 0, None))
        # A re-save keeps a run's place; a delete and a new save puts it last.
        store.save(_checkpoint("c", "queued", 0, store.load("c").version))  # type: ignore[union-attr]
        store.delete("a")
        store.save(_checkpoint("a", "queued", 0, None))
    found = [info.run_id for info in store.claimable(BASE, 10, status="queued")]
    assert found == ["c", "b", "a"]
    assert all(info.due_at == DUE_NOW for info in store.claimable(BASE, 10))
    _check(store)


def test_finished_runs_are_not_indexed() -> None:
    """Finished runs stay out of the claim index: only the active ones are in it."""
    store = MemoryStore()
    with _kept_times():
        for i in range(50):
            store.save(_checkpoint(f"done-{i}", "done", 1, None))
        store.save(_checkpoint("due", "waiting-timer", 1, None))
    assert [info.run_id for info in store.claimable(BASE + timedelta(days=1))] == ["due"]
    assert store.claimable(DUE_NOW) == []


def test_bad_pages_are_refused_and_negative_limits_scan() -> None:
    """A bad status or skip raises as before; a negative limit gets the scan's answer."""
    store = MemoryStore()
    with pytest.raises(ValueError, match="status"):
        store.claimable(BASE, 1, status="done")
    with pytest.raises(ValueError, match="skip"):
        store.claimable(BASE, 1, skip=-1)
    with _kept_times():
        for run_id in IDS:
            store.save(_checkpoint(run_id, "queued", 0, None))
    assert [_row(i) for i in store.claimable(BASE, -2)] == [
        _row(i) for i in Store.claimable(store, BASE, -2)
    ]


def test_clear_and_dict_writes_keep_the_index() -> None:
    """Writes through any dict method keep the index; ``clear`` empties it."""
    store = MemoryStore()
    with _kept_times():
        for run_id in IDS:
            store.save(_checkpoint(run_id, "running", 1, None))
    assert len(store.claimable(BASE, 100)) == len(IDS)
    runs: Any = store._runs
    runs.pop("r0")
    runs.popitem()
    runs.setdefault("r0", _checkpoint("r0", "queued", 0, "v"))
    _check(store)
    runs.clear()
    assert store.claimable(BASE, 100) == []
    runs.update({"x": _checkpoint("x", "queued", 0, "v")})
    assert [info.run_id for info in store.claimable(BASE, 100)] == ["x"]
    _check(store)


# -- arun on the memory store: its saves take no task, its steps a timer only if needed --


def test_arun_renews_a_suspending_step_longer_than_its_lease() -> None:
    """An async step that awaits past its lease is renewed from the timer, not taken over."""
    store = MemoryStore()
    versions: list[str | None] = []

    async def long(state: dict[str, Any]) -> dict[str, Any]:
        for _ in range(200):
            await asyncio.sleep(0.01)
            cp = store.load("long")
            assert cp is not None
            if not versions or versions[-1] != cp.version:
                versions.append(cp.version)
            if len(versions) >= 3:
                break
        return {"long": True}

    state = asyncio.run(arun("long", [Step("long", long)], store, lease=0.3))
    assert state == {"long": True}
    assert len(versions) >= 3, "the lease was not renewed during the step"
    final = store.load("long")
    assert final is not None and final.owner is None and final.epoch == 1


def test_arun_cancelled_in_a_suspended_step_saves_nothing_for_it() -> None:
    """Cancelling arun while its step awaits stops the run there; the lease is given back."""
    store = MemoryStore()
    entered = asyncio.Event()

    async def first(state: dict[str, Any]) -> dict[str, Any]:
        return {"a": 1}

    async def held(state: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        await asyncio.sleep(30)
        return {"b": 1}

    async def main() -> None:
        task = asyncio.create_task(arun("c", [Step("a", first), Step("b", held)], store))
        await asyncio.wait_for(entered.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    cp = store.load("c")
    assert cp is not None and cp.step == 0 and cp.state == {"a": 1} and cp.owner is None


def test_arun_step_errors_after_suspending_reach_the_run() -> None:
    """A step that fails after awaiting fails the run as one that fails at once does."""
    store = MemoryStore()

    async def late(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        raise ValueError("late")

    async def early(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("early")

    for run_id, fn in (("late", late), ("early", early)):
        with pytest.raises(StepFailed, match=run_id):
            asyncio.run(arun(run_id, [Step("s", fn, retry=RetryPolicy(max_attempts=1))], store))
