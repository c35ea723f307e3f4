"""The documentation site's sources: complete, public, and their code examples run.

``mkdocs build --strict`` (scripts/test) checks links, anchors and that every page is in
the navigation; these tests check what it cannot: that the API reference documents every
public name and no private path, that each backend's README is a page, that every file
a page includes exists, that every Python example in the pages is valid Python, and that
every example of the README and the pages runs as pasted, in a fresh directory (fakes
stand in for models in the examples themselves). An example that cannot run alone (a
server, a framework, a fragment of a larger program) is marked on the line before its
fence with ``<!-- not-run: REASON -->``, and that list stays short.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import stepstone
import stepstone.testing
from stepstone import _registry

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"
PAGES = sorted(DOCS.rglob("*.md"))
README = REPO / "README.md"

# ``::: dotted.path`` lines: what mkdocstrings renders.
_IDENTIFIER = re.compile(r"^::: (\S+)\s*$", re.M)
# ``--8<-- "path"`` or ``--8<-- "path:section"`` lines: what pymdownx.snippets includes.
_SNIPPET = re.compile(r'^\s*--8<-- "([^":]+)(?::([\w-]+))?"\s*$', re.M)
_ADAPTERS = ("langgraph", "agent_framework", "pydantic_ai", "openai_agents")


def _identifiers(page: str) -> list[str]:
    return _IDENTIFIER.findall((REFERENCE / page).read_text())


def _all_identifiers() -> list[str]:
    return [name for page in REFERENCE.glob("*.md") for name in _identifiers(page.name)]


def test_reference_documents_every_public_name() -> None:
    """Each name in ``stepstone.__all__`` has its own entry on the ``stepstone`` page."""
    documented = set(_identifiers("stepstone.md"))
    missing = [n for n in stepstone.__all__ if f"stepstone.{n}" not in documented]
    assert not missing, f"add to docs/reference/stepstone.md: {missing}"


def test_reference_documents_the_testing_names_stores_and_adapters() -> None:
    """stepstone.testing's names, each built-in store class and each adapter module."""
    documented = set(_all_identifiers())
    wanted = [f"stepstone.testing.{n}" for n in stepstone.testing.__all__]
    wanted += [target.replace(":", ".") for target, *_ in _registry._BUILTIN.values()]
    wanted += [f"stepstone.adapters.{name}" for name in _ADAPTERS]
    missing = [name for name in wanted if name not in documented]
    assert not missing, f"add to docs/reference/: {missing}"


def _reference_params() -> list[Any]:
    # An adapter module imports its framework (the OpenAI Agents SDK: seconds of CPU on a
    # busy machine), over the fast tier's 2 s: those entries run in the rest tier.
    return [
        pytest.param(name, marks=pytest.mark.slow)
        if name.startswith("stepstone.adapters.")
        else name
        for name in sorted(set(_all_identifiers()))
    ]


@pytest.mark.parametrize("identifier", _reference_params())
def test_reference_paths_are_public_and_resolve(identifier: str) -> None:
    """No reference entry names a private module, and each one exists at that path."""
    parts = identifier.split(".")
    assert not any(p.startswith("_") for p in parts), f"private path: {identifier}"
    # The longest importable prefix is the module; the rest are attributes of it.
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not exc.name.startswith("stepstone"):
                pytest.skip(f"{identifier} needs {exc.name}, which is not installed")
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{identifier} does not resolve")


def test_every_backend_readme_is_a_page() -> None:
    """Each backend README (the overview, one per backend, the emulator's) is a page."""
    found = (REPO / "backends").glob("**/README.md")
    readmes = sorted(p.relative_to(REPO) for p in found if "node_modules" not in p.parts)
    assert len(readmes) >= 6
    for readme in readmes:
        page = DOCS / readme
        assert page.exists(), f"no page docs/{readme}"
        assert f'--8<-- "{readme.as_posix()}"' in page.read_text(), f"docs/{readme}"


