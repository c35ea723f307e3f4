"""Long states in pieces on the file store: ``.pieces/<name>/<key>`` beside the documents.

The shared behaviour (``stepstone._statelog``) is the lead's; this file covers what the
file store adds: the pieces as files, written durably before the document, removed on
a lost compare-and-swap and on delete, never reached through a symlink, collected after
a new base; crash points killed in real child processes; a store written by the
release before pieces (cb0d7bd) opens and carries on, and that release, given a store
with pieces, destroys nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    Checkpoint,
    ConflictError,
    CorruptCheckpoint,
    Step,
    StoreError,
    _hooks,
    _statelog,
    open_store,
    run,
)
from stepstone._checkpoint import evolve, utcnow
from stepstone.stores.file import FileStore, encode_name
from stepstone.stores.file import _disk as disk_module
from stepstone.stores.file import _pieces as pieces_module
from stepstone.stores.file import _store as store_module

SRC = str(Path(__file__).resolve().parents[3] / "src")
REPO = Path(__file__).resolve().parents[3]
ITEM = "x" * 2000
#: Comfortably past ``_statelog.INLINE_MAX``: a state kept in pieces.
LONG = {"log": [f"{n}-{ITEM}" for n in range(40)]}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    with FileStore(tmp_path / "store") as opened:
        yield opened


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    _hooks.install(None)


def _run_dir(store: FileStore, run_id: str) -> Path:
    return Path(store.path) / ".pieces" / encode_name(run_id)


def _doc(store: FileStore, run_id: str) -> dict[str, Any]:
    text = (Path(store.path) / f"{encode_name(run_id)}.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _named(store: FileStore, run_id: str) -> set[str]:
    """The piece keys the run's current document names."""
    ref = _doc(store, run_id).get("state_ref")
    return set() if ref is None else set(_statelog.pieces_of(ref))


def _appended(cp: Checkpoint, n: int) -> Checkpoint:
    """``cp`` with one more item at the end of its log, the head handed back as is."""
    return evolve(cp, state={**cp.state, "log": [*cp.state["log"], f"{n}-{ITEM}"]})


def _appending_steps(count: int) -> list[Step]:
    def add(n: int) -> Any:
        def step(state: dict[str, Any]) -> dict[str, Any]:
            return {"log": [*state.get("log", []), f"{n}-{ITEM}"]}

        return step

    return [Step(f"s{n}", add(n)) for n in range(count)]


# -- saving and loading ----------------------------------------------------------------


def _big_state() -> dict[str, Any]:
    chunk = "y" * (1 << 20)
    return {"blob": [f"{n:04d}{chunk}" for n in range(64)], "n": 64}


def test_64_mib_state_saved_and_loaded(tmp_path: Path) -> None:
    """A 64 MiB state saves into pieces of at most 1 MiB and loads back equal, in a new store."""
    state = _big_state()
    with FileStore(tmp_path / "store") as store:
        saved = store.save(Checkpoint("big", state=state))
        keys = store.piece_keys("big")
        assert len(keys) == 65 and set(keys) == _named(store, "big")
        assert all(
            p.stat().st_size <= _statelog.PIECE_MAX for p in _run_dir(store, "big").iterdir()
        )
        assert (Path(store.path) / "big.json").stat().st_size < 64 * 1024  # names, not holds
    with FileStore(tmp_path / "store") as fresh:
        loaded = fresh.load("big")
    assert loaded is not None and loaded.version == saved.version
    assert loaded.state == state


@pytest.mark.slow
def test_64_mib_state_saved_and_loaded_async(tmp_path: Path) -> None:
    """The same through asave and aload."""
    state = _big_state()

    async def main() -> None:
        async with FileStore(tmp_path / "store") as store:
            saved = await store.asave(Checkpoint("big", state=state))
            assert len(await store.apiece_keys("big")) == 65
        async with FileStore(tmp_path / "store") as fresh:
            loaded = await fresh.aload("big")
            assert loaded is not None and loaded.version == saved.version
            assert loaded.state == state

    asyncio.run(main())


def test_small_states_stay_inline_and_make_no_pieces_directory(store: FileStore) -> None:
    """A state under INLINE_MAX is a schema-2 document as before, and no .pieces appears."""
    store.save(Checkpoint("small", state={"n": 1}))
    assert _doc(store, "small")["stepstone"] == 2
    assert not (Path(store.path) / ".pieces").exists()


