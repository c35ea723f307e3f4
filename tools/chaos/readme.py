"""The results table: rendered from a run's totals into RESULTS.md, copied into the README.

``render_table`` writes the markdown that ``scripts/chaos`` saves to
``tests/chaos/RESULTS.md``; ``update_readme`` copies that file between the README's
``<!-- chaos:begin -->`` and ``<!-- chaos:end -->`` markers and touches nothing else.
``parse_table`` reads a rendered table back, so a test can check the committed file has
the format this module writes.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import time
from collections import Counter
from pathlib import Path

from stepstone._errors import StepstoneError

from .backends import kill_points
from .harness import RUNNER_POINTS, Stats

__all__ = [
    "README_BEGIN",
    "README_END",
    "TABLE_TITLE",
    "machine_line",
    "parse_table",
    "readme_block",
    "render_table",
    "update_readme",
]

TABLE_TITLE = "### Chaos run"
README_BEGIN = "<!-- chaos:begin -->"
README_END = "<!-- chaos:end -->"
POINTS_TITLE = "Deaths per kill point:"
SUMMARY_HEAD = (
    "| backend | mode | single workflows | concurrent workers | processes | "
    "**deaths (SIGKILL)** | save conflicts | **violations** | seconds | deaths/s |"
)
CHURN_TITLE = (
    "Churn cases (`--churn`: long states deleted and started again, killed inside piece "
    "writes, deletes and collections) and the final sweep (every run deleted, "
    "`collect_orphans(0)`):"
)
CHURN_HEAD = (
    "| backend | mode | churn cases | acknowledged saves | orphans collected | **pieces left** |"
)


def machine_line(workdir: str | None = None) -> str:
    """``Machine: N cores, OS, Python; where the stores' files were; date -u``."""
    where = ""
    if workdir is not None:
        where = f"; files on {_filesystem(workdir)}"
    date = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    return (
        f"Machine: {os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}{where}; `date -u`: {date}."
    )


def _filesystem(path: str) -> str:
    """Return ``DEVICE (FSTYPE)`` of the mount holding ``path``, from /proc/mounts."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="utf-8") as fh:
        for line in fh:
            device, mount, fstype = line.split()[:3]
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best[0]):
                best = (mount, device, fstype)
    kind = "tmpfs, in memory" if best[2] == "tmpfs" else "the real disk, not tmpfs"
    return f"{best[1]} ({best[2]}: {kind})"


def _point_order(stats: list[Stats]) -> list[str]:
    """Runner points first, then each backend's save points in the order they fire."""
    points = list(RUNNER_POINTS)
    for s in stats:
        with contextlib.suppress(StepstoneError):  # a backend whose driver is missing
            points += list(kill_points(s.backend))
        points += sorted(s.deaths)
    return list(dict.fromkeys(points))


def _rate(deaths: int, seconds: float) -> str:
    return f"{deaths / seconds:.1f}" if seconds > 0 else "-"


