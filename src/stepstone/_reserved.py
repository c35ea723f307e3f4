"""Records that are stepstone's own, not runs: one rule for every listing and count.

A store holds, beside the runs, records stepstone writes for itself: the blocks of run
streams (``stream:RUN_ID/N``, issue 34), the schedules (``~schedules``), flow control's
limits (``~limit/NAME``) and tenants' budgets (``~tenant-budget/NAME``). Listings
(``stepstone runs list``, the dashboard) and status counts leave them out through
``is_reserved`` and ``run_counts``, and nowhere else decides it. The ids are text here,
not imported, so ``stepstone --help`` imports none of those modules (a test checks they
match their owners' constants).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["LIMIT_PREFIX", "RESERVED_IDS", "RESERVED_PREFIXES", "is_reserved", "run_counts"]

#: Flow control's limit records (``_flow._limit.PREFIX`` is this), for the CLI's listings.
LIMIT_PREFIX = "~limit/"
#: Heads of reserved record ids: ``_stream._events.HEAD + ":"``, ``_flow._limit.PREFIX``,
#: ``_tenant.PREFIX``.
RESERVED_PREFIXES = ("stream:", LIMIT_PREFIX, "~tenant-budget/")
#: Reserved record ids: ``_cron.RECORD``.
RESERVED_IDS = frozenset({"~schedules"})


def is_reserved(record_id: str) -> bool:
    """Return whether ``record_id`` is one of stepstone's own records, not a run."""
    return record_id in RESERVED_IDS or record_id.startswith(RESERVED_PREFIXES)


def run_counts(store: Store, prefix: str = "") -> dict[str, int]:
    """Return ``store.count_by_status(prefix)`` without the reserved records.

    A backend's count covers every record under ``prefix``; the reserved ones under it
    are counted by prefix too (one more count per reserved head that can overlap, an
    index range where the backend has one) and taken off, so no listing pays a scan.
    """
    counts = store.count_by_status(prefix)
    for head in RESERVED_PREFIXES:
        if head.startswith(prefix) or prefix.startswith(head):
            for status, n in store.count_by_status(max(head, prefix, key=len)).items():
                counts[status] = counts.get(status, 0) - n
    for record_id in RESERVED_IDS:
        if record_id.startswith(prefix):
            # The listing's own query, not a load: a list never reads a record's state.
            for info in store.list_page(None, prefix=record_id, limit=50):
                if info.run_id == record_id:
                    counts[info.status] = counts.get(info.status, 0) - 1
    return counts
