"""A store's pieces seen from a test: saves and loads in either form, a save's piece names.

For the tests of long states (``stepstone._statelog``) on every backend: ``mode`` is
``sync`` (save/load) or ``async`` (asave/aload).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from stepstone import Store
from stepstone import _statelog as sl
from stepstone._checkpoint import Checkpoint, Stored

__all__ = ["keys_in", "load_in", "next_save", "pieces_named", "ref_of", "save_in"]

State = dict[str, Any]


def save_in(store: Store, cp: Checkpoint, mode: str) -> Checkpoint:
    if mode == "async":
        return asyncio.run(store.asave(cp))
    return store.save(cp)


def load_in(store: Store, run_id: str, mode: str) -> Checkpoint:
    cp = asyncio.run(store.aload(run_id)) if mode == "async" else store.load(run_id)
    assert cp is not None, run_id
    return cp


def keys_in(store: Store, run_id: str, mode: str) -> list[str]:
    if mode == "async":
        return asyncio.run(store.apiece_keys(run_id))
    return store.piece_keys(run_id)


def ref_of(cp: Checkpoint) -> dict[str, Any]:
    handle = cp.stored_state
    assert isinstance(handle, Stored) and handle.ref is not None, "the state is not in pieces"
    return handle.ref


def pieces_named(cp: Checkpoint) -> list[str]:
    return sorted(sl.pieces_of(ref_of(cp)))


def next_save(cp: Checkpoint, state: State | None = None, **changes: Any) -> Checkpoint:
    """``cp`` one step on, as the runner saves it (with ``state`` if given)."""
    step = cp.step + 1
    names = (*cp.step_names, f"s{step}")
    return replace(
        cp, step=step, step_names=names, state=cp.state if state is None else state, **changes
    )
