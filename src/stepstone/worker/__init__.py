"""The worker: claims runs that need work (queued, due, interrupted) and drives them.

``Worker`` is also exported from ``stepstone``. The package, one concept a module:

- ``_worker``: ``Worker``, its arguments and what it is made of;
- ``_config``: the defaults, the checks of the arguments, the table of workflows served;
- ``_claims``: the claim loop, written once as generators of effects (``Claims``);
- ``_watch``: the claim decision over other owners' leases (no I/O);
- ``_io``: the claim loop's own effects and the calls that perform them;
- ``_outcomes``: how an execution begins and ends (claimed, parked, its events);
- ``_wakeups``: the store's listener, which ends a rest when another process rings;
- ``_base``: ``stop`` and ``abandon``, shared by the two drivers;
- ``_threads``: the thread driver (``serve``); ``_tasks``: the task driver (``aserve``).
"""

from ._config import DEFAULT_CONCURRENCY, DEFAULT_GRACE, DEFAULT_POLL
from ._worker import Worker

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_GRACE", "DEFAULT_POLL", "Worker"]
