"""No module of the package over 600 lines: each concept in a file a reader takes in whole."""

from __future__ import annotations

from pathlib import Path

import stepstone

SRC = Path(stepstone.__file__).resolve().parent
LIMIT = 600
#: Generated statement text (``tools/sqlgen.py --write``): data, not code to read.
GENERATED = {"stores/_sql_text.py"}


def test_no_module_is_over_the_limit() -> None:
    """Every hand-written module of ``src/stepstone`` has at most 600 lines."""
    over = {
        name: lines
        for path in SRC.rglob("*.py")
        if (name := path.relative_to(SRC).as_posix()) not in GENERATED
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert not over, f"modules over {LIMIT} lines (split them by concept): {over}"


def test_the_generated_text_is_where_named() -> None:
    """The generated modules named above are real files (no stale exception)."""
    missing = sorted(name for name in GENERATED if not (SRC / name).is_file())
    assert not missing, f"no such module (drop it from GENERATED): {missing}"
