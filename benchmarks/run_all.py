"""Run every benchmark, one after another, and write the results.

    .venv/bin/python benchmarks/run_all.py [--quick] [--no-cosmos] [--no-sql] [--no-peers]

Writes benchmarks/results.json (everything measured, with the machine and date),
benchmarks/results.md (the tables and the targets) and benchmarks/overhead.png (via
benchmarks/plot.py under a Python that has matplotlib: benchmarks/.venv-plot, else the
peers venv; skipped with a message when neither has it). Each script runs in its own
process, with a time limit, in sequence (never in parallel: they would measure each
other). Peers come from benchmarks/peers/peers.py run by benchmarks/.venv-peers when
that venv exists (bash benchmarks/peers/setup.sh makes it). PostgreSQL and MySQL/MariaDB
are measured in figures 1 and 3-6 when their servers answer (loopback by default, see
benchmarks/README.md); each script says "<backend> skipped: <reason>" otherwise.

Targets are checked and reported, never asserted: wall-clock figures on a shared
machine are noisy, so each is given with its spread and, where one exists, as a ratio
to a floor measured in the same process, interleaved.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import HERE, ROOT, TMP, scratch

from stepstone._bench import machine_info

PEERS_PY = HERE / ".venv-peers" / "bin" / "python"
PLOT_PYTHONS = [HERE / ".venv-plot" / "bin" / "python", PEERS_PY]

SCRIPTS = [
    # (figure, script, extra args, time limit in seconds)
    ("overhead", "bench_overhead.py", ["--cosmos"], 240),
    ("scale", "bench_scale.py", [], 480),
    ("state_size", "bench_state_size.py", [], 300),
    ("processes", "bench_processes.py", [], 300),
    ("requests", "bench_requests.py", [], 240),
    ("async", "bench_async.py", [], 900),
    ("threads", "bench_threads.py", [], 420),
    ("startup", "bench_startup.py", [], 300),
]
#: Every figure name ``--only`` accepts: the scripts', plus the peers and callgrind.
FIGURES = [name for name, *_ in SCRIPTS] + ["peers", "callgrind"]


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_script(script: str, extra: list[str], quick: bool, limit: float) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / script), "--json", *extra] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {limit} s", "seconds": limit}
    seconds = round(time.perf_counter() - t0, 1)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail), "seconds": seconds}
    payload: dict[str, Any] = json.loads(lines[-1])
    payload["seconds"] = seconds
    return payload


def run_peers(quick: bool, limit: float) -> dict[str, Any]:
    if not PEERS_PY.exists():
        return {"skipped": f"{PEERS_PY} not found (bash benchmarks/peers/setup.sh makes it)"}
    with scratch("peers") as tmp:
        cmd = [str(PEERS_PY), str(HERE / "peers" / "peers.py"), "--json", "--tmpdir", str(tmp)]
        # Bounded: peers.py's own full mode (5 x 1.5 s per config) runs 2-6 minutes here.
        cmd += ["--quick"] if quick else ["--repeats", "5", "--target-s", "0.75"]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT, check=False
            )
        except subprocess.TimeoutExpired:
            return {"skipped": f"peers.py timed out after {limit} s"}
    rows = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    out: dict[str, Any] = {
        "results": rows,
        "exit": done.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if not rows:
        out["skipped"] = "peers.py printed no results: " + " | ".join(
            (done.stderr or "").strip().splitlines()[-5:]
        )
    return out


def run_callgrind(before: str | None, limit: float) -> dict[str, Any]:
    """Instructions per operation by benchmarks/callgrind.sh: the work tree, and ``before``."""
    import shutil

    if not shutil.which("valgrind"):
        return {"skipped": "valgrind not found (apt-get install valgrind)"}
    out: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds")}
    for key, extra in (("after", []), ("before", ["--before", before] if before else None)):
        if extra is None:
            continue
        cmd = ["bash", str(HERE / "callgrind.sh"), "--json", *extra]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT, check=False
            )
        except subprocess.TimeoutExpired:
            out[key] = {"error": f"timed out after {limit} s"}
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        out[key] = json.loads(lines[-1]) if lines else {"error": done.stderr.strip()[-400:]}
    return out


# --- targets ------------------------------------------------------------------------------


def _row(figures: dict[str, Any], figure: str, **match: Any) -> dict[str, Any] | None:
    for r in figures.get(figure, {}).get("results", []) or []:
        if all(str(r.get(k, "")).startswith(str(v)) for k, v in match.items()):
            found: dict[str, Any] = r
            return found
    return None


def check_targets(figures: dict[str, Any], peers: dict[str, Any]) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []

    def add(name: str, goal: str, measured: str, met: bool | None) -> None:
        targets.append({"target": name, "goal": goal, "measured": measured, "met": met})

    sq = _row(figures, "overhead", backend="sqlite", durability="full")
    if sq and sq.get("save_over_floor"):
        r = sq["save_over_floor"]
        add(
            "SQLite durable save vs raw sqlite3 (WAL, synchronous=FULL)",
            "<= 1.15x",
            f"{r['median']:.2f}x [min {r['min']:.2f}, max {r['max']:.2f}] "
            f"(save {sq['save_us']['median']:.0f} us, floor {sq['floor_us']['median']:.0f} us)",
            r["median"] <= 1.15,
        )
    fl = _row(figures, "overhead", backend="file", durability="full")
    if fl and fl.get("save_over_floor"):
        r = fl["save_over_floor"]
        add(
            "file durable save vs write+fsync+rename+fsync(dir)",
            "<= 1.15x",
            f"{r['median']:.2f}x [min {r['min']:.2f}, max {r['max']:.2f}] "
            f"(save {fl['save_us']['median']:.0f} us, floor {fl['floor_us']['median']:.0f} us)",
            r["median"] <= 1.15,
        )
    scale = [r for r in figures.get("scale", {}).get("results", []) or [] if r["backend"] == "file"]
    if len(scale) >= 2:
        first, last = scale[0], scale[-1]
        add(
            f"file save at {last['stored_runs']:,} stored runs vs at {first['stored_runs']:,}",
            "<= 1.2x",
            f"{last['save_vs_first']:.2f}x by medians ({first['save_us']['median']:.0f} -> "
            f"{last['save_us']['median']:.0f} us); {last.get('save_over_floor_vs_first', 0):.2f}x "
            "after dividing each by its floor",
            _both(last["save_vs_first"] <= 1.2, last.get("save_over_floor_vs_first", 9) <= 1.2),
        )
    mem = _row(figures, "overhead", backend="memory")
    if mem and mem.get("overhead_per_step_us"):
        o = mem["overhead_per_step_us"]
        c = mem.get("overhead_per_step_cpu_us") or o
        add(
            "runner per-step overhead, memory store (quiet machine)",
            "<= 8 us",
            f"CPU time {c['median']:.1f} us [min {c['min']:.1f}, max {c['max']:.1f}]; wall "
            f"{o['median']:.1f} us [min {o['min']:.1f}, max {o['max']:.1f}]",
            _both(c["median"] <= 8, o["median"] <= 8),
        )
    peer_rows = [p for p in peers.get("results", []) if "per_step_us_median" in p]
    if sq and sq.get("overhead_per_step_us") and peer_rows:
        # Peers run in other processes, minutes apart from stepstone's figures, and fsync
        # latency here drifts several-fold within minutes. So each side is also divided by
        # its own floor, measured at the same moment: stepstone's by the raw sqlite3
        # upsert interleaved with it, the peers' by peers.py's raw-sqlite "matched" run.
        # The target is judged on those ratios; the absolute numbers are shown beside.
        ours = sq["overhead_per_step_us"]["median"]
        ours_ratio = (sq.get("overhead_over_floor") or {}).get("median")
        raw = next(
            (p for p in peer_rows if p["system"] == "raw-sqlite" and p["config"] == "matched"),
            None,
        )
        parts = []
        verdicts: list[bool] = []
        for p in peer_rows:
            if p["config"] != "matched" or p["system"] == "raw-sqlite":
                continue
            theirs = p["per_step_us_median"]
            text = f"{p['system']} {theirs:,.0f} us"
            if raw and ours_ratio:
                theirs_ratio = theirs / raw["per_step_us_median"]
                text += f" = {theirs_ratio:.2f}x its floor"
                verdicts.append(ours_ratio < theirs_ratio)
            parts.append(text)
        floor_note = (
            f" (peers' raw-sqlite floor {raw['per_step_us_median']:,.0f} us)" if raw else ""
        )
        add(
            "stepstone (sqlite, synchronous=FULL) per-step overhead below every peer at "
            "matched durability (WAL + synchronous=FULL, persist every step), each relative "
            "to its own same-moment raw-sqlite floor",
            "lower than each",
            f"stepstone {ours:,.0f} us = {ours_ratio or 0:.2f}x its floor "
            f"({sq['floor_us']['median']:,.0f} us); " + "; ".join(parts) + floor_note,
            all(verdicts) if verdicts else None,
        )
    targets += new_targets(figures)
    return targets


#: callgrind mode -> (what, instructions per save at most), issue 12.
INSTRUCTION_TARGETS = {
    "memory": ("memory store", 60_000),
    "sqlite": ("SQLite store (synchronous=FULL)", 120_000),
    "file": ("file store", 120_000),
}


def new_targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 12's targets: instructions per save, group commit, start-up."""
    targets: list[dict[str, Any]] = []

    def add(name: str, goal: str, measured: str, met: bool | None) -> None:
        targets.append({"target": name, "goal": goal, "measured": measured, "met": met})

    cg = figures.get("callgrind", {})
    after = (cg.get("after") or {}).get("instructions") or {}
    before = (cg.get("before") or {}).get("instructions") or {}
    for mode, (what, goal) in INSTRUCTION_TARGETS.items():
        if mode in after:
            was = (
                f" (before, {cg['before'].get('src')}: {before[mode]:,})" if mode in before else ""
            )
            if "build" in after:
                was += (
                    f"; of it building the Checkpoint {after['build']:,}, store.save alone "
                    f"{after[mode] - after['build']:,}"
                )
            add(
                f"CPU instructions per save of a 1 KB state, {what} (callgrind)",
                f"<= {goal:,}",
                f"{after[mode]:,}{was}",
                after[mode] <= goal,
            )
    th = figures.get("threads", {}).get("results") or []
    ov = _row(figures, "overhead", backend="sqlite", durability="full")
    fsync_us = (figures.get("threads", {}).get("fsync_floor_us") or {}).get("median") or (
        (ov or {}).get("floor_us", {}).get("median")
    )
    for backend, want in (("sqlite", 4.0), ("postgresql", 3.0)):
        rows = {r["threads"]: r for r in th if r["backend"] == backend}
        if 1 in rows and 64 in rows:
            r64 = rows[64]
            ratio = r64["steps_per_s"]["median"] / rows[1]["steps_per_s"]["median"]
            p99 = (r64.get("save_p99_us") or {}).get("median")
            text = (
                f"{ratio:.2f}x ({rows[1]['steps_per_s']['median']:,.0f} -> "
                f"{r64['steps_per_s']['median']:,.0f} steps/s), p99 save {p99 or 0:,.0f} us"
            )
            met = ratio >= want
            if backend == "sqlite" and fsync_us and p99:
                text += (
                    f" = {p99 / fsync_us:.1f} fsyncs (one fsync: the raw sqlite3 floor, "
                    f"{fsync_us:.0f} us)"
                )
                met = met and p99 <= 3 * fsync_us
            add(
                f"64 threads under run on one {backend} store vs 1 thread (group commit)",
                f">= {want:.0f}x" + (", p99 save <= 3 fsyncs" if backend == "sqlite" else ""),
                text,
                met,
            )
    st = figures.get("startup", {})
    above = st.get("above_bare_ms") or {}
    for key, what, goal in (("import", "import stepstone", 30), ("help", "stepstone --help", 50)):
        if key in above:
            add(
                f"{what}: CPU above a bare interpreter",
                f"<= {goal} ms",
                f"{above[key]:.1f} ms (median of {st.get('repeats')} interleaved rounds)",
                above[key] <= goal,
            )
    if "heavy_modules_after_import" in st:
        found = st["heavy_modules_after_import"] + st.get("heavy_modules_after_help", [])
        add(
            "import stepstone / --help import no SQLAlchemy, azure, driver or asyncio",
            "none",
            ", ".join(sorted(set(found))) or "none",
            not found,
        )
    return targets


