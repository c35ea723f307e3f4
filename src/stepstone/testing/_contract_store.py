"""``StoreMethodsContract``: load, save, delete, list and claim on one backend.

Round trips of every field, compare-and-swap on create, update and delete, listing and
the claim index, run ids and states the contract refuses, the context manager and the
request count; each test runs in both forms (``ops``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from .. import _codec
from .._checkpoint import DUE_NOW, PRIORITY_AGING, Checkpoint, Failure, Signal, utcnow
from .._errors import ConflictError, InvalidRunId, InvalidState
from .._store import RunInfo, Store
from ._base import ContractBase, cp
from ._cases import AWKWARD_RUN_IDS, BAD_RUN_IDS, BAD_STATES, T0, runtime_checkpoints
from ._ops import Ops

__all__ = ["StoreMethodsContract"]


class StoreMethodsContract(ContractBase):
    """The Store methods themselves; mixed into ``StoreContract``."""

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
        originals = runtime_checkpoints(T0)
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

    def test_save_many_keeps_each_outcome(self, ops: Ops) -> None:
        """``save_many``: each save as ``save`` would, in order; one failing fails no other."""
        taken = ops.save(cp("taken", 0, {"first": True}))
        moved = ops.save(cp("moved", 0, {"v": 1}))
        long_text = "x" * 300_000  # past the inline limit: kept in pieces where a store can
        outcomes = ops.save_many(
            [
                cp("new", 0, {"n": 1}),
                cp("taken", 0, {"second": True}),  # a create over an existing run
                cp("moved", 1, {"v": 2}, version=moved.version),
                cp("long", 0, {"text": long_text}),
                cp("bad", 0, {"not json": {1, 2}}),
            ]
        )
        assert [type(o).__name__ for o in outcomes] == [
            "Checkpoint",
            "ConflictError",
            "Checkpoint",
            "Checkpoint",
            "InvalidState",
        ], outcomes
        for outcome, run_id in zip(outcomes, ("new", "taken", "moved", "long", "bad"), strict=True):
            loaded = ops.load(run_id)
            if isinstance(outcome, Checkpoint):
                assert loaded is not None and loaded.version == outcome.version, run_id
                assert loaded.state == outcome.state, run_id
        assert ops.load("taken") == taken, "a lost create changed the stored run"
        updated = ops.load("moved")
        assert updated is not None and updated.state == {"v": 2} and updated.step == 1
        again = ops.load("long")
        assert again is not None and again.state == {"text": long_text}
        assert ops.load("bad") is None
        assert ops.save_many([]) == []

    def test_save_many_lost_swap_writes_none_of_its_pieces(self, ops: Ops) -> None:
        """A lost create in ``save_many`` fails alone: the run keeps its record and its
        pieces (none of the loser's), and the call's other save lands whole."""
        held = ops.save(cp("held", 0, {"text": "a" * 300_000}))
        keys = ops.store.piece_keys("held") if ops.store.holds_pieces else []
        outcomes = ops.save_many(
            [cp("held", 0, {"text": "b" * 300_000}), cp("fresh", 0, {"text": "c" * 300_000})]
        )
        assert isinstance(outcomes[0], ConflictError), outcomes
        assert isinstance(outcomes[1], Checkpoint), outcomes
        if ops.store.holds_pieces:
            assert ops.store.piece_keys("held") == keys, "the lost save's pieces were kept"
        assert ops.load("held") == held
        fresh = ops.load("fresh")
        assert fresh is not None and fresh.state == {"text": "c" * 300_000}

    def test_save_many_refuses_what_it_cannot_save(self, ops: Ops) -> None:
        """Not a list of Checkpoint, or two of one run: a clear error, nothing saved."""
        with pytest.raises(TypeError, match=r"item 1 is a str, not a stepstone\.Checkpoint"):
            ops.save_many([cp("ok", 0), "not a checkpoint"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match=r"takes a list of stepstone\.Checkpoint"):
            ops.save_many(cp("ok", 0))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="run 'twice' appears twice"):
            ops.save_many([cp("twice", 0), cp("other", 0), cp("twice", 1)])
        assert [ops.load(r) for r in ("ok", "twice", "other")] == [None, None, None]

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
        saved = {c.run_id: ops.save(c) for c in runtime_checkpoints(T0)}
        saved["done"] = ops.save(cp("done", 1, total_steps=2, owner="gone"))
        info = {i.run_id: i for i in ops.list_info()}
        assert set(info) == set(saved)
        told = ("status", "step", "total_steps", "version", "owner", "due_at")
        for run_id in saved:
            _tells(info[run_id], ops.load(run_id), told)
        assert info["owned"].due_at == T0 + timedelta(seconds=30.5)
        # Queued runs are due at once, by any clock: in the year after DUE_NOW.
        queued_due = info["queued"].due_at
        assert queued_due is not None and DUE_NOW < queued_due < DUE_NOW + timedelta(days=365)
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
            _tells(info, ops.load(run_id), ("status", "version", "owner", "due_at"))
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

    def test_claimable_takes_queued_runs_by_priority_then_age(self, ops: Ops) -> None:
        """Queued runs come highest priority first, then longest queued (keys or none).

        A level of priority is worth ``PRIORITY_AGING`` seconds queued, so a run queued
        long enough goes before higher ones queued after it: none starves.
        """
        now = utcnow()
        level = PRIORITY_AGING
        runs = {  # run_id: (priority, seconds queued)
            "new-low": (0, 0.0),
            "low": (0, 10.0),
            "new-high": (2, 0.0),
            "mid": (1, 30.0),
            "old-low": (0, 2 * level + 30.0),
            "oldest-negative": (-1, 5 * level),
        }
        for run_id, (priority, queued) in runs.items():
            flow: dict[str, Any] = {"keys": [], "limits": {}, "priority": priority}
            made = now - timedelta(seconds=queued)
            ops.save(
                Checkpoint(run_id=run_id, total_steps=1, queued=True, created_at=made, flow=flow)
            )
        order = [i.run_id for i in ops.claimable(now, limit=10) if i.status == "queued"]
        # By queued time less priority * PRIORITY_AGING: -240, -150, -120, -90, -10, 0 s.
        assert order == ["oldest-negative", "old-low", "new-high", "mid", "low", "new-low"]

    def test_claimable_pages_each_kind(self, ops: Ops) -> None:
        """claimable(status=, skip=) pages through one kind in due_at order, all of it.

        A worker pages past runs it cannot serve and through every running run, so no
        run stays behind a page of others. A waiting run holding an unconsumed signal
        it waits for, or held by an owner, is due now whatever its ``wake_at``.
        """
        if not ops.store.claims_by_kind:
            pytest.skip(
                "claims_by_kind is False (claimable(now, limit) predates paging): workers "
                "page by asking for longer lists; add the keyword-only status= and skip= "
                "and declare claims_by_kind = True for an indexed page"
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


def _tells(info: RunInfo, stored: Checkpoint | None, fields: tuple[str, ...]) -> None:
    """Assert that ``info`` tells each of ``fields`` as the stored run ``stored`` has it."""
    assert stored is not None, info.run_id
    told = {name: getattr(info, name) for name in fields}
    assert told == {name: getattr(stored, name) for name in fields}, info.run_id
