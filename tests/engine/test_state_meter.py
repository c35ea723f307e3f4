"""``stepstone.testing.StateMeter``: the saves planned in a block and the bytes they write."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from fresh_stores import LOCAL_BACKENDS, fresh_config
from stepstone import Checkpoint, Step, open_store, run
from stepstone._statelog import INLINE_MAX
from stepstone.testing import StateMeter


@pytest.mark.parametrize("kind", LOCAL_BACKENDS)
def test_an_inline_state_counts_its_text(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A small state's save counts once, with the bytes of the state's JSON text."""
    with open_store(fresh_config(kind, request, tmp_path)) as store, StateMeter() as meter:
        store.save(Checkpoint("r1", state={"a": "é"}))
    assert meter.saves == 1
    assert meter.bytes == len('{"a":"é"}'.encode())


@pytest.mark.parametrize("kind", LOCAL_BACKENDS)
def test_a_long_state_counts_its_pieces_then_only_its_log(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A state over INLINE_MAX counts its base; an appended item counts only its log piece."""
    big = {"items": ["x" * 100 for _ in range(2 * INLINE_MAX // 100)]}
    with open_store(fresh_config(kind, request, tmp_path)) as store:
        with StateMeter() as first:
            saved = store.save(Checkpoint("r1", state=big))
        assert first.bytes > 2 * INLINE_MAX
        state = saved.state
        state["items"].append("y")
        with StateMeter() as second:
            store.save(replace(saved, state=state, step=saved.step + 1))
    assert second.saves == 1
    assert 0 < second.bytes < 100


def test_nothing_counts_outside_the_block_and_meters_nest(tmp_path: Path) -> None:
    """A meter counts only while entered; an outer meter counts what an inner one does."""
    steps = [Step("a", lambda s: {**s, "n": 1}), Step("b", lambda s: {**s, "n": 2})]
    with open_store("memory://") as store:
        with StateMeter() as outer:
            with StateMeter() as inner:
                run("r1", steps, store, input={})
            run("r2", steps, store, input={})
        run("r3", steps, store, input={})
    assert inner.saves >= 2
    assert outer.saves == 2 * inner.saves
    assert outer.bytes == 2 * inner.bytes


def test_saves_of_other_threads_count() -> None:
    """Saves planned on another thread of the process count too."""
    with open_store("memory://") as store, StateMeter() as meter:
        thread = threading.Thread(target=store.save, args=(Checkpoint("r1", state={}),))
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the saving thread hung"
    assert meter.saves == 1


def test_a_meter_is_entered_once() -> None:
    """Entering a meter that is already entered is refused; it still counts once."""
    meter = StateMeter()
    with meter, pytest.raises(RuntimeError, match="already entered"):
        meter.__enter__()
