"""``scripts/fleet`` (``python -m fleet``): run fleet campaigns, print and save the figures.

``python -m fleet [OPTIONS]`` runs one campaign per backend, prints each result and its
violations, writes ``tests/chaos/FLEET.md`` (unless ``--no-write``) and with
``--update-readme`` copies it into the README's fleet block. Exit status 1 if any
invariant was violated. ``python -m fleet worker SPEC`` is a worker process (started by
the harness itself).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import warnings
from pathlib import Path

from .backends import (
    BACKENDS,
    REPO,
    check_sql,
    cosmos_config,
    cosmos_emulator_module,
    drop_table,
    local_config,
    sql_config,
)
from .harness import MODES, Options, Result, run_fleet
from .report import render, update_readme

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/fleet", description=__doc__.split("\n\n")[0])
    d = Options()
    p.add_argument("--backends", default="file,sqlite", help="comma list, or all")
    p.add_argument("--runs", type=int, default=d.runs)
    p.add_argument("--runs-of", action="append", default=[], metavar="BACKEND=N")
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--lease", type=float, default=d.lease)
    p.add_argument("--poll", type=float, default=d.poll)
    p.add_argument("--kills", type=int, default=d.kills)
    p.add_argument("--freezes", type=int, default=d.freezes)
    p.add_argument("--stops", type=int, default=d.stops, help="graceful stops (SIGTERM)")
    p.add_argument(
        "--point-kills",
        type=int,
        default=d.point_kills,
        help="kills a worker deals itself at a named runtime point (claim, renewal, ...)",
    )
    p.add_argument(
        "--points-first",
        action="store_true",
        help="fire the point kills before the other faults (the first at worker.claimed)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--signal-window", type=float, default=None, help="seconds (default: 0.06 x runs)"
    )
    p.add_argument(
        "--mode",
        default=d.mode,
        help="comma list of threads, async, mixed: one campaign per mode and backend",
    )
    p.add_argument(
        "--skew", type=float, default=d.skew, help="seconds of wall-clock skew between workers"
    )
    p.add_argument(
        "--drop-rings",
        type=float,
        default=d.drop_rings,
        help="fraction of each worker's wake-ups dropped at random (lost notifications)",
    )
    p.add_argument(
        "--step-max",
        type=float,
        default=d.step_max,
        help="most seconds a step sleeps (over a third of --lease: renewals inside steps)",
    )
    p.add_argument("--timeout", type=float, default=d.timeout)
    p.add_argument("--workdir", help="keep the stores and logs here (default: a temp dir)")
    p.add_argument("--out", default=str(REPO / "tests" / "chaos" / "FLEET.md"))
    p.add_argument("--no-write", action="store_true", help="print only, write no FLEET.md")
    p.add_argument("--update-readme", action="store_true", help="copy FLEET.md into README")
    return p


def _campaign(backend: str, opts: Options, stack: contextlib.ExitStack) -> Result:
    if backend in ("file", "sqlite"):
        return run_fleet(local_config(backend, opts.workdir), opts, backend)
    if backend in ("postgresql", "mysql"):
        check_sql(backend)
        config, table = sql_config(backend)
        try:
            return run_fleet(config, opts, backend)
        finally:
            drop_table(backend, table)
    emulator = getattr(stack, "emulator", None)
    if emulator is None:
        module = cosmos_emulator_module()
        print("cosmos: starting the emulator (tests/cosmos_emulator.py)...", flush=True)
        emulator = stack.enter_context(module.cosmos_emulator())
        stack.emulator = emulator  # type: ignore[attr-defined]
        os.environ["AZURE_COSMOS_KEY"] = emulator.key
        os.environ.pop("AZURE_COSMOS_CONNECTION_STRING", None)
    return run_fleet(cosmos_config(emulator), opts, backend)


def main(argv: list[str]) -> int:
    """Run the command line; return the exit status."""
    if argv[:1] == ["worker"]:
        from .worker import worker_main  # noqa: PLC0415

        return worker_main(json.loads(argv[1]))
    args = _parser().parse_args(argv)
    # The local Cosmos emulator's certificate is self-signed (config says verify=false).
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    backends = BACKENDS if args.backends == "all" else tuple(args.backends.split(","))
    for backend in backends:
        if backend not in BACKENDS:
            raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    modes = tuple(args.mode.split(","))
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    if not 0 <= args.drop_rings <= 1:
        raise SystemExit(f"--drop-rings must be a fraction from 0 to 1, got {args.drop_rings:g}")
    runs_of = {}
    for item in args.runs_of:
        name, _, n = item.partition("=")
        runs_of[name] = int(n)
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-"))
        for backend, mode in [(b, m) for b in backends for m in modes]:
            opts = Options(
                mode=mode,
                skew=args.skew,
                drop_rings=args.drop_rings,
                runs=runs_of.get(backend, args.runs),
                workers=args.workers,
                concurrency=args.concurrency,
                lease=args.lease,
                poll=args.poll,
                kills=args.kills,
                freezes=args.freezes,
                stops=args.stops,
                point_kills=args.point_kills,
                points_first=args.points_first,
                step_max=args.step_max,
                seed=args.seed,
                signal_window=args.signal_window or 0.06 * runs_of.get(backend, args.runs),
                timeout=args.timeout,
                workdir=str(Path(tmp) / f"{backend}-{mode}"),
            )
            print(
                f"{backend} ({mode}, skew {opts.skew:g} s): {opts.runs} runs, "
                f"{opts.workers} workers...",
                flush=True,
            )
            result = _campaign(backend, opts, stack)
            results.append(result)
            print(json.dumps(result.summary()), flush=True)
            for line in result.report.violations:
                print(f"  VIOLATION {line}", flush=True)
    # Where the logs were kept changes no figure: not part of the command shown.
    shown = list(argv)
    if "--workdir" in shown:
        at = shown.index("--workdir")
        del shown[at : at + 2]
    command = "scripts/fleet " + shlex.join(shown)
    text = render(results, command.strip())
    print(text)
    if not args.no_write:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    if args.update_readme:
        update_readme(REPO / "README.md", Path(args.out).read_text())
        print("updated the README's fleet block")
    return 1 if any(not r.ok for r in results) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
