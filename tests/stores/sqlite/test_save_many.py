"""``save_many`` on SQLite: the saves of one call share one transaction and one commit.

The contract (each save's own outcome, a lost swap writing none of its pieces, on every
backend) is ``StoreContract``'s; here, what SQLite adds: one ``COMMIT`` for the whole
call, the call kept in one batch when it queues behind another commit, a waiter
interrupted while queued taking all of its saves out, and a process killed inside the
transaction leaving none of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Checkpoint, _hooks
from stepstone.stores._group import GroupCommit, Pending
from stepstone.stores.sqlite import SQLiteStore
from waiting import until

REPO = Path(__file__).resolve().parents[3]
WAIT = 30.0  # seconds any wait below allows before failing, naming what hung


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(str(tmp_path / "many.db")) as s:
        yield s
    _hooks.install(None)


def _commits(store: SQLiteStore) -> list[str]:
    """Record every commit the store makes from now on (the ``sqlite.committed`` hook)."""
    seen: list[str] = []
    _hooks.install(lambda point: seen.append(point) if point == "sqlite.committed" else None)
    return seen


def test_one_call_is_one_transaction_and_one_commit(store: SQLiteStore) -> None:
    first = store.save(Checkpoint("old", state={"v": 1}))
    commits = _commits(store)
    outcomes = store.save_many(
        [
            *(Checkpoint(f"r{n}", state={"n": n}) for n in range(8)),
            Checkpoint("old", step=1, state={"v": 2}, version=first.version),
            Checkpoint("long", state={"text": "y" * 300_000}),  # pieces, in the same commit
        ]
    )
    assert all(isinstance(o, Checkpoint) for o in outcomes), outcomes
    assert commits == ["sqlite.committed"], f"{len(commits)} commits for one save_many"
    assert store._group is not None and store._group.batch_sizes[10] == 1


def test_a_call_queued_behind_a_commit_stays_in_one_batch(store: SQLiteStore) -> None:
    """Queued while another save commits, the call's saves are the next batch, whole."""
    group = store._group
    assert group is not None
    held, release = threading.Event(), threading.Event()

    def hook(point: str) -> None:
        if point == "sqlite.in_transaction" and threading.current_thread().name == "lone":
            held.set()
            assert release.wait(WAIT), "the test never released the lone save"

    _hooks.install(hook)
    lone = threading.Thread(
        target=store.save, args=(Checkpoint("lone", state={}),), name="lone", daemon=True
    )
    lone.start()
    assert held.wait(WAIT), "the lone save never reached its transaction"
    answer: list[Any] = []
    many = threading.Thread(
        target=lambda: answer.append(
            store.save_many([Checkpoint(f"q{n}", state={"n": n}) for n in range(5)])
        ),
        daemon=True,
    )
    many.start()
    until("the five saves to queue", lambda: len(group._queue) == 5)
    release.set()
    lone.join(WAIT)
    many.join(WAIT)
    assert not lone.is_alive() and not many.is_alive(), "a save hung"
    assert all(isinstance(o, Checkpoint) for o in answer[0]), answer
    assert group.batch_sizes[5] == 1, dict(group.batch_sizes)


def test_a_caller_interrupted_while_queued_takes_all_its_saves_out() -> None:
    """Interrupted before its batch began, none of the call's saves lands; the group
    goes on (the next save commits at once), never waiting for a leader that left."""
    executed: list[list[str]] = []
    gate = threading.Event()

    def execute(batch: list[Pending]) -> None:
        executed.append([item.sql for item in batch])
        if batch[0].sql == "lone":
            assert gate.wait(WAIT), "the test never opened the gate"
        for item in batch:
            item.stored = 1

    group = GroupCommit(execute, "test")
    lone = threading.Thread(target=group.submit, args=(Pending("lone", None),), daemon=True)
    lone.start()
    until("the lone save to lead", lambda: executed == [["lone"]])
    mine = [Pending(f"mine{n}", None) for n in range(3)]
    previous = signal.signal(signal.SIGALRM, _interrupt)

    def interrupt_once_queued() -> None:
        until("the three to queue", lambda: len(group._queue) == 3)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)

    try:
        threading.Thread(target=interrupt_once_queued, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            group.submit_many(mine)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert group._queue == [], "the interrupted saves stayed queued"
    gate.set()
    lone.join(WAIT)
    assert not lone.is_alive(), "the lone save hung"
    after = Pending("after", None)
    done = threading.Thread(target=group.submit, args=(after,), daemon=True)
    done.start()
    done.join(WAIT)
    assert not done.is_alive(), "the group waited for a leader that left"
    assert executed == [["lone"], ["after"]], executed
    assert all(item.stored is None for item in mine)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from stepstone import Checkpoint, _hooks
    from stepstone.stores.sqlite import SQLiteStore

    store = SQLiteStore(sys.argv[1])
    kept = store.load("kept")

    def hook(point):
        if point == "sqlite.in_transaction":
            os.kill(os.getpid(), signal.SIGKILL)  # every statement run, nothing committed

    _hooks.install(hook)
    store.save_many([
        Checkpoint("kept", step=1, state={"v": 2}, version=kept.version),
        *(Checkpoint(f"made{n}", state={"n": n, "pad": "p" * 200_000}) for n in range(4)),
    ])
    print("not killed", flush=True)
    """
)


@pytest.mark.crash
def test_sigkill_inside_the_transaction_leaves_none_of_the_saves(tmp_path: Path) -> None:
    path = str(tmp_path / "killed.db")
    with SQLiteStore(path) as s:
        kept = s.save(Checkpoint("kept", state={"v": 1}))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        code = child.wait(WAIT)
    finally:
        child.kill()
    assert code == -signal.SIGKILL, f"the child was not killed mid-transaction ({code})"
    # Reopened in this process, as a fresh process would: the old record, nothing new.
    with SQLiteStore(path) as s:
        assert s.load("kept") == kept
        assert [s.load(f"made{n}") for n in range(4)] == [None] * 4
        assert all(s.piece_keys(f"made{n}") == [] for n in range(4))
