"""Make the chaos harness (``tools/chaos``, repository tooling outside the wheel) importable."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = str(Path(__file__).resolve().parents[2] / "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)