def render_table(
    stats: list[Stats], command: str, seconds: float, machine: str | None = None
) -> str:
    """Return the markdown results table (what RESULTS.md and the README hold).

    One summary row per backend and mode (seconds: that backend and mode's own driver
    time, its shards in parallel), then the deaths per kill point, one column each.
    """
    rows = [TABLE_TITLE, "", f"Command: `{command}`", "", SUMMARY_HEAD]
    rows.append("|---|---|" + "---:|" * 8)
    for s in stats:
        deaths = sum(s.deaths.values())
        values = [
            s.scenarios["single"],
            s.scenarios["concurrent"],
            s.processes,
            deaths,
            s.conflicts,
            len(s.violations),
        ]
        cells = [s.backend, s.mode, *map(str, values), f"{s.seconds:.0f}", _rate(deaths, s.seconds)]
        rows.append("| " + " | ".join(cells) + " |")
    total_deaths = sum(sum(s.deaths.values()) for s in stats)
    totals = [
        sum(s.scenarios["single"] for s in stats),
        sum(s.scenarios["concurrent"] for s in stats),
        sum(s.processes for s in stats),
        total_deaths,
        sum(s.conflicts for s in stats),
        sum(len(s.violations) for s in stats),
    ]
    total_cells = [
        "**total**",
        "",
        *map(str, totals),
        f"{seconds:.0f}",
        _rate(total_deaths, seconds),
    ]
    rows.append("| " + " | ".join(total_cells) + " |")
    rows += ["", POINTS_TITLE, ""]
    rows.append(
        "| kill point | " + " | ".join(f"{s.backend} {s.mode}" for s in stats) + " | total |"
    )
    rows.append("|---|" + "---:|" * (len(stats) + 1))
    for point in _point_order(stats):
        values = [s.deaths[point] for s in stats]
        if any(values):
            cells = [f"`{point}`", *map(str, values), str(sum(values))]
            rows.append("| " + " | ".join(cells) + " |")
    if any(s.scenarios["churn"] for s in stats):
        rows += ["", CHURN_TITLE, "", CHURN_HEAD, "|---|---|" + "---:|" * 4]
        for s in stats:
            values = [s.scenarios["churn"], s.saves, s.orphans, s.pieces_left]
            rows.append("| " + " | ".join([s.backend, s.mode, *map(str, values)]) + " |")
    rate = total_deaths / seconds if seconds > 0 else 0.0
    rows += [
        "",
        f"{total_deaths} process deaths in {seconds:.0f} s wall clock ({rate:.0f} deaths/s).",
    ]
    if machine:
        rows += ["", machine]
    return "\n".join(rows) + "\n"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_table(text: str) -> tuple[list[Stats], str, float]:
    """Read a table ``render_table`` wrote back: (totals, command, wall-clock seconds).

    Violations come back as placeholders (their count is what the table holds).

    Raises:
        ValueError: the text is not in the format ``render_table`` writes.
    """
    lines = text.splitlines()
    if not lines or lines[0] != TABLE_TITLE:
        raise ValueError(f"the table does not start with {TABLE_TITLE!r}")
    command_match = re.search(r"^Command: `(.*)`$", text, re.M)
    wall_match = re.search(r"^\d+ process deaths in (\d+) s wall clock", text, re.M)
    if command_match is None or wall_match is None or SUMMARY_HEAD not in lines:
        raise ValueError("the table has no Command line, summary header or wall-clock line")
    at = lines.index(SUMMARY_HEAD) + 2
    stats: list[Stats] = []
    while lines[at].startswith("| ") and not lines[at].startswith("| **total**"):
        backend, mode, single, conc, procs, _deaths, conflicts, violations, secs, _ = _cells(
            lines[at]
        )
        stats.append(
            Stats(
                backend,
                Counter({"single": int(single), "concurrent": int(conc)}),
                int(procs),
                Counter(),
                ["(from the table)"] * int(violations),
                float(secs),
                int(conflicts),
                mode,
            )
        )
        at += 1
    at = lines.index(POINTS_TITLE) + 4
    while at < len(lines) and lines[at].startswith("| `"):
        point, *values, _total = _cells(lines[at])
        for s, value in zip(stats, values, strict=True):
            if int(value):
                s.deaths[point.strip("`")] = int(value)
        at += 1
    if CHURN_TITLE in lines:
        at = lines.index(CHURN_TITLE) + 4
        for s in stats:
            _backend, _mode, churn, saves, orphans, left = _cells(lines[at])
            s.scenarios["churn"] = int(churn)
            s.saves, s.orphans, s.pieces_left = int(saves), int(orphans), int(left)
            at += 1
    return stats, command_match.group(1), float(wall_match.group(1))


def readme_block(readme: str) -> str | None:
    """Return the text between the chaos markers, stripped; None if there are no markers.

    Raises:
        ValueError: the markers are not exactly one begin followed by one end.
    """
    begins, ends = readme.count(README_BEGIN), readme.count(README_END)
    if begins == ends == 0:
        return None
    if begins != 1 or ends != 1:
        raise ValueError(
            f"README.md needs exactly one {README_BEGIN} and one {README_END} "
            f"(found {begins} and {ends})"
        )
    _head, rest = readme.split(README_BEGIN, 1)
    if README_END not in rest:
        raise ValueError(f"{README_END} comes before {README_BEGIN} in README.md")
    return rest.split(README_END, 1)[0].strip()


def update_readme(readme_path: Path, results_path: Path) -> bool:
    """Rewrite the text between the chaos markers with RESULTS.md; True if it changed."""
    readme = readme_path.read_text(encoding="utf-8")
    results = results_path.read_text(encoding="utf-8").strip()
    if readme_block(readme) is None:
        raise SystemExit(
            f"{readme_path} has no {README_BEGIN} / {README_END} markers: add them (each on "
            "its own line) where the table goes, then run scripts/chaos --update-readme"
        )
    head, rest = readme.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    new = f"{head}{README_BEGIN}\n{results}\n{README_END}{tail}"
    if new == readme:
        return False
    readme_path.write_text(new, encoding="utf-8")
    return True