def _both(a: bool, b: bool) -> bool | None:
    """Met if both measures agree it is, missed if both agree it is not, else unclear."""
    return a if a == b else None


# --- markdown -----------------------------------------------------------------------------


def f(d: dict[str, Any] | None, unit: str = "") -> str:
    if not d:
        return "-"
    if unit == "x":
        return f"{d['median']:.2f}x ({d['min']:.2f}-{d['max']:.2f})"
    return f"{_n(d['median'])} ({_n(d['min'])}-{_n(d['max'])})"


def _n(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def skipped_lines(figure: dict[str, Any]) -> list[str]:
    """The figure's "skipped" notes (a string in older results, a list now), as paragraphs."""
    notes = figure.get("skipped")
    if not notes:
        return []
    return [line for note in ([notes] if isinstance(notes, str) else notes) for line in (note, "")]


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
        *["| " + " | ".join(r) + " |" for r in rows],
        "",
    ]


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    disk = m.get("disk", {})
    figs = results["figures"]
    out = [
        "# stepstone benchmark results",
        "",
        f"{results['date']} UTC, {'quick' if results['quick'] else 'full'} run, "
        f"{results['total_s']:.0f} s in all. Machine: {m.get('nproc')} CPUs ({m.get('cpu', '?')}), "
        f"{m.get('memory_gib')} GiB memory, {disk.get('fstype', '?')} on {disk.get('device', '?')}"
        f"{' (rotational)' if disk.get('rotational') else ''}, Python {m.get('python')}, "
        f"SQLite {m.get('sqlite')}. Load average (1/5/15 min) at start "
        f"{results.get('loadavg_at_start')}, at end {m.get('loadavg_1_5_15')}: other work on "
        "the machine moves every absolute figure.",
        "",
        *_dates_line(results),
        "Every figure: median over repeats (min-max). Microseconds unless marked. Ratios are "
        "taken per repeat between measurements interleaved in the same process. Generated by "
        "`benchmarks/run_all.py`; see `benchmarks/README.md` for what each figure means.",
        "",
        "## Targets (checked, not asserted)",
        "",
    ]
    out += md_table(
        ["target", "goal", "measured", "met"],
        [
            [
                t["target"],
                t["goal"],
                t["measured"],
                {True: "yes", False: "**no**"}.get(t["met"], "unclear (noise)"),
            ]
            for t in results["targets"]
        ],
    )
    ov = figs.get("overhead", {})
    out += ["## Figures 1 and 2: per-step overhead and save/load cost", ""]
    if "error" in ov:
        out += [f"failed: {ov['error']}", ""]
    else:
        out += md_table(
            [
                "backend",
                "durability",
                "per-step overhead",
                "of it CPU",
                "floor",
                "overhead/floor",
                "save",
                "save/floor",
                "load",
            ],
            [
                [
                    r["backend"],
                    r["durability"],
                    f(r["overhead_per_step_us"]),
                    f(r.get("overhead_per_step_cpu_us")),
                    f(r["floor_us"]),
                    f(r["overhead_over_floor"], "x"),
                    f(r["save_us"]),
                    f(r["save_over_floor"], "x"),
                    f(r["load_us"]),
                ]
                for r in ov.get("results", [])
            ],
        )
        out += skipped_lines(ov)
    peers = results.get("peers", {})
    out += ["## Peers: per-step overhead (benchmarks/peers/peers.py)", ""]
    if peers.get("results"):
        out += md_table(
            ["system", "config", "per-step overhead", "notes"],
            [
                [
                    p.get("system", "?"),
                    p.get("config", "?"),
                    (
                        f"{_n(p['per_step_us_median'])} ({_n(p['per_step_us_min'])}-"
                        f"{_n(p['per_step_us_max'])})"
                    )
                    if "per_step_us_median" in p
                    else f"error: {p.get('error')}",
                    "; ".join(
                        x
                        for x in (
                            "/".join(str(v) for v in p.get("pragmas", {}).values()),
                            f"durability={p['durability']}" if "durability" in p else "",
                            "floor, not a peer" if p.get("system") == "raw-sqlite" else "",
                        )
                        if x
                    ),
                ]
                for p in peers["results"]
            ],
        )
    else:
        out += [peers.get("skipped", "not run"), ""]
    sc = figs.get("scale", {})
    out += ["## Figure 3: durable save cost vs runs already stored", ""]
    if "error" in sc:
        out += [f"failed: {sc['error']}", ""]
    else:
        out += md_table(
            [
                "backend",
                "stored runs",
                "populate",
                "save",
                "floor",
                "save/floor",
                "save vs smallest",
                "(save/floor) vs smallest",
                "load",
            ],
            [
                [
                    r["backend"],
                    f"{r['stored_runs']:,}",
                    f"{r['populate_s']:.1f} s ({r['populate_us_per_run'] or 0:.0f} us/run)",
                    f(r["save_us"]),
                    f(r["floor_us"]),
                    f(r["save_over_floor"], "x"),
                    f"{r['save_vs_first']:.2f}x",
                    f"{r.get('save_over_floor_vs_first', 0):.2f}x",
                    f(r["load_us"]),
                ]
                for r in sc.get("results", [])
            ],
        )
        out += [
            "Populate: file and sqlite through the store's own save at the weaker durability; "
            "postgresql and mysql by bulk `executemany` of the store's INSERT through the "
            "driver, 5,000 rows per transaction.",
            "",
        ]
        out += skipped_lines(sc)
    ss = figs.get("state_size", {})
    out += ["## Figure 4: save cost by state size (default durability)", ""]
    if "error" in ss:
        out += [f"failed: {ss['error']}", ""]
    else:
        out += md_table(
            ["shape", "size", "backend", "save", "floor", "save/floor", "encode_state", "load"],
            [
                [
                    r["shape"],
                    r["size"],
                    r["backend"],
                    f(r["save_us"]),
                    f(r["floor_us"]),
                    f(r["save_over_floor"], "x"),
                    f(r["encode_us"]),
                    f(r["load_us"]),
                ]
                for r in ss.get("results", [])
            ],
        )
        out += skipped_lines(ss)
    pr = figs.get("processes", {})
    out += ["## Figure 5: throughput with N processes on one store (steps/s)", ""]
    if "error" in pr:
        out += [f"failed: {pr['error']}", ""]
    else:
        out += md_table(
            ["backend", "durability", "processes", "steps/s", "vs 1 process", "per process"],
            [
                [
                    r["backend"],
                    r["durability"],
                    str(r["processes"]),
                    f(r.get("steps_per_s")) if "error" not in r else r["error"],
                    f"{r.get('speedup_vs_1', 0):.2f}x",
                    f(r.get("per_process_steps_per_s")),
                ]
                for r in pr.get("results", [])
            ],
        )
        out += skipped_lines(pr)
    rq = figs.get("requests", {})
    out += ["## Figure 6: requests per operation (Cosmos DB, PostgreSQL, MySQL/MariaDB)", ""]
    if "error" in rq:
        out += [f"failed: {rq['error']}", ""]
    elif rq.get("results"):
        out += requests_table(rq)
        out += skipped_lines(rq)
    else:
        out += skipped_lines(rq) or ["not run", ""]
    out += new_sections(results)
    out += ["![per-step overhead and save cost vs stored runs](overhead.png)", ""]
    return "\n".join(out)


