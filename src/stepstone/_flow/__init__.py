"""Flow control on the Store: keyed concurrency, request and token rates, shared 429s.

``_limit`` holds what users declare (``Limit``, its policies in ``_policy``) and the
errors; ``_bucket`` the rules of a limit record as pure functions (GCRA, fenced slots);
``_ops`` the record operations as effect generators; ``_api`` the public functions;
``_hook`` what the runner does around a step that names limits.

The names below are imported on first use, as ``stepstone``'s are: ``_api`` imports
asyncio, and the CLI's parser reads ``_policy.POLICIES`` on every command, ``--help``
too, without it.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # what the names below are, for type checkers; imported on first use
    from ._api import (
        LimitUsage,
        aget_limit,
        alimit_usage,
        alist_limits,
        aset_limit,
        get_limit,
        limit_usage,
        list_limits,
        set_limit,
    )
    from ._limit import Limit, LimitReached, RateLimited

__all__ = [
    "Limit",
    "LimitReached",
    "LimitUsage",
    "RateLimited",
    "aget_limit",
    "alimit_usage",
    "alist_limits",
    "aset_limit",
    "get_limit",
    "limit_usage",
    "list_limits",
    "set_limit",
]

_DECLARED = ("Limit", "LimitReached", "RateLimited")
__getattr__ = lazy_getattr(
    __name__,
    {name: "._limit" if name in _DECLARED else "._api" for name in __all__},
    globals(),
)
