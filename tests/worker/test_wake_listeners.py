"""Cross-process push wake-ups: each backend's ``Store.listen`` hears other processes.

PostgreSQL (``LISTEN``/``NOTIFY``), SQLite (``data_version``, woken by inotify) and the
file store (inotify on its directory). Another *process* writes work, reopening the store
from its config string, and the listener of this process rings. Needs PostgreSQL at
127.0.0.1:5432 (database ``test``); without it those tests skip, or fail under CI.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from fresh_stores import POSTGRES_URL
from stepstone import Workflow, open_store
from stepstone._checkpoint import Checkpoint
from stepstone._store import Store
from stepstone.stores._sql.listen_pg import APPLICATION_NAME, PostgresListener
from stepstone.stores._sql.listen_sqlite import SQLiteListener
from stepstone.stores.file import _notify
from stepstone.stores.postgres import PostgresStore
from stepstone.testing import backend_unavailable

PG = POSTGRES_URL
WAIT = 30.0  # generous: a ring takes milliseconds, a loaded CI machine may take seconds
LINUX = sys.platform.startswith("linux")

# The other process: reopen the store from its config string and make work there.
CHILD = """
import sys
import stepstone
from stepstone import Workflow, open_store

config, action, run_id = sys.argv[1:4]
with open_store(config) as store:
    if action == "start":
        stepstone.start(store, Workflow("nothing", []), run_id)
    else:
        stepstone.signal(store, run_id, "go", 1)
"""


def _in_other_process(config: str, action: str, run_id: str) -> None:
    subprocess.run(
        [sys.executable, "-c", CHILD, config, action, run_id],
        check=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _pg_admin() -> Any:
    try:
        import psycopg

        return psycopg.connect(PG, autocommit=True, connect_timeout=3)
    except Exception as exc:  # noqa: BLE001 - a server that fails in any way is unavailable
        backend_unavailable(f"postgresql on 127.0.0.1: {type(exc).__name__}: {exc}")


@pytest.fixture
def pg_admin() -> Iterator[Any]:
    conn = _pg_admin()
    yield conn
    conn.close()


@pytest.fixture
def pg_config(pg_admin: Any) -> Iterator[str]:
    table = f"w_{uuid.uuid4().hex}"
    yield f"{PG}?table={table}&connect_timeout=2"
    pg_admin.execute(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")


@pytest.fixture(params=["postgresql", "sqlite", "file"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store's config string, for each backend that pushes wake-ups."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_config"))
    if not LINUX and request.param == "file":
        pytest.skip("the file store listens with inotify, Linux only")  # not a backend skip
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'wake.db'}"
    return f"file://{tmp_path / 'runs'}"


class Bell:
    """A ``ring`` callback that counts, and fails the test if called after ``close``."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.count = 0
        self.closed = False
        self.late = 0

    def __call__(self) -> None:
        if self.closed:
            self.late += 1
        self.count += 1
        self.event.set()

    def expect(self, what: str) -> None:
        assert self.event.wait(WAIT), f"no ring within {WAIT} s after {what}"
        self.event.clear()


def _listen(store: Store, bell: Callable[[], None]) -> Any:
    listener = store.listen(bell)
    assert listener is not None, f"{store!r} returned no listener"
    return listener


def _settle(bell: Bell) -> None:
    """Swallow the rings already under way (PostgreSQL rings once when it listens)."""
    while bell.event.wait(0.3):
        bell.event.clear()


def _close(listener: Any, bell: Bell) -> None:
    listener.close()
    bell.closed = True
    listener.thread.join(WAIT)
    assert not listener.thread.is_alive(), f"{listener!r}: thread still running after close"


@pytest.mark.process
def test_start_in_other_process_rings(config: str) -> None:
    """A run started by another process wakes this process's listener."""
    with open_store(config) as store:
        bell = Bell()
        listener = _listen(store, bell)
        try:
            _settle(bell)
            _in_other_process(config, "start", "from-afar")
            bell.expect("another process started a run")
        finally:
            _close(listener, bell)
        assert store.load("from-afar") is not None


@pytest.mark.process
def test_signal_in_other_process_rings(config: str) -> None:
    """A signal sent by another process to a run waiting for it wakes the listener."""
    with open_store(config) as store:
        store.save(Checkpoint("waits", total_steps=1, waiting_for="signal go"))
        bell = Bell()
        listener = _listen(store, bell)
        try:
            _settle(bell)
            _in_other_process(config, "signal", "waits")
            bell.expect("another process signalled a run")
        finally:
            _close(listener, bell)


def test_close_is_prompt_and_no_ring_after_close(config: str) -> None:
    """close() ends the thread, and no ring reaches the callback once it returned."""
    with open_store(config) as store, open_store(config) as writer:
        bell = Bell()
        listener = _listen(store, bell)
        stop = threading.Event()

        def write() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                stepstone.start(writer, Workflow("nothing", []), f"busy-{n}")

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        try:
            bell.expect("another store object kept starting runs")
            _close(listener, bell)
            listener.close()  # twice is allowed
        finally:
            stop.set()
            thread.join(WAIT)
        assert bell.late == 0, f"{bell.late} rings after close() returned"


# --- PostgreSQL -------------------------------------------------------------------------


def _wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT} s"
        time.sleep(0.02)


