"""``stepstone runs budget``, ``runs list --over-budget`` and spend in ``runs show``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_support import cli
from fresh_stores import fresh_config
from stepstone import Budget, Step, StepContext, Suspended, open_store, run


def _spender(state: dict[str, Any], ctx: StepContext) -> None:
    ctx.charge(usd=3, tokens=5, ref=f"resp-{ctx.run_id}-{ctx.step_name}")


STEPS = [Step("a", _spender), Step("b", _spender)]


@pytest.fixture
def kind() -> str:
    """The store's backend: SQLite, unless a test runs on more (it parametrizes ``kind``)."""
    return "sqlite"


@pytest.fixture
def config(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of ``kind`` holding a run paused at its budget and a run with no budget."""
    url = fresh_config(kind, request, tmp_path)
    with open_store(url) as store:
        with pytest.raises(Suspended):
            run("paused", STEPS, store, budget=Budget(usd=2))
        run("free", STEPS, store)
        run("plain", [Step("x", lambda state: None)], store)
    return url


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_list_shows_spend_and_filters_the_runs_over_budget(config: str) -> None:
    """The SPEND column shows each run's spend; --over-budget keeps the paused run only."""
    listed = cli("runs", "list", "--store", config)
    assert listed.returncode == 0, listed.stderr
    assert "SPEND" in listed.stdout and "$3 of $2, 5 tokens, OVER BUDGET" in listed.stdout
    over = cli("runs", "list", "--store", config, "--over-budget", "--json")
    assert [row["run_id"] for row in json.loads(over.stdout)] == ["paused"]
    assert json.loads(over.stdout)[0]["spend"]["over"] is True


def test_show_prints_the_spend(config: str) -> None:
    """runs show has a spend line, runs show --json a spend object (None without a ledger)."""
    shown = cli("runs", "show", "paused", "--store", config)
    assert "spend:" in shown.stdout and "OVER BUDGET" in shown.stdout
    data = json.loads(cli("runs", "show", "free", "--store", config, "--json").stdout)
    assert data["spend"]["usd"] == 6.0 and data["spend"]["limit_usd"] is None
    plain = json.loads(cli("runs", "show", "plain", "--store", config, "--json").stdout)
    assert plain["spend"] is None


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_raising_from_the_command_line_resumes_the_paused_run(config: str) -> None:
    """--raise-usd makes the run due and the next run finishes it; a repeated --id is a no-op."""
    raised = cli("runs", "budget", "paused", "--raise-usd", "5", "--id", "r1", "--store", config)
    assert raised.returncode == 0, raised.stderr
    assert "raised the budget of run 'paused' by $5" in raised.stdout
    again = cli("runs", "budget", "paused", "--raise-usd", "5", "--id", "r1", "--store", config)
    assert "already raised" in again.stdout
    with open_store(config) as store:
        run("paused", STEPS, store)
    data = json.loads(cli("runs", "budget", "paused", "--store", config, "--json").stdout)
    assert data["status"] == "done"
    assert (data["spend"]["usd"], data["spend"]["limit_usd"]) == (6.0, 7.0)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--raise-usd", "-1"], "finite number > 0"),
        (["--raise-usd", "lots"], "not a number of dollars"),
        (["--raise-tokens", "0"], "--raise-tokens"),
        (["--id", "x"], "--id needs --raise-usd or --raise-tokens"),
    ],
)
def test_bad_raises_are_refused_and_nothing_is_recorded(
    config: str, args: list[str], says: str
) -> None:
    """A bad amount is a usage error naming it; the run's signals stay as they were."""
    done = cli("runs", "budget", "paused", *args, "--store", config)
    assert done.returncode == 2 and says in done.stderr
    with open_store(config) as store:
        cp = store.load("paused")
        assert cp is not None and not cp.signals


def test_an_unknown_run_is_an_error(config: str) -> None:
    """runs budget on a run that does not exist fails with exit 1, naming it."""
    done = cli("runs", "budget", "nope", "--raise-usd", "1", "--store", config)
    assert done.returncode == 1 and "nope" in done.stderr
