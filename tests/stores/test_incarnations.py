"""Pieces tied to one incarnation of a run (issue 29, items 1, 2 and 4).

- a delete between a first save's pieces and its document leaves the save whole;
- a delete and a new first save of the same id between a save's document and its
  collection leave the new run whole;
- two processes, one deleting ids in a loop, one making first long saves of them:
  every run that is there at the end loads;
- a writer killed between a first save's pieces and its document leaves orphans (on the
  SQL stores, which write them in the save's transaction, as an earlier release did), which
  ``collect_orphans`` deletes once older than its minimum age, and not before, and
  which the next base of the same id collects once old; ``collect_orphans(0)`` takes
  one made in the current second (ages by the clock seam, ``FakeClock``);
- a run written by the previous release (keys without an incarnation) still loads,
  saves, collects and deletes.

Backends as in ``tests/stores/test_long_states.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import DURABLE_BACKENDS, fresh_config
from pieces_support import keys_in, load_in, next_save, pieces_named, ref_of, save_in
from stepstone import ConflictError, CorruptCheckpoint, Store, open_store
from stepstone import _statelog as sl
from stepstone._checkpoint import Checkpoint
from stepstone.testing import FakeClock, kill_point
from stepstone.testing._base import child_env

#: Where a save and a delete can interleave (file and memory lock the run instead).
RACING = tuple(kind for kind in DURABLE_BACKENDS if kind != "file")
DURABLE = DURABLE_BACKENDS
MODES = ("sync", "async")
State = dict[str, Any]

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(params=RACING)
def racing_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend whose saves and deletes interleave."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture(params=DURABLE)
def durable_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend another process can open."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``sync``: save/load/delete; ``async``: their ``a`` twins."""
    return str(request.param)


def _state(tag: str, size: int = 12_000) -> State:
    """A state past ``INLINE_MAX``: kept in pieces."""
    return {"tag": tag, "text": "x" * size}


def _delete(store: Store, run_id: str, mode: str) -> bool:
    if mode == "async":
        return asyncio.run(store.adelete(run_id))
    return store.delete(run_id)


@pytest.fixture
def two(racing_config: str) -> Iterator[tuple[Store, Store]]:
    """Two store objects on one store: a saver and another client."""
    with open_store(racing_config) as a, open_store(racing_config) as b:
        yield a, b


def test_a_delete_between_a_first_saves_pieces_and_document_keeps_the_save(
    two: tuple[Store, Store], mode: str
) -> None:
    """A delete that finds no document deletes no pieces: the first save it raced loads."""
    saver, other = two
    run_id = f"first-{mode}"
    deleted: list[bool] = []

    def act(point: str) -> None:
        if not deleted:
            deleted.append(other.delete(run_id))

    with kill_point("pieces.written", act):
        saved = save_in(saver, Checkpoint(run_id, state=_state("a")), mode)
    assert deleted == [False]
    assert load_in(other, run_id, mode).state == saved.state == _state("a")


def test_a_restart_between_a_saves_document_and_collection_keeps_the_new_run(
    two: tuple[Store, Store], mode: str
) -> None:
    """A run deleted and started again before a new base's collection keeps its pieces."""
    saver, other = two
    run_id = f"restart-{mode}"
    first = save_in(saver, Checkpoint(run_id, state=_state("old")), mode)
    restarted: list[bool] = []

    def act(point: str) -> None:
        if not restarted:  # once: the new run's own save fires this point too
            restarted.append(other.delete(run_id))
            other.save(Checkpoint(run_id, state=_state("new", 20_000)))

    with kill_point("pieces.collect", act):
        save_in(saver, next_save(first, _state("old2", 60_000)), mode)
    assert restarted == [True]
    loaded = load_in(other, run_id, mode)
    assert loaded.state == _state("new", 20_000)
    assert keys_in(other, run_id, mode) == pieces_named(loaded)
    # The new run goes on: a delete then removes exactly its pieces.
    assert _delete(other, run_id, mode)
    assert keys_in(other, run_id, mode) == []


def test_a_delete_with_an_expected_version_removes_its_incarnations_pieces(
    two: tuple[Store, Store], mode: str
) -> None:
    """``delete(expected_version=...)`` deletes the document and its pieces; a stale
    version is a conflict that deletes nothing."""
    saver, other = two
    run_id = f"expected-{mode}"
    first = save_in(saver, Checkpoint(run_id, state=_state("a")), mode)
    second = save_in(saver, next_save(first, _state("b", 60_000)), mode)
    with pytest.raises(ConflictError):
        other.delete(run_id, expected_version=first.version)
    assert load_in(other, run_id, mode).state == second.state
    assert other.delete(run_id, expected_version=second.version)
    assert keys_in(other, run_id, mode) == []


