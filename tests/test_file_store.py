"""FileStore behaviour that is specific to keeping checkpoints as files.

The generic Store contract (CAS semantics, round trips, listing...) lives in the shared
contract suite; this file covers naming, permissions, on-disk corruption, crash debris,
config strings, locking across threads and processes, and the durability option.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepstone import (
    Checkpoint,
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidState,
    StoreError,
    StorePermissionError,
    _hooks,
    open_store,
)
from stepstone.stores import file as file_module
from stepstone.stores.file import FileStore, decode_name, encode_name

STATE = {"n": 1, "text": "hello"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    with FileStore(tmp_path / "store") as opened:
        yield opened


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    _hooks.install(None)


def _files(directory: Path) -> set[str]:
    return {entry.name for entry in directory.iterdir()}


def _data_files(directory: Path) -> set[str]:
    return {name for name in _files(directory) if name.endswith(".json")}


# -- file naming -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_id", "expected"),
    [
        ("plain-run_1", "plain-run_1.json"),
        ("../x", "%2e.%2fx.json"),
        ("a/b", "a%2fb.json"),
        ("/abs", "%2fabs.json"),
        (".hidden", "%2ehidden.json"),
        ("Upper", "%55pper.json"),
        ("é ü", "%c3%a9%20%c3%bc.json"),
        ("100%", "100%25.json"),
        ("~x", "%7ex.json"),
    ],
)
def test_file_names_are_escaped_lowercase(store: FileStore, run_id: str, expected: str) -> None:
    """Each run_id maps to the documented escaped file name inside the store's directory."""
    store.save(Checkpoint(run_id, state=STATE))
    directory = Path(store.path)
    assert _data_files(directory) == {expected}
    assert list(store.list_runs()) == [run_id]
    loaded = store.load(run_id)
    assert loaded is not None
    assert loaded.run_id == run_id


# Cc covers C0, DEL and C1; Cs lone surrogates: what check_run_id refuses.
_run_ids = st.text(st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=120)


@given(_run_ids)
def test_names_are_safe_and_reversible(run_id: str) -> None:
    """Every valid id maps to a safe lowercase name that decodes back to it (or is hashed)."""
    name = encode_name(run_id)
    assert len(name) <= 200
    assert name == name.lower()
    assert not name.startswith(".")
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_-.%~")
    if name.startswith("~"):
        assert name == "~" + hashlib.sha256(run_id.encode()).hexdigest()
    else:
        assert "~" not in name
        assert decode_name(name) == run_id


@given(_run_ids, _run_ids)
def test_names_are_injective(first: str, second: str) -> None:
    """Two different ids never share a file name, even ignoring case."""
    if first != second:
        assert encode_name(first).lower() != encode_name(second).lower()


def test_nothing_escapes_the_directory(tmp_path: Path) -> None:
    """Run ids full of slashes and dots create files only inside the store's directory."""
    with FileStore(tmp_path / "inner" / "store") as store:
        for run_id in ("../escape", "../../escape", "/etc/passwd", "..", ".", "a/../../b"):
            store.save(Checkpoint(run_id, state=STATE))
    assert _files(tmp_path) == {"inner"}
    assert _files(tmp_path / "inner") == {"store"}


def test_case_differing_ids_get_distinct_lowercase_names(store: FileStore) -> None:
    """Ids that differ only in case map to names that stay distinct on case-folding systems."""
    ids = ["run", "Run", "RUN", "rUn"]
    for index, run_id in enumerate(ids):
        store.save(Checkpoint(run_id, state={"index": index}))
    names = _files(Path(store.path))
    assert all(name == name.lower() for name in names)
    assert len({name.lower() for name in _data_files(Path(store.path))}) == len(ids)
    for index, run_id in enumerate(ids):
        loaded = store.load(run_id)
        assert loaded is not None
        assert loaded.state == {"index": index}
    assert sorted(store.list_runs()) == sorted(ids)


def test_long_ids_are_hashed(store: FileStore) -> None:
    """An id whose escaped name exceeds 200 bytes is stored under ~sha256 and still listed."""
    run_id = "É" * 400  # 800 UTF-8 bytes, 2400 escaped characters
    store.save(Checkpoint(run_id, state=STATE))
    digest = hashlib.sha256(run_id.encode()).hexdigest()
    assert _data_files(Path(store.path)) == {f"~{digest}.json"}
    assert list(store.list_runs()) == [run_id]
    loaded = store.load(run_id)
    assert loaded is not None
    assert loaded.run_id == run_id