@pytest.mark.slow
def test_300_step_appending_run_loads_its_final_state_with_few_pieces(store: FileStore) -> None:
    """300 steps appending 2 KB each: the load equals the result; only named pieces remain."""
    steps = _appending_steps(300)
    final = run("long", steps, store)
    assert len(final["log"]) == 300
    loaded = FileStore(store.path).load("long")
    assert loaded is not None and loaded.state == final and loaded.status == "done"
    on_disk = {p.name for p in _run_dir(store, "long").iterdir()}
    # Nothing but what the document names (the superseded bases and logs are collected),
    # and far fewer files than saves.
    assert on_disk == _named(store, "long")
    assert len(on_disk) <= _statelog.LOG_MAX
    total = sum(p.stat().st_size for p in _run_dir(store, "long").iterdir())
    state_bytes = len(json.dumps(final, separators=(",", ":")))
    assert total < (_statelog.LOG_FACTOR + 2) * state_bytes


def test_appending_saves_write_only_the_change(store: FileStore) -> None:
    """A save appending one item to a long state writes one small log piece."""
    cp = store.save(Checkpoint("run", state=LONG))
    before = set(store.piece_keys("run"))
    cp = store.save(_appended(cp, 40))
    new = set(store.piece_keys("run")) - before
    assert len(new) == 1
    assert (_run_dir(store, "run") / new.pop()).stat().st_size < 3 * len(ITEM)
    loaded = FileStore(store.path).load("run")
    assert loaded is not None and loaded.state == cp.state


# -- compare-and-swap, delete, collection -----------------------------------------------


def test_a_lost_compare_and_swap_leaves_no_pieces(store: FileStore) -> None:
    """The loser of two saves from one version writes no piece; the winner's stay.

    (It loses under the document's lock, before writing any: the race after the pieces
    is a first save's, below.)
    """
    first = store.save(Checkpoint("run", state=LONG))
    winner = store.save(_appended(first, 40))
    with pytest.raises(ConflictError):
        store.save(evolve(first, state={"log": [f"other-{ITEM}"] * 30}))
    with pytest.raises(ConflictError):
        store.save(_appended(first, 41))  # a log piece, from a stale handle
    assert set(store.piece_keys("run")) == _named(store, "run")
    loaded = FileStore(store.path).load("run")
    assert loaded is not None and loaded.state == winner.state


def test_a_first_save_that_loses_after_writing_its_pieces_removes_them(tmp_path: Path) -> None:
    """A first save out-raced between its pieces and its document removes exactly its pieces."""
    with FileStore(tmp_path / "s") as one, FileStore(tmp_path / "s") as two:
        fired: list[str] = []

        def race(point: str) -> None:
            if point == "pieces.written" and not fired:
                fired.append(point)
                _hooks.install(None)
                one.save(Checkpoint("run", state={"log": [f"a-{ITEM}"] * 30}))

        _hooks.install(race)
        with pytest.raises(ConflictError):
            two.save(Checkpoint("run", state={"log": [f"b-{ITEM}"] * 30}))
        assert fired
        assert set(one.piece_keys("run")) == _named(one, "run") != set()
        loaded = FileStore(one.path).load("run")
        assert loaded is not None and loaded.state["log"][0] == f"a-{ITEM}"


def test_delete_removes_the_run_s_pieces(store: FileStore) -> None:
    """Delete removes the document, then every piece and the run's piece directory."""
    cp = store.save(Checkpoint("run", state=LONG))
    store.save(_appended(cp, 40))
    store.save(Checkpoint("other", state=LONG))
    assert store.delete("run") is True
    assert not _run_dir(store, "run").exists()
    assert store.piece_keys("run") == []
    assert store.load("run") is None
    assert store.piece_keys("other")  # another run's are untouched


def test_delete_with_expected_version_removes_pieces_too(store: FileStore) -> None:
    """A delete guarded by the version removes the pieces as well."""
    cp = store.save(Checkpoint("run", state=LONG))
    assert store.delete("run", expected_version=cp.version) is True
    assert not _run_dir(store, "run").exists()


