"""``Closing``: ``with`` and ``async with`` for an object that has ``close`` and ``aclose``."""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """Context managers, sync and async: entering returns the object, leaving closes it.

    ``with`` calls ``close``, ``async with`` awaits ``aclose``; a subclass defines both (a
    store, and an adapter over one). Leaving by an exception closes too, and lets it go on.
    """

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
