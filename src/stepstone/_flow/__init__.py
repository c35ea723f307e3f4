"""Flow control on the Store: keyed concurrency, request and token rates, shared 429s.

``_limit`` holds what users declare (``Limit``) and the errors; ``_bucket`` the rules of
a limit record as pure functions (GCRA, fenced slots); ``_ops`` the record operations
as effect generators; ``_api`` the public functions; ``_hook`` what the runner does
around a step that names limits.
"""

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
