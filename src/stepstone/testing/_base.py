"""What every part of the contract suite shares: fixtures, capabilities, checkpoints."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .._checkpoint import Checkpoint
from .._registry import open_store
from .._store import Store
from ._ops import MODES, Mode, Ops

__all__ = ["ContractBase", "child_env", "cp", "declares"]


def cp(run_id: str, step: int = 0, state: dict[str, Any] | None = None, **kw: Any) -> Checkpoint:
    """A checkpoint of ``run_id`` after ``step``, with step names ``s0``.. and ``state``."""
    names = kw.pop("step_names", tuple(f"s{i}" for i in range(step + 1)))
    return Checkpoint(run_id=run_id, step=step, state=state or {"n": step}, step_names=names, **kw)


def child_env() -> dict[str, str]:
    """The environment for a child Python process that must import this stepstone."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def declares(store_type: type[Store], name: str) -> bool:
    """Whether the backend class itself (not ``Store``'s defaults) sets attribute ``name``."""
    mro = store_type.__mro__
    own = mro[: mro.index(Store)] if Store in mro else mro
    return any(name in vars(cls) for cls in own)


class ContractBase:
    """Fixtures and capability reading shared by the sync and async parts of the suite.

    What a backend can do is read from the store's class attributes (``durable``,
    ``kill_points``, ``counts_requests``, ``native_async``; see ``Store``). The suite's
    own ``durable`` and ``save_kill_points`` attributes are the older way and are read
    only when the backend class does not declare the matching attribute.
    """

    #: Legacy: used only if the backend class does not declare ``kill_points``.
    save_kill_points: ClassVar[Mapping[str, bool] | None] = None
    #: Legacy: used only if the backend class does not declare ``durable``.
    durable: ClassVar[bool | None] = None
    #: How many processes the cross-process concurrency tests start.
    processes: ClassVar[int] = 4
    #: How many runs the async test drives at once in one event loop.
    concurrent_runs: ClassVar[int] = 500

    @pytest.fixture
    def store(self, store_config: str) -> Iterator[Store]:
        """Open the store under test from its config string."""
        with open_store(store_config) as store:
            yield store

    @pytest.fixture(params=MODES)
    def mode(self, request: pytest.FixtureRequest) -> Mode:
        """The form a test runs in: the sync methods and ``run``, or the async ones and ``arun``."""
        value: Mode = request.param
        return value

    @pytest.fixture
    def ops(self, store: Store, mode: Mode) -> Iterator[Ops]:
        """The store and runner in this test's form, on one event loop in the async form."""
        ops = Ops(mode, store)
        try:
            yield ops
        finally:
            ops.close()

    # -- capabilities ----------------------------------------------------------------------

    def kill_points(self, store: Store) -> dict[str, bool]:
        """Hook points inside a save, mapped to whether the new checkpoint survives a kill."""
        if declares(type(store), "kill_points") or self.save_kill_points is None:
            return dict(type(store).kill_points)
        return dict(self.save_kill_points)

    def is_durable(self, store: Store) -> bool:
        """Whether the store outlives its process."""
        if self.durable is not None and not declares(type(store), "durable"):
            return self.durable
        return type(store).durable

    def need_durable(self, store: Store) -> None:
        """Skip a test that needs the store to outlive its process."""
        if not self.is_durable(store):
            pytest.skip(f"{type(store).__name__} does not outlive its process (durable=False)")
