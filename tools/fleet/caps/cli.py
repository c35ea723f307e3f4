"""``python -m fleet.caps run --load all --backends all``: campaigns, a table of results.

``worker SPEC`` is one worker process (the harness starts them). ``run`` runs each
workload on each backend (file, sqlite, postgresql, mysql, cosmos: a fresh directory,
table or container, the tables dropped after; the memory store lives in one process and
is not a fleet's store) and prints a Markdown row per campaign; the exit status is 1 if
any invariant failed. ``cosmos`` starts an emulator (``tests/cosmos_emulator.py``) for
the command, once, and stops it at the end; ``all`` leaves it out (it costs minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import warnings
from typing import Any

from ..backends import (
    check_sql,
    cosmos_config,
    cosmos_emulator_module,
    drop_table,
    local_config,
    sql_config,
)
from .harness import CapOptions, CapResult, run_campaign
from .loads import LOADS

__all__ = ["main", "row"]

BACKENDS = ("file", "sqlite", "postgresql", "mysql", "cosmos")
#: What ``--backends all`` runs: Cosmos only when asked by name (an emulator's minutes).
ALL = ("file", "sqlite", "postgresql", "mysql")
HEADER = (
    "| workload | backend | mode | size | deaths (points); freezes, SIGTERMs | seconds "
    "| figures | invariants |\n"
    "|---|---|---|---|---|---|---|---|"
)


def row(result: CapResult) -> str:
    """Return ``result`` as a Markdown table row."""
    points = ", ".join(f"{p} {n}" for p, n in sorted(result.points.items()))
    figures = ", ".join(f"{k} {v}" for k, v in result.verdict.figures.items())
    verdict = "hold" if not result.verdict.failures else "FAILED"
    return (
        f"| {result.load} | {result.backend} | {result.mode} | {result.size} "
        f"| {result.deaths} ({points}); frozen {result.freezes}, SIGTERM {result.terms} "
        f"| {result.seconds:.1f} | {figures} | {verdict} |"
    )


def start_emulator(stack: contextlib.ExitStack) -> Any:
    """Start a Cosmos emulator that ``stack`` stops; its key goes to the workers' env."""
    print("cosmos: starting the emulator (tests/cosmos_emulator.py)...", flush=True)
    emulator = stack.enter_context(cosmos_emulator_module().cosmos_emulator())
    # The workers inherit the environment: the config string carries no key.
    os.environ["AZURE_COSMOS_KEY"] = emulator.key
    os.environ.pop("AZURE_COSMOS_CONNECTION_STRING", None)
    return emulator


def campaign(
    load: str,
    backend: str,
    size: int,
    kills: int,
    seed: int,
    mode: str,
    faults: tuple[int, int],
    emulator: Any = None,
) -> CapResult:
    """Run ``load`` on a fresh store of ``backend`` (``cosmos``: a container on ``emulator``)."""
    with tempfile.TemporaryDirectory(prefix=f"caps-{load}-") as tmp:
        table = None
        if backend in ("file", "sqlite"):
            config = local_config(backend, tmp)
        elif backend == "cosmos":
            config = cosmos_config(emulator)
        else:
            check_sql(backend)
            config, table = sql_config(backend)
        try:
            freezes, terms = faults
            opts = CapOptions(
                load,
                backend,
                config,
                size,
                kills=kills,
                seed=seed,
                mode=mode,
                freezes=freezes,
                terms=terms,
            )
            return run_campaign(opts, f"{tmp}/logs")
        finally:
            if table is not None:
                drop_table(backend, table)


def main(argv: list[str]) -> int:
    """Run the command line; return the exit status."""
    if argv[:1] == ["worker"]:
        from .child import child_main  # noqa: PLC0415 - only a worker needs the store

        return child_main(json.loads(argv[1]))
    parser = argparse.ArgumentParser(prog="python -m fleet.caps")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run campaigns and print their results")
    run.add_argument("--load", default="all", help=f"one of {sorted(LOADS)}, or all")
    run.add_argument(
        "--backends", default="sqlite", help=f"comma list of {BACKENDS}, or all ({', '.join(ALL)})"
    )
    run.add_argument(
        "--size", type=int, default=30, help="runs (flow, spend), minute slots (sched)"
    )
    run.add_argument("--kills", type=int, default=8, help="kill plans handed out per campaign")
    run.add_argument("--freezes", type=int, default=0, help="workers frozen past their lease")
    run.add_argument("--terms", type=int, default=0, help="workers stopped with SIGTERM")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--mode", default="sync", help="sync (Worker.serve), async (aserve), both")
    args = parser.parse_args(argv)
    loads = sorted(LOADS) if args.load == "all" else args.load.split(",")
    backends = ALL if args.backends == "all" else tuple(args.backends.split(","))
    for backend in backends:
        if backend not in BACKENDS:
            raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    # The local Cosmos emulator's certificate is self-signed (config says verify=false).
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    failed = False
    modes = ("sync", "async") if args.mode == "both" else (args.mode,)
    with contextlib.ExitStack() as stack:
        emulator = start_emulator(stack) if "cosmos" in backends else None
        print(HEADER, flush=True)
        for load, backend, mode in ((x, b, m) for x in loads for b in backends for m in modes):
            faults = (args.freezes, args.terms)
            result = campaign(
                load, backend, args.size, args.kills, args.seed, mode, faults, emulator
            )
            print(row(result), flush=True)
            for failure in result.verdict.failures:
                print(f"    {failure}", flush=True)
            failed = failed or bool(result.verdict.failures)
    return 1 if failed else 0
