"""Streams follow their run: deleted with it (``delete``, ``prune``) and expired with it.

Blocks are removed from the last to the first, so a removal cut short by a crash leaves
a shorter stream that still starts at block 0 (readers and writers rely on no gaps),
and a second call finishes it. ``migrate`` needs nothing here: blocks are records like
any other, copied with the runs.
"""

from __future__ import annotations

from .._store import Store
from ._events import HEAD, block_id
from ._writer import _ends, find_end

__all__ = ["delete_stream", "expire_stream", "is_block"]


def is_block(record_id: str) -> bool:
    """Return whether ``record_id`` names a block of some run's stream (not a run)."""
    return record_id.startswith(HEAD + ":")


def delete_stream(store: Store, run_id: str) -> int:
    """Delete every block of ``run_id``'s stream; return how many there were.

    Call it with (after) deleting the run: a run started again under the same id then
    begins a new, empty stream.

    Raises:
        StoreError: the store failed; blocks not yet deleted stay (call again).
    """
    end = find_end(store, run_id)
    for n in range(end - 1, -1, -1):
        store.delete(block_id(run_id, n))
    _ends.pop((id(store), run_id), None)
    return end


def expire_stream(store: Store, run_id: str, ttl_seconds: int | None) -> int:
    """Give every block of ``run_id``'s stream the TTL given the run (``Store.expire``).

    From the last block to the first, as ``delete_stream`` deletes: an item's TTL runs
    from its last write, so the last block expires first and the stream never has a gap
    (a run started again under the id would otherwise write block 0 before old ones).
    """
    end = find_end(store, run_id)
    for n in range(end - 1, -1, -1):
        store.expire(block_id(run_id, n), ttl_seconds)
    return end
