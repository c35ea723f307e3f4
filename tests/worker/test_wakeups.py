"""Push wake-ups (issue 20): a worker resting its whole poll wakes when there is work.

Each test serves with a poll far longer than it waits (``SLOW_POLL``, the back-off
turned off and a ``Map`` parent's own fallback look pushed past it), so only a push can
make the run go on in time: ``start``, ``signal``, ``cancel`` and a child's completion
in this process ring the store's doorbell, and a ``Sleep`` wakes the worker that
suspended it at its due time. Each acts only once the worker has finished its last
look and begun to rest (the ``worker.resting`` hook point), so that look cannot find
the work by itself. No wall-clock limit is asserted: a test waits ``PROMPT`` seconds,
a sixth of the poll. With every ring dropped (``WakeupDropped``) the poll still
finishes the run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone._suspend
from fresh_stores import BACKENDS, fresh_config
from stepstone import (
    Map,
    Sleep,
    Step,
    Store,
    WaitFor,
    Worker,
    Workflow,
    _hooks,
    cancel,
    open_store,
    signal,
    start,
)
from stepstone._checkpoint import DUE_NOW, Signal, evolve, utcnow
from stepstone._store import Listener
from stepstone._wake import Doorbell, WakeupDropped, aannounce, announce
from stepstone.stores.memory import MemoryStore
from stepstone.testing._barrier import WAIT_TIMEOUT
from stepstone.worker import _claims
from stepstone.worker._claims import next_idle
from waiting import status_of, until

#: The poll of every worker that must be woken by a push: far beyond ``PROMPT``.
SLOW_POLL = 60.0
#: Seconds a test waits for what a push makes happen at once.
PROMPT = 10.0
State = dict[str, Any]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend, one object shared by the test and its worker."""
    with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    """``serve`` (threads) or ``aserve`` (tasks)."""
    return str(request.param)


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fallback that could stand in for a push within ``PROMPT``.

    The back-off (quick looks after activity when the store has no listener) starts at
    the poll, and a ``Map`` parent's own timer (its look at its children even if none
    told it) is ten minutes away.
    """
    monkeypatch.setattr(_claims, "_QUICK", SLOW_POLL)
    monkeypatch.setattr(stepstone._suspend, "CHILD_POLL", 600.0)


class Serving:
    """A ``Worker`` serving ``store`` (the test's own object) in a thread, sync or async.

    ``rested(n)`` waits until the worker began a rest after its ``n``-th run ended:
    from then on only a wake-up (a ring, a due time, the poll) makes it look again.
    """

    def __init__(
        self,
        store: Store,
        flows: list[Workflow],
        mode: str,
        poll: float,
        also: Callable[[str], None] | None = None,
    ) -> None:
        self.worker = Worker(store, flows, poll=poll, lease=30)
        self.mode = mode
        self.also = also  # a test's own hook, called at every point after ours
        self.error: BaseException | None = None
        self.rests: list[int] = []  # ``worker.completed`` as each rest began
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, name=f"{mode} worker")
        self.previous = _hooks.installed()

    def _main(self) -> None:
        try:
            if self.mode == "async":
                asyncio.run(self.worker.aserve())
            else:
                self.worker.serve()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread by __exit__
            self.error = exc

    def hook(self, point: str) -> None:
        if point == "worker.resting":
            with self.lock:
                self.rests.append(self.worker.completed)
        if self.previous is not None:
            self.previous(point)
        if self.also is not None:
            self.also(point)

    def rested(self, ended: int) -> None:
        """Wait until a rest began after ``ended`` runs had ended on this worker."""

        def resting() -> bool:
            with self.lock:
                return any(done >= ended for done in self.rests)

        until(f"the worker to rest after {ended} runs ended", resting, WAIT_TIMEOUT)

    def __enter__(self) -> Serving:
        _hooks.install(self.hook)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(WAIT_TIMEOUT)
        _hooks.install(self.previous)
        assert not self.thread.is_alive(), f"the {self.mode} worker did not stop"
        if self.error is not None:
            raise self.error


def _marker(event: threading.Event) -> Step:
    def mark(state: State) -> None:
        event.set()

    return Step("mark", mark)


# --- pushes in this process -----------------------------------------------------------


@pytest.mark.usefixtures("slow")
def test_start_wakes_a_resting_worker(store: Store, mode: str) -> None:
    """A run started in the worker's process is claimed at once, not at the next poll."""
    ran = threading.Event()
    flow = Workflow("started", [_marker(ran)])
    with Serving(store, [flow], mode, SLOW_POLL) as serving:
        serving.rested(0)
        start(store, flow, "r-start")
        assert ran.wait(PROMPT), "start did not wake the worker (it waits for its poll)"


@pytest.mark.usefixtures("slow")
def test_signal_wakes_a_resting_worker(store: Store, mode: str) -> None:
    """A signal to a run waiting for it resumes the run at once, not at the next poll."""
    ran = threading.Event()
    flow = Workflow("signalled", [WaitFor("got", "go"), _marker(ran)])
    with Serving(store, [flow], mode, SLOW_POLL) as serving:
        start(store, flow, "r-signal")
        until(
            "the run to wait for its signal",
            lambda: status_of(store, "r-signal") == "waiting",
            PROMPT,
        )
        serving.rested(1)
        assert signal(store, "r-signal", "go", {"ok": True})
        assert ran.wait(PROMPT), "the signal did not wake the worker (it waits for its poll)"


@pytest.mark.usefixtures("slow")
def test_a_childs_completion_wakes_its_parent(store: Store, mode: str) -> None:
    """A ``Map`` claims its children at once and resumes when the last one ends."""
    ran = threading.Event()
    child = Workflow("kid", [Step("square", lambda s: {"y": s["x"] * s["x"]})])
    parent = Workflow(
        "fan",
        [Map("kids", child, lambda s: [{"x": x} for x in range(3)]), _marker(ran)],
    )
    with Serving(store, [parent], mode, SLOW_POLL) as serving:
        serving.rested(0)
        start(store, parent, "r-map")
        assert ran.wait(PROMPT), "the Map's children or its parent waited for the poll"
    final = store.load("r-map")
    assert final is not None and final.status == "done", final
    assert [kid["y"] for kid in final.state["kids"]] == [0, 1, 4]


@pytest.mark.usefixtures("slow")
def test_cancelling_a_child_wakes_its_parent(store: Store, mode: str) -> None:
    """A child cancelled while its parent waits fails the parent at once, not at the poll."""
    child = Workflow("held", [WaitFor("got", "go")])
    parent = Workflow("fan-held", [Map("kids", child, lambda s: [{}])])
    with Serving(store, [parent], mode, SLOW_POLL) as serving:
        start(store, parent, "r-parent")
        kid = "r-parent/kids/0"
        until("the child to wait", lambda: status_of(store, kid) == "waiting", PROMPT)
        until("the parent to wait", lambda: status_of(store, "r-parent") == "waiting", PROMPT)
        serving.rested(2)  # the parent and the child each suspended on this worker
        cancel(store, kid)
        until("the parent to fail", lambda: status_of(store, "r-parent") == "failed", PROMPT)
    final = store.load("r-parent")
    assert final is not None and final.failure is not None
    assert "cancelled" in final.failure.message, final.failure


@pytest.mark.usefixtures("slow")
def test_a_sleep_wakes_the_worker_that_suspended_it(store: Store, mode: str) -> None:
    """A ``Sleep`` resumes at its due time, which the worker remembers, not at the poll."""
    ran = threading.Event()
    flow = Workflow("napper", [Sleep("nap", duration=0.3), _marker(ran)])
    with Serving(store, [flow], mode, SLOW_POLL) as serving:
        serving.rested(0)
        start(store, flow, "r-sleep")
        assert ran.wait(PROMPT), "the Sleep waited for the worker's poll"
    final = store.load("r-sleep")
    assert final is not None and final.status == "done"


def test_dropped_rings_only_delay(store: Store, mode: str) -> None:
    """With every ring dropped (``WakeupDropped``) the poll still resumes the run."""
    ran = threading.Event()
    drops: list[str] = []
    flow = Workflow("unrung", [WaitFor("got", "go"), _marker(ran)])

    def drop(point: str) -> None:
        if point == "wake.ring":
            drops.append(point)
            raise WakeupDropped

    with Serving(store, [flow], mode, 0.2, also=drop):
        start(store, flow, "r-unrung")
        until("the run to wait", lambda: status_of(store, "r-unrung") == "waiting", WAIT_TIMEOUT)
        signal(store, "r-unrung", "go")
        assert ran.wait(WAIT_TIMEOUT), "a dropped ring stranded the run"
    assert drops, "no ring was made, so none was dropped"


# --- the listener a store may give -----------------------------------------------------


class _Heard:
    """A listener that counts how often it is closed."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class _Listening(MemoryStore):
    """A memory store whose ``listen`` hands back a listener the test rings and watches."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.rings: list[Callable[[], None]] = []
        self.listener = _Heard()

    def listen(self, ring: Callable[[], None]) -> Listener | None:
        if self.fail:
            raise _Unprintable  # its text cannot be read for the warning either
        self.rings.append(ring)
        return self.listener


@pytest.mark.parametrize("fail", [False, True], ids=["listens", "cannot-listen"])
def test_worker_closes_its_listener_and_survives_one_that_fails(
    mode: str, fail: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker closes the listener it opened when it stops; one that fails to open
    leaves it serving, on the poll."""
    monkeypatch.setattr(_claims, "_QUICK", SLOW_POLL)
    store = _Listening(fail=fail)
    ran = threading.Event()
    flow = Workflow("heard", [WaitFor("got", "go"), _marker(ran)])
    with Serving(store, [flow], mode, 0.2 if fail else SLOW_POLL) as serving:
        start(store, flow, "r-heard")
        until("the run to wait", lambda: status_of(store, "r-heard") == "waiting", PROMPT)
        serving.rested(1)
        if fail:
            signal(store, "r-heard", "go")
        else:
            # "worker.resting" fires as the look that opens the listener ends, before the
            # listener is opened: wait for it (a loaded run saw the rings still empty).
            until("the idle worker to open its listener", lambda: len(store.rings) == 1, PROMPT)
            # Written as another process would: no doorbell rung, only the listener.
            cp = store.load("r-heard")
            assert cp is not None
            store.save(evolve(cp, signals=(Signal("go", "s1", None, utcnow()),), wake_at=DUE_NOW))
            store.rings[0]()
        assert ran.wait(PROMPT), "the worker did not resume the run"
    assert store.listener.closed == (0 if fail else 1)


# --- the doorbell ---------------------------------------------------------------------


class _Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("no text")


def test_a_raising_callback_does_not_stop_the_ring() -> None:
    """Every callback is called though others raise (one's exception cannot even print)."""
    bell = Doorbell()
    called: list[str] = []

    def boom() -> None:
        called.append("boom")
        raise RuntimeError("listener broke")

    def unprintable() -> None:
        called.append("unprintable")
        raise _Unprintable

    bell.subscribe(boom)
    bell.subscribe(unprintable)
    bell.subscribe(lambda: called.append("last"))
    bell.ring()  # raises nothing
    assert called == ["boom", "unprintable", "last"]


def test_unsubscribe_removes_only_its_own_subscription() -> None:
    """The same callback subscribed twice is called twice; each unsubscribe removes one."""
    bell = Doorbell()
    called: list[int] = []

    def note() -> None:
        called.append(1)

    first = bell.subscribe(note)
    bell.subscribe(note)
    first()
    first()  # a second call changes nothing
    bell.ring()
    assert called == [1]


def test_announce_rings_and_swallows_the_stores_error() -> None:
    """``announce`` rings this process's workers even when the store cannot notify others."""

    class Mute(MemoryStore):
        def announce(self) -> None:
            raise _Unprintable

    store = Mute()
    rung = threading.Event()
    store.doorbell.subscribe(rung.set)
    announce(store)
    assert rung.is_set()
    asyncio.run(_aannounce(store))


async def _aannounce(store: Store) -> None:
    await aannounce(store)


def test_a_dropped_ring_reaches_no_callback() -> None:
    """A hook raising ``WakeupDropped`` at ``wake.ring`` drops that ring whole."""
    bell = Doorbell()
    rung = threading.Event()
    bell.subscribe(rung.set)
    previous = _hooks.installed()

    def drop(point: str) -> None:
        if point == "wake.ring":
            raise WakeupDropped

    _hooks.install(drop)
    try:
        bell.ring()
    finally:
        _hooks.install(previous)
    assert not rung.is_set()
    bell.ring()
    assert rung.is_set()


def test_the_back_off_doubles_to_the_poll_and_restarts_on_activity() -> None:
    """Without a listener: 50 ms after activity, doubled per idle look, never past the poll."""
    rests = [0.05]
    for _ in range(7):
        rests.append(next_idle(rests[-1], False, 1.0))
    assert rests == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert next_idle(1.0, True, 1.0) == 0.05
    assert next_idle(0.05, True, 0.01) == 0.01  # a poll shorter than the quick look wins
    assert next_idle(0.0, False, 0.0) == 0.0  # poll=0 stays a busy loop, as asked