def test_delete_leaves_files_it_did_not_write(store: FileStore) -> None:
    """A file not named like a piece in a run's directory survives its delete (and warns)."""
    store.save(Checkpoint("run", state=LONG))
    stranger = _run_dir(store, "run") / "NOTES.txt"
    stranger.write_text("mine")
    assert store.delete("run") is True
    assert stranger.read_text() == "mine"
    assert {p.name for p in _run_dir(store, "run").iterdir()} == {"NOTES.txt"}


def test_a_new_base_collects_the_old_pieces(store: FileStore) -> None:
    """A whole save (another store object) writes a new base and removes what came before."""
    cp = store.save(Checkpoint("run", state=LONG))
    for n in range(3):
        cp = store.save(_appended(cp, 40 + n))
    assert len(store.piece_keys("run")) == 4
    with FileStore(store.path) as other:
        found = other.load("run")
        assert found is not None
        # Loaded by another store object: saved whole, a new base, the rest collected.
        store.save(evolve(found, state={"log": [*found.state["log"], f"40-{ITEM}"]}))
    keys = store.piece_keys("run")
    assert set(keys) == _named(store, "run") and len(keys) == 1


def test_shrinking_to_inline_collects_every_piece(store: FileStore) -> None:
    """A long state that becomes small again goes inline, and its pieces are collected."""
    cp = store.save(Checkpoint("run", state=LONG))
    with FileStore(store.path) as other:  # saved whole (a handle of another store object)
        other.save(evolve(cp, state={"log": []}))
    assert _doc(store, "run")["stepstone"] == 2
    assert store.piece_keys("run") == []
    loaded = FileStore(store.path).load("run")
    assert loaded is not None and loaded.state == {"log": []}


def test_a_reader_whose_pieces_were_collected_reads_the_document_again(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that raced a new base finds its pieces gone and returns the newer state."""
    store.save(Checkpoint("run", state=LONG))
    keys = store.piece_keys("run")
    newer = {"log": [f"new-{ITEM}"] * 30}
    real = store_module.FileStore._pp_fetch  # the load's read of the pieces
    raced: list[bool] = []

    def racing(self: FileStore, *args: Any) -> Any:
        if not raced:
            raced.append(True)
            with FileStore(store.path) as writer:  # a new base collects the old pieces
                found = store.load("run")
                assert found is not None
                writer.save(evolve(found, state=newer))
                assert not set(store.piece_keys("run")) & set(keys)
        return real(self, *args)

    monkeypatch.setattr(store_module.FileStore, "_pp_fetch", racing)
    reader = FileStore(store.path)
    loaded = reader.load("run")
    assert raced and loaded is not None and loaded.state == newer


def test_a_missing_piece_is_a_corrupt_checkpoint_naming_it(store: FileStore) -> None:
    """A piece gone from under an unchanged document: CorruptCheckpoint with run and key."""
    store.save(Checkpoint("run", state=LONG))
    key = store.piece_keys("run")[0]
    (_run_dir(store, "run") / key).unlink()
    with pytest.raises(CorruptCheckpoint, match=key) as caught:
        FileStore(store.path).load("run")
    assert "run.json" in str(caught.value)


def test_listings_and_claims_do_not_read_the_pieces(store: FileStore) -> None:
    """claimable, list_runs and list_info work on a schema-3 document; claimable needs no piece."""
    long_id = "q" * 300  # a hashed name: listing reads its document's run_id
    store.save(Checkpoint(long_id, state=LONG, queued=True, workflow="wf"))
    store.save(Checkpoint("plain", state=LONG, queued=True, workflow="wf"))
    assert set(store.list_runs()) == {long_id, "plain"}
    assert {info.run_id for info in store.list_info()} == {long_id, "plain"}
    shutil.rmtree(Path(store.path) / ".pieces")
    assert {info.run_id for info in store.claimable(utcnow())} == {long_id, "plain"}
    assert set(store.list_runs()) == {long_id, "plain"}


def test_a_run_with_pieces_carries_on_through_status_changes(store: FileStore) -> None:
    """Queued -> running -> done over a schema-3 document keeps the index right."""
    cp = store.save(Checkpoint("run", state=LONG, queued=True, workflow="wf"))
    assert [i.run_id for i in store.claimable(utcnow())] == ["run"]
    cp = store.save(evolve(_appended(cp, 40), queued=False, owner="w", step=0, step_names=("a",)))
    assert [i.status for i in store.claimable(utcnow())] == ["running"]
    done = evolve(_appended(cp, 41), owner=None, step=1, step_names=("a", "b"), total_steps=2)
    store.save(done)
    assert store.claimable(utcnow()) == []
    assert not list((Path(store.path) / ".active").iterdir())


# -- the piece operations ------------------------------------------------------------------


def test_piece_operations_round_trip(store: FileStore) -> None:
    """put_pieces stores, pieces returns what is there, piece_keys lists sorted; idempotent."""
    pieces = [_statelog.Piece("3.abc.b0", 3, b"one"), _statelog.Piece("2.def.0", 2, b"two")]
    store.put_pieces("r", pieces)
    store.put_pieces("r", pieces[:1])  # again: nothing changes
    store.put_pieces("r", [_statelog.Piece("3.abc.b0", 3, b"other")])  # written once
    assert store.piece_keys("r") == ["2.def.0", "3.abc.b0"]
    assert store.pieces("r", ["3.abc.b0", "9.none.0"]) == {"3.abc.b0": b"one"}
    assert store.pieces("nobody", ["1.a.0"]) == {} and store.piece_keys("nobody") == []
    assert not [n for n in os.listdir(_run_dir(store, "r")) if n.startswith(".tmp-")]


def test_piece_operations_async(store: FileStore) -> None:
    """The async twins do the same."""

    async def main() -> None:
        await store.aput_pieces("r", [_statelog.Piece("1.a.b0", 1, b"data")])
        assert await store.apiece_keys("r") == ["1.a.b0"]
        assert await store.apieces("r", ["1.a.b0"]) == {"1.a.b0": b"data"}

    asyncio.run(main())


@pytest.mark.parametrize("key", ["../x", "1/2", "x.1", "1.", "1.A", ".tmp-1", "1." + "a" * 300])
def test_bad_piece_keys_are_refused(store: FileStore, key: str) -> None:
    """A key that could name a path, or that the store cannot list back, is a ValueError."""
    with pytest.raises(ValueError, match="piece key"):
        store.put_pieces("r", [_statelog.Piece(key, 1, b"")])
    with pytest.raises(ValueError, match="piece key"):
        store.pieces("r", [key])
    assert not (Path(store.path) / ".pieces").exists()


def test_a_document_naming_a_path_as_a_piece_is_corrupt(store: FileStore) -> None:
    """A state_ref whose key climbs out of the run's directory is refused, not followed."""
    store.save(Checkpoint("run", state=LONG))
    path = Path(store.path) / "run.json"
    doc = json.loads(path.read_text())
    doc["state_ref"]["base"] = ["../../run.json"]
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptCheckpoint, match="not a piece key"):
        FileStore(store.path).load("run")


