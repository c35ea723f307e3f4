"""The fleet test: worker processes draining started runs while they are killed and frozen.

Repository tooling (not in the wheel), run by ``tests/chaos/test_fleet.py`` at CI size
and by ``scripts/fleet`` (``python -m fleet``) at any size. ``harness`` starts the runs
and the workers and injects the faults, ``workload`` holds the workflows and the exact
final state of each run, ``invariants`` checks what must hold, ``report`` renders
``tests/chaos/FLEET.md`` and the README block, ``worker`` is one worker process,
``signals`` plans and delivers the signals a campaign sends. ``caps`` runs the
campaigns of flow control, schedules and budgets (``python -m fleet.caps``).
"""

from .backends import BACKENDS
from .harness import Options, Result, run_fleet
from .invariants import Fault, Report, drain_bound

__all__ = ["BACKENDS", "Fault", "Options", "Report", "Result", "drain_bound", "run_fleet"]
