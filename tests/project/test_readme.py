"""The README's example runs as written, its tables match the code, and it stays a landing page.

The texts that moved from the README to the documentation site (the local Cosmos DB
path, the command reference) are checked where they now live, in ``docs/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepstone import _registry

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## Example") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_example_is_short() -> None:
    """The example stays about ten lines."""
    assert len(_example().strip().splitlines()) <= 11


@pytest.mark.process
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


@pytest.mark.process
def test_example_and_cli_share_the_default_store(tmp_path: Path) -> None:
    """`stepstone runs list` right after the example lists its run (same default store)."""
    env = {k: v for k, v in os.environ.items() if k != "STEPSTONE_STORE"}
    subprocess.run(
        [sys.executable, "-c", _example()], cwd=tmp_path, env=env, capture_output=True, check=True
    )
    listed = subprocess.run(
        [sys.executable, "-m", "stepstone", "runs", "list", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["report-2026-11-30"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == ["stepstone.db"]


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start : end if end >= 0 else len(text)]


def test_install_works_before_publication() -> None:
    """Install says how to install from a clone and a Git URL; the index form waits."""
    install = _section("Install")
    assert "pip install -e ." in install
    assert "git+https://" in install
    first_command = re.search(r"```bash\n(.*?)\n", install, re.S)
    assert first_command is not None and "pip install stepstone" not in first_command.group(1)
    assert "Once published: `pip install stepstone`" in install


def test_local_cosmos_path_is_complete() -> None:
    """The Azure page's local emulator commands carry the key and match docker-compose.yml."""
    from cosmos_emulator import WELL_KNOWN_KEY

    text = (DOCS / "azure.md").read_text()
    assert WELL_KNOWN_KEY in text
    compose = (README.parent / "docker-compose.yml").read_text()
    local = compose[compose.index("cosmos-local:") :]
    for name, value in re.findall(r"^\s+(COSMOS_\w+): \"?([^\"\n]+)\"?$", local, re.M):
        assert f"-e {name}={value}" in text, name
    assert "docker-compose --profile local up" in text  # Debian's Compose v1
    assert re.search(r"docker run -d .*--network host", text)


def test_cli_section_names_every_command() -> None:
    """Every `stepstone` command and `runs` action appears on the Operating page."""
    from stepstone.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert isinstance(commands, dict)
    text = (DOCS / "operating.md").read_text()
    for name, sub in commands.items():
        assert f"stepstone {name}" in text, name
        if name == "runs":
            actions = next(a for a in sub._actions if a.dest == "runs_command").choices
            assert actions is not None
            for action in actions:
                assert f"stepstone runs {action}" in text, action


def test_demo_script_hint_is_runnable() -> None:
    """scripts/demo runs the venv's script, and the demo's hint names one that exists."""
    script = (README.parent / "scripts" / "demo").read_text()
    assert "exec .venv/bin/stepstone demo" in script
    from stepstone.cli._demo_bench import command_name

    first = command_name().split()[0]
    assert shutil.which(first) is not None or Path(first).exists()


def test_readme_is_a_landing_page() -> None:
    """The README stays short: what it is, install, two examples, the backends, links."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move text to docs/"
    titles = [line for line in lines if line.startswith("## ")]
    for title in ("## Install", "## Example", "## Async", "## Backends", "## Documentation"):
        assert title in titles, title


def test_readme_links_resolve() -> None:
    """Every relative link in the README names a file or folder of the repository."""
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (REPO / target).exists(), target


def test_readme_keeps_the_test_command() -> None:
    """.ci/run runs "the README's test command": the README still gives it, unchanged."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "exec scripts/test" in ci
    install = _section("Install")
    assert "./scripts/test    # installs the test tools" in install


def test_docs_example_is_the_readme_example() -> None:
    """Getting started shows the README's example, character for character."""
    page = (DOCS / "getting-started.md").read_text()
    section = page[page.index("## Example") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None and match.group(1) == _example()
