"""``scripts/chaos``: the command line of the harness, and the entry of spawned processes.

``python -m chaos [OPTIONS]`` (``tools/`` on the path; ``scripts/chaos`` sets it up) runs
the harness and prints the results table; ``python -m chaos child SPEC`` and
``python -m chaos shard OPTIONS`` are the processes it starts itself.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from . import __doc__ as _package_doc
from .backends import BACKENDS, REPO, Servers
from .child import ERROR_EXIT, MODES, child_main
from .churn import churn_main
from .harness import LEASE, Options, Stats, child_env, run_shard
from .readme import machine_line, render_table, update_readme

__all__ = ["cli", "main"]


def _start_shard(opts: Options, cases: tuple[int, int, int], deaths: int | None) -> Any:
    os.makedirs(opts.workdir, exist_ok=True)
    spec = {
        "options": dataclasses.asdict(opts),
        "cases": list(cases),
        "deaths": deaths,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "chaos", "shard", json.dumps(spec)],
        stdout=subprocess.PIPE,
        env=child_env(),
    )


def _deaths_of(values: list[str]) -> dict[str, int]:
    out = {}
    for value in values:
        backend, _, n = value.partition("=")
        if backend not in BACKENDS or not n.isdigit():
            raise SystemExit(f"--deaths-of wants BACKEND=N with BACKEND in {BACKENDS}: {value!r}")
        out[backend] = int(n)
    return out


def cli(argv: list[str]) -> int:
    """``scripts/chaos``: run the harness and print (and save) the results table."""
    repo = REPO
    summary = (_package_doc or "the chaos harness").strip().split("\n")[0]
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=summary)
    parser.add_argument(
        "--backend",
        action="append",
        choices=(*BACKENDS, "all"),
        help="repeatable; 'all' is every backend; default file, sqlite",
    )
    parser.add_argument(
        "--mode",
        choices=(*MODES, "both"),
        default="both",
        help="drive each child with stepstone.run (sync), stepstone.arun (async) or "
        "both, each mode its own store and --deaths (default both)",
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=LEASE,
        help=f"seconds of the children's lease; every death costs the next process one "
        f"lease of watching unless it died on this machine (default {LEASE:g})",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--case", type=int, help="rerun exactly this case, verbosely")
    parser.add_argument(
        "--deaths",
        type=int,
        default=400,
        help="process deaths to inject per backend and mode (default 400)",
    )
    parser.add_argument(
        "--deaths-of",
        action="append",
        default=[],
        metavar="BACKEND=N",
        help="deaths for one backend, overriding --deaths (repeatable)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel drivers")
    parser.add_argument("--big", action="store_true", help="states near each backend's limit")
    parser.add_argument(
        "--long",
        choices=("mixed", "all", "none"),
        default="mixed",
        help="long-state cases (a growing transcript kept in pieces): half, all or none",
    )
    parser.add_argument(
        "--churn",
        action="store_true",
        help="every 5th case deletes and restarts long-state runs, killed inside piece "
        "writes, deletes and collections; a final sweep counts the pieces left",
    )
    parser.add_argument("--spawn", action="store_true", help="fresh interpreters, not fork")
    parser.add_argument("--max-deaths", type=int, default=8, help="deaths per case at most")
    parser.add_argument("--workdir", help="where stores and effects go (default: a temp dir)")
    parser.add_argument("--tmpfs", action="store_true", help="temp dir in /dev/shm (fast fsync)")
    parser.add_argument(
        "--cosmos-config",
        default=os.environ.get("STEPSTONE_CHAOS_COSMOS"),
        help="a cosmos:// config (key in AZURE_COSMOS_KEY); default: start the local "
        "emulator with tests/cosmos_emulator.py (Docker, or node off CI)",
    )
    parser.add_argument(
        "--results",
        default=str(repo / "tests" / "chaos" / "RESULTS.md"),
        help="markdown file the table is written to (with --case: not written)",
    )
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="only copy RESULTS.md into README.md between <!-- chaos:begin --> and "
        "<!-- chaos:end --> (nothing else in README.md changes), then exit",
    )
    args = parser.parse_args(argv)
    if args.update_readme:
        readme = repo / "README.md"
        changed = update_readme(readme, Path(args.results))
        print(f"{readme}: chaos block {'updated' if changed else 'already up to date'}")
        return 0
    chosen = args.backend or ["file", "sqlite"]
    backends = list(BACKENDS) if "all" in chosen else list(dict.fromkeys(chosen))
    modes = list(MODES) if args.mode == "both" else [args.mode]
    deaths_of = _deaths_of(args.deaths_of)
    keep = args.workdir is not None
    base = tempfile.gettempdir() if not args.tmpfs else "/dev/shm"
    workdir = args.workdir or tempfile.mkdtemp(prefix="stepstone-chaos-", dir=base)
    with contextlib.ExitStack() as stack:
        servers = Servers(workdir, args.cosmos_config, stack)
        for backend in backends:
            servers.prepare(backend)
        if args.cosmos_config and "cosmos" in backends and len(modes) > 1:
            raise SystemExit(
                "--cosmos-config names one container, and both modes would run the same "
                "run ids in it: give --mode sync or --mode async"
            )
        pairs = [(backend, mode) for backend in backends for mode in modes]
        if args.case is not None:
            return _cli_case(args, pairs, servers, workdir)
        return _cli_run(args, argv, pairs, deaths_of, servers, workdir, keep)
    return 1  # unreachable


#: ``--long`` to ``Options.long``.
_LONG: dict[str, bool | None] = {"mixed": None, "all": True, "none": False}


def _cli_case(args: Any, pairs: list[tuple[str, str]], servers: Servers, workdir: str) -> int:
    total = 0
    for backend, mode in pairs:
        opts = Options(
            backend,
            servers.config(backend, 0, mode),
            os.path.join(workdir, f"{backend}-{mode}-0"),
            seed=args.seed,
            big=args.big,
            spawn=args.spawn,
            max_deaths=args.max_deaths,
            verbose=True,
            mode=mode,
            lease=args.lease,
            long=_LONG[args.long],
            churn=args.churn,
        )
        os.makedirs(opts.workdir, exist_ok=True)
        print(f"{backend} {mode}: case {args.case} (seed {args.seed}), store {opts.config}")
        stats = run_shard(opts, [args.case], log=print)
        total += len(stats.violations)
        died = sum(stats.deaths.values())
        print(f"{backend} {mode}: {died} deaths, {len(stats.violations)} violations")
    print(f"files kept in {workdir}")
    return 1 if total else 0


def _cli_run(
    args: Any,
    argv: list[str],
    pairs: list[tuple[str, str]],
    deaths_of: dict[str, int],
    servers: Servers,
    workdir: str,
    keep: bool,
) -> int:
    began = time.monotonic()
    per_pair = max(1, args.jobs // len(pairs))
    procs = []
    for backend, mode in pairs:
        # A given --cosmos-config is one container: one shard, or the cases' run ids clash.
        shards = 1 if backend == "cosmos" and servers.cosmos else per_pair
        deaths = deaths_of.get(backend, args.deaths)
        for shard in range(shards):
            opts = Options(
                backend,
                servers.config(backend, shard, mode),
                # Each shard its own directory: effects files are named by case number.
                os.path.join(workdir, f"{backend}-{mode}-{shard}"),
                seed=args.seed,
                big=args.big,
                spawn=args.spawn,
                max_deaths=args.max_deaths,
                shard=shard,
                mode=mode,
                lease=args.lease,
                long=_LONG[args.long],
                churn=args.churn,
            )
            target = -(-deaths // shards)
            procs.append(((backend, mode), _start_shard(opts, (shard, 10**9, shards), target)))
    totals = {pair: Stats(pair[0], mode=pair[1]) for pair in pairs}
    failed = False
    for pair, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            print(
                f"{pair[0]} {pair[1]}: a driver failed with status {proc.returncode}",
                file=sys.stderr,
            )
            failed = True
            continue
        totals[pair].add(Stats.from_json(json.loads(out.decode().strip().splitlines()[-1])))
    seconds = time.monotonic() - began
    command = "scripts/chaos " + " ".join(argv) if argv else "scripts/chaos"
    table = render_table(
        [totals[p] for p in pairs], command.strip(), seconds, machine_line(workdir)
    )
    print(table)
    for stats in totals.values():
        for line in stats.violations:
            print(line)
    if not args.no_write:
        Path(args.results).write_text(table, encoding="utf-8")
        print(f"written to {args.results}")
    if not keep and not failed and not any(s.violations for s in totals.values()):
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed or any(s.violations for s in totals.values()) else 0


def main(argv: list[str]) -> int:
    """``child SPEC`` (spawn mode), ``shard OPTIONS`` (one driver), ``code-child SPEC`` (a
    code workflow's process, ``chaos.code``), else the command line."""
    if argv and argv[0] == "code-child":  # a code workflow's process (``chaos.code``)
        from .code import child_main as code_child  # noqa: PLC0415 - only that child needs it

        return code_child(json.loads(argv[1]))
    if not argv or argv[0] not in ("child", "churn", "shard"):
        return cli(argv)
    kind, payload_json = argv[0], argv[1]
    # The local emulator's self-signed certificate (verify=false): one warning per request.
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    spec = json.loads(payload_json)
    if kind in ("child", "churn"):
        try:
            code, result = child_main(spec) if kind == "child" else churn_main(spec)
        except BaseException as exc:  # noqa: BLE001 - the child reports every outcome to the driver as JSON
            code, result = ERROR_EXIT, {"error": repr(exc), "tb": traceback.format_exc()}
        print(json.dumps(result))
        return code
    if kind == "shard":
        opts = Options(**spec["options"])
        cases = spec["cases"]
        stats = run_shard(
            opts,
            iter(range(cases[0], cases[1], cases[2])),
            deaths_target=spec.get("deaths"),
            time_limit=spec.get("time_limit"),
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
        print(json.dumps(stats.to_json()))
        return 0
    raise SystemExit(f"unknown kind {kind!r}")
