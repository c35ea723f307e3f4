"""``SignalSafeEvent`` keeps ``threading.Event``'s meaning (the worker's stop and wake-up)."""

from __future__ import annotations

import threading

from stepstone._sigevent import SignalSafeEvent
from stepstone.testing._barrier import WAIT_TIMEOUT


def test_a_wait_times_out_while_the_flag_is_down() -> None:
    event = SignalSafeEvent()
    assert not event.is_set()
    assert event.wait(0) is False
    assert event.wait(0.01) is False


def test_set_before_a_wait_returns_at_once_and_clear_lowers_it() -> None:
    event = SignalSafeEvent()
    event.set()
    assert event.is_set()
    assert event.wait(0) is True
    assert event.wait(None) is True  # again: the flag stays up until cleared
    event.clear()
    assert not event.is_set()
    assert event.wait(0.01) is False


def test_one_set_wakes_every_waiter() -> None:
    event = SignalSafeEvent()
    woke: list[bool] = []
    parked = threading.Barrier(6)

    def waiter() -> None:
        parked.wait(WAIT_TIMEOUT)
        woke.append(event.wait(WAIT_TIMEOUT))

    threads = [threading.Thread(target=waiter) for _ in range(5)]
    for thread in threads:
        thread.start()
    parked.wait(WAIT_TIMEOUT)
    event.set()
    for thread in threads:
        thread.join(WAIT_TIMEOUT)
        assert not thread.is_alive(), "a waiter was not woken by set"
    assert woke == [True] * 5


def test_a_set_after_clear_is_never_lost() -> None:
    """Rounds of clear, then set from another thread: each wait sees its own set."""
    event = SignalSafeEvent()
    for _ in range(200):
        event.clear()
        setter = threading.Thread(target=event.set)
        setter.start()
        assert event.wait(WAIT_TIMEOUT), "a set from another thread was lost"
        setter.join(WAIT_TIMEOUT)


def test_tokens_do_not_pile_up_while_the_flag_stays_up() -> None:
    """A busy worker's rings set its wake-up event over and over between two clears."""
    event = SignalSafeEvent()
    for _ in range(1000):
        event.set()
        assert event.wait(0)
    assert event._tokens.qsize() == 1
    event.clear()
    assert event._tokens.qsize() == 0
    assert event.wait(0.01) is False  # no token left over to wake a waiter wrongly
