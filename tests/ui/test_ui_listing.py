"""The dashboard's listing queries: every backend's override equals the default scan.

``Store.list_page`` and ``Store.count_by_status`` have a default built on ``list_info``
(a pass over every run); each backend answers them from an index instead. These tests
compare the two on the same data for every status, prefix and page size, paging to the
end, before and after runs change, and check that the override reads no full listing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import BACKENDS, cosmos_config, fresh_config
from stepstone import Checkpoint, Failure, Store, open_store
from stepstone._checkpoint import STATUSES, RunStatus, evolve
from stepstone._store import page_key

_BASE = datetime(2026, 1, 1, tzinfo=UTC)
# Ids with shared prefixes, cases, LIKE wildcards and non-ASCII (no astral characters:
# the emulator orders strings by UTF-16 units, Python by code points).
_STEMS = ["a", "ab", "abc-", "B", "b", "a_%", "x!y", "é"]
_PREFIXES = ["", "a", "ab", "B", "a_", "é", "nothing-has-this"]


@pytest.fixture(params=BACKENDS)
def listing_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    """A fresh, empty store on each of the six backends (as in test_contract.py)."""
    config = fresh_config(str(request.param), request, tmp_path)
    with open_store(config) as store:
        yield store


def _checkpoint(run_id: str, status: RunStatus, updated_at: datetime) -> Checkpoint:
    """A checkpoint in ``status``, last updated at ``updated_at``."""
    cp = Checkpoint(run_id, total_steps=3, updated_at=updated_at, created_at=updated_at)
    if status == "done":
        return evolve(cp, step=2, step_names=("s0", "s1", "s2"))
    if status == "queued":
        return evolve(cp, queued=True)
    if status == "waiting":
        return evolve(cp, waiting_for="signal approval")
    if status == "cancelled":
        return evolve(cp, cancelled=True)
    if status == "failed":
        return evolve(cp, failure=Failure(0, "charge", "RuntimeError", "503", 3, updated_at))
    return cp


def _fill(store: Store, count: int = 36) -> list[str]:
    """Import ``count`` runs over every status, with ties in updated_at; return the ids."""
    ids = []
    for i in range(count):
        run_id = f"{_STEMS[i % len(_STEMS)]}{i:03d}"
        # Three runs per second (some whole seconds: isoformat drops the fraction), so
        # (updated_at, run_id) ties are broken by the run id as the cursor is.
        at = _BASE + timedelta(seconds=i // 3, microseconds=(i % 2) * 500)
        store.import_checkpoint(_checkpoint(run_id, STATUSES[(i * 5) % len(STATUSES)], at))
        ids.append(run_id)
    return ids


def _ids(infos: list[Any]) -> list[tuple[str, str, str | None]]:
    return [(i.run_id, i.status, i.version) for i in infos]


def _check_all_pages(store: Store, status: RunStatus | None, prefix: str, limit: int) -> int:
    """Page to the end with the override and the default; return how many runs were seen."""
    after: tuple[datetime, str] | None = None
    seen = 0
    while True:
        got = store.list_page(status, prefix=prefix, after=after, limit=limit)
        want = Store.list_page(store, status, prefix=prefix, after=after, limit=limit)
        where = f"status={status} prefix={prefix!r} limit={limit} after={after}"
        assert _ids(got) == _ids(want), where
        assert [page_key(i) for i in got] == [page_key(i) for i in want], where
        seen += len(got)
        if len(got) < limit:
            return seen
        after = page_key(got[-1])


def _check_everything(store: Store) -> None:
    counts = Store.count_by_status(store)
    for status in (None, *STATUSES):
        for prefix in _PREFIXES:
            seen = _check_all_pages(store, status, prefix, 4)
            expected = sum(counts.values()) if status is None else counts[status]
            if not prefix:
                assert seen == expected, (status, seen, expected)
    for prefix in _PREFIXES:
        assert store.count_by_status(prefix) == Store.count_by_status(store, prefix), prefix
    # Other page sizes, and a cursor that is no run's key (between two ties).
    for limit in (1, 50):
        _check_all_pages(store, None, "", limit)
        _check_all_pages(store, "running", "a", limit)
    assert store.list_page(limit=0) == Store.list_page(store, limit=0) == []
    between = (_BASE + timedelta(seconds=5), "abc")
    for status in (None, "done"):
        got = store.list_page(status, after=between, limit=5)
        assert _ids(got) == _ids(Store.list_page(store, status, after=between, limit=5))


def test_override_equals_the_default(listing_store: Store) -> None:
    """list_page and count_by_status give the default's answers, before and after writes."""
    store = listing_store
    ids = _fill(store)
    _check_everything(store)
    # Change some runs (their status and updated_at move) and delete others: an index
    # kept beside the data must follow.
    for run_id in ids[:4]:
        cp = store.load(run_id)
        assert cp is not None
        store.save(evolve(cp, cancelled=True))
    for run_id in ids[4:7]:
        assert store.delete(run_id)
    store.save(Checkpoint("ab-new", total_steps=2))
    _check_everything(store)
    assert store.count_by_status()["cancelled"] == Store.count_by_status(store)["cancelled"]


