"""Flow control of whole runs (issue 37): workflow and dynamic keys, priority, workers.

A run started with keys holds them from its claim to its end; a run whose key is full
is parked ``waiting`` on ``limit:<key>`` and woken by the release (no poll needed);
``priority`` and age decide which waiter a release hands its slot to.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    ConfigError,
    Limit,
    LimitReached,
    Map,
    Step,
    Store,
    Suspended,
    Worker,
    Workflow,
    limit_usage,
    open_store,
    run,
    set_limit,
    start,
    workflow,
)
from stepstone._checkpoint import Checkpoint
from stepstone._flow import _bucket
from stepstone.testing._barrier import WAIT_TIMEOUT

State = dict[str, Any]


@pytest.fixture(params=("memory", "file", "sqlite"))
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    config = {
        "memory": f"memory://flow-runs-{uuid.uuid4().hex}",
        "file": f"file://{tmp_path}/runs",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
    }[request.param]
    with open_store(config) as opened:
        yield opened


def test_start_records_keys_and_priority(local: Store) -> None:
    """start(keys=, priority=) records the run's keys (name:value) and priority."""
    set_limit(local, Limit("tenant", concurrency=2))
    flow = Workflow("w", [Step("s", lambda s: None)], limits=[Limit("api", concurrency=4)])
    start(local, flow, "r", keys={"tenant": "acme"}, priority=3)
    cp = local.load("r")
    assert cp is not None and cp.flow is not None
    assert cp.flow["keys"] == ["api", "tenant:acme"] and cp.flow["priority"] == 3
    plain = Workflow("plain", [Step("s", lambda s: None)])
    start(local, plain, "p")
    assert local.load("p").flow is None  # type: ignore[union-attr]


def test_start_refuses_bad_keys(local: Store) -> None:
    """An unknown key, a non-str value or a bad priority is a ConfigError; nothing stored."""
    flow = Workflow("w", [Step("s", lambda s: None)])
    with pytest.raises(ConfigError, match="unknown limit key 'tenant:acme'"):
        start(local, flow, "r", keys={"tenant": "acme"})
    with pytest.raises(ConfigError, match="non-empty str"):
        start(local, flow, "r", keys={"tenant": 3})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="priority"):
        start(local, flow, "r", priority=1.5)  # type: ignore[arg-type]
    assert local.load("r") is None


def test_reject_policy_refuses_at_start(local: Store) -> None:
    """A full key whose policy is reject refuses the start with LimitReached."""
    set_limit(local, Limit("solo", concurrency=1, policy="reject"))
    local.save(Checkpoint("holder", total_steps=2, owner="w:elsewhere:1:m.0:x", epoch=1))
    from stepstone._flow import _ops
    from stepstone._flow._api import drive

    assert drive(local, _ops.acquire("solo", "holder", 1, 0))[1].granted
    flow = Workflow("w", [Step("s", lambda s: None)], limits=["solo"])
    with pytest.raises(LimitReached, match="solo"):
        start(local, flow, "r")
    assert local.load("r") is None


def test_a_tenant_waits_for_its_own_key_only(local: Store) -> None:
    """Tenant acme's second run parks while its first runs; tenant other's runs at once."""
    set_limit(local, Limit("tenant", concurrency=1))
    entered = threading.Event()
    release = threading.Event()

    def work(state: State) -> State:
        if state.get("block"):
            entered.set()
            assert release.wait(WAIT_TIMEOUT), "the test never released the first run"
        return {"done": True}

    flow = Workflow("tenants", [Step("work", work)])
    start(local, flow, "a1", {"block": True}, keys={"tenant": "acme"})
    start(local, flow, "a2", keys={"tenant": "acme"})
    start(local, flow, "o1", keys={"tenant": "other"})
    first = threading.Thread(target=run, args=("a1", flow, local))
    first.start()
    assert entered.wait(WAIT_TIMEOUT), "the first run never started"
    with pytest.raises(Suspended, match="limit:tenant:acme"):
        run("a2", flow, local)
    assert local.load("a2").status == "waiting"  # type: ignore[union-attr]
    assert run("o1", flow, local) == {"done": True}
    release.set()
    first.join(WAIT_TIMEOUT)
    usage = limit_usage(local, "tenant:acme")
    assert usage is not None and usage.holders == {"a2": -1}  # handed to the waiter
    assert run("a2", flow, local) == {"done": True}
    assert limit_usage(local, "tenant:acme").holders == {}  # type: ignore[union-attr]


