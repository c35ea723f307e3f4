"""The Store contract every backend implements."""

from __future__ import annotations

import abc
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Self, TypeVar

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpoint
from ._observe import logger

if TYPE_CHECKING:
    from ._checkpoint import RunStatus

__all__ = ["Diagnosis", "RunInfo", "Store"]

T = TypeVar("T")


async def _to_thread(fn: Callable[..., T], *args: Any) -> T:
    # asyncio is imported here, not at the top: it costs ~40 ms that sync users and
    # every command-line call would pay for nothing.
    import asyncio  # noqa: PLC0415

    return await asyncio.to_thread(fn, *args)


class Diagnosis(NamedTuple):
    """One check made by ``Store.doctor``."""

    check: str
    ok: bool
    detail: str


class RunInfo:
    """What ``Store.list_info`` reports for one run: enough to list and prune without state."""

    __slots__ = ("run_id", "status", "step", "total_steps", "updated_at")

    def __init__(
        self,
        run_id: str,
        status: RunStatus,
        step: int,
        total_steps: int | None,
        updated_at: datetime | None,
    ) -> None:
        self.run_id = run_id
        self.status: RunStatus = status
        self.step = step
        self.total_steps = total_steps
        self.updated_at = updated_at

    def __repr__(self) -> str:
        return (
            f"RunInfo(run_id={self.run_id!r}, status={self.status!r}, step={self.step}, "
            f"updated_at={self.updated_at!r})"
        )


class Store(abc.ABC):
    """Keeps at most one checkpoint per run_id, with compare-and-swap saves.

    Subclasses implement the five abstract methods and ``from_config``; a backend that
    forgets one fails when constructed. Every method may raise ``StoreUnavailable`` or
    ``StorePermissionError`` when the backend cannot be reached or refuses access.

    Async counterparts (``aload``, ``asave``, ...) sit beside the sync methods with the
    same names plus an ``a`` prefix; by default they run the sync method in a thread,
    and a backend with a native async driver overrides them.
    """

    #: The config-string scheme that selects this backend, e.g. ``"sqlite"``.
    scheme: ClassVar[str] = ""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: str) -> Self:
        """Open the store described by a config string of this backend's scheme.

        Raises:
            ConfigError: the string is malformed or has parts this backend does not know;
                the message lists the valid forms.
        """

    @abc.abstractmethod
    def load(self, run_id: str) -> Checkpoint | None:
        """Return the run's checkpoint, or None if the run never started.

        Raises:
            InvalidRunId: ``run_id`` is not 1-1024 characters without control characters.
            CorruptCheckpoint: what is stored is not a readable checkpoint; it is left as is.
        """

    @abc.abstractmethod
    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Store ``checkpoint`` if the stored version still equals ``checkpoint.version``.

        ``version`` None means nothing may be stored for the run yet. The write is atomic:
        afterwards a load sees either the old or the new checkpoint, never a mix.

        Returns:
            The checkpoint as stored, with its new ``version``, ``updated_at`` and
            ``state_json`` set and a ``state`` that shares nothing with the argument.

        Raises:
            ConflictError: the stored version differs; nothing was stored.
            InvalidState: the state does not round-trip through JSON; nothing was stored.
            CheckpointTooLarge: the encoded checkpoint is over the backend's limit.
        """

    @abc.abstractmethod
    def delete(self, run_id: str) -> bool:
        """Delete the run's checkpoint; return whether there was one.

        Raises:
            InvalidRunId: ``run_id`` is not a valid run id.
        """

    @abc.abstractmethod
    def list_runs(self) -> Iterator[str]:
        """Yield the run_ids stored, in no particular order."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and handles. Closing twice is allowed."""

    def list_info(self) -> Iterator[RunInfo]:
        """Yield a ``RunInfo`` per stored run. Backends with an index override this.

        A run whose checkpoint is corrupt is logged and skipped: one bad document must
        not hide every other run from an operator listing or pruning the store.
        """
        for run_id in self.list_runs():
            try:
                cp = self.load(run_id)
            except CorruptCheckpoint as exc:
                logger.warning("skipping run %r in listing: %s", run_id, exc)
                continue
            if cp is not None:
                yield RunInfo(run_id, cp.status, cp.step, cp.total_steps, cp.updated_at)

    def init(self) -> list[str]:
        """Create what the backend needs (tables, database, container) if it may.

        Returns:
            One line per thing created or found; backends that create everything on first
            use return a line saying so.

        Raises:
            StorePermissionError: the credentials may not create it; the message says
                what to provision by hand.
        """
        return [f"{self.scheme} store: created on first use, nothing to do"]

    def doctor(self) -> list[Diagnosis]:
        """Check connectivity, permissions and schema; return one ``Diagnosis`` per check.

        The default writes, reads and deletes a probe run under a reserved id. Backends
        add their own checks (schema version, partition key) by extending the list.
        """
        probe = f"__stepstone_doctor__/{os.getpid()}-{time.monotonic_ns()}"
        results: list[Diagnosis] = []

        def check(name: str, action: Callable[[], object]) -> bool:
            try:
                action()
            except Exception as exc:
                results.append(Diagnosis(name, False, f"{type(exc).__name__}: {exc}"))
                return False
            results.append(Diagnosis(name, True, "ok"))
            return True

        if check("list runs (read access)", lambda: next(iter(self.list_runs()), None)):
            saved: list[Checkpoint] = []
            if check(
                "save a probe run (write access)",
                lambda: saved.append(self.save(Checkpoint(run_id=probe, total_steps=0))),
            ):
                check("load the probe run", lambda: self.load(probe))
                check("delete the probe run", lambda: self.delete(probe))
        return results

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def aload(self, run_id: str) -> Checkpoint | None:
        """Async ``load``."""
        return await _to_thread(self.load, run_id)

    async def asave(self, checkpoint: Checkpoint) -> Checkpoint:
        """Async ``save``."""
        return await _to_thread(self.save, checkpoint)

    async def adelete(self, run_id: str) -> bool:
        """Async ``delete``."""
        return await _to_thread(self.delete, run_id)

    async def aclose(self) -> None:
        """Async ``close``."""
        await _to_thread(self.close)
