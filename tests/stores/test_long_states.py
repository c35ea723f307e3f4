"""Long states kept in pieces (``stepstone._statelog``), on every backend, sync and async.

- a 64 MiB state is saved and loaded back equal;
- a 300-step appending run loads equal to what ``run`` returned, and only the pieces
  its document names are kept (old bases and logs are collected);
- a log of more than ``LOG_MAX`` pieces (a large base allows it) loads whole;
- two writers race one run: the loser's pieces are gone, the winner's state loads;
- deleting a run deletes its pieces;
- a reader never sees a half state while a writer keeps writing new bases;
- a process killed at ``pieces.written`` / ``pieces.collect`` leaves the old / new
  state whole, the run resumes to the right end, and a later base collects the orphans.

Backends as in ``tests/engine/test_upgrades.py`` (``tests/stores/test_contract.py``'s configs): a
missing server is a loud skip locally and a failure under CI.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import stepstone
from child_process import TESTS
from fresh_stores import BACKENDS, DURABLE_BACKENDS, fresh_config
from pieces_support import keys_in, load_in, next_save, pieces_named, ref_of, save_in
from stepstone import ConflictError, Step, Store, open_store
from stepstone import _statelog as sl
from stepstone._checkpoint import Checkpoint, Stored
from stepstone._codec import dump_json

SRC = str(Path(stepstone.__file__).resolve().parents[1])
#: A child imports this module, and through it the helper modules of the tests.
CHILD_PATH = os.pathsep.join([SRC, TESTS, str(Path(__file__).resolve().parent)])
# Every built-in backend holds pieces (Cosmos DB as piece items beside the run's item).
DURABLE = DURABLE_BACKENDS
MODES = ("sync", "async")
State = dict[str, Any]

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(params=BACKENDS)
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture(params=DURABLE)
def durable_config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend another process can open."""
    return fresh_config(str(request.param), request, tmp_path)


@pytest.fixture
def store(store_config: str) -> Iterator[Store]:
    """The store under test."""
    with open_store(store_config) as opened:
        if not type(opened).holds_pieces:
            pytest.fail(f"{type(opened).__name__}.holds_pieces is False: no long states")
        yield opened


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``sync``: save/load/run; ``async``: asave/aload/arun."""
    return str(request.param)


def _rebased(cp: Checkpoint) -> Checkpoint:
    """``cp`` with a handle that forces a whole save (a new base) of the same generation."""
    handle = cp.stored_state
    assert isinstance(handle, Stored)
    return replace(cp, stored_state=replace(handle, private=None))


def _long(n: int, size: int = 300) -> State:
    return {"items": [{"n": i, "text": "t" * size} for i in range(n)], "meta": {"k": 1}}


# -- size ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_64_mib_state_is_saved_and_loaded(store: Store, mode: str) -> None:
    """One 40 MiB string and 24k small dicts: saved in pieces, loaded back equal."""
    big: State = {
        "blob": "é" * (20 << 20),  # 40 MiB of UTF-8
        "rows": [{"i": i, "name": f"row-{i}", "v": [i, i * 2, "x" * 900]} for i in range(24_000)],
    }
    run_id = f"big-{mode}"
    saved = save_in(store, Checkpoint(run_id, state=big), mode)
    ref = ref_of(saved)
    assert ref["base_bytes"] > 60 << 20
    assert len(ref["base"]) > 1  # cut into pieces
    loaded = load_in(store, run_id, mode)
    assert loaded.state == big
    assert keys_in(store, run_id, mode) == pieces_named(loaded)


# -- a long appending run ------------------------------------------------------------------


def _append(state: State) -> State:
    items = state.setdefault("items", [])
    items.append({"n": len(items), "text": "a" * 2000})
    return state


async def _aappend(state: State) -> State:
    return _append(state)


@pytest.mark.slow
def test_an_appending_run_loads_its_final_state_and_keeps_only_named_pieces(
    store: Store, mode: str
) -> None:
    """300 steps of 2 KB each: load equals run()'s result; old bases and logs collected."""
    run_id = f"append-{mode}"
    if mode == "async":
        steps = [Step(f"s{i}", _aappend) for i in range(300)]
        final = asyncio.run(stepstone.arun(run_id, steps, store))
    else:
        steps = [Step(f"s{i}", _append) for i in range(300)]
        final = stepstone.run(run_id, steps, store)
    assert len(final["items"]) == 300
    cp = load_in(store, run_id, mode)
    assert cp.state == final
    keys = keys_in(store, run_id, mode)
    assert keys == pieces_named(cp), "pieces left that the document does not name"
    held = sum(map(len, store.pieces(run_id, keys).values()))
    assert held <= (sl.LOG_FACTOR + 1) * len(dump_json(final).encode()) + sl.INLINE_MAX