def test_hashing_starts_just_over_200_bytes(store: FileStore) -> None:
    """An escaped name of exactly 200 bytes is kept; one of 201 bytes is hashed."""
    kept, hashed = "a" * 200, "a" * 201
    store.save(Checkpoint(kept, state=STATE))
    store.save(Checkpoint(hashed, state=STATE))
    digest = hashlib.sha256(hashed.encode()).hexdigest()
    assert _data_files(Path(store.path)) == {f"{kept}.json", f"~{digest}.json"}
    assert sorted(store.list_runs()) == sorted([kept, hashed])


def test_hashed_file_holding_another_run_is_corrupt(store: FileStore) -> None:
    """A hashed file whose document names a different run is refused on load and not listed."""
    first, second = "x" * 300, "y" * 300
    store.save(Checkpoint(first, state=STATE))
    directory = Path(store.path)
    first_file = directory / f"~{hashlib.sha256(first.encode()).hexdigest()}.json"
    second_file = directory / f"~{hashlib.sha256(second.encode()).hexdigest()}.json"
    first_file.rename(second_file)
    with pytest.raises(CorruptCheckpoint, match="holds run"):
        store.load(second)
    assert list(store.list_runs()) == []


def test_list_runs_ignores_temp_lock_and_foreign_names(store: FileStore) -> None:
    """Only canonical ``*.json`` names are listed: temp, lock and non-canonical files are not."""
    store.save(Checkpoint("real", state=STATE))
    directory = Path(store.path)
    for name in (".tmp-0123", "Upper.json", "%61.json", "%ff.json", "%00.json", "notes.txt"):
        (directory / name).write_text("{}")
    assert list(store.list_runs()) == ["real"]


# -- permissions -----------------------------------------------------------------------


def test_created_directories_and_files_are_private(tmp_path: Path) -> None:
    """Missing directories are created 0700 and every file 0600, even under umask 0."""
    old_umask = os.umask(0)
    try:
        with FileStore(tmp_path / "parent" / "store") as store:
            store.save(Checkpoint("run", state=STATE))
            directory = Path(store.path)
            modes = {
                name: stat.S_IMODE((directory / name).stat().st_mode) for name in _files(directory)
            }
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "parent").stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert modes == {"run.json": 0o600, "run.lock": 0o600}


def test_existing_directory_mode_is_left_alone(tmp_path: Path) -> None:
    """Opening a store on an existing directory does not change its mode."""
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    FileStore(directory).close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unwritable_directory_raises_store_permission_error(tmp_path: Path) -> None:
    """A directory the process may not write gives StorePermissionError naming the file."""
    with FileStore(tmp_path / "store") as store:
        os.chmod(store.path, 0o500)
        try:
            with pytest.raises(StorePermissionError, match="run.lock"):
                store.save(Checkpoint("run", state=STATE))
        finally:
            os.chmod(store.path, 0o700)


def test_permission_error_is_translated(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An EACCES from the OS surfaces as StorePermissionError with the original as cause."""
    real_open = os.open

    def refusing_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if str(path).endswith(".json"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(StorePermissionError, match="run.json") as caught:
        store.load("run")
    assert isinstance(caught.value.__cause__, PermissionError)


def test_disk_full_is_translated_and_leaves_no_temp(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while writing becomes a StoreError naming the temp file, which is removed."""

    def full_disk(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(StoreError, match=r"\.tmp-.*ENOSPC") as caught:
        store.save(Checkpoint("run", state=STATE))
    assert isinstance(caught.value.__cause__, OSError)
    monkeypatch.undo()
    assert _files(Path(store.path)) <= {"run.lock"}


# -- corrupt and foreign files -------------------------------------------------------------


def _write_raw(store: FileStore, name: str, data: bytes) -> Path:
    path = Path(store.path) / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\xffgarbage",
        b'{"hello": "world"}',  # foreign JSON
        b"[1, 2, 3]",
        b'{"stepstone": 99, "run_id": "run"}',  # a newer schema
        b"",
    ],
    ids=["binary", "foreign-json", "json-list", "future-schema", "empty"],
)
def test_unreadable_file_is_corrupt_and_never_touched(store: FileStore, data: bytes) -> None:
    """Load and save raise CorruptCheckpoint naming the file, whose bytes stay unchanged."""
    path = _write_raw(store, "run.json", data)
    with pytest.raises(CorruptCheckpoint, match=str(path)):
        store.load("run")
    for version in (None, "1.abc"):
        with pytest.raises(CorruptCheckpoint, match=str(path)):
            store.save(Checkpoint("run", state=STATE, version=version))
    assert path.read_bytes() == data
    assert _data_files(Path(store.path)) == {"run.json"}