# -- two processes -------------------------------------------------------------------------

_DELETER = textwrap.dedent(
    """
    import os, sys
    from stepstone import open_store

    config, stop, ids = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("ready", flush=True)
    with open_store(config) as store:
        n = 0
        while not os.path.exists(stop):
            store.delete(f"race-{n % ids}")
            n += 1
    print(n, flush=True)
    """
)
RACE_IDS = 3
RACE_SAVES = 200


@pytest.mark.crash
def test_two_processes_deleting_and_first_saving_the_same_ids_lose_no_save(
    durable_config: str, tmp_path: Path
) -> None:
    """One process deletes ids in a loop while this one makes first long saves of them
    and a new base each: every run there at the end loads (the file store's locks
    included)."""
    racing_config = durable_config
    stop = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, "-c", _DELETER, racing_config, str(stop), str(RACE_IDS)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acknowledged = 0
    lost: list[str] = []

    def check(store: Store, run_id: str, what: str) -> None:
        # Gone (deleted since) is fine; there but unreadable is a lost save.
        try:
            store.load(run_id)
        except CorruptCheckpoint as exc:
            lost.append(f"{what}: {exc}")

    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready", "the deleting process never started"
        with open_store(racing_config) as store:
            for n in range(RACE_SAVES):
                run_id = f"race-{n % RACE_IDS}"
                try:
                    cp = store.save(Checkpoint(run_id, state=_state(f"{n}")))
                    acknowledged += 1
                    check(store, run_id, f"first save {n}")
                    store.save(next_save(cp, _state(f"{n}b", 60_000)))
                    check(store, run_id, f"new base {n}")
                except ConflictError:
                    continue  # still there, or deleted under the second save
            for k in range(RACE_IDS):
                check(store, f"race-{k}", "at the end")
    finally:
        stop.touch()
        out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    assert acknowledged, "no first save was acknowledged"
    assert not lost, f"{len(lost)} of {acknowledged} acknowledged saves lost: {lost[:3]}"


# -- orphans -------------------------------------------------------------------------------

_KILLED = textwrap.dedent(
    """
    import os, sys, time
    from stepstone import open_store, _statelog as sl
    from stepstone._checkpoint import Checkpoint
    from stepstone.testing import kill_point

    config, run_id, age = sys.argv[1], sys.argv[2], float(sys.argv[3])
    made = sl.new_inc
    sl.new_inc = lambda now=None: made(time.time() - age)  # an incarnation made long ago

    def die(point):
        os._exit(9)

    cp = Checkpoint(run_id, state={"text": "k" * 300_000})
    with open_store(config) as store:
        if getattr(type(store), "_pieces_in_commit", False):
            # Its pieces go in the save's own transaction, so a kill leaves none: leave
            # what a writer of an earlier release, killed between them and its
            # document, left behind.
            prepared = sl.prepare_save(store, cp, piece_max=store._piece_max)
            store.put_pieces(run_id, prepared.pieces)
            os._exit(9)
        with kill_point("pieces.written", die):
            store.save(cp)
    """
)


def _kill_a_first_save(config: str, run_id: str, age: float) -> None:
    """A process makes a first long save of ``run_id`` and dies after its pieces."""
    child = subprocess.run(
        [sys.executable, "-c", _KILLED, config, run_id, str(age)],
        env=child_env(),
        timeout=300,
        check=False,
        capture_output=True,
        text=True,
    )
    assert child.returncode == 9, child.stderr[-3000:]


def _collect(store: Store, min_age: float, mode: str) -> list[sl.Orphan]:
    if mode == "async":
        return asyncio.run(store.acollect_orphans(min_age))
    return store.collect_orphans(min_age)


