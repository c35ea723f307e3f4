"""Flow control (issue 37): limits stored as records, slots, rates, shared 429 back-off.

The invariants: never more holders than ``concurrency`` (threads racing on one store),
a dead holder's slot reclaimed, rates within the GCRA bound on a FakeClock, a parked
run costs no attempt and no thread. Every backend through the Store's own operations:
memory, file and SQLite here; PostgreSQL and MySQL by their parameter id.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS, LOCAL_BACKENDS, fresh_config
from stepstone import (
    ConfigError,
    Limit,
    LimitReached,
    RateLimited,
    RetryPolicy,
    Step,
    StepFailed,
    Store,
    Suspended,
    Workflow,
    aget_limit,
    alist_limits,
    arun,
    aset_limit,
    get_limit,
    limit_usage,
    list_limits,
    open_store,
    run,
    set_limit,
    start,
)
from stepstone._flow import _bucket, _ops
from stepstone._flow._api import drive
from stepstone._flow._hook import LIMIT_POLL
from stepstone.testing import FakeClock

State = dict[str, Any]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


@pytest.fixture(params=LOCAL_BACKENDS)
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with open_store(fresh_config(str(request.param), request, tmp_path)) as opened:
        yield opened


# --- declaring limits -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -2}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"rpm": 0}, "rpm"),
        ({"tpm": -1}, "tpm"),
        ({"rpm": float("inf")}, "rpm"),
        ({"requests": 10}, "window"),
        ({"tokens": 10}, "window"),
        ({"per": 10}, "per="),
        ({"rpm": 5, "requests": 5, "per": 1}, "not both"),
        ({"policy": "drop"}, "queue, reject"),
    ],
)
def test_bad_limits_raise_config_error(kwargs: dict[str, Any], names: str) -> None:
    """A limit <= 0, a rate with no window or an unknown policy names what is wrong."""
    with pytest.raises(ConfigError, match=names):
        Limit("k", **kwargs)


def test_bad_keys_and_step_limits_raise_config_error() -> None:
    """Keys are 1 to 200 characters without controls; a step's limits are a list."""
    for key in ("", "x" * 201, "a\nb", 3):
        with pytest.raises(ConfigError, match="key"):
            Limit(key)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="list"):
        Step("s", lambda s: None, limits="api")
    with pytest.raises(ConfigError, match="twice"):
        Step("s", lambda s: None, limits=["api", Limit("api", concurrency=1)])
    with pytest.raises(ConfigError, match="tokens"):
        Step("s", lambda s: None, limits=["api"], tokens=-5)
    with pytest.raises(ConfigError, match="retry_after"):
        RateLimited(-1)


def test_limits_round_trip_and_keep_holders(store: Store) -> None:
    """set_limit stores a record; changing it keeps its holders; list_limits finds it."""
    key = f"api-{uuid.uuid4().hex[:6]}"
    assert get_limit(store, key) is None
    set_limit(store, Limit(key, concurrency=2, rpm=500, tpm=200_000))
    store.save(_holder(store, "holder-run"))
    decision = drive(store, _ops.acquire(key, "holder-run", 1, 10))[1]
    assert decision.granted
    changed = set_limit(store, Limit(key, concurrency=5, requests=10, per=1.0))
    assert changed.concurrency == 5 and changed.request_rate() == (10.0, 1.0)
    usage = limit_usage(store, key)
    assert usage is not None and usage.holders == {"holder-run": 1}
    assert [limit.key for limit in list_limits(store)] == [key]


def test_run_and_step_limits_on_every_backend(store: Store) -> None:
    """A run holding a tenant key and a rate-limited step, sync then async, on each backend."""
    set_limit(store, Limit("tenant", concurrency=1))
    flow = Workflow("w", [Step("s", lambda s: {"ok": True}, limits=[Limit("api", rpm=600)])])
    start(store, flow, "r1", keys={"tenant": "acme"}, priority=2)
    start(store, flow, "r2", keys={"tenant": "acme"})
    assert run("r1", flow, store) == {"ok": True}
    assert asyncio.run(arun("r2", flow, store)) == {"ok": True}
    cp = store.load("r1")
    assert cp is not None and cp.flow is not None and cp.flow["priority"] == 2
    for key in ("tenant:acme", "api"):
        usage = limit_usage(store, key)
        assert usage is not None and usage.holders == {}, key
    assert sorted(limit.key for limit in list_limits(store)) == ["api", "tenant", "tenant:acme"]


