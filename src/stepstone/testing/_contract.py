"""``StoreContract``: the behaviour every backend must show, written once as tests.

Every test that touches the store or the runner takes the ``ops`` fixture and runs twice,
``[sync]`` and ``[async]``: ``ops.load`` is ``store.load`` or ``await store.aload``,
``ops.run`` is ``stepstone.run`` or ``await stepstone.arun`` (see ``_ops.py``). The
async-only tests (many runs in one loop, cancellation, a blocked-loop check) come from
``AsyncContract`` in ``_contract_async.py``; leases, workers and suspended runs from
``RuntimeContract`` in ``_runtime.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import sys
import threading
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import pytest

from .. import _codec, _store
from .._checkpoint import DUE_NOW, Checkpoint, Failure, Signal, utcnow
from .._errors import (
    ConflictError,
    InputMismatch,
    InvalidRunId,
    InvalidState,
    StepFailed,
    WorkflowChanged,
)
from .._runner import RetryPolicy, Step, StepContext
from .._store import RunInfo, Store
from . import _barrier, _workers
from ._base import child_env, cp
from ._contract_async import AsyncContract
from ._ops import Ops
from ._runtime import RuntimeContract

__all__ = ["AWKWARD_RUN_IDS", "StoreContract", "backend_unavailable"]

#: Run ids that break naive backends: path tricks, URL syntax, case, length, Unicode.
AWKWARD_RUN_IDS = (
    "plain",
    "Plain",
    "PLAIN",
    "a/b",
    "/",
    "..",
    "../x",
    "./x",
    "a\\b",
    "#",
    "?q=1",
    "%",
    "%2F",
    "a%2fb",
    "with space",
    " leading and trailing ",
    "ü",
    "u\u0308",
    "日本語の実行",
    "emoji-\U0001f680",
    "~tilde",
    "!bang",
    ".hidden",
    "x.json",
    "x.lock",
    ".tmp-x",
    "CON",
    "'; DROP TABLE x; --",
    "x" * 1024,
    "é" * 1024,
    "/" * 1024,
)

BAD_RUN_IDS: tuple[object, ...] = (
    "",
    "x" * 1025,
    "a\x00b",
    "line\nbreak",
    "tab\t",
    "\x7f",
    5,
    None,
)

BAD_STATES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("set", {"docs": [{"when": {1, 2}}]}, "state['docs'][0]['when']"),
    ("bytes", {"blob": b"x"}, "state['blob']"),
    ("nan", {"score": float("nan")}, "state['score']"),
    ("inf", {"nested": {"x": [1.0, float("inf")]}}, "state['nested']['x'][1]"),
    ("int key", {"map": {1: "one"}}, "state['map'][1]"),
    ("tuple", {"pair": (1, 2)}, "state['pair']"),
    ("object", {"obj": object()}, "state['obj']"),
    ("surrogate", {"s": ["ok", "bad\ud800"]}, "state['s'][1]"),
)

_T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def backend_unavailable(reason: str) -> NoReturn:
    """Skip a backend's tests loudly, or fail them when CI demands every backend.

    CI sets ``STEPSTONE_REQUIRE_BACKENDS=1``; then a missing server is a failure, so a
    backend can never vanish from CI as a quiet skip.
    """
    import os  # noqa: PLC0415

    message = f"BACKEND UNAVAILABLE: {reason}"
    if os.environ.get("STEPSTONE_REQUIRE_BACKENDS") == "1":
        pytest.fail(message + " (STEPSTONE_REQUIRE_BACKENDS=1: every backend must run)")
    pytest.skip(message)


def _runtime_checkpoints(now: datetime) -> list[Checkpoint]:
    """Checkpoints using every schema-2 field, each kind of run once."""
    signals = (
        Signal("approval", "sig-1", {"ok": True, "by": "ü", "n": [1, 2.5, None]}, now),
        Signal("approval", "sig-2", None, now + timedelta(microseconds=1)),
        Signal("note", "sig-3", "text", now + timedelta(seconds=1)),
    )
    return [
        cp(
            "owned",
            1,
            {"a": 1, "b": 2},
            total_steps=5,
            input={"query": "héllo", "k": [1, {"x": None}]},
            workflow="agent",
            workflow_version="2026-01",
            cancel_requested=True,
            owner="worker-1/pid-42",
            epoch=7,
            lease=30.5,
            renewed_at=now,
            created_at=now - timedelta(hours=1),
            parent="parent-run",
        ),
        cp(
            "waiting",
            0,
            {"a": 1},
            total_steps=3,
            waiting_for="signal approval",
            wake_at=now + timedelta(days=1, microseconds=3),
            signals=signals,
            consumed={"approval": 1, "note": 0},
            epoch=2,
        ),
        Checkpoint(
            run_id="queued",
            total_steps=2,
            input={"x": 1},
            workflow="agent",
            queued=True,
            created_at=now - timedelta(minutes=5),
        ),
        cp("cancelled", 0, {"a": 1}, total_steps=3, cancelled=True, cancel_requested=True),
    ]


class StoreContract(RuntimeContract, AsyncContract):
    """Subclass with a ``store_config`` fixture returning a fresh, empty store's config.

    What the backend can do is read from the store class (``durable``, ``kill_points``,
    ``counts_requests``, ``native_async``). Class attributes of the subclass tune size:
    ``processes`` (processes the concurrency tests start) and ``concurrent_runs`` (runs
    the async test drives at once in one loop).
    """

    # -- the Store methods ---------------------------------------------------------

    def test_missing_run_is_none(self, ops: Ops) -> None:
        """Loading a run that never started returns None, not an error."""
        assert ops.load("never-started") is None

    def test_round_trip(self, ops: Ops) -> None:
        """A saved checkpoint loads back with the same fields and the new version."""
        state = {"text": "héllo", "n": 3, "f": 1.5, "ok": True, "none": None, "l": [1, {"a": []}]}
        failure = Failure(2, "s2", "ValueError", "boom", 1, utcnow())
        saved = ops.save(cp("r", 1, state, total_steps=4, attempt=1, failure=failure))
        assert saved.version is not None
        loaded = ops.load("r")
        assert loaded is not None
        assert loaded.state == state
        assert loaded.step == 1
        assert loaded.step_names == ("s0", "s1")
        assert loaded.total_steps == 4
        assert loaded.attempt == 1
        assert loaded.failure == failure
        assert loaded.version == saved.version
        assert loaded.status == "failed"
        assert loaded.created_at is not None and loaded.updated_at is not None

    def test_runtime_fields_round_trip(self, ops: Ops) -> None:
        """Input, workflow, ownership, suspension, signals and flags load back exactly."""
        originals = _runtime_checkpoints(_T0)
        for original in originals:
            saved = ops.save(original)
            loaded = ops.load(original.run_id)
            assert loaded is not None, original.run_id
            expected = replace(
                original,
                version=saved.version,
                created_at=loaded.created_at,
                updated_at=loaded.updated_at,
            )
            assert loaded == expected, original.run_id
            if original.created_at is not None:
                assert loaded.created_at == original.created_at, original.run_id
        statuses = {c.run_id: c.status for c in originals}
        assert statuses == {
            "owned": "running",
            "waiting": "waiting",
            "queued": "queued",
            "cancelled": "cancelled",
        }

    def test_schema_1_document_still_loads(self, ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
        """A checkpoint written as a schema-1 document loads, and saves on top of it work."""
        # The backend writes the document through its own path; only the schema number
        # differs, which is what a checkpoint saved by stepstone 0.1 looks like.
        monkeypatch.setattr(_codec, "SCHEMA_VERSION", 1)
        old = ops.save(cp("old", 0, {"a": 1}, total_steps=2))
        monkeypatch.undo()
        loaded = ops.load("old")
        assert loaded is not None
        assert (loaded.step, loaded.state, loaded.version) == (0, {"a": 1}, old.version)
        assert (loaded.input, loaded.owner, loaded.epoch, loaded.signals) == (None, None, 0, ())
        assert loaded.status == "running"
        new = ops.save(cp("old", 1, {"a": 1, "b": 2}, total_steps=2, version=loaded.version))
        again = ops.load("old")
        assert again is not None and again.version == new.version and again.status == "done"

    def test_numbers_round_trip_exactly(self, ops: Ops) -> None:
        """Big ints, floats that look like ints and negative zero come back exactly."""
        state = {
            "big": 2**60 + 1,
            "neg_big": -(2**63),
            "float": 1.0,
            "neg_zero": -0.0,
            "tiny": 5e-324,
            "huge": 1.7976931348623157e308,
            "list": [1, 1.0, 2**53 + 1],
        }
        ops.save(cp("r", 0, state))
        loaded = ops.load("r")
        assert loaded is not None
        assert json.dumps(loaded.state, sort_keys=True) == json.dumps(state, sort_keys=True)

    def test_status_done_from_checkpoint_alone(self, ops: Ops) -> None:
        """A checkpoint whose last step is the workflow's last reports done."""
        ops.save(cp("r", 2, total_steps=3))
        loaded = ops.load("r")
        assert loaded is not None and loaded.status == "done"

    def test_isolation_between_run_ids(self, ops: Ops) -> None:
        """Saving one run neither creates nor changes another."""
        ops.save(cp("one", 0, {"who": "one"}))
        ops.save(cp("two", 0, {"who": "two"}))
        one, two = ops.load("one"), ops.load("two")
        assert one is not None and one.state == {"who": "one"}
        assert two is not None and two.state == {"who": "two"}
        assert ops.load("three") is None

    def test_create_is_compare_and_swap(self, ops: Ops) -> None:
        """A save with version None fails with ConflictError when the run exists."""
        ops.save(cp("r", 0, {"first": True}))
        with pytest.raises(ConflictError):
            ops.save(cp("r", 0, {"second": True}))
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == {"first": True}

    def test_update_is_compare_and_swap(self, ops: Ops) -> None:
        """A save with a stale version fails and stores nothing; the current one succeeds."""
        v1 = ops.save(cp("r", 0, {"v": 1}))
        v2 = ops.save(cp("r", 1, {"v": 2}, version=v1.version))
        assert v2.version != v1.version
        with pytest.raises(ConflictError):
            ops.save(cp("r", 2, {"v": "stale"}, version=v1.version))
        with pytest.raises(ConflictError):
            ops.save(cp("r", 2, {"v": "made-up"}, version="not-a-version"))
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == {"v": 2}
        assert loaded.version == v2.version

    def test_recreated_run_gets_a_new_version(self, ops: Ops) -> None:
        """After delete and re-create, a version held from before no longer matches."""
        old = ops.save(cp("r", 0))
        assert ops.delete("r")
        new = ops.save(cp("r", 0))
        assert new.version != old.version
        with pytest.raises(ConflictError):
            ops.save(cp("r", 1, version=old.version))

    def test_stale_save_cannot_resurrect_a_deleted_run(self, ops: Ops) -> None:
        """A save with a version after the run was deleted conflicts and stores nothing."""
        held = ops.save(cp("r", 0))
        assert ops.delete("r")
        with pytest.raises(ConflictError):
            ops.save(cp("r", 1, version=held.version))
        assert ops.load("r") is None

    def test_saved_state_is_not_aliased(self, ops: Ops) -> None:
        """Mutating the state passed to save, or the one returned, changes nothing stored."""
        state: dict[str, Any] = {"list": [1]}
        saved = ops.save(cp("r", 0, state))
        state["list"].append(2)
        saved.state["list"].append(3)
        saved.state["new"] = True
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == {"list": [1]}
        loaded.state["list"].append(4)
        again = ops.load("r")
        assert again is not None and again.state == {"list": [1]}

    def test_delete(self, ops: Ops) -> None:
        """Delete removes the run and reports whether it existed."""
        ops.save(cp("r", 0))
        assert ops.delete("r") is True
        assert ops.load("r") is None
        assert ops.delete("r") is False
        assert "r" not in set(ops.list_runs())

    def test_delete_is_compare_and_swap(self, ops: Ops) -> None:
        """Delete with a stale expected version raises ConflictError and deletes nothing."""
        v1 = ops.save(cp("r", 0, {"v": 1}))
        v2 = ops.save(cp("r", 1, {"v": 2}, version=v1.version))
        assert v1.version is not None and v2.version is not None
        with pytest.raises(ConflictError):
            ops.delete("r", expected_version=v1.version)
        with pytest.raises(ConflictError):
            ops.delete("r", expected_version="not-a-version")
        kept = ops.load("r")
        assert kept is not None and (kept.version, kept.state) == (v2.version, {"v": 2})
        assert ops.delete("r", expected_version=v2.version) is True
        assert ops.load("r") is None
        assert ops.delete("r", expected_version=v2.version) is False
        assert ops.delete("never-saved", expected_version=v2.version) is False

    def test_list_runs(self, ops: Ops) -> None:
        """list_runs yields exactly the stored run_ids."""
        assert set(ops.list_runs()) == set()
        ids = {"a", "b/c", "Ü", "x" * 1024}
        for run_id in ids:
            ops.save(cp(run_id, 0))
        assert sorted(ops.list_runs()) == sorted(ids)

    def test_list_info(self, ops: Ops) -> None:
        """list_info reports each run's status and step without needing the caller's steps."""
        ops.save(cp("done", 1, total_steps=2))
        ops.save(cp("running", 0, total_steps=2))
        ops.save(cp("failed", 0, total_steps=2, failure=Failure(1, "s1", "E", "m", 1, utcnow())))
        info = {i.run_id: i for i in ops.list_info()}
        assert {k: v.status for k, v in info.items()} == {
            "done": "done",
            "running": "running",
            "failed": "failed",
        }
        assert info["done"].step == 1 and info["done"].updated_at is not None

    def test_list_info_reports_version_owner_and_due_time(self, ops: Ops) -> None:
        """Each RunInfo carries the run's version, owner and due time as its checkpoint has them."""
        saved = {c.run_id: ops.save(c) for c in _runtime_checkpoints(_T0)}
        saved["done"] = ops.save(cp("done", 1, total_steps=2, owner="gone"))
        info = {i.run_id: i for i in ops.list_info()}
        assert set(info) == set(saved)
        for run_id in saved:
            got, stored = info[run_id], ops.load(run_id)
            assert stored is not None, run_id
            assert (got.status, got.step, got.total_steps) == (
                stored.status,
                stored.step,
                stored.total_steps,
            ), run_id
            assert got.version == stored.version, run_id
            assert got.owner == stored.owner, run_id
            assert got.due_at == stored.due_at, run_id
        assert info["owned"].due_at == _T0 + timedelta(seconds=30.5)
        assert info["queued"].due_at == DUE_NOW  # queued runs are due at once, by any clock
        assert info["done"].due_at is None and info["cancelled"].due_at is None

    def test_claimable_finds_work_and_only_work(self, ops: Ops) -> None:
        """claimable(now) returns running runs and due queued/waiting ones, never finished ones."""
        now = utcnow()
        past, future = now - timedelta(minutes=1), now + timedelta(hours=1)
        failure = Failure(1, "s1", "E", "m", 1, now)
        for c in (
            cp("running", 0, total_steps=3, owner="w1", lease=30.0, renewed_at=future),
            cp("running-free", 0, total_steps=3),
            Checkpoint(run_id="queued", total_steps=2, queued=True, created_at=past),
            cp("waiting-due", 0, total_steps=3, waiting_for="timer", wake_at=past),
            cp("waiting-at-now", 0, total_steps=3, waiting_for="timer", wake_at=now),
            cp("waiting-later", 0, total_steps=3, waiting_for="timer", wake_at=future),
            cp("waiting-signal", 0, total_steps=3, waiting_for="signal approval"),
            cp("done", 2, total_steps=3),
            cp("failed", 0, total_steps=3, failure=failure),
            cp("cancelled", 0, total_steps=3, cancelled=True),
            Checkpoint(run_id="queued-cancelled", total_steps=2, queued=True, cancelled=True),
        ):
            ops.save(c)
        found = ops.claimable(now)
        ids = [i.run_id for i in found]
        assert len(ids) == len(set(ids)), ids
        assert set(ids) == {"running", "running-free", "queued", "waiting-due", "waiting-at-now"}
        by_id = {i.run_id: i for i in found}
        for run_id, info in by_id.items():
            stored = ops.load(run_id)
            assert stored is not None
            assert (info.status, info.version, info.owner) == (
                stored.status,
                stored.version,
                stored.owner,
            ), run_id
            assert info.due_at == stored.due_at, run_id
        due = [i for i in found if i.status != "running"]
        assert [i.due_at for i in due] == sorted(i.due_at or now for i in due)

    def test_claimable_respects_limit_and_due_order(self, ops: Ops) -> None:
        """claimable returns at most limit runs of each kind, the earliest due first.

        Queued runs are due at once (``DUE_NOW``, whatever clock queued them), so they
        come before waiting runs, which come in the order of their wake-up times.
        """
        now = utcnow()
        for index in range(4):
            when = now + timedelta(minutes=10 - index)  # a queuer whose clock is ahead
            ops.save(Checkpoint(run_id=f"q{index}", total_steps=2, queued=True, created_at=when))
            ops.save(cp(f"run{index}", 0, total_steps=3))
        ops.save(cp("w1", 0, total_steps=3, waiting_for="timer", wake_at=now - timedelta(hours=1)))
        ops.save(cp("w2", 0, total_steps=3, waiting_for="timer", wake_at=now - timedelta(hours=2)))
        found = ops.claimable(now, limit=10)
        due = [i.run_id for i in found if i.status != "running"]
        assert sorted(due[:4]) == ["q0", "q1", "q2", "q3"] and due[4:] == ["w2", "w1"]
        limited = ops.claimable(now, limit=2)
        running = [i.run_id for i in limited if i.status == "running"]
        assert len(running) == 2 and set(running) <= {f"run{i}" for i in range(4)}
        assert [i.status for i in limited if i.status != "running"] == ["queued", "queued"]
        earlier = ops.claimable(now - timedelta(days=1), limit=10)
        assert {i.run_id for i in earlier if i.status == "waiting"} == set(), "not due a day ago"

    def test_claimable_pages_each_kind(self, ops: Ops) -> None:
        """claimable(status=, skip=) pages through one kind in due_at order, all of it.

        A worker pages past runs it cannot serve and through every running run, so no
        run stays behind a page of others. A waiting run holding an unconsumed signal
        it waits for, or held by an owner, is due now whatever its ``wake_at``.
        """
        if not _store.pages(type(ops.store).claimable):
            pytest.skip(
                "claimable(now, limit) predates paging: workers page by asking for longer "
                "lists; add the keyword-only status= and skip= for an indexed page"
            )
        now = utcnow()
        go = Signal("go", "id-1", None, now)
        for index in range(7):
            later = now + timedelta(minutes=index)  # a renewer whose clock may be ahead
            ops.save(cp(f"run{index}", 0, total_steps=3, owner="w", lease=30.0, renewed_at=later))
            ops.save(Checkpoint(run_id=f"q{index}", total_steps=2, queued=True))
            earlier = now - timedelta(minutes=index)
            ops.save(cp(f"w{index}", 0, total_steps=3, waiting_for="timer", wake_at=earlier))
        ops.save(cp("w-signalled", 0, total_steps=3, waiting_for="signal go", signals=(go,)))
        ops.save(cp("w-owned", 0, total_steps=3, waiting_for="signal go", owner="w", lease=30.0))
        ops.save(cp("w-later", 0, total_steps=3, waiting_for="timer", wake_at=now + timedelta(1)))
        ops.save(cp("done", 2, total_steps=3))
        expected = {
            "running": [f"run{i}" for i in range(7)],
            "queued": [f"q{i}" for i in range(7)],
            "waiting": ["w-signalled", "w-owned", *(f"w{i}" for i in range(6, -1, -1))],
        }
        for status, want in expected.items():
            seen: list[RunInfo] = []
            for skip in range(0, 12, 3):
                page = ops.claimable(now, 3, status=status, skip=skip)  # type: ignore[arg-type]
                assert len(page) <= 3, (status, skip, page)
                assert all(info.status == status for info in page), page
                seen.extend(page)
            ids = [info.run_id for info in seen]
            assert len(ids) == len(set(ids)), f"a run on two pages of {status}: {ids}"
            assert sorted(ids) == sorted(want), status
            due = [info.due_at or DUE_NOW for info in seen]
            assert due == sorted(due), f"{status} pages out of due_at order"
        assert [i.run_id for i in ops.claimable(now, 10, status="waiting")][:2] in (
            ["w-signalled", "w-owned"],
            ["w-owned", "w-signalled"],
        )
        with pytest.raises(ValueError, match="status"):
            ops.claimable(now, 3, status="done")
        with pytest.raises(ValueError, match="skip"):
            ops.claimable(now, 3, status="queued", skip=-1)

    def test_awkward_run_ids(self, ops: Ops) -> None:
        """Every run_id the contract allows round-trips and never shares a checkpoint."""
        for index, run_id in enumerate(AWKWARD_RUN_IDS):
            ops.save(cp(run_id, 0, {"index": index}))
        for index, run_id in enumerate(AWKWARD_RUN_IDS):
            loaded = ops.load(run_id)
            assert loaded is not None, run_id
            assert loaded.state == {"index": index}, run_id
            assert loaded.run_id == run_id
        assert sorted(ops.list_runs()) == sorted(AWKWARD_RUN_IDS)
        assert ops.delete("../x")
        assert ops.load("../x") is None
        assert ops.load("x") is None
        loaded = ops.load("./x")
        assert loaded is not None and loaded.state["index"] == AWKWARD_RUN_IDS.index("./x")

    @pytest.mark.parametrize("bad", BAD_RUN_IDS, ids=repr)
    def test_bad_run_id_refused(self, ops: Ops, bad: Any) -> None:
        """A run_id outside the contract is refused with InvalidRunId on every method."""
        with pytest.raises(InvalidRunId, match="run_id"):
            ops.load(bad)
        with pytest.raises(InvalidRunId):
            ops.save(Checkpoint(run_id=bad, step=0, state={}, step_names=("a",)))
        with pytest.raises(InvalidRunId):
            ops.delete(bad)
        assert ops.list_runs() == []

    @pytest.mark.parametrize(("kind", "state", "path"), BAD_STATES, ids=[b[0] for b in BAD_STATES])
    def test_non_json_state_refused(
        self, ops: Ops, kind: str, state: dict[str, Any], path: str
    ) -> None:
        """A state that does not round-trip through JSON is refused naming its path."""
        before = ops.save(cp("r", 0, {"good": 1}))
        with pytest.raises(InvalidState) as info:
            ops.save(cp("r", 1, state, version=before.version))
        assert info.value.path == path
        assert path in str(info.value)
        loaded = ops.load("r")
        assert loaded is not None
        assert (loaded.state, loaded.version) == ({"good": 1}, before.version)
        with pytest.raises(InvalidState):
            ops.save(cp("fresh", 0, state))
        assert ops.load("fresh") is None

    def test_store_is_context_manager_and_close_twice(self, ops: Ops, store_config: str) -> None:
        """A store closes on leaving a (async) with block, closing again is allowed, data stays."""
        with ops.open(store_config) as other:
            assert isinstance(other, Store)
            ops.save(cp("ctx", 0, {"kept": True}), store=other)
        ops.close_store(other)
        ops.close_store(other)
        if self.is_durable(ops.store):
            with ops.open(store_config) as again:
                loaded = ops.load("ctx", store=again)
            assert loaded is not None and loaded.state == {"kept": True}

    def test_requests_are_counted_one_per_call(self, ops: Ops) -> None:
        """A store that counts requests sends exactly one per save and one per load."""
        if not type(ops.store).counts_requests:
            pytest.skip(f"{type(ops.store).__name__} does not count requests")
        counted: Any = ops.store
        ops.save(cp("warm-up", 0))  # first use may create the container or table
        ops.load("warm-up")
        before = counted.requests_sent
        first = ops.save(cp("r", 0))
        assert counted.requests_sent - before == 1, "a create is one request"
        before = counted.requests_sent
        ops.save(cp("r", 1, version=first.version))
        assert counted.requests_sent - before == 1, "a compare-and-swap update is one request"
        before = counted.requests_sent
        assert ops.load("r") is not None
        assert counted.requests_sent - before == 1, "a load is one request"

    # -- processes, threads and tasks ----------------------------------------------

    def test_reopen_in_new_process(self, ops: Ops, store_config: str) -> None:
        """A fresh process opening the same config string sees what was saved."""
        self.need_durable(ops.store)
        ops.save(cp("r/1", 1, {"from": "parent"}))
        code = (
            "import asyncio, json, sys, stepstone\n"
            "store = stepstone.open_store(sys.argv[1])\n"
            "cp = store.load('r/1') if sys.argv[2] == 'sync' else asyncio.run(store.aload('r/1'))\n"
            "print(json.dumps([cp.step, cp.state]))\n"
        )
        done = _barrier.run_child(
            [sys.executable, "-c", code, store_config, ops.mode], "reopen", env=child_env()
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [1, {"from": "parent"}]

    def test_racing_one_run_in_one_process(self, ops: Ops, store_config: str) -> None:
        """Threads (sync) or tasks on one loop (async) saving on one version: one wins a round."""
        ops.save(Checkpoint(run_id="race", step=-1, state={"wins": []}))
        rounds, workers = 8, 4
        if ops.is_async:
            results = ops.aio(_workers.race_tasks(ops.store, "race", rounds, workers))
        else:
            barrier = threading.Barrier(workers)
            found: queue.Queue[tuple[int, int, bool]] = queue.Queue()
            if self.is_durable(ops.store):
                # Each thread opens its own store, as separate workers in one process do.
                threads = [
                    _barrier.Worker(
                        f"racer-{w}",
                        _workers.race_one_run,
                        store_config,
                        "race",
                        rounds,
                        w,
                        barrier,
                        found,
                    )
                    for w in range(workers)
                ]
            else:  # each open of memory:// is a new store; share this one
                threads = [
                    _barrier.Worker(
                        f"racer-{w}",
                        _workers.race_rounds,
                        ops.store,
                        "race",
                        rounds,
                        w,
                        barrier,
                        found.put,
                    )
                    for w in range(workers)
                ]
            for t in threads:
                t.start()
            _barrier.join_threads(threads, _barrier.PROCESS_TIMEOUT)
            results = [found.get_nowait() for _ in range(rounds * workers)]
        self._check_race(ops, results, rounds)

    @staticmethod
    def _check_race(ops: Ops, results: list[tuple[int, int, bool]], rounds: int) -> None:
        winners = {r: w for r, w, ok in results if ok}
        wins_per_round = Counter(r for r, _, ok in results if ok)
        assert all(wins_per_round[r] == 1 for r in range(rounds)), wins_per_round
        final = ops.load("race")
        assert final is not None
        assert final.state["wins"] == [winners[r] for r in range(rounds)]
        assert final.step == rounds - 1

    def test_processes_racing_one_run(self, ops: Ops, store_config: str) -> None:
        """Processes saving on top of the same version: exactly one wins each round."""
        self.need_durable(ops.store)
        ops.save(Checkpoint(run_id="race", step=-1, state={"wins": []}))
        rounds, workers = 6, self.processes
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(workers)
        results = ctx.Queue()
        procs = {
            f"racer-{w}": ctx.Process(
                target=_workers.race_one_run,
                args=(store_config, "race", rounds, w, barrier, results, ops.mode),
            )
            for w in range(workers)
        }
        for p in procs.values():
            p.start()
        collected = _barrier.collect(results, rounds * workers, procs)
        for name, p in procs.items():
            _barrier.join_process(p, name)
        self._check_race(ops, collected, rounds)

    def test_processes_writing_different_runs(self, ops: Ops, store_config: str) -> None:
        """Many processes running their own runs into one store lose no checkpoint."""
        self.need_durable(ops.store)
        per_process = 5
        ctx = multiprocessing.get_context("spawn")
        procs = {
            f"writer-{w}": ctx.Process(
                target=_workers.run_many, args=(store_config, f"p{w}", per_process, ops.mode)
            )
            for w in range(self.processes)
        }
        for p in procs.values():
            p.start()
        for name, p in procs.items():
            _barrier.join_process(p, name)
        expected = {f"p{w}-{i}" for w in range(self.processes) for i in range(per_process)}
        assert set(ops.list_runs()) == expected
        for run_id in expected:
            loaded = ops.load(run_id)
            assert loaded is not None
            assert loaded.state == {"a": 1, "b": 2, "c": 3}
            assert loaded.status == "done"

    # -- the runner on this store --------------------------------------------------

    def test_run_skips_completed_steps(self, ops: Ops) -> None:
        """A resumed run skips the steps its checkpoint completed and runs the rest."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("not yet")

        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log), Step("c", boom)])
        final = ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log), ops.add("c", 3, log)])
        assert final == {"a": 1, "b": 2, "c": 3}
        assert log == ["a", "b", "c"]

    def test_finished_run_runs_nothing(self, ops: Ops) -> None:
        """Running a finished run again returns its final state and runs no step."""
        log: list[str] = []
        steps = [ops.add("a", 1, log), ops.add("b", 2, log)]
        assert ops.run("r", steps) == {"a": 1, "b": 2}
        assert ops.run("r", steps) == {"a": 1, "b": 2}
        assert log == ["a", "b"]

    def test_appending_steps_is_allowed(self, ops: Ops) -> None:
        """Steps appended after a finished run run on the next call; earlier ones do not."""
        log: list[str] = []
        ops.run("r", [ops.add("a", 1, log)])
        assert ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log)]) == {"a": 1, "b": 2}
        assert log == ["a", "b"]

    def test_step_failed_reports_the_step(self, ops: Ops) -> None:
        """A raising step gives StepFailed with run, index, name, last state and cause."""

        def boom(state: dict[str, Any]) -> None:
            state["a"] = "mutated before raising"
            raise ValueError("bad input")

        with pytest.raises(StepFailed) as info:
            ops.run("r", [ops.add("a", 1), ops.step("b", boom)])
        err = info.value
        assert (err.run_id, err.step_index, err.step_name) == ("r", 1, "b")
        assert err.state == {"a": 1}
        assert isinstance(err.__cause__, ValueError)
        loaded = ops.load("r")
        assert loaded is not None and loaded.status == "failed" and loaded.step == 0
        assert loaded.failure is not None
        assert (loaded.failure.step_name, loaded.failure.error_type) == ("b", "ValueError")
        assert loaded.failure.message == "bad input"

    def test_failure_cleared_when_step_succeeds(self, ops: Ops) -> None:
        """Resuming clears the saved failure once the failed step succeeds."""

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("x")

        with pytest.raises(StepFailed):
            ops.run("r", [Step("a", boom), ops.add("b", 2)])
        ops.run("r", [ops.add("a", 1), ops.add("b", 2)])
        loaded = ops.load("r")
        assert loaded is not None and loaded.failure is None and loaded.status == "done"

    def test_workflow_changed(self, ops: Ops) -> None:
        """Resuming with renamed or removed completed steps raises and runs nothing."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("stop")

        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1), ops.add("b", 2), Step("c", boom)])
        with pytest.raises(WorkflowChanged) as info:
            ops.run("r", [ops.add("a", 1, log), ops.add("B", 2, log), ops.add("c", 3, log)])
        assert info.value.position == 1
        assert "position 1" in str(info.value)
        with pytest.raises(WorkflowChanged) as info:
            ops.run("r", [ops.add("a", 1, log)])
        assert info.value.position == 1
        assert log == []

    def test_step_state_is_a_copy(self, ops: Ops) -> None:
        """A step that keeps and later mutates its state cannot change any checkpoint."""
        kept: list[dict[str, Any]] = []

        def keep(state: dict[str, Any]) -> dict[str, Any]:
            kept.append(state)
            return {"kept": True}

        def later(state: dict[str, Any]) -> dict[str, Any]:
            kept[0]["sneaky"] = "changed"
            kept[0]["kept"] = "changed"
            return {"later": True}

        final = ops.run("r", [ops.add("a", [1]), Step("keep", keep), ops.step("later", later)])
        assert final == {"a": [1], "kept": True, "later": True}
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == final
        final["a"].append(2)
        again = ops.load("r")
        assert again is not None and again.state["a"] == [1]

    def test_in_place_mutation_is_kept(self, ops: Ops) -> None:
        """Changes a step makes to its own state in place are saved like returned ones."""

        def append(state: dict[str, Any]) -> None:
            state["items"].append("b")

        steps = [ops.add("items", ["a"]), ops.step("append", append), Step("again", append)]
        assert ops.run("r", steps) == {"items": ["a", "b", "b"]}
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == {"items": ["a", "b", "b"]}

    def test_non_json_update_fails_without_saving(self, ops: Ops) -> None:
        """A step returning a non-JSON value fails and leaves the last checkpoint as it was."""
        with pytest.raises(InvalidState):
            ops.run("r", [ops.add("a", 1), ops.add("b", {1, 2})])
        loaded = ops.load("r")
        assert loaded is not None and loaded.step == 0 and loaded.state == {"a": 1}

    def test_conflict_stops_the_run(self, ops: Ops) -> None:
        """When another worker advances the run mid-step, run raises ConflictError."""
        log: list[str] = []
        store = ops.store

        def interloper(state: dict[str, Any]) -> dict[str, Any]:
            # A plain step: under arun it runs in a worker thread, so sync calls are fine.
            current = store.load("r")
            assert current is not None
            store.save(
                replace(
                    current,
                    step=1,
                    state={"a": 1, "b": "other"},
                    step_names=("a", "b"),
                    total_steps=3,
                )
            )
            return {"b": "mine"}

        with pytest.raises(ConflictError):
            ops.run("r", [ops.add("a", 1), Step("b", interloper), ops.add("c", 3, log)])
        assert log == []
        loaded = ops.load("r")
        assert loaded is not None and loaded.state == {"a": 1, "b": "other"}

    def test_retry_runs_until_success(self, ops: Ops) -> None:
        """A step that fails twice then succeeds runs three times under a retry policy."""
        attempts: list[int] = []

        def flaky(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            attempts.append(ctx.attempt)
            if ctx.attempt < 3:
                raise ConnectionError("try again")
            return {"flaky": ctx.attempt}

        policy = RetryPolicy(max_attempts=5, initial_delay=0, jitter=0)
        assert ops.run("r", [ops.step("flaky", flaky, retry=policy)]) == {"flaky": 3}
        assert attempts == [1, 2, 3]
        loaded = ops.load("r")
        assert loaded is not None and loaded.failure is None and loaded.attempt == 0

    def test_retry_gives_up_with_last_error(self, ops: Ops) -> None:
        """Exhausted attempts fail the run with the last error and save the failure."""

        def always(state: dict[str, Any], ctx: StepContext) -> None:
            raise TimeoutError(f"attempt {ctx.attempt}")

        policy = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
        with pytest.raises(StepFailed) as info:
            ops.run("r", [Step("x", always, retry=policy)])
        assert str(info.value.__cause__) == "attempt 2"
        loaded = ops.load("r")
        assert loaded is not None and loaded.failure is not None
        assert (loaded.failure.attempt, loaded.attempt, loaded.status) == (2, 0, "failed")

    def test_failed_run_gets_a_fresh_budget(self, ops: Ops) -> None:
        """Running a failed run again starts the step's attempts from one."""
        attempts: list[int] = []

        def fails_twice(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            attempts.append(ctx.attempt)
            if len(attempts) <= 2:
                raise TimeoutError("down")
            return {"ok": True}

        policy = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
        with pytest.raises(StepFailed):
            ops.run("r", [ops.step("x", fails_twice, retry=policy)])
        assert ops.run("r", [ops.step("x", fails_twice, retry=policy)]) == {"ok": True}
        assert attempts == [1, 2, 1]

    def test_retry_only_listed_errors(self, ops: Ops) -> None:
        """An error the policy does not list fails at once, without retrying."""
        attempts: list[int] = []

        def wrong(state: dict[str, Any], ctx: StepContext) -> None:
            attempts.append(ctx.attempt)
            raise KeyError("not retried")

        policy = RetryPolicy(max_attempts=5, initial_delay=0, retry_on=(ConnectionError,))
        with pytest.raises(StepFailed):
            ops.run("r", [ops.step("x", wrong, retry=policy)])
        assert attempts == [1]

    def test_idempotency_key(self, ops: Ops) -> None:
        """Each step's key is stable across attempts and distinct across steps and runs."""
        keys: dict[tuple[str, str, int], str] = {}

        def record(state: dict[str, Any], ctx: StepContext) -> None:
            keys[(ctx.run_id, ctx.step_name, ctx.attempt)] = ctx.idempotency_key
            if ctx.attempt == 1 and ctx.step_name == "b":
                raise RuntimeError("once")

        policy = RetryPolicy(max_attempts=2, initial_delay=0)
        steps = [ops.step("a", record), Step("b", record, retry=policy)]
        ops.run("r1", steps)
        ops.run("r2", steps)
        assert keys[("r1", "b", 1)] == keys[("r1", "b", 2)]
        assert len({keys[("r1", "a", 1)], keys[("r1", "b", 1)], keys[("r2", "a", 1)]}) == 3

    # -- input= ------------------------------------------------------------------------

    def test_input_is_the_initial_state_and_recorded(self, ops: Ops) -> None:
        """input= is the state the first step sees, and the first save records it."""
        seen: list[dict[str, Any]] = []

        def first(state: dict[str, Any]) -> dict[str, Any]:
            seen.append(dict(state))
            return {"a": 1}

        given = {"query": "héllo", "k": [1, {"x": None}]}
        final = ops.run("r", [ops.step("first", first), ops.add("b", 2)], input=given)
        assert final == {**given, "a": 1, "b": 2}
        assert seen == [given]
        loaded = ops.load("r")
        assert loaded is not None and loaded.input == given

    def test_input_reused_when_resuming_without_it(self, ops: Ops) -> None:
        """Resuming with input=None starts from the recorded input, not from an empty state."""
        seen: list[dict[str, Any]] = []

        def first(state: dict[str, Any]) -> dict[str, Any]:
            seen.append(dict(state))
            if len(seen) == 1:
                raise RuntimeError("not yet")
            return {"a": 1}

        with pytest.raises(StepFailed):
            ops.run("r", [ops.step("first", first)], input={"q": 1})
        assert ops.run("r", [ops.step("first", first)]) == {"q": 1, "a": 1}
        assert seen == [{"q": 1}, {"q": 1}]
        loaded = ops.load("r")
        assert loaded is not None and loaded.input == {"q": 1} and loaded.status == "done"

    def test_different_input_is_refused_and_runs_nothing(self, ops: Ops) -> None:
        """Resuming with another input raises InputMismatch naming the difference; no step runs."""
        log: list[str] = []

        def boom(state: dict[str, Any]) -> None:
            raise RuntimeError("stop")

        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1), Step("b", boom)], input={"q": 1, "k": [1, 2]})
        before = ops.load("r")
        assert before is not None
        with pytest.raises(InputMismatch) as info:
            ops.run("r", [ops.add("a", 1, log), ops.add("b", 2, log)], input={"q": 1, "k": [1, 3]})
        assert info.value.run_id == "r"
        assert "k" in info.value.path and "k" in str(info.value)
        assert log == []
        after = ops.load("r")
        assert after is not None and (after.version, after.input) == (before.version, before.input)

    def test_same_input_again_is_a_no_op(self, ops: Ops) -> None:
        """Passing the recorded input again resumes normally, and a finished run runs nothing."""
        log: list[str] = []
        calls: list[int] = []

        def once(state: dict[str, Any]) -> dict[str, Any]:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("not yet")
            return {"b": 2}

        given = {"q": [1, 2]}
        with pytest.raises(StepFailed):
            ops.run("r", [ops.add("a", 1, log), Step("b", once)], input=given)
        final = ops.run("r", [ops.add("a", 1, log), Step("b", once)], input={"q": [1, 2]})
        assert final == {"q": [1, 2], "a": 1, "b": 2}
        assert ops.run("r", [ops.add("a", 1, log), Step("b", once)], input=given) == final
        assert log == ["a"] and len(calls) == 2

    # -- real crashes ----------------------------------------------------------------

    def _child(self, ops: Ops, store_config: str, tmp_path: Path, run_id: str, **spec: Any) -> Any:
        spec = {
            "config": store_config,
            "run_id": run_id,
            "mode": ops.mode,
            "steps": spec.pop("steps", ["a", "b", "c"]),
            "effects": str(tmp_path / f"effects-{abs(hash(run_id))}.log"),
            **spec,
        }
        return _barrier.run_child(
            [sys.executable, "-m", "stepstone.testing._child", json.dumps(spec)],
            f"_child {run_id!r} ({ops.mode}, kill={spec.get('kill')})",
            env=child_env(),
        )

    @staticmethod
    def _effects(tmp_path: Path, run_id: str) -> list[str]:
        path = tmp_path / f"effects-{abs(hash(run_id))}.log"
        if not path.exists():
            return []
        return [line.split()[0] for line in path.read_text().splitlines()]

    @pytest.mark.crash
    @pytest.mark.parametrize("how", ["exit", "sigkill"])
    def test_crash_inside_step_resumes(
        self, ops: Ops, store_config: str, tmp_path: Path, how: str
    ) -> None:
        """A process killed inside step b resumes in a fresh process running only b and c."""
        self.need_durable(ops.store)
        kill = {"how": how, "step": "b", "at": "inside"}
        died = self._child(ops, store_config, tmp_path, "crash", kill=kill)
        assert died.returncode == (3 if how == "exit" else -9), died.stderr
        assert self._effects(tmp_path, "crash") == ["a", "b"]
        resumed = self._child(ops, store_config, tmp_path, "crash")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout) == {"a": 1, "b": 2, "c": 3, "last": "c"}
        assert self._effects(tmp_path, "crash") == ["a", "b", "b", "c"]

    @pytest.mark.crash
    def test_crash_after_step_before_save_reruns_it_once(
        self, ops: Ops, store_config: str, tmp_path: Path
    ) -> None:
        """Killed after b returned but before its checkpoint: b runs again, once."""
        self.need_durable(ops.store)
        kill = {"how": "sigkill", "step": "b", "at": "runner.after_step"}
        died = self._child(ops, store_config, tmp_path, "after", kill=kill)
        assert died.returncode == -9, died.stderr
        loaded = ops.load("after")
        assert loaded is not None and loaded.step == 0 and loaded.state == {"a": 1, "last": "a"}
        resumed = self._child(ops, store_config, tmp_path, "after")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout) == {"a": 1, "b": 2, "c": 3, "last": "c"}
        assert self._effects(tmp_path, "after") == ["a", "b", "b", "c"]

    @pytest.mark.crash
    def test_crash_inside_save_keeps_a_whole_checkpoint(
        self, ops: Ops, store_config: str, tmp_path: Path
    ) -> None:
        """Killed at each kill point inside b's save: the next load is the old or new checkpoint."""
        self.need_durable(ops.store)
        points = self.kill_points(ops.store)
        if not points:
            pytest.skip(f"{type(ops.store).__name__} declares no kill points inside a save")
        for point, new_visible in points.items():
            run_id = f"save-{point}"
            kill = {"how": "sigkill", "step": "b", "at": point}
            died = self._child(ops, store_config, tmp_path, run_id, kill=kill)
            assert died.returncode == -9, (point, died.stdout, died.stderr)
            loaded = ops.load(run_id)
            assert loaded is not None, point
            if new_visible:
                assert (loaded.step, loaded.state) == (1, {"a": 1, "b": 2, "last": "b"}), point
            else:
                assert (loaded.step, loaded.state) == (0, {"a": 1, "last": "a"}), point
            resumed = self._child(ops, store_config, tmp_path, run_id)
            assert resumed.returncode == 0, (point, resumed.stderr)
            assert json.loads(resumed.stdout) == {"a": 1, "b": 2, "c": 3, "last": "c"}
            expected_b = 1 if new_visible else 2
            assert self._effects(tmp_path, run_id).count("b") == expected_b, point

    @pytest.mark.crash
    def test_attempt_count_survives_a_crash(
        self, ops: Ops, store_config: str, tmp_path: Path
    ) -> None:
        """A process killed between attempts resumes with the attempt count it had."""
        self.need_durable(ops.store)
        # b fails on attempt 1, and the process dies during the backoff before attempt 2.
        kill = {"how": "sigkill", "step": "b", "at": "runner.backoff"}
        spec: dict[str, Any] = {"fail": {"b": 1}, "retry": {"b": 3}}
        died = self._child(ops, store_config, tmp_path, "retry", kill=kill, **spec)
        assert died.returncode == -9, died.stderr
        loaded = ops.load("retry")
        assert loaded is not None and loaded.attempt == 1 and loaded.failure is not None
        resumed = self._child(ops, store_config, tmp_path, "retry", **spec)
        assert resumed.returncode == 0, resumed.stderr
        path = tmp_path / f"effects-{abs(hash('retry'))}.log"
        assert path.read_text().splitlines() == ["a 1", "b 1", "b 2", "c 1"]

    @pytest.mark.crash
    def test_crash_loop_stops_at_max_attempts(
        self, ops: Ops, store_config: str, tmp_path: Path
    ) -> None:
        """A step that kills its process every time stops after max_attempts, not forever."""
        self.need_durable(ops.store)
        kill = {"how": "sigkill", "step": "b", "at": "inside"}
        for _ in range(2):
            died = self._child(ops, store_config, tmp_path, "loop", kill=kill, retry={"b": 2})
            assert died.returncode == -9, died.stderr
        final = self._child(ops, store_config, tmp_path, "loop", kill=kill, retry={"b": 2})
        assert final.returncode == 1, final.stderr
        assert json.loads(final.stdout) == {"failed": "b", "attempt": 2}
        assert self._effects(tmp_path, "loop") == ["a", "b", "b"]
