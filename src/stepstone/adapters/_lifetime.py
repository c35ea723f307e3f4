"""The lifetime an adapter shares: a store it was handed, or one it opened and closes."""

from __future__ import annotations

from .._closing import Closing
from .._store import Store

__all__ = ["StoreOwner"]


class StoreOwner(Closing):
    """``close`` / ``aclose`` (and so both context managers) for an adapter over a ``store``.

    A store the adapter opened itself from a config string (``owns_store``) is closed
    with it; one it was handed stays open for whoever opened it.
    """

    store: Store
    owns_store: bool

    def close(self) -> None:
        """Close the store if this object opened it from a config string."""
        if self.owns_store:
            self.store.close()

    async def aclose(self) -> None:
        """Async ``close``."""
        if self.owns_store:
            await self.store.aclose()