@pytest.mark.slow  # 300 durable saves: over a second on the file store, more under load
def test_a_log_longer_than_log_max_is_loaded_whole(store: Store, mode: str) -> None:
    """A base of 160 KiB allows 320 log pieces: a load fetches 300 of them, in order.

    The piece count scales with the base (``log_limit``, issue 36); this is the load's
    part on each backend: more keys than one ``IN`` list or one query held before.
    """
    run_id = f"loglong-{mode}"
    state = _long(1)
    state["pad"] = "p" * (160 << 10)
    cp = save_in(store, Checkpoint(run_id, state=state), mode)
    assert sl.log_limit(ref_of(cp)["base_bytes"]) > 300 > sl.LOG_MAX
    for n in range(300):
        cp.state["meta"]["k"] = n  # a tiny change: bytes never decide
        cp = save_in(store, next_save(cp), mode)
    assert ref_of(cp)["log_count"] == 300
    loaded = load_in(store, run_id, mode)
    assert loaded.state == cp.state and loaded.state["meta"]["k"] == 299
    assert keys_in(store, run_id, mode) == pieces_named(loaded)


# -- races, delete, readers ----------------------------------------------------------------


def test_the_loser_of_a_race_leaves_no_pieces(store_config: str, mode: str) -> None:
    """Two store objects save the same version: one conflicts, its pieces are deleted."""
    with open_store(store_config) as a, open_store(store_config) as b:
        run_id = f"race-{mode}"
        save_in(a, Checkpoint(run_id, state=_long(60)), mode)
        left, right = load_in(a, run_id, mode), load_in(b, run_id, mode)
        left.state["items"].append({"from": "a", "text": "l" * 3000})
        right.state["items"].append({"from": "b", "text": "r" * 3000})
        winner = save_in(a, next_save(left), mode)
        with pytest.raises(ConflictError):
            save_in(b, next_save(right), mode)
        # A whole save racing too: the loser's new base is deleted as well.
        whole = next_save(_rebased(right), _long(70, 400))
        with pytest.raises(ConflictError):
            save_in(b, whole, mode)
        assert keys_in(a, run_id, mode) == pieces_named(winner)
        loaded = load_in(b, run_id, mode)
        assert loaded.state == winner.state
        assert loaded.state["items"][-1]["from"] == "a"


def test_delete_removes_every_piece(store: Store, mode: str) -> None:
    """Deleting a run with a base and a log leaves no piece behind."""
    run_id = f"delete-{mode}"
    cp = save_in(store, Checkpoint(run_id, state=_long(60)), mode)
    cp.state["items"].append({"more": 1})
    save_in(store, next_save(cp), mode)
    assert keys_in(store, run_id, mode)
    if mode == "async":
        assert asyncio.run(store.adelete(run_id))
    else:
        assert store.delete(run_id)
    assert keys_in(store, run_id, mode) == []


