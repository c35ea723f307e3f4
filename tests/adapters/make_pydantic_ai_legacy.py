"""Write ``pydantic_ai_legacy_records.json``: records of the release before issue 31's move.

Run once, with the code of that release (``PYTHONPATH=src:tests python
tests/adapters/make_pydantic_ai_legacy.py``), to record what a store written by it holds:
a pydantic-ai agent run waiting for an approval (its first model request journaled) and
the journal record that release kept beside the run (``RUN/agent/pydantic-ai-journal``),
each as the stored document (a file store's file). ``test_pydantic_ai`` loads
them into a store of today and resumes the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from legacy_records import write_records
from stepstone import Store, Suspended

OUT = Path(__file__).parent / "pydantic_ai_legacy_records.json"


def make_runs(store: Store, agents: Any) -> None:
    """A run waiting for an approval and a finished one."""
    from stepstone.adapters.pydantic_ai import adurable_agent_run

    with contextlib.suppress(Suspended):  # waits for the approval: as recorded
        waiting = agents.approval_agent()
        asyncio.run(adurable_agent_run(store, "legacy-wait", waiting, "refund me"))
    asyncio.run(adurable_agent_run(store, "legacy-done", agents.make_agent(), "q"))


if __name__ == "__main__":
    write_records(OUT, "test_pydantic_ai", make_runs)