def test_a_worker_runs_every_run_through_a_full_key(local: Store) -> None:
    """A worker with 4 threads runs 12 runs of a concurrency-2 key: never 3 at once."""
    set_limit(local, Limit("pool", concurrency=2))
    lock = threading.Lock()
    inside = [0]
    most = [0]

    def work(state: State) -> State:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        threading.Event().wait(0.02)  # linger, so that a third holder would overlap
        with lock:
            inside[0] -= 1
        return {"done": True}

    flow = Workflow("pooled", [Step("work", work)], limits=["pool"])
    ids = [f"r{i}" for i in range(12)]
    for run_id in ids:
        start(local, flow, run_id)
    worker = Worker(local, [flow], concurrency=4, poll=0.05)
    thread = threading.Thread(target=worker.serve)
    thread.start()
    try:
        done = threading.Event()

        def check() -> bool:
            return all(local.load(r).status == "done" for r in ids)  # type: ignore[union-attr]

        for _ in range(int(WAIT_TIMEOUT / 0.05)):
            if check():
                done.set()
                break
            done.wait(0.05)
        assert done.is_set(), "the worker did not finish the runs through the key"
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert most[0] == 2


def test_release_hands_the_slot_to_the_highest_effective_priority() -> None:
    """Priority first; a waiter that waited AGING*n seconds beats a new one of priority n."""
    limit = Limit("k", concurrency=1)
    state: dict[str, Any] = _bucket.fresh(limit)
    for run_id, priority, at in (("held", 0, 0.0), ("low", 0, 1.0), ("high", 5, 2.0)):
        new, _ = _bucket.decide(state, limit, run_id, 1, 0, at, set(), priority)
        assert new is not None
        state = new
    released, woken = _bucket.release(state, "held", 1, 3.0)
    assert woken == "high" and released is not None
    assert released["holders"] == {"high": ["r", 3.0]}
    # Much later, an old low-priority waiter beats a fresh priority-5 one.
    aged: dict[str, Any] = {
        "config": limit.config(),
        "holders": {"held": [1, 0]},
        "waiters": [["old", 0, 0.0], ["new", 5, 1000.0]],
    }
    _, woken = _bucket.release(aged, "held", 1, 1000.0 + 1)
    assert woken == "old"  # 0 + 1001/60 > 5 + 1/60


def test_a_kept_slot_lapses_if_its_waiter_never_comes() -> None:
    """A slot handed to a woken waiter is kept RESERVE seconds, then taken by another."""
    limit = Limit("k", concurrency=1)
    state = {**_bucket.fresh(limit), "holders": {"gone": ["r", 0.0]}}
    _, early = _bucket.decide(state, limit, "other", 1, 0, _bucket.RESERVE / 2, set())
    assert not early.granted
    _, late = _bucket.decide(state, limit, "other", 1, 0, _bucket.RESERVE + 1, set())
    assert late.granted
    _, mine = _bucket.decide(state, limit, "gone", 2, 0, 1.0, set())
    assert mine.granted


def test_map_max_concurrency_runs_children_a_few_at_a_time(local: Store) -> None:
    """Map(max_concurrency=2) over 6 items: a worker never runs 3 children at once."""
    lock = threading.Condition()
    inside = [0]
    most = [0]

    def child(state: State) -> State:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            lock.notify_all()
            # The first child waits for a second (the worker may run two at once), so the
            # check that two did is not a race with a loaded machine's scheduling.
            lock.wait_for(lambda: most[0] >= 2, timeout=WAIT_TIMEOUT / 4)
        threading.Event().wait(0.02)  # linger, so that a third child would overlap
        with lock:
            inside[0] -= 1
        return {"double": state["n"] * 2}

    kid = Workflow("kid", [Step("child", child)])
    parent = Workflow(
        "fan",
        [Map("each", kid, lambda state: [{"n": n} for n in range(6)], max_concurrency=2)],
    )
    start(local, parent, "p")
    worker = Worker(local, [parent, kid], concurrency=6, poll=0.05)
    thread = threading.Thread(target=worker.serve)
    thread.start()
    try:
        finished = threading.Event()
        for _ in range(int(WAIT_TIMEOUT / 0.05)):
            if local.load("p").status == "done":  # type: ignore[union-attr]
                finished.set()
                break
            finished.wait(0.05)
        assert finished.is_set(), "the Map parent did not finish"
    finally:
        worker.stop()
        thread.join(WAIT_TIMEOUT)
    assert most[0] == 2
    result = local.load("p").state["each"]  # type: ignore[union-attr]
    assert [r["double"] for r in result] == [0, 2, 4, 6, 8, 10]


