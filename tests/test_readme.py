"""The README's example runs as written, and its tables match the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepstone import _registry

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## Example") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_example_is_short() -> None:
    """The example stays about ten lines."""
    assert len(_example().strip().splitlines()) <= 11


def test_example_runs_and_resumes(tmp_path: Path) -> None:
    """The example runs, and a second run resumes the finished run without re-running steps."""
    first = subprocess.run(
        [sys.executable, "-c", _example()], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert "publishing CHECKPOINT EVERY STEP" in first.stdout
    second = subprocess.run(
        [sys.executable, "-c", _example()], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert "publishing" not in second.stdout
    assert "'summary': 'CHECKPOINT EVERY STEP'" in second.stdout


@pytest.mark.parametrize("scheme", sorted(_registry._BUILTIN))
def test_backends_table_lists_every_builtin(scheme: str) -> None:
    """Every built-in scheme has a row in the README's backends table, with its class."""
    target = _registry._BUILTIN[scheme][0].replace(":", ".")
    rows = [line for line in README.read_text().splitlines() if line.startswith(f"| `{scheme}`")]
    assert rows, f"no README row for {scheme}"
    assert f"`{target}`" in rows[0]