# -- symlinks and trust ----------------------------------------------------------------------


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir(mode=0o700)
    return target


def test_a_symlink_at_pieces_is_refused_and_not_followed(tmp_path: Path) -> None:
    """A symlink planted at .pieces fails the save with a StoreError; nothing lands outside."""
    outside = _outside(tmp_path)
    with FileStore(tmp_path / "store") as store:
        (Path(store.path) / ".pieces").symlink_to(outside)
        with pytest.raises(StoreError, match="symlink") as caught:
            store.save(Checkpoint("run", state=LONG))
        assert ".pieces" in str(caught.value)
        assert store.load("run") is None
        with pytest.raises(StoreError, match="symlink"):
            store.piece_keys("run")
    assert list(outside.iterdir()) == []


def test_a_symlink_at_a_run_s_piece_directory_is_refused_and_not_followed(tmp_path: Path) -> None:
    """A symlink at .pieces/<run> fails save and load; nothing outside is read or written."""
    outside = _outside(tmp_path)
    with FileStore(tmp_path / "store") as store:
        cp = store.save(Checkpoint("run", state=LONG))
        keys = store.piece_keys("run")
        moved = tmp_path / "moved"
        _run_dir(store, "run").rename(moved)
        shutil.copytree(moved, outside, dirs_exist_ok=True)  # what a follower would find
        _run_dir(store, "run").symlink_to(outside)
        with pytest.raises(StoreError, match="symlink"):
            FileStore(store.path).load("run")
        with pytest.raises(StoreError, match="symlink"):
            store.save(_appended(cp, 40))
        assert sorted(p.name for p in outside.iterdir()) == keys
        # Delete removes the planted entry itself, never what it points to.
        assert store.delete("run") is True
        assert not _run_dir(store, "run").is_symlink()
        assert sorted(p.name for p in outside.iterdir()) == keys


