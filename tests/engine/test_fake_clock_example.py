"""The documented FakeClock example (docs/reference/testing.md includes this file whole).

An approval that is not given within two days counts as a no. Both tests take
milliseconds: the clock is moved, not waited for.
"""

from datetime import timedelta

import pytest

from stepstone import Step, Suspended, WaitFor, Workflow, open_store, run, signal
from stepstone.testing import FakeClock

approval = Workflow(
    "approval",
    [
        WaitFor("approval", "approve", timeout=timedelta(days=2), default={"ok": False}),
        Step("send", lambda state: {"sent": state["approval"]["ok"]}),
    ],
)


def test_no_answer_within_two_days_is_a_no() -> None:
    """With no signal, the run takes the default once two days have passed on the clock."""
    with FakeClock() as clock, open_store("memory://") as store:
        with pytest.raises(Suspended):
            run("reply-1", approval, store)  # saved as waiting for "approve"
        clock.advance(timedelta(days=1, hours=23))
        with pytest.raises(Suspended):
            run("reply-1", approval, store)  # not yet: still waiting
        clock.advance(timedelta(hours=1))
        assert run("reply-1", approval, store) == {"approval": {"ok": False}, "sent": False}


def test_an_answer_within_two_days_is_used() -> None:
    """A signal that comes before the timeout is what the run goes on with."""
    with FakeClock() as clock, open_store("memory://") as store:
        with pytest.raises(Suspended):
            run("reply-2", approval, store)
        clock.advance(timedelta(days=1))
        signal(store, "reply-2", "approve", {"ok": True})
        assert run("reply-2", approval, store) == {"approval": {"ok": True}, "sent": True}
