"""The capability workloads by name (``--load``)."""

from __future__ import annotations

from .common import Load
from .flow import FlowLoad
from .sched import SchedLoad
from .spend import SpendLoad

__all__ = ["LOADS"]

LOADS: dict[str, Load] = {load.name: load for load in (FlowLoad(), SchedLoad(), SpendLoad())}
