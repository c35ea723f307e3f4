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
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

OUT = Path(__file__).parent / "openai_agents_legacy_records.json"


def main() -> None:
    agents: Any = importlib.import_module("test_openai_agents")

    from stepstone import Suspended, open_store
    from stepstone.adapters.openai_agents import StepstoneRunner

    with tempfile.TemporaryDirectory() as tmp:
        os.environ[agents.LOG_ENV] = str(Path(tmp) / "calls.log")
        with open_store(f"file://{tmp}/runs") as store:
            with contextlib.suppress(Suspended):  # waits for the approval: as recorded
                StepstoneRunner.run_sync(
                    store, "legacy-wait", agents.refund_agent(), "refund me",
                    run_config=agents.config_(),
                )  # fmt: skip
            StepstoneRunner.run_sync(
                store, "legacy-done", agents.lookup_agent(), "hi", run_config=agents.config_()
            )
        records = {
            path.name: path.read_text(encoding="utf-8")
            for path in sorted(Path(tmp, "runs").rglob("*.json"))
        }
    OUT.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {len(records)} records to {OUT}")


if __name__ == "__main__":
    main()
