"""Write ``openai_agents_legacy_records.json``: records of the release before issue 31's move.

Run once, with the code of that release (``PYTHONPATH=src:tests python
tests/adapters/make_openai_agents_legacy.py``), to record what a store written by it
holds: an OpenAI Agents run waiting for an approval (its first model call and its pause
journaled) and a finished one, with the journal that release kept beside each run (one
record per entry, ``openai-agents:RUN/STEP/KEY``), each as the stored document (a file
store's file). For the test of the OpenAI Agents adapter's move onto the run's journal
(not made yet: see ``docs/workflows-as-code.md``, "Not done yet").
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from legacy_records import write_records
from stepstone import Store, Suspended

OUT = Path(__file__).parent / "openai_agents_legacy_records.json"


def make_runs(store: Store, agents: Any) -> None:
    """A run waiting for an approval and a finished one."""
    from stepstone.adapters.openai_agents import StepstoneRunner

    with contextlib.suppress(Suspended):  # waits for the approval: as recorded
        StepstoneRunner.run_sync(
            store, "legacy-wait", agents.refund_agent(), "refund me",
            run_config=agents.config_(),
        )  # fmt: skip
    StepstoneRunner.run_sync(
        store, "legacy-done", agents.lookup_agent(), "hi", run_config=agents.config_()
    )


if __name__ == "__main__":
    write_records(OUT, "test_openai_agents", make_runs)
