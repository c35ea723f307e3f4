"""How a worker hears that there may be work: the store's listener, opened and closed.

A worker rests between looks at the claim index; a ring ends the rest early. Rings
come from this process (``Store.doorbell``: a run started, signalled, a child done) and,
where the store can push, from other processes (``Store.listen``). Without a listener
the claim loop looks again soon after activity and backs off to ``poll``
(``_claims.next_idle``).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import _wake
from .._errors import safe_text
from .._observe import logger
from .._store import Listener, Store

__all__ = ["listen", "unlisten"]


def listen(store: Store, ring: Callable[[], None], label: str, poll: float) -> Listener | None:
    """Start hearing other processes' announcements (``Store.listen``), if the store can.

    Returns the listener, or None when the store cannot push (or opening it failed,
    logged): the worker then only looks sooner after activity.
    """

    def heard() -> None:
        if not _wake.dropped():  # a test dropping rings drops these too
            ring()

    try:
        return store.listen(heard)
    except Exception as exc:  # noqa: BLE001 - without it the worker only polls sooner
        logger.warning(
            "%s: cannot listen for other processes' wake-ups (%s: %s); looking at the "
            "store after activity and every %gs",
            label,
            type(exc).__name__,
            safe_text(exc, 300),
            poll,
        )
        return None


def unlisten(listener: Listener | None, label: str) -> None:
    """Close ``listener`` (if any); a failure is logged, the worker is leaving anyway."""
    if listener is None:
        return
    try:
        listener.close()
    except Exception as exc:  # noqa: BLE001 - the worker is leaving; nothing else to do
        logger.warning("%s: closing the wake-up listener failed: %s", label, safe_text(exc, 300))
