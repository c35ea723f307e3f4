"""Cosmos DB's native TTL and stepstone's own records: schedules, limits, stream blocks.

The store's ``ttl=N`` option retires runs N seconds after their last write. The
schedules record and the limit records hold configuration and are written only when it
changes, so they must never expire; a run's stream blocks must expire with the run, and
from the last block to the first, so a stream never has a gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fresh_stores import fresh_config
from stepstone import Limit, Step, StepContext, Workflow, open_store, run, schedule, set_limit
from stepstone._cron import RECORD
from stepstone._flow._limit import PREFIX, record_id
from stepstone._stream import expire_stream
from stepstone._stream._events import block_id
from stepstone._stream._writer import find_end
from stepstone.stores.cosmos import CosmosStore
from stepstone.stores.cosmos._wire import LIMIT_PREFIX, SCHEDULES_RECORD, item_id, record_ttl

State = dict[str, Any]


def _raw_item(emulator: Any, store: CosmosStore, run_id: str) -> dict[str, Any]:
    """The item of ``run_id`` as Cosmos holds it (the SDK, past the store)."""
    client = emulator.client()
    container = client.get_database_client(store.database_name).get_container_client(
        store.container_name
    )
    item: dict[str, Any] = container.read_item(item_id(run_id), partition_key=item_id(run_id))
    return item


def _talk(state: State, ctx: StepContext) -> None:
    ctx.emit("tokens", ctx.step_name)


def test_the_record_names_agree_with_the_runtime() -> None:
    """The store's text copies of the record ids are the runtime's own."""
    assert (SCHEDULES_RECORD, LIMIT_PREFIX) == (RECORD, PREFIX)
    assert record_ttl(RECORD, 60) == -1 and record_ttl(record_id("gpu"), None) == -1
    assert record_ttl("~limits", 60) == 60 and record_ttl("r", None) is None


def test_the_ttl_option_spares_schedules_and_limits_on_cosmos(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """With ttl=60, runs and their stream blocks carry 60; the records never expire."""
    emulator = request.getfixturevalue("emulator")
    with open_store(fresh_config("cosmos", request, tmp_path) + "&ttl=60") as store:
        assert isinstance(store, CosmosStore)
        set_limit(store, Limit("gpu", concurrency=1))
        flow = Workflow("digest", [Step("build", lambda s: {"ok": True})])
        schedule(store, "nightly", cron="0 3 * * *", workflow=flow)
        # The run holds the key: its record is written again, by an acquire and a release.
        run("r", [Step("talk", _talk, limits=["gpu"])], store)
        ttls = {
            name: _raw_item(emulator, store, name).get("ttl")
            for name in (record_id("gpu"), RECORD, "r", block_id("r", 0))
        }
    assert ttls == {record_id("gpu"): -1, RECORD: -1, "r": 60, block_id("r", 0): 60}


def test_a_streams_blocks_expire_from_the_last_on_cosmos(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """expire_stream gives every block the run's TTL, the last block first."""
    emulator = request.getfixturevalue("emulator")
    with open_store(fresh_config("cosmos", request, tmp_path)) as store:
        assert isinstance(store, CosmosStore)
        run("r", [Step("one", _talk), Step("two", _talk), Step("three", _talk)], store)
        end = find_end(store, "r")
        assert end >= 2, f"the run wrote {end} block(s); the order needs two"
        order: list[str] = []
        expire = store.expire

        def noted(run_id: str, ttl_seconds: int | None) -> bool:
            order.append(run_id)
            return expire(run_id, ttl_seconds)

        monkeypatch.setattr(store, "expire", noted)
        assert expire_stream(store, "r", 3600) == end
        ttls = [_raw_item(emulator, store, block_id("r", n)).get("ttl") for n in range(end)]
    assert order == [block_id("r", n) for n in reversed(range(end))]
    assert ttls == [3600] * end
