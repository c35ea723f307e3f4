"""Named points inside the runner and the backends where test code may act.

Only tests install a hook (the crash and chaos suites kill the process at a chosen
point); in production ``fire`` is one global lookup and a comparison. Points in use:

- ``runner.before_step``, ``runner.after_step`` (step returned, checkpoint not saved),
  ``runner.after_save``, ``runner.backoff`` (a retry is waiting)
- ``file.after_temp_write``, ``file.after_rename``, ``file.before_dir_fsync``
- ``sqlite.in_transaction`` (statement executed, not committed)
- ``sql.before_request``, ``sql.request_sent`` (PostgreSQL/MySQL: the single autocommit
  statement not yet sent; executed and acknowledged, result not yet read)
- ``cosmos.before_request`` (the save's request not yet sent), ``cosmos.request_sent``
  (the response arrived, CosmosStore has not processed it)
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["fire", "install"]

_hook: Callable[[str], None] | None = None


def install(hook: Callable[[str], None] | None) -> None:
    """Install ``hook`` (called with the point's name), or remove it with None."""
    global _hook  # noqa: PLW0603 - one process-wide test seam, on purpose
    _hook = hook


def fire(point: str) -> None:
    """Call the installed hook, if any, at ``point``."""
    if _hook is not None:
        _hook(point)