# -- no full scan -------------------------------------------------------------------------


def _no_scan(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the listing read every run")

    for name in ("list_info", "list_runs", "load"):
        monkeypatch.setattr(store, name, refuse)


def test_memory_page_reads_only_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory store answers a page from its index: no listing, no load, page-sized work."""
    from stepstone.stores import _listing

    store = open_store("memory://")
    for i in range(2000):
        store.save(_checkpoint(f"run-{i:05d}", STATUSES[i % len(STATUSES)], _BASE))
    assert len(store.list_page("done", limit=10)) == 10  # builds the index once
    expected = Store.count_by_status(store, "run-01")
    _no_scan(store, monkeypatch)
    touched: list[str] = []

    def counted(runs: dict[str, Any], run_id: str) -> Any:
        touched.append(run_id)
        return dict.__getitem__(runs, run_id)

    monkeypatch.setattr(_listing.IndexedRuns, "__getitem__", counted)
    page = store.list_page("done", limit=10)
    deep = store.list_page("done", after=page_key(page[-1]), limit=10)
    assert len(deep) == 10 and deep[0].run_id < page[-1].run_id
    assert store.count_by_status("run-01") == expected
    assert len(touched) == 20  # the two pages' runs, and no other run read


def test_cosmos_page_and_counts_are_indexed_queries(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cosmos sends one TOP query per page and one COUNT per status, never the full list."""
    store = open_store(cosmos_config(request, "listing"))
    try:
        _fill(store, 12)
        want = _ids(Store.list_page(store, "running", limit=2))
        assert len(want) == 2
        sent: list[str] = []
        real = store._query  # type: ignore[attr-defined]

        def record(query: str, parameters: Any = None) -> Any:
            sent.append(query)
            return real(query, parameters)

        monkeypatch.setattr(store, "_query", record)
        _no_scan(store, monkeypatch)
        before = store.requests_sent  # type: ignore[attr-defined]
        assert _ids(store.list_page("running", prefix="", limit=2)) == want
        assert len(sent) == 1 and "SELECT TOP @limit" in sent[0]
        assert "ORDER BY c.status ASC, c.updated_at DESC, c.run_id DESC" in sent[0]
        assert store.requests_sent - before == 1  # type: ignore[attr-defined]
        sent.clear()
        store.count_by_status("a")
        assert len(sent) == len(STATUSES)
        assert all(q.startswith("SELECT VALUE COUNT(1) FROM c WHERE c.status") for q in sent)
    finally:
        store.close()


def test_cosmos_old_container_scans_then_init_adds_the_listing_indexes(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Without the composite indexes the emulator refuses the ORDER BY: the store warns and
    lists by the default scan; ``init`` adds the indexes and the indexed query is used."""
    import copy

    from azure.cosmos import CosmosClient, PartitionKey

    from stepstone.stores.cosmos import CONTAINER_DEFINITION

    config = cosmos_config(request, "listing")
    emulator: Any = request.getfixturevalue("emulator")
    name = config.split("?")[0].rsplit("/", 1)[1]
    policy = copy.deepcopy(CONTAINER_DEFINITION["indexingPolicy"])
    policy["compositeIndexes"] = policy["compositeIndexes"][:1]  # the claim index only
    client = CosmosClient(emulator.endpoint, emulator.key, **emulator.client_kwargs())
    database = client.create_database_if_not_exists("listing")
    database.create_container(
        name, partition_key=PartitionKey(path="/id"), indexing_policy=policy, default_ttl=-1
    )
    store = open_store(config.replace("create=true", "create=false"))
    try:
        _fill(store, 6)
        with caplog.at_level(logging.WARNING, logger="stepstone"):
            scanned = store.list_page(limit=3)
        assert "lacks the listing indexes" in caplog.text
        assert _ids(scanned) == _ids(Store.list_page(store, limit=3))
        doctor = "listing indexes (status, updated_at, run_id)"
        assert not {c.check: c for c in store.doctor()}[doctor].ok
        lines = store.init()
        assert any("listing indexes" in line and "added" in line for line in lines), lines
        assert {c.check: c for c in store.doctor()}[doctor].ok
        assert not any("added" in line for line in store.init())  # once is enough
        # The emulator indexes existing items for the new composite indexes only when
        # they are written again (the service rebuilds them in the background): touch
        # them, as time would.
        for info in Store.list_page(store, limit=10):
            cp = store.load(info.run_id)
            assert cp is not None
            store.save(cp)
        want = _ids(Store.list_page(store, limit=3))
        _no_scan(store, monkeypatch)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="stepstone"):
            assert _ids(store.list_page(limit=3)) == want
        assert "lacks the listing indexes" not in caplog.text
    finally:
        store.close()
