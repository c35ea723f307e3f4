"""The figures: ``tests/chaos/FLEET.md`` rendered from campaign results, and its README copy.

``update_readme`` replaces what lies between ``<!-- fleet:begin -->`` and
``<!-- fleet:end -->`` in the README with FLEET.md and touches nothing else.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from .harness import Result
from .invariants import TAIL

__all__ = ["README_BEGIN", "README_END", "TITLE", "render", "update_readme"]

TITLE = "### Fleet run"
README_BEGIN = "<!-- fleet:begin -->"
README_END = "<!-- fleet:end -->"
COLUMNS = (
    "backend",
    "mode",
    "skew s",
    "runs",
    "child runs",
    "workers",
    "processes",
    "kills",
    "at points",
    "points unreached",
    "freezes",
    "stops",
    "takeovers",
    "signals",
    "repeated ids",
    "steps run",
    "max repeats",
    "lost leases",
    "fenced steps",
    "drain s",
    "bound s",
    "violations",
    "seconds",
)


def render(results: list[Result], command: str) -> str:
    """Return the FLEET.md markdown for ``results``."""
    first = results[0].options
    out = [
        TITLE,
        "",
        f"Command: `{command}`",
        "",
        f"{first.workers} worker processes per backend ({first.concurrency} runs each at "
        f"once, lease {first.lease:g} s, poll {first.poll:g} s) drain the runs (and their "
        "Map children) while the harness SIGKILLs workers (a replacement starts at once), "
        f"SIGSTOPs them for {first.freeze_min:g}-{first.freeze_max:g} leases then SIGCONTs "
        "them, and SIGTERMs some (**stops**: a graceful hand-over); half the faults aim at "
        "the owner of a run that suspends (signal, timer, children) or of a child run. "
        "Signals arrive at random times, some ids twice (**repeated ids**). **takeovers**: "
        "runs claimed from an owner whose lease expired. **max repeats**: most extra "
        "executions of one step, each covered by a kill or freeze that hit a worker running "
        "it (on SQLite a freeze hits every worker: the frozen one may hold the write lock), "
        "or by a lease a live worker lost (**lost leases**: its store writes came later than "
        "its lease allowed, and were refused). "
        "**fenced steps**: steps a worker ran after losing its run (none of their writes "
        "landed). **drain s**: seconds from the last fault (its SIGKILL, SIGSTOP or "
        "SIGTERM) or signal until every run was done; **bound s**: 3 leases + 2 polls + "
        f"the 10 s child poll + {TAIL:g} s for the last runs' own steps. **violations**: "
        "broken invariants (exact final states, nothing stranded, no fenced write landed, "
        "signals exactly once, repeats within faults). **mode**: how the workers serve "
        "(`threads`: `Worker.serve`; `async`: `Worker.aserve`; `mixed`: alternately). "
        "**at points**: of the kills, those a worker dealt itself at a named runtime "
        "point (armed by the harness, in turn: a claim landed, a renewal landed, a signal "
        "consumed before its save, a Map child created, before/after a step, after a "
        "save); **points unreached**: armed points no thread passed within the wait (the "
        "worker was then SIGKILLed, counted among the kills). **skew s**: the workers' "
        "wall clocks read this far off the host's, in the pattern "
        "ahead, exact, behind, half ahead (takeovers are decided on each claimant's "
        "monotonic clock, so skew must change nothing).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    for result in results:
        row = result.summary()
        out.append("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    out += [
        "",
        f"Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d', time.gmtime())}.",
        "",
    ]
    return "\n".join(out)


def update_readme(readme: Path, block: str) -> None:
    """Replace the README's fleet block with ``block``.

    Raises:
        SystemExit: the markers are missing.
    """
    text = readme.read_text()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{readme}: no {README_BEGIN} ... {README_END} block")
    new = text[: begin + len(README_BEGIN)] + "\n" + block.rstrip() + "\n" + text[end:]
    readme.write_text(new)