def test_async_twins(local: Store) -> None:
    """aset_limit, aget_limit and alist_limits do what the sync ones do."""

    async def main() -> None:
        await aset_limit(local, Limit("a", concurrency=1))
        got = await aget_limit(local, "a")
        assert got is not None and got.concurrency == 1
        assert [limit.key for limit in await alist_limits(local)] == ["a"]

    asyncio.run(main())


def test_unknown_key_fails_the_step_with_config_error(local: Store) -> None:
    """A step naming a key with no record fails, recorded, with ConfigError as cause."""
    with pytest.raises(StepFailed) as caught:
        run("r", [Step("s", lambda s: {"x": 1}, limits=["nowhere"])], local)
    assert isinstance(caught.value.__cause__, ConfigError)
    assert "nowhere" in str(caught.value.__cause__)
    cp = local.load("r")
    assert cp is not None and cp.status == "failed"


# --- concurrency ------------------------------------------------------------------------


def test_threads_never_exceed_concurrency(local: Store) -> None:
    """Eight threads running twelve runs through concurrency 2: never three at once."""
    limit = Limit("slots", concurrency=2)
    changed = threading.Condition()
    inside = [0]
    most = [0]
    busy = [6]  # runner threads with runs left (below)

    def work(state: State) -> State:
        with changed:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            changed.notify_all()
            # Two holders at once, so a third would be seen: wait for a partner while
            # another runner has runs left (it retries until it holds the other slot).
            # Not a barrier with a timeout: the last holder alone waited all of it.
            held = changed.wait_for(lambda: inside[0] >= 2 or busy[0] <= 1, timeout=60)
            assert held, "no second holder came while another runner had runs left"
            inside[0] -= 1
        return {"done": True}

    steps = [Step("work", work, limits=[limit])]
    errors: list[BaseException] = []

    def runner(ids: list[str]) -> None:
        try:
            for run_id in ids:
                for _ in range(500):
                    try:
                        run(run_id, steps, local)
                        break
                    except Suspended:
                        continue
                    except BaseException as exc:  # noqa: BLE001 - reported below
                        errors.append(exc)
                        return
        finally:
            with changed:
                busy[0] -= 1
                changed.notify_all()

    ids = [f"r{i}" for i in range(12)]
    threads = [threading.Thread(target=runner, args=(ids[i::6],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a runner thread hung"
    assert not errors, errors
    assert most[0] == 2
    assert all(local.load(r).status == "done" for r in ids)  # type: ignore[union-attr]
    usage = limit_usage(local, "slots")
    assert usage is not None and usage.holders == {}


def test_dead_holders_slots_are_reclaimed(local: Store) -> None:
    """A slot whose run is gone, finished, or was claimed again is taken by the next run."""
    set_limit(local, Limit("one", concurrency=1))

    def take(run_id: str, epoch: int) -> bool:
        return bool(drive(local, _ops.acquire("one", run_id, epoch, 0))[1].granted)

    assert take("ghost", 3)  # no such run: its slot is reclaimed by the next
    run("finished", [Step("s", lambda s: None)], local)
    finished = local.load("finished")
    assert finished is not None and take("finished", finished.epoch)
    local.save(_holder(local, "moved"))
    assert take("moved", 0)  # "finished" is done: it holds nothing
    assert take("fourth", 0)  # "moved" runs at epoch 1 now, not 0: taken over
    local.save(_holder(local, "live"))
    assert take("live", 1)  # "fourth" has no run record
    assert not take("fifth", 0)  # "live" is owned at its epoch: its slot holds
    usage = limit_usage(local, "one")
    assert usage is not None and usage.holders == {"live": 1} and usage.waiters == ["fifth"]


def test_stale_holder_rules() -> None:
    """A slot is held only while its run is owned at the same epoch by a live owner."""
    from stepstone._checkpoint import Checkpoint

    owned = Checkpoint("r", total_steps=2, owner="someone-elsewhere", epoch=4)
    assert not _ops.holder_is_stale(owned, 4)
    assert _ops.holder_is_stale(owned, 3)
    assert _ops.holder_is_stale(None, 4)
    assert _ops.holder_is_stale(Checkpoint("r", total_steps=2, epoch=4), 4)


def test_full_key_parks_the_run_waiting_on_it(local: Store) -> None:
    """A run finding its key full is saved waiting on limit:<key>, no attempt spent."""
    set_limit(local, Limit("one", concurrency=1))
    holder_started = threading.Event()
    release = threading.Event()

    def hold(state: State) -> None:
        holder_started.set()
        assert release.wait(10), "the test never released the holder"

    policy = RetryPolicy(max_attempts=1)
    thread = threading.Thread(target=run, args=("holder", [Step("h", hold, limits=["one"])], local))
    thread.start()
    assert holder_started.wait(10), "the holder never started"
    with pytest.raises(Suspended, match="limit:one"):
        run("waiter", [Step("w", lambda s: {"w": 1}, retry=policy, limits=["one"])], local)
    cp = local.load("waiter")
    assert cp is not None and cp.status == "waiting" and cp.waiting_for == "limit:one"
    assert cp.attempt == 0 and cp.owner is None
    assert limit_usage(local, "one").waiters == ["waiter"]  # type: ignore[union-attr]
    release.set()
    thread.join(10)
    # The release woke the waiter: due now, not at its poll.
    woken = local.load("waiter")
    assert woken is not None and woken.due_at is not None
    assert woken.due_at <= woken.updated_at  # type: ignore[operator]
    assert run("waiter", [Step("w", lambda s: {"w": 1}, retry=policy, limits=["one"])], local)
    assert local.load("waiter").waiting_for is None  # type: ignore[union-attr]


def test_reject_policy_fails_the_step(local: Store) -> None:
    """A full key whose policy is reject fails the step with LimitReached."""
    set_limit(local, Limit("strict", concurrency=1, policy="reject"))
    local.save(_holder(local, "other"))
    drive(local, _ops.acquire("strict", "other", 1, 0))
    with pytest.raises(StepFailed) as caught:
        run("r", [Step("s", lambda s: None, limits=["strict"])], local)
    assert isinstance(caught.value.__cause__, LimitReached)


def _holder(store: Store, run_id: str) -> Any:
    """Return a live-looking run record at epoch 1 (owned by another host's worker)."""
    from stepstone._checkpoint import Checkpoint

    return Checkpoint(run_id, total_steps=3, owner="w:elsewhere:1:m.0:x", epoch=1, lease=60)


# --- rates ------------------------------------------------------------------------------


def test_request_rate_never_exceeds_the_gcra_bound(local: Store) -> None:
    """Twenty runs on rpm=6: over any interval t at most 6 + 6*t/60 start, all finish."""
    starts: list[float] = []
    limit = Limit("rpm", rpm=6)
    with FakeClock() as clock:
        steps = [Step("s", lambda s: starts.append(clock.now().timestamp()), limits=[limit])]
        pending = [f"r{i}" for i in range(20)]
        for _ in range(500):
            while pending:
                try:
                    run(pending[0], steps, local)
                except Suspended:
                    break  # the key is over its rate: the rest would be refused too
                pending.pop(0)
            if not pending:
                break
            clock.advance(timedelta(seconds=2.5))
        assert not pending
    assert len(starts) == 20
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            span = starts[j] - first
            assert j - i + 1 <= 6 + 6 * span / 60 + 1e-6, (i, j, span)


def test_tokens_settle_and_refund() -> None:
    """Tokens over the estimate push the next acquisition back; a refund brings it in."""
    limit = Limit("t", tokens=100, per=10)
    taken, first = _bucket.decide(_bucket.fresh(limit), limit, "a", 1, 100, 0.0, set())
    assert first.granted and taken is not None
    state = taken
    _, second = _bucket.decide(state, limit, "b", 1, 10, 0.0, set())
    assert not second.granted and second.why == "tokens" and second.retry_at == pytest.approx(1.0)
    refunded = _bucket.settle(state, limit, 100, 50, 0.0)
    assert refunded is not None
    _, third = _bucket.decide(refunded, limit, "b", 1, 50, 0.0, set())
    assert third.granted
    with pytest.raises(ConfigError, match="never fit"):
        _bucket.decide(_bucket.fresh(limit), limit, "c", 1, 101, 0.0, set())


def test_a_waiter_looking_again_writes_nothing() -> None:
    """A parked run that polls a full key it is listed on costs the record no write."""
    limit = Limit("hot", concurrency=1)
    held, first = _bucket.decide(_bucket.fresh(limit), limit, "a", 1, 0, 0.0, set())
    assert first.granted and held is not None
    listed, full = _bucket.decide(held, limit, "b", 1, 0, 1.0, set())
    assert not full.granted and listed is not None and listed["waiters"] == [["b", 0, 1.0]]
    again, still = _bucket.decide(listed, limit, "b", 1, 0, 3.0, set())
    assert not still.granted and still.why == "concurrency"
    assert again is None  # nothing changed: the poll is a load, not a compare-and-swap
    raised, _ = _bucket.decide(listed, limit, "b", 1, 0, 3.0, set(), 5)
    assert raised is not None and raised["waiters"] == [["b", 5, 1.0]]  # a new priority


def test_ctx_acquire_and_settle(local: Store) -> None:
    """ctx.acquire takes a key mid-step (the call restarts holding it); settle charges."""
    set_limit(local, Limit("llm", tpm=1000, concurrency=1))
    calls: list[int] = []

    def ask(state: State, ctx: Any) -> State:
        calls.append(1)
        ctx.acquire("llm", tokens=100)
        held = limit_usage(local, "llm")
        assert held is not None and list(held.holders) == ["r"]
        ctx.settle(400)
        return {"answer": 42}

    with FakeClock():
        assert run("r", [Step("ask", ask)], local) == {"answer": 42}
        usage = limit_usage(local, "llm")
        assert usage is not None and usage.holders == {}
        record = local.load("~limit/llm")
        assert record is not None
        # 400 tokens of 1000/min charged: the TAT is 24 s ahead.
        assert record.state["tok_tat"] - clock_now() == pytest.approx(24.0, abs=0.01)
    assert len(calls) == 2  # the code before ctx.acquire ran twice


def clock_now() -> float:
    from stepstone import _clock

    return _clock.now().timestamp()


# --- a 429 ------------------------------------------------------------------------------


def test_rate_limited_parks_blocks_the_key_and_spends_no_attempt(local: Store) -> None:
    """RateLimited(30): the run parks 30 s, the key is blocked for others, no attempt spent."""
    set_limit(local, Limit("api", rpm=1000))
    answers = [RateLimited(30), None]

    def call(state: State) -> State:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return {"ok": True}

    once = RetryPolicy(max_attempts=1)
    with FakeClock() as clock:
        with pytest.raises(Suspended, match="limit:api"):
            run("r", [Step("call", call, retry=once, limits=["api"])], local)
        cp = local.load("r")
        assert cp is not None and cp.attempt == 0 and cp.failure is None
        assert cp.wake_at == clock.now() + timedelta(seconds=30)
        with pytest.raises(Suspended, match="limit:api"):
            run("other", [Step("o", lambda s: {"o": 1}, limits=["api"])], local)
        assert local.load("other").wake_at == cp.wake_at  # type: ignore[union-attr]
        clock.advance(timedelta(seconds=30))
        assert run("r", [Step("call", call, retry=once, limits=["api"])], local) == {"ok": True}
        assert run("other", [Step("o", lambda s: {"o": 1}, limits=["api"])], local) == {"o": 1}


def test_parked_run_looks_again_after_the_poll(local: Store) -> None:
    """A run parked on a full key is due again after LIMIT_POLL even if never woken."""
    set_limit(local, Limit("one", concurrency=1))
    local.save(_holder(local, "other"))
    drive(local, _ops.acquire("one", "other", 1, 0))
    with FakeClock() as clock:
        with pytest.raises(Suspended):
            run("r", [Step("s", lambda s: None, limits=["one"])], local)
        cp = local.load("r")
        assert cp is not None and cp.wake_at == clock.now() + timedelta(seconds=LIMIT_POLL)


def test_async_runs_take_limits(local: Store) -> None:
    """arun takes and gives back a step's limits as run does."""

    async def call(state: State) -> State:
        return {"ok": True}

    async def main() -> None:
        steps = [Step("call", call, limits=[Limit("alimit", concurrency=1, rpm=60)])]
        assert await arun("r", steps, local) == {"ok": True}

    asyncio.run(main())
    usage = limit_usage(local, "alimit")
    assert usage is not None and usage.holders == {}


def test_ctx_acquire_restarts_the_step_on_its_saved_state(local: Store) -> None:
    """A step that changed its state before ctx.acquire is called again on the saved one."""
    set_limit(local, Limit("k", concurrency=1))

    def step(state: State, ctx: Any) -> State:
        state["n"] = state.get("n", 0) + 1  # changed in place, before the acquisition
        ctx.acquire("k")
        return {"seen": state["n"]}

    assert run("r", [Step("s", step)], local, input={"n": 10}) == {"n": 11, "seen": 11}