def test_truncated_file_is_corrupt(store: FileStore) -> None:
    """A document cut short (a torn write by something else) is refused and kept as is."""
    saved = store.save(Checkpoint("run", state={"big": "x" * 1000}))
    path = Path(store.path) / "run.json"
    truncated = path.read_bytes()[:-200]
    path.write_bytes(truncated)
    with pytest.raises(CorruptCheckpoint, match="run.json"):
        store.load("run")
    with pytest.raises(CorruptCheckpoint, match="run.json"):
        store.save(Checkpoint("run", state=STATE, version=saved.version))
    assert path.read_bytes() == truncated


def test_document_without_version_is_corrupt(store: FileStore) -> None:
    """A stepstone document lacking the file store's version key is refused."""
    store.save(Checkpoint("run", state=STATE))
    path = Path(store.path) / "run.json"
    doc = json.loads(path.read_bytes())
    del doc["version"]
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptCheckpoint, match="version"):
        store.load("run")


def test_document_for_another_run_is_corrupt(store: FileStore) -> None:
    """A file copied under another run's name is refused rather than loaded as that run."""
    store.save(Checkpoint("first", state=STATE))
    directory = Path(store.path)
    (directory / "second.json").write_bytes((directory / "first.json").read_bytes())
    with pytest.raises(CorruptCheckpoint, match="holds run 'first'"):
        store.load("second")


def test_delete_removes_a_corrupt_file(store: FileStore) -> None:
    """Delete is an operator's explicit request, so it removes even an unreadable file."""
    _write_raw(store, "run.json", b"garbage")
    assert store.delete("run") is True
    assert _files(Path(store.path)) == set()


def test_oversized_file_is_corrupt_without_reading_it(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data file over the size limit is refused on load as not a checkpoint."""
    monkeypatch.setattr(file_module, "MAX_DOCUMENT_BYTES", 100)
    _write_raw(store, "run.json", b" " * 101)
    with pytest.raises(CorruptCheckpoint, match="over the 100-byte limit"):
        store.load("run")


def test_document_over_limit_is_refused(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint over the limit raises CheckpointTooLarge with size and limit; nothing stored."""
    monkeypatch.setattr(file_module, "MAX_DOCUMENT_BYTES", 1000)
    with pytest.raises(CheckpointTooLarge, match="limit of 1000 bytes") as caught:
        store.save(Checkpoint("run", state={"big": "x" * 2000}))
    assert caught.value.limit == 1000
    assert caught.value.size > 2000
    with pytest.raises(CheckpointTooLarge):
        store.save(Checkpoint("run", state={"big": "x" * 900}))  # only the document is over
    assert _data_files(Path(store.path)) == set()
    assert store.load("run") is None


def test_lone_surrogates_refused_before_any_write(store: FileStore) -> None:
    """A state with lone surrogates (not UTF-8) is refused, and no file is written."""
    with pytest.raises(InvalidState, match="lone surrogate"):
        store.save(Checkpoint("run", state={"bad\udc80key": ["\ud800", "ok"]}))
    assert not (Path(store.path) / "run.json").exists()


def test_document_format(store: FileStore) -> None:
    """The file holds the shared document plus the version, readable with plain json."""
    saved = store.save(Checkpoint("run", state=STATE, total_steps=3))
    raw = (Path(store.path) / "run.json").read_text("utf-8")
    assert raw.count("\n") == 2  # a metadata line, then the state line
    doc = json.loads(raw)
    assert doc["stepstone"] == 1
    assert doc["run_id"] == "run"
    assert doc["version"] == saved.version
    assert doc["state"] == STATE


# -- crash debris --------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["file.after_temp_write"])
def test_failure_before_rename_removes_temp_and_keeps_old(store: FileStore, point: str) -> None:
    """An error between writing the temp file and renaming it leaves no temp and the old data."""
    first = store.save(Checkpoint("run", state={"v": 1}))
    before = (Path(store.path) / "run.json").read_bytes()

    def boom(name: str) -> None:
        if name == point:
            raise RuntimeError("injected")

    _hooks.install(boom)
    with pytest.raises(RuntimeError, match="injected"):
        store.save(Checkpoint("run", state={"v": 2}, version=first.version))
    _hooks.install(None)
    assert _files(Path(store.path)) == {"run.json", "run.lock"}
    assert (Path(store.path) / "run.json").read_bytes() == before
    again = store.save(Checkpoint("run", state={"v": 3}, version=first.version))
    assert again.state == {"v": 3}


def test_failure_after_rename_has_published(store: FileStore) -> None:
    """An error after the rename leaves the new document in place and no temp file."""
    first = store.save(Checkpoint("run", state={"v": 1}))

    def boom(name: str) -> None:
        if name == "file.before_dir_fsync":
            raise RuntimeError("injected")

    _hooks.install(boom)
    with pytest.raises(RuntimeError):
        store.save(Checkpoint("run", state={"v": 2}, version=first.version))
    _hooks.install(None)
    assert _files(Path(store.path)) == {"run.json", "run.lock"}
    loaded = store.load("run")
    assert loaded is not None
    assert loaded.state == {"v": 2}


def test_hooks_fire_in_order(store: FileStore) -> None:
    """A save passes the three crash points in order, which the crash suite relies on."""
    seen: list[str] = []
    _hooks.install(seen.append)
    store.save(Checkpoint("run", state=STATE))
    assert seen == ["file.after_temp_write", "file.after_rename", "file.before_dir_fsync"]


def test_stale_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    """Opening removes temp files over an hour old, keeps fresh ones and never other files."""
    directory = tmp_path / "store"
    directory.mkdir()
    old, fresh = directory / ".tmp-old", directory / ".tmp-fresh"
    others = [directory / "keep.json", directory / "notes.txt", directory / ".tmpnot"]
    for path in [old, fresh, *others]:
        path.write_text("x")
    two_hours_ago = time.time() - 7200
    for path in [old, *others]:
        os.utime(path, (two_hours_ago, two_hours_ago))
    FileStore(directory).close()
    assert _files(directory) == {".tmp-fresh", "keep.json", "notes.txt", ".tmpnot"}


# -- durability and config -------------------------------------------------------------------


@pytest.mark.parametrize(("durability", "expected"), [("full", 2), ("none", 0)])
def test_durability_controls_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str, expected: int
) -> None:
    """durability=full fsyncs the file and the directory on each save; none never fsyncs."""
    with open_store(f"file://{tmp_path}/store?durability={durability}") as store:
        calls: list[int] = []
        real_fsync = os.fsync

        def counting_fsync(fd: int) -> None:
            calls.append(fd)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", counting_fsync)
        first = store.save(Checkpoint("run", state=STATE))
        assert len(calls) == expected
        store.save(Checkpoint("run", state=STATE, version=first.version))
        assert len(calls) == 2 * expected
        store.delete("run")
        assert len(calls) == (2 * expected + 1 if expected else 0)


