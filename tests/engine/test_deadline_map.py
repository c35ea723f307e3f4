"""A deadline ends a run mid-Map and its children (issue 33), on SQLite and PostgreSQL.

The children inherit the parent's deadline: two sleep past it (due at it, not at the
end of their sleep), one is cut off inside its step when it falls and fails with
``DeadlineExceeded`` itself. The parent, due at its deadline, then fails with
``DeadlineExceeded`` at its Map and cancels its active children; the one that failed
keeps its status, ``failed``, and its failure record.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fresh_stores import fresh_config as _config
from stepstone import Map, Sleep, Step, Suspended, Workflow, open_store, run
from stepstone._deadline import DeadlineExceeded, deadline_of
from stepstone._store import Store
from stepstone.testing import FakeClock

State = dict[str, Any]
T0 = datetime(2030, 1, 1, tzinfo=UTC)
#: Real seconds a test waits for something that happens at once; never reached when green.
HANG = 30.0


@pytest.fixture(params=("memory", "sqlite", "postgresql"))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend the issue names (memory as the reference)."""
    with open_store(_config(str(request.param), request, tmp_path)) as opened:
        yield opened


def test_a_deadline_ends_a_run_mid_map_and_its_children(store: Store) -> None:
    release = threading.Event()
    with FakeClock(T0) as clock:

        def work(state: State) -> State:
            if state["n"] == 1:
                clock.advance(timedelta(minutes=11))  # the deadline falls in this step
                release.wait(HANG)
                return {"late": True}
            return {"worked": state["n"]}

        child = Workflow(
            "child",
            [
                Step("work", work),
                Sleep("nap", duration=timedelta(hours=1)),
                Step("end", lambda s: {"ended": True}),
            ],
        )
        parent = Workflow(
            "parent",
            [
                Map("fan", child, lambda s: [{"n": n} for n in range(3)]),
                Step("after", lambda s: {}),
            ],
            deadline=600,
        )
        run_id = f"m-{uuid.uuid4().hex}"
        kids = [f"{run_id}/fan/{n}" for n in range(3)]
        with pytest.raises(Suspended):
            run(run_id, parent, store)  # the parent waits for its children
        deadline = T0 + timedelta(minutes=10)
        parent_cp = store.load(run_id)
        assert parent_cp is not None and parent_cp.wake_at is not None
        assert parent_cp.wake_at <= deadline  # a worker wakes it at its deadline at the latest
        for kid in kids:
            cp = store.load(kid)
            assert cp is not None and deadline_of(cp) == deadline  # inherited
        for n in (0, 2):  # both run their step, then sleep: due at the deadline, not later
            with pytest.raises(Suspended):
                run(kids[n], child, store)
            cp = store.load(kids[n])
            assert cp is not None and cp.wake_at == deadline
        try:
            with pytest.raises(DeadlineExceeded):
                run(kids[1], child, store)  # cut off mid-step by the inherited deadline
        finally:
            release.set()
        with pytest.raises(DeadlineExceeded):
            run(run_id, parent, store)
    ended = store.load(run_id)
    assert ended is not None and ended.status == "failed" and ended.failure is not None
    assert ended.failure.error_type == "DeadlineExceeded" and ended.failure.step_name == "fan"
    statuses = []
    for kid in kids:
        cp = store.load(kid)
        assert cp is not None
        statuses.append(cp.status)
    assert statuses == ["cancelled", "failed", "cancelled"]
    cut = store.load(kids[1])
    assert cut is not None and cut.failure is not None and "late" not in cut.state
    assert cut.failure.error_type == "DeadlineExceeded"
