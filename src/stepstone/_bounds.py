"""Defaults and bounds that the CLI's parser shows, in a module of their own.

Leases (``_lease``), orphaned pieces (``_incarnation``) and a worker's ``max_runs``
(``worker._config``) use them and re-export them; the CLI's parser reads them here
(``--lease``, ``--older-than``, ``--max-runs``), so that ``stepstone --help`` imports
none of those modules nor the checkpoint record they need.
"""

from __future__ import annotations

__all__ = ["DEFAULT_LEASE", "MAX_LEASE", "MAX_RUNS", "MIN_LEASE", "ORPHAN_AGE"]

#: Seconds. Long enough that a renewal every ten seconds is cheap traffic; short enough
#: that a crashed worker's runs move to another worker within half a minute.
DEFAULT_LEASE = 30.0
#: Bounds on a lease, so that a typo cannot strand a run for a year or renew in a loop.
MIN_LEASE = 0.05
MAX_LEASE = 24 * 3600.0
#: Seconds after which pieces of an incarnation no document names are collected.
ORPHAN_AGE = 24 * 3600.0
#: The most executions ``Worker(max_runs=)`` may name: more is a typo, not a batch.
MAX_RUNS = 1_000_000_000