def test_a_symlink_at_a_piece_is_not_followed(store: FileStore, tmp_path: Path) -> None:
    """A symlink planted at a piece's key is refused as not ours, not read through."""
    store.save(Checkpoint("run", state=LONG))
    key = store.piece_keys("run")[0]
    secret = tmp_path / "secret"
    secret.write_bytes((_run_dir(store, "run") / key).read_bytes())
    (_run_dir(store, "run") / key).unlink()
    (_run_dir(store, "run") / key).symlink_to(secret)
    with pytest.raises(CorruptCheckpoint, match="symlink"):
        FileStore(store.path).load("run")


def test_a_pieces_directory_writable_by_everyone_is_refused(store: FileStore) -> None:
    """With trust=strict, a .pieces others may write is refused; trust=any accepts it."""
    store.save(Checkpoint("run", state=LONG))
    root = Path(store.path) / ".pieces"
    root.chmod(0o777)
    with pytest.raises(StoreError, match="writable|mode"):
        FileStore(store.path).load("run")
    with FileStore(store.path, trust="any") as shared:
        assert shared.load("run") is not None


# -- durability ------------------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["full", "none"])
def test_pieces_are_durable_before_the_document_in_both_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """Each piece file and its directory are fsynced before the document is written."""
    synced: list[str] = []
    real_sync = disk_module.sync

    def recording(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_sync(fd)

    monkeypatch.setattr(pieces_module, "sync", recording)
    at_write: list[list[str]] = []
    _hooks.install(
        lambda point: at_write.append(list(synced)) if point == "pieces.written" else None
    )
    with open_store(f"file://{tmp_path}/store?durability={durability}") as store:
        cp = store.save(Checkpoint("run", state=LONG))
        synced.clear()
        at_write.clear()
        store.save(_appended(cp, 40))
    assert at_write == [["file", "dir"]]


# -- crashes in real processes ---------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, sys
    from stepstone import Checkpoint, _hooks, open_store
    from stepstone._checkpoint import evolve
    config, point, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    item = "x" * 2000
    def more(cp, n):
        return evolve(cp, state={**cp.state, "log": [*cp.state["log"], f"{n}-{item}"]})
    with open_store(config) as store:
        cp = store.save(Checkpoint("run", state={"log": [f"{n}-{item}" for n in range(40)]}))
        for n in range(40, 43):
            cp = store.save(more(cp, n))
        print(cp.version, flush=True)
        _hooks.install(lambda name: os._exit(17) if name == point else None)
        if mode == "base":
            # Saved by another store object: whole, a new base collecting the rest.
            state = {"log": [f"new-{n}-{item}" for n in range(50)]}
            open_store(config).save(evolve(cp, state=state))
        else:  # one more item: a log piece
            state = {**cp.state, "log": [*cp.state["log"], f"43-{item}"]}
            store.save(evolve(cp, state=state))
    os._exit(0)
    """
)


def _child(config: str, point: str, mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, config, point, mode],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 17, done.stderr
    return done.stdout.strip()


_REOPEN = textwrap.dedent(
    """
    import json, sys
    from stepstone import open_store
    from stepstone._checkpoint import evolve
    item = "x" * 2000
    with open_store(sys.argv[1]) as store:
        cp = store.load("run")
        print(json.dumps([cp.version, cp.state["log"][0][:6], len(cp.state["log"])]), flush=True)
        # A delta, then (another store object: a foreign handle) a whole new base.
        cp = store.save(evolve(cp, state={**cp.state, "log": [*cp.state["log"], f"z-{item}"]}))
        # Loaded by this store object, saved by another: whole, a new base.
        with open_store(sys.argv[1]) as other:
            other.save(evolve(cp, state={"log": [*cp.state["log"], f"w-{item}"]}))
    """
)


def _reopen(config: str) -> list[Any]:
    done = subprocess.run(
        [sys.executable, "-c", _REOPEN, config],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found: list[Any] = json.loads(done.stdout.strip().splitlines()[0])
    return found


@pytest.mark.crash
@pytest.mark.parametrize("durability", ["full", "none"])
@pytest.mark.parametrize(
    ("point", "mode", "survives"),
    [
        ("pieces.written", "log", False),
        ("pieces.written", "base", False),
        ("pieces.collect", "base", True),
    ],
)
def test_a_save_killed_at_a_piece_point_leaves_the_old_or_the_new_state(
    tmp_path: Path, durability: str, point: str, mode: str, survives: bool
) -> None:
    """Killed there, a fresh process loads the old (or new) state whole; orphans get collected."""
    config = f"file://{tmp_path}/store?durability={durability}"
    before = _child(config, point, mode)
    with FileStore(tmp_path / "store") as store:
        # The killed save left pieces no document names: its own, or the ones it replaced.
        assert set(store.piece_keys("run")) - _named(store, "run")
    version, head, length = _reopen(config)
    if survives:
        assert version != before and head == "new-0-" and length == 50
    else:
        assert version == before and head == "0-xxxx" and length == 43
    with FileStore(tmp_path / "store") as store:
        # Whatever the killed save left behind was collected by the later new base.
        assert set(store.piece_keys("run")) == _named(store, "run")
        assert not [n for n in os.listdir(_run_dir(store, "run")) if not n[0].isdigit()]
        loaded = store.load("run")
        assert loaded is not None and loaded.state["log"][-2:] == [f"z-{ITEM}", f"w-{ITEM}"]


_LOOP = textwrap.dedent(
    """
    import sys
    from stepstone import Checkpoint, open_store
    from stepstone._checkpoint import evolve
    item = "x" * 2000
    def more(cp, n):
        return evolve(cp, state={**cp.state, "log": [*cp.state["log"], f"{n}-{item}"]})
    with open_store(sys.argv[1]) as store:
        cp = store.save(Checkpoint("run", state={"log": [f"{n}-{item}" for n in range(20)]}))
        n = 20
        while True:
            if n % 37 == 0:  # now and then a whole new base from another store object
                with open_store(sys.argv[1]) as other:
                    cp = other.save(evolve(cp, state={"log": [*cp.state["log"], f"{n}-{item}"]}))
                cp = store.load("run")
            else:
                cp = store.save(more(cp, n))
            print(n, flush=True)
            n += 1
    """
)


@pytest.mark.crash
@pytest.mark.parametrize("saves", [7, 40, 90])
def test_a_saver_sigkilled_anywhere_leaves_a_whole_state(tmp_path: Path, saves: int) -> None:
    """SIGKILL after some acknowledged saves: the state loads whole, at or past the last one."""
    config = f"file://{tmp_path}/store"
    child = subprocess.Popen(
        [sys.executable, "-c", _LOOP, config],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acked = -1
    for line in child.stdout:
        acked = int(line)
        if acked >= 20 + saves:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    with FileStore(tmp_path / "store") as store:
        loaded = store.load("run")
    assert loaded is not None
    log = loaded.state["log"]
    assert log == [f"{n}-{ITEM}" for n in range(len(log))]  # whole: every item, in order
    assert len(log) in (acked + 1, acked + 2)  # the last acknowledged save, or the next


# -- the release before pieces -----------------------------------------------------------------

# Written by the file store of cb0d7bd (the release before pieces), files as they were.
_OLD_STORE = {
    "%57aiting%2f%52un.json": (
        '{"stepstone":2,"run_id":"Waiting/Run","step":-1,"step_names":[],"total_steps":null,'
        '"attempt":0,"failure":null,"created_at":"2026-12-02T09:18:47.618087+00:00",'
        '"updated_at":"2026-12-02T09:18:47.618087+00:00","workflow":"wf","queued":true,'
        '"version":"1.18ad57ace234",\n"state":{"items":[0,1,2,3,4]}}\n'
    ),
    "done-run.json": (
        '{"stepstone":2,"run_id":"done-run","step":0,"step_names":["a"],"total_steps":1,'
        '"attempt":0,"failure":null,"created_at":"2026-12-02T09:18:47.617093+00:00",'
        '"updated_at":"2026-12-02T09:18:47.617093+00:00","version":"1.2cf55c8ab720",\n'
        '"state":{"n":1,"text":"héllo"}}\n'
    ),
    "~0d4e2ca9e9cbced7a7a5380eb29e1a3783b9b6d0db72de36a1051038e1c1fbc7.json": (
        '{"stepstone":2,"run_id":"' + "x" * 300 + '","step":-1,"step_names":[],'
        '"total_steps":null,"attempt":0,"failure":null,'
        '"created_at":"2026-12-02T09:18:47.619101+00:00",'
        '"updated_at":"2026-12-02T09:18:47.619101+00:00","version":"1.eef10ffb6841",\n'
        '"state":{"k":"v"}}\n'
    ),
    ".active/~0d4e2ca9e9cbced7a7a5380eb29e1a3783b9b6d0db72de36a1051038e1c1fbc7": "running",
    ".active/%57aiting%2f%52un": "queued",
}


def _old_store(directory: Path) -> None:
    directory.mkdir(mode=0o700)
    (directory / ".active").mkdir(mode=0o700)
    for name, text in _OLD_STORE.items():
        (directory / name).write_text(text, encoding="utf-8")
        (directory / name).chmod(0o600)


def test_a_store_of_the_release_before_pieces_opens_as_is(tmp_path: Path) -> None:
    """A cb0d7bd store opens unchanged, lists, claims, loads, and its runs grow into pieces."""
    _old_store(tmp_path / "old")
    with FileStore(tmp_path / "old") as store:
        assert not (tmp_path / "old" / ".pieces").exists()  # opening changes nothing
        assert set(store.list_runs()) == {"Waiting/Run", "done-run", "x" * 300}
        claimable = {info.run_id for info in store.claimable(utcnow())}
        assert claimable == {"Waiting/Run", "x" * 300}
        done = store.load("done-run")
        assert done is not None and done.state == {"n": 1, "text": "héllo"}
        waiting = store.load("Waiting/Run")
        assert waiting is not None and waiting.version == "1.18ad57ace234"
        grown = store.save(evolve(waiting, state={"items": [0, 1, 2, 3, 4], **LONG}))
        assert _doc(store, "Waiting/Run")["stepstone"] == 3
    with FileStore(tmp_path / "old") as again:
        loaded = again.load("Waiting/Run")
        assert loaded is not None and loaded.state == grown.state
        assert {info.run_id for info in again.claimable(utcnow())} == claimable


def _old_release(tmp_path: Path) -> Path | None:
    """The source of cb0d7bd, from the repository's history; None where it is not there."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    target = tmp_path / "old-src"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "cb0d7bd", "src"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True, timeout=120)
    return target / "src"


_OLD_CHILD = textwrap.dedent(
    """
    import json, sys
    from stepstone import Checkpoint, CorruptCheckpoint, StoreError
    from stepstone.stores.file import FileStore
    store = FileStore(sys.argv[1])
    out = {"runs": sorted(store.list_runs())}
    try:
        store.load("long")
    except CorruptCheckpoint as exc:
        out["load"] = str(exc)
    try:
        store.save(Checkpoint("long", state={"n": 1}, version=json.loads(sys.argv[2])))
    except StoreError as exc:
        out["save"] = type(exc).__name__
    out["small"] = store.load("small").state
    store.save(Checkpoint("fresh", state={"n": 2}))
    print(json.dumps(out))
    """
)


@pytest.mark.crash
def test_the_release_before_pieces_destroys_nothing_in_a_store_with_pieces(tmp_path: Path) -> None:
    """cb0d7bd opening a store with pieces refuses the long run ("upgrade") and touches no piece."""
    old_src = _old_release(tmp_path)
    if old_src is None:
        pytest.skip("the repository's history (git, commit cb0d7bd) is not available")
    with FileStore(tmp_path / "store") as store:
        cp = store.save(Checkpoint("long", state=LONG))
        store.save(Checkpoint("small", state={"n": 1}))
        keys = store.piece_keys("long")
        contents = {key: (_run_dir(store, "long") / key).read_bytes() for key in keys}
    done = subprocess.run(
        [sys.executable, "-c", _OLD_CHILD, str(tmp_path / "store"), json.dumps(cp.version)],
        env={**os.environ, "PYTHONPATH": str(old_src)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["runs"] == ["long", "small"]  # .pieces is not taken for a run
    assert "upgrade stepstone" in out["load"]
    assert out["save"] == "CorruptCheckpoint"
    assert out["small"] == {"n": 1}
    with FileStore(tmp_path / "store") as store:
        assert {k: (_run_dir(store, "long") / k).read_bytes() for k in keys} == contents
        loaded = store.load("long")
        assert loaded is not None and loaded.state == LONG and loaded.version == cp.version
        assert set(store.list_runs()) == {"long", "small", "fresh"}
