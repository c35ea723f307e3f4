"""Churn cases at CI size: long states deleted and started again under the same ids,
processes killed inside piece writes, deletes and collections, and the final sweep.

``tools/chaos/churn.py`` is the harness; ``scripts/chaos --churn`` runs it at any size.
Each durable backend, both modes: every acknowledged save loads after every death, and
once every run is deleted and orphans collected no piece is left under any id used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chaos.churn import check_churn, final_sweep
from test_chaos import (  # type: ignore[import-not-found]  # beside this file; tools/chaos is `chaos`
    DEATHS,
    DEATHS_SHARE,
    MIN_DEATHS,
    _options,
    backend,
    mode,
)

import chaos
from stepstone import Checkpoint, open_store
from stepstone._statelog import Piece

__all__ = ["backend", "mode"]  # the fixtures, shared with test_chaos.py

pytestmark = [
    pytest.mark.crash,
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

#: The points a churn case must die at on every backend.
CLEANUP_POINTS = {"pieces.deleting", "pieces.collecting"}


@pytest.mark.parametrize("name", chaos.BACKENDS)
def test_cleanup_kill_points_come_from_the_store_class(name: str) -> None:
    """Every durable backend declares kill points inside delete and collect_orphans."""
    points = chaos.cleanup_kill_points(name)
    assert set(points) == CLEANUP_POINTS, f"{name}: cleanup_kill_points {dict(points)}"
    assert "pieces.piece" in chaos.piece_kill_points(name), name


def test_churn_keeps_every_acknowledged_save_and_leaves_no_piece(
    backend: tuple[str, str], mode: str, tmp_path: Path
) -> None:
    """Churn and long cases killed at piece, delete and collection points: 0 violations,
    0 pieces left after the final sweep."""
    opts = _options(backend, tmp_path, long=True, churn=True, mode=mode)
    share = DEATHS_SHARE.get(backend[0], 1.0)
    # A quarter of the chaos run's deaths: 25 on file and SQLite, the floor elsewhere,
    # already reach both clean-up points in both modes (checked below); a churn case costs
    # ~1-3 s a death, and the big sizes are scripts/chaos --churn's (README's table).
    deaths = max(MIN_DEATHS, int(DEATHS * share / 4))
    stats = chaos.run_shard(opts, iter(range(10**9)), deaths_target=deaths)
    print(
        f"chaos churn {backend[0]} {mode}: {sum(stats.deaths.values())} deaths, "
        f"{dict(stats.scenarios)}, {stats.saves} acknowledged churn saves, {stats.orphans} "
        f"orphans collected, {stats.pieces_left} pieces left, {len(stats.violations)} violations"
    )
    assert not stats.violations, "\n".join(stats.violations)
    assert stats.scenarios["churn"] and stats.saves
    assert stats.pieces_left == 0
    missed = [p for p in sorted(CLEANUP_POINTS) if not stats.deaths[p]]
    assert not missed, f"clean-up kill points never reached: {missed} ({dict(stats.deaths)})"


def test_check_churn_reports_a_lost_acknowledged_save(tmp_path: Path) -> None:
    """An acknowledged save that no longer loads is a violation naming the run."""
    ops = tmp_path / "ops.log"
    ops.write_text(json.dumps(["ack", "churn/x", "0123456789abcdef"]) + "\n", encoding="utf-8")
    violations: list[str] = []
    with open_store(f"file://{tmp_path}/runs") as store:
        saves = check_churn(violations, store, str(ops), ["churn/x"], "here")
    assert saves == 1
    assert len(violations) == 1 and "'churn/x' holds None" in violations[0], violations


def test_final_sweep_counts_a_piece_nobody_names(tmp_path: Path) -> None:
    """A piece no collection may take (a legacy key under a deleted run) is counted as left."""
    violations: list[str] = []
    with open_store(f"file://{tmp_path}/runs") as store:
        store.save(Checkpoint(run_id="kept", step=0, state={"a": 1}, step_names=("a",)))
        store.put_pieces("gone", [Piece("0.abc.0", 0, b"{}")])
        collected, left = final_sweep(violations, store, ["gone"])
        assert store.load("kept") is None, "the sweep deletes every run"
    assert (collected, left) == (0, 1)
    assert len(violations) == 1 and "1 pieces left under 'gone'" in violations[0], violations
