"""Draw benchmarks/overhead.png from benchmarks/results.json (needs matplotlib).

Run by run_all.py with an interpreter that has matplotlib (benchmarks/.venv-plot, made
by benchmarks/setup_plot.sh, or the peers venv), never stepstone's own venv:

    benchmarks/.venv-plot/bin/python benchmarks/plot.py [results.json] [overhead.png]

Left: per-step overhead per stepstone backend and per peer (median, bars from min to
max over repeats; log scale). Middle: durable save cost against runs already stored,
with the floor measured beside it (file, sqlite, postgresql, mysql: whichever ran).
Right: steps/s against concurrency, N runs in one event loop under ``arun`` (stepstone
and LangGraph's async savers) and N threads under ``run``, when those figures ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib  # type: ignore[import-not-found, unused-ignore]

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

HERE = Path(__file__).resolve().parent


def overhead_bars(results: dict[str, Any]) -> list[tuple[str, float, float, float, str]]:
    """(label, median, min, max, kind) per bar, in microseconds."""
    bars: list[tuple[str, float, float, float, str]] = []
    for r in results.get("figures", {}).get("overhead", {}).get("results", []):
        o = r.get("overhead_per_step_us")
        if o:
            label = f"stepstone {r['backend']} ({r['durability'].split(' ')[0]})"
            if r["backend"] == "cosmos":
                label += " [emulator]"
            elif r["backend"] in ("postgresql", "mysql"):
                label += " [loopback]"
            bars.append((label, o["median"], o["min"], o["max"], "stepstone"))
    for p in results.get("peers", {}).get("results", []):
        if "per_step_us_median" not in p:
            continue
        kind = "floor" if p["system"] == "raw-sqlite" else "peer"
        bars.append(
            (
                f"{p['system']} ({p['config']})",
                p["per_step_us_median"],
                p["per_step_us_min"],
                p["per_step_us_max"],
                kind,
            )
        )
    return bars


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results.json"
    target = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "overhead.png"
    results = json.loads(source.read_text())
    fig, (left, right, third) = plt.subplots(1, 3, figsize=(21, 6.5), width_ratios=[1.25, 1, 1])
    colors = {"stepstone": "#1f77b4", "peer": "#ff7f0e", "floor": "#7f7f7f"}

    bars = overhead_bars(results)
    if bars:
        ys = list(range(len(bars)))[::-1]
        med = [max(b[1], 0.01) for b in bars]
        lo = [max(b[1] - b[2], 0) for b in bars]
        hi = [max(b[3] - b[1], 0) for b in bars]
        left.barh(ys, med, color=[colors[b[4]] for b in bars], xerr=[lo, hi], capsize=3)
        left.set_yticks(ys, [b[0] for b in bars], fontsize=8)
        left.set_xscale("log")
        for y, m, b in zip(ys, med, bars, strict=True):
            text = f"{m:,.0f}" if m >= 100 else f"{m:.1f}"
            left.text(max(m, b[3]) * 1.1, y, text, va="center", fontsize=7)
        left.set_xlabel("per-step overhead, microseconds (log; bar = median, whiskers = min..max)")
        left.set_title("Per-step overhead: 10-step run, ~1 KB state")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
        left.legend(
            handles,
            ["stepstone", "peer library", "floor (raw sqlite3, not a peer)"],
            fontsize=8,
            loc="lower right",
        )
    else:
        left.text(0.5, 0.5, "no overhead results", ha="center")

    scale = results.get("figures", {}).get("scale", {}).get("results", [])
    for backend, color in (
        ("file", "#2ca02c"),
        ("sqlite", "#d62728"),
        ("postgresql", "#9467bd"),
        ("mysql", "#8c564b"),
    ):
        rows = [r for r in scale if r["backend"] == backend and r.get("save_us")]
        if not rows:
            continue
        xs = [r["stored_runs"] for r in rows]
        for key, style, label in (
            ("save_us", "-o", f"{backend} save (durable)"),
            ("floor_us", "--s", f"{backend} floor"),
        ):
            vals = [r[key] for r in rows if r.get(key)]
            if len(vals) != len(xs):
                continue
            med = [v["median"] for v in vals]
            right.errorbar(
                xs,
                med,
                yerr=[
                    [m - v["min"] for m, v in zip(med, vals, strict=True)],
                    [v["max"] - m for m, v in zip(med, vals, strict=True)],
                ],
                fmt=style,
                color=color,
                alpha=1.0 if key == "save_us" else 0.5,
                capsize=3,
                label=label,
            )
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("runs already in the store (log)")
    right.set_ylabel("microseconds per save (log)")
    right.set_title("Durable save cost vs stored runs")
    right.grid(True, which="both", alpha=0.3)
    if scale:
        right.legend(fontsize=8)

    concurrency_panel(third, results)
    m = results.get("machine", {})
    disk = m.get("disk", {})
    fig.suptitle(
        f"stepstone benchmarks, {results.get('date', '')[:16]} UTC: {m.get('nproc')} CPUs, "
        f"{m.get('memory_gib')} GiB, {disk.get('fstype', '?')} disk, Python {m.get('python')}"
        + (" (quick)" if results.get("quick") else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    print(f"wrote {target}")


def concurrency_panel(ax: Any, results: dict[str, Any]) -> None:
    """Steps/s against N: async tasks (solid) and threads (dashed), log-log."""
    figs = results.get("figures", {})
    drawn = False
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#ff7f0e"]
    colors: dict[str, str] = {}

    def color(name: str) -> str:
        if name.startswith("langgraph"):
            return "#ff7f0e" if "Sqlite" in name else "#e377c2"
        return colors.setdefault(name, palette[len(colors) % len(palette)])

    for r in figs.get("async", {}).get("results", []) or []:
        tp = r.get("throughput") or {}
        xs = sorted(int(n) for n in tp)
        if not xs or r["system"] == "memory":
            continue
        ys = [tp[str(n)]["steps_per_s"]["median"] for n in xs]
        ax.plot(xs, ys, "-o", color=color(r["system"]), label=f"{r['system']} (async tasks)")
        drawn = True
    by: dict[str, list[tuple[int, float]]] = {}
    for r in figs.get("threads", {}).get("results", []) or []:
        by.setdefault(r["backend"], []).append((r["threads"], r["steps_per_s"]["median"]))
    for backend, pts in by.items():
        pts.sort()
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            "--s",
            color=color(backend),
            alpha=0.7,
            label=f"{backend} (threads, run)",
        )
        drawn = True
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent runs in one process (log)")
    ax.set_ylabel("steps per second (log)")
    ax.set_title("Throughput vs concurrency, one store")
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no async/threads results", ha="center", transform=ax.transAxes)


if __name__ == "__main__":
    main()
