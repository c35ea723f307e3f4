"""``kill_point``: act at a named point inside the runner or a backend, from a test.

The points are those ``stepstone._hooks`` documents (``runner.after_step``, a backend's
``Store.kill_points``, ...). An action is chained after whatever hook is installed
already, so a test's own hook and the suite's stack instead of replacing each other;
removing it puts the previous hook back. Hooks are process-wide: an action sees the
points of every thread, and decides for itself which thread to act in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Self

from .. import _hooks

__all__ = ["KillPoint", "kill_point"]


class KillPoint:
    """An action installed at one or more points; ``remove()`` or leaving ``with`` ends it."""

    def __init__(self, points: frozenset[str], action: Callable[[str], None]) -> None:
        self.points = points
        self.action = action
        self._previous = _hooks.installed()
        self._removed = False
        _hooks.install(self._fire)

    def _fire(self, point: str) -> None:
        if self._previous is not None:
            self._previous(point)
        if point in self.points:
            self.action(point)

    def remove(self) -> None:
        """Put back the hook that was installed before this one; a second call does nothing.

        Remove stacked actions in the reverse order of their installing (``with`` blocks
        do): removing an older one also drops those installed after it.
        """
        if not self._removed:
            self._removed = True
            _hooks.install(self._previous)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def kill_point(points: str | Iterable[str], action: Callable[[str], None]) -> KillPoint:
    """Call ``action(point)`` each time any thread reaches ``points`` (one name or several).

    The action runs after any hook installed before it, in the thread that reached the
    point; what it raises propagates there, as a crash or a failure inside a save would.
    It is installed at once; ``with kill_point(...):`` removes it on leaving the block,
    or call ``remove()``.

    Example::

        def die(point: str) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        with kill_point("runner.after_step", die):
            stepstone.run(...)
    """
    names = frozenset([points] if isinstance(points, str) else points)
    return KillPoint(names, action)
