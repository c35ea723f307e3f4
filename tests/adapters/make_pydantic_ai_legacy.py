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
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

OUT = Path(__file__).parent / "pydantic_ai_legacy_records.json"


def main() -> None:
    agents: Any = importlib.import_module("test_pydantic_ai")

    from stepstone import Suspended, open_store
    from stepstone.adapters.pydantic_ai import adurable_agent_run

    with tempfile.TemporaryDirectory() as tmp:
        os.environ[agents.LOG_ENV] = str(Path(tmp) / "calls.log")
        with open_store(f"file://{tmp}/runs") as store:
            with contextlib.suppress(Suspended):  # waits for the approval: as recorded
                waiting = agents.approval_agent()
                asyncio.run(adurable_agent_run(store, "legacy-wait", waiting, "refund me"))
            asyncio.run(adurable_agent_run(store, "legacy-done", agents.make_agent(), "q"))
        records = {
            path.name: path.read_text(encoding="utf-8")
            for path in sorted(Path(tmp, "runs").rglob("*.json"))
        }
    OUT.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {len(records)} records to {OUT}")


if __name__ == "__main__":
    main()
