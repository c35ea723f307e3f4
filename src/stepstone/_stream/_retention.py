"""Streams follow their run: deleted with it (``delete``, ``prune``) and expired with it.

Blocks are removed from the last to the first, so a removal cut short by a crash leaves
a shorter stream that still starts at block 0 (readers and writers rely on no gaps),
and a second call finishes it. ``migrate`` needs nothing here: blocks are records like
any other, copied with the runs.
"""

from __future__ import annotations

import re
from datetime import datetime

from .._store import Store
from ._events import HEAD, block_id
from ._writer import _ends, find_end

#: A block id's run part for a run id too long to spell out (``_events.block_id``).
_DIGEST = re.compile(r"~[0-9a-f]{64}")

__all__ = ["delete_orphan_streams", "delete_stream", "expire_stream", "is_block"]


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


def delete_orphan_streams(
    store: Store, blocks: list[tuple[str, datetime]], before: datetime
) -> int:
    """Delete the streams whose run is gone and whose last write is before ``before``.

    ``blocks`` are (record id, updated at) of listed records (others are ignored). A
    run that expired by its ttl while its blocks waited for it to rest (Cosmos DB's
    blocks keep no ttl while the run is active) leaves them behind; ``prune`` calls
    this with a cutoff a day ago, since a run still starting may have blocks and no
    record yet. Each run is re-read first. Blocks of a run id too long for a plain
    block id are named by a digest and cannot be traced back: they stay.

    Raises:
        StoreError: the store failed; what was not deleted stays (call again).
    """
    newest: dict[str, datetime] = {}
    for record_id, updated in blocks:
        if is_block(record_id):
            run_id, slash, n = record_id[len(HEAD) + 1 :].rpartition("/")
            if slash and n.isdigit() and not _DIGEST.fullmatch(run_id):
                newest[run_id] = max(updated, newest.get(run_id, updated))
    gone = 0
    for run_id in sorted(r for r, t in newest.items() if t < before):
        if store.load(run_id) is None:
            delete_stream(store, run_id)
            gone += 1
    return gone
