"""MemoryStore: process-local checkpoints, for tests and examples."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar, Concatenate, ParamSpec, Self, TypeVar
from urllib.parse import urlsplit

from .. import _hooks, _lease, _statelog
from .._checkpoint import Checkpoint, RunStatus, check_run_id, evolve, utcnow
from .._errors import ConfigError, ConflictError
from .._runinfo import PageAsk, ReadyAsk
from .._store import Claim, RunInfo, Store, check_page
from ._common import Unanswered, new_version
from ._listing import IndexedRuns

__all__ = ["FORMS", "MemoryStore"]

#: The config-string forms the memory store accepts.
FORMS = "memory:// (a new empty store) or memory://NAME (shared by name in this process)"
_named: dict[str, MemoryStore] = {}
_named_lock = threading.Lock()

_S = TypeVar("_S", bound=Store)
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _on_the_loop(
    method: Callable[Concatenate[_S, _P], _T],
) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]:
    """Return the async form of a sync method that never blocks: it runs on the loop.

    The one rule for every async method of the memory store, instead of one twin each.
    """
    name = method.__name__

    async def on_the_loop(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        # Looked up on the instance: a subclass overriding the sync method changes both.
        sync: Callable[_P, _T] = getattr(self, name)
        return sync(*args, **kwargs)

    on_the_loop.__name__ = on_the_loop.__qualname__ = "a" + name
    on_the_loop.__doc__ = f"Async ``{name}``; same contract, same errors."
    return on_the_loop


class MemoryStore(Store):
    """Keeps checkpoints in a dict: nothing survives the process.

    The state is kept as JSON text, validated like every durable backend does, so a state
    that works here works everywhere, and nothing a caller holds aliases what is stored.
    """

    scheme: ClassVar[str] = "memory"
    durable: ClassVar[bool] = False
    native_async: ClassVar[bool] = True
    claims_by_kind: ClassVar[bool] = True
    asave_never_suspends: ClassVar[bool] = True  # asave calls save; it awaits nothing
    claims_in_one_call: ClassVar[bool] = True  # claim_ready: one hold of the lock
    holds_pieces: ClassVar[bool] = True

    def __init__(self) -> None:
        # The saved checkpoints; ``state_json`` is the truth, ``state`` is never read back.
        # A dict that keeps the dashboard's listing index in step (``_listing.py``).
        self._runs = IndexedRuns()
        # The pieces of the runs whose state is long (``_statelog``): run_id -> key -> piece.
        self._pieces: dict[str, dict[str, _statelog.Piece]] = {}
        self._lock = threading.Lock()
        # Saves whose answer was lost (only a hook loses one here), for their retry.
        self._unanswered = Unanswered()

    @classmethod
    def from_config(cls, config: str) -> Self:
        parts = urlsplit(config)
        if parts.scheme.lower() != "memory" or parts.path not in ("", "/") or parts.query:
            raise ConfigError(f"malformed memory store config {config!r}; forms: {FORMS}")
        if not parts.netloc:
            return cls()
        with _named_lock:
            store = _named.get(parts.netloc)
            if store is None or not isinstance(store, cls):
                store = _named[parts.netloc] = cls()
            return store

    def load(self, run_id: str) -> Checkpoint | None:
        check_run_id(run_id)
        with self._lock:
            found = self._runs.get(run_id)
            if found is None:
                return None
            return self._loaded(found)

    def _loaded(self, found: Checkpoint) -> Checkpoint:
        """The stored checkpoint with a state of its own (under the lock)."""
        # ``found.state`` may be a dict the runner has since mutated: only the text, or
        # the pieces, count.
        handle = found.stored_state
        if found.state_json is None and handle is not None and handle.ref is not None:
            held = self._pieces.get(found.run_id, {})
            pieces = {key: held[key].data for key in _statelog.pieces_of(handle.ref) if key in held}
            state, stored = _statelog.assemble(
                self,
                found.run_id,
                found.version,
                handle.ref,
                pieces,
                f"memory run {found.run_id!r}",
            )
            return evolve(found, state=state, stored_state=stored)
        return evolve(found, state=json.loads(found.state_json or "{}"))

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        run_id = check_run_id(checkpoint.run_id)
        # A retry of a save whose answer was lost writes what that save planned.
        again: tuple[_statelog.Prepared, str] | None = self._unanswered.take(checkpoint, run_id)
        prepared = _statelog.prepare_save(self, checkpoint) if again is None else again[0]
        with self._lock:
            current = self._runs.get(run_id)
            current_version = None if current is None else current.version
            if current_version != checkpoint.version:
                if again is not None and current is not None and current_version == again[1]:
                    return current  # the retried save's own write: it landed
                raise ConflictError(
                    f"run {run_id!r}: expected version {checkpoint.version!r}, "
                    f"stored {current_version!r}",
                    run_id,
                )
            version = new_version(current_version) if again is None else again[1]
            saved = self._store(checkpoint, prepared, version)
        try:
            _hooks.fire("memory.saved")  # tests: the answer of a save that landed is lost
        except BaseException:
            self._unanswered.keep(checkpoint, run_id, (prepared, version))
            raise
        return saved

    def _store(
        self, checkpoint: Checkpoint, prepared: _statelog.Prepared, version: str
    ) -> Checkpoint:
        """Keep a planned save (under the lock): its pieces and checkpoint at once."""
        run_id = checkpoint.run_id
        if prepared.pieces:
            held = self._pieces.setdefault(run_id, {})
            for piece in prepared.pieces:
                held[piece.key] = piece
        below = prepared.collect_below
        if below is not None and run_id in self._pieces:
            kept = {k: p for k, p in self._pieces[run_id].items() if p.gen >= below}
            if kept:
                self._pieces[run_id] = kept
            else:
                del self._pieces[run_id]
        saved = checkpoint.stored(
            prepared.state, prepared.state_text, version, utcnow(), prepared.bind(version)
        )
        self._runs[run_id] = saved
        return saved

    def delete(self, run_id: str, *, expected_version: str | None = None) -> bool:
        check_run_id(run_id)
        with self._lock:
            current = self._runs.get(run_id)
            if current is None:
                return False
            if expected_version is not None and current.version != expected_version:
                raise ConflictError(
                    f"run {run_id!r}: not deleted: expected version {expected_version!r}, "
                    f"stored {current.version!r}",
                    run_id,
                )
            del self._runs[run_id]
            self._pieces.pop(run_id, None)
            return True

    def piece_keys(self, run_id: str) -> list[str]:
        with self._lock:
            return sorted(self._pieces.get(run_id, ()))

    def pieces(self, run_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        with self._lock:
            held = self._pieces.get(run_id, {})
            return {key: held[key].data for key in keys if key in held}

    def put_pieces(self, run_id: str, pieces: Sequence[_statelog.Piece]) -> None:
        with self._lock:
            held = self._pieces.setdefault(run_id, {})
            for piece in pieces:
                held.setdefault(piece.key, piece)

    def list_runs(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._runs))

    def close(self) -> None:
        """Nothing to release; the data stays until the process ends."""

    # Native async: a dict and a lock held for microseconds never block the loop, so
    # there is no thread to hop to: each async method calls its sync twin at once (the
    # contract's methods name the signature; the instance's own method is called).
    aload = _on_the_loop(Store.load)
    asave = _on_the_loop(Store.save)
    adelete = _on_the_loop(Store.delete)
    aclaimable = _on_the_loop(Store.claimable)
    aclose = _on_the_loop(Store.close)
    apiece_keys = _on_the_loop(Store.piece_keys)
    apieces = _on_the_loop(Store.pieces)
    aput_pieces = _on_the_loop(Store.put_pieces)
    aclaim_ready = _on_the_loop(Store.claim_ready)

    # -- the claims and the dashboard's listing, from the indexes ``IndexedRuns`` keeps --

    def claimable(
        self, now: datetime, limit: int = 100, *, status: RunStatus | None = None, skip: int = 0
    ) -> list[RunInfo]:
        """Return the running runs and the queued/waiting ones due by ``now`` (indexed).

        With ``status``, one page of that kind only (``Store.claimable``). Binary
        searches in the (status, due_at) index: the cost does not grow with finished runs.

        Raises:
            ValueError: ``status`` is not an active status, or ``skip`` is negative.
        """
        check_page(status, skip)
        if type(limit) is not int or limit < 0:
            # A negative limit slices from the end of the scan's lists: its answer, as is.
            return super().claimable(now, limit, status=status, skip=skip)
        with self._lock:
            found = self._runs.claims(now, limit, status, skip)
        return [RunInfo.of(cp) for cp in found]

    def _claim_asked(self, ask: ReadyAsk) -> list[Claim]:
        """Claim up to ``limit`` unowned, due runs of ``served`` workflows, under the lock.

        See ``Store.claim_ready``: each is stored exactly as ``save`` stores
        ``_lease.claimed`` of its loaded record, all in one hold of the lock.
        """
        owner, lease, limit, served, now, exclude = ask
        if type(limit) is not int or limit <= 0:
            return []
        claims: list[Claim] = []
        with self._lock:
            picked: list[Checkpoint] = []
            for cp in self._runs.ready(now):
                if len(picked) >= limit:
                    break
                if (
                    cp.owner is None
                    and (cp.workflow or "", cp.workflow_version) in served
                    and cp.run_id not in exclude
                    and not (cp.queued and cp.cancel_requested)
                ):
                    picked.append(cp)
            for found in picked:  # written after the walk: a write moves the index
                before = self._loaded(found)
                claim = _lease.claimed(before, owner, lease)
                prepared = _statelog.prepare_save(self, claim)
                saved = self._store(claim, prepared, new_version(found.version))
                claims.append(Claim(before, saved))
        return claims

    def _list_page(self, ask: PageAsk) -> list[RunInfo]:
        """One page of the listing, newest first: a binary search in a sorted index."""
        with self._lock:
            found = self._runs.page(*ask)
        return [RunInfo.of(cp) for cp in found]

    def count_by_status(self, prefix: str = "") -> dict[str, int]:
        """Count the runs per status from the index: a few binary searches."""
        with self._lock:
            return self._runs.counts(prefix)