def test_default_durability_is_full(tmp_path: Path) -> None:
    """Without the option, a config string and the constructor both pick full durability."""
    assert open_store(f"file://{tmp_path}/a").durability == "full"  # type: ignore[attr-defined]
    assert FileStore(tmp_path / "b").durability == "full"
    assert "durability='none'" in repr(FileStore(tmp_path / "c", durability="none"))


def test_config_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """file:///abs and file:rel (resolved against the cwd at open) both open a FileStore."""
    absolute = open_store(f"file://{tmp_path}/abs")
    assert isinstance(absolute, FileStore)
    assert absolute.path == str(tmp_path / "abs")
    monkeypatch.chdir(tmp_path)
    relative = open_store("file:rel/dir")
    assert isinstance(relative, FileStore)
    assert relative.path == str(tmp_path / "rel" / "dir")
    monkeypatch.chdir("/")
    relative.save(Checkpoint("run", state=STATE))  # a later chdir does not move the store
    assert (tmp_path / "rel" / "dir" / "run.json").exists()
    assert str(tmp_path / "abs") in repr(absolute)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("file://host/x", "names a host"),
        ("file://localhost/x", "names a host"),
        ("file://", "names no directory"),
        ("file:", "names no directory"),
        ("file:///x?durability=fast", "not allowed"),
        ("file:///x?sync=1", "unknown option"),
        ("file:///x?durability=full&durability=none", "given twice"),
        ("file:///x#frag", "fragment"),
    ],
)
def test_bad_config_strings(config: str, message: str) -> None:
    """Malformed file configs raise ConfigError saying what is wrong."""
    with pytest.raises(ConfigError, match=message) as caught:
        FileStore.from_config(config)
    if message in ("names a host", "names no directory", "fragment"):
        assert "file:///abs/dir or file:rel/dir" in str(caught.value)