def test_map_max_concurrency_must_be_positive() -> None:
    """max_concurrency of 0, a bool or a float is a ConfigError naming it."""
    kid = Workflow("kid", [Step("s", lambda s: None)])
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="max_concurrency"):
            Map("each", kid, lambda s: [], max_concurrency=bad)  # type: ignore[arg-type]


def test_a_code_workflow_holds_its_keys(local: Store) -> None:
    """@workflow(limits=...) runs hold the key from claim to end, as a Workflow's do."""
    set_limit(local, Limit("tenant", concurrency=1))

    @workflow("coded", limits=[Limit("coded-runs", concurrency=1)])
    def coded(ctx: Any, input: State) -> int:
        usage = limit_usage(local, "coded-runs")
        assert usage is not None and list(usage.holders) == [ctx.run_id]
        return int(ctx.step("one", lambda: 1))

    start(local, coded, "c1", keys={"tenant": "acme"})
    assert run("c1", coded, local)["result"] == 1
    cp = local.load("c1")
    assert cp is not None and cp.flow is not None
    assert cp.flow["keys"] == ["coded-runs", "tenant:acme"]


def test_code_workflow_steps_take_limits(local: Store) -> None:
    """ctx.step(limits=...) holds the key for the call; a full key parks the run."""
    set_limit(local, Limit("gpu", concurrency=1))
    seen: list[list[str]] = []

    def use() -> int:
        usage = limit_usage(local, "gpu")
        assert usage is not None
        seen.append(list(usage.holders))
        return 7

    @workflow("gpu-user")
    def user(ctx: Any, input: State) -> int:
        first = int(ctx.step("prep", lambda: 1))
        return first + int(ctx.step("use", use, limits=["gpu"], tokens=0))

    local.save(Checkpoint("other", total_steps=2, owner="w:elsewhere:1:m.0:x", epoch=1))
    from stepstone._flow import _ops
    from stepstone._flow._api import drive

    assert drive(local, _ops.acquire("gpu", "other", 1, 0))[1].granted
    with pytest.raises(Suspended, match="limit:gpu"):
        run("u", user, local)
    assert local.load("u").waiting_for == "limit:gpu"  # type: ignore[union-attr]
    assert seen == []
    local.save(Checkpoint("other", total_steps=2, epoch=1, version=local.load("other").version))  # type: ignore[union-attr]
    assert run("u", user, local)["result"] == 8
    assert seen == [["u"]]
    assert limit_usage(local, "gpu").holders == {}  # type: ignore[union-attr]


def test_async_code_workflow_steps_take_limits(local: Store) -> None:
    """An async def workflow's ctx.step(limits=...) takes and gives back the key."""
    import asyncio

    from stepstone import arun

    @workflow("agpu-user")
    async def user(ctx: Any, input: State) -> int:
        return int(await ctx.step("use", lambda: 3, limits=[Limit("agpu", concurrency=1)]))

    assert asyncio.run(arun("au", user, local))["result"] == 3
    assert limit_usage(local, "agpu").holders == {}  # type: ignore[union-attr]


