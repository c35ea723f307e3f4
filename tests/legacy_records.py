"""The frame of the ``make_*_legacy.py`` scripts: an adapter's runs on a new file store,
and every document it stored written to a JSON fixture (file name -> text)."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepstone import Store, open_store


def write_records(out: Path, test_module: str, make_runs: Callable[[Store, Any], None]) -> None:
    """Call ``make_runs(store, module)`` on a new file store and write its records to ``out``.

    ``module`` is the adapter's test module (``test_module``: its agents, and ``LOG_ENV``,
    pointed at a log in the temporary directory).
    """
    agents: Any = importlib.import_module(test_module)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[agents.LOG_ENV] = str(Path(tmp) / "calls.log")
        with open_store(f"file://{tmp}/runs") as store:
            make_runs(store, agents)
        records = {
            path.name: path.read_text(encoding="utf-8")
            for path in sorted(Path(tmp, "runs").rglob("*.json"))
        }
    out.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {len(records)} records to {out}")
