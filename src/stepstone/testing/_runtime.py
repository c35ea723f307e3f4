"""``RuntimeContract``: leases, workers, cancellation and suspended runs, on every backend.

The runtime builds only on the Store contract (compare-and-swap saves and the claim
index), so every backend must show the same ownership behaviour: exactly one claimant
wins, a takeover happens only after a whole lease without renewal, a fenced owner writes
nothing, signals are applied exactly once. Each test runs in both forms (``ops``).
"""

from __future__ import annotations

from ._ownership import OwnershipContract
from ._runtime_kit import until
from ._suspension import SuspensionContract

__all__ = ["RuntimeContract", "until"]


class RuntimeContract(OwnershipContract, SuspensionContract):
    """Ownership, workers and suspension; mixed into ``StoreContract``.

    The tests live in ``_ownership.py`` (claims, leases, start, cancel, workers) and
    ``_suspension.py`` (signals, timers, children); their helpers in ``_runtime_kit.py``.
    """
