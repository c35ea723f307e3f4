"""FileStore behaviour that is specific to keeping checkpoints as files.

The generic Store contract (CAS semantics, round trips, listing...) lives in the shared
contract suite; this file covers naming, permissions, on-disk corruption, crash debris,
config strings, locking across threads and processes, and the durability option.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
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
    StoreUnavailable,
    _hooks,
    open_store,
)
from stepstone._checkpoint import utcnow
from stepstone.stores.file import FileStore, decode_name, encode_name
from stepstone.stores.file import _errors as file_errors
from stepstone.stores.file import _store as store_module

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
    """Every entry but the index directory, which the index tests look at themselves."""
    return {entry.name for entry in directory.iterdir()} - {".active"}


def _markers(store: FileStore) -> set[str]:
    return {entry.name for entry in (Path(store.path) / ".active").iterdir()}


def _done(run_id: str, **fields: object) -> Checkpoint:
    """A checkpoint whose run is finished: it has no index marker."""
    return Checkpoint(run_id, step=0, step_names=("only",), total_steps=1, **fields)  # type: ignore[arg-type]


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
    (tmp_path / "inner").mkdir(mode=0o700)
    with FileStore(tmp_path / "inner" / "store") as store:
        for run_id in ("../escape", "../../escape", "/etc/passwd", "..", ".", "a/../../b"):
            store.save(Checkpoint(run_id, state=STATE))
    assert _files(tmp_path) == {"inner"}
    assert _files(tmp_path / "inner") == {"store"}


def test_a_typo_in_the_path_is_refused_not_created(tmp_path: Path) -> None:
    """Only the store directory itself is created: a missing parent is an error naming it."""
    with pytest.raises(StoreError, match="parent directory .*nosuch.* does not exist"):
        FileStore(tmp_path / "nosuch" / "deeper" / "runs")
    assert not (tmp_path / "nosuch").exists()


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
    """The missing store directory is created 0700 and every file 0600, even under umask 0."""
    (tmp_path / "parent").mkdir(mode=0o700)
    old_umask = os.umask(0)
    try:
        with FileStore(tmp_path / "parent" / "store") as store:
            store.save(Checkpoint("run", state=STATE))
            directory = Path(store.path)
            modes = {
                name: stat.S_IMODE((directory / name).stat().st_mode) for name in _files(directory)
            }
            index = directory / ".active"
            index_modes = {
                stat.S_IMODE(index.stat().st_mode),
                stat.S_IMODE((index / "run").stat().st_mode),
            }
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "parent").stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert modes == {"run.json": 0o600}
    assert index_modes == {0o700, 0o600}


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
            with pytest.raises(StorePermissionError, match="run"):
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
        store.save(_done("run", state=STATE))
    assert isinstance(caught.value.__cause__, OSError)
    monkeypatch.undo()
    assert _files(Path(store.path)) == set()


@pytest.mark.parametrize(
    ("exc", "error", "text"),
    [
        (PermissionError(13, "Permission denied"), StorePermissionError, "permission denied"),
        (OSError(errno.ENOLCK, "No locks available"), StoreUnavailable, "(ENOLCK)"),
        (OSError(errno.ESTALE, "Stale file handle"), StoreUnavailable, "(ESTALE)"),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), StoreUnavailable, "(ETIMEDOUT)"),
        (OSError(errno.EIO, "Input/output error"), StoreError, "Input/output error (EIO)"),
        (OSError("no errno"), StoreError, "no errno (None)"),
    ],
)
def test_os_errors_map_by_the_table(exc: OSError, error: type[StoreError], text: str) -> None:
    """Each OSError becomes the error its table row names, the path and errno in the text."""
    with pytest.raises(error) as caught, file_errors.translating("/srv/store", "run.json"):
        raise exc
    assert type(caught.value) is error
    assert str(caught.value).startswith("/srv/store/run.json: ")
    assert text in str(caught.value)
    assert caught.value.__cause__ is exc


def test_own_errors_pass_the_table_untouched() -> None:
    """A stepstone error raised inside a translated block (itself an OSError) is not wrapped."""
    ours = StorePermissionError("refusing")
    with pytest.raises(StorePermissionError) as caught, file_errors.translating("/srv/store"):
        raise ours
    assert caught.value is ours
    with pytest.raises(KeyError), file_errors.translating("/srv/store"):
        raise KeyError("not an OS error")


def test_the_package_keeps_its_public_names() -> None:
    """The module turned package still offers what callers import from it."""
    import stepstone.stores.file as package

    for name in package.__all__:
        assert getattr(package, name) is not None
    assert package.FileStore.__module__.startswith("stepstone.stores.file")
    assert "durability=full|none" in package.FORMS
    assert package.decode_name(package.encode_name("Run/ü")) == "Run/ü"


def test_the_package_modules_import_no_cycle() -> None:
    """Each module of the package imports only those before it: no cycle, none in functions."""
    import ast

    import stepstone.stores.file as package
    from parsing import parse

    folder = Path(package.__file__).parent
    graph: dict[str, set[str]] = {}
    for source in folder.glob("*.py"):
        tree = parse(source.read_text(), str(source))
        graph[source.stem] = {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        }
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = [
                    node
                    for node in ast.walk(function)
                    if isinstance(node, ast.ImportFrom) and node.level >= 1
                ]
                assert not inner, f"{source.name}: {function.name} imports inside a function"
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for imported in graph.get(module, set()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


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
    path.unlink()
    path.write_bytes(truncated)
    with FileStore(store.path) as other:
        with pytest.raises(CorruptCheckpoint, match="run.json"):
            other.load("run")
        with pytest.raises(CorruptCheckpoint, match="run.json"):
            other.save(Checkpoint("run", state=STATE, version=saved.version))
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
    monkeypatch.setattr(store_module.FileStore, "_max_bytes", 100)
    _write_raw(store, "run.json", b" " * 101)
    with pytest.raises(CorruptCheckpoint, match="over the 100-byte limit"):
        store.load("run")


def test_document_over_limit_is_refused(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint over the limit raises CheckpointTooLarge with size and limit; nothing stored."""
    monkeypatch.setattr(store_module.FileStore, "_max_bytes", 1000)
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
    assert doc["stepstone"] == 2
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
    assert _files(Path(store.path)) == {"run.json"}
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
    assert _files(Path(store.path)) == {"run.json"}
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


