"""How a load of a state in pieces reads its document again (``_pieces_protocol``).

A piece missing means a newer save collected it, or damage. The stores tell them apart
by the document: the same version still naming a missing piece is damage
(``CorruptCheckpoint``); a new version is a writer's progress, read again. A reader that
a fast writer outruns many times in a row is not reading damage: on a loaded MariaDB the
reader test of ``stores/test_long_states`` saw three new bases in a row and, when three reads
were all a load allowed, reported the state corrupt.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, ClassVar

import pytest

from stepstone import CorruptCheckpoint, StoreUnavailable
from stepstone._codec import PiecesNeeded
from stepstone._statepieces import PiecesMissing
from stepstone.stores._pieces_protocol import READ_AGAIN, PiecesProtocol, run_plain


class _Churn(PiecesProtocol[None]):
    """A store whose writer replaces the document ``replaced`` times during the load.

    Version ``n`` names the piece ``p<n>``; a fetch finds only the current version's
    piece, and only once the writer has stopped (a new base collects the old piece).
    With ``damaged``, the last version's piece is gone too.
    """

    _pieces_lagging: ClassVar[bool] = False

    def __init__(self, replaced: int, damaged: bool = False) -> None:
        self.version = 0
        self.replaced = replaced
        self.damaged = damaged
        self.reads = 0

    def _pp_source(self, ctx: Any) -> str:
        return f"run {ctx!r}"

    def _pp_decode(self, ctx: Any, doc: Any, version: Any, found: dict[str, bytes] | None) -> Any:
        ref = {"base": [f"p{version}"], "log": []}
        if found is None:
            raise PiecesNeeded(ref)
        if f"p{version}" not in found:
            raise PiecesMissing([f"p{version}"])
        return ("state", version)

    def _pp_fetch(self, ctx: Any, keys: Sequence[str]) -> Generator[None, Any, dict[str, bytes]]:
        # Between the document's read and this fetch the writer saved a new base.
        if self.version < self.replaced:
            self.version += 1
            return {}
        if self.damaged:
            return {}
        return {f"p{self.version}": b"x"}
        yield  # a generator of no effects, as a store that does its own I/O

    def _pp_read(self, ctx: Any) -> Generator[None, Any, tuple[Any, Any] | None]:
        self.reads += 1
        return {"doc": self.version}, self.version
        yield


def _load(store: _Churn) -> Any:
    return run_plain(store._pieces_load("r", {"doc": 0}, 0))


@pytest.mark.parametrize("replaced", [1, 3, 10, READ_AGAIN - 1])
def test_a_reader_outrun_by_a_writer_reads_again_until_it_catches_up(replaced: int) -> None:
    store = _Churn(replaced)
    assert _load(store) == ("state", replaced)
    assert store.reads == replaced


def test_a_reader_never_catching_up_is_told_to_read_again_not_that_the_state_is_damaged() -> None:
    store = _Churn(replaced=READ_AGAIN + 5)
    with pytest.raises(StoreUnavailable, match="replaced 50 times.*nothing is damaged"):
        _load(store)
    assert store.reads == READ_AGAIN


def test_the_same_document_missing_a_piece_twice_is_damage_at_once() -> None:
    store = _Churn(replaced=2, damaged=True)
    with pytest.raises(CorruptCheckpoint, match="names 1 piece.*'p2'"):
        _load(store)
    assert store.reads == 3  # two new versions, then the same one again
