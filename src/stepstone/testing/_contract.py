"""``StoreContract``: the behaviour every backend must show, written once as tests.

Every test that touches the store or the runner takes the ``ops`` fixture and runs twice,
``[sync]`` and ``[async]``: ``ops.load`` is ``store.load`` or ``await store.aload``,
``ops.run`` is ``stepstone.run`` or ``await stepstone.arun`` (see ``_ops.py``). The
suite is the sum of its parts, one concept a module: the Store methods
(``_contract_store.py``), the runner on the store (``_contract_runner.py``), threads,
processes and real crashes (``_contract_processes.py``), leases, workers and suspended
runs (``_runtime.py``), and the async-only tests (many runs in one loop, cancellation,
a blocked-loop check; ``_contract_async.py``).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from ._cases import AWKWARD_RUN_IDS, BAD_STATES
from ._contract_async import AsyncContract
from ._contract_processes import ProcessContract
from ._contract_runner import RunnerContract
from ._contract_store import StoreMethodsContract
from ._runtime import RuntimeContract

# AWKWARD_RUN_IDS and BAD_STATES stay importable from here: tests and backends use them.
__all__ = ["AWKWARD_RUN_IDS", "BAD_STATES", "StoreContract", "backend_unavailable"]


def backend_unavailable(reason: str) -> NoReturn:
    """Skip a backend's tests loudly, or fail them when CI demands every backend.

    CI sets ``STEPSTONE_REQUIRE_BACKENDS=1``; then a missing server is a failure, so a
    backend can never vanish from CI as a quiet skip.
    """
    message = f"BACKEND UNAVAILABLE: {reason}"
    if os.environ.get("STEPSTONE_REQUIRE_BACKENDS") == "1":
        pytest.fail(message + " (STEPSTONE_REQUIRE_BACKENDS=1: every backend must run)")
    pytest.skip(message)


class StoreContract(
    StoreMethodsContract, RunnerContract, ProcessContract, RuntimeContract, AsyncContract
):
    """Subclass with a ``store_config`` fixture returning a fresh, empty store's config.

    What the backend can do is read from the store class (``durable``, ``kill_points``,
    ``counts_requests``, ``native_async``). Class attributes of the subclass tune size:
    ``processes`` (processes the concurrency tests start) and ``concurrent_runs`` (runs
    the async test drives at once in one loop).
    """