def test_put_pieces_racing_copies_both_succeed_and_keep_the_first(
    store_config: str, mode: str
) -> None:
    """Two store objects putting the same pieces at once (a migration run twice) both
    succeed; a key already stored keeps its bytes."""
    pieces = [sl.Piece(f"1.race.b{n}", 1, f"piece {n}".encode() * 50) for n in range(12)]
    with open_store(store_config) as a, open_store(store_config) as b:
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def put(store: Store) -> None:
            try:
                barrier.wait(30)
                if mode == "async":
                    asyncio.run(store.aput_pieces("race", pieces))
                else:
                    store.put_pieces("race", pieces)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=put, args=(s,)) for s in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive(), "put_pieces hung"
        assert errors == []
        # (Two memory:// objects are two stores: each holds what it was given.)
        for store in (a, b):
            store.put_pieces("race", [sl.Piece("1.race.b0", 1, b"other bytes")])
            got = store.pieces("race", [p.key for p in pieces])
            assert got == {p.key: p.data for p in pieces}
            assert store.piece_keys("race") == sorted(p.key for p in pieces)


def test_a_reader_never_sees_a_half_state(store_config: str) -> None:
    """A second store object loads while the first keeps writing new bases: always whole."""
    rounds = 40
    written: list[State] = [_long(40 + n, 200 + n) for n in range(rounds)]
    digests = {sl_key(s) for s in written}
    run_id = "reader"
    errors: list[BaseException] = []
    seen: list[int] = []
    with open_store(store_config) as writer, open_store(store_config) as reader:
        cp = writer.save(Checkpoint(run_id, state=written[0]))
        done = threading.Event()

        def write() -> None:
            nonlocal cp
            try:
                for n in range(1, rounds):
                    # Every key replaced: a new base each time, the old ones collected.
                    cp = writer.save(next_save(_rebased(cp), written[n]))
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=write)
        thread.start()
        try:
            while not done.is_set() or len(seen) < 5:
                got = reader.load(run_id)
                assert got is not None
                assert sl_key(got.state) in digests, "a state never written was loaded"
                assert sl_key(got.state) == sl_key(written[got.step + 1])
                seen.append(got.step)
        finally:
            thread.join()
        assert not errors, errors
        assert seen == sorted(seen), "a reader went back in time"
        final = reader.load(run_id)
        assert final is not None and final.state == written[-1]
        assert writer.piece_keys(run_id) == pieces_named(final)


def sl_key(state: State) -> tuple[int, int]:
    """What tells the states of the reader test apart: items and text size."""
    items = state["items"]
    return len(items), len(items[0]["text"])


# -- crashes -------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    import stepstone
    from stepstone import open_store
    from stepstone.testing import kill_point
    from test_long_states import crash_steps, SEED

    config, point, nth, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    seen = {"phase": False, "count": 0, "step": -1}

    def act(name):
        if name == "runner.after_step":
            seen["phase"] = True
            seen["step"] += 1
        elif name == "runner.after_save":
            seen["phase"] = False
        elif name == point and seen["phase"]:
            seen["count"] += 1
            if seen["count"] == nth:
                print(seen["step"], flush=True)
                os._exit(9)

    with kill_point({"runner.after_step", "runner.after_save", point}, act):
        if mode == "async":
            async def main():
                async with open_store(config) as store:
                    await stepstone.arun("crash", crash_steps(), store, input=SEED)
            asyncio.run(main())
        else:
            with open_store(config) as store:
                stepstone.run("crash", crash_steps(), store, input=SEED)
    print("no kill", flush=True)
    """
)

#: The crash run's input: a long state from the first save on.
SEED: State = {"items": [{"n": -1, "text": "s" * (2 * sl.INLINE_MAX)}]}
CRASH_STEPS = 60


def _crash_step(state: State) -> State:
    items = state["items"]
    items.append({"n": len(items) - 1, "text": "c" * 4000})
    return state


def crash_steps() -> list[Step]:
    """The crash run's steps: each appends 4 KB."""
    return [Step(f"c{i}", _crash_step) for i in range(CRASH_STEPS)]


def _expected(step: int) -> State:
    state: State = {"items": [dict(item) for item in SEED["items"]]}
    for _ in range(step + 1):
        state = _crash_step(state)
    return state


