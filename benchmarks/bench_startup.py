"""Start-up cost: ``import stepstone`` and ``stepstone --help`` above a bare interpreter.

CPU time (user + system) of each child process, from ``os.wait4``'s resource usage, over
many repetitions interleaved round by round (bare ``python -c pass``, ``python -c
"import stepstone"``, ``stepstone --help``); reported as the median of the per-round
differences from the bare interpreter, with each command's own median. (``perf stat -e
instructions`` would be steadier, but this machine's virtual CPU exposes no instruction
counter; ``--callgrind`` adds callgrind instruction counts of each command instead.)

Then what the import pulls in: every module in ``sys.modules`` after ``import
stepstone`` (and after the CLI's ``--help``) whose top-level package is one of
sqlalchemy, azure, psycopg, pymysql, aiomysql or asyncio (none should be: a store's
driver is imported when a store of that kind is opened), and the slowest imports by
``-X importtime``.

Targets (issue 12): import at most 30 ms of CPU above a bare interpreter, ``--help`` at
most 50 ms.

    .venv/bin/python benchmarks/bench_startup.py [--repeats 40] [--json] [--callgrind]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import callgrind_count

FORBIDDEN = ("sqlalchemy", "azure", "psycopg", "pymysql", "aiomysql", "asyncio")
IMPORT_TARGET_MS = 30.0
HELP_TARGET_MS = 50.0


def commands(python: str) -> dict[str, list[str]]:
    cli = Path(python).with_name("stepstone")
    help_cmd = [str(cli), "--help"] if cli.exists() else [python, "-m", "stepstone", "--help"]
    return {
        "bare": [python, "-c", "pass"],
        "import": [python, "-c", "import stepstone"],
        "help": help_cmd,
    }


#: The children's environment (see ``child_env``).
ENV: dict[str, str] = dict(os.environ)


def child_env(bytecode: bool) -> dict[str, str]:
    """The environment to start the children in.

    With ``bytecode`` (the default), as an installed wheel runs: compiled bytecode cached
    (in ``benchmarks/.tmp/pycache`` via ``PYTHONPYCACHEPREFIX``, so nothing is written
    beside the sources) even when ``PYTHONDONTWRITEBYTECODE`` is set here, as it is on
    this project's machines; without it, every import compiles its module from source.
    """
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        prefix = Path(__file__).resolve().parent / ".tmp" / "pycache"
        prefix.mkdir(parents=True, exist_ok=True)
        env["PYTHONPYCACHEPREFIX"] = str(prefix)
    return env


def cpu_of(argv: list[str]) -> float:
    """CPU seconds (user + system) the child spent, its output discarded."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def modules_after(python: str, code: str) -> list[str]:
    out = subprocess.run(
        [python, "-c", code + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    ).stdout.split()
    return [m for m in out if m.split(".")[0] in FORBIDDEN]


HELP_CODE = """
import contextlib, io, sys
sys.argv = ['stepstone', '--help']
from stepstone.cli import main
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    main()
"""


def importtime(python: str, top: int = 12, runs: int = 5) -> list[tuple[str, float, float]]:
    """(module, self ms, cumulative ms) of the slowest imports under ``import stepstone``.

    Wall-clock times from ``-X importtime``, the least of ``runs`` runs per module (the
    run least disturbed by other work on the machine).
    """
    best: dict[str, tuple[float, float]] = {}
    for _ in range(runs):
        err = subprocess.run(
            [python, "-X", "importtime", "-c", "import stepstone"],
            capture_output=True,
            text=True,
            check=True,
            env=ENV,
        ).stderr
        for line in err.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
            if m:
                name, self_ms, cum_ms = m.group(4), int(m.group(1)) / 1000, int(m.group(2)) / 1000
                old = best.get(name)
                best[name] = (
                    (self_ms, cum_ms)
                    if old is None
                    else (min(old[0], self_ms), min(old[1], cum_ms))
                )
    rows = [(name, s, c) for name, (s, c) in best.items()]
    return sorted(rows, key=lambda r: -r[1])[:top]


def callgrind(argv: list[str]) -> int | None:
    """Instructions of ``argv`` (an interpreter and its arguments); None without valgrind."""
    if not shutil.which("valgrind"):
        return None
    return callgrind_count(argv[1:], ENV, python=argv[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, help="rounds (default 40, 15 with --quick)")
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--no-sql", action="store_true", help="accepted for run_all.py; no effect")
    p.add_argument("--json", action="store_true")
    p.add_argument("--callgrind", action="store_true", help="also count instructions")
    p.add_argument("--python", default=sys.executable)
    p.add_argument(
        "--no-bytecode",
        action="store_true",
        help="leave PYTHONDONTWRITEBYTECODE as it is: every import compiles from source",
    )
    args = p.parse_args()
    ENV.clear()
    ENV.update(child_env(not args.no_bytecode))
    args.repeats = args.repeats or (15 if args.quick else 40)
    cmds = commands(args.python)
    for argv in cmds.values():  # warm the page cache and .pyc files first
        cpu_of(argv)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    names = list(cmds)
    load0 = os.getloadavg()
    for r in range(args.repeats):
        order = names[r % 3 :] + names[: r % 3]
        for name in order:
            times[name].append(cpu_of(cmds[name]))
    diff = {
        k: [(a - b) * 1000 for a, b in zip(times[k], times["bare"], strict=True)]
        for k in ("import", "help")
    }
    result: dict[str, Any] = {
        "figure": "startup",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_start": [round(x, 2) for x in load0],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "repeats": args.repeats,
        "bytecode": "compiled from source at every import"
        if args.no_bytecode
        else "cached (PYTHONPYCACHEPREFIX), as an installed wheel",
        "commands": {k: " ".join(v) for k, v in cmds.items()},
        "cpu_ms": {k: round(statistics.median(v) * 1000, 2) for k, v in times.items()},
        "cpu_ms_min": {k: round(min(v) * 1000, 2) for k, v in times.items()},
        "above_bare_ms": {k: round(statistics.median(v), 2) for k, v in diff.items()},
        "targets_ms": {"import": IMPORT_TARGET_MS, "help": HELP_TARGET_MS},
        "heavy_modules_after_import": modules_after(args.python, "import stepstone"),
        "heavy_modules_after_help": modules_after(args.python, HELP_CODE),
        "slowest_imports": importtime(args.python),
    }
    if args.callgrind:
        counts = {k: callgrind(v) for k, v in cmds.items()}
        result["instructions"] = counts
        bare = counts["bare"]
        if bare:
            above: dict[str, int | None] = {}
            for k in ("import", "help"):
                got = counts[k]
                above[k] = None if got is None else got - bare
            result["instructions_above_bare"] = above
    if args.json:
        print(json.dumps(result))
        return
    print(f"bytecode: {result['bytecode']}")
    print(
        f"{result['date']}, {args.repeats} rounds, load {result['load_avg_start']} -> "
        f"{result['load_avg_end']}"
    )
    for k in cmds:
        extra = ""
        if k != "bare":
            above = result["above_bare_ms"][k]
            goal = result["targets_ms"][k]
            extra = (
                f"  above bare: {above:.1f} ms (target <= {goal:.0f} ms: "
                f"{'met' if above <= goal else 'MISSED'})"
            )
        print(
            f"  {k:7s} {result['cpu_ms'][k]:7.1f} ms CPU (min {result['cpu_ms_min'][k]:.1f})"
            f"{extra}   [{result['commands'][k]}]"
        )
    if "instructions" in result:
        print(
            f"  instructions: {result['instructions']}, above bare: "
            f"{result.get('instructions_above_bare')}"
        )
    for key, label in (
        ("heavy_modules_after_import", "import stepstone"),
        ("heavy_modules_after_help", "stepstone --help"),
    ):
        found = result[key]
        print(
            f"  after {label}: "
            + (", ".join(found) if found else f"none of {', '.join(FORBIDDEN)} imported")
        )
    print("  slowest imports (self ms, cumulative ms):")
    for name, self_ms, cum_ms in result["slowest_imports"]:
        print(f"    {self_ms:7.2f} {cum_ms:8.2f}  {name}")


if __name__ == "__main__":
    main()
