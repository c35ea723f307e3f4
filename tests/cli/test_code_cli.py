"""Workflows as code (issue 31) on the command line: ``runs show``/``journal`` list a run's
journaled calls; ``runs fork``/``rerun`` take a call's name (``revise#2``).

Commands run through ``stepstone.cli.main(argv)`` on a SQLite store in a temporary
directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import stepstone
from cli_support import cli
from fresh_stores import fresh_config
from stepstone import Suspended, open_store, run, signal

State = dict[str, Any]


@stepstone.workflow("cli-loop")
def loop(ctx: Any, input: State) -> Any:
    """A draft, two revisions, a wait, a send."""
    draft = ctx.step("draft", str.upper, "d")
    for i in range(2):
        draft = ctx.step("revise", str.upper, f"r{i}")
    ctx.wait_for("go")
    return ctx.step("send", str.upper, draft)


@pytest.fixture
def kind() -> str:
    """The store's backend: SQLite, unless a test runs on more (it parametrizes ``kind``)."""
    return "sqlite"


@pytest.fixture
def url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of ``kind`` holding run ``r`` of ``loop``, waiting for its signal."""
    config = fresh_config(kind, request, tmp_path)
    with open_store(config) as store, pytest.raises(Suspended):
        run("r", loop, store)
    return config


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_show_and_journal_list_the_calls(url: str) -> None:
    """``runs show`` has a journal section; ``runs journal`` lists the calls, as JSON too."""
    code, shown, err = cli("runs", "show", "r", "--store", url)
    assert code == 0, err
    assert "journal:  3 calls" in shown
    assert "revise#2" in shown and "SEQ" in shown and "BYTES" in shown
    code, listed, err = cli("runs", "journal", "r", "--store", url, "--json")
    assert code == 0, err
    calls = json.loads(listed)
    assert [(c["seq"], c["call"], c["name"], c["ordinal"]) for c in calls] == [
        (0, "draft#1", "draft", 1),
        (1, "revise#1", "revise", 1),
        (2, "revise#2", "revise", 2),
    ]
    assert all(c["attempt"] == 1 and c["size"] > 0 and c["at"] for c in calls)
    code, table, err = cli("runs", "journal", "r", "--store", url)
    assert code == 0 and "revise#1" in table and "ok" in table, err


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_fork_and_rerun_take_a_call_name(url: str) -> None:
    """``runs fork r revise#1 f`` keeps calls up to it; ``runs rerun r revise#2`` cuts before."""
    code, said, err = cli("runs", "fork", "r", "revise#1", "f", "--store", url)
    assert code == 0, err
    assert "after call revise#1" in said
    code, said, err = cli("runs", "rerun", "r", "revise#2", "--store", url)
    assert code == 0, err
    assert "runs again from call revise#2" in said
    with open_store(url) as store:
        assert [e.call for e in stepstone.journal(store, "f")] == ["draft#1", "revise#1"]
        assert [e.call for e in stepstone.journal(store, "r")] == ["draft#1", "revise#1"]
        signal(store, "r", "go")
        assert run("r", loop, store)["result"] == "R1"
    code, _, err = cli("runs", "rerun", "r", "revise", "--store", url)
    assert code == 2 and "NAME#N" in err
    code, _, err = cli("runs", "fork", "r", "nope#1", "g", "--store", url)
    assert code != 0 and "no journaled call 'nope#1'" in err