@pytest.mark.crash
def test_orphans_of_a_killed_first_save_are_collected_once_old_enough(
    durable_config: str, mode: str
) -> None:
    """Pieces of a first save killed before its document: kept while younger than the
    minimum age, collected by ``collect_orphans`` once older; a live run is untouched."""
    _kill_a_first_save(durable_config, "orphaned", 2 * 3600)
    with open_store(durable_config) as store:
        live = store.save(Checkpoint("live", state=_state("live")))
        left = keys_in(store, "orphaned", mode)
        assert left, "the killed save left no pieces"
        assert store.load("orphaned") is None
        assert _collect(store, 3 * 3600, mode) == []
        assert keys_in(store, "orphaned", mode) == left
        collected = _collect(store, 3600, mode)
        assert sorted(o.key for o in collected) == left
        assert sum(o.size for o in collected) >= 300_000
        assert keys_in(store, "orphaned", mode) == []
        assert load_in(store, "live", mode).state == live.state


@pytest.mark.crash
def test_a_new_base_collects_old_orphans_of_its_id_only(durable_config: str) -> None:
    """A killed first save's old orphans go at the next base under that id; young ones
    (a save that may be in flight) stay."""
    _kill_a_first_save(durable_config, "again", 2 * sl.ORPHAN_AGE)
    with open_store(durable_config) as store:
        old = store.piece_keys("again")
        cp = store.save(Checkpoint("again", state=_state("a")))
        assert not set(old) & set(store.piece_keys("again"))
        assert store.piece_keys("again") == pieces_named(cp)
    _kill_a_first_save(durable_config, "young", 0)
    with open_store(durable_config) as store:
        young = store.piece_keys("young")
        assert young
        assert store.collect_orphans() == []
        assert store.piece_keys("young") == young


# -- the previous release's runs ---------------------------------------------------------


