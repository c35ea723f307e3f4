"""Capability campaigns: flow control, schedules and budgets under worker deaths.

Repository tooling beside the fleet test (``tools/fleet``): ``harness`` runs one
campaign (a workload on one store, worker processes SIGKILLed at the workload's kill
points and replaced), ``flow``, ``sched`` and ``spend`` are the workloads with their
invariants, ``child`` is one worker process, ``cli`` is ``python -m fleet.caps``
(runs at any size, on any backends, in either serving mode).
"""

from .harness import CapOptions, CapResult, run_campaign
from .loads import LOADS

__all__ = ["LOADS", "CapOptions", "CapResult", "run_campaign"]