@pytest.mark.parametrize(("durability", "per_save", "per_delete"), [("full", 2, 1), ("none", 1, 0)])
def test_durability_controls_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str, per_save: int, per_delete: int
) -> None:
    """full fsyncs the file and the directory on each save; none fsyncs the file alone."""
    with open_store(f"file://{tmp_path}/store?durability={durability}") as store:
        calls: list[int] = []
        real_fsync = os.fsync

        def counting_fsync(fd: int) -> None:
            calls.append(fd)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", counting_fsync)
        first = store.save(_done("run", state=STATE))
        assert len(calls) == per_save
        store.save(_done("run", state=STATE, version=first.version))
        assert len(calls) == 2 * per_save
        store.delete("run")
        assert len(calls) == 2 * per_save + per_delete


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
    (tmp_path / "rel").mkdir(mode=0o700)
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
        except BaseException as exc:  # noqa: BLE001 - a thread's failure, re-raised in the test  # pragma: no cover
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


@pytest.mark.process
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


def test_waiter_on_a_replaced_document_starts_over(store: FileStore) -> None:
    """A save that waited on a document another save replaced re-reads the new one: CAS holds."""
    import fcntl

    first = store.save(Checkpoint("run", state={"v": 1}))
    directory = Path(store.path)
    held = os.open(directory / "run.json", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # plays another process's save in progress
    done = threading.Event()
    outcome: list[object] = []

    def save() -> None:
        try:
            outcome.append(store.save(Checkpoint("run", state={"v": 2}, version=first.version)))
        except BaseException as exc:  # noqa: BLE001 - the thread's outcome, checked below
            outcome.append(exc)
        done.set()

    thread = threading.Thread(target=save)
    thread.start()
    try:
        # The other process's save lands: a new document (new inode) under the run's name.
        doc = json.loads((directory / "run.json").read_bytes())
        doc["version"] = "2.000000000000"
        (directory / "other.tmp").write_text(json.dumps(doc))
        os.rename(directory / "other.tmp", directory / "run.json")
    finally:
        os.close(held)
    thread.join(30)
    assert done.is_set(), "the save hung on a replaced document's lock"
    assert isinstance(outcome[0], ConflictError), outcome
    loaded = store.load("run")
    assert loaded is not None
    assert loaded.version == "2.000000000000"


def test_delete_removes_document_and_marker(store: FileStore) -> None:
    """Delete unlinks the document and the run's index marker, and reports whether it existed."""
    store.save(Checkpoint("run", state=STATE))
    assert _markers(store) == {"run"}
    assert store.delete("run") is True
    assert _files(Path(store.path)) == set()
    assert _markers(store) == set()
    assert store.delete("run") is False
    assert _files(Path(store.path)) == set()


# -- trusting the directory ------------------------------------------------------------

OTHER_UID = 54321  # a user that is neither us nor root


def _chown_other(path: Path, *, link: bool = False) -> None:
    """Give ``path`` to another user; only root may, so skip where we are not root."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    if link:
        os.lchown(path, OTHER_UID, -1)
    else:
        os.chown(path, OTHER_UID, -1)


def test_world_writable_directory_is_refused(tmp_path: Path) -> None:
    """A store directory anyone can write is refused, naming the mode and the opt-out."""
    directory = tmp_path / "open"
    directory.mkdir()
    os.chmod(directory, 0o777)
    with pytest.raises(StorePermissionError, match=r"writable by every user.*0777.*trust=any"):
        FileStore(directory)
    with pytest.raises(StorePermissionError, match="trust=any"):
        open_store(f"file://{directory}")
    with open_store(f"file://{directory}?trust=any") as store:
        store.save(Checkpoint("run", state=STATE))
        assert "trust='any'" in repr(store)
    FileStore(directory, trust="any").close()


def test_sticky_store_directory_is_still_refused(tmp_path: Path) -> None:
    """The sticky bit does not save a world-writable store directory: anyone can add files."""
    directory = tmp_path / "sticky"
    directory.mkdir()
    os.chmod(directory, 0o1777)
    with pytest.raises(StorePermissionError, match="writable by every user"):
        FileStore(directory)


def test_world_writable_ancestor_needs_the_sticky_bit(tmp_path: Path) -> None:
    """A world-writable parent is refused unless sticky (as /tmp is), where ours stays ours."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "store").mkdir(mode=0o700)
    os.chmod(parent, 0o777)
    with pytest.raises(StorePermissionError, match=r"parent, on the way to it.*writable"):
        FileStore(parent / "store")
    os.chmod(parent, 0o1777)
    FileStore(parent / "store").close()


def test_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A store directory owned by another user (not root) is refused, naming the uid."""
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    _chown_other(directory)
    with pytest.raises(StorePermissionError, match=rf"owned by uid {OTHER_UID}.*trust=any"):
        FileStore(directory)
    FileStore(directory, trust="any").close()


def test_ancestor_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A directory on the way owned by another user could swap ours: refused."""
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    (parent / "store").mkdir(mode=0o700)
    _chown_other(parent)
    with pytest.raises(StorePermissionError, match=r"theirs, on the way to it, owned by uid"):
        FileStore(parent / "store")


def test_symlink_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A store reached through another user's symlink is refused; our own symlink is fine."""
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.symlink_to(target)
    FileStore(ours).close()
    theirs.symlink_to(target)
    _chown_other(theirs, link=True)
    with pytest.raises(StorePermissionError, match=rf"symlink owned by uid {OTHER_UID}"):
        FileStore(theirs)
    with pytest.raises(StorePermissionError, match="symlink owned"):
        FileStore(theirs / "sub")  # a symlink in the middle of the path counts too


def _bounded(what: str, fn: Callable[[], object], seconds: float = 10) -> object:
    """Return ``fn()`` (or raise what it raised); fail naming ``what`` if it hangs.

    A daemon thread, not SIGALRM: pytest-timeout owns the alarm, and a thread stuck
    forever on a FIFO must not keep the test process alive.
    """
    outcome: list[object] = []
    failure: list[BaseException] = []

    def call() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
            failure.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{what} hung for {seconds} s")
    if failure:
        raise failure[0]
    return outcome[0]


def test_fifo_at_a_run_path_never_blocks(
    store: FileStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO planted at a run's path is that run's CorruptCheckpoint; nothing waits on it."""
    store.save(Checkpoint("good", state=STATE))
    fifo = Path(store.path) / "run.json"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(CorruptCheckpoint, match="regular"):
        _bounded("load of a FIFO", lambda: store.load("run"))
    with pytest.raises(CorruptCheckpoint, match="regular"):
        _bounded("save over a FIFO", lambda: store.save(Checkpoint("run", state=STATE)))
    with pytest.raises(CorruptCheckpoint):
        _bounded(
            "save with a version over a FIFO",
            lambda: store.save(Checkpoint("run", state=STATE, version="1.abc")),
        )
    assert _bounded("list_runs beside a FIFO", lambda: list(store.list_runs())) == ["good"]
    infos = _bounded("list_info beside a FIFO", lambda: list(store.list_info()))
    assert [info.run_id for info in infos] == ["good"]  # type: ignore[attr-defined]
    assert "not a regular file" in caplog.text
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # left as it was
    assert _bounded("delete of a FIFO", lambda: store.delete("run")) is True
    assert not fifo.exists()


def test_symlink_at_a_run_path_is_not_followed(store: FileStore, tmp_path: Path) -> None:
    """A symlink named like a run is refused on load and save, skipped by listing."""
    elsewhere = tmp_path / "forged.json"
    store.save(Checkpoint("real", state=STATE))
    elsewhere.write_bytes((Path(store.path) / "real.json").read_bytes())
    link = Path(store.path) / "run.json"
    link.symlink_to(elsewhere)
    with pytest.raises(CorruptCheckpoint, match="symlink"):
        store.load("run")
    with pytest.raises(CorruptCheckpoint, match="symlink"):
        store.save(Checkpoint("run", state=STATE))
    assert list(store.list_runs()) == ["real"]
    assert store.delete("run") is True  # removes the link, never its target
    assert elsewhere.exists()


def test_directory_named_like_a_run_is_skipped(store: FileStore) -> None:
    """A directory named like a run (plain or hashed) never aborts listing or claimable."""
    store.save(Checkpoint("real", state=STATE))
    (Path(store.path) / "run.json").mkdir()
    (Path(store.path) / f"~{'0' * 64}.json").mkdir()
    assert list(store.list_runs()) == ["real"]
    assert [info.run_id for info in store.list_info()] == ["real"]
    assert [info.run_id for info in store.claimable(utcnow())] == ["real"]
    with pytest.raises(CorruptCheckpoint, match="directory"):
        store.load("run")
    with pytest.raises(CorruptCheckpoint, match="directory"):
        store.save(Checkpoint("run", state=STATE))
    with pytest.raises(CorruptCheckpoint, match="directory"):
        store.delete("run")
    assert (Path(store.path) / "run.json").is_dir()


# -- compare-and-swap delete -------------------------------------------------------------


def test_delete_with_expected_version(store: FileStore) -> None:
    """A stale expected version deletes nothing; the current one deletes; a missing run is False."""
    first = store.save(Checkpoint("run", state=STATE))
    second = store.save(Checkpoint("run", state=STATE, version=first.version))
    with pytest.raises(ConflictError, match="nothing was deleted"):
        store.delete("run", expected_version=first.version)
    assert store.load("run") is not None
    assert store.delete("run", expected_version=second.version) is True
    assert store.load("run") is None
    assert store.delete("run", expected_version=second.version) is False


def test_delete_sees_a_save_by_another_store(store: FileStore) -> None:
    """A version this store read is stale once another process saved: delete refuses."""
    first = store.save(Checkpoint("run", state=STATE))
    with FileStore(store.path) as other:
        other.save(Checkpoint("run", state={"n": 2}, version=first.version))
    with pytest.raises(ConflictError):
        store.delete("run", expected_version=first.version)


# -- the open-document cache keeps compare-and-swap exact ----------------------------------


def test_stale_cached_version_conflicts_after_another_save(store: FileStore) -> None:
    """A store that saved a run last still loses the CAS when another process saved since."""
    first = store.save(Checkpoint("run", state={"n": 1}))
    with FileStore(store.path) as other:
        loaded = other.load("run")
        assert loaded is not None
        other.save(Checkpoint("run", state={"n": 2}, version=loaded.version))
    with pytest.raises(ConflictError, match="expected version"):
        store.save(Checkpoint("run", state={"n": 3}, version=first.version))


def test_stale_cached_version_conflicts_after_delete_and_recreate(store: FileStore) -> None:
    """A run deleted and started again elsewhere is a new run: the old version never matches."""
    first = store.save(Checkpoint("run", state={"n": 1}))
    with FileStore(store.path) as other:
        other.delete("run")
        other.save(Checkpoint("run", state={"n": 9}))
    with pytest.raises(ConflictError):
        store.save(Checkpoint("run", state={"n": 2}, version=first.version))
    with pytest.raises(ConflictError):
        store.save(Checkpoint("run", state={"n": 2}))  # and it exists, so None loses too
    loaded = store.load("run")
    assert loaded is not None
    assert loaded.state == {"n": 9}


def test_create_race_has_one_winner(tmp_path: Path) -> None:
    """Two stores creating the same run: the second gets ConflictError, not an overwrite."""
    with FileStore(tmp_path / "s") as one, FileStore(tmp_path / "s") as two:
        one.save(Checkpoint("run", state={"by": 1}))
        with pytest.raises(ConflictError):
            two.save(Checkpoint("run", state={"by": 2}))
        loaded = two.load("run")
    assert loaded is not None
    assert loaded.state == {"by": 1}


def test_steady_save_makes_at_most_eight_system_calls(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saving a run this store saved last: flock, fstat, open, write, fsync x2, rename, close."""
    import fcntl

    cp = store.save(Checkpoint("run", state=STATE))
    calls: list[str] = []
    for module, names in (
        (
            os,
            (
                "open",
                "close",
                "read",
                "write",
                "fsync",
                "rename",
                "link",
                "unlink",
                "fstat",
                "stat",
                "lstat",
                "mkdir",
                "scandir",
                "urandom",
            ),
        ),
        (fcntl, ("flock", "fcntl")),
    ):
        for fn_name in names:
            real = getattr(module, fn_name)

            def counted(
                *args: object, _real: object = real, _name: str = fn_name, **kwargs: object
            ) -> object:
                calls.append(_name)
                return _real(*args, **kwargs)  # type: ignore[operator]

            monkeypatch.setattr(module, fn_name, counted)
    for _ in range(5):
        calls.clear()
        cp = store.save(cp)
        assert len(calls) <= 8, calls
    assert sorted(calls) == sorted(
        ["flock", "fstat", "open", "write", "fsync", "rename", "fsync", "close"]
    )
    with FileStore(store.path) as fresh:  # a resumed run: loaded, then saved
        calls.clear()
        loaded = fresh.load("run")
        assert loaded is not None
        assert len(calls) <= 4, calls  # open, fstat, read (and a close of what it replaces)
        calls.clear()
        fresh.save(loaded)
        assert len(calls) <= 8, calls


@pytest.mark.process
def test_forked_child_does_not_hold_the_parent_s_documents(store: FileStore) -> None:
    """A forked child closes the documents it inherited, so it never keeps a run locked."""
    store.save(Checkpoint("run", state=STATE))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write_end, str(len(store._handles.known)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read_end, 16) == b"0"
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


# -- the index of active runs ----------------------------------------------------------


def test_markers_follow_status(store: FileStore) -> None:
    """A run gets a marker when it becomes active and loses it when it comes to rest."""
    running = store.save(Checkpoint("run", state=STATE, total_steps=2))
    assert _markers(store) == {"run"}
    step = store.save(
        Checkpoint("run", step=0, step_names=("a",), total_steps=2, version=running.version)
    )
    assert _markers(store) == {"run"}
    store.save(
        Checkpoint("run", step=1, step_names=("a", "b"), total_steps=2, version=step.version)
    )
    assert _markers(store) == set()
    store.save(_done("finished"))
    assert _markers(store) == set()


def test_marker_is_written_before_the_save(store: FileStore) -> None:
    """Killed after writing the temp file, the new active run already has its marker."""

    def boom(name: str) -> None:
        if name == "file.after_temp_write":
            raise RuntimeError("injected")

    _hooks.install(boom)
    with pytest.raises(RuntimeError):
        store.save(Checkpoint("run", state=STATE))
    _hooks.install(None)
    assert _markers(store) == {"run"}
    assert store.load("run") is None
    assert store.claimable(utcnow()) == []
    assert _markers(store) == {"run"}  # young: its save may still be under way
    old = time.time() - 7200
    os.utime(Path(store.path) / ".active" / "run", (old, old))
    assert store.claimable(utcnow()) == []
    assert _markers(store) == set()  # a crash's leftover: removed


def test_claimable_reads_only_active_runs(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """claimable reports running runs and due queued/waiting ones, and never opens finished runs."""
    now = utcnow()
    from datetime import timedelta

    store.save(
        Checkpoint("running", state=STATE, total_steps=3, owner="w1", lease=30.0, renewed_at=now)
    )
    store.save(Checkpoint("queued", state=STATE, total_steps=3, queued=True))
    store.save(
        Checkpoint(
            "later",
            state=STATE,
            total_steps=3,
            waiting_for="timer",
            wake_at=now + timedelta(hours=1),
        )
    )
    store.save(
        Checkpoint(
            "due",
            state=STATE,
            total_steps=3,
            waiting_for="timer",
            wake_at=now - timedelta(seconds=1),
        )
    )
    for n in range(20):
        store.save(_done(f"finished-{n}"))
    opened: list[str] = []
    real_load = FileStore._load

    def spying(self: FileStore, name: str, run_id: str | None, keep: bool) -> object:
        opened.append(name)
        return real_load(self, name, run_id, keep)

    monkeypatch.setattr(FileStore, "_load", spying)
    found = store.claimable(utcnow() + timedelta(seconds=1))
    assert [(info.run_id, info.status) for info in found] == [
        ("running", "running"),
        ("queued", "queued"),
        ("due", "waiting"),
    ] or [(info.run_id, info.status) for info in found] == [
        ("running", "running"),
        ("due", "waiting"),
        ("queued", "queued"),
    ]
    assert not [name for name in opened if name.startswith("finished")]
    running = found[0]
    assert running.owner == "w1"
    assert running.version is not None
    assert running.due_at == now + timedelta(seconds=30)
    assert len(store.claimable(utcnow() + timedelta(seconds=1), limit=1)) == 2


def test_stale_marker_of_a_finished_run_is_cleaned(store: FileStore) -> None:
    """A marker left by a crash after a run finished is removed by the next claimable."""
    store.save(_done("run"))
    (Path(store.path) / ".active" / "run").write_text("running")
    assert store.claimable(utcnow()) == []
    assert _markers(store) == set()


def test_list_info_fills_version_owner_and_due_at(store: FileStore) -> None:
    """list_info reports each run's version, owner and due time."""
    saved = store.save(
        Checkpoint("run", state=STATE, total_steps=2, owner="me", lease=10.0, renewed_at=utcnow())
    )
    [info] = list(store.list_info())
    assert (info.version, info.owner, info.due_at) == (saved.version, "me", saved.due_at)


def test_capabilities_are_declared() -> None:
    """The class declares its durability levels, kill points and sync-only I/O."""
    assert FileStore.durability_levels == ("full", "none")
    assert dict(FileStore.kill_points) == {
        "file.after_temp_write": False,
        "file.after_rename": True,
        "file.before_dir_fsync": True,
    }
    assert FileStore.native_async is False


def test_close_under_concurrent_saves(tmp_path: Path) -> None:
    """close() while eight threads save: each call finishes or says the store is closed."""
    store = FileStore(tmp_path / "store")
    started = threading.Barrier(9)
    unexpected: list[BaseException] = []
    saved = [0] * 8

    def worker(index: int) -> None:
        cp: Checkpoint | None = None
        started.wait(timeout=30)
        while True:
            try:
                cp = store.save(
                    Checkpoint(
                        f"run-{index}",
                        state={"i": saved[index]},
                        version=None if cp is None else cp.version,
                    )
                )
                saved[index] += 1
            except StoreError as exc:
                if "closed" not in str(exc):
                    unexpected.append(exc)
                return
            except BaseException as exc:  # noqa: BLE001 - a thread's failure, reported below
                unexpected.append(exc)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    started.wait(timeout=30)
    deadline = time.monotonic() + 60
    while min(saved) < 3:
        assert time.monotonic() < deadline, f"saving threads stalled before close(): {saved}"
        time.sleep(0.001)
    store.close()
    for index, thread in enumerate(threads):
        thread.join(30)
        assert not thread.is_alive(), f"saving thread {index} hung after close()"
    assert unexpected == []
    with FileStore(tmp_path / "store") as reopened:
        for index in range(8):
            loaded = reopened.load(f"run-{index}")
            assert loaded is not None
            assert loaded.state["i"] in (saved[index] - 1, saved[index])
    assert {p.name for p in tmp_path.iterdir()} == {"store"}  # nothing written elsewhere


@pytest.mark.parametrize(
    "edit",
    [
        lambda doc: doc.update(updated_at="yesterday"),
        lambda doc: doc.update(wake_at="2026-01-01T00:00:00"),  # no time zone
        lambda doc: doc.update(step="one"),
    ],
    ids=["bad-timestamp", "naive-wake-at", "bad-step"],
)
def test_hand_edited_document_hides_no_other_run(store: FileStore, edit: object) -> None:
    """A hand-edited, unreadable document is its run's CorruptCheckpoint, never the others'."""
    store.save(Checkpoint("good", state=STATE))
    store.save(Checkpoint("bad", state=STATE))
    path = Path(store.path) / "bad.json"
    doc = json.loads(path.read_bytes())
    edit(doc)  # type: ignore[operator]
    path.unlink()
    path.write_text(json.dumps(doc))
    with FileStore(store.path) as fresh:
        with pytest.raises(CorruptCheckpoint, match="bad.json"):
            fresh.load("bad")
        assert [info.run_id for info in fresh.list_info()] == ["good"]
        assert [info.run_id for info in fresh.claimable(utcnow())] == ["good"]


def test_non_utf8_document_is_corrupt(store: FileStore) -> None:
    """Bytes that are not UTF-8 in a run's file are that run's CorruptCheckpoint."""
    store.save(Checkpoint("good", state=STATE))
    (Path(store.path) / "bad.json").write_bytes(b'{"stepstone":2,"run_id":"bad\xff"}')
    with pytest.raises(CorruptCheckpoint, match="bad.json"):
        store.load("bad")
    assert [info.run_id for info in store.list_info()] == ["good"]


def test_directory_of_an_older_release_is_read_and_cleaned(tmp_path: Path) -> None:
    """A store written by the release with lock files loads, saves, and delete drops the lock."""
    directory = tmp_path / "old"
    directory.mkdir(mode=0o700)
    document = (
        '{"stepstone":1,"run_id":"run","step":0,"step_names":["a"],"total_steps":3,'
        '"attempt":0,"failure":null,"created_at":"2026-11-30T10:04:42+00:00",'
        '"updated_at":"2026-11-30T10:04:42+00:00","version":"1.a27e8be498e3",\n'
        '"state":{"n":1}}\n'
    )
    (directory / "run.json").write_text(document)
    (directory / "run.lock").write_bytes(b"")
    with FileStore(directory) as store:
        loaded = store.load("run")
        assert loaded is not None
        assert loaded.version == "1.a27e8be498e3"
        saved = store.save(
            Checkpoint(
                "run",
                step=1,
                step_names=("a", "b"),
                state={"n": 2},
                total_steps=3,
                version=loaded.version,
            )
        )
        assert saved.version is not None
        assert saved.version.startswith("2.")
        assert store.delete("run", expected_version=saved.version) is True
    assert _files(directory) == set()
