"""Chaos for code workflows (issue 31): generated ``@workflow`` runs killed between journal
appends, finished by fresh processes (``tools/chaos/code.py``).

Per durable backend and mode (a plain ``def`` under ``run``, an ``async def`` under
``arun``), two generated cases of a fixed seed: loops of calls, parallel calls, waits,
sleeps, ``ctx.map`` children, ``ctx.now``/``uuid``/``random``, killed by SIGKILL inside
calls, before and after their journal saves, while a signal is consumed and while
children are made. Every rule of ``chaos.code.check`` must hold: 0 violations.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos.code import run_case

from fresh_stores import fresh_table

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]

#: A seed whose first two cases die in every mode (2 deaths each), so kills happen.
SEED = 11


@pytest.fixture(params=["file", "sqlite", "postgresql", "mysql"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh durable store (a new table on the servers, dropped after)."""
    if request.param == "file":
        return f"file://{tmp_path}/runs"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    if request.param == "mysql":
        return fresh_table(request, "mysql://root@127.0.0.1:3306/test")
    return fresh_table(request, "postgresql://postgres@127.0.0.1:5432/test")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_code_workflows_survive_kills_between_journal_appends(
    config: str, mode: str, tmp_path: Path
) -> None:
    """Killed at every kind of point, each case finishes exactly as a crash-free run would."""
    deaths = 0
    for case in range(2):
        bad, figures = run_case(config, SEED, case, mode, str(tmp_path))
        assert bad == [], f"seed {SEED} case {case} {mode}: {figures}\n" + "\n".join(bad)
        deaths += figures["deaths"]
    assert deaths >= 2, f"seed {SEED}: only {deaths} deaths: the kill plan no longer kills"
