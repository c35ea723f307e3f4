"""Stepstone's own records (stream blocks, schedules, limits, budgets) are not runs.

One rule (``stepstone._reserved``) for ``stepstone runs list``, the dashboard's list and
its status counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_support import cli, store_url
from stepstone import Step, StepContext, open_store, run
from stepstone import _reserved as reserved
from stepstone._checkpoint import Checkpoint
from stepstone._cron import RECORD
from stepstone._flow._limit import PREFIX as LIMIT_PREFIX
from stepstone._reserved import RESERVED_IDS, RESERVED_PREFIXES, is_reserved, run_counts
from stepstone._stream._events import HEAD
from stepstone._tenant import PREFIX as TENANT_PREFIX


def test_reserved_ids_are_their_owners() -> None:
    """The rule's text ids are the constants of the modules that write those records."""
    assert set(RESERVED_PREFIXES) == {HEAD + ":", LIMIT_PREFIX, TENANT_PREFIX}
    assert reserved.LIMIT_PREFIX == LIMIT_PREFIX
    assert set(RESERVED_IDS) == {RECORD}
    assert is_reserved("stream:r/0") and is_reserved("~schedules")
    assert is_reserved("~limit/x") and is_reserved("~tenant-budget/acme")
    assert not is_reserved("~tilde") and not is_reserved("streamed") and not is_reserved("r")


def _record(run_id: str) -> Checkpoint:
    return Checkpoint(run_id=run_id, step=0, state={}, step_names=("x",), total_steps=1)


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_counts_and_lists_leave_reserved_records_out(kind: str, tmp_path: Path) -> None:
    """A run that streamed, beside a schedules, a limit and a budget record: counts and
    ``runs list`` show the two runs alone, whatever the prefix."""

    def talk(state: dict[str, Any], ctx: StepContext) -> None:
        ctx.emit("tokens", "hi")

    config = store_url(kind, tmp_path)
    with open_store(config) as store:
        run("r1", [Step("talk", talk)], store)
        run("r2", [Step("quiet", lambda s: None)], store)
        for record_id in (RECORD, LIMIT_PREFIX + "x", TENANT_PREFIX + "acme"):
            store.save(_record(record_id))
        assert store.load(HEAD + ":r1/0") is not None  # the stream's block exists
        assert run_counts(store)["done"] == 2
        assert store.count_by_status()["done"] > 2  # the raw count holds them all
        assert run_counts(store, "r")["done"] == 2
        assert run_counts(store, "~")["done"] == 0
        assert sum(run_counts(store, "stream:r1").values()) == 0
    listed = cli("runs", "list", "--json", "--store", config)
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["run_id"] for r in json.loads(listed.stdout)) == ["r1", "r2"]


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_prune_leaves_reserved_records_whatever_their_age(kind: str, tmp_path: Path) -> None:
    """``runs prune`` past every record's age deletes the finished run alone: a tenant's
    cap and spend (its record's status is "done": pruning it lifted the cap), the
    schedules, a limit and a live run's stream block stay, as written."""
    from stepstone import TenantCap, Workflow, schedule, set_tenant_cap, tenant_spend

    config = store_url(kind, tmp_path)
    with open_store(config) as store:
        run("old", [Step("quiet", lambda s: None)], store)
        set_tenant_cap(store, TenantCap("acme", usd=3))
        flow = Workflow("nightly", [Step("quiet", lambda s: None)], version="1")
        schedule(store, "nightly", cron="0 3 * * *", workflow=flow)
        store.save(_record(LIMIT_PREFIX + "openai"))
        store.save(_record(HEAD + ":starting/0"))
        kept = {rid: store.load(rid) for rid in store.list_runs() if is_reserved(rid)}
    assert len(kept) == 4, sorted(kept)
    pruned = cli("runs", "prune", "--older-than", "2999-01-01T00:00:00+00:00", "--store", config)
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 1 run" in pruned.stdout, pruned.stdout
    with open_store(config) as store:
        assert store.load("old") is None
        assert {rid: store.load(rid) for rid in kept} == kept
        assert tenant_spend(store, "acme").cap == TenantCap("acme", usd=3)
