"""What the LangGraph adapter's test modules share: the backends, their stores, and the
forkserver their child processes come from."""

from __future__ import annotations

import multiprocessing
import os
import uuid
from typing import Any

import pytest

from fresh_stores import BACKENDS, MYSQL_URL, POSTGRES_URL, fresh_table

DURABLE = BACKENDS[1:]
# A generous bound on anything a child process does; hitting it names what hung.
CHILD_TIMEOUT = 120.0


def _config_for(name: str, request: pytest.FixtureRequest, tmp: pytest.TempPathFactory) -> str:
    """A config string naming a fresh, empty store of backend ``name`` for one module."""
    if name == "memory":
        return f"memory://langgraph-{uuid.uuid4().hex}"
    if name == "file":
        return f"file://{tmp.mktemp('lg')}/runs"
    if name == "sqlite":
        return f"sqlite:///{tmp.mktemp('lg')}/runs.db"
    if name == "postgresql":
        return fresh_table(request, POSTGRES_URL)
    if name == "mysql":
        return fresh_table(request, MYSQL_URL)
    emulator: Any = request.getfixturevalue("emulator")
    # In the environment, not the string, and inherited by child processes.
    previous = os.environ.get("AZURE_COSMOS_KEY")
    os.environ["AZURE_COSMOS_KEY"] = emulator.key

    def restore() -> None:
        if previous is None:
            os.environ.pop("AZURE_COSMOS_KEY", None)
        else:
            os.environ["AZURE_COSMOS_KEY"] = previous

    request.addfinalizer(restore)
    protocol = "&protocol=http" if emulator.endpoint.startswith("http://") else ""
    return (
        f"cosmos://{emulator.host}:{emulator.port}/langgraph/lg-{uuid.uuid4().hex[:12]}"
        f"?verify=false&create=true{protocol}"
    )


_FORKSERVER: Any = None
_PRELOAD = [
    "pytest",
    "langgraph.graph",
    "langgraph.types",
    "langgraph.checkpoint.conformance",
    "stepstone.adapters.langgraph",
    "stepstone.testing",
    *(f"stepstone.stores.{name}" for name in ("file", "sqlite", "postgres", "mysql", "cosmos")),
]


def _context() -> Any:
    global _FORKSERVER
    if _FORKSERVER is None:
        _FORKSERVER = multiprocessing.get_context("forkserver")
        # Python 3.11's forkserver ignores the parent's sys.path, so this test module
        # cannot be preloaded (it would fail silently); what it imports can.
        _FORKSERVER.set_forkserver_preload(_PRELOAD)
    return _FORKSERVER


def with_env(env: dict[str, str], target: Any, *args: Any) -> None:
    """Run ``target(*args)`` in a child after setting ``env``: a forkserver child has the
    forkserver's environment, from whenever it started (in a file or SQLite test, say)."""
    os.environ.update(env)
    target(*args)


def child_env() -> dict[str, str]:
    """What a forkserver child must be handed: the emulator's key this test set."""
    return {k: v for k, v in os.environ.items() if k == "AZURE_COSMOS_KEY"}
