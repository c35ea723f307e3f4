"""The defaults and bounds of leases and of orphaned pieces, in a module of their own.

``_lease`` and ``_incarnation`` use them and re-export them; the CLI's parser shows them
(``--lease``, ``--older-than``) and reads them here, so that ``stepstone --help`` imports
neither those modules nor the checkpoint record they need.
"""

from __future__ import annotations

__all__ = ["DEFAULT_LEASE", "MAX_LEASE", "MIN_LEASE", "ORPHAN_AGE"]

#: Seconds. Long enough that a renewal every ten seconds is cheap traffic; short enough
#: that a crashed worker's runs move to another worker within half a minute.
DEFAULT_LEASE = 30.0
#: Bounds on a lease, so that a typo cannot strand a run for a year or renew in a loop.
MIN_LEASE = 0.05
MAX_LEASE = 24 * 3600.0
#: Seconds after which pieces of an incarnation no document names are collected.
ORPHAN_AGE = 24 * 3600.0