# The parameter is ``doc``, not ``page``: a test asking for ``page`` would be taken for a
# browser test by any Playwright pytest plugin (and grouped with the browser tests).
@pytest.mark.parametrize("doc", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_included_files_exist(doc: Path) -> None:
    """Every file a page includes exists, and a named section is marked in it."""
    for path, section in _SNIPPET.findall(doc.read_text()):
        target = REPO / path
        assert target.is_file(), f"{doc.name} includes {path}, which does not exist"
        if section:
            text = target.read_text()
            for edge in ("start", "end"):
                assert f"--8<-- [{edge}:{section}]" in text, f"{path} has no {edge}:{section}"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^ *```python\n(.*?)^ *```", text, re.S | re.M)


@pytest.mark.parametrize("doc", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_python_examples_compile(doc: Path) -> None:
    """Every ```python block on a page is valid Python (top-level ``await`` allowed)."""
    for block in _python_blocks(doc.read_text()):
        compile(block, str(doc), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_python_examples_are_found() -> None:
    """The block finder sees the examples: the pages hold a few dozen of them."""
    blocks = [b for page in PAGES for b in _python_blocks(page.read_text())]
    assert len(blocks) >= 10
    assert any("from stepstone import" in b for b in blocks)


# A ```python block, and the ``<!-- not-run: REASON -->`` line right before its fence.
_BLOCK = re.compile(
    r"^(?:<!-- not-run: (?P<why>[^\n]*?) -->\n)?(?P<indent> *)```python\n(?P<code>.*?)^ *```",
    re.S | re.M,
)
#: How many examples may be marked not-run: few, or the docs stop being checked.
_MAX_NOT_RUN = 13


def _examples() -> list[tuple[str, str | None, str]]:
    """Return ``(where, reason not run or None, code)`` of every example, README first."""
    found = []
    for doc in [README, *PAGES]:
        name = doc.relative_to(REPO).as_posix()
        for number, match in enumerate(_BLOCK.finditer(doc.read_text())):
            code = textwrap.dedent(match["code"])
            found.append((f"{name}#{number}", match["why"], code))
    return found


#: A block that only includes a file of tests/ (pymdownx.snippets): that file runs as a
#: test of its own, so the block is neither run here nor counted as not run.
_INCLUDED_TEST = re.compile(r'--8<-- "tests/[^"]+\.py"')

_RUN = [
    (where, code)
    for where, why, code in _examples()
    if why is None and not _INCLUDED_TEST.fullmatch(code.strip())
]


def test_not_run_examples_are_few_and_say_why() -> None:
    """Every example not run gives its reason, and they stay a short list."""
    skipped = [(where, why) for where, why, _ in _examples() if why is not None]
    assert all(len(why.strip()) >= 10 for _, why in skipped), skipped
    assert len(skipped) <= _MAX_NOT_RUN, skipped
    assert len(_RUN) >= 8  # the finder still sees the examples it runs
    assert any(where.startswith("README.md#") for where, _ in _RUN)


@pytest.mark.slow
@pytest.mark.parametrize(("where", "code"), _RUN, ids=[where for where, _ in _RUN])
def test_examples_run_as_pasted(where: str, code: str, tmp_path: Path) -> None:
    """Each README and docs example not marked not-run runs as pasted, in a fresh directory."""
    env = {k: v for k, v in os.environ.items() if k != "STEPSTONE_STORE"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: the example did not finish within 120 s")
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"


def test_the_development_install_brings_mkdocs() -> None:
    """The development page's install command installs the dev group, which holds mkdocs."""
    import tomllib

    page = (DOCS / "development.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "mkdocs serve" in b)
    installs = [line for line in block.splitlines() if "pip install" in line]
    assert installs and "--group dev" in installs[0], block
    assert block.index("pip install") < block.index("mkdocs serve")
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]
    assert any(str(req).startswith("mkdocs==") for req in groups["dev"]), groups["dev"]
