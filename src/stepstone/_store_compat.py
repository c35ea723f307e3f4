"""Calling a store through the contract's defaults: older third-party stores included.

A store written to an earlier ``Store`` contract (``delete(run_id)`` without
``expected_version``, ``claimable(now, limit)`` without paging) still works: these
helpers call it in the form it has. The async defaults run the sync method in a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ._errors import StoreError
from ._runinfo import RunInfo, check_page

if TYPE_CHECKING:
    from ._checkpoint import RunStatus

T = TypeVar("T")


class StoreLike(Protocol):
    """What these helpers use of a ``stepstone.Store`` (without importing it: no cycle)."""

    @property
    def claims_by_kind(self) -> bool: ...

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool: ...

    def claimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]: ...

    async def aclaimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]: ...


async def _to_thread(fn: Callable[..., T], *args: Any) -> T:
    # asyncio is imported here, not at the top: it costs ~40 ms that sync users and
    # every command-line call would pay for nothing.
    import asyncio  # noqa: PLC0415 - deferred (~40 ms), see above

    return await asyncio.to_thread(fn, *args)


def _delete(store: StoreLike, run_id: str, expected_version: str | None) -> bool:
    if expected_version is None:
        # A third-party store written to the previous contract has ``delete(run_id)``
        # only: call it that way whenever no version is expected.
        return store.delete(run_id)
    if not _takes_expected_version(type(store)):
        raise StoreError(
            f"{type(store).__qualname__}.delete takes no expected_version (it was written "
            "to an older Store contract), so it cannot delete by compare-and-swap; nothing "
            "was deleted. Add the keyword-only expected_version argument to that delete"
        )
    return store.delete(run_id, expected_version=expected_version)


_SIGNATURES: dict[type[StoreLike], bool] = {}


def _takes_expected_version(cls: type[StoreLike]) -> bool:
    known = _SIGNATURES.get(cls)
    if known is None:
        import inspect  # noqa: PLC0415 - only for this rare path; ~10 ms at import

        try:
            parameters = inspect.signature(cls.delete).parameters
        except (TypeError, ValueError):  # no signature to read: let the call tell
            known = True
        else:
            known = "expected_version" in parameters or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
            )
        _SIGNATURES[cls] = known
    return known


def claim_page(
    store: StoreLike, now: datetime, limit: int, status: RunStatus | None, skip: int
) -> list[RunInfo]:
    """Call ``store.claimable`` for one page, also on a store written to its old form.

    A third-party store whose ``claimable(now, limit)`` predates paging gets a longer
    limit and the page is cut from its answer: slower, never stuck.
    """
    if status is None and skip == 0:
        return store.claimable(now, limit)
    if store.claims_by_kind:
        return store.claimable(now, limit, status=status, skip=skip)
    check_page(status, skip)
    kind = [info for info in store.claimable(now, skip + limit) if info.status == status]
    return kind[skip : skip + limit]


async def aclaim_page(
    store: StoreLike, now: datetime, limit: int, status: RunStatus | None, skip: int
) -> list[RunInfo]:
    """Async ``claim_page``: ``store.aclaimable``, or the sync page in a thread."""
    if status is None and skip == 0:
        return await store.aclaimable(now, limit)
    if store.claims_by_kind:
        return await store.aclaimable(now, limit, status=status, skip=skip)
    return await _to_thread(claim_page, store, now, limit, status, skip)