def test_bad_durability_in_constructor(tmp_path: Path) -> None:
    """The constructor refuses a durability other than full or none."""
    with pytest.raises(ConfigError, match="durability"):
        FileStore(tmp_path, durability="fast")  # type: ignore[arg-type]


def test_path_that_is_a_file_is_a_store_error(tmp_path: Path) -> None:
    """Opening a store on a regular file fails with a StoreError naming it."""
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(StoreError, match=str(target)):
        FileStore(target)


def test_close_is_idempotent_and_final(store: FileStore) -> None:
    """Closing twice is fine, and a closed store refuses work instead of using a stale fd."""
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.load("run")


# -- locking -------------------------------------------------------------------------------


def test_threads_racing_cas_one_winner_per_round(store: FileStore) -> None:
    """Threads saving the same version concurrently: exactly one wins each round."""
    threads_count, rounds = 8, 20
    barrier = threading.Barrier(threads_count)
    wins = [0] * rounds
    errors: list[BaseException] = []
    counter_lock = threading.Lock()

    def worker(index: int) -> None:
        try:
            for round_no in range(rounds):
                barrier.wait()
                current = store.load("run")
                barrier.wait()  # everyone holds the same version before anyone saves
                version = None if current is None else current.version
                try:
                    store.save(Checkpoint("run", state={"by": index}, version=version))
                except ConflictError:
                    continue
                with counter_lock:
                    wins[round_no] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert wins == [1] * rounds


def _process_worker(
    directory: str, index: int, rounds: int, barrier: object, results: object
) -> None:
    store = FileStore(directory)
    for round_no in range(rounds):
        barrier.wait()  # type: ignore[attr-defined]
        current = store.load("shared")
        barrier.wait()  # type: ignore[attr-defined]
        version = None if current is None else current.version
        try:
            store.save(
                Checkpoint("shared", state={"by": index, "round": round_no}, version=version)
            )
        except ConflictError:
            continue
        results.put((round_no, index))  # type: ignore[attr-defined]
    store.close()


def test_processes_racing_cas_one_winner_per_round(tmp_path: Path) -> None:
    """Processes saving the same version concurrently: exactly one wins each round."""
    processes_count, rounds = 4, 15
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes_count)
    results = ctx.Queue()
    directory = str(tmp_path / "store")
    FileStore(directory).close()
    procs = [
        ctx.Process(target=_process_worker, args=(directory, i, rounds, barrier, results))
        for i in range(processes_count)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0] * processes_count
    winners: dict[int, list[int]] = {}
    while not results.empty():
        round_no, index = results.get(timeout=5)
        winners.setdefault(round_no, []).append(index)
    assert sorted(winners) == list(range(rounds))
    assert all(len(indexes) == 1 for indexes in winners.values()), winners
    with FileStore(directory) as store:
        final = store.load("shared")
    assert final is not None
    assert final.state == {"by": winners[rounds - 1][0], "round": rounds - 1}
    assert final.version is not None
    assert final.version.startswith(f"{rounds}.")


def test_waiter_on_a_deleted_lock_file_retries_on_the_new_one(store: FileStore) -> None:
    """A save that waited on a lock file that delete unlinked must lock the new file instead."""
    import fcntl

    directory = Path(store.path)
    lock_path = directory / "run.lock"
    old = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(old, fcntl.LOCK_EX)  # plays a delete() in progress
    done = threading.Event()
    outcome: list[object] = []

    def save() -> None:
        try:
            outcome.append(store.save(Checkpoint("run", state=STATE)))
        except BaseException as exc:  # pragma: no cover - reported below
            outcome.append(exc)
        done.set()

    thread = threading.Thread(target=save)
    thread.start()
    time.sleep(0.2)
    assert not done.is_set()  # blocked on the old lock
    os.unlink(lock_path)  # delete() unlinks the lock file while holding it...
    new = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(new, fcntl.LOCK_EX)  # ...and another saver takes the new one
    os.close(old)  # the delete finishes
    time.sleep(0.3)
    assert not done.is_set(), "save went ahead holding a lock on a deleted file"
    assert not (directory / "run.json").exists()
    os.close(new)
    thread.join(10)
    assert done.is_set()
    assert isinstance(outcome[0], Checkpoint)


def test_delete_removes_data_and_lock_files(store: FileStore) -> None:
    """Delete unlinks both the document and the run's lock file, and reports whether it existed."""
    store.save(Checkpoint("run", state=STATE))
    assert store.delete("run") is True
    assert _files(Path(store.path)) == set()
    assert store.delete("run") is False
    assert _files(Path(store.path)) == set()
