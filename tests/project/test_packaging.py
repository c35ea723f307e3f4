"""What ships: a wheel of what runs, no third-party dependency, one version source."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

import stepstone

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_a_bare_install_declares_no_third_party_dependency() -> None:
    assert PYPROJECT["project"]["dependencies"] == []


def test_dev_tools_are_a_dependency_group_not_a_published_extra() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "dev" not in extras
    assert "dev" in PYPROJECT["dependency-groups"]
    assert extras["testing"] == ["pytest>=8"]


def test_the_version_is_written_once() -> None:
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "src/stepstone/__init__.py"
    assert stepstone.__version__.count(".") == 2
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert f"## [{stepstone.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


# Run in a fresh interpreter: a finder refuses every import that is neither the standard
# library nor stepstone, so anything the default paths import from outside fails loudly.
_NO_THIRD_PARTY = textwrap.dedent(
    """
    import sys

    ALLOWED = set(sys.stdlib_module_names) | {"stepstone"}

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] not in ALLOWED:
                raise ImportError(f"third-party import on the default path: {name}")
            return None

    sys.meta_path.insert(0, Refuse())

    import stepstone
    from stepstone import Step, Workflow, open_store, run

    wf = Workflow("w", [Step("a", lambda s: {**s, "a": 1}), Step("b", lambda s: {**s, "b": 2})])
    for config in sys.argv[1:]:
        with open_store(config) as store:
            assert run("r1", wf, store, input={}) == {"a": 1, "b": 2}, config
    from stepstone.cli import main
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    print("ok", stepstone.__version__)
    """
)


@pytest.mark.process
def test_the_default_paths_import_no_third_party_package(tmp_path: Path) -> None:
    configs = ["memory://", f"file://{tmp_path / 'runs'}", f"sqlite:///{tmp_path / 'r.db'}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", _NO_THIRD_PARTY, *configs],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == f"ok {stepstone.__version__}"


@pytest.mark.slow
def test_the_wheel_holds_what_runs_and_no_tooling(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("stepstone-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "stepstone/__init__.py" in names
    assert "stepstone/py.typed" in names
    assert any(n.startswith("stepstone/ui/") and n.endswith(".js") for n in names)
    assert any(n.endswith("LICENSE") for n in names)
    # The SQL generator and the shim for a package never released stay out of the wheel.
    assert not [n for n in names if "sqlgen" in n or n == "stepstone/stores/sql.py"]
    assert not [n for n in names if n.startswith(("tools/", "tests/", "benchmarks/"))]
    # SQLAlchemy is imported only where a user hands stepstone an engine (the extra).
    importers = [
        n
        for n in names
        if n.endswith(".py")
        and any(
            line.lstrip().startswith(("import sqlalchemy", "from sqlalchemy"))
            for line in zipfile.ZipFile(wheel).read(n).decode().splitlines()
        )
    ]
    assert all("engine" in n for n in importers), importers
