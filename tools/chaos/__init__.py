"""The chaos harness: generated workflows, real process deaths at chosen points, resume.

Repository tooling, not part of the stepstone wheel (nothing in ``src/`` imports it).
Everything is derived from ``(seed, case)``, so any failing case reruns exactly with::

    scripts/chaos --backend file --seed 1234 --case 17 [--mode async]

One module per concern:

- ``workload``: the generated workflow and its crash-free states (no store, no process);
- ``child``: what a child process runs: the kill hook, the steps, ``run`` or ``arun``;
- ``harness``: the driver: forking, killing, restarting, concurrent workers, shards;
- ``churn``: churn cases (long states deleted and started again, killed inside piece
  writes, deletes and collections) and the final sweep (no piece left);
- ``code``: the same for code workflows (``@workflow`` functions killed between
  journal appends), a campaign of its own (``tests/chaos/test_chaos_code.py``);
- ``invariants``: what must hold after every death and at the end;
- ``backends``: per-backend set-up (servers, tables, the emulator), capabilities read
  from the Store classes;
- ``readme``: the results table, RESULTS.md and the README's chaos block;
- ``cli``: ``scripts/chaos`` (argparse) and the entry of spawned processes.

The names below are what ``tests/chaos`` uses.
"""

from .backends import (
    BACKENDS,
    BIG_BUDGET,
    SQL_SERVERS,
    check_sql_server,
    cleanup_kill_points,
    drop_sql_tables,
    kill_points,
    new_table_name,
    piece_kill_points,
    save_kill_points,
    sql_config,
    sql_server,
)
from .child import MODES
from .harness import RUNNER_POINTS, CaseResult, Options, Stats, run_case, run_shard
from .invariants import seed_bystanders, snapshot
from .readme import TABLE_TITLE, parse_table, readme_block, render_table, update_readme
from .workload import Workflow, expected_states, make_workflow

__all__ = [
    "BACKENDS",
    "BIG_BUDGET",
    "MODES",
    "RUNNER_POINTS",
    "SQL_SERVERS",
    "TABLE_TITLE",
    "CaseResult",
    "Options",
    "Stats",
    "Workflow",
    "check_sql_server",
    "cleanup_kill_points",
    "drop_sql_tables",
    "expected_states",
    "kill_points",
    "piece_kill_points",
    "save_kill_points",
    "make_workflow",
    "new_table_name",
    "parse_table",
    "readme_block",
    "render_table",
    "run_case",
    "run_shard",
    "seed_bystanders",
    "snapshot",
    "sql_config",
    "sql_server",
    "update_readme",
]