@pytest.mark.crash
@pytest.mark.parametrize(
    ("point", "nth"), [("pieces.piece", 2), ("pieces.written", 3), ("pieces.collect", 1)]
)
def test_a_kill_inside_a_long_save_leaves_a_whole_state(
    durable_config: str, mode: str, point: str, nth: int
) -> None:
    """Killed at a piece point: old (piece, written) or new (collect) state, resumed, orphans
    swept."""
    with open_store(durable_config) as probe:
        points = dict(type(probe).piece_kill_points)
    if point not in points:
        pytest.fail(f"{durable_config.split(':', maxsplit=1)[0]}: no {point} in piece_kill_points")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, durable_config, point, str(nth), mode],
        env={**os.environ, "PYTHONPATH": CHILD_PATH},
        timeout=600,
        check=False,
        capture_output=True,
        text=True,
    )
    assert child.returncode == 9, (child.stdout, child.stderr[-3000:])
    saving = int(child.stdout.split()[0])  # the step whose save was killed
    with open_store(durable_config) as store:
        cp = store.load("crash")
        assert cp is not None
        want = saving if points[point] else saving - 1
        assert cp.step == want, (point, saving, cp.step)
        assert cp.state == _expected(cp.step)
        orphans = set(store.piece_keys("crash")) - set(sl.pieces_of(ref_of(cp)))
        crash_gen = ref_of(cp)["gen"]
    # A fresh process (this one, on a store reopened from its config) resumes it.
    with open_store(durable_config) as store:
        if mode == "async":
            final = asyncio.run(
                stepstone.arun("crash", crash_steps(), store, input=SEED, lease=0.5)
            )
        else:
            final = stepstone.run("crash", crash_steps(), store, input=SEED, lease=0.5)
        assert final == _expected(CRASH_STEPS - 1)
        end = store.load("crash")
        assert end is not None and end.state == final
        end_ref = ref_of(end)
        keys = store.piece_keys("crash")
        # The workload writes several new bases after the kill: each collects below it.
        assert min(map(sl.gen_of, end_ref["base"])) > crash_gen
        assert not orphans & set(keys), "orphans of the killed save were never collected"
        assert keys == sorted(sl.pieces_of(end_ref))


def test_cosmos_keeps_a_long_state_in_items_under_its_limit(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Cosmos: a 3 MB state goes to piece items, none over 2 MB; a 3 MB input is refused.

    The input is in the run's item itself (only the state moves to pieces): over the
    item limit it is refused before any request, and the stored checkpoint is kept.
    """
    from stepstone import CheckpointTooLarge
    from stepstone.stores.cosmos import CosmosStore
    from stepstone.stores.cosmos._wire import MAX_ITEM_BYTES, NOT_PIECE

    with open_store(fresh_config("cosmos", request, tmp_path)) as store:
        assert isinstance(store, CosmosStore)
        first = store.save(Checkpoint("r", state={"n": 1}))
        big = store.save(next_save(first, {"n": 2, "blob": "x" * (3 * 1024 * 1024)}))
        assert store.load("r") == big
        container = store._ensure_open()
        sizes = [
            row["size"]
            for row in container.query_items(
                "SELECT c.id, LENGTH(c.data) AS size FROM c WHERE c.piece_of = 'r'",
                enable_cross_partition_query=True,
            )
        ]
        assert len(sizes) >= 3 and max(sizes) < MAX_ITEM_BYTES, sizes
        listed = list(
            container.query_items(
                f"SELECT c.id FROM c WHERE {NOT_PIECE}", enable_cross_partition_query=True
            )
        )
        assert [row["id"] for row in listed] == ["r"]
        with pytest.raises(CheckpointTooLarge) as info:
            store.save(replace(next_save(big), input={"huge": "y" * (3 * 1024 * 1024)}))
        assert info.value.size > info.value.limit == MAX_ITEM_BYTES
        assert store.load("r") == big
        assert [info.run_id for info in store.list_info()] == ["r"]
