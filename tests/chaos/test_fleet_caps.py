"""Flow control, schedules and budgets under worker deaths: the capability campaigns at CI size.

The harness lives in ``tools/fleet/caps`` (``python -m fleet.caps run --load all
--backends all`` runs it at any size; the last figures are in docs/proof.md). Each
test starts 3 worker processes on a fresh store, SIGKILLs them at the workload's kill
points (replacements start at once) and checks the workload's invariants:

- flow: never more than 2 holders of the concurrency key at once, no acquisitions
  over the GCRA bound of the rate key, no slot or waiter left after the last fault,
  every run done; its campaign also freezes 2 workers past their lease (SIGSTOP, then
  SIGCONT: their runs and slots are taken over, their thawed work fenced) and stops 1
  gracefully (SIGTERM), replaced like the dead;
- sched: a minute schedule under a 60x schedule clock: exactly one run per slot,
  ``fired`` equal to the slots, nothing pending or skipped;
- spend: each ledger's confirmed total is its steps' prices (one ref per step), its
  unconfirmed reservations exactly the attempts that reserved and died, each root's
  pool exactly the child attempts that reached it.

One backend each (a campaign costs 10-20 s), the budgets under ``Worker.aserve``; the
kill plans are seeded.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from fleet.backends import local_config
from fleet.caps import CapOptions, run_campaign
from fleet.caps.common import Verdict
from fleet.caps.flow import RATE, SLACK, _fenced, _max_overlap, _rate_excess, _thawing
from fleet.caps.sched import unexplained_reruns
from fleet.caps.spend import _Default, _ledger_check

from stepstone._budget import SPEND_KEY

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(300)]

CAMPAIGNS = [
    # flow also freezes 2 workers past their lease (SIGSTOP, SIGCONT) and stops 1 (SIGTERM)
    pytest.param("flow", "sqlite", "sync", 20, 2, 1, id="flow-sqlite"),
    pytest.param("sched", "file", "sync", 6, 0, 0, id="sched-file"),
    # aserve: the step runs in a thread, the pool charge in the event loop's
    pytest.param("spend", "sqlite", "async", 6, 0, 0, id="spend-sqlite-aserve"),
]


@pytest.mark.parametrize(("load", "backend", "mode", "size", "freezes", "terms"), CAMPAIGNS)
def test_capability_under_kills(
    load: str, backend: str, mode: str, size: int, freezes: int, terms: int, tmp_path: Path
) -> None:
    """Workers killed at the workload's points (and frozen, stopped) leave its invariants."""
    config = local_config(backend, str(tmp_path))
    opts = CapOptions(
        load,
        backend,
        config,
        size,
        kills=5,
        seed=7,
        timeout=150,
        mode=mode,
        freezes=freezes,
        terms=terms,
        fault_every=0.5,
    )
    result = run_campaign(opts, str(tmp_path / "logs"))
    assert result.verdict.failures == [], result.verdict.failures
    assert result.deaths > 0, f"no kill plan fired: {result.points}"  # faults really landed
    assert (result.freezes, result.terms) == (freezes, terms), "not every freeze/stop landed"


def test_flow_checks_catch_violations() -> None:
    """The overlap and rate checks see a third holder and a burst over the GCRA bound."""

    assert _max_overlap([(0.0, 2.0), (1.0, 3.0)]) == 2
    assert _max_overlap([(0.0, 2.0), (1.0, 3.0), (1.5, 4.0)]) == 3
    assert _max_overlap([(0.0, 1.0), (1.0, 2.0)]) == 1  # an end before a start at one time
    assert _rate_excess([i * 0.25 for i in range(12)])[0] <= 0  # 4/s: the bound exactly
    burst = [0.01 * i for i in range(RATE + 3)]  # RATE + 3 in 60 ms: 1 over the slack
    assert _rate_excess(burst)[0] > 0


def test_flow_checks_fence_a_frozen_holder_taken_over() -> None:
    """A hold frozen and taken over counts until its freeze; one not taken over, to its end."""
    hold = {"run": "r", "pid": 1, "t": 10.0, "x": "a"}
    freeze = {"pid": 1, "t0": 11.0, "t1": 17.0}
    again = {"run": "r", "pid": 2, "t": 16.5, "x": "b"}  # another worker took the run over
    assert _fenced(hold, 17.5, [freeze], {"a": hold, "b": again}) == 11.0
    assert _fenced(hold, 17.5, [freeze], {"a": hold}) == 17.5
    assert _fenced(hold, 17.5, [{**freeze, "pid": 3}], {"a": hold, "b": again}) == 17.5
    assert _thawing({"pid": 1, "t": 17.0 + SLACK / 2}, [freeze])
    assert not _thawing({"pid": 1, "t": 17.0 + SLACK * 2}, [freeze])
    assert not _thawing({"pid": 2, "t": 12.0}, [freeze])


def test_sched_check_explains_reruns_by_deaths_and_freezes() -> None:
    """A slot's step run twice is explained only by a worker that died or froze."""
    first = {"k": "tick", "run": "sched/tick/a", "pid": 1}
    again = {"k": "tick", "run": "sched/tick/a", "pid": 2}
    assert unexplained_reruns([first, again], {}, []) == ["sched/tick/a"]
    assert unexplained_reruns([first, again], {1: 5.0}, []) == []
    assert unexplained_reruns([first, again], {}, [{"pid": 1, "t0": 4.0, "t1": 9.0}]) == []
    assert unexplained_reruns([again, again], {1: 5.0}, []) == ["sched/tick/a"]


def _cp(ledger: dict[str, object]) -> SimpleNamespace:
    """A done checkpoint with ``ledger`` (what ``spend_of`` reads of one)."""
    return SimpleNamespace(state={SPEND_KEY: ledger}, signals=[], waiting_for=None, status="done")


def test_spend_check_catches_a_wrong_ledger() -> None:
    """A reservation no dead attempt made, or a charge counted twice, fails the check."""
    ledger = {
        "usd": 0.75,
        "refs": {"r/s0/a": "s0", "r/s2/b": "s2"},
        "unconfirmed": [{"id": "1", "step": "s0", "attempt": "1.0", "usd": 1.0, "tokens": 0}],
    }
    prices = {"s0": 0.25, "s2": 0.5}
    died_in_s0 = _Default({("r", "s0"): {"a", "z"}, ("r", "s2"): {"b"}})  # z reserved, died
    good = Verdict()
    assert _ledger_check(good, "r", _cp(ledger), prices, died_in_s0) == 1
    assert good.failures == []
    none_died = _Default({("r", "s0"): {"a"}, ("r", "s2"): {"b"}})
    bad = Verdict()
    _ledger_check(bad, "r", _cp(ledger), prices, none_died)
    assert any("unconfirmed" in failure for failure in bad.failures)
    twice = {**ledger, "usd": 1.0, "refs": {**ledger["refs"], "r/s0/c": "s0"}}  # type: ignore[dict-item]
    bad = Verdict()
    _ledger_check(bad, "r", _cp(twice), prices, died_in_s0)
    assert any("not one per step" in failure for failure in bad.failures)
