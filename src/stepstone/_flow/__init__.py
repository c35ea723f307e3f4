"""Flow control on the Store: keyed concurrency, request and token rates, shared 429s.

``_limit`` holds what users declare (``Limit``; its policies are ``.._flow_policy``'s)
and the errors; ``_bucket`` the rules of a limit record as pure functions (GCRA, fenced
slots); ``_ops`` the record operations as effect generators; ``_api`` the public
functions; ``_hook`` what the runner does around a step that names limits.
"""

from . import _api
from ._api import *  # noqa: F403 - the public functions, listed once: _api.__all__
from ._limit import Limit, LimitReached, RateLimited

# What ``_api`` exports, and the declarations: one list of the public functions.
__all__ = ["Limit", "LimitReached", "RateLimited"]
__all__ += _api.__all__