def test_replace_pending_keeps_only_the_latest_run(local: Store) -> None:
    """Debounce: each start of a replace_pending key cancels the runs not started yet."""
    set_limit(local, Limit("thread", concurrency=1, policy="replace_pending"))
    flow = Workflow("reply", [Step("answer", lambda state: {"answered": state["text"]})])
    start(local, flow, "m1", {"text": "hi"}, keys={"thread": "t1"})
    start(local, flow, "m2", {"text": "hi there"}, keys={"thread": "t1"})
    start(local, flow, "other", {"text": "x"}, keys={"thread": "t2"})
    assert local.load("m1").status == "cancelled"  # type: ignore[union-attr]
    assert local.load("other").status == "queued"  # type: ignore[union-attr]
    assert run("m2", flow, local) == {"text": "hi there", "answered": "hi there"}
    start(local, flow, "m3", {"text": "later"}, keys={"thread": "t1"})
    assert local.load("m2").status == "done"  # type: ignore[union-attr]
    assert local.load("m3").status == "queued"  # type: ignore[union-attr]


def test_cancel_running_stops_the_holder(local: Store) -> None:
    """A start on a cancel_running key cancels the run holding it at its next boundary."""
    set_limit(local, Limit("chat", concurrency=1, policy="cancel_running"))
    entered = threading.Event()
    go_on = threading.Event()

    def first(state: State) -> State:
        if state.get("block"):
            entered.set()
            assert go_on.wait(WAIT_TIMEOUT), "the test never let the first step finish"
        return {"first": True}

    flow = Workflow("chat", [Step("first", first), Step("second", lambda s: {"second": True})])
    start(local, flow, "old", {"block": True}, keys={"chat": "c1"})
    errors: list[BaseException] = []

    def run_old() -> None:
        try:
            run("old", flow, local)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    thread = threading.Thread(target=run_old)
    thread.start()
    assert entered.wait(WAIT_TIMEOUT), "the old run never started"
    start(local, flow, "new", keys={"chat": "c1"})
    assert local.load("old").cancel_requested  # type: ignore[union-attr]
    go_on.set()
    thread.join(WAIT_TIMEOUT)
    assert local.load("old").status == "cancelled"  # type: ignore[union-attr]
    assert [type(e).__name__ for e in errors] == ["RunCancelled"]
    assert run("new", flow, local) == {"first": True, "second": True}


def test_code_workflow_rate_limited_parks_and_blocks(local: Store) -> None:
    """A ctx.step raising RateLimited parks the run until then and blocks its key."""
    from datetime import timedelta

    from stepstone import RateLimited
    from stepstone.testing import FakeClock

    answers: list[BaseException | None] = [RateLimited(30), None]

    def call() -> int:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return 5

    @workflow("rl-user")
    def user(ctx: Any, input: State) -> int:
        return int(ctx.step("call", call, limits=[Limit("llm", rpm=600)]))

    with FakeClock() as clock:
        with pytest.raises(Suspended, match="limit:llm"):
            run("rl", user, local)
        usage = limit_usage(local, "llm")
        assert usage is not None and usage.blocked_until == clock.now() + timedelta(seconds=30)
        clock.advance(timedelta(seconds=30))
        assert run("rl", user, local)["result"] == 5
    assert answers == []


def test_a_workflow_run_directly_holds_its_keys(local: Store) -> None:
    """run() of a new run of a Workflow with limits holds them, as a started run does."""

    def check(state: State) -> State:
        usage = limit_usage(local, "direct")
        assert usage is not None
        return {"holders": list(usage.holders)}

    flow = Workflow("direct", [Step("check", check)], limits=[Limit("direct", concurrency=1)])
    assert run("d1", flow, local) == {"holders": ["d1"]}
    cp = local.load("d1")
    assert cp is not None and cp.flow is not None and cp.flow["keys"] == ["direct"]


def test_keys_made_from_a_template_follow_it(local: Store) -> None:
    """Changing tenant changes tenant:acme, until tenant:acme is set itself."""
    from stepstone import get_limit

    set_limit(local, Limit("tenant", concurrency=1))
    flow = Workflow("t", [Step("s", lambda s: None)])
    start(local, flow, "r", keys={"tenant": "acme"})
    set_limit(local, Limit("tenant", concurrency=3))
    assert get_limit(local, "tenant:acme").concurrency == 3  # type: ignore[union-attr]
    set_limit(local, Limit("tenant:acme", concurrency=5))
    set_limit(local, Limit("tenant", concurrency=2))
    assert get_limit(local, "tenant:acme").concurrency == 5  # type: ignore[union-attr]