def test_postgres_reconnects_after_its_connection_is_killed(pg_config: str, pg_admin: Any) -> None:
    """A listener whose backend is terminated reconnects, rings, and hears NOTIFY again."""
    with open_store(pg_config) as store:
        assert isinstance(store, PostgresStore)
        bell = Bell()
        listener = store.listen(bell)
        assert isinstance(listener, PostgresListener)
        try:
            bell.expect("the listener first listened")
            pid = listener.backend_pid
            assert pid is not None
            rows = pg_admin.execute(
                "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchall()
            assert rows == [(APPLICATION_NAME,)]
            _settle(bell)
            pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            bell.expect("its connection was killed (the ring after reconnecting)")
            _wait_for("a new listening connection", lambda: listener.backend_pid not in (None, pid))
            _settle(bell)
            _in_other_process(pg_config, "start", "after-reconnect")
            bell.expect("another process started a run, after the reconnect")
        finally:
            _close(listener, bell)


def test_postgres_listener_skips_its_own_stores_notify(pg_config: str) -> None:
    """NOTIFY sent by the listening store object itself does not ring (its doorbell did)."""
    with open_store(pg_config) as store, open_store(pg_config) as other:
        bell = Bell()
        listener = _listen(store, bell)
        try:
            bell.expect("the listener first listened")
            _settle(bell)
            store.announce()
            # A ring would come within milliseconds; 2 s of silence means none is coming.
            assert not bell.event.wait(2.0), "rang for the listening store's own NOTIFY"
            other.announce()
            bell.expect("another store object announced")
        finally:
            _close(listener, bell)


def _pg_listener(store: PostgresStore, bell: Bell) -> PostgresListener:
    """A listener as ``store.listen`` makes it, not started yet."""
    return PostgresListener(
        bell,
        where=store.where,
        table=store.table,
        connect_args=store._connect_args,
        read_timeout=store.read_timeout,
        scrub=store._scrub,
    )


def test_postgres_close_is_prompt_when_the_server_never_answers(pg_config: str) -> None:
    """close() returns at once, and the thread ends, while connecting to a silent server."""
    with socket.socket() as server, open_store(pg_config) as store:
        assert isinstance(store, PostgresStore)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        bell = Bell()
        listener = _pg_listener(store, bell)
        listener._connect_args["port"] = server.getsockname()[1]
        listener.start()
        server.settimeout(WAIT)
        accepted, _ = server.accept()  # the listener is connecting, and will hear nothing
        with accepted:
            started = time.monotonic()
            listener.close()
            took = time.monotonic() - started
            bell.closed = True
            # Not a wall-clock limit on the machine: close waits at most CLOSE_WAIT (2 s) by
            # design, whatever the server does.
            assert took < 10, f"close() took {took:.1f} s"
            listener.thread.join(WAIT)  # the connect ends by connect_timeout (2 s here)
            assert not listener.thread.is_alive(), "listener thread still running"
        assert bell.count == 0, "a listener that never connected rang"


def test_postgres_listener_logs_no_password(
    pg_config: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener that cannot connect logs the store's address, never the password."""
    secret = "s3cr3t-Pa55word-wake"
    with open_store(pg_config) as store:
        assert isinstance(store, PostgresStore)
        bell = Bell()
        listener = _pg_listener(store, bell)
        listener._connect_args["password"] = secret
        listener._connect_args["user"] = "nosuchrole"
        with caplog.at_level("DEBUG", logger="stepstone"):
            listener.start()
            _wait_for("a logged connection failure", lambda: "not listening" in caplog.text)
            _close(listener, bell)
        assert secret not in caplog.text
        assert store.where in caplog.text


# --- SQLite -----------------------------------------------------------------------------


@pytest.mark.process
def test_sqlite_without_inotify_polls_data_version(tmp_path: Path) -> None:
    """Without inotify the SQLite listener still rings, polling data_version."""
    config = f"sqlite:///{tmp_path / 'poll.db'}"
    with open_store(config) as store:
        bell = Bell()
        listener = SQLiteListener(str(tmp_path / "poll.db"), 1000, bell, inotify=False)
        listener.start()
        try:
            _in_other_process(config, "start", "polled")
            bell.expect("another process started a run (polling)")
        finally:
            _close(listener, bell)
        assert store.load("polled") is not None


# --- file store -------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.skipif(not LINUX, reason="inotify: Linux only")
def test_file_listener_watches_the_directory_it_opened(tmp_path: Path) -> None:
    """A directory swapped in at the store's path (a symlink) is not what is watched."""
    real, other = tmp_path / "runs", tmp_path / "elsewhere"
    with open_store(f"file://{real}") as store:
        bell = Bell()
        listener = _listen(store, bell)
        try:
            moved = tmp_path / "moved"
            real.rename(moved)
            with open_store(f"file://{other}") as decoy:
                real.symlink_to(other)
                stepstone.start(decoy, Workflow("nothing", []), "decoy")
            _in_other_process(f"file://{moved}", "start", "real")
            bell.expect("another process started a run in the directory the store opened")
            assert (moved / "real.json").exists()
        finally:
            _close(listener, bell)
        # Only the real directory's saves rang: the decoy's happened before "real" and
        # would have rung the event already; the count is 1 only if none did.
        assert bell.count == 1, f"{bell.count} rings; the decoy directory rang"


def test_file_listener_is_none_without_inotify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where inotify is missing the file store returns no listener (the worker polls)."""
    monkeypatch.setattr(_notify, "open_inotify", lambda: None)
    with open_store(f"file://{tmp_path / 'runs'}") as store:
        assert store.listen(lambda: None) is None