def test_a_run_with_legacy_keys_loads_saves_and_deletes(
    racing_config: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run saved as the previous release did (no incarnation) loads, saves deltas and
    new bases under legacy keys, collects them, and is deleted with its pieces."""
    with open_store(racing_config) as store:
        with monkeypatch.context() as patch:
            patch.setattr(sl, "_inc_for", lambda cp, handle: None)
            legacy = save_in(store, Checkpoint("legacy", state=_state("a")), mode)
        assert all(":" not in key for key in keys_in(store, "legacy", mode))
        assert "inc" not in ref_of(legacy)
        loaded = load_in(store, "legacy", mode)
        assert loaded.state == _state("a")
        loaded.state["more"] = [1, 2, 3]
        delta = save_in(store, next_save(loaded), mode)
        rebased = save_in(store, next_save(delta, _state("b", 60_000)), mode)
        assert "inc" not in ref_of(rebased)
        assert keys_in(store, "legacy", mode) == pieces_named(rebased)
        assert load_in(store, "legacy", mode).state == _state("b", 60_000)
        assert _delete(store, "legacy", mode)
        assert keys_in(store, "legacy", mode) == []


def test_an_incarnation_is_made_once_per_document_lineage() -> None:
    """A first save starts an incarnation; every later save of the lineage keeps it,
    and its age is readable from it."""
    from stepstone.stores.memory import MemoryStore

    store = MemoryStore()
    first = store.save(Checkpoint("lineage", state=_state("a")))
    inc = ref_of(first)["inc"]
    assert len(inc) == sl.INC_LEN and abs(int(inc[:8], 16) - time.time()) < 3600
    later = store.save(next_save(first, {"small": 1}))
    assert store.save(next_save(later, _state("c", 50_000)))
    assert {sl.inc_of(key) for key in store.piece_keys("lineage")} == {inc}
    assert sl.gen_of(f"{inc}:12.abc.0") == 12 and sl.gen_of("7.abc.b0") == 7
    assert sl.inc_of("7.abc.b0") is None


@pytest.mark.crash
@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_doctor_fix_collects_old_orphans_and_says_what(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``stepstone doctor --fix`` deletes orphans older than ``--min-age`` and prints the
    run, pieces and bytes; younger ones stay and nothing is printed for them."""
    from cli_support import cli

    config = fresh_config(kind, request, tmp_path)
    _kill_a_first_save(config, "orphaned", 2 * 3600)
    young = cli("doctor", "--fix", "--min-age", str(3 * 3600), "--store", config)
    assert young.returncode == 0, young.stderr
    assert "collected run" not in young.stdout
    with open_store(config) as store:
        assert store.piece_keys("orphaned")
    fixed = cli("doctor", "--fix", "--min-age", "3600", "--store", config)
    assert fixed.returncode == 0, fixed.stderr
    assert "collected run orphaned: 1 pieces, " in fixed.stdout, fixed.stdout
    with open_store(config) as store:
        assert store.piece_keys("orphaned") == []


@pytest.mark.crash
def test_prune_sweeps_orphans_older_than_a_day(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``stepstone runs prune`` also collects orphaned pieces older than a day (and says
    how many); a younger orphan and a live run's pieces stay."""
    from cli_support import cli

    config = fresh_config("sqlite", request, tmp_path)
    _kill_a_first_save(config, "old-orphan", 25 * 3600)
    _kill_a_first_save(config, "young-orphan", 2 * 3600)
    with open_store(config) as store:
        store.save(Checkpoint("live", state=_state("live")))
        young, live = store.piece_keys("young-orphan"), store.piece_keys("live")
        assert store.piece_keys("old-orphan") and young and live
    pruned = cli("runs", "prune", "--older-than", "30d", "--store", config)
    assert pruned.returncode == 0, pruned.stderr
    assert "orphaned piece(s) of long states older than a day" in pruned.stdout, pruned.stdout
    with open_store(config) as store:
        assert store.piece_keys("old-orphan") == []
        assert store.piece_keys("young-orphan") == young
        assert store.piece_keys("live") == live


def test_a_save_without_a_handle_starts_an_incarnation_and_loses_nothing(
    racing_config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save built by hand (an expected version, no handle) writes under a new
    incarnation; the older one's pieces are left to orphan collection, and it loads."""
    made = sl.new_inc
    with open_store(racing_config) as store:
        with monkeypatch.context() as patch:
            patch.setattr(sl, "new_inc", lambda now=None: made(time.time() - 2 * 3600))
            first = store.save(Checkpoint("by-hand", state=_state("a")))
        old = set(store.piece_keys("by-hand"))
        by_hand = Checkpoint("by-hand", state=_state("b", 30_000), version=first.version)
        second = store.save(by_hand)
        assert ref_of(second)["inc"] != ref_of(first)["inc"]
        assert old <= set(store.piece_keys("by-hand")), "young pieces of the old one went"
        assert store.load("by-hand") == second
        assert store.delete("by-hand")
        assert set(store.piece_keys("by-hand")) == old
        assert [o.key for o in store.collect_orphans(3600)] == sorted(old)


def test_collect_orphans_of_age_zero_takes_an_incarnation_of_this_second(
    durable_config: str,
) -> None:
    """An orphan made in the current second is at least 0 seconds old: ``collect_orphans(0)``
    takes it; one of age 60 waits until the clock has moved 60 seconds."""
    # Three quarters into a second: an incarnation's age is counted from the second it
    # names, so the fraction does not keep it another second.
    start = datetime(2031, 5, 6, 7, 8, 9, 750_000, tzinfo=UTC)
    with FakeClock(start) as clock, open_store(durable_config) as store:
        now = sl.new_inc()
        assert int(now[:8], 16) == int(start.timestamp())
        store.put_pieces("gone-now", [sl.Piece(f"{now}:0.abc.0", 0, b"now")])
        later = sl.new_inc()
        store.put_pieces("gone-later", [sl.Piece(f"{later}:0.abc.0", 0, b"later")])
        assert store.collect_orphans(60) == []
        collected = store.collect_orphans(0)
        # (A store may name the run by its key rather than its id, and count the bytes
        # it stores rather than the piece's.)
        assert sorted(o.key for o in collected) == sorted([f"{later}:0.abc.0", f"{now}:0.abc.0"])
        assert all(o.size >= 3 for o in collected)
        soon = f"{sl.new_inc()}:0.abc.0"
        store.put_pieces("old-soon", [sl.Piece(soon, 0, b"x")])
        clock.advance(59)
        assert store.collect_orphans(60) == []
        clock.advance(1)
        assert [o.key for o in store.collect_orphans(60)] == [soon]
        assert store.piece_keys("gone-now") == store.piece_keys("old-soon") == []


def test_a_delete_removes_its_incarnations_pieces_and_no_others(durable_config: str) -> None:
    """``delete`` removes the deleted document's incarnation's pieces; a young orphan of
    another incarnation under the same id stays, for ``collect_orphans``."""
    with open_store(durable_config) as store:
        stray = f"{sl.new_inc()}:0.abc.0"
        store.put_pieces("mixed", [sl.Piece(stray, 0, b"stray")])
        cp = store.save(Checkpoint("mixed", state=_state("a")))
        assert sorted(store.piece_keys("mixed")) == sorted([*pieces_named(cp), stray])
        assert store.delete("mixed")
        assert store.piece_keys("mixed") == [stray]
        assert [o.key for o in store.collect_orphans(0)] == [stray]
        assert store.piece_keys("mixed") == []