def _dates_line(results: dict[str, Any]) -> list[str]:
    """When each figure was measured, if not all in this run (``--only`` merges)."""
    dates = {name: fig.get("date") for name, fig in results["figures"].items()}
    if results.get("peers", {}).get("date"):
        dates["peers"] = results["peers"]["date"]
    if all(d in (None, results["date"]) for d in dates.values()):
        return []
    return [
        "Figures from several runs (`run_all.py --only` merges): "
        + "; ".join(f"{name} {str(d)[:16].replace('T', ' ')}" for name, d in dates.items() if d)
        + ".",
        "",
    ]


def _when(fig: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """A figure measured in another run than the header's says when, and under what load."""
    date = fig.get("date")
    if not date or date == results.get("date"):
        return []
    load = ""
    if fig.get("load_avg_start"):
        load = f", load average {fig['load_avg_start']} -> {fig.get('load_avg_end')}"
    return [f"Measured {date}{load}.", ""]


def _callgrind_section(cg: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """Markdown for callgrind.sh's instruction counts, before and after, with the targets."""
    out: list[str] = []
    out += ["## Instructions per operation (benchmarks/callgrind.sh)", ""]
    out += _when(cg, results)
    if "skipped" in cg:
        out += [cg["skipped"], ""]
    else:
        after = (cg.get("after") or {}).get("instructions") or {}
        before = (cg.get("before") or {}).get("instructions") or {}
        labels = {
            "memory": "memory store save",
            "sqlite": "sqlite save (synchronous=FULL)",
            "file": "file save (fsync)",
            "sqlite-floor": "sqlite floor (raw sqlite3)",
            "file-floor": "file floor (write+fsync+rename+fsync)",
            "build": "building the Checkpoint saved (part of each save above)",
            "run-memory": "run() of 10 steps, memory store",
            "plain": "10 plain step calls",
        }
        rows = []
        for mode, label in labels.items():
            if mode not in after and mode not in before:
                continue
            goal = INSTRUCTION_TARGETS.get(mode, (None, None))[1]
            a, b = after.get(mode), before.get(mode)
            per_step = f" ({a // 10:,} per step)" if a and mode in ("run-memory", "plain") else ""
            rows.append(
                [
                    label,
                    f"{b:,}" if b else "-",
                    (f"{a:,}" if a else "-") + per_step,
                    f"{b / a:.2f}x" if a and b else "-",
                    f"<= {goal:,}" if goal else "",
                    "" if not goal or a is None else ("yes" if a <= goal else "**no**"),
                ]
            )
        src_b = (cg.get("before") or {}).get("src", "-")
        out += md_table(
            [
                "operation",
                f"before ({src_b})",
                "after (work tree)",
                "before/after",
                "target",
                "met",
            ],
            rows,
        )
        out += [
            "User-space instructions per operation (valgrind callgrind), (count at 2N - "
            f"count at N) / N with N = {(cg.get('after') or {}).get('n', '?')}: start-up "
            "and imports cancel out. The kernel's share (write, fsync, rename) is not "
            "counted. Repeatable to within a fraction of a percent whatever the load, but a "
            "pair in which one process does a one-off piece of work (it happened once "
            "to the file store) comes out wrong: rerun that mode."
            + (f" {cg['after']['note']}." if (cg.get("after") or {}).get("note") else ""),
            "",
        ]
    return out


def new_sections(results: dict[str, Any]) -> list[str]:
    """Markdown for the issue-12 figures: callgrind, async, threads, start-up."""
    figs = results["figures"]
    out: list[str] = []
    cg = figs.get("callgrind")
    if cg:
        out += _callgrind_section(cg, results)
    for key, title in (
        (
            "async",
            "Async: `arun` next to `run`, and N concurrent runs in one "
            "event loop (benchmarks/bench_async.py)",
        ),
    ):
        fig = figs.get(key)
        if not fig:
            continue
        out += [f"## {title}", ""]
        out += _when(fig, results)
        if "error" in fig:
            out += [f"failed: {fig['error']}", ""]
            continue
        rows = [
            [
                r["system"],
                f(r["overhead_per_step_us"].get("run")),
                f(r["overhead_per_step_us"].get("arun")),
            ]
            for r in fig.get("results", [])
        ]
        out += ["Per-step overhead (us), 10 steps of ~1 KB state, new run each, sequential:", ""]
        out += md_table(["system", "run (sync steps)", "arun / ainvoke (async def steps)"], rows)
        conc = [str(c) for c in fig.get("concurrency", [])]
        rows = []
        for r in fig.get("results", []):
            tp = r.get("throughput", {})
            one = (tp.get(conc[0]) or {}).get("steps_per_s", {}).get("median") if conc else None
            for n in conc:
                c = tp.get(n)
                if not c:
                    continue
                sps = c["steps_per_s"]["median"]
                rows.append(
                    [
                        r["system"],
                        n,
                        f(c["steps_per_s"]),
                        f"{sps / one:.2f}x" if one else "-",
                        f(c.get("save_p50_us")),
                        f(c.get("save_p99_us")),
                    ]
                )
        out += [
            f"Throughput with N runs in one event loop ({fig.get('window_s')} s windows after "
            "a warm-up; steps/s; save latency in us, of `asave` / LangGraph's `aput`):",
            "",
        ]
        out += md_table(
            ["system", "N", "steps/s", f"vs N={conc[0] if conc else '?'}", "save p50", "save p99"],
            rows,
        )
        vias = [f"- {r['system']}: {r['via']}" for r in fig.get("results", []) if r.get("via")]
        out += [*vias, ""] if vias else []
        out += skipped_lines(fig)
    th = figs.get("threads")
    if th:
        out += ["## Threads: N threads under `run` on one store (benchmarks/bench_threads.py)", ""]
        out += _when(th, results)
        if "error" in th:
            out += [f"failed: {th['error']}", ""]
        else:
            out += md_table(
                ["backend", "threads", "steps/s", "vs 1 thread", "save p50", "save p99"],
                [
                    [
                        r["backend"],
                        str(r["threads"]),
                        f(r["steps_per_s"]),
                        f"{r['vs_first']:.2f}x" if r.get("vs_first") else "-",
                        f(r.get("save_p50_us")),
                        f(r.get("save_p99_us")),
                    ]
                    for r in th.get("results", [])
                ],
            )
            fl = th.get("fsync_floor_us")
            out += [
                "Save latency in us. One fsync in the same run ("
                + str(th.get("fsync_floor", "raw sqlite3 upsert + commit"))
                + f"): {f(fl)} us."
                if fl
                else "Save latency in us.",
                "",
            ]
            out += skipped_lines(th)
    st = figs.get("startup")
    if st:
        out += ["## Start-up (benchmarks/bench_startup.py)", ""]
        out += _when(st, results)
        if "error" in st:
            out += [f"failed: {st['error']}", ""]
        else:
            cpu, above = st.get("cpu_ms", {}), st.get("above_bare_ms", {})
            out += md_table(
                ["command", "CPU ms (median)", "above bare", "target"],
                [
                    [
                        "`" + st["commands"][k].replace(str(ROOT) + "/", "") + "`",
                        f"{cpu[k]:.1f}",
                        f"{above[k]:.1f}" if k in above else "-",
                        {"import": "<= 30", "help": "<= 50"}.get(k, ""),
                    ]
                    for k in cpu
                ],
            )
            heavy = st.get("heavy_modules_after_import", []) + st.get(
                "heavy_modules_after_help", []
            )
            out += [
                f"CPU time (user + system) of each child from `wait4`, {st.get('repeats')} "
                "rounds interleaved. Modules of sqlalchemy, azure, psycopg, pymysql, "
                "aiomysql or asyncio loaded after `import stepstone` or `--help`: "
                + (", ".join(sorted(set(heavy))) or "none")
                + ".",
                "",
            ]
            slow = st.get("slowest_imports") or []
            if slow:
                out += [
                    "Slowest imports (`-X importtime`, least of 5 runs): "
                    + ", ".join(f"{name} {self_ms:.1f} ms" for name, self_ms, _ in slow[:8])
                    + ".",
                    "",
                ]
    return out


def requests_table(rq: dict[str, Any]) -> list[str]:
    """Figure 6 as one table: an operation per row, a backend per column."""
    rows = rq.get("results", [])
    via = rq.get("via")
    if not isinstance(via, dict):  # results from before PostgreSQL/MySQL: cosmos only
        via = {"cosmos": via}
    backends = list(dict.fromkeys(r.get("backend", "cosmos") for r in rows))
    by = {(r.get("backend", "cosmos"), r["operation"]): r for r in rows}
    operations = list(dict.fromkeys(r["operation"] for r in rows))
    out = [
        "Requests per call, ms per call in brackets. Cosmos DB: HTTP requests (what it "
        "bills, in RUs), latency of the emulator, not the service; PostgreSQL and "
        "MySQL/MariaDB: SQL statements, one round trip each, to a server on loopback. "
        "1 per save and 1 per load is the minimum.",
        "",
    ]
    out += md_table(
        ["operation", *backends],
        [
            [op]
            + [
                f"{by[b, op]['requests']:.2f} ({by[b, op]['ms']:.2f} ms)" if (b, op) in by else "-"
                for b in backends
            ]
            for op in operations
        ],
    )
    for b in backends:
        first = next(r for r in rows if r.get("backend", "cosmos") == b)
        out += [
            f"- {b}: {via.get(b, '?')}; {first['n']} calls each, counted by {first['counted_by']}"
        ]
    return [*out, ""]


def plot(results_path: Path, png: Path) -> str:
    for python in PLOT_PYTHONS:
        if not python.exists():
            continue
        has = subprocess.run(
            [str(python), "-c", "import matplotlib"], capture_output=True, check=False
        )
        if has.returncode != 0:
            continue
        done = subprocess.run(
            [str(python), str(HERE / "plot.py"), str(results_path), str(png)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode == 0:
            return f"wrote {png} (matplotlib from {python})"
        return f"plot failed: {done.stderr.strip().splitlines()[-1:]}"
    return "no plot: no venv with matplotlib (bash benchmarks/setup_plot.sh makes one)"


def _script_flags(args: argparse.Namespace, figure: str, extra: Sequence[str]) -> list[str]:
    """The command-line flags of one figure's script, the --no-* options passed down."""
    wanted = list(extra)
    if figure == "async" and args.no_peers:
        wanted.append("--no-peers")
    if figure == "async" and args.no_cosmos:
        wanted.append("--no-cosmos")
    flags = [x for x in wanted if not (args.no_cosmos and x == "--cosmos")]
    if args.no_cosmos and figure == "requests":
        flags.append("--no-cosmos")
    if args.no_sql:
        flags.append("--no-sql")
    return flags


def _merge_previous(
    old_path: Path, figures: dict[str, Any], peers: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Merge into what was measured before: the other figures keep their own dates."""
    old = json.loads(old_path.read_text()) if old_path.exists() else {}
    old_figures: dict[str, Any] = old.get("figures", {})
    for old_fig in old_figures.values():
        old_fig.setdefault("date", old.get("date"))
    old_figures.update(figures)
    if not peers:
        peers = old.get("peers", {})
        peers.setdefault("date", old.get("date"))
    return old_figures, peers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-cosmos", action="store_true", help="skip Cosmos DB")
    parser.add_argument("--no-sql", action="store_true", help="skip PostgreSQL and MySQL/MariaDB")
    parser.add_argument("--no-peers", action="store_true", help="skip peers.py")
    parser.add_argument("--out", default=str(HERE), help="folder for results.* and the PNG")
    parser.add_argument(
        "--only",
        metavar="FIGS",
        help="measure only these (comma-separated: " + ",".join(FIGURES) + ") and merge them "
        "into the existing results.json; each keeps its own date",
    )
    parser.add_argument("--no-callgrind", action="store_true", help="skip callgrind.sh")
    parser.add_argument(
        "--callgrind-before",
        metavar="REV",
        help="also count instructions of stepstone as committed at REV (the 'before')",
    )
    parser.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: re-check targets and rewrite results.md and the PNG from FILE",
    )
    args = parser.parse_args()
    out_dir = Path(args.out)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        results["targets"] = check_targets(results["figures"], results.get("peers", {}))
        write_outputs(results, out_dir)
        return

    TMP.mkdir(exist_ok=True)
    started = time.perf_counter()
    load_at_start = machine_info().get("loadavg_1_5_15")
    date = datetime.now(UTC).isoformat(timespec="seconds")
    only = set(args.only.split(",")) if args.only else set(FIGURES)
    unknown = only - set(FIGURES)
    if unknown:
        parser.error(f"--only: unknown figure(s) {sorted(unknown)}; choose from {FIGURES}")
    figures: dict[str, Any] = {}
    for figure, script, extra, limit in SCRIPTS:
        if figure not in only:
            continue
        flags = _script_flags(args, figure, extra)
        log(f"{script} ...")
        figures[figure] = run_script(script, flags, args.quick, limit)
        log(
            f"{script}: {figures[figure].get('seconds')} s"
            + (f", ERROR {figures[figure]['error']}" if "error" in figures[figure] else "")
        )
    for fig in figures.values():
        fig.setdefault("date", date)
    if "callgrind" in only and not args.no_callgrind:
        log("callgrind.sh ...")
        figures["callgrind"] = run_callgrind(args.callgrind_before, 1800)
        log("callgrind.sh done")
    peers: dict[str, Any]
    if "peers" not in only:
        peers = {}
    elif args.no_peers:
        peers = {"skipped": "--no-peers"}
    else:
        log("peers/peers.py ...")
        peers = run_peers(args.quick, 600)
        peers["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        log(f"peers: {peers.get('seconds')} s {peers.get('skipped', '')}")
    if args.only:
        figures, peers = _merge_previous(out_dir / "results.json", figures, peers)
    results = {
        "date": date,
        "quick": args.quick,
        "total_s": round(time.perf_counter() - started, 1),
        "machine": machine_info(str(TMP)),
        "loadavg_at_start": load_at_start,
        "figures": figures,
        "peers": peers,
    }
    results["targets"] = check_targets(figures, peers)
    write_outputs(results, out_dir)


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    results_path = out_dir / "results.json"
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "results.md").write_text(markdown(results))
    log(f"wrote {results_path} and {out_dir / 'results.md'}")
    log(plot(results_path, out_dir / "overhead.png"))
    for t in results["targets"]:
        mark = {True: "met    ", False: "MISSED ", None: "UNCLEAR"}[t["met"]]
        print(f"{mark} {t['target']}: {t['goal']}; measured {t['measured']}")


if __name__ == "__main__":
    main()
